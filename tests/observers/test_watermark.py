"""Low watermarks (percolator/watermark.py) and waiting on them.

The property test drives random interleavings of writes, transactions left in flight,
observer runs, runs that die before their commit or between commit and cleanup, and
parking, and after every step judges the published watermark from the stored data alone:
every committed change of the watched column below it must be covered by the observer's
ack.
"""

from __future__ import annotations

import contextlib
import json
import random
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from percolator.observers.api import (
    Observer,
    finish_registration,
    register_observers,
    unregister_observer,
)
from percolator.observers.drain import run_until_quiet
from percolator.observers.parking import ParkingLot, skips
from percolator.observers.runner import process_notification
from percolator.observers.worker import Worker, WorkerOptions

import percolator
from percolator import failpoints, notifications, watermark
from percolator.errors import InvalidArgumentError
from percolator.layout import LOCK, WRITE
from percolator.notifications import read_ack
from percolator.protocol.cells import CellKey
from percolator.records import LockCell
from percolator.testing import ProtocolHarness
from percolator.timestamps.hybrid import physical_ms
from percolator.transaction import Transaction
from percolator.watermark import WatermarkTimeoutError, compute_watermarks
from tests.conftest import ClientSettings, connect_client
from tests.observers import helpers
from tests.observers.helpers import EVENTS, MIRROR, Mirror, MirrorLogger, RunLogger
from tests.observers.procs import run_cli

# Short lock waits: a run that meets a lock left in flight gives up at once (a conflict).
PROPERTY_CLIENT = ClientSettings(
    lock_ttl_ms=60_000, lock_wait_ms=20, oracle="manual", setup=helpers.create_tables
)

WAIT_CLIENT = ClientSettings(oracle="shared", setup=helpers.create_tables)


@pytest.fixture(autouse=True)
def _no_failpoints() -> Iterator[None]:
    yield
    failpoints.disable()


def committed_changes(client: percolator.Client, rows: list[bytes]) -> dict[bytes, set[int]]:
    """Every committed change of ``obs_events/value`` per row, from the store: the write
    records plus a commit held only in the lock cell."""
    found: dict[bytes, set[int]] = {row: set() for row in rows}
    cells = client.store.read_rows(
        EVENTS, rows, columns=[(WRITE, b"value"), (LOCK, b"value")], max_versions=2**31 - 1
    )
    for row, by_column in cells.items():
        for version, _ in by_column.get((WRITE, b"value"), []):
            found[row].add(version)
        for _, value in by_column.get((LOCK, b"value"), [])[:1]:
            last = LockCell.decode(value).last_commit
            if last is not None:
                found[row].add(last.commit_ts)
    return found


def acks(client: percolator.Client, observer: str, rows: list[bytes]) -> dict[bytes, int | None]:
    txn = client.observer_transaction()
    try:
        return {row: read_ack(txn, observer, EVENTS, row, "value") for row in rows}
    finally:
        txn.rollback()


def judge(client: percolator.Client, watermark: int, rows: list[bytes]) -> None:
    ack = acks(client, "run-logger", rows)
    for row, commits in committed_changes(client, rows).items():
        for commit_ts in commits:
            if commit_ts < watermark:
                assert ack[row] is not None and ack[row] >= commit_ts, (
                    f"watermark {watermark} passed the unprocessed change {row!r}@{commit_ts} "
                    f"(ack {ack[row]})"
                )


# Twelve seeds: enough that ignoring in-flight locks, or holding a dirty cell at its newest
# instead of its oldest notify version, fails several of them.
@pytest.mark.parametrize("seed", range(1, 13))
def test_watermark_never_passes_an_unprocessed_change(local_store_url: str, seed: int) -> None:
    rng = random.Random(seed)
    client = connect_client(local_store_url, PROPERTY_CLIENT)
    try:
        observer = RunLogger()
        register_observers(client, [observer])
        harness = ProtocolHarness(client.store, EVENTS)
        lot = ParkingLot(client)
        rows = [b"r%d" % i for i in range(5)]
        # row -> (start_ts, commit_ts or None, notified): transactions left in flight
        in_flight: dict[bytes, tuple[int, int | None, bool]] = {}
        last = 0
        steps = {"write": 0, "in_flight": 0, "decide": 0, "run": 0, "crash": 0, "park": 0}

        def pending() -> list[notifications.Notification]:
            parked = lot.parked()
            return [
                n
                for n in notifications.pending(client.store, EVENTS, ["value"])
                if not skips(parked, n)
            ]

        for _ in range(60):
            op = rng.choice(
                ["write", "write", "in_flight", "decide", "run", "run", "run", "crash", "park"]
            )
            row = rng.choice(rows)
            if op == "write" and row not in in_flight:
                with client.transaction() as txn:
                    txn.set(EVENTS, row, "value", b"v%d" % rng.randrange(100))
            elif op == "in_flight" and row not in in_flight:
                start_ts = client.oracle.get_timestamp()
                harness.must_prewrite(
                    [(row, "value", b"inflight")],
                    primary=(row, "value"),
                    start_ts=start_ts,
                    ttl_ms=60_000,
                )
                # Where the commit stopped: prewritten only; commit timestamp drawn but no
                # notification written yet; notification written, primary not decided yet.
                stage = rng.choice(["prewritten", "drawn", "notified"])
                commit_ts = None
                if stage != "prewritten":
                    commit_ts = client.oracle.get_timestamp()
                if stage == "notified":
                    notifications.put_notifications(
                        client.store, [CellKey(EVENTS, row, "value")], commit_ts
                    )
                in_flight[row] = (start_ts, commit_ts, stage == "notified")
            elif op == "decide" and in_flight:
                row = rng.choice(sorted(in_flight))
                start_ts, commit_ts, notified = in_flight.pop(row)
                if rng.random() < 0.7:
                    if commit_ts is None:
                        commit_ts = client.oracle.get_timestamp()
                    if not notified:
                        notifications.put_notifications(
                            client.store, [CellKey(EVENTS, row, "value")], commit_ts
                        )
                    harness.must_commit_primary((row, "value"), start_ts, commit_ts)
                else:
                    harness.must_rollback((row, "value"), start_ts)
            elif op in ("run", "crash") and pending():
                notification = rng.choice(pending())
                if op == "crash":
                    point = rng.choice(["observer.before_commit", "observer.before_cleanup"])
                    failpoints.enable(point, "raise")
                # A crashed run, or a conflict with a transaction in flight.
                with contextlib.suppress(Exception):
                    process_notification(client, observer, notification, attempts=1)
                failpoints.disable()
            elif op == "park" and pending():
                if lot.records() and rng.random() < 0.5:
                    lot.retry(lot.records())
                else:
                    lot.park("run-logger", rng.choice(pending()), 3, "told to fail")
            else:
                continue
            steps[op] += 1
            current = compute_watermarks(client.store, client.oracle)["run-logger"].watermark
            assert current >= last, f"the watermark went back from {last} to {current}"
            last = current
            judge(client, current, rows)
        assert steps["run"] and steps["write"], steps
        # Settle: decide what is in flight, retry the parked, drain; the watermark passes.
        for row, (start_ts, _, _) in sorted(in_flight.items()):
            harness.must_rollback((row, "value"), start_ts)
        lot.retry(lot.records())
        settled = client.oracle.get_timestamp()
        run_until_quiet(client, [observer])
        final = client.wait_for(settled, ["run-logger"], timeout=10)["run-logger"]
        assert final.watermark > settled and final.pending == 0
        judge(client, final.watermark, rows)
    finally:
        client.close()


def test_lock_in_flight_holds_the_watermark_below_its_start(
    local_client: percolator.Client,
) -> None:
    client = local_client
    register_observers(client, [RunLogger()])
    harness = ProtocolHarness(client.store, EVENTS)
    start_ts = client.oracle.get_timestamp()
    harness.must_prewrite([(b"x", "value", b"1")], primary=(b"x", "value"), start_ts=start_ts)
    result = compute_watermarks(client.store, client.oracle)["run-logger"]
    assert result.watermark <= start_ts and result.locks == 1
    assert "locked at" in result.describe()
    harness.must_rollback((b"x", "value"), start_ts)
    assert compute_watermarks(client.store, client.oracle)["run-logger"].watermark > start_ts


def test_the_oldest_notify_version_holds_it_back(local_client: percolator.Client) -> None:
    """Two unprocessed changes of one cell: the scan shows the newer, the watermark stays
    below the older."""
    client = local_client
    register_observers(client, [RunLogger()])
    commits = []
    for value in (b"1", b"2"):
        with client.transaction() as txn:
            txn.set(EVENTS, b"x", "value", value)
        assert txn.commit_ts is not None
        commits.append(txn.commit_ts)
    result = compute_watermarks(client.store, client.oracle)["run-logger"]
    assert result.watermark <= commits[0] and result.pending == 1


class DeclaredMirror(Mirror):
    outputs = ((MIRROR, "value"),)


class DeclaredLogger(RunLogger):
    outputs = ((helpers.RUNS, "covers"), (helpers.RUNS, "value"))


def test_cascading_holds_a_downstream_observer_back(local_client: percolator.Client) -> None:
    client = local_client
    mirror, downstream, other = DeclaredMirror(), MirrorLogger(), DeclaredLogger()
    downstream.outputs = ((helpers.RUNS, "covers"), (helpers.RUNS, "value"))  # type: ignore[misc]
    register_observers(client, [mirror, downstream, other])
    with client.transaction() as txn:
        txn.set(EVENTS, b"x", "chain", b"1")
    assert txn.commit_ts is not None
    results = compute_watermarks(client.store, client.oracle)
    assert results["mirror"].watermark <= txn.commit_ts
    # mirror-logger has nothing pending itself, but its input is mirror's output.
    assert results["mirror-logger"].own > txn.commit_ts
    assert results["mirror-logger"].watermark <= txn.commit_ts
    assert results["mirror-logger"].held_by == "mirror"
    # run-logger declares outputs no one watches upstream of it: it is not held back.
    assert results["run-logger"].watermark > txn.commit_ts


def test_undeclared_outputs_hold_every_other_observer_back(local_client: percolator.Client) -> None:
    client = local_client
    register_observers(client, [Mirror(), DeclaredLogger()])
    with client.transaction() as txn:
        txn.set(EVENTS, b"x", "chain", b"1")
    assert txn.commit_ts is not None
    results = compute_watermarks(client.store, client.oracle)
    assert results["run-logger"].held_by == "mirror"
    assert results["run-logger"].watermark <= txn.commit_ts


def test_bad_outputs_are_refused(local_client: percolator.Client) -> None:
    bad = RunLogger()
    bad.outputs = ("counts",)  # type: ignore[assignment]
    with pytest.raises(InvalidArgumentError, match=r"run-logger.*table, column"):
        register_observers(local_client, [bad])


# --------------------------------------------------------------------------- wait


class Doubler(Observer):
    """Derives ``obs_mirror/double`` = 2 x ``obs_events/num``."""

    name = "doubler"
    table = EVENTS
    columns = ("num",)
    outputs = ((MIRROR, "double"),)

    def process(self, txn: Transaction, row: bytes, column: str) -> None:
        value = txn.get(EVENTS, row, column)
        txn.set(MIRROR, row, "double", str(2 * int(value or b"0")).encode())


class DoubleLogger(Observer):
    """Derives ``obs_mirror/quad`` = 2 x ``obs_mirror/double`` (a second stage)."""

    name = "double-logger"
    table = MIRROR
    columns = ("double",)
    outputs = ((MIRROR, "quad"),)

    def process(self, txn: Transaction, row: bytes, column: str) -> None:
        value = txn.get(MIRROR, row, column)
        txn.set(MIRROR, row, "quad", str(2 * int(value or b"0")).encode())


def _wait_returns_with_derived_data_complete(url: str) -> None:
    client = connect_client(url, WAIT_CLIENT)
    worker = Worker(client, [Doubler(), DoubleLogger()], WorkerOptions(threads=2))
    try:
        worker.start()
        for round_ in range(3):
            with client.transaction() as txn:
                for i in range(10):
                    txn.set(EVENTS, b"n%d" % i, "num", str(i + round_).encode())
            # Only the last stage is named: cascading makes it wait for the first too.
            client.wait_for(observers=["double-logger"], timeout=60)
            snap = client.snapshot()
            for i in range(10):
                assert snap.get(MIRROR, b"n%d" % i, "quad") == str(4 * (i + round_)).encode()
    finally:
        worker.stop()
        client.close()


def test_wait_returns_when_derived_data_is_complete(local_store_url: str) -> None:
    _wait_returns_with_derived_data_complete(local_store_url)


@pytest.mark.hbase
def test_wait_returns_when_derived_data_is_complete_on_hbase(hbase_store_url: str) -> None:
    _wait_returns_with_derived_data_complete(hbase_store_url)


def test_wait_times_out_naming_what_is_pending(local_client: percolator.Client) -> None:
    client = local_client
    register_observers(client, [RunLogger()])
    with client.transaction() as txn:
        txn.set(EVENTS, b"stuck", "value", b"1")
    ParkingLot(client).park(
        "run-logger",
        notifications.pending(client.store, EVENTS, ["value"])[0],
        3,
        "boom",
    )
    with pytest.raises(WatermarkTimeoutError) as caught:
        client.wait_for(timeout=0.2)
    message = str(caught.value)
    assert "run-logger" in message and "stuck" in message
    assert "1 pending" in message and "1 parked" in message


def test_wait_refuses_unknown_observers_and_bad_timeouts(local_client: percolator.Client) -> None:
    register_observers(local_client, [RunLogger()])
    with pytest.raises(InvalidArgumentError, match=r"'nope' not registered.*run-logger"):
        local_client.wait_for(observers=["nope"], timeout=1)
    with pytest.raises(InvalidArgumentError, match="timeout"):
        local_client.wait_for(timeout=-1)


def test_wait_with_nothing_registered_returns_at_once(local_client: percolator.Client) -> None:
    assert local_client.wait_for(timeout=0) == {}


def test_concurrent_waiters_and_publishers_stay_monotonic(local_client: percolator.Client) -> None:
    client = local_client
    register_observers(client, [RunLogger()])
    seen: list[int] = []
    errors: list[BaseException] = []

    def compute() -> None:
        try:
            for _ in range(5):
                seen.append(compute_watermarks(client.store, client.oracle)["run-logger"].watermark)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=compute) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    final = compute_watermarks(client.store, client.oracle)["run-logger"].watermark
    assert final >= max(seen)


# --------------------------------------------------------------------------- catch-up


def _catch_up_processes_existing_data_once(url: str) -> None:
    client = connect_client(url, WAIT_CLIENT)
    try:
        commits = {}
        for i in range(6):
            with client.transaction() as txn:
                txn.set(EVENTS, b"old%d" % i, "value", b"v%d" % i)
            commits[b"old%d" % i] = txn.commit_ts
        observer = RunLogger()
        register_observers(client, [observer])
        # The watermark starts below the oldest change it owes.
        result = compute_watermarks(client.store, client.oracle)["run-logger"]
        assert result.watermark <= min(commits.values())
        run_until_quiet(client, [observer])
        client.wait_for(observers=["run-logger"], timeout=30)
        assert helpers.runs(client.snapshot()) == {row: [c] for row, c in commits.items()}
        # Registering again changes nothing: nothing is owed.
        register_observers(client, [observer])
        assert notifications.pending(client.store, EVENTS, ["value"]) == []
        # Unregistered, written, registered again: only the new change is processed.
        assert unregister_observer(client, "run-logger")
        with client.transaction() as txn:
            txn.set(EVENTS, b"old0", "value", b"while unwatched")
        assert notifications.pending(client.store, EVENTS, ["value"]) == []
        register_observers(client, [observer])
        held = compute_watermarks(client.store, client.oracle)["run-logger"]
        assert held.watermark <= txn.commit_ts
        run_until_quiet(client, [observer])
        client.wait_for(observers=["run-logger"], timeout=30)
        expected = {row: [c] for row, c in commits.items()}
        expected[b"old0"].append(txn.commit_ts)
        assert helpers.runs(client.snapshot()) == expected
        assert helpers.uncovered(client, "run-logger", EVENTS, "value", list(commits)) == []
    finally:
        client.close()


def test_catch_up_processes_existing_data_exactly_once(local_store_url: str) -> None:
    _catch_up_processes_existing_data_once(local_store_url)


@pytest.mark.hbase
def test_catch_up_processes_existing_data_exactly_once_on_hbase(hbase_store_url: str) -> None:
    _catch_up_processes_existing_data_once(hbase_store_url)


def test_worker_start_catches_up(local_store_url: str) -> None:
    client = connect_client(local_store_url, WAIT_CLIENT)
    try:
        with client.transaction() as txn:
            for i in range(5):
                txn.set(EVENTS, b"n%d" % i, "num", str(i).encode())
        worker = Worker(client, [Doubler(), DoubleLogger()], WorkerOptions(threads=2))
        worker.start()
        try:
            client.wait_for(txn.commit_ts, observers=["double-logger"], timeout=60)
            snap = client.snapshot()
            for i in range(5):
                assert snap.get(MIRROR, b"n%d" % i, "quad") == str(4 * i).encode()
        finally:
            worker.stop()
    finally:
        client.close()


def test_an_unfinished_catch_up_holds_the_watermark_at_zero(
    local_client: percolator.Client,
) -> None:
    client = local_client
    with client.transaction() as txn:
        txn.set(EVENTS, b"old", "value", b"1")
    observer = RunLogger()
    register_observers(client, [observer], catch_up=False)
    watermark.begin_catch_up(client.store, "run-logger", None)  # ... and the process died here
    result = compute_watermarks(client.store, client.oracle)["run-logger"]
    assert result.watermark == 0 and result.catching_up
    assert "catch-up not finished" in result.describe()
    reports = finish_registration(client, [observer])
    assert [r.owed for r in reports] == [1]
    assert not watermark.catch_up_owed(client.store, "run-logger")
    run_until_quiet(client, [observer])
    assert client.wait_for(observers=["run-logger"], timeout=10)["run-logger"].pending == 0
    assert helpers.runs(client.snapshot()) == {b"old": [txn.commit_ts]}


# --------------------------------------------------------------------------- commands


def test_wait_and_catch_up_commands(tmp_path: Path, plugin_dir: Path) -> None:
    url = f"embedded:{tmp_path / 'store'}"
    client = connect_client(url, WAIT_CLIENT)
    try:
        with client.transaction() as txn:
            txn.set(EVENTS, b"old", "value", b"1")
        register_observers(client, [RunLogger()], catch_up=False)
    finally:
        client.close()
    # Nothing notified the old row: the watermark passes it although it is not processed.
    caught = run_cli(["catch-up", "run-logger", "--store", url], plugin_dir)
    assert caught.returncode == 0, caught.stderr
    assert "1 of 1 cells notified" in caught.stdout
    timed_out = run_cli(["wait", "--store", url, "--timeout", "0.3"], plugin_dir)
    assert timed_out.returncode == 3, timed_out.stderr
    assert "run-logger" in timed_out.stderr and "old" in timed_out.stderr
    marks = run_cli(["watermarks", "--store", url, "--json"], plugin_dir)
    assert marks.returncode == 0, marks.stderr
    doc = json.loads(marks.stdout)
    assert doc["observer"] == "run-logger" and doc["pending"] == 1 and doc["lag_ms"] >= 0
    client = connect_client(url, WAIT_CLIENT)
    try:
        run_until_quiet(client, [RunLogger()])
    finally:
        client.close()
    passed = run_cli(["wait", "--store", url, "--observer", "run-logger", "--timeout", "30"])
    assert passed.returncode == 0, passed.stderr
    assert "run-logger" in passed.stdout
    missing = run_cli(["wait", "--store", f"embedded:{tmp_path / 'none'}"])
    assert missing.returncode != 0 and "does not exist" in missing.stderr


def test_worker_metrics_report_watermark_and_lag(local_store_url: str) -> None:
    from tests.observers.test_worker import scrape

    client = connect_client(local_store_url, WAIT_CLIENT)
    worker = Worker(client, [Doubler()], WorkerOptions(threads=1, metrics_port=0))
    try:
        worker.start()
        with client.transaction() as txn:
            txn.set(EVENTS, b"m", "num", b"1")
        client.wait_for(txn.commit_ts, ["doubler"], timeout=30)
        metrics = scrape(worker)
        mark = metrics['percolator_observer_watermark_seconds{observer="doubler"}']
        lag = metrics['percolator_observer_watermark_lag_seconds{observer="doubler"}']
        assert mark * 1000 > physical_ms(txn.commit_ts) and 0 <= lag < 60
    finally:
        worker.stop()
        client.close()


def test_status_reports_each_watermark(tmp_path: Path) -> None:
    url = f"embedded:{tmp_path / 'store'}"
    client = connect_client(url, WAIT_CLIENT)
    try:
        register_observers(client, [RunLogger()])
        with client.transaction() as txn:
            txn.set(EVENTS, b"late", "value", b"1")
        ParkingLot(client).park(
            "run-logger", notifications.pending(client.store, EVENTS, ["value"])[0], 3, "boom"
        )
    finally:
        client.close()
    result = run_cli(["status", "--store", url, "--json"])
    (mark,) = json.loads(result.stdout)["watermarks"]["observers"]
    assert mark["observer"] == "run-logger" and mark["pending"] == 1 and mark["parked"] == 1
    assert mark["watermark"] <= txn.commit_ts and mark["lag_ms"] >= 0
    text = run_cli(["status", "--store", url])
    assert "watermark run-logger:" in text.stdout and "1 parked" in text.stdout


def test_catch_up_of_a_table_that_does_not_exist_yet_owes_nothing(
    local_client: percolator.Client,
) -> None:
    """An observer registered ahead of its table (a bulk load creates it later) registers
    without error, owes nothing, and its watermark is not held by a catch-up."""

    class Ahead(Observer):
        name = "ahead"
        table = "created_later"
        columns = ("c",)

        def process(self, txn: Transaction, row: bytes, column: str) -> None:
            pass

    from percolator.observers.catchup import catch_up

    register_observers(local_client, [Ahead()])  # catches up by default: nothing to scan
    report = catch_up(local_client, "ahead")
    assert report.owed == 0 and report.scanned == 0
    assert not compute_watermarks(local_client.store, local_client.oracle)["ahead"].catching_up


class _UndeclaredDoubler(Doubler):
    outputs = None  # type: ignore[assignment]  # may write anything: upstream of all


class _UndeclaredDoubleLogger(DoubleLogger):
    outputs = None  # type: ignore[assignment]


@pytest.mark.parametrize("declared", [True, False], ids=["declared-outputs", "cycle"])
def test_an_upstream_run_between_the_scans_still_holds_the_downstream_watermark(
    local_client: percolator.Client, monkeypatch: pytest.MonkeyPatch, declared: bool
) -> None:
    """The doubler's run commits (writing the double-logger's notification and cleaning up
    its own) right after the first scan of a watermark computation.  Whichever observer was
    scanned first, the double-logger's watermark must stay at or below the change: its
    derived data is not complete.  With declared outputs the doubler is scanned first; with
    none the two are each other's upstream (a cycle, broken at the smaller name, the
    double-logger), and the double-logger's notifications are read again."""
    client = local_client
    doubler = Doubler() if declared else _UndeclaredDoubler()
    logger = DoubleLogger() if declared else _UndeclaredDoubleLogger()
    register_observers(client, [doubler, logger])
    with client.transaction() as txn:
        txn.set(EVENTS, b"n1", "num", b"1")
    change_ts = txn.commit_ts
    assert change_ts is not None
    real_scan = watermark._scan_own
    ran: list[int] = []

    def scan_then_run_the_doubler(*args: object, **kwargs: object) -> int:
        bound = real_scan(*args, **kwargs)  # type: ignore[arg-type]
        if not ran:
            for notification in notifications.pending(client.store, EVENTS, ["num"]):
                process_notification(client, doubler, notification)
            ran.append(1)
        return bound

    monkeypatch.setattr(watermark, "_scan_own", scan_then_run_the_doubler)
    marks = compute_watermarks(client.store, client.oracle, publish=False)
    assert ran
    assert notifications.pending(client.store, EVENTS, ["num"]) == []
    assert client.snapshot().get(MIRROR, b"n1", "double") == b"2"
    assert marks["double-logger"].watermark <= change_ts

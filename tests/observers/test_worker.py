"""The worker in one process (observers/worker.py): scanners and pool, chains of observers,
back-off, parking and retry, metrics, graceful shutdown.  Its parts alone: test_finder.py
(scanning, scanner positions) and test_processor.py (queue, back-off, parking)."""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Callable

import pytest
from percolator.observers.metrics import parse_text
from percolator.observers.parking import ParkingLot, pending
from percolator.observers.worker import Worker, WorkerOptions

import percolator
from percolator.errors import ConfigError
from percolator.store.base import Store
from percolator.testing import ProtocolHarness
from percolator.transaction import Transaction
from tests.observers import helpers
from tests.observers.helpers import CONTROL, EVENTS, MIRROR, runs, wait_for
from tests.observers.procs import wait_quiet

FAST = WorkerOptions(
    threads=4,
    scanners=2,
    failure_limit=3,
    backoff_base_s=0.01,
    backoff_max_s=0.05,
    idle_sleep_s=0.01,
    housekeeping_s=0.1,
    parked_refresh_s=0.2,
    metrics_port=0,
)


def scrape(worker: Worker) -> dict[str, float]:
    url = f"http://127.0.0.1:{worker.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return parse_text(response.read().decode())


def set_cells(client: percolator.Client, column: str, values: dict[bytes, bytes]) -> None:
    with client.transaction() as txn:
        for row, value in values.items():
            txn.set(EVENTS, row, column, value)


def test_chained_observers_run_at_most_once_per_change_and_end_acknowledged(
    local_client: percolator.Client, start_worker: Callable[..., Worker]
) -> None:
    client = local_client
    start_worker([helpers.RunLogger(), helpers.Mirror(), helpers.MirrorLogger()], FAST)
    rows = [b"row%02d" % i for i in range(12)]
    for round_ in range(6):
        set_cells(client, "value", {r: b"v%d" % round_ for r in rows})
        set_cells(client, "chain", {r: b"c%d" % round_ for r in rows[::2]})
        time.sleep(0.02)
    # The watermarks pass only once every write and what was derived from it is processed.
    client.wait_for(timeout=60)

    snapshot = client.snapshot()
    for prefix in (b"log:", b"chain:", b"mirror:"):
        assert helpers.duplicate_runs(runs(snapshot, prefix)) == []
    assert helpers.uncovered(client, "run-logger", EVENTS, "value", rows) == []
    assert helpers.uncovered(client, "mirror", EVENTS, "chain", rows) == []
    assert helpers.uncovered(client, "mirror-logger", MIRROR, "value", rows[::2]) == []
    # The last run of each cell saw the last value.
    mirrored = dict(snapshot.scan(MIRROR, columns=["value"]))
    assert mirrored == {r: {"value": b"c5"} for r in rows[::2]}
    assert set(runs(snapshot, b"mirror:")) == set(rows[::2])


def test_a_failing_notification_is_parked_the_others_keep_running_and_retry_works(
    local_client: percolator.Client, start_worker: Callable[..., Worker]
) -> None:
    client = local_client
    with client.transaction() as txn:
        txn.set(CONTROL, b"switch", "fail", b"1")
    worker = start_worker([helpers.AlwaysFails(), helpers.Flaky(), helpers.RunLogger()], FAST)
    lot = ParkingLot(client)
    set_cells(client, "poison", {b"p1": b"x", b"p2": b"x"})
    set_cells(client, "flaky", {b"f1": b"x"})
    set_cells(client, "value", {b"v1": b"x"})
    wait_for(lambda: len(lot.records()) == 3, what="three parked notifications")

    parked = {(r.observer, r.row): r for r in lot.records()}
    assert set(parked) == {("always-fails", b"p1"), ("always-fails", b"p2"), ("flaky", b"f1")}
    assert parked[("always-fails", b"p1")].failures == FAST.failure_limit
    assert "RuntimeError: boom on b'p1'" in parked[("always-fails", b"p1")].last_error
    # The others keep running, also on new changes after the parking.
    set_cells(client, "value", {b"v2": b"y"})
    wait_for(lambda: set(runs(client.snapshot())) == {b"v1", b"v2"}, what="run-logger runs")
    # Parked cells are not retried: their notifications stay, nobody runs them.
    failures = scrape(worker)['percolator_observer_failures_total{observer="always-fails"}']
    assert failures == 2 * FAST.failure_limit
    time.sleep(0.3)
    metrics = scrape(worker)
    assert metrics['percolator_observer_failures_total{observer="always-fails"}'] == failures
    assert metrics['percolator_observer_parked{observer="always-fails"}'] == 2
    assert metrics['percolator_observer_parked_total{observer="flaky"}'] == 1
    assert sorted(r for r, _, _ in pending(client, EVENTS, ["poison"])) == [b"p1", b"p2"]

    # Fix the cause, retry: the run happens, the record goes.
    with client.transaction() as txn:
        txn.set(CONTROL, b"switch", "fail", b"0")
    assert lot.retry(lot.records(observer="flaky")) == [parked[("flaky", b"f1")]]
    wait_for(lambda: b"f1" in runs(client.snapshot(), b"flaky:"), what="the retried run")
    assert helpers.uncovered(client, "flaky", EVENTS, "flaky", [b"f1"]) == []
    wait_for(lambda: pending(client, EVENTS, ["flaky"]) == [], what="flaky cleaned up")
    assert {r.observer for r in lot.records()} == {"always-fails"}

    # An observer that still fails is parked again after the limit, counting from zero.
    lot.retry(lot.records(observer="always-fails"))
    wait_for(
        lambda: scrape(worker)['percolator_observer_parked_total{observer="always-fails"}'] == 4,
        what="parked again",
    )
    assert len(lot.records(observer="always-fails")) == 2


def test_failures_back_off(
    local_client: percolator.Client, start_worker: Callable[..., Worker]
) -> None:
    options = WorkerOptions(
        failure_limit=100, backoff_base_s=0.5, idle_sleep_s=0.01, metrics_port=0
    )
    worker = start_worker([helpers.AlwaysFails()], options)
    set_cells(local_client, "poison", {b"p": b"x"})
    time.sleep(1.2)
    failures = scrape(worker)['percolator_observer_failures_total{observer="always-fails"}']
    # Without back-off this would be hundreds; with it (0.25..0.75 s, then 0.5..1.5 s)
    # at most three fit in 1.2 s.
    assert 1 <= failures <= 3


def test_metrics_show_backlog_runs_and_latency(
    local_client: percolator.Client, start_worker: Callable[..., Worker]
) -> None:
    gate = helpers.Gate()
    options = WorkerOptions(threads=1, idle_sleep_s=0.01, metrics_port=0)
    worker = start_worker([gate], options)
    set_cells(local_client, "gated", {b"g%d" % i: b"x" for i in range(5)})
    assert gate.entered.wait(10)
    metrics = scrape(worker)
    assert metrics['percolator_observer_backlog{observer="gate"}'] == 5  # one in flight
    # Counters start at zero: the series is there before the first run commits.
    assert metrics['percolator_observer_runs_total{observer="gate"}'] == 0
    gate.release.set()
    wait_quiet(local_client, [EVENTS])
    time.sleep(1.05)  # the backlog is recounted at most once a second
    metrics = scrape(worker)
    assert metrics['percolator_observer_backlog{observer="gate"}'] == 0
    assert metrics['percolator_observer_runs_total{observer="gate"}'] == 5
    assert metrics['percolator_observer_latency_seconds_count{observer="gate"}'] == 5
    assert metrics['percolator_observer_latency_seconds_bucket{observer="gate",le="+Inf"}'] == 5
    assert metrics["percolator_scanner_passes_total"] >= 1


def test_metrics_show_the_age_of_locks_the_runs_met(
    local_client: percolator.Client, start_worker: Callable[..., Worker]
) -> None:
    gate = helpers.Gate()
    worker = start_worker([gate], WorkerOptions(threads=1, idle_sleep_s=0.01, metrics_port=0))
    zero = scrape(worker)
    for outcome in ("alive", "committed", "rolled_back"):
        assert zero[f'percolator_locks_met_age_seconds_count{{outcome="{outcome}"}}'] == 0
    set_cells(local_client, "gated", {b"g0": b"x"})
    assert gate.entered.wait(10)  # the only thread is held: g1 waits
    set_cells(local_client, "gated", {b"g1": b"x"})
    # A client that died in its prewrite leaves a lock on g1, expired at once.
    dead = ProtocolHarness(local_client.store, EVENTS)
    dead.prewrite(
        [(b"g1", "gated", b"dead")],
        primary=(b"g1", "gated"),
        start_ts=local_client.oracle.get_timestamp(),
        ttl_ms=1,
    )
    time.sleep(0.3)
    gate.release.set()
    wait_quiet(local_client, [EVENTS])
    met = scrape(worker)
    assert met['percolator_locks_met_age_seconds_count{outcome="rolled_back"}'] == 1
    assert met['percolator_locks_met_age_seconds_bucket{outcome="rolled_back",le="0.1"}'] == 0
    assert met['percolator_locks_met_age_seconds_bucket{outcome="rolled_back",le="5.0"}'] == 1
    assert local_client.snapshot().get(EVENTS, b"g1", "gated") == b"x"


def test_stop_lets_a_run_in_flight_finish(
    local_client: percolator.Client, start_worker: Callable[..., Worker]
) -> None:
    gate = helpers.Gate()
    worker = start_worker([gate], WorkerOptions(threads=1, idle_sleep_s=0.01))
    set_cells(local_client, "gated", {b"g": b"x"})
    assert gate.entered.wait(10)
    stopper = threading.Thread(target=worker.stop, kwargs={"drain_timeout_s": 20})
    stopper.start()
    time.sleep(0.2)
    assert stopper.is_alive()  # waiting for the run
    gate.release.set()
    stopper.join(20)
    assert not stopper.is_alive()
    assert b"g" in runs(local_client.snapshot(), b"gate:")
    assert pending(local_client, EVENTS, ["gated"]) == []


def test_stop_rolls_back_a_run_that_does_not_finish_in_time(
    local_client: percolator.Client, start_worker: Callable[..., Worker]
) -> None:
    gate = helpers.Gate()
    worker = start_worker([gate], WorkerOptions(threads=1, idle_sleep_s=0.01))
    set_cells(local_client, "gated", {b"g": b"x"})
    assert gate.entered.wait(10)
    stopper = threading.Thread(target=worker.stop, kwargs={"drain_timeout_s": 0.2})
    stopper.start()
    wait_for(worker._abort.is_set, what="the drain deadline")
    gate.release.set()  # the run's user code returns only now, past the deadline
    stopper.join(20)
    assert runs(local_client.snapshot(), b"gate:") == {}
    assert helpers.uncovered(local_client, "gate", EVENTS, "gated", [b"g"]) != []
    assert [r for r, _, _ in pending(local_client, EVENTS, ["gated"])] == [b"g"]


def test_an_observer_whose_setup_fails_is_left_out(
    local_client: percolator.Client, start_worker: Callable[..., Worker]
) -> None:
    class BadSetup(helpers.RunLogger):
        name = "bad-setup"
        columns = ("other",)

        def setup(self, client: percolator.Client) -> None:
            raise RuntimeError("cannot reach the index service")

    worker = start_worker([BadSetup(), helpers.RunLogger()], FAST)
    assert [o.name for o in worker.observers] == ["run-logger"]
    assert worker.errors == [("bad-setup", "RuntimeError: cannot reach the index service")]
    set_cells(local_client, "value", {b"r": b"x"})
    wait_for(lambda: b"r" in runs(local_client.snapshot()), what="run-logger run")


def test_a_worker_with_no_usable_observer_does_not_start(local_client: percolator.Client) -> None:
    class BadSetup(helpers.RunLogger):
        def setup(self, client: percolator.Client) -> None:
            raise RuntimeError("nope")

    with pytest.raises(ConfigError, match="no observer could be started: run-logger: "):
        Worker(local_client, [BadSetup()]).start()


def test_two_hosted_observers_on_one_column_are_refused(local_client: percolator.Client) -> None:
    class Twin(helpers.RunLogger):
        name = "twin"

    with pytest.raises(ConfigError, match="both watch obs_events/value"):
        Worker(local_client, [helpers.RunLogger(), Twin()])


@pytest.mark.parametrize(
    ("option", "value"), [("threads", 0), ("failure_limit", -1), ("backoff_base_s", -1.0)]
)
def test_bad_worker_options_are_config_errors(option: str, value: object) -> None:
    with pytest.raises(ConfigError, match=option):
        WorkerOptions(**{option: value})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("option", "bound"), [("threads", 256), ("scanners", 256), ("key_groups", 65_536)]
)
def test_thread_and_key_group_counts_are_bounded(option: str, bound: int) -> None:
    """A count past its bound is refused before any thread starts or group is listed (a
    mistyped one grew a process to 20 GB or ran out of OS threads); the bound itself is
    accepted."""
    assert getattr(WorkerOptions(**{option: bound}), option) == bound  # type: ignore[arg-type]
    for value in (bound + 1, 99_999_999_999):
        with pytest.raises(
            ConfigError,
            match=rf"worker option {option} must be an int in 1\.\.{bound}, got {value}",
        ):
            WorkerOptions(**{option: value})  # type: ignore[arg-type]


def test_default_threads_follow_the_store(store: Store) -> None:
    """One run thread where the store's calls take turns in this process (memory,
    embedded), four where a server does the work (HBase); given threads are kept."""
    expected = 4 if store.url.startswith("hbase") else 1
    assert store.calls_run_in_parallel == (expected == 4)
    assert WorkerOptions().for_store(store).run_threads == expected
    assert WorkerOptions(threads=3).for_store(store).run_threads == 3
    with pytest.raises(ConfigError, match="not set"):
        _ = WorkerOptions().run_threads


def test_a_worker_with_default_options_runs_one_thread_on_a_local_store(
    local_client: percolator.Client, start_worker: Callable[..., Worker]
) -> None:
    worker = start_worker([helpers.RunLogger()], WorkerOptions(idle_sleep_s=0.01))
    assert worker.options.threads == 1
    assert [t.name for t in worker._runners] == ["observer-run-0"]
    set_cells(local_client, "value", {b"r": b"1"})
    wait_for(lambda: b"r" in runs(local_client.snapshot()), what="run-logger run")


class _Sleepy(helpers.RunLogger):
    def process(self, txn: Transaction, row: bytes, column: str) -> None:
        time.sleep(0.002)
        super().process(txn, row, column)


def test_many_threads_on_many_cells(
    local_client: percolator.Client, start_worker: Callable[..., Worker]
) -> None:
    options = WorkerOptions(threads=8, scanners=3, scan_batch=7, idle_sleep_s=0.01)
    worker = start_worker([_Sleepy()], options)
    rows = [b"cell%03d" % i for i in range(150)]
    set_cells(local_client, "value", {r: b"1" for r in rows})
    set_cells(local_client, "value", {r: b"2" for r in rows[::3]})
    wait_quiet(local_client, [EVENTS])
    covered = runs(local_client.snapshot())
    assert set(covered) == set(rows)
    assert helpers.duplicate_runs(covered) == []
    assert helpers.uncovered(local_client, "run-logger", EVENTS, "value", rows) == []
    assert worker.metrics.passes.value() >= 1

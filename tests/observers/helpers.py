"""Test observers and the checks the observer tests make against the store.

Every test observer that counts runs writes a *run row* in the same transaction as its ack
(``obs_runs``: row ``<cell row>|<start_ts>``, column ``covers`` = the commit timestamp of
the observed cell it saw).  So only committed runs are counted, straight from the store,
never from logs.

The observers are also plugins: ``plugin_dir`` (tests/observers/conftest.py) declares them
in a ``percolator.observers`` entry-point group for worker subprocesses.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable

from percolator.observers.api import Observer

from percolator.client import Client
from percolator.notifications import Notification, pending, read_ack
from percolator.transaction import Snapshot, Transaction

EVENTS = "obs_events"
RUNS = "obs_runs"
MIRROR = "obs_mirror"
CONTROL = "obs_control"
TABLES = (EVENTS, RUNS, MIRROR, CONTROL)
# Upper bound of the random pause inside a run (widens race windows), from the environment
# so worker subprocesses can be told.
SLEEP_ENV = "OBS_TEST_SLEEP_MS"


def create_tables(client: Client) -> None:
    for table in TABLES:
        client.create_table(table)


def pending_events(client: Client, column: str = "value") -> list[Notification]:
    """What a scanner would find in ``obs_events``: the newest notify version of each dirty
    cell of ``column``."""
    return pending(client.store, EVENTS, [column])


def log_run(txn: Transaction, table: str, row: bytes, column: str, prefix: bytes = b"") -> None:
    """Record this run in ``obs_runs`` (committed with the run, or not at all)."""
    value, covers = txn.get_with_commit_ts(table, row, column)
    run_row = prefix + row + b"|" + b"%020d" % txn.start_ts
    txn.set(RUNS, run_row, "covers", str(covers).encode())
    txn.set(RUNS, run_row, "value", value if value is not None else b"<deleted>")


class _TestObserver(Observer):
    def setup(self, client: Client) -> None:
        create_tables(client)

    def pause(self) -> None:
        limit = int(os.environ.get(SLEEP_ENV, "0") or 0)
        if limit:
            time.sleep(random.uniform(0, limit / 1000))


class RunLogger(_TestObserver):
    """Logs every run of ``obs_events/value``."""

    name = "run-logger"
    table = EVENTS
    columns = ("value",)

    prefix = b"log:"

    def process(self, txn: Transaction, row: bytes, column: str) -> None:
        self.pause()
        log_run(txn, EVENTS, row, column, prefix=self.prefix)


class WeakRunLogger(RunLogger):
    name = "weak-run-logger"
    columns = ("weak",)
    weak = True
    prefix = b"weak:"


class Mirror(_TestObserver):
    """Copies ``obs_events/chain`` to ``obs_mirror/value`` (observed by MirrorLogger)."""

    name = "mirror"
    table = EVENTS
    columns = ("chain",)

    def process(self, txn: Transaction, row: bytes, column: str) -> None:
        self.pause()
        value = txn.get(EVENTS, row, column)
        log_run(txn, EVENTS, row, column, prefix=b"chain:")
        if value is None:
            txn.delete(MIRROR, row, "value")
        else:
            txn.set(MIRROR, row, "value", value)


class MirrorLogger(_TestObserver):
    name = "mirror-logger"
    table = MIRROR
    columns = ("value",)

    def process(self, txn: Transaction, row: bytes, column: str) -> None:
        self.pause()
        log_run(txn, MIRROR, row, column, prefix=b"mirror:")


class AlwaysFails(_TestObserver):
    name = "always-fails"
    table = EVENTS
    columns = ("poison",)

    def process(self, txn: Transaction, row: bytes, column: str) -> None:
        raise RuntimeError(f"boom on {row!r}")


class Flaky(_TestObserver):
    """Fails while ``obs_control/switch/fail`` is b"1", then logs its runs."""

    name = "flaky"
    table = EVENTS
    columns = ("flaky",)

    def process(self, txn: Transaction, row: bytes, column: str) -> None:
        if txn.get(CONTROL, b"switch", "fail") == b"1":
            raise RuntimeError(f"flaky observer told to fail on {row!r}")
        log_run(txn, EVENTS, row, column, prefix=b"flaky:")


class Gate(_TestObserver):
    """Blocks each run until :attr:`release` is set (in-process tests only)."""

    name = "gate"
    table = EVENTS
    columns = ("gated",)

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()

    def process(self, txn: Transaction, row: bytes, column: str) -> None:
        self.entered.set()
        self.release.wait(30)
        log_run(txn, EVENTS, row, column, prefix=b"gate:")


NOT_AN_OBSERVER = 42

PLUGINS = {
    "run-logger": "tests.observers.helpers:RunLogger",
    "weak-run-logger": "tests.observers.helpers:WeakRunLogger",
    "mirror": "tests.observers.helpers:Mirror",
    "mirror-logger": "tests.observers.helpers:MirrorLogger",
    "always-fails": "tests.observers.helpers:AlwaysFails",
    "flaky": "tests.observers.helpers:Flaky",
    # broken on purpose
    "broken-import": "tests.observers.no_such_module:Thing",
    "not-an-observer": "tests.observers.helpers:NOT_AN_OBSERVER",
    "misnamed": "tests.observers.helpers:RunLogger",
}


# --------------------------------------------------------------------------- store checks


def runs(snapshot: Snapshot, prefix: bytes = b"log:") -> dict[bytes, list[int]]:
    """Committed runs per observed row: the commit timestamps they covered, in run order.
    ``prefix`` selects one observer's runs (see each observer's ``log_run`` call)."""
    found: dict[bytes, list[tuple[int, int]]] = defaultdict(list)
    stop = prefix[:-1] + bytes([prefix[-1] + 1])
    for run_row, cells in snapshot.scan(RUNS, prefix, stop, columns=["covers"]):
        head, _, start_ts = run_row[len(prefix) :].rpartition(b"|")
        found[head].append((int(start_ts), int(cells["covers"])))
    return {row: [c for _, c in sorted(items)] for row, items in found.items()}


def duplicate_runs(covered: dict[bytes, list[int]]) -> list[str]:
    """Changes covered by more than one committed run."""
    problems = []
    for row, commits in covered.items():
        seen: set[int] = set()
        for commit_ts in commits:
            if commit_ts in seen:
                problems.append(f"{row!r}: change {commit_ts} committed more than one run")
            seen.add(commit_ts)
    return problems


def uncovered(
    client: Client, observer: str, table: str, column: str, rows: Iterable[bytes]
) -> list[str]:
    """Cells whose ack does not cover their latest write (read at a fresh timestamp)."""
    problems = []
    txn = client.observer_transaction()
    try:
        for row in rows:
            _, latest = txn.get_with_commit_ts(table, row, column)
            ack = read_ack(txn, observer, table, row, column)
            if latest is not None and (ack is None or ack < latest):
                problems.append(f"{table}/{row!r}/{column}: latest write {latest}, ack {ack}")
    finally:
        txn.rollback()
    return problems


def wait_for(condition: Callable[[], object], timeout: float = 30, what: str = "") -> None:
    """Poll ``condition`` every 20 ms until it holds; AssertionError after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what or condition}")

"""The run pool's part of a worker (observers/processor.py), driven in the test's thread: a
cell is queued once, conflicts back off without counting, failures back off and count, and a
cell that keeps failing is parked and skipped."""

from __future__ import annotations

import threading
import time

import pytest
from percolator.observers import processor as processor_module
from percolator.observers.api import Observer, register_observers
from percolator.observers.options import WorkerOptions
from percolator.observers.parking import ParkedNotification, ParkingLot
from percolator.observers.processor import NotificationProcessor
from percolator.observers.runner import ConflictExhaustedError, RunResult
from percolator.observers.worker import Worker
from percolator.observers.worker_metrics import WorkerMetrics

import percolator
from percolator import notifications
from percolator.errors import UndeterminedCommitError
from percolator.notifications import Notification
from percolator.protocol.cells import CellKey
from percolator.transaction import Transaction
from tests.observers import helpers
from tests.observers.helpers import EVENTS


def processor(
    client: percolator.Client, observer: Observer, options: WorkerOptions
) -> tuple[NotificationProcessor, WorkerMetrics]:
    metrics = WorkerMetrics(dict, dict)
    hosted = {(observer.table, column): observer for column in observer.columns}
    made = NotificationProcessor(
        client,
        hosted,
        options,
        metrics,
        ParkingLot(client),
        stopping=threading.Event(),
        abort=threading.Event(),
    )
    return made, metrics


def run_queued(pool: NotificationProcessor) -> None:
    """Run what is queued in this thread, as one run thread would."""
    pool.end_runs(1)
    pool.run_loop()


def poisoned(client: percolator.Client) -> Notification:
    with client.transaction() as txn:
        txn.set(EVENTS, b"p", "poison", b"x")
    assert txn.commit_ts is not None
    return Notification(EVENTS, b"p", "poison", txn.commit_ts)


def test_a_cell_in_flight_is_not_queued_twice(memory_client: percolator.Client) -> None:
    pool, _ = processor(memory_client, helpers.RunLogger(), WorkerOptions())
    notification = Notification(EVENTS, b"r", "value", 5)
    assert pool.offer(notification)
    assert not pool.offer(Notification(EVENTS, b"r", "value", 6))  # same cell
    run_queued(pool)  # nothing committed there: a run that only cleans up
    assert pool.offer(notification)


def test_a_failure_backs_off_and_the_limit_parks(memory_client: percolator.Client) -> None:
    client = memory_client
    observer = helpers.AlwaysFails()
    options = WorkerOptions(failure_limit=2, backoff_base_s=60)
    pool, metrics = processor(client, observer, options)
    notification = poisoned(client)
    assert pool.offer(notification)
    run_queued(pool)
    assert metrics.failures.value(observer="always-fails") == 1
    assert not pool.offer(notification)  # backing off for 30..90 s
    assert ParkingLot(client).records() == []

    pool.failed(observer, notification, RuntimeError("boom again"))
    [record] = ParkingLot(client).records()
    assert (record.observer, record.cell, record.failures) == ("always-fails", notification.cell, 2)
    assert "RuntimeError: boom again" in record.last_error
    assert metrics.parked.value(observer="always-fails") == 1
    assert pool.parked_cells() == {notification.cell}
    assert not pool.offer(notification)


@pytest.mark.parametrize(
    "error",
    [ConflictExhaustedError("lost every attempt", 3), UndeterminedCommitError("unknown")],
    ids=["conflicts", "undetermined"],
)
def test_conflicts_and_undetermined_commits_back_off_without_counting_as_failures(
    memory_client: percolator.Client, monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    def lose(*args: object, **kwargs: object) -> list[RunResult]:
        raise error

    monkeypatch.setattr(processor_module, "process_batch", lose)
    pool, metrics = processor(memory_client, helpers.RunLogger(), WorkerOptions())
    notification = Notification(EVENTS, b"r", "value", 5)
    assert pool.offer(notification)
    run_queued(pool)
    assert not pool.offer(notification)  # backing off
    assert metrics.failures.value(observer="run-logger") == 0
    expected = 3 if isinstance(error, ConflictExhaustedError) else 0
    assert metrics.conflicts.value(observer="run-logger") == expected
    assert pool.parked_cells() == set()


class HotCell(helpers.RunLogger):
    """Each run on row ``hot`` also writes a shared cell, which another writer commits
    first while the run is under way, the first ``fights`` times: those runs conflict."""

    def __init__(self, client: percolator.Client, fights: int) -> None:
        self.client = client
        self.fights = fights

    def process(self, txn: Transaction, row: bytes, column: str) -> None:
        super().process(txn, row, column)
        if row == b"hot":
            txn.set(EVENTS, b"shared", "tally", b"run")
            if self.fights > 0:
                self.fights -= 1
                with self.client.transaction() as other:
                    other.set(EVENTS, b"shared", "tally", b"other")


def test_a_batch_that_keeps_conflicting_is_split_so_only_the_hot_cell_waits(
    memory_client: percolator.Client,
) -> None:
    """A conflict on one cell aborts its whole batch; once the batch's attempts are spent its
    cells run one by one: the others commit at once, and only the hot cell, which conflicts
    alone too, backs off."""
    client = memory_client
    attempts = WorkerOptions().attempts
    observer = HotCell(client, fights=2 * attempts)  # every batched and every single attempt
    register_observers(client, [observer])
    with client.transaction() as txn:
        for row in (b"a", b"hot", b"c"):
            txn.set(EVENTS, row, "value", b"x")
    commit_ts = txn.commit_ts
    pool, metrics = processor(client, observer, WorkerOptions(batch_size=8, conflict_backoff_s=60))
    queued = helpers.pending_events(client)
    assert len(queued) == 3 and all(pool.offer(n) for n in queued)
    run_queued(pool)
    assert helpers.runs(client.snapshot()) == {b"a": [commit_ts], b"c": [commit_ts]}
    assert observer.fights == 0
    assert metrics.conflicts.value(observer="run-logger") == 2 * attempts
    [hot] = [n for n in queued if n.row == b"hot"]
    assert not pool.offer(hot)  # backing off
    assert [n.row for n in helpers.pending_events(client)] == [b"hot"]


def test_a_batch_takes_its_observers_notifications_from_between_others(
    memory_client: percolator.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scan of a table with two observed columns offers their notifications row by row,
    interleaved: each observer's still run in full batches, not one by one, and every
    notification runs exactly once."""
    batches: list[tuple[str, list[bytes]]] = []

    def record(client: object, observer: Observer, batch: list[Notification], **_: object) -> list:
        batches.append((observer.name, [n.row for n in batch]))
        return []

    monkeypatch.setattr(processor_module, "process_batch", record)
    strong, weak = helpers.RunLogger(), helpers.WeakRunLogger()
    metrics = WorkerMetrics(dict, dict)
    pool = NotificationProcessor(
        memory_client,
        {(EVENTS, "value"): strong, (EVENTS, "weak"): weak},
        WorkerOptions(batch_size=4),
        metrics,
        ParkingLot(memory_client),
        stopping=threading.Event(),
        abort=threading.Event(),
    )
    monkeypatch.setattr(pool, "_count", lambda *args: None)
    rows = [b"r%d" % i for i in range(3)]  # the queue's room is 8 (end marker included)
    for row in rows:
        for column in ("value", "weak"):
            assert pool.offer(Notification(EVENTS, row, column, 5))
    run_queued(pool)
    assert batches == [("run-logger", rows), ("weak-run-logger", rows)]


def test_a_parked_set_reload_racing_with_a_park_keeps_the_cell_parked(
    local_client: percolator.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The housekeeper reloads the parked set while a run thread parks a cell: if the reload
    read the store before the park was written, the cell must stay parked anyway (else it
    runs and fails again, counting from zero)."""
    observer = helpers.AlwaysFails()
    worker = Worker(local_client, [observer], WorkerOptions(failure_limit=1))
    processor = worker.processor
    helpers.create_tables(local_client)
    notification = Notification(EVENTS, b"p", "poison", 1)
    # Its notification is in the store (a record of a cell without one is dropped as run).
    notifications.put_notifications(local_client.store, [CellKey(EVENTS, b"p", "poison")], 1)
    read_store = worker.parking.records

    def read_then_park() -> list[ParkedNotification]:
        before = read_store()
        processor.failed(observer, notification, RuntimeError("boom"))
        return before

    monkeypatch.setattr(worker.parking, "records", read_then_park)
    processor.refresh_parked([EVENTS])
    assert notification.cell in processor.parked_cells()
    monkeypatch.setattr(worker.parking, "records", read_store)
    processor.refresh_parked([EVENTS])
    assert notification.cell in processor.parked_cells()  # now read from the store
    ParkingLot(local_client).retry(ParkingLot(local_client).records())
    processor.refresh_parked([EVENTS])
    assert notification.cell not in processor.parked_cells()


class FailsOnBadValue(helpers.RunLogger):
    """Fails while the observed cell holds ``bad``; logs the run otherwise."""

    def process(self, txn: Transaction, row: bytes, column: str) -> None:
        if txn.get(EVENTS, row, column) == b"bad":
            raise RuntimeError("cannot process bad")
        super().process(txn, row, column)


def write_value(client: percolator.Client, value: bytes) -> Notification:
    with client.transaction() as txn:
        txn.set(EVENTS, b"r", "value", value)
    [notification] = helpers.pending_events(client)
    return notification


def test_a_parked_cell_runs_its_next_change_and_that_run_deletes_the_record(
    memory_client: percolator.Client,
) -> None:
    """Parking sets a change aside, not the cell for ever: a later change of the cell (here
    the fix of its bad input) runs without an operator, and its run covers the parked change,
    so the record goes."""
    client = memory_client
    observer = FailsOnBadValue()
    register_observers(client, [observer])
    pool, metrics = processor(client, observer, WorkerOptions(failure_limit=1))
    bad = write_value(client, b"bad")
    assert pool.offer(bad)
    run_queued(pool)
    assert [r.cell for r in ParkingLot(client).records()] == [bad.cell]
    assert not pool.offer(bad)  # the parked change is skipped

    fixed = write_value(client, b"good")
    assert fixed.notify_ts > bad.notify_ts
    assert pool.offer(fixed)
    run_queued(pool)
    assert metrics.runs.value(observer="run-logger") == 1
    assert helpers.runs(client.snapshot()) == {b"r": [fixed.notify_ts]}
    assert ParkingLot(client).records() == []
    assert pool.parked_cells() == set()
    assert helpers.pending_events(client) == []


def test_a_run_of_the_parked_change_in_another_worker_deletes_the_record(
    memory_client: percolator.Client,
) -> None:
    """Failure counts are per worker: one worker may park a change that another then runs
    (its run was under way when it learnt of the park).  That run covers the change: the
    record goes, and the cell's later changes are not held back."""
    client = memory_client
    register_observers(client, [helpers.RunLogger()])
    notification = write_value(client, b"v1")
    failing, _ = processor(client, helpers.AlwaysFails(), WorkerOptions(failure_limit=1))
    other, _ = processor(client, helpers.RunLogger(), WorkerOptions())
    assert other.offer(notification)  # in flight here before the park
    failing.failed(helpers.AlwaysFails(), notification, RuntimeError("only here"))
    assert len(ParkingLot(client).records()) == 1
    other.refresh_parked([EVENTS])
    run_queued(other)
    assert helpers.runs(client.snapshot()) == {b"r": [notification.notify_ts]}
    assert ParkingLot(client).records() == []
    assert other.parked_cells() == set()


def test_a_newer_park_of_the_cell_survives_a_run_of_an_older_change(
    memory_client: percolator.Client,
) -> None:
    """A run deletes only a record of its own change or an older one: a park of a newer
    change (written by another worker meanwhile) stays."""
    client = memory_client
    register_observers(client, [helpers.RunLogger()])
    older = write_value(client, b"v1")
    newer = write_value(client, b"v2")
    lot = ParkingLot(client)
    assert lot.unpark_covered(older.cell, older.notify_ts) is None  # nothing parked
    lot.park("run-logger", newer, 3, "failed elsewhere")
    assert lot.unpark_covered(older.cell, newer.notify_ts - 1) == newer.notify_ts
    assert [r.notify_ts for r in lot.records()] == [newer.notify_ts]
    # Nor does a park of the older change replace it.
    assert lot.park("run-logger", older, 5, "failed here").notify_ts == newer.notify_ts
    assert [r.notify_ts for r in lot.records()] == [newer.notify_ts]
    assert lot.unpark_covered(newer.cell, newer.notify_ts) is None
    assert lot.records() == []


def test_a_newer_change_that_keeps_failing_is_parked_in_turn_across_reloads(
    memory_client: percolator.Client,
) -> None:
    """A reload of the parked set must not reset the failure count of a parked cell's newer
    change (which runs): once that change failed ``failure_limit`` times it is parked, the
    record naming it, instead of being retried for ever."""
    client = memory_client
    observer = FailsOnBadValue()
    register_observers(client, [observer])
    pool, metrics = processor(
        client, observer, WorkerOptions(failure_limit=2, backoff_base_s=0.001)
    )

    def fail_until_parked(notification: Notification) -> None:
        for _ in range(2):
            time.sleep(0.01)  # the back-off
            assert pool.offer(notification)
            run_queued(pool)
            pool.refresh_parked([EVENTS])  # the housekeeper's reload, between the failures

    first = write_value(client, b"bad")
    fail_until_parked(first)
    assert [r.notify_ts for r in ParkingLot(client).records()] == [first.notify_ts]
    again = write_value(client, b"bad")
    fail_until_parked(again)
    assert [r.notify_ts for r in ParkingLot(client).records()] == [again.notify_ts]
    assert metrics.parked.value(observer="run-logger") == 2
    assert not pool.offer(again)


def test_a_record_of_a_change_another_worker_ran_before_it_knew_goes_at_the_next_reload(
    memory_client: percolator.Client,
) -> None:
    """A worker that has not reloaded the parked set since a park runs the parked change and
    cleans its notification up, leaving the record: the next reload finds no notification at
    or below the parked version on the cell and deletes the record."""
    client = memory_client
    register_observers(client, [helpers.RunLogger()])
    notification = write_value(client, b"v1")
    failing, _ = processor(client, helpers.AlwaysFails(), WorkerOptions(failure_limit=1))
    other, _ = processor(client, helpers.RunLogger(), WorkerOptions())
    other.refresh_parked([EVENTS])
    assert other.offer(notification)
    failing.failed(helpers.AlwaysFails(), notification, RuntimeError("only here"))
    run_queued(other)
    assert helpers.pending_events(client) == []
    assert len(ParkingLot(client).records()) == 1
    failing.refresh_parked([EVENTS])
    assert ParkingLot(client).records() == []
    assert failing.parked_cells() == set()

"""One observer run, step by step (observers/runner.py): ack check, user code, ack, cleanup.

Scripts on every backend; runs are counted from the run rows the test observers commit with
their acks (tests/observers/helpers.py).
"""

from __future__ import annotations

import threading

import pytest
from percolator.observers.api import register_observers, trigger
from percolator.observers.parking import pending
from percolator.observers.runner import (
    ConflictExhaustedError,
    Outcome,
    cleanup,
    process_notification,
)

import percolator
from percolator import failpoints
from percolator.errors import InvalidArgumentError, PercolatorError
from percolator.failpoints import FailpointError
from percolator.layout import NOTIFY
from percolator.notifications import put_notifications, read_ack
from percolator.protocol.cells import CellKey
from percolator.transaction import Transaction
from tests.observers import helpers
from tests.observers.helpers import EVENTS, RunLogger, pending_events, runs


@pytest.fixture(autouse=True)
def _no_failpoints() -> object:
    yield
    failpoints.disable()


def write(client: percolator.Client, row: bytes, value: bytes, column: str = "value") -> int:
    with client.transaction() as txn:
        txn.set(EVENTS, row, column, value)
    assert txn.commit_ts is not None
    return txn.commit_ts


def ack_of(
    client: percolator.Client, observer: str, row: bytes, column: str = "value"
) -> int | None:
    txn = client.observer_transaction()
    try:
        return read_ack(txn, observer, EVENTS, row, column)
    finally:
        txn.rollback()


@pytest.fixture
def logger(client: percolator.Client) -> RunLogger:
    observer = RunLogger()
    register_observers(client, [observer])
    return observer


@pytest.fixture
def local_logger(local_client: percolator.Client) -> RunLogger:
    observer = RunLogger()
    register_observers(local_client, [observer])
    return observer


def test_a_write_notifies_at_its_commit_ts_and_one_run_acks_it(
    client: percolator.Client, logger: RunLogger
) -> None:
    commit_ts = write(client, b"r1", b"v1")
    [notification] = pending_events(client)
    assert notification.notify_ts == commit_ts

    result = process_notification(client, logger, notification)

    assert result.outcome is Outcome.COMMITTED
    assert result.observed_commit_ts == commit_ts
    assert result.cleaned
    assert ack_of(client, logger.name, b"r1") == commit_ts
    assert runs(client.snapshot()) == {b"r1": [commit_ts]}
    assert pending_events(client) == []


def test_unobserved_columns_leave_no_notification(
    local_client: percolator.Client, local_logger: RunLogger
) -> None:
    client = local_client
    write(client, b"r1", b"x", column="other")
    assert pending(client, EVENTS) == []


def test_a_stale_notification_only_cleans_up(
    local_client: percolator.Client, local_logger: RunLogger
) -> None:
    client, logger = local_client, local_logger
    commit_ts = write(client, b"r1", b"v1")
    [notification] = pending_events(client)
    process_notification(client, logger, notification)
    # The same notification again (a second worker that saw it too, or a crash before the
    # cleanup): the ack covers the change, the user code does not run.
    put_notifications(client.store, [CellKey(EVENTS, b"r1", "value")], commit_ts)
    again = process_notification(client, logger, notification)
    assert again.outcome is Outcome.ACKED
    assert runs(client.snapshot()) == {b"r1": [commit_ts]}


def test_many_writes_fold_into_one_run_that_sees_the_latest(
    local_client: percolator.Client, local_logger: RunLogger
) -> None:
    client, logger = local_client, local_logger
    commits = [write(client, b"r1", b"v%d" % i) for i in range(5)]
    [notification] = pending_events(client)
    assert notification.notify_ts == commits[-1]
    process_notification(client, logger, notification)
    assert runs(client.snapshot()) == {b"r1": [commits[-1]]}
    [(_, run)] = client.snapshot().scan(helpers.RUNS, columns=["value"])
    assert run["value"] == b"v4"
    assert pending(client, EVENTS) == []


def test_cleanup_never_deletes_a_notification_newer_than_the_scanner_saw(
    client: percolator.Client, logger: RunLogger
) -> None:
    first = write(client, b"r1", b"v1")
    [seen] = pending_events(client)
    second = write(client, b"r1", b"v2")  # lands after the scan, before the run
    result = process_notification(client, logger, seen)
    # The run started after the second commit, so it covered it; the cleanup stopped at
    # the version the scanner saw.
    assert result.observed_commit_ts == second > first
    [left] = pending_events(client)
    assert left.notify_ts == second
    assert process_notification(client, logger, left).outcome is Outcome.ACKED
    assert runs(client.snapshot()) == {b"r1": [second]}
    assert pending_events(client) == []


def test_masking_trap_long_transaction_committing_after_a_cleanup_is_observed(
    client: percolator.Client, logger: RunLogger
) -> None:
    """A transaction that starts before a notification version T is written and cleaned
    up, and commits after the cleanup, must still leave a notification that survives: its
    notification is at its commit_ts (> T), not at its start_ts (< T), which the cleanup's
    delete marker would mask."""
    write(client, b"r1", b"v1")
    long_txn = client.transaction()  # starts before the notification the worker will see
    trigger(client, EVENTS, [b"r1"], "value")  # e.g. a backfill: T > long_txn.start_ts
    [seen] = pending_events(client)
    assert seen.notify_ts > long_txn.start_ts
    process_notification(client, logger, seen)  # run, then delete notify versions <= T
    assert pending_events(client) == []

    long_txn.set(EVENTS, b"r1", "value", b"late")
    long_txn.commit()
    assert long_txn.commit_ts is not None

    [late] = pending_events(client)
    assert late.notify_ts == long_txn.commit_ts
    result = process_notification(client, logger, late)
    assert result.outcome is Outcome.COMMITTED
    assert result.observed_commit_ts == long_txn.commit_ts
    assert ack_of(client, logger.name, b"r1") == long_txn.commit_ts


def test_the_masking_trap_is_real_in_the_store(
    client: percolator.Client, logger: RunLogger
) -> None:
    """Why the test above matters: after the cleanup at T, a notification put at a version
    <= T (where a notify-at-start_ts design would put it) is masked - lost."""
    write(client, b"r1", b"v1")
    long_txn_start = client.oracle.get_timestamp()
    trigger(client, EVENTS, [b"r1"], "value")
    [seen] = pending_events(client)
    cleanup(client, seen)
    put_notifications(client.store, [CellKey(EVENTS, b"r1", "value")], long_txn_start)
    assert pending_events(client) == []


def test_a_long_transaction_in_commit_during_the_run_is_waited_for_and_covered(
    client: percolator.Client, logger: RunLogger
) -> None:
    """A writer whose commit_ts is below the run's start_ts but whose notification was not
    yet visible to the scanner: the run's read resolves its lock (waits for it), so the run
    covers it and the cleanup of the older version loses nothing."""
    write(client, b"r1", b"v1")
    [seen] = pending_events(client)
    failpoints.enable("commit.before_primary", "sleep:300")
    done = threading.Event()

    def slow_writer() -> None:
        with client.transaction() as txn:
            txn.set(EVENTS, b"r1", "value", b"v2")
        done.set()

    thread = threading.Thread(target=slow_writer)
    thread.start()
    # Wait until the writer holds its lock (notification written, primary not committed).
    for _ in range(500):
        cells = client.store.read_row(EVENTS, b"r1", [(NOTIFY, b"value")], max_versions=5)
        if len(cells.get((NOTIFY, b"value"), [])) >= 2:
            break
        threading.Event().wait(0.01)
    else:
        raise AssertionError("the slow writer never wrote its notification")
    result = process_notification(client, logger, seen)
    thread.join()
    failpoints.disable()
    assert done.is_set()
    _, latest = client.snapshot().get_with_commit_ts(EVENTS, b"r1", "value")
    assert result.observed_commit_ts == latest
    assert ack_of(client, logger.name, b"r1") == latest
    # Whatever is left is at most a notification the ack already covers.
    for notification in pending_events(client):
        assert process_notification(client, logger, notification).outcome is Outcome.ACKED


def test_a_notification_of_a_rolled_back_write_runs_nothing(
    local_client: percolator.Client, local_logger: RunLogger
) -> None:
    client, logger = local_client, local_logger
    failpoints.enable("commit.before_primary", "raise")
    with pytest.raises(FailpointError):
        write(client, b"r1", b"never")
    failpoints.disable()
    [spurious] = pending_events(client)  # written before the commit point, as designed
    result = process_notification(client, logger, spurious)
    assert result.outcome is Outcome.NOTHING
    assert runs(client.snapshot()) == {}
    assert pending_events(client) == []


def test_a_deleted_cell_is_observed_with_its_delete_commit(
    local_client: percolator.Client, local_logger: RunLogger
) -> None:
    client, logger = local_client, local_logger
    write(client, b"r1", b"v1")
    process_notification(client, logger, pending_events(client)[0])
    with client.transaction() as txn:
        txn.delete(EVENTS, b"r1", "value")
    result = process_notification(client, logger, pending_events(client)[0])
    assert result.observed_commit_ts == txn.commit_ts
    run_rows = dict(client.snapshot().scan(helpers.RUNS, columns=["covers", "value"]))
    assert sorted(cells["value"] for cells in run_rows.values()) == [b"<deleted>", b"v1"]


def test_crash_points_before_commit_and_before_cleanup(
    local_client: percolator.Client, local_logger: RunLogger
) -> None:
    client, logger = local_client, local_logger
    commit_ts = write(client, b"r1", b"v1")
    [notification] = pending_events(client)

    failpoints.enable("observer.before_commit", "raise")
    with pytest.raises(FailpointError):
        process_notification(client, logger, notification)
    assert runs(client.snapshot()) == {}  # nothing committed
    assert pending_events(client) == [notification]  # the notification stays

    failpoints.enable("observer.before_cleanup", "raise")
    failpoints.disable("observer.before_commit")
    with pytest.raises(FailpointError):
        process_notification(client, logger, notification)
    assert runs(client.snapshot()) == {b"r1": [commit_ts]}  # committed ...
    assert pending_events(client) == [notification]  # ... but not cleaned up

    failpoints.disable()
    assert process_notification(client, logger, notification).outcome is Outcome.ACKED
    assert runs(client.snapshot()) == {b"r1": [commit_ts]}
    assert pending_events(client) == []


def test_an_exception_in_the_observer_commits_nothing(memory_client: percolator.Client) -> None:
    client = memory_client
    failing = helpers.AlwaysFails()
    register_observers(client, [failing])
    write(client, b"r1", b"x", column="poison")
    [notification] = pending_events(client, "poison")
    with pytest.raises(RuntimeError, match="boom"):
        process_notification(client, failing, notification)
    assert ack_of(client, failing.name, b"r1", "poison") is None
    assert pending_events(client, "poison") == [notification]


class _Racer(RunLogger):
    """Two runs meet at a barrier inside process(): both have passed the ack check."""

    def __init__(self, barrier: threading.Barrier) -> None:
        self.barrier = barrier

    def process(self, txn: Transaction, row: bytes, column: str) -> None:
        self.barrier.wait(10)
        super().process(txn, row, column)


class _WeakRacer(_Racer):
    name = "weak-run-logger"
    columns = ("weak",)
    weak = True
    prefix = b"weak:"


@pytest.mark.parametrize("weak", [False, True], ids=["strong", "weak"])
def test_two_racing_runs_commit_once_when_strong_and_may_both_commit_when_weak(
    memory_client: percolator.Client, weak: bool
) -> None:
    client = memory_client
    barrier = threading.Barrier(2)
    observer = _WeakRacer(barrier) if weak else _Racer(barrier)
    register_observers(client, [observer])
    column = observer.columns[0]
    write(client, b"r1", b"v", column=column)
    [notification] = pending_events(client, column)
    outcomes: list[object] = []

    def run() -> None:
        try:
            outcomes.append(process_notification(client, observer, notification, attempts=1))
        except ConflictExhaustedError as exc:
            outcomes.append(exc)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    covered = runs(client.snapshot(), observer.prefix)
    if weak:
        # No ack: both runs commit.  The counting below is what catches a duplicate.
        assert covered[b"r1"] == [covered[b"r1"][0]] * 2
        assert helpers.duplicate_runs(covered)
    else:
        assert len(covered[b"r1"]) == 1
        assert sum(isinstance(o, ConflictExhaustedError) for o in outcomes) == 1
        assert helpers.duplicate_runs(covered) == []


def test_process_must_not_finish_the_transaction(memory_client: percolator.Client) -> None:
    class Committer(RunLogger):
        def process(self, txn: Transaction, row: bytes, column: str) -> None:
            txn.commit()

    client = memory_client
    observer = Committer()
    register_observers(client, [observer])
    write(client, b"r1", b"v")
    with pytest.raises(PercolatorError, match="must not commit or roll back"):
        process_notification(client, observer, pending_events(client)[0])


def test_trigger_rejects_reserved_columns(memory_client: percolator.Client) -> None:
    with pytest.raises(InvalidArgumentError):
        trigger(memory_client, EVENTS, [b"r"], "!ack/x/y")

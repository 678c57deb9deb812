"""Several notifications of one observer in one transaction (observers/runner.py:
process_batch; the worker's ``batch_size``): the same guarantees as single runs - each change
covered by at most one committed run, a failing or conflicting batch leaves every
notification for later - at one commit per batch."""

from __future__ import annotations

import time

import pytest
from percolator.observers.api import register_observers
from percolator.observers.runner import Outcome, process_batch
from percolator.observers.worker import Worker, WorkerOptions

import percolator
from percolator.notifications import Notification, write_ack
from percolator.transaction import Transaction
from tests.observers import helpers
from tests.observers.helpers import EVENTS, RunLogger, pending_events, runs
from tests.txn.test_round_trips import delta, reads_and_writes


def write(client: percolator.Client, rows: list[bytes], value: bytes = b"x") -> int:
    with client.transaction() as txn:
        for row in rows:
            txn.set(EVENTS, row, "value", value)
    assert txn.commit_ts is not None
    return txn.commit_ts


@pytest.fixture
def logger(local_client: percolator.Client) -> RunLogger:
    observer = RunLogger()
    register_observers(local_client, [observer])
    return observer


def test_a_batch_commits_every_run_in_one_transaction_and_cleans_up(
    local_client: percolator.Client, logger: RunLogger
) -> None:
    client = local_client
    rows = [b"r%02d" % i for i in range(6)]
    commit_ts = write(client, rows)
    results = process_batch(client, logger, pending_events(client))
    assert [r.outcome for r in results] == [Outcome.COMMITTED] * 6
    assert len({r.commit_ts for r in results}) == 1  # one commit for the whole batch
    assert runs(client.snapshot()) == {row: [commit_ts] for row in rows}
    assert pending_events(client) == []


def test_a_batch_skips_what_is_acknowledged_or_was_never_committed(
    local_client: percolator.Client, logger: RunLogger
) -> None:
    client = local_client
    first = write(client, [b"done"])
    process_batch(client, logger, pending_events(client))
    second = write(client, [b"new"])
    notifications = [
        Notification(EVENTS, b"done", "value", first),  # seen again: already acknowledged
        Notification(EVENTS, b"ghost", "value", second),  # no commit there (rolled back)
        *pending_events(client),
    ]
    results = process_batch(client, logger, notifications)
    assert [r.outcome for r in results] == [Outcome.ACKED, Outcome.NOTHING, Outcome.COMMITTED]
    assert [r.commit_ts is None for r in results] == [True, True, False]
    assert runs(client.snapshot()) == {b"done": [first], b"new": [second]}


class WritesTheNextRow(RunLogger):
    """The run of row ``a`` writes the observed cell of row ``b`` (a propagation), and
    every run records the value it saw, buffered writes of its batch included."""

    def process(self, txn: Transaction, row: bytes, column: str) -> None:
        super().process(txn, row, column)
        seen = txn.get(EVENTS, row, column) or b"<none>"
        txn.set(helpers.RUNS, b"saw:" + row + b"|%020d" % txn.start_ts, "value", seen)
        if row == b"a":
            txn.set(EVENTS, b"b", column, b"from-a")


def test_a_cell_an_earlier_run_of_the_batch_wrote_gets_a_run_of_its_own(
    local_client: percolator.Client,
) -> None:
    """Run in the batch, ``b`` would read ``a``'s buffered write yet acknowledge only the
    commit before it; the write's own notification would then run ``b`` again, for the
    same value: two committed runs of one change.  ``b`` is deferred instead."""
    client = local_client
    observer = WritesTheNextRow()
    register_observers(client, [observer])
    first = write(client, [b"a", b"b"])
    results = process_batch(client, observer, pending_events(client))
    assert [r.outcome for r in results] == [Outcome.COMMITTED, Outcome.DEFERRED]
    batch_ts = results[0].commit_ts
    assert batch_ts is not None and results[1].commit_ts is None
    left = pending_events(client)
    assert [n.row for n in left] == [b"b"]
    [result] = process_batch(client, observer, left)
    assert result.outcome is Outcome.COMMITTED and result.observed_commit_ts == batch_ts
    assert runs(client.snapshot()) == {b"a": [first], b"b": [batch_ts]}
    saw = [value for _, value in client.snapshot().scan(helpers.RUNS, b"saw:b", b"saw:c")]
    assert saw == [{"value": b"from-a"}]
    assert pending_events(client) == []


class FailsOnBad(RunLogger):
    def process(self, txn: Transaction, row: bytes, column: str) -> None:
        if row == b"bad":
            raise RuntimeError("boom on bad")
        super().process(txn, row, column)


def test_an_exception_in_one_run_commits_nothing_of_the_batch(
    local_client: percolator.Client,
) -> None:
    client = local_client
    observer = FailsOnBad()
    register_observers(client, [observer])
    write(client, [b"a", b"bad", b"c"])
    before = pending_events(client)
    with pytest.raises(RuntimeError, match="boom on bad"):
        process_batch(client, observer, before)
    assert runs(client.snapshot()) == {}
    assert pending_events(client) == before


def test_a_conflicting_batch_is_retried_whole(
    local_client: percolator.Client, logger: RunLogger
) -> None:
    """Another run acknowledges change ``a`` while the batch runs: the batch conflicts on
    that ack and none of its runs commit; the retry finds ``a`` acknowledged and commits
    only ``b``'s run."""
    client = local_client
    commit_ts = write(client, [b"a", b"b"])
    notifications = pending_events(client)
    interfered = []

    class Interfering(RunLogger):
        def process(self, txn: Transaction, row: bytes, column: str) -> None:
            super().process(txn, row, column)
            if row == b"b" and not interfered:
                other = client.observer_transaction()
                write_ack(other, logger.name, EVENTS, b"a", "value", commit_ts)
                interfered.append(other.commit())

    results = process_batch(client, Interfering(), notifications)
    assert [r.outcome for r in results] == [Outcome.ACKED, Outcome.COMMITTED]
    assert results[0].conflicts == 1 and results[0].attempts == 2
    assert runs(client.snapshot()) == {b"b": [commit_ts]}  # a's first run rolled back
    assert pending_events(client) == []


def test_a_batching_worker_runs_every_change_once_and_parks_only_the_failing_cell(
    local_client: percolator.Client,
) -> None:
    client = local_client
    observer = FailsOnBad()
    rows = [b"r%03d" % i for i in range(60)]
    register_observers(client, [observer])
    commits = {}
    for start in range(0, len(rows), 20):  # backlog first, so that batches form
        commit_ts = write(client, rows[start : start + 20])
        commits.update({row: commit_ts for row in rows[start : start + 20]})
    write(client, [b"bad"])
    options = WorkerOptions(
        threads=2, batch_size=8, idle_sleep_s=0.01, failure_limit=2, backoff_base_s=0.01
    )
    worker = Worker(client, [observer], options)
    worker.start()
    try:
        # The parked cell holds the watermark back: wait for the runs and the park instead.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if len(runs(client.snapshot())) == len(rows) and worker.processor.parked_cells():
                break
            time.sleep(0.05)
    finally:
        worker.stop(drain_timeout_s=5)
    covered = runs(client.snapshot())
    assert helpers.duplicate_runs(covered) == []
    assert covered == {row: [commits[row]] for row in rows}
    assert worker.processor.parked_cells() == {(EVENTS, b"bad", "value")}
    # Fewer commits than runs: batches formed.
    assert len({r for r in _run_start_ts(client)}) < len(rows)


def _run_start_ts(client: percolator.Client) -> list[bytes]:
    return [
        run_row.rpartition(b"|")[2]
        for run_row, _ in client.snapshot().scan(helpers.RUNS, columns=["covers"])
    ]


@pytest.mark.usefixtures("steady_table_checks")
def test_a_batch_costs_the_round_trips_of_one_run_except_per_cell_compare_and_sets(
    memory_client: percolator.Client,
) -> None:
    client = memory_client
    logger = RunLogger()
    register_observers(client, [logger])
    client.oracle.get_timestamp()  # the oracle's first block is not part of a run
    write(client, [b"one"])
    [single] = pending_events(client)
    before = reads_and_writes(client)
    process_batch(client, logger, [single])
    one = delta(before, reads_and_writes(client))
    write(client, [b"r%d" % i for i in range(8)])
    batch = pending_events(client)
    before = reads_and_writes(client)
    process_batch(client, logger, batch)
    eight = delta(before, reads_and_writes(client))
    # Reads: the observed cells and acks in one read, the run rows in one prewrite read.
    assert one["read_rows"] == eight["read_rows"] == 2, (one, eight)
    # Blind puts (data, commit index, write records) ride in the compare-and-set batches of
    # their table, the primary's record and commit-index entry on the commit point itself
    # (the memory store has conditional puts): no put call of its own.
    assert client.store.conditional_puts
    assert one.get("put", 0) == 0 and eight.get("put", 0) == 0, (one, eight)
    assert one["delete_versions"] == eight["delete_versions"] == 1
    # Each written cell (ack and two run cells per change) is locked and committed by
    # compare-and-set, except the primary's commit point: 3 cells, 2 per cell.
    assert one["compare_and_set"] == 6 and eight["compare_and_set"] == 6 * 8, (one, eight)
    # ... but they go to the store in batches whose number does not grow with the runs:
    # the primary's lock, the commit point (a batch of one, carrying the primary's
    # record), then the secondaries' locks and their commits, one batch per table each.
    # One run's secondaries lie in one table, eight runs' in two (acks and run cells).
    assert one["compare_and_set_many"] == 1 + 1 + 2 * 1, (one, eight)
    assert eight["compare_and_set_many"] == 1 + 1 + 2 * 2, (one, eight)


class ReadsTitle(RunLogger):
    """Also reads another column of the notified row (``title``), declared or not."""

    name = "reads-title"

    def process(self, txn: Transaction, row: bytes, column: str) -> None:
        txn.get(EVENTS, row, "title")
        super().process(txn, row, column)


class DeclaresTitle(ReadsTitle):
    name = "declares-title"
    reads = ("title",)


@pytest.mark.usefixtures("steady_table_checks")
@pytest.mark.parametrize("observer_class", [ReadsTitle, DeclaresTitle])
def test_declared_reads_of_the_row_are_read_with_the_observed_cells(
    memory_client: percolator.Client, observer_class: type[ReadsTitle]
) -> None:
    client = memory_client
    observer = observer_class()
    register_observers(client, [observer])
    client.oracle.get_timestamp()
    rows = [b"r%d" % i for i in range(8)]
    with client.transaction() as txn:
        for row in rows:
            txn.set(EVENTS, row, "title", b"t:" + row)
    write(client, rows)
    batch = pending_events(client)
    before = reads_and_writes(client)
    results = process_batch(client, observer, batch)
    reads = delta(before, reads_and_writes(client))["read_rows"]
    assert [r.outcome for r in results] == [Outcome.COMMITTED] * 8
    # Declared: one read of observed cells, acks and titles, one prewrite read; undeclared:
    # one more read per run.
    assert reads == (2 if observer.reads else 2 + 8), reads

"""Per-step scenario tests written as protocol scripts, on every backend.

Each test drives the protocol steps directly with explicit timestamps (``h.ts(n)``) and a
manual clock, and checks the stored state after each step.
"""

from __future__ import annotations

import pytest

from percolator.errors import ConflictError, LockWaitTimeoutError, TransactionAbortedError
from percolator.layout import DATA, WRITE
from percolator.protocol import cells as cells_module
from percolator.protocol.cells import fetch_cells
from percolator.protocol.lock import commit_lock
from percolator.protocol.read import read_cells
from percolator.protocol.resolve import TxnOutcome, TxnState, find_commit_in_history, resolve_lock
from percolator.records import Kind, WriteRecord
from percolator.store import Store
from percolator.testing import ProtocolHarness

K = b"k"
C = "c"


@pytest.fixture
def h(store: Store) -> ProtocolHarness:
    return ProtocolHarness(store)


def write_history(h: ProtocolHarness, row: bytes, column: str) -> list[tuple[int, WriteRecord]]:
    versions = h.store.read_row(
        h.table, row, columns=[(WRITE, column.encode())], max_versions=1000
    ).get((WRITE, column.encode()), [])
    return [(ts, WriteRecord.decode(v)) for ts, v in versions]


def test_single_cell_prewrite_commit_read(h: ProtocolHarness) -> None:
    h.must_get(K, C, h.ts(1), None)
    h.must_prewrite([(K, C, b"v1")], primary=(K, C), start_ts=h.ts(10))
    # A reader below the lock's start_ts is not affected by it.
    h.must_get(K, C, h.ts(5), None)
    # A reader above it must wait for the live lock and gives up after its bound.
    assert isinstance(h.must_get_blocked(K, C, h.ts(12)), LockWaitTimeoutError)
    h.must_commit_primary((K, C), h.ts(10), h.ts(11))
    h.must_unlocked(K, C)
    h.must_get(K, C, h.ts(11), b"v1")  # read_ts == commit_ts sees the commit
    h.must_get(K, C, h.ts(10), None)  # read_ts == start_ts does not
    # The primary's commit lives in the lock cell; its write record comes with the next
    # prewrite (or the committer's batch), not with the commit point.
    assert h.lock_cell(K, C).last_commit is not None


def test_newer_commit_is_write_write_conflict(h: ProtocolHarness) -> None:
    h.must_prewrite([(K, C, b"a")], primary=(K, C), start_ts=h.ts(10))
    h.must_commit_primary((K, C), h.ts(10), h.ts(20))
    # Started before the commit: first committer wins, the later one conflicts.
    exc = h.must_prewrite_conflict([(K, C, b"b")], primary=(K, C), start_ts=h.ts(15))
    assert exc.conflict_ts == h.ts(20) and exc.start_ts == h.ts(15)
    assert exc.row == K and exc.column == C
    # Started after it: fine.
    h.must_prewrite([(K, C, b"b")], primary=(K, C), start_ts=h.ts(21))


def test_commit_equal_to_start_ts_conflicts(h: ProtocolHarness) -> None:
    h.must_prewrite([(K, C, b"a")], primary=(K, C), start_ts=h.ts(10))
    h.must_commit_primary((K, C), h.ts(10), h.ts(20))
    h.must_prewrite_conflict([(K, C, b"b")], primary=(K, C), start_ts=h.ts(20))


def test_live_lock_is_a_conflict_for_writers(h: ProtocolHarness) -> None:
    h.must_prewrite([(K, C, b"a")], primary=(K, C), start_ts=h.ts(10))
    exc = h.must_prewrite_conflict([(K, C, b"b")], primary=(K, C), start_ts=h.ts(11))
    assert exc.conflict_ts == h.ts(10)
    h.must_locked(K, C, h.ts(10))


def test_expired_lock_is_rolled_back_by_reader(h: ProtocolHarness) -> None:
    h.must_prewrite([(K, C, b"a")], primary=(K, C), start_ts=h.ts(10), ttl_ms=100)
    h.clock_ms = h.base_ms + 10 + 101
    h.must_get(K, C, h.ts(200), None)
    h.must_unlocked(K, C)
    cell = h.lock_cell(K, C)
    assert cell.rolled_back == h.ts(10)
    h.must_status((K, C), h.ts(10), TxnState.ROLLED_BACK)


def test_expired_lock_is_rolled_back_by_writer(h: ProtocolHarness) -> None:
    h.must_prewrite([(K, C, b"a")], primary=(K, C), start_ts=h.ts(10), ttl_ms=100)
    h.clock_ms = h.base_ms + 500
    h.must_prewrite([(K, C, b"b")], primary=(K, C), start_ts=h.ts(300))
    h.must_commit_primary((K, C), h.ts(300), h.ts(301))
    h.must_get(K, C, h.ts(302), b"b")


def test_delayed_commit_after_rollback_fails(h: ProtocolHarness) -> None:
    h.must_prewrite([(K, C, b"a")], primary=(K, C), start_ts=h.ts(10), ttl_ms=100)
    before = h.lock_cell(K, C).encode()
    h.clock_ms = h.base_ms + 500
    h.must_status((K, C), h.ts(10), TxnState.ROLLED_BACK)
    # The commit compare-and-set of the paused transaction expects its lock bytes: gone.
    assert not commit_lock(h.store, h.key(K, C), before, h.ts(20))
    h.must_get(K, C, h.ts(30), None)


def test_delayed_prewrite_after_rollback_sees_its_rollback(h: ProtocolHarness) -> None:
    # T10 prewrites the primary p; its secondary s is delayed.  p is rolled back.
    h.must_prewrite([(b"p", C, b"a")], primary=(b"p", C), start_ts=h.ts(10), ttl_ms=100)
    h.clock_ms = h.base_ms + 500
    h.must_status((b"p", C), h.ts(10), TxnState.ROLLED_BACK)
    # Re-prewriting the primary (a delayed retry of the same transaction) aborts.
    with pytest.raises(TransactionAbortedError):
        h.prewrite([(b"p", C, b"a")], primary=(b"p", C), start_ts=h.ts(10))


def test_secondary_rolled_forward_when_primary_committed(h: ProtocolHarness) -> None:
    p, s = (b"p", C), (b"s", C)
    h.must_prewrite([(b"p", C, b"P"), (b"s", C, b"S")], primary=p, start_ts=h.ts(10))
    h.must_commit_primary(p, h.ts(10), h.ts(11))
    h.must_locked(b"s", C, h.ts(10))  # the committer died before the secondary
    h.must_get(b"s", C, h.ts(12), b"S")  # the reader rolls it forward
    h.must_unlocked(*s)
    assert write_history(h, b"s", C) == [(h.ts(11), WriteRecord(Kind.PUT, h.ts(10)))]


def test_secondary_rolled_back_when_primary_rolled_back(h: ProtocolHarness) -> None:
    p = (b"p", C)
    h.must_prewrite([(b"p", C, b"P"), (b"s", C, b"S")], primary=p, start_ts=h.ts(10), ttl_ms=50)
    h.clock_ms = h.base_ms + 1000
    h.must_get(b"s", C, h.ts(100), None)
    h.must_unlocked(b"s", C)
    h.must_unlocked(b"p", C)
    h.must_get(b"p", C, h.ts(100), None)


def test_secondary_whose_primary_was_never_written_is_resolvable(h: ProtocolHarness) -> None:
    # MUST: a lock whose primary holds no trace of the transaction is resolvable (here the
    # orphan is created directly; the committer never produces one, see the next test).
    from percolator.protocol.cells import Mutation
    from percolator.protocol.prewrite import prewrite
    from percolator.records import LockInfo

    key = h.key(b"s", C)

    def make_lock(m: Mutation) -> LockInfo:
        return LockInfo(h.ts(10), 50, m.kind, h.table, b"never-written", C)

    prewrite(h.store, h.resolver, [Mutation(key, Kind.PUT, b"S")], h.ts(10), make_lock)
    h.must_locked(b"s", C, h.ts(10))
    h.clock_ms = h.base_ms + 1000
    h.must_get(b"s", C, h.ts(100), None)
    h.must_unlocked(b"s", C)
    h.must_status((b"never-written", C), h.ts(10), TxnState.ROLLED_BACK)


def test_primary_rolled_back_then_overwritten_keeps_secondary_rolled_back(
    h: ProtocolHarness,
) -> None:
    p = (b"p", C)
    h.must_prewrite([(b"p", C, b"P"), (b"s", C, b"S")], primary=p, start_ts=h.ts(10), ttl_ms=50)
    h.clock_ms = h.base_ms + 1000
    h.must_status(p, h.ts(10), TxnState.ROLLED_BACK)
    # Later transactions commit on the primary: the rollback marker disappears.
    for n in (100, 200):
        h.must_prewrite([(b"p", C, b"x")], primary=p, start_ts=h.ts(n))
        h.must_commit_primary(p, h.ts(n), h.ts(n + 1))
    assert h.lock_cell(b"p", C).rolled_back == 0
    # The leftover secondary still resolves to "rolled back" from the write history.
    h.must_get(b"s", C, h.ts(300), None)
    h.must_unlocked(b"s", C)


def test_committed_primary_overwritten_later_still_rolls_secondary_forward(
    h: ProtocolHarness,
) -> None:
    p = (b"p", C)
    h.must_prewrite([(b"p", C, b"P"), (b"s", C, b"S")], primary=p, start_ts=h.ts(10))
    h.must_commit_primary(p, h.ts(10), h.ts(11))
    h.must_prewrite([(b"p", C, b"P2")], primary=p, start_ts=h.ts(20))
    h.must_commit_primary(p, h.ts(20), h.ts(21))
    # The lock cell now holds T20's commit; T10's is found in the write history.
    assert find_commit_in_history(h.store, h.key(*p), h.ts(10)) == h.ts(11)
    h.must_status(p, h.ts(10), TxnState.COMMITTED, commit_ts=h.ts(11))
    h.must_get(b"s", C, h.ts(30), b"S")


def test_primary_rolled_forward_from_stale_lock_bytes_keeps_its_commit_findable(
    h: ProtocolHarness,
) -> None:
    # A resolver read the primary's lock before the commit point and learnt the outcome
    # after it: it rolls the primary itself forward from stale bytes.  The compare-and-set
    # fails; where the store has conditional puts (every backend here) the record and index
    # entry ride on it and land with it or not at all (protocol/commit.py, MUST), and
    # elsewhere the entry is put before the record.  The committer died before writing any
    # record.
    p = (b"p", C)
    h.must_prewrite([(b"p", C, b"P"), (b"s", C, b"S")], primary=p, start_ts=h.ts(10))
    stale = fetch_cells(h.store, [h.key(*p)], before=None, with_data=False)[h.key(*p)]
    assert stale.lock_cell.lock is not None
    h.must_commit_primary(p, h.ts(10), h.ts(11))
    committed = TxnOutcome(TxnState.COMMITTED, commit_ts=h.ts(11))
    assert resolve_lock(h.store, h.key(*p), stale.lock_cell.lock, stale.lock_bytes, committed)
    assert h.store.conditional_puts
    assert write_history(h, b"p", C) == []  # the failed compare-and-set carried nothing
    # A later commit replaces T10's in the primary's lock cell; the prewrite puts T10's
    # missing record and index entry first, so the commit index can still tell T10
    # committed.
    h.must_prewrite([(b"p", C, b"P2")], primary=p, start_ts=h.ts(20))
    h.must_commit_primary(p, h.ts(20), h.ts(21))
    h.must_status(p, h.ts(10), TxnState.COMMITTED, commit_ts=h.ts(11))
    h.must_get(b"s", C, h.ts(30), b"S")


def test_prewrite_writes_previous_commits_record_before_replacing_it(h: ProtocolHarness) -> None:
    # MUST: a commit's write record exists before its Committed state leaves the lock cell.
    h.must_prewrite([(K, C, b"a")], primary=(K, C), start_ts=h.ts(10))
    h.must_commit_primary((K, C), h.ts(10), h.ts(11))
    assert write_history(h, K, C) == []  # only the lock cell knows the commit so far
    h.must_prewrite([(K, C, b"b")], primary=(K, C), start_ts=h.ts(20))
    assert write_history(h, K, C) == [(h.ts(11), WriteRecord(Kind.PUT, h.ts(10)))]
    # A reader between the two commits finds T10 through the history.
    h.must_get(K, C, h.ts(15), b"a")


def test_reads_pick_the_version_the_commit_points_at(h: ProtocolHarness) -> None:
    h.must_prewrite([(K, C, b"committed")], primary=(K, C), start_ts=h.ts(10))
    h.must_commit_primary((K, C), h.ts(10), h.ts(11))
    # A rolled-back transaction leaves a newer orphan data version behind.
    h.must_prewrite([(K, C, b"orphan")], primary=(K, C), start_ts=h.ts(20), ttl_ms=10)
    h.clock_ms = h.base_ms + 1000
    h.must_status((K, C), h.ts(20), TxnState.ROLLED_BACK)
    assert h.store.read_row(h.table, K, columns=[(DATA, C.encode())])[(DATA, C.encode())][0] == (
        h.ts(20),
        b"orphan",
    )
    h.must_get(K, C, h.ts(30), b"committed")


def test_reads_in_parts_pick_the_versions_the_commits_point_at(
    h: ProtocolHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three cells whose newest data is a rolled-back orphan, read with one cell per store
    read: the reads of the committed versions are split too, and each finds its own."""
    columns = ("a", "b", "c")
    for n, column in enumerate(columns):
        h.must_prewrite([(K, column, column.encode())], primary=(K, column), start_ts=h.ts(n))
        h.must_commit_primary((K, column), h.ts(n), h.ts(n + 5))
    orphans = [(K, column, b"orphan") for column in columns]
    h.must_prewrite(orphans, primary=(K, "a"), start_ts=h.ts(20), ttl_ms=10)
    h.clock_ms = h.base_ms + 1000
    for column in columns:
        h.must_rollback((K, column), h.ts(20))
    monkeypatch.setattr(cells_module, "CELLS_PER_READ", 3)  # one cell: lock, write, data
    reads = []
    real_read_cells = h.store.read_cells

    def counted(*args: object, **kwargs: object) -> object:
        reads.append(args[1])
        return real_read_cells(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(h.store, "read_cells", counted)
    keys = [h.key(K, column) for column in columns]
    found = read_cells(h.store, h.resolver, keys, h.ts(30))
    assert found == {key: key.column.encode() for key in keys}
    # three reads of the cells' newest state, then three of the data at the commits
    assert [len(cells) for cells in reads] == [3, 3, 3, 1, 1, 1], reads


def test_delete_hides_older_value(h: ProtocolHarness) -> None:
    h.must_prewrite([(K, C, b"a")], primary=(K, C), start_ts=h.ts(10))
    h.must_commit_primary((K, C), h.ts(10), h.ts(11))
    h.must_prewrite([(K, C, None)], primary=(K, C), start_ts=h.ts(20))
    h.must_commit_primary((K, C), h.ts(20), h.ts(21))
    h.must_get(K, C, h.ts(15), b"a")
    h.must_get(K, C, h.ts(22), None)


def test_lock_above_read_ts_is_ignored(h: ProtocolHarness) -> None:
    h.must_prewrite([(K, C, b"a")], primary=(K, C), start_ts=h.ts(10))
    h.must_commit_primary((K, C), h.ts(10), h.ts(11))
    h.must_prewrite([(K, C, b"b")], primary=(K, C), start_ts=h.ts(50))
    h.must_get(K, C, h.ts(40), b"a")  # no waiting: the lock's commit will be above 40


def test_prewrite_is_idempotent(h: ProtocolHarness) -> None:
    h.must_prewrite([(K, C, b"a")], primary=(K, C), start_ts=h.ts(10))
    first = h.lock_cell(K, C)
    h.must_prewrite([(K, C, b"a")], primary=(K, C), start_ts=h.ts(10))
    assert h.lock_cell(K, C) == first


def test_rollback_and_commit_are_idempotent(h: ProtocolHarness) -> None:
    h.must_prewrite([(b"a", C, b"1"), (b"b", C, b"2")], primary=(b"a", C), start_ts=h.ts(10))
    h.must_commit_primary((b"a", C), h.ts(10), h.ts(11))
    h.must_commit((b"b", C), h.ts(10), h.ts(11))
    h.must_commit((b"b", C), h.ts(10), h.ts(11))
    h.must_prewrite([(b"x", C, b"1")], primary=(b"x", C), start_ts=h.ts(20))
    h.must_rollback((b"x", C), h.ts(20))
    h.must_rollback((b"x", C), h.ts(20))
    h.must_get(b"x", C, h.ts(30), None)


def test_status_of_alive_transaction_does_not_roll_back(h: ProtocolHarness) -> None:
    h.must_prewrite([(K, C, b"a")], primary=(K, C), start_ts=h.ts(10), ttl_ms=1000)
    status = h.status((K, C), h.ts(10))
    assert status.state is TxnState.ALIVE
    h.must_locked(K, C, h.ts(10))


def test_binary_rows_and_columns(h: ProtocolHarness) -> None:
    row = bytes(range(256))
    column = "col/ünï"
    h.must_prewrite([(row, column, b"\x00\xff")], primary=(row, column), start_ts=h.ts(10))
    h.must_commit_primary((row, column), h.ts(10), h.ts(11))
    h.must_get(row, column, h.ts(12), b"\x00\xff")


def test_conflict_error_is_retryable_and_named(h: ProtocolHarness) -> None:
    h.must_prewrite([(K, C, b"a")], primary=(K, C), start_ts=h.ts(10))
    exc = h.must_prewrite_conflict([(K, C, b"b")], primary=(K, C), start_ts=h.ts(11))
    assert isinstance(exc, ConflictError) and exc.retryable
    assert "row=b'k'" in str(exc) and "column='c'" in str(exc)

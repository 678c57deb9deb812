"""Prewrite: lock each written cell for transaction ``start_ts``.

Per cell, in this order:

1. **Read** the lock cell and the newest write record (one Get per row, batched;
   :func:`~percolator.protocol.cells.fetch_cells`).
2. **Check**: a lock of another transaction -> resolve it if that transaction is finished or
   dead, otherwise conflict; a latest commit ``>= start_ts`` -> write-write conflict (snapshot
   isolation's first-committer-wins); a rollback marker for ``start_ts`` -> we were rolled
   back, abort.
3. **Blind puts**: the data at ``start_ts``, and the write record of the lock cell's latest
   commit if the history lacks it, so that commit's record exists before the lock cell
   forgets it (design notes §3, MUST), preceded by its commit-index entry in a put of its
   own (protocol/commit.py, MUST).
4. **Compare-and-set** the lock cell from the exact bytes read to ``Locked{start_ts, ...}``
   (keeping the previous commit inside).

When no history record is missing (the common case: the committer writes records right
after its commit point), steps 3 and 4 go to the store **in one call** per table
(``Store.compare_and_set_many`` with puts: one write transaction on the embedded store,
concurrent round trips on HBase).  That is safe because a data version at ``start_ts`` is
invisible until a commit points at it, and no commit of ``start_ts`` can exist before this
call returned (the commit point comes after every prewrite); if the lock is lost or the put
fails, the version is an orphan like that of any rolled-back transaction.  A missing history
record must land *before* the lock replaces the commit it describes, so then the puts
complete first, in calls of their own.

A failed compare-and-set means the cell changed between read and write: the cell is
re-checked from step 1.  A compare-and-set whose outcome is unknown (connection broke) is
never re-issued: the cell is re-read, and the transaction aborts unless the lock is ours;
the data puts of that call, whose outcome is unknown too, are then put again (idempotent).

Idempotent per cell: a cell already locked by ``start_ts`` is left as it is.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable, Mapping, Sequence

from percolator import failpoints
from percolator.errors import ConflictError, StoreUnavailableError, TransactionAbortedError
from percolator.layout import DATA, WRITE
from percolator.protocol.cells import CellKey, Mutation, RawCell, fetch_cells, put_by_table
from percolator.protocol.commit import commit_index_put
from percolator.protocol.lock import place_locks
from percolator.protocol.resolve import LockResolver
from percolator.records import Kind, LockInfo, WriteRecord
from percolator.store.base import Put, Store

_MAX_ROUNDS = 20


def prewrite(
    store: Store,
    resolver: LockResolver,
    mutations: Sequence[Mutation],
    start_ts: int,
    make_lock: Callable[[Mutation], LockInfo],
    on_locked: Callable[[CellKey, bytes], None] | None = None,
    known: Mapping[CellKey, RawCell] | None = None,
    lost: set[CellKey] | None = None,
) -> set[CellKey]:
    """Prewrite ``mutations`` (any tables).  Raises ConflictError or TransactionAbortedError.
    Returns the cells whose compare-and-set failed at least once (re-read and tried again):
    a state in ``known`` that was not the cell's any more.  A ``lost`` set given is that
    set, filled as the compare-and-sets fail: it also holds them when this call raises.

    ``on_locked(key, lock_bytes)`` is called for every cell this call locked, as soon as it
    is locked, with the exact bytes of the lock cell: a caller that aborts later knows exactly
    which locks to roll back, and the commit can compare-and-set without re-reading.
    The compare-and-sets of a round go to the store in one call per table (one write
    transaction on the embedded store, parallel calls on HBase), with that table's data
    puts.

    ``known`` holds raw states the transaction already read (at its ``start_ts``, or later
    as this function reads them); the first round uses them instead of reading those cells
    again.  That is sound because the compare-and-set expects the exact lock bytes the
    checks were made on: if the cell changed since, the compare-and-set fails and the cell
    is re-read and re-checked.
    """
    by_key = {m.key: m for m in mutations}
    pending = list(by_key)
    lost = set() if lost is None else lost
    for _ in range(_MAX_ROUNDS):
        if not pending:
            return lost
        reuse = {key: known[key] for key in pending if key in known} if known else {}
        missing = [key for key in pending if key not in reuse]
        raws = fetch_cells(store, missing, before=None, with_data=False) if missing else {}
        raws.update(reuse)
        known = None  # later rounds re-read: the cells changed under us
        ready: list[RawCell] = []
        retry: list[CellKey] = []
        for key in pending:
            raw = raws[key]
            verdict = _check(raw, start_ts, resolver)
            if verdict is _Verdict.DONE:
                if on_locked is not None and raw.lock_bytes is not None:
                    on_locked(key, raw.lock_bytes)
            elif verdict is _Verdict.RETRY:
                retry.append(key)
            else:
                ready.append(raw)
        if ready:
            index_puts, puts = _puts([by_key[raw.key] for raw in ready], ready, start_ts)
            if index_puts:
                # Missing history: entries, then records, then the locks (MUST).
                put_by_table(store, index_puts)
                put_by_table(store, puts)
                puts = {}
            failpoints.failpoint("prewrite.before_lock")
            outcomes = _lock_all(store, ready, by_key, start_ts, make_lock, on_locked, puts)
            failed = [raw.key for raw, locked in zip(ready, outcomes, strict=True) if not locked]
            lost.update(failed)
            retry.extend(failed)
        pending = retry
    if pending:
        key = pending[0]
        raise ConflictError(
            "prewrite kept losing the race for the lock cell",
            table=key.table,
            row=key.row,
            column=key.column,
            start_ts=start_ts,
        )
    return lost


class _Verdict(enum.Enum):
    LOCK = enum.auto()  # go ahead
    DONE = enum.auto()  # already ours
    RETRY = enum.auto()  # resolved another transaction's lock: re-read


def _check(raw: RawCell, start_ts: int, resolver: LockResolver) -> _Verdict:
    key = raw.key
    cell = raw.lock_cell
    if cell.rolled_back == start_ts:
        raise TransactionAbortedError(
            f"transaction {start_ts} was rolled back by another client (seen at {key})"
        )
    if cell.lock is not None:
        if cell.lock.start_ts == start_ts:
            return _Verdict.DONE
        status = resolver.resolve(raw)
        if not status.final:
            raise ConflictError(
                "cell is locked by a live transaction",
                table=key.table,
                row=key.row,
                column=key.column,
                start_ts=start_ts,
                conflict_ts=cell.lock.start_ts,
            )
        return _Verdict.RETRY
    latest = raw.latest_commit()
    if latest is not None and latest.commit_ts >= start_ts:
        raise ConflictError(
            "write-write conflict: the cell was committed after this transaction started",
            table=key.table,
            row=key.row,
            column=key.column,
            start_ts=start_ts,
            conflict_ts=latest.commit_ts,
        )
    return _Verdict.LOCK


def _puts(
    mutations: Sequence[Mutation], raws: Sequence[RawCell], start_ts: int
) -> tuple[dict[str, list[Put]], dict[str, list[Put]]]:
    """The blind puts of step 3 by table: the commit-index entries of missing history
    records (to be stored first), and the rest.  No entries: no record was missing."""
    index_by_table: dict[str, list[Put]] = {}
    by_table: dict[str, list[Put]] = {}
    for mutation, raw in zip(mutations, raws, strict=True):
        key = mutation.key
        puts = by_table.setdefault(key.table, [])
        if mutation.kind == Kind.PUT:
            puts.append(Put(key.row, DATA, key.qualifier, start_ts, mutation.value))
        last = raw.lock_cell.last_commit
        if last is not None and (raw.write is None or raw.write[0] != last.commit_ts):
            # The commit may have been a primary's whose committer died before writing its
            # record and index: the index must exist before the lock cell forgets the
            # commit, and before the record (whose presence is all this check looks at:
            # protocol/commit.py).
            index_by_table.setdefault(key.table, []).append(
                commit_index_put(key, last.start_ts, last.commit_ts)
            )
            record = WriteRecord(last.kind, last.start_ts)
            puts.append(Put(key.row, WRITE, key.qualifier, last.commit_ts, record.encode()))
    return index_by_table, by_table


def _lock_all(
    store: Store,
    ready: Sequence[RawCell],
    by_key: dict[CellKey, Mutation],
    start_ts: int,
    make_lock: Callable[[Mutation], LockInfo],
    on_locked: Callable[[CellKey, bytes], None] | None,
    puts: dict[str, list[Put]],
) -> list[bool]:
    """Step 4 for every ready cell: their compare-and-sets in one store call per table,
    carrying ``puts`` (step 3).  Whether each cell is now locked by ``start_ts``."""
    try:
        news = place_locks(store, [(raw, make_lock(by_key[raw.key])) for raw in ready], puts)
    except StoreUnavailableError:
        # Unknown outcomes: never re-issue a compare-and-set.  Re-read; every lock is ours
        # or we abort.
        again = fetch_cells(store, [raw.key for raw in ready], before=None, with_data=False)
        news = [
            cell.lock_bytes if cell.lock_cell.locked_by(start_ts) else None
            for cell in (again[raw.key] for raw in ready)
        ]
        lost = [raw.key for raw, new in zip(ready, news, strict=True) if new is None]
        _report_locked(ready, news, on_locked)  # an abort rolls these back
        if lost:
            raise TransactionAbortedError(
                f"prewrite of {lost[0]} had an unknown outcome and the lock is not ours"
            ) from None
        # The locks are ours; the data puts of the call may be lost: put them again.
        put_by_table(store, puts)
        return [True] * len(ready)
    _report_locked(ready, news, on_locked)
    return [new is not None for new in news]


def _report_locked(
    ready: Sequence[RawCell],
    news: Sequence[bytes | None],
    on_locked: Callable[[CellKey, bytes], None] | None,
) -> None:
    if on_locked is not None:
        for raw, new in zip(ready, news, strict=True):
            if new is not None:
                on_locked(raw.key, new)


class AbsentCells:
    """Whether to prewrite a cell the transaction never read **without reading it first**,
    compare-and-setting its lock cell from absent: per table, from how often such cells
    turned out never written.  Thread-safe; one per client.

    A transaction that inserts (a backfill batch, an observer writing new index entries,
    new rows) reads each written cell only to find it absent.  Taking "absent" as the read
    saves that round trip, and is exactly as safe as a read that found the cell absent:
    the compare-and-set from absent applies only while the cell has no lock cell (a lock
    cell is never empty), and the checks an absent cell passes are none; otherwise it
    fails, and the prewrite reads the cell and tries again (a failed round, then a read:
    one round trip more than reading first).  A transaction's unread cells of one table
    are read in one call, so one cell that exists among many guessed costs that call and
    more: the guess is all or nothing per table and transaction, made only where it is
    likely to be right for every cell - at least :data:`MIN_SEEN` cells seen, and an
    exponentially weighted share ``p`` of absent ones (weight :data:`WEIGHT` per cell)
    with ``p ** cells >= GUESS_AT``.  Reads and guesses both feed it, so a table whose
    writes turn into updates stops being guessed."""

    MIN_SEEN = 8
    GUESS_AT = 0.75
    WEIGHT = 0.1

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_table: dict[str, tuple[int, float]] = {}

    def guess(self, table: str, cells: int = 1) -> bool:
        """Whether to take ``cells`` unread cells of ``table``, written by one transaction,
        as absent."""
        with self._lock:
            seen, share = self._by_table.get(table, (0, 0.0))
        return seen >= self.MIN_SEEN and share**cells >= self.GUESS_AT

    def observe(self, table: str, absent: bool) -> None:
        """An unread cell of ``table`` was (``absent``) or was not absent: read, or guessed
        and its compare-and-set applied (or not)."""
        with self._lock:
            seen, share = self._by_table.get(table, (0, 0.0))
            share = float(absent) if seen == 0 else share + self.WEIGHT * (absent - share)
            self._by_table[table] = (seen + 1, share)

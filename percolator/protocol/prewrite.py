"""Prewrite: lock each written cell for transaction ``start_ts``.

Per cell, in this order:

1. **Read** the lock cell and the newest write record (one Get per row, batched).
2. **Check**: a lock of another transaction -> resolve it if that transaction is finished or
   dead, otherwise conflict; a latest commit ``>= start_ts`` -> write-write conflict (snapshot
   isolation's first-committer-wins); a rollback marker for ``start_ts`` -> we were rolled
   back, abort.
3. **Blind puts**: the data at ``start_ts``, and the write record of the lock cell's latest
   commit if the history lacks it, so that commit's record exists before the lock cell
   forgets it (design notes §3, MUST).
4. **Compare-and-set** the lock cell from the exact bytes read to ``Locked{start_ts, ...}``
   (keeping the previous commit inside).

A failed compare-and-set means the cell changed between read and write: the cell is
re-checked from step 1.  A compare-and-set whose outcome is unknown (connection broke) is
never re-issued: the cell is re-read, and the transaction aborts unless the lock is ours.

Idempotent per cell: a cell already locked by ``start_ts`` is left as it is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Executor

from percolator import failpoints
from percolator.concurrency import run_all
from percolator.errors import ConflictError, StoreUnavailableError, TransactionAbortedError
from percolator.layout import DATA, LOCK, WRITE
from percolator.protocol.cells import CellKey, Mutation, RawCell, fetch_cells
from percolator.records import Kind, LockInfo, WriteRecord
from percolator.resolver import LockResolver
from percolator.store.base import Put, Store

_MAX_ROUNDS = 20


def prewrite(
    store: Store,
    resolver: LockResolver,
    mutations: Sequence[Mutation],
    start_ts: int,
    make_lock: Callable[[Mutation], LockInfo],
    executor: Executor | None = None,
    on_locked: Callable[[CellKey, bytes], None] | None = None,
) -> None:
    """Prewrite ``mutations`` (any tables).  Raises ConflictError or TransactionAbortedError.

    ``on_locked(key, lock_bytes)`` is called for every cell this call locked, as soon as it
    is locked, with the exact bytes of the lock cell: a caller that aborts later knows exactly
    which locks to roll back, and the commit can compare-and-set without re-reading.
    Compare-and-sets of different cells run in parallel on ``executor``.
    """
    by_key = {m.key: m for m in mutations}
    pending = list(by_key)
    for _ in range(_MAX_ROUNDS):
        if not pending:
            return
        raws = fetch_cells(store, pending, before=None, with_data=False)
        ready: list[RawCell] = []
        retry: list[CellKey] = []
        for key in pending:
            raw = raws[key]
            verdict = _check(raw, start_ts, resolver)
            if verdict == "done":
                if on_locked is not None and raw.lock_bytes is not None:
                    on_locked(key, raw.lock_bytes)
            elif verdict == "retry":
                retry.append(key)
            else:
                ready.append(raw)
        if ready:
            _put_data_and_history(store, [by_key[r.key] for r in ready], ready, start_ts)
            failpoints.failpoint("prewrite.before_lock")
            outcomes = run_all(
                executor,
                lambda r: _lock(store, r, by_key[r.key], start_ts, make_lock, on_locked),
                ready,
            )
            retry.extend(raw.key for raw, locked in zip(ready, outcomes, strict=True) if not locked)
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


def _check(raw: RawCell, start_ts: int, resolver: LockResolver) -> str:
    """'lock' (go ahead), 'done' (already ours), 'retry' (resolved something; re-read)."""
    key = raw.key
    cell = raw.lock_cell
    if cell.rolled_back == start_ts:
        raise TransactionAbortedError(
            f"transaction {start_ts} was rolled back by another client (seen at {key})"
        )
    if cell.lock is not None:
        if cell.lock.start_ts == start_ts:
            return "done"
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
        return "retry"
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
    return "lock"


def _put_data_and_history(
    store: Store, mutations: Sequence[Mutation], raws: Sequence[RawCell], start_ts: int
) -> None:
    by_table: dict[str, list[Put]] = {}
    for mutation, raw in zip(mutations, raws, strict=True):
        key = mutation.key
        puts = by_table.setdefault(key.table, [])
        if mutation.kind == Kind.PUT:
            puts.append(Put(key.row, DATA, key.qualifier, start_ts, mutation.value))
        last = raw.lock_cell.last_commit
        if last is not None and (raw.write is None or raw.write[0] != last.commit_ts):
            record = WriteRecord(last.kind, last.start_ts)
            puts.append(Put(key.row, WRITE, key.qualifier, last.commit_ts, record.encode()))
    for table, puts in by_table.items():
        if puts:
            store.put(table, puts)


def _lock(
    store: Store,
    raw: RawCell,
    mutation: Mutation,
    start_ts: int,
    make_lock: Callable[[Mutation], LockInfo],
    on_locked: Callable[[CellKey, bytes], None] | None,
) -> bool:
    key = raw.key
    new = raw.lock_cell.with_lock(make_lock(mutation)).encode()
    try:
        locked = store.compare_and_set(key.table, key.row, LOCK, key.qualifier, raw.lock_bytes, new)
    except StoreUnavailableError:
        # Unknown outcome: never re-issue.  Re-read; the lock is ours or we abort.
        again = fetch_cells(store, [key], before=None, with_data=False)[key]
        if not again.lock_cell.locked_by(start_ts) or again.lock_bytes is None:
            raise TransactionAbortedError(
                f"prewrite of {key} had an unknown outcome and the lock is not ours"
            ) from None
        locked, new = True, again.lock_bytes
    if locked and on_locked is not None:
        on_locked(key, new)
    return locked

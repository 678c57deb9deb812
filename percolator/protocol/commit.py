"""Commit: turn one cell's lock into a commit at ``commit_ts``.

For a secondary cell (and for lazy roll-forward by a resolver) the order is fixed:

1. blind-put the write record ``{kind, start_ts}`` at ``commit_ts`` in family ``w``;
2. compare-and-set the lock cell from ``Locked{start_ts}`` to ``Committed{commit_ts}``.

Step 1 before step 2 keeps the invariant that a commit's write record exists before the
lock cell can forget it.  Both steps are idempotent, so any number of clients may roll the
same cell forward concurrently.

The **primary** is different: its compare-and-set is the commit point of the whole
transaction and is done by the committer (percolator/committer.py) before any write record.
"""

from __future__ import annotations

from collections.abc import Sequence

from percolator.layout import LOCK, WRITE
from percolator.protocol.cells import CellKey, fetch_cells
from percolator.records import Kind, LockCell, WriteRecord
from percolator.store.base import Put, Store


def write_record_puts(
    cells: Sequence[tuple[CellKey, Kind]], start_ts: int, commit_ts: int
) -> list[Put]:
    """The write-record puts for committing ``start_ts``'s cells at ``commit_ts``."""
    return [
        Put(key.row, WRITE, key.qualifier, commit_ts, WriteRecord(kind, start_ts).encode())
        for key, kind in cells
    ]


def commit_cell(
    store: Store,
    key: CellKey,
    start_ts: int,
    commit_ts: int,
    lock_bytes: bytes | None = None,
    *,
    write_record_done: bool = False,
) -> bool:
    """Roll ``start_ts``'s lock on ``key`` forward to ``commit_ts``.

    Returns True if the cell now shows the commit (by this call or an earlier one), False
    if the cell holds no lock of ``start_ts`` and no commit of it (it was rolled back).
    """
    for _ in range(100):
        if lock_bytes is None:
            raw = fetch_cells(store, [key], before=None, with_data=False)[key]
            lock_bytes = raw.lock_bytes
        cell = LockCell.decode(lock_bytes)
        if not cell.locked_by(start_ts):
            # Already rolled forward (by us or a resolver), possibly overwritten since by later
            # commits.  A rollback of a committed transaction's cell cannot happen (resolvers
            # decide from the primary), so only an explicit rollback marker means "no".
            return cell.rolled_back != start_ts
        if not write_record_done:
            assert cell.lock is not None
            store.put(key.table, write_record_puts([(key, cell.lock.kind)], start_ts, commit_ts))
            write_record_done = True
        new = cell.committed(commit_ts).encode()
        if store.compare_and_set(key.table, key.row, LOCK, key.qualifier, lock_bytes, new):
            return True
        lock_bytes = None  # changed under us (another resolver): re-read and re-check
    raise RuntimeError(f"roll-forward of {key} did not settle after 100 attempts")

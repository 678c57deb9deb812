"""Rollback: undo the lock of a transaction on one cell.

The lock cell is compare-and-set from ``Locked{start_ts}`` back to the previous commit plus a
marker naming the rolled-back ``start_ts``.  The new bytes always differ from the bytes the
transaction read before it locked the cell, so a delayed prewrite of the rolled-back
transaction fails its compare-and-set, re-reads, sees its own rollback and aborts.

Data versions the transaction wrote stay behind: no write record points at them, so no read
can see them, and garbage collection removes them.

Idempotent: rolling back a cell that no longer holds the transaction's lock does nothing.
"""

from __future__ import annotations

from percolator.protocol.cells import CellKey, fetch_cells
from percolator.protocol.lock import roll_back_lock
from percolator.records import LockCell
from percolator.store.base import Store


def rollback_cell(
    store: Store, key: CellKey, start_ts: int, lock_bytes: bytes | None = None
) -> bool:
    """Roll back ``start_ts``'s lock on ``key``.

    ``lock_bytes``: the lock cell bytes the caller just read (saves a read); if they are not
    ``start_ts``'s lock, or are stale, the cell is re-read.  Returns True if this call (or an
    earlier one) left the cell rolled back for ``start_ts``, False if the cell is not locked by
    ``start_ts`` for another reason (it was committed, or never locked).
    """
    for _ in range(100):
        if lock_bytes is None:
            raw = fetch_cells(store, [key], before=None, with_data=False)[key]
            lock_bytes = raw.lock_bytes
        cell = LockCell.decode(lock_bytes)
        if not cell.locked_by(start_ts) or lock_bytes is None:
            return cell.rolled_back == start_ts
        if roll_back_lock(store, key, lock_bytes):
            return True
        # The lock cell changed under us (a heartbeat, or someone else resolving): re-read.
        lock_bytes = None
    raise RuntimeError(f"rollback of {key} at {start_ts} did not settle after 100 attempts")


def try_rollback_cell(store: Store, key: CellKey, start_ts: int, lock_bytes: bytes) -> bool:
    """One compare-and-set from exactly ``lock_bytes`` (which must hold ``start_ts``'s lock)
    to the rolled-back state.  False if the cell changed since those bytes were read: the
    caller re-reads and decides again (the lock may have been extended by a heartbeat)."""
    if not LockCell.decode(lock_bytes).locked_by(start_ts):
        raise ValueError(f"{key}: the given lock bytes are not a lock of {start_ts}")
    return roll_back_lock(store, key, lock_bytes)

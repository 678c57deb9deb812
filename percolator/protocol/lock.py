"""Every transition of a lock cell: the one module that compare-and-sets the lock family.

A lock cell (family ``l``, format in percolator/records.py) always holds the latest commit of
its user cell and, while a transaction has the cell prewritten, that transaction's lock.  It
moves only along these edges, each one compare-and-set from the **exact bytes** the caller
read::

    latest commit     --place_lock-->      Locked{start_ts}                 prewrite
    Locked{start_ts}  --extend_lock-->     Locked{start_ts}, later expiry   heartbeat
    Locked{start_ts}  --commit_lock-->     Committed{commit_ts}             commit point (on
                                                                            the primary), roll
                                                                            forward (elsewhere)
    Locked{start_ts}  --roll_back_lock-->  latest commit + a marker naming  rollback
                                           the rolled-back start_ts

Expecting exact bytes is what makes each edge safe: lock bytes never repeat (a lock carries
its unique ``start_ts``, a commit its unique ``commit_ts``, a rollback the marker), so a
compare-and-set succeeds only if nothing happened to the cell since it was read (no ABA).

Each function is **one** compare-and-set (the ``*_many`` forms: one per cell, sent to the
store in one call per table) and says whether it applied; none of them reads,
retries or decides what a failure means.  That is the job of the protocol actions that call
them (percolator/protocol/prewrite.py, commit.py, rollback.py, resolve.py, and the heartbeat
in percolator/committer.py): the action decides idempotency ("already ours", "already
committed by a resolver", "rolled back by someone else").

A :class:`~percolator.errors.StoreUnavailableError` from any function here means the outcome
is **unknown**: the compare-and-set may or may not have been applied.  It is never re-issued
blindly; each action says how it settles the doubt (the commit point turns it into an
:class:`~percolator.errors.UndeterminedCommitError`, see commit.commit_primary).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from percolator.layout import LOCK
from percolator.protocol.cells import CellKey, RawCell
from percolator.records import LockCell, LockInfo
from percolator.store.base import CompareAndSet, Put, Store


def _cas(
    store: Store,
    key: CellKey,
    expected: bytes | None,
    new: bytes,
    then_put: tuple[Put, ...] = (),
) -> bool:
    if not then_put:
        return store.compare_and_set(key.table, key.row, LOCK, key.qualifier, expected, new)
    item = CompareAndSet(key.row, LOCK, key.qualifier, expected, new, then_put)
    [applied] = store.compare_and_set_many(key.table, [item])
    return applied


def _cas_many(
    store: Store,
    edges: Sequence[tuple[CellKey, bytes | None, bytes]],
    puts: Mapping[str, Sequence[Put]] | None = None,
    *,
    ride: bool = False,
) -> list[bool]:
    """``(key, expected, new)`` compare-and-sets, one store call per table, each carrying
    that table's ``puts`` (in no order relative to the compare-and-sets; a table with puts
    and no edge gets a call of its own); results in the order given.  An error leaves the
    outcome of every edge and put of the call unknown.

    ``ride`` (only where ``store.conditional_puts``): a put of an edge's row and qualifier
    rides on that edge's compare-and-set (:attr:`CompareAndSet.then_put`), landing only if
    it applies; on HBase that saves the put's round trip."""
    by_table: dict[str, list[int]] = {table: [] for table, p in (puts or {}).items() if p}
    for i, (key, _, _) in enumerate(edges):
        by_table.setdefault(key.table, []).append(i)
    applied = [False] * len(edges)
    for table, indexes in by_table.items():
        table_puts: Sequence[Put] = puts.get(table, ()) if puts else ()
        riders: dict[tuple[bytes, bytes], list[Put]] = {}
        if ride and table_puts:
            cells = {(edges[i][0].row, edges[i][0].qualifier) for i in indexes}
            loose: list[Put] = []
            for put in table_puts:
                cell = (put.row, put.qualifier)
                (riders.setdefault(cell, []) if cell in cells else loose).append(put)
            table_puts = loose
        items = [
            CompareAndSet(
                edges[i][0].row,
                LOCK,
                edges[i][0].qualifier,
                edges[i][1],
                edges[i][2],
                tuple(riders.get((edges[i][0].row, edges[i][0].qualifier), ())),
            )
            for i in indexes
        ]
        if not items:
            store.put(table, table_puts)
            continue
        results = store.compare_and_set_many(table, items, table_puts)
        for i, ok in zip(indexes, results, strict=True):
            applied[i] = ok
    return applied


def _held(key: CellKey, lock_bytes: bytes) -> LockCell:
    cell = LockCell.decode(lock_bytes)
    if cell.lock is None:
        raise ValueError(f"{key}: the given lock cell bytes hold no lock")
    return cell


def place_lock(store: Store, raw: RawCell, lock: LockInfo) -> bytes | None:
    """Prewrite's compare-and-set: from the bytes in ``raw`` (the cell's latest commit, as
    read) to the same state holding ``lock``.  Returns the new bytes if it applied, ``None``
    if the cell changed since it was read."""
    new = raw.lock_cell.with_lock(lock).encode()
    return new if _cas(store, raw.key, raw.lock_bytes, new) else None


def place_locks(
    store: Store,
    locks: Sequence[tuple[RawCell, LockInfo]],
    puts: Mapping[str, Sequence[Put]] | None = None,
) -> list[bytes | None]:
    """:func:`place_lock` for many cells at once: for each, the new bytes if it applied,
    ``None`` if the cell changed since it was read.  ``puts`` (by table) go to the store in
    the same calls, in no order relative to the locks; where the store has conditional
    puts, a cell's own puts (its data) ride on its lock and land only with it."""
    news = [raw.lock_cell.with_lock(lock).encode() for raw, lock in locks]
    edges = [(raw.key, raw.lock_bytes, new) for (raw, _), new in zip(locks, news, strict=True)]
    applied = _cas_many(store, edges, puts, ride=store.conditional_puts)
    return [new if ok else None for new, ok in zip(news, applied, strict=True)]


def extend_lock(store: Store, key: CellKey, lock_bytes: bytes, ttl_ms: int) -> bytes | None:
    """The heartbeat: the lock held in ``lock_bytes`` with ``ttl_ms`` instead of its TTL.
    Returns the new bytes if it applied, ``None`` if the cell changed (the lock was rolled
    back by a resolver, or committed)."""
    cell = _held(key, lock_bytes)
    assert cell.lock is not None
    new = cell.with_lock(replace(cell.lock, ttl_ms=ttl_ms)).encode()
    return new if _cas(store, key, lock_bytes, new) else None


def commit_lock(
    store: Store,
    key: CellKey,
    lock_bytes: bytes,
    commit_ts: int,
    then_put: tuple[Put, ...] = (),
) -> bool:
    """The lock held in ``lock_bytes`` becomes ``Committed{commit_ts}``.  On a primary this
    is the commit point of the whole transaction; on any other cell it is the roll-forward
    and needs the cell's write record riding on it, or put first where the store has
    no conditional puts (commit.commit_cell does either).

    ``then_put``: puts of ``key``'s row that land with the change, atomically, and only if
    it applies (needs ``store.conditional_puts``; see :class:`CompareAndSet`)."""
    new = _held(key, lock_bytes).committed(commit_ts).encode()
    return _cas(store, key, lock_bytes, new, then_put)


def commit_locks(
    store: Store,
    locked: Sequence[tuple[CellKey, bytes]],
    commit_ts: int,
    puts: Mapping[str, Sequence[Put]] | None = None,
) -> list[bool]:
    """:func:`commit_lock` for many ``(key, lock_bytes)`` at once: whether each applied.
    ``puts`` (by table) go to the store in the same calls, in no order relative to the
    compare-and-sets; where the store has conditional puts, a cell's own puts (its write
    record) ride on its compare-and-set and land only with it."""
    edges = [
        (key, lock_bytes, _held(key, lock_bytes).committed(commit_ts).encode())
        for key, lock_bytes in locked
    ]
    return _cas_many(store, edges, puts, ride=store.conditional_puts)


def roll_back_lock(store: Store, key: CellKey, lock_bytes: bytes) -> bool:
    """The lock held in ``lock_bytes`` is dropped: the cell returns to its latest commit plus
    a marker naming the rolled-back ``start_ts``, so the new bytes differ from those the
    transaction read before locking and a delayed prewrite of it fails (design notes §3)."""
    new = _held(key, lock_bytes).rolled_back_state().encode()
    return _cas(store, key, lock_bytes, new)

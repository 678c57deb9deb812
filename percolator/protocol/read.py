"""Snapshot read at ``read_ts``.

One Get per row fetches the lock cell, the newest write record ``<= read_ts`` and the newest
data version ``<= read_ts`` (exclusive bound ``read_ts + 1``); a read of more than
:data:`~percolator.protocol.cells.CELLS_PER_READ` cells takes several, each cell's own cells
in one of them.  In the common case (no lock, newest data version is the committed one)
that is the whole read: **one round trip**.

* A lock with ``start_ts <= read_ts`` may belong to a transaction that commits below
  ``read_ts``: it must be resolved before the read can answer.  Dead transactions are rolled
  forward or back at once; a live one makes the reader back off with jitter, bounded by
  ``lock_wait_ms``, after which :class:`LockWaitTimeoutError` is raised (retryable).
* A lock with ``start_ts > read_ts`` is ignored: its commit will be above ``read_ts``.
* The visible commit is the newer of the lock cell's latest commit (if ``<= read_ts``) and
  the newest write record; its data is at its ``start_ts``.  If the newest data version in
  the first Get is not that one (a rolled-back transaction left a newer orphan), one more
  Get at ``start_ts + 1`` fetches it.

Reads never write anything except when resolving locks of finished transactions.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence

from percolator.errors import LockWaitTimeoutError, StoreError
from percolator.layout import DATA
from percolator.protocol import cells
from percolator.protocol.cells import CellKey, RawCell, fetch_cells
from percolator.protocol.resolve import LockResolver
from percolator.records import CommitInfo, Kind
from percolator.retry import Backoff
from percolator.store.base import Store


def read_cells(
    store: Store,
    resolver: LockResolver,
    keys: Sequence[CellKey],
    read_ts: int,
    *,
    lock_wait_ms: int = 10_000,
    seen: dict[CellKey, RawCell] | None = None,
) -> dict[CellKey, bytes | None]:
    """Values of ``keys`` as of ``read_ts`` (``None`` = absent or deleted)."""
    found = read_commits(store, resolver, keys, read_ts, lock_wait_ms=lock_wait_ms, seen=seen)
    return {key: value for key, (value, _) in found.items()}


def read_commits(
    store: Store,
    resolver: LockResolver,
    keys: Sequence[CellKey],
    read_ts: int,
    *,
    lock_wait_ms: int = 10_000,
    seen: dict[CellKey, RawCell] | None = None,
) -> dict[CellKey, tuple[bytes | None, CommitInfo | None]]:
    """Values of ``keys`` as of ``read_ts`` with the commit that wrote each (``None`` when
    the cell was never written; a DELETE commit gives value ``None`` and its commit).

    ``seen``, if given, receives the raw state each answer was read from; a transaction
    hands it to its prewrite, which can then skip re-reading cells it read (see
    percolator/protocol/prewrite.py)."""
    results: dict[CellKey, tuple[bytes | None, CommitInfo | None]] = {}
    pending = list(dict.fromkeys(keys))
    deadline = time.monotonic() + lock_wait_ms / 1000
    # Jittered so readers piling onto one lock do not retry in lockstep.
    backoff = Backoff(0.002, 0.2)
    while pending:
        raws = fetch_cells(store, pending, before=read_ts + 1)
        blocked: list[RawCell] = []
        need_data: list[tuple[CellKey, CommitInfo]] = []
        for key in pending:
            raw = raws[key]
            lock = raw.lock_cell.lock
            if lock is not None and lock.start_ts <= read_ts:
                blocked.append(raw)
                continue
            if seen is not None:
                seen[key] = raw
            commit = raw.latest_commit(read_ts)
            if commit is None or commit.kind == Kind.DELETE:
                results[key] = (None, commit)
            elif raw.data is not None and raw.data[0] == commit.start_ts:
                results[key] = (raw.data[1], commit)
            else:
                need_data.append((key, commit))
        if need_data:
            fetched = _fetch_data_at(store, [(key, c.start_ts) for key, c in need_data])
            for key, commit in need_data:
                results[key] = (fetched[key], commit)
        pending = []
        if not blocked:
            break
        waiting: list[RawCell] = []
        for raw in blocked:
            status = resolver.resolve(raw)
            pending.append(raw.key)
            if not status.final:
                waiting.append(raw)
        if waiting:
            if time.monotonic() >= deadline:
                raw = waiting[0]
                assert raw.lock_cell.lock is not None
                raise LockWaitTimeoutError(
                    f"gave up after {lock_wait_ms} ms waiting for a live lock",
                    table=raw.key.table,
                    row=raw.key.row,
                    column=raw.key.column,
                    start_ts=read_ts,
                    conflict_ts=raw.lock_cell.lock.start_ts,
                )
            backoff.sleep()
    return results


def _fetch_data_at(store: Store, wanted: list[tuple[CellKey, int]]) -> dict[CellKey, bytes]:
    """Fetch data versions at exact ``start_ts``s, one read per (table, start_ts) group (per
    :data:`~percolator.protocol.cells.CELLS_PER_READ` cells of a group)."""
    groups: dict[tuple[str, int], list[CellKey]] = defaultdict(list)
    for key, start_ts in wanted:
        groups[(key.table, start_ts)].append(key)
    out: dict[CellKey, bytes] = {}
    per_read = max(1, cells.CELLS_PER_READ)  # read at call time: one setting for every read
    for (table, start_ts), group in groups.items():
        for keys in cells.in_parts(group, per_read):
            _fetch_data_group(store, table, start_ts, keys, out)
    return out


def _fetch_data_group(
    store: Store, table: str, start_ts: int, keys: Sequence[CellKey], out: dict[CellKey, bytes]
) -> None:
    """The data at ``start_ts`` of ``keys`` (of ``table``), in one read, into ``out``."""
    # Exactly these cells: a cross product of their rows and columns could name far more.
    fetched = store.read_cells(
        table, [(k.row, (DATA, k.qualifier)) for k in keys], before=start_ts + 1
    )
    for key in keys:
        versions = fetched.get(key.row, {}).get((DATA, key.qualifier))
        if not versions or versions[0][0] != start_ts:
            # A write record points at data that is gone: only garbage collection
            # removes data, and it never removes the data of a visible commit.
            raise StoreError(
                f"data of {key} at start_ts {start_ts} is missing although a commit "
                "points at it (store damaged or read below the GC safe point)"
            )
        out[key] = versions[0][1]


def raw_read(store: Store, keys: Sequence[CellKey], read_ts: int) -> dict[CellKey, RawCell]:
    """The raw protocol state of ``keys`` (for tools and tests)."""
    return fetch_cells(store, keys, before=read_ts + 1)

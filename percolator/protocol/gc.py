"""Garbage collection of old versions below a safe point.

1. **Safe point**: ``now - life_time``, lowered below the oldest live transaction that any
   client has published (``Client.publish_min_start_ts``) and below any lock that is still
   alive.  Reads below the safe point are rejected with :class:`SafePointError`.
2. **Locks** below the candidate safe point are resolved (rolled forward or back) first, so
   no transaction below the safe point is undecided when versions disappear.
3. The safe point is stored (compare-and-set, only ever forward) **before** any deletion:
   a client that sees the old safe point may still read, but only at or above it.
4. Per cell, the newest write record ``<= safe point`` is kept with its data; older write
   records and data versions are deleted (``delete_versions`` at ``commit_ts - 1`` and
   ``start_ts - 1``).  Cells whose kept record is not newer than the previous safe point
   were already collected and are skipped, so a GC run does not re-mark untouched cells.

Known leftover: data versions of rolled-back transactions that are newer than a cell's
kept commit stay until a later commit of that cell is collected.

Idempotent and safe to run concurrently with transactions; two GC runs at once do no harm
(the safe point only moves forward by compare-and-set).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from percolator import failpoints
from percolator.layout import DATA, LOCK, META_FAMILY, META_TABLE, WRITE
from percolator.protocol.cells import CellKey, RawCell
from percolator.protocol.resolve import LockResolver
from percolator.records import LockCell, WriteRecord
from percolator.store.base import Delete, ScanOptions, Store
from percolator.timestamps import compose, describe, physical_ms

_U64 = struct.Struct(">Q")
SAFE_POINT_ROW = b"gc"
SAFE_POINT_QUALIFIER = b"safe_point"
CLIENTS_PREFIX = b"clients/"
_DELETE_BATCH = 1000


@dataclass
class GcReport:
    safe_point: int = 0
    previous_safe_point: int = 0
    locks_resolved: int = 0
    locks_alive: int = 0
    cells_collected: int = 0
    clients_expired: int = 0
    tables: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (
            f"safe point {describe(self.safe_point)}; {self.locks_resolved} locks resolved, "
            f"{self.locks_alive} alive; {self.cells_collected} cells collected in "
            f"{len(self.tables)} tables; {self.clients_expired} expired client records removed"
        )


def read_safe_point(store: Store) -> tuple[int, bytes | None]:
    """The stored safe point and its exact bytes (for compare-and-set)."""
    cells = store.read_row(
        META_TABLE, SAFE_POINT_ROW, columns=[(META_FAMILY, SAFE_POINT_QUALIFIER)]
    )
    versions = cells.get((META_FAMILY, SAFE_POINT_QUALIFIER))
    if not versions:
        return 0, None
    return _U64.unpack(versions[0][1])[0], versions[0][1]


def advance_safe_point(store: Store, safe_point: int) -> int:
    """Move the stored safe point forward to ``safe_point`` (never back).  Returns the
    stored value afterwards."""
    for _ in range(100):
        current, raw = read_safe_point(store)
        if current >= safe_point:
            return current
        if store.compare_and_set(
            META_TABLE,
            SAFE_POINT_ROW,
            META_FAMILY,
            SAFE_POINT_QUALIFIER,
            raw,
            _U64.pack(safe_point),
        ):
            return safe_point
    raise RuntimeError("the safe point kept changing under this GC run")


def published_min_start_ts(store: Store, now_ms: int) -> tuple[int | None, list[bytes]]:
    """The oldest live transaction any client published, and the rows of expired records."""
    oldest: int | None = None
    expired: list[bytes] = []
    options = ScanOptions(start=CLIENTS_PREFIX, stop=CLIENTS_PREFIX[:-1] + b"0")
    for row, cells in store.scan(META_TABLE, META_FAMILY, options):
        value = cells.get(b"min_start_ts")
        if value is None:
            continue
        min_start, expires = _U64.unpack(value[1][:8])[0], _U64.unpack(value[1][8:16])[0]
        if expires < now_ms:
            expired.append(row)
        elif min_start and (oldest is None or min_start < oldest):
            oldest = min_start
    return oldest, expired


def run_gc(
    store: Store,
    resolver: LockResolver,
    tables: Sequence[str],
    *,
    now_ts: int,
    life_time_ms: int,
    progress: Callable[[str], None] | None = None,
) -> GcReport:
    """One garbage-collection pass over ``tables``.

    ``now_ts`` is a fresh timestamp from the oracle: with ``life_time_ms=0`` the safe point
    is above every transaction that started before this call."""
    say = progress or (lambda message: None)
    report = GcReport(tables=list(tables))
    candidate = max(0, now_ts - compose(life_time_ms))
    oldest, expired = published_min_start_ts(store, physical_ms(now_ts))
    if oldest is not None:
        candidate = min(candidate, oldest)
    previous, _ = read_safe_point(store)
    report.previous_safe_point = previous

    for table in tables:
        say(f"resolving locks below {describe(candidate)} in {table}")
        candidate = _resolve_old_locks(store, resolver, table, candidate, report)

    safe_point = advance_safe_point(store, candidate)
    report.safe_point = safe_point
    failpoints.failpoint("gc.after_safe_point")

    for table in tables:
        say(f"collecting versions below {describe(safe_point)} in {table}")
        _collect(store, table, safe_point, previous, report)

    if expired:
        store.delete_versions(
            META_TABLE, [Delete(row, META_FAMILY, b"min_start_ts", 2**62) for row in expired]
        )
        report.clients_expired = len(expired)
    say(report.summary())
    return report


def _resolve_old_locks(
    store: Store, resolver: LockResolver, table: str, candidate: int, report: GcReport
) -> int:
    for row, cells in store.scan(table, LOCK, ScanOptions(batch_size=1000)):
        for qualifier, (_, value) in cells.items():
            cell = LockCell.decode(value)
            lock = cell.lock
            if lock is None or lock.start_ts >= candidate:
                continue
            key = CellKey(table, row, qualifier.decode("utf-8"))
            status = resolver.resolve(RawCell(key, value, cell, None, None))
            if status.final:
                report.locks_resolved += 1
            else:
                # A live transaction below the candidate: keep the safe point below it.
                report.locks_alive += 1
                candidate = min(candidate, lock.start_ts)
    return candidate


def _collect(store: Store, table: str, safe_point: int, previous: int, report: GcReport) -> None:
    deletes: list[Delete] = []
    options = ScanOptions(before=safe_point + 1, batch_size=1000)
    for row, cells in store.scan(table, WRITE, options):
        for qualifier, (commit_ts, value) in cells.items():
            if commit_ts <= previous:
                continue  # already the kept version of an earlier GC run
            record = WriteRecord.decode(value)
            deletes.append(Delete(row, WRITE, qualifier, commit_ts - 1))
            deletes.append(Delete(row, DATA, qualifier, record.start_ts - 1))
            report.cells_collected += 1
            if len(deletes) >= _DELETE_BATCH:
                store.delete_versions(table, deletes)
                deletes = []
    if deletes:
        store.delete_versions(table, deletes)


def lock_report(store: Store, table: str) -> list[RawCell]:
    """Every lock currently held in ``table`` (for status tools and tests)."""
    found: list[RawCell] = []
    for row, cells in store.scan(table, LOCK, ScanOptions(batch_size=1000)):
        for qualifier, (_, value) in cells.items():
            cell = LockCell.decode(value)
            if cell.lock is not None:
                key = CellKey(table, row, qualifier.decode("utf-8"))
                found.append(RawCell(key, value, cell, None, None))
    return found

"""Garbage collection of old versions below a safe point, without breaking any reader.

One pass:

1. **Candidate**: ``now - life_time``, lowered below the oldest live reader any client has
   published, the named reservations, and the calling client's own readers
   (percolator/readers.py).
2. **Locks, in every table** (whatever subset is being collected): every lock below the
   candidate is resolved (rolled forward or back); a live one lowers the candidate below it.
   So no transaction below the safe point is undecided when history disappears anywhere: a
   secondary lock in table ``b`` can never outlive the history of its primary in ``a``.  A
   lock whose primary's table is gone cannot be decided: it is counted (``locks_orphaned``)
   and skipped, and GC of everything else goes on.
3. The safe point is stored (compare-and-set, only ever forward) **before** any deletion.
4. The readers are **read again**: nothing at or above the oldest live reader, reservation or
   live lock is deleted (the deletion bound may be below the stored safe point; readers below
   the stored safe point get SafePointError anyway).  This second read is what protects a
   reader whose publication landed while the pass was running (percolator/readers.py).
   Then the **locks again**, in every table, below that bound: a transaction no record
   protected (a lapsed record, a transaction inherited across a fork) may have locked after
   the first scan and passed its commit check against the previous safe point; every lock
   it placed is there before the safe point was stored, so this scan settles the dead ones
   while their primary's commit-index entry still exists, and a live one lowers the bound.
5. Per table: per cell, the newest write record ``<= bound`` is kept with its data; older
   write records and data versions (including the orphans of rolled-back transactions below
   the kept commit) are deleted, and so are the commit-index entries of transactions below the
   bound (``protocol/commit.py``).  Each table's progress (``gc/table/<name>``) is stored only
   after its collection finished, and a cell is skipped only when its kept record is not newer
   than **that table's** progress: a pass killed at any step, or a pass over a subset of
   tables, leaves nothing uncollectable.

6. **Dead cells** of each collected table go entirely: a lock cell that holds no lock, whose
   latest commit is a delete (or that never committed) and whose last rollback are both below
   the bound goes, with every write record and data version of its cell below the bound.
   Reads of such a cell answer "absent" with or without them.  The Thrift-1 gateway
   has no conditional delete, so the lock cell is deleted "at or below" a version: safe only
   if every compare-and-set after GC read the cell is stamped above it.  A compare-and-set
   on the meta table (``gc:clock``) before the scan gives the store's time; every later one
   is stamped at or above that time minus :attr:`Store.stamp_skew_ms` (the *stamp limit*),
   so GC removes only lock cells stamped below the limit, deleting at or below limit - 1.
   A transaction that prewrites such a cell later finds no record of its
   history, so its write-write check cannot see commits below the bound: every transaction
   checks the safe point between its prewrite and its commit point (committer.py), and one
   below it aborts.  The history goes first and the lock cell last, in a call of its own: a
   pass killed between the two leaves a lock cell the next pass finds dead again (the other
   way round, it would leave history no scan of lock cells finds).  A prewrite that reads
   the lock cell in between re-puts the record of the delete it holds; on HBase the delete
   marker hides it, elsewhere a later pass collects it.  A dead cell whose notify family
   still holds a notification stays until a later pass: the observer's run must find the
   delete it was notified of (gone, it would read "never written" and skip the change).

7. The delete masks of the collected tables and of the meta table are forgotten
   (:meth:`Store.compact_deletes`; on HBase its own major compactions do that), so the
   embedded store's masks stay bounded too.

Deletes are batched (one store call per 1000 cells).  Idempotent and safe to run
concurrently with transactions and with other GC passes.

Known leftover (the Thrift-1 gateway deletes "every version at or below", never one version
in the middle): on a cell whose latest commit is a put, data versions of rolled-back
transactions that are **newer** than that commit stay until a later commit of the cell is
collected or the cell is deleted.  A resolver or committer that decided to roll a cell
forward and stalled across a pass puts nothing late: its write record rides on its
compare-and-set of the lock cell (protocol/commit.py, MUST), except with the Thrift-1 gateway
alone, where the late blind put lands under this pass's delete marker.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from percolator import failpoints
from percolator.errors import InvalidArgumentError, TableNotFoundError
from percolator.layout import (
    DATA,
    LOCK,
    META_FAMILY,
    META_TABLE,
    WRITE,
    acked_qualifier,
    is_commit_index,
)
from percolator.protocol.cells import CellKey, RawCell
from percolator.protocol.resolve import LockResolver
from percolator.readers import (
    CLIENT_QUALIFIER,
    SAFE_POINT_QUALIFIER,
    SAFE_POINT_ROW,
    collect_reservations,
    live_readers,
    read_safe_point,
    set_meta_cell,
)
from percolator.records import Kind, LockCell, WriteRecord
from percolator.store.base import MAX_VERSION, Delete, ScanOptions, Store
from percolator.timestamps import compose, describe, now_ms, physical_ms

_U64 = struct.Struct(">Q")
TABLE_PROGRESS_PREFIX = b"gc/table/"
TABLE_PROGRESS_QUALIFIER = b"collected"
CLOCK_QUALIFIER = b"clock"
_DELETE_BATCH = 1000
#: The longest GC life time, in ms: the whole physical range of the timestamps (the
#: physical part of the largest version a store holds, 2**45 - 1 ms, about 1115 years).
#: Longer means nothing (every version of every timestamp is younger), and the command
#: line's seconds that large overflow on the way to milliseconds.
MAX_LIFE_TIME_MS = physical_ms(MAX_VERSION)

#: ``notified(table, cells)``: the ``(row, qualifier)`` cells among ``cells`` that have a
#: notification waiting
Notified = Callable[[str, Sequence[tuple[bytes, bytes]]], set[tuple[bytes, bytes]]]


@dataclass
class GcReport:
    safe_point: int = 0
    previous_safe_point: int = 0
    #: versions below this were collected (at most the safe point; below live readers)
    bound: int = 0
    locks_resolved: int = 0
    locks_alive: int = 0
    #: locks whose primary's table no longer exists (undecidable; left in place)
    locks_orphaned: int = 0
    cells_collected: int = 0
    #: cells whose latest commit is a delete, removed with their lock cell
    dead_cells_removed: int = 0
    #: dead cells left for a later pass: a notification of their delete was still waiting
    dead_cells_notified: int = 0
    #: dead cells kept: an observer's ack is older than their delete (it has not run since,
    #: e.g. unregistered; registering it again catches up on the delete)
    dead_cells_owed: int = 0
    #: notify cells of columns no observer watches, cleaned (by the client, see gc())
    notifications_collected: int = 0
    #: delete masks forgotten (Store.compact_deletes: embedded and memory stores)
    delete_masks_dropped: int = 0
    clients_expired: int = 0
    #: records of reservations released or expired long ago, removed
    reservations_removed: int = 0
    tables: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (
            f"safe point {describe(self.safe_point)}; {self.locks_resolved} locks resolved, "
            f"{self.locks_alive} alive, {self.locks_orphaned} orphaned; "
            f"{self.cells_collected} cells collected and {self.dead_cells_removed} deleted "
            f"cells removed in {len(self.tables)} tables ({self.dead_cells_owed} kept for "
            "an observer's run); "
            f"{self.clients_expired} expired client records and "
            f"{self.reservations_removed} old reservations removed; "
            f"{self.delete_masks_dropped} delete masks dropped"
        )


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


def store_clock_ms(store: Store) -> int:
    """A version the store stamped during this call: every compare-and-set issued after it
    returns is stamped at least this minus :attr:`Store.stamp_skew_ms`.  The meta cell
    ``gc:clock`` is set to a random value (by compare-and-set), then its version is read."""
    set_meta_cell(store, SAFE_POINT_ROW, CLOCK_QUALIFIER, os.urandom(8))
    # Another pass may have stamped it again since: later still, just as good.
    column = (META_FAMILY, CLOCK_QUALIFIER)
    return store.read_row(META_TABLE, SAFE_POINT_ROW, columns=[column])[column][0][0]


def table_progress(store: Store, table: str) -> int:
    """Up to which timestamp ``table`` was last collected completely (0: never)."""
    row = TABLE_PROGRESS_PREFIX + table.encode("utf-8")
    versions = store.read_row(META_TABLE, row, columns=[(META_FAMILY, TABLE_PROGRESS_QUALIFIER)])
    found = versions.get((META_FAMILY, TABLE_PROGRESS_QUALIFIER))
    return _U64.unpack(found[0][1])[0] if found else 0


def set_table_progress(store: Store, table: str, collected: int) -> None:
    row = TABLE_PROGRESS_PREFIX + table.encode("utf-8")
    set_meta_cell(store, row, TABLE_PROGRESS_QUALIFIER, _U64.pack(collected))


def forget_table_progress(store: Store, table: str) -> None:
    """A table created anew under an old name starts uncollected."""
    set_table_progress(store, table, 0)


def check_life_time_ms(life_time_ms: int) -> None:
    """Raise :class:`InvalidArgumentError` unless ``life_time_ms`` is an int (not a bool) in
    ``[0, MAX_LIFE_TIME_MS]``; called before a GC pass does anything."""
    if (
        not isinstance(life_time_ms, int)
        or isinstance(life_time_ms, bool)
        or not 0 <= life_time_ms <= MAX_LIFE_TIME_MS
    ):
        raise InvalidArgumentError(
            f"life_time_ms must be an int in [0, {MAX_LIFE_TIME_MS}] (the timestamps' "
            f"physical range, about 1115 years), got {life_time_ms!r}"
        )


def run_gc(
    store: Store,
    resolver: LockResolver,
    tables: Sequence[str],
    *,
    now_ts: int,
    life_time_ms: int,
    all_tables: Sequence[str] | None = None,
    own_oldest_reader: Callable[[], int | None] = lambda: None,
    own_row: bytes | None = None,
    progress: Callable[[str], None] | None = None,
    notified: Notified,
) -> GcReport:
    """One garbage-collection pass collecting ``tables``; locks are resolved in
    ``all_tables`` (default: ``tables``; the client passes every user table).

    ``now_ts`` is a fresh timestamp from the oracle: with ``life_time_ms=0`` the safe point
    is above every transaction that started before this call and is not a live reader.
    ``notified(table, cells)``: which of the ``(row, qualifier)`` cells have a notification
    waiting (percolator/notifications.py owns that family): dead cells among them stay.
    ``life_time_ms`` outside ``[0, MAX_LIFE_TIME_MS]`` raises :class:`InvalidArgumentError`
    before anything is read or written (:func:`check_life_time_ms`)."""
    check_life_time_ms(life_time_ms)
    say = progress or (lambda message: None)
    report = GcReport(tables=list(tables))
    candidate = max(0, now_ts - compose(life_time_ms))
    readers = live_readers(store, physical_ms(now_ts), extra=own_oldest_reader(), own_row=own_row)
    if readers.oldest is not None:
        candidate = min(candidate, readers.oldest)
    previous, _ = read_safe_point(store)
    report.previous_safe_point = previous

    oldest_alive: int | None = None
    for table in all_tables if all_tables is not None else tables:
        say(f"resolving locks below {describe(candidate)} in {table}")
        candidate, alive = _resolve_old_locks(store, resolver, table, candidate, report)
        if alive is not None and (oldest_alive is None or alive < oldest_alive):
            oldest_alive = alive

    safe_point = advance_safe_point(store, candidate)
    report.safe_point = safe_point
    failpoints.failpoint("gc.after_safe_point")

    # Read the readers again: one that published after the first read is protected here.
    again = live_readers(store, now_ms(), extra=own_oldest_reader(), own_row=own_row)
    bound = min(x for x in (safe_point, again.oldest, oldest_alive) if x is not None)
    # And the locks again: a transaction below the bound that was not published (its
    # record lapsed, or it was inherited across a fork) may have placed its locks after
    # the first scan and passed its commit check against the safe point stored before
    # this pass's.  Its locks are all in place by then, so this scan meets each one still
    # there: a dead one is settled while its commit-index entry still exists, a live one
    # keeps the bound below it.  A transaction that locks after this scan checks the
    # safe point just stored and, below the bound, aborts.
    for table in all_tables if all_tables is not None else tables:
        bound, _ = _resolve_old_locks(store, resolver, table, bound, report, again=True)
    report.bound = bound

    # Lock cells stamped below this are older than any compare-and-set still to come.
    stamp_limit = store_clock_ms(store) - store.stamp_skew_ms
    for table in tables:
        say(f"collecting versions below {describe(bound)} in {table}")
        done = table_progress(store, table)
        _collect(store, table, bound, done, report)
        failpoints.failpoint("gc.after_versions")
        _remove_dead_cells(store, table, bound, stamp_limit, report, notified)
        failpoints.failpoint("gc.after_table")
        if bound > done:
            set_table_progress(store, table, bound)

    # Expired in both reads, the same record (row and version): deleted at or below the
    # version read, so a record its client stored since (always at a higher version, see
    # ReaderRegistry.publish) survives, and no delete marker hides the client's later ones.
    expired = sorted(set(readers.expired) & set(again.expired))
    if expired:
        store.delete_versions(
            META_TABLE,
            [Delete(row, META_FAMILY, CLIENT_QUALIFIER, version) for row, version in expired],
        )
        report.clients_expired = len(expired)
    report.reservations_removed = collect_reservations(store, now_ms())
    # Last, so the masks of this pass's own deletes go too (the protocol never relies on a
    # mask; see Store.compact_deletes).
    for table in [*tables, META_TABLE]:
        report.delete_masks_dropped += store.compact_deletes(table)
    say(report.summary())
    return report


def _resolve_old_locks(
    store: Store,
    resolver: LockResolver,
    table: str,
    candidate: int,
    report: GcReport,
    *,
    again: bool = False,
) -> tuple[int, int | None]:
    """Resolve every lock of ``table`` below ``candidate``.  Returns the candidate (lowered
    below live locks) and the oldest live lock's start_ts.  ``again``: the pass's second
    scan (its live and orphaned locks were counted by the first)."""
    oldest_alive: int | None = None
    for row, cells in store.scan(table, LOCK, ScanOptions(batch_size=1000)):
        for qualifier, (_, value) in cells.items():
            cell = LockCell.decode(value)
            lock = cell.lock
            if lock is None or lock.start_ts >= candidate:
                continue
            key = CellKey(table, row, qualifier.decode("utf-8"))
            try:
                status = resolver.resolve(RawCell(key, value, cell, None, None))
            except TableNotFoundError:
                # Its primary's table was dropped: the transaction's fate cannot be known.
                # Leave the lock (reads of this cell report it) and collect everything else.
                report.locks_orphaned += 0 if again else 1
                continue
            if status.final:
                report.locks_resolved += 1
            else:
                # A live transaction below the candidate: keep the safe point below it.
                report.locks_alive += 0 if again else 1
                candidate = min(candidate, lock.start_ts)
                if oldest_alive is None or lock.start_ts < oldest_alive:
                    oldest_alive = lock.start_ts
    return candidate, oldest_alive


def _collect(store: Store, table: str, bound: int, done: int, report: GcReport) -> None:
    deletes: list[Delete] = []
    options = ScanOptions(before=bound + 1, batch_size=1000)
    for row, cells in store.scan(table, WRITE, options):
        for qualifier, (version, value) in cells.items():
            if is_commit_index(qualifier):
                # Entries at start_ts: only locks of transactions below the bound could need
                # them, and those were all resolved above.
                if version < bound:
                    deletes.append(Delete(row, WRITE, qualifier, bound - 1))
            elif version > done:  # else: already the kept version of an earlier pass
                record = WriteRecord.decode(value)
                deletes.append(Delete(row, WRITE, qualifier, version - 1))
                deletes.append(Delete(row, DATA, qualifier, record.start_ts - 1))
                report.cells_collected += 1
            if len(deletes) >= _DELETE_BATCH:
                store.delete_versions(table, deletes)
                deletes = []
    if deletes:
        store.delete_versions(table, deletes)


def is_dead(cell: LockCell, bound: int) -> bool:
    """Whether a lock cell says its user cell is gone for every reader at or above
    ``bound``: no lock, no commit but a delete below ``bound``, and no rollback at or above
    it (a rolled-back transaction at or above the bound may still be running; its marker
    must stay so that its late prewrite fails)."""
    last = cell.last_commit
    return (
        cell.lock is None
        and cell.rolled_back < bound
        and (last is None or (last.kind is Kind.DELETE and last.commit_ts < bound))
    )


def owes_delete(cell: LockCell, acks: Sequence[LockCell]) -> bool:
    """Whether a strong observer has not seen the delete of dead ``cell``, judged from the
    lock cells of its acks of that cell (``acks``): a run at start timestamp ``O``
    acknowledges the latest commit at or below ``O``, so an ack whose run started before
    the delete committed covers an earlier change; an ack being written now may cover
    either.  Such a cell must stay: an observer that is not registered now (no notification
    was written for the delete) finds what it owes, when registered again, only from the
    cell's lock cell (observers/catchup.py); removed, the delete would be lost to it for
    good.  (A weak observer keeps no acks: it is not covered.)"""
    last = cell.last_commit
    if last is None:  # never committed: nobody saw a value to be told is gone
        return False
    for ack in acks:
        if ack.lock is not None:
            return True
        written = ack.last_commit
        if written is not None and written.kind is Kind.PUT and written.start_ts < last.commit_ts:
            return True  # (a deleted ack is no ack: percolator observers forget)
    return False


def _acks_by_column(cells: Mapping[bytes, tuple[int, bytes]]) -> dict[bytes, list[LockCell]]:
    """The lock cells of a row's ack columns (``layout.ack_column``), by the qualifier of the
    column they acknowledge."""
    acks: dict[bytes, list[LockCell]] = {}
    for qualifier, (_, value) in cells.items():
        acked = acked_qualifier(qualifier)
        if acked is not None:
            acks.setdefault(acked, []).append(LockCell.decode(value))
    return acks


def _remove_dead_cells(
    store: Store,
    table: str,
    bound: int,
    stamp_limit: int,
    report: GcReport,
    notified: Notified,
) -> None:
    """Delete the dead cells of ``table`` (module docstring, step 6), lock cells last.
    A dead cell with a notification waiting (``notified``) stays for a later pass: the
    observer's run must still find the delete it is notified of."""
    dead: list[tuple[bytes, bytes]] = []

    def flush() -> None:
        waiting = notified(table, dead)
        locks: list[Delete] = []
        history: list[Delete] = []
        for row, qualifier in dead:
            if (row, qualifier) in waiting:
                report.dead_cells_notified += 1
                continue
            # Every compare-and-set since the store clock was read is stamped at or above
            # stamp_limit, so "at or below stamp_limit - 1" removes only the version read
            # (and older ones).  One timestamp for every cell: one call per batch on HBase,
            # whose deletes take their timestamp per call.
            locks.append(Delete(row, LOCK, qualifier, stamp_limit - 1))
            # Below the bound: nothing a reader at or above it can see (the lock cell said
            # no commit but the delete is below it; a transaction that starts there writes
            # at or above it), and no live reader is below it.
            history.append(Delete(row, WRITE, qualifier, bound - 1))
            history.append(Delete(row, DATA, qualifier, bound - 1))
        dead.clear()
        if not locks:
            return
        store.delete_versions(table, history)
        failpoints.failpoint("gc.before_lock_cells")
        store.delete_versions(table, locks)
        report.dead_cells_removed += len(locks)

    for row, cells in store.scan(table, LOCK, ScanOptions(batch_size=_DELETE_BATCH)):
        acks: dict[bytes, list[LockCell]] | None = None  # the row's, read when needed
        for qualifier, (version, value) in cells.items():
            if version >= stamp_limit:
                continue
            cell = LockCell.decode(value)
            if not is_dead(cell, bound):
                continue
            if acks is None:
                acks = _acks_by_column(cells)
            if owes_delete(cell, acks.get(qualifier, ())):
                report.dead_cells_owed += 1
                continue
            dead.append((row, qualifier))
            if len(dead) >= _DELETE_BATCH:
                flush()
    if dead:
        flush()


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

"""Commit: the commit point of a transaction, and turning one cell's lock into a commit.

**The commit point** (:func:`commit_primary`) is one compare-and-set of the transaction's
primary lock cell from the exact lock bytes the transaction holds to
``Committed{commit_ts}``.  Before it, nothing of the transaction is visible and any client may
roll it back; after it, the transaction is committed whatever happens next.  Its outcome is
one of three:

* applied -> committed;
* not applied -> the lock is no longer ours (a resolver rolled the transaction back after it
  found the lock expired): :class:`TransactionAbortedError`;
* the store could not say (connection broken mid-call) ->
  :class:`UndeterminedCommitError`, never a guess: the compare-and-set may have been applied.
  A later read of the primary shows the truth; re-running the transaction could apply it
  twice, so nothing retries it automatically.

The primary's write record is put after the commit point, with those of the secondaries:
until it lands, the primary's ``Committed{commit_ts}`` carries the commit by itself.  On a
store with conditional puts (``Store.conditional_puts``: memory, embedded, HBase with a
Thrift-2 gateway) the primary's
record and commit-index entry instead ride on the commit point itself
(:func:`primary_commit_puts`): they land with it, atomically, or not at all.  That is
Percolator's own commit point (the primary's write record and the lock's removal in one
row transaction), and one write fewer per transaction.

**The commit index** (:func:`commit_index_put`) lets a status check find a primary's commit
in one read (protocol/resolve.py).  A prewrite that is about to replace the primary's
``Committed{commit_ts}`` writes a missing record *and* index entry first, but it judges
"missing" by the record alone.  So, MUST: **the index entry is stored before the primary's
write record**, by every writer of that record (:func:`put_commit_records`, the roll-forward
in :func:`commit_cell`, the prewrite's repair), in a separate, earlier put: a put is atomic
per row *and version* only (on HBase one call per version), and the entry (at ``start_ts``)
and the record (at ``commit_ts``) have different versions.  (On a store whose whole put call
is atomic, ``Store.put_is_atomic``, one put holding both is as good: neither lands without
the other; :func:`record_puts` does that.)  Otherwise a crash between them,
or a resolver rolling the primary forward from stale lock bytes, leaves a record without an
entry; the next commit of the cell replaces the lock cell's copy; and a later status check
judges the committed transaction rolled back and rolls its remaining secondaries back.

For a secondary cell (and for lazy roll-forward by a resolver, :func:`commit_cell`), on a
store with conditional puts the write record ``{kind, start_ts}`` at ``commit_ts`` in family
``w`` (and a primary's index entry before it) **rides on** the compare-and-set of the lock
cell from ``Locked{start_ts}`` to ``Committed{commit_ts}``: it lands exactly when that
applies, so only while the cell still holds this transaction's lock.  MUST: a record is never
put blind where the store could make it conditional.  A blind put may land arbitrarily late
(a resolver or committer paused after it decided, its reader record lapsed): after the cell
was rolled forward by someone else, deleted by a later transaction and removed by GC as a
dead cell, such a put would leave a commit pointing at data GC deleted, and every later read
of the cell would fail (``test_a_stalled_resolver_cannot_revive_a_cell_gc_removed``).

On a store without conditional puts (HBase with only its Thrift-1 gateway) the order is:

1. blind-put the write record (and a primary's index entry first);
2. compare-and-set the lock cell.

Step 1 before step 2 keeps the invariant that a commit's write record exists before the
lock cell can forget it; a late blind put there lands under GC's delete marker ("every
version at or below"), which hides it until a major compaction drops both.  Either way the
steps are idempotent, so any number of clients may roll the same cell forward concurrently.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable, Mapping, Sequence

from percolator import failpoints
from percolator.errors import (
    StoreUnavailableError,
    TransactionAbortedError,
    UndeterminedCommitError,
)
from percolator.layout import WRITE, commit_index_qualifier
from percolator.protocol.cells import CellKey, fetch_cells, put_by_table
from percolator.protocol.lock import commit_lock, commit_locks
from percolator.records import Kind, LockCell, WriteRecord
from percolator.store.base import Put, Store

_U64 = struct.Struct(">Q")
log = logging.getLogger(__name__)


def write_record_puts(
    cells: Sequence[tuple[CellKey, Kind]], start_ts: int, commit_ts: int
) -> list[Put]:
    """The write-record puts for committing ``start_ts``'s cells at ``commit_ts``."""
    return [
        Put(key.row, WRITE, key.qualifier, commit_ts, WriteRecord(kind, start_ts).encode())
        for key, kind in cells
    ]


def commit_index_put(key: CellKey, start_ts: int, commit_ts: int) -> Put:
    """The commit-index entry of a transaction's primary: ``start_ts -> commit_ts`` (layout:
    :func:`percolator.layout.commit_index_qualifier`).  With it a status check is one read
    of one version however long the primary's history has grown since (protocol/resolve.py).

    Written before the primary's write record (module docstring: MUST), and by a prewrite
    that re-puts a missing record of the previous commit (it does not know whether that cell
    was a primary, so it writes the entry anyway: one small cell, collected by GC)."""
    return Put(
        key.row, WRITE, commit_index_qualifier(key.qualifier), start_ts, _U64.pack(commit_ts)
    )


def record_puts(
    store: Store,
    primary: CellKey | None,
    cells: Sequence[tuple[CellKey, Kind]],
    start_ts: int,
    commit_ts: int,
) -> dict[str, list[Put]]:
    """The puts, by table, of the write records of ``start_ts``'s ``cells`` at
    ``commit_ts`` and of the commit-index entry of ``primary`` (``None``: no primary among
    the cells).  On a store whose put calls are atomic the entry is among them (first);
    otherwise the caller must have stored it already, in a put of its own (module
    docstring: MUST), as :func:`put_commit_records` does."""
    by_table: dict[str, list[Put]] = {}
    if primary is not None and store.put_is_atomic:
        by_table[primary.table] = [commit_index_put(primary, start_ts, commit_ts)]
    cells_by_table: dict[str, list[tuple[CellKey, Kind]]] = {}
    for key, kind in cells:
        cells_by_table.setdefault(key.table, []).append((key, kind))
    for table, table_cells in cells_by_table.items():
        by_table.setdefault(table, []).extend(write_record_puts(table_cells, start_ts, commit_ts))
    return by_table


def primary_commit_puts(
    store: Store, primary: CellKey, kind: Kind, start_ts: int, commit_ts: int
) -> tuple[Put, ...]:
    """The puts that ride on the commit point (:func:`commit_primary`'s ``then_put``): the
    primary's commit-index entry and write record where the store has conditional puts,
    nothing elsewhere.  Both are in the primary's row, and land atomically with its
    ``Committed{commit_ts}`` or not at all, so the index entry never trails the record
    (module docstring: MUST)."""
    if not store.conditional_puts:
        return ()
    return (
        commit_index_put(primary, start_ts, commit_ts),
        *write_record_puts([(primary, kind)], start_ts, commit_ts),
    )


def put_index_entry(store: Store, primary: CellKey, start_ts: int, commit_ts: int) -> None:
    """Store ``primary``'s commit-index entry in a put of its own, unless the store's put
    calls are atomic (then :func:`record_puts` carries it with the records)."""
    if not store.put_is_atomic:
        store.put(primary.table, [commit_index_put(primary, start_ts, commit_ts)])


def put_commit_records(
    store: Store,
    primary: CellKey | None,
    cells: Sequence[tuple[CellKey, Kind]],
    start_ts: int,
    commit_ts: int,
) -> None:
    """Store the write records of ``start_ts``'s ``cells`` at ``commit_ts``, and the
    commit-index entry of ``primary`` (``None``: no primary among the cells) first or with
    them (:func:`record_puts`).  Idempotent; call only once the transaction is known to be
    committed."""
    if primary is not None:
        put_index_entry(store, primary, start_ts, commit_ts)
    put_by_table(store, record_puts(store, primary, cells, start_ts, commit_ts))


def commit_primary(
    store: Store,
    primary: CellKey,
    start_ts: int,
    commit_ts: int,
    lock_bytes: bytes,
    *,
    then_put: tuple[Put, ...] = (),
    on_committed: Callable[[], None] | None = None,
    on_undetermined: Callable[[], None] | None = None,
) -> None:
    """The commit point: compare-and-set ``primary`` from ``lock_bytes`` (the exact bytes of
    ``start_ts``'s lock there) to ``Committed{commit_ts}``, with ``then_put``
    (:func:`primary_commit_puts`) landing in the same atomic step.

    Returns once the transaction is committed.  ``on_committed`` is called the moment the
    compare-and-set applied, before anything else can fail, so a caller interrupted right
    after still knows the transaction committed.  Raises TransactionAbortedError (the lock
    was rolled back by another client: nothing is committed) or UndeterminedCommitError (the
    outcome is unknown).  Failpoints ``commit.primary_cas`` (before the compare-and-set) and
    ``commit.primary_cas_applied`` (after it, whatever its result).

    Unknown means unknown, whatever broke: a store error, a bug, or an interrupt (Ctrl-C)
    while the compare-and-set was in flight may each have struck after the server applied it.
    Any Exception then becomes UndeterminedCommitError; an interrupt (KeyboardInterrupt,
    SystemExit) propagates as itself after ``on_undetermined`` told the caller."""
    applied: bool | None = None
    sent = False
    try:
        failpoints.failpoint("commit.primary_cas")
        sent = True
        applied = commit_lock(store, primary, lock_bytes, commit_ts, then_put)
        if applied and on_committed is not None:
            on_committed()
        failpoints.failpoint("commit.primary_cas_applied")
    except BaseException as exc:
        # A store error is unknown by definition (the failpoints simulate one before and
        # after the compare-and-set); anything else is unknown only while the call was out.
        unknown = isinstance(exc, StoreUnavailableError) or (sent and applied is None)
        if not unknown:
            raise  # the outcome is known: the caller decides
        if not isinstance(exc, Exception):
            if on_undetermined is not None:
                on_undetermined()
            raise
        raise UndeterminedCommitError(
            f"transaction {start_ts}: the commit of primary {primary} at {commit_ts} has an "
            f"unknown outcome ({type(exc).__name__}: {exc}); a later read shows whether it "
            "committed"
        ) from exc
    if not applied:
        raise TransactionAbortedError(
            f"transaction {start_ts} was rolled back by another client before its commit "
            f"point (primary {primary})"
        )


def commit_cell(
    store: Store,
    key: CellKey,
    start_ts: int,
    commit_ts: int,
    lock_bytes: bytes | None = None,
    *,
    write_record_done: bool = False,
) -> bool:
    """Roll ``start_ts``'s lock on ``key`` forward to ``commit_ts`` (a secondary, or any cell
    of a transaction known to be committed).

    ``lock_bytes``: the lock cell bytes the caller just read (saves a read); if they are
    stale, the cell is re-read.  Returns True if the cell now shows the commit (by this call
    or an earlier one), False if the cell holds no lock of ``start_ts`` and no commit of it
    (it was rolled back: a broken protocol, logged as an error).
    """
    for _ in range(100):
        if lock_bytes is None:
            raw = fetch_cells(store, [key], before=None, with_data=False)[key]
            lock_bytes = raw.lock_bytes
        cell = LockCell.decode(lock_bytes)
        if not cell.locked_by(start_ts) or lock_bytes is None:
            # Already rolled forward (by us or a resolver), possibly overwritten since by later
            # commits.  A rollback of a committed transaction's cell cannot happen (resolvers
            # decide from the primary), so only an explicit rollback marker means "no".
            if cell.rolled_back != start_ts:
                return True
            # Never expected: said loudly, because the transaction is no longer all-or-nothing.
            log.error(
                "transaction %d committed at %d, but its cell %s was rolled back: atomicity "
                "is broken (a protocol bug; please report it)",
                start_ts,
                commit_ts,
                key,
                extra={"start_ts": start_ts, "commit_ts": commit_ts},
            )
            return False
        riders: tuple[Put, ...] = ()
        if not write_record_done:
            lock = cell.lock
            assert lock is not None
            # Rolling the primary itself forward (a resolver that read its lock before the
            # commit point): its index entry must precede its record (module docstring).
            is_primary = lock.is_primary_of(key.table, key.row, key.column)
            if store.conditional_puts:  # they land with the compare-and-set or not at all
                riders = (
                    primary_commit_puts(store, key, lock.kind, start_ts, commit_ts)
                    if is_primary
                    else tuple(write_record_puts([(key, lock.kind)], start_ts, commit_ts))
                )
            else:
                put_commit_records(
                    store, key if is_primary else None, [(key, lock.kind)], start_ts, commit_ts
                )
                write_record_done = True
        if commit_lock(store, key, lock_bytes, commit_ts, riders):
            return True
        lock_bytes = None  # changed under us (another resolver): re-read and re-check
    raise RuntimeError(f"roll-forward of {key} did not settle after 100 attempts")


def commit_secondaries(
    store: Store,
    locked: Sequence[tuple[CellKey, bytes | None]],
    start_ts: int,
    commit_ts: int,
    records: Mapping[str, Sequence[Put]] | None = None,
) -> list[bool]:
    """:func:`commit_cell` for many cells: the cells whose lock bytes are known are
    compare-and-set together (one store call per table); a cell that changed since, or whose
    outcome is unknown, or whose bytes are not known is then rolled forward on its own
    (re-read first).  Results as :func:`commit_cell`'s, in order.  Idempotent, like
    :func:`commit_cell`; a re-sent compare-and-set expects the exact bytes of ``start_ts``'s
    lock, so at most one of two copies applies.

    ``records`` (by table, from :func:`record_puts`): the cells' write records.  Where the
    store has conditional puts, a cell's record rides on its compare-and-set
    (:func:`~percolator.protocol.lock.commit_locks`) and lands exactly when it applies; a
    cell settled on its own carries its record the same way (:func:`commit_cell`), so no
    record of a cell is put blind (module docstring, MUST).  Elsewhere the records go in the
    same store calls, in no order relative to the compare-and-sets: a secondary's
    ``Committed{commit_ts}`` carries the commit by itself, and its record is only needed
    before a later prewrite replaces that state, which puts any missing record first (design
    notes §3, MUST); if that call fails they are put again (idempotent), after the
    secondaries were settled.  Puts of no cell in ``locked`` go loose in either case."""
    known = [(key, lock_bytes) for key, lock_bytes in locked if lock_bytes]
    riding = store.conditional_puts
    batch = records or {}
    loose: Mapping[str, Sequence[Put]] = batch
    if riding:
        cells = {(key.table, key.row, key.qualifier) for key, _ in locked}
        # A record of a cell whose bytes are unknown rides on that cell's own roll-forward.
        unknown = cells - {(key.table, key.row, key.qualifier) for key, _ in known}
        batch = {
            table: [p for p in puts if (table, p.row, p.qualifier) not in unknown]
            for table, puts in batch.items()
        }
        loose = {
            table: [p for p in puts if (table, p.row, p.qualifier) not in cells]
            for table, puts in batch.items()
        }
    records_lost = False
    try:
        applied = commit_locks(store, known, commit_ts, batch)
    except StoreUnavailableError:
        applied = [False] * len(known)  # unknown: settled below from a fresh read
        records_lost = True
    committed = {key for (key, _), ok in zip(known, applied, strict=True) if ok}
    results = [
        key in committed
        or commit_cell(store, key, start_ts, commit_ts, write_record_done=not riding)
        for key, _ in locked
    ]
    if records_lost:
        put_by_table(store, loose)  # skips tables without puts
    return results

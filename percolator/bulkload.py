"""Bulk load: write the committed state of cells directly, behind a table fence.

A bulk load is **one transaction written without the two-phase commit**: every cell it
writes gets its data at the load's ``start_ts``, its write record ``PUT@start_ts`` at the
load's ``commit_ts`` and its lock cell set to ``Committed{commit_ts, start_ts, PUT}`` (plus,
for observed columns, a notification at ``commit_ts``), all with blind batched puts.  Both
timestamps are drawn from the oracle once, when the load begins, and kept in the load's
record, so every writer of the load (a retried Spark task, a re-run of a killed job) puts
**identical cells at identical versions**: re-putting is idempotent, and every cell ends
with exactly one version per family.

``start_ts`` is drawn before the fence goes up, ``commit_ts`` only **after** the fence is
visible: the fence is first written with ``commit_ts`` 0 ("not drawn yet"), then a second
compare-and-set fills it in (whoever finds our load id with ``commit_ts`` 0 - this run, or
a re-run taking it over - draws it).  Low watermarks rely on it (percolator/watermark.py,
"Bulk loads"): a computation that found no fence on a table after taking its fresh
timestamp ``now`` knows every later load of it commits above ``now``; one that finds the
fence holds its watermark at ``commit_ts`` (at ``start_ts`` while it is 0).

The fence (table state in the meta table)
-----------------------------------------
Row ``b"tables/" + table`` of the meta table (its format: :mod:`percolator.tablestate`),
written only by compare-and-set.  A table without this row is an ordinary table.
``fingerprint`` (absent in records written before it existed, and when the loader gave
none) identifies what the load writes - the Spark job records its input's row count and
digest, the ones its transactional mode keeps in the job record - see "Same load id,
other input" below.

* A load begins only on a table that does not exist or holds no lock cell (is empty), by
  setting the state to ``loading`` (compare-and-set from what it read).  The row is written
  **before** the table is created, so a client that finds the table created by the load
  also finds it ``loading``.
* While a table is ``loading``, clients refuse every transactional read and write of it
  with :class:`TableLoadingError` (retryable: it succeeds after the publish); observers
  therefore back off on its notifications instead of running them early.
* **Publish** flips ``loading`` to ``ready`` with compare-and-set: readers see none of the
  load (refused) or all of it.
* **Clients re-check.**  A client trusts what it read of a table's state for at most
  :data:`TABLE_STATE_REFRESH_MS` (percolator/client.py): each read or write of a table, and
  each commit after its prewrite, re-reads the state row when the client's reading of it
  started longer ago.  ``begin_load`` waits that long (plus a margin) after it saw its
  fence in place before it draws ``commit_ts``, and then checks that the table still holds
  no lock cell.  So a reader whose ``read_ts`` is above ``commit_ts`` (the only readers the
  load's cells are visible to) checked the state after the fence was up and is refused,
  even if it used the table before the load (an existing empty table, or a table dropped
  and loaded again under its name); and a writer that passed its check after prewriting
  placed its locks before that lock check, which then refuses the load, while one that
  checks later is refused itself, before its commit point.
* A table that existed before the load (``created`` is ``no``, or ``pending`` when a run
  died before creating it and someone else created it) may have been cached by a client
  that could still write it during the load.  Its publish therefore first **verifies** the
  table: every lock cell must hold exactly the load's committed state, every cell's
  newest write record must be the load's, and each must have the other beside it;
  otherwise the publish fails naming the cell and the table stays fenced (nothing is
  silently overwritten).
* **Writers stop before the lease ends.**  Each writer of the load (a Spark task) checks,
  before each batch and at most every :meth:`LeaseCheck.interval_ms`, that the state still
  names its load (id and timestamps) as ``loading`` with at least a quarter of the lease
  left by its own clock (:class:`LeaseCheck`), and stops with :class:`BulkLoadError`
  otherwise.  A loaded table is dropped only once its lease has expired
  (:func:`check_droppable`; the drop then holds the name, ``dropping``, from the exact
  state it checked, so no load begins or takes over until the drop is done:
  :func:`fence_for_drop`), and a loader that gives up shortens its lease to that quarter
  once it stopped renewing it (:func:`release_lease`); a loader renews only the lease of
  its own incarnation of the load (same ``start_ts``).  So a writer that outlived its load
  (paused, cut off, or left running after its job failed) cannot put cells of the old load
  into the table that replaced it - unless a single store call of it stays in flight, or
  it stays paused between its check and its put, for longer than a quarter of the lease
  less the check interval (15 s less 1 s with the default lease): what a lease without a
  fencing token in the store can promise.
* The **lease** (``lease_expires_ms``) is renewed by the running loader.  A re-run with the
  same load id takes the load over at once (it writes the same cells at the same
  versions, so two writers of one load never disagree); another load id is refused while
  the lease runs and afterwards too (the table holds part of the other load: re-run it, or
  drop the table).  A re-run after the publish (``ready`` with the same load id) writes
  nothing.
* **Same load id, other input.**  A load id may name the input by where it is rather than
  by what it holds (the Spark job's default id hashes the input *paths*).  A take-over that
  wrote other rows than the load began with would publish rows of both inputs, and a
  "published before" answer would be false; so a run whose ``fingerprint`` differs from
  the recorded one is refused (:class:`BulkLoadError`, nothing changed) in both cases.

Garbage collection
------------------
While a load runs, its ``start_ts`` is held by a named safe-point reservation
(``bulkload:<table>:<load id>``, :func:`percolator.readers.reserve_safe_point`), valid
until the lease expires, so the safe point stays below the load.  After the publish
GC sees the loaded cells as one ordinary committed transaction at ``commit_ts``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, replace

from percolator.errors import ConfigError, TableExistsError, TransactionError
from percolator.layout import (
    DATA,
    LOCK,
    TABLE_FAMILIES,
    WRITE,
    check_table_name,
    ensure_meta_table,
)
from percolator.notifications import notification_put
from percolator.readers import release_safe_point, reserve_safe_point
from percolator.records import Kind, LockCell, RecordError, WriteRecord
from percolator.store.base import Put, ScanOptions, Store, Version
from percolator.tablestate import (
    DROPPING,
    LOADING,
    ORDINARY,
    READY,
    LoadState,
    compare_and_set_state,
    read_state,
)
from percolator.timestamps import describe, now_ms, physical_ms

DEFAULT_LEASE_MS = 60_000
#: how long a client trusts what it read of a table's state (module docstring, "Clients
#: re-check"); a load waits this long, plus the margin, between its fence and commit_ts
TABLE_STATE_REFRESH_MS = 100
_REFRESH_MARGIN_MS = 50


class TableLoadingError(TransactionError):
    """The table is being bulk-loaded: transactions may neither read nor write it until the
    load is published.  Retryable: the same work succeeds after the publish."""

    retryable = True

    def __init__(self, table: str, state: LoadState) -> None:
        super().__init__(
            f"table {table!r} is being bulk-loaded (load {state.load_id!r}): transactions "
            "cannot read or write it until the load is published"
        )
        self.table = table
        self.load_id = state.load_id


class BulkLoadError(ConfigError):
    """A bulk load cannot begin or be published (the message says why); nothing of the
    table's earlier contents was changed."""


def check_usable(store: Store, table: str) -> None:
    """Raise :class:`TableLoadingError` if ``table`` is being loaded (one read).  A client
    trusts the answer for :data:`TABLE_STATE_REFRESH_MS` only (module docstring, "Clients
    re-check")."""
    state, _ = read_state(store, table)
    if state is not None and state.state == LOADING:
        raise TableLoadingError(table, state)


def _has_lock_cells(store: Store, table: str) -> bool:
    return any(True for _ in store.scan(table, LOCK, ScanOptions(batch_size=1, limit=1)))


def reservation_name(table: str, load_id: str) -> str:
    """The load's named safe-point reservation (percolator/readers.py; status lists it)."""
    return f"bulkload:{table}:{load_id}".replace("/", "%2F")


def _reserve(store: Store, table: str, state: LoadState) -> None:
    """Hold the GC safe point below ``start_ts`` until the lease expires."""
    ttl_ms = max(1, state.lease_expires_ms - now_ms())
    reserve_safe_point(store, reservation_name(table, state.load_id), state.start_ts, ttl_ms)


@dataclass(frozen=True)
class Begun:
    """The result of :func:`begin_load`: the load's state; ``published`` if this load id
    was published earlier (a re-run after success: write nothing)."""

    state: LoadState
    published: bool


def begin_load(
    store: Store,
    timestamp: Callable[[], int],
    table: str,
    load_id: str,
    *,
    lease_ms: int = DEFAULT_LEASE_MS,
    fingerprint: str = "",
) -> Begun:
    """Fence ``table`` for load ``load_id`` (or take over / recognise that load).

    Refuses (:class:`BulkLoadError`, nothing changed) a table that holds cells, or one that
    another load fences, or load ``load_id`` recorded with another ``fingerprint`` (what
    the load writes; "" does not say, and is not checked).  ``timestamp`` draws oracle
    timestamps (twice, for a new load: ``commit_ts`` after the fence is visible, see the
    module docstring)."""
    check_table_name(table)
    ensure_meta_table(store)
    for _ in range(20):
        state, raw = read_state(store, table)
        if state is not None and state.load_id == load_id:
            _check_same_input(table, state, fingerprint)
            if state.state == READY:
                return Begun(state, published=True)
            renewed = replace(
                state,
                lease_expires_ms=now_ms() + lease_ms,
                # An unknown fingerprint is adopted: later re-runs are checked against it.
                fingerprint=state.fingerprint or fingerprint,
            )
            if renewed.commit_ts == 0:
                # Fenced (we read the fence) but ``commit_ts`` not drawn yet.  Every client
                # re-reads a table's state at this interval ("Clients re-check"): wait it
                # out, so that every reader above commit_ts and every writer that commits
                # into the table from now on has seen the fence...
                time.sleep((TABLE_STATE_REFRESH_MS + _REFRESH_MARGIN_MS) / 1000)
                # ...and a writer that checked before it has its locks in place by now.
                if store.table_exists(table) and _has_lock_cells(store, table):
                    # An ordinary table again (we hold the fence: nobody else writes it).
                    compare_and_set_state(store, table, raw, ORDINARY)
                    raise BulkLoadError(
                        f"table {table!r} was written while the load began; refused"
                    )
                renewed = replace(renewed, commit_ts=timestamp())
            if not compare_and_set_state(store, table, raw, renewed):
                continue
            _reserve(store, table, renewed)
            return Begun(_ensure_table(store, table, renewed), published=False)
        if state is not None and state.state == DROPPING:
            raise BulkLoadError(
                f"table {table!r} is being dropped (or a drop of it died: drop it again); "
                "load it once the drop finished"
            )
        if state is not None and state.state == LOADING:
            lease = (
                "its lease is live"
                if state.lease_expires_ms > now_ms()
                else "its loader is gone (lease expired): re-run that load to finish it, or drop "
                "the table"
            )
            raise BulkLoadError(
                f"table {table!r} is being bulk-loaded by load {state.load_id!r}; {lease}"
            )
        existed = store.table_exists(table)
        if existed:
            families = {f.name for f in store.table_families(table)}
            if families != {f.name for f in TABLE_FAMILIES}:
                raise BulkLoadError(
                    f"table {table!r} exists but is not an engine table (families "
                    f"{sorted(families)})"
                )
        if existed and _has_lock_cells(store, table):
            raise BulkLoadError(
                f"table {table!r} already holds cells: a bulk load only fills a new or empty "
                "table (use the transactional mode for live tables)"
            )
        start_ts = timestamp()
        # ``commit_ts`` 0: drawn once the fence is visible (the next pass of the loop).
        new = LoadState(
            LOADING,
            load_id,
            start_ts,
            0,
            now_ms() + lease_ms,
            "no" if existed else "pending",
            fingerprint,
        )
        if not compare_and_set_state(store, table, raw, new):
            continue
        # Checked again now that the fence is up: a transaction that wrote between the
        # first check and the compare-and-set is caught here.
        if existed and _has_lock_cells(store, table):
            restore_state(store, table, new.encode(), raw)
            raise BulkLoadError(f"table {table!r} was written while the load began; refused")
        # The next pass finds our load id fenced and draws ``commit_ts`` (see above).
    raise BulkLoadError(f"the state of table {table!r} kept changing; try again")


def _check_same_input(table: str, state: LoadState, fingerprint: str) -> None:
    """Refuse to take over (or call published) load ``state`` for a run that writes
    something else: the load id names the input, not its content (see the module
    docstring).

    A recorded fingerprint that is unknown (a record written before fingerprints existed)
    is accepted, as it was then: refusing would leave a load begun by the earlier version
    impossible to finish except by dropping the table, and accepting is no worse than
    that version; the take-over records the new fingerprint, so the next re-run is
    checked.  A caller that gives none is not checked (it has nothing to compare)."""
    if not state.fingerprint or not fingerprint or state.fingerprint == fingerprint:
        return
    ran = f"bulk load {state.load_id!r} of table {table!r} ran before on different input"
    differ = f"({state.fingerprint}; now {fingerprint})"
    if state.state == READY:
        raise BulkLoadError(
            f"{ran} {differ} and was published: the table holds that input; nothing written. "
            "To load this input instead, drop the table and run the load again; to change "
            "rows of the live table, use the transactional mode"
        )
    raise BulkLoadError(
        f"{ran} {differ} and did not finish: the table holds part of that input and stays "
        "fenced; taking the load over would publish rows of both. Drop the table (which "
        "forgets the load) and run this load again, or finish the earlier load on its "
        "original input (another load id is refused while the table is fenced)"
    )


def restore_state(store: Store, table: str, written: bytes, previous: bytes | None) -> None:
    """Put back the state ``previous`` (None: no state row, written as :data:`ORDINARY`)
    that a fence (a load's, or a drop's) replaced by ``written``, which never took effect.
    Best effort: a no-op if the state moved on."""
    compare_and_set_state(store, table, written, previous or ORDINARY)


def _ensure_table(store: Store, table: str, state: LoadState) -> LoadState:
    """Create the table of a ``pending`` load and record whether this load created it."""
    if state.created != "pending":
        return state
    try:
        store.create_table(table, TABLE_FAMILIES)
        created = "yes"
    except TableExistsError:
        # Created by someone else after the fence went up (they see ``loading``), or by
        # an earlier run of this load that died before recording it: verify at publish.
        created = "no"
    _, raw = read_state(store, table)
    new = replace(state, created=created)
    if not compare_and_set_state(store, table, raw, new):
        raise BulkLoadError(f"the state of table {table!r} changed under the load; re-run it")
    return new


#: how long a drop holds a table's name (``dropping``) against another dropper
DROP_HOLD_MS = 60_000


@dataclass(frozen=True)
class DropFence:
    """What :func:`fence_for_drop` replaced and wrote: the table's state before the drop
    (exact bytes, None: no state row) and the ``dropping`` record now in its place."""

    previous: bytes | None
    dropping: bytes


def fence_for_drop(store: Store, table: str) -> DropFence:
    """Hold ``table``'s name for a drop: replace its exact state by ``dropping`` (one
    compare-and-set), after :func:`check_droppable`'s checks on that very state.  From then
    on no load begins or takes over the table and every writer of a load fails its lease
    check, so nothing written after the drop belongs to a load of the old table.  Raises
    BulkLoadError if a load holds the table, another drop holds the name, or the state kept
    changing."""
    for _ in range(20):
        state, raw = read_state(store, table)
        _refuse_drop(table, state)
        dropping = LoadState(DROPPING, "", 0, 0, now_ms() + DROP_HOLD_MS, "no").encode()
        if compare_and_set_state(store, table, raw, dropping):
            return DropFence(raw, dropping)
    raise BulkLoadError(f"the state of table {table!r} kept changing; try the drop again")


def clear_state(store: Store, table: str, fence: DropFence) -> None:
    """After the drop: the name is an ordinary table's again (``ready`` with no load; a
    delete would mask later compare-and-sets of the row).  Only from the drop's own
    ``dropping`` record: nothing else may have replaced it."""
    if not compare_and_set_state(store, table, fence.dropping, ORDINARY):
        state, _ = read_state(store, table)
        raise BulkLoadError(
            f"table {table!r} was dropped, but its state changed under the drop (now {state}); "
            "drop it again"
        )


def writer_margin_ms(lease_ms: int) -> int:
    """How much of a load's lease its writers must see left to write: a quarter of it."""
    return max(1, lease_ms // 4)


class LeaseCheck:
    """Keeps one writer of a load from writing once the load may have lost its table
    (module docstring, "Writers stop before the lease ends").

    :meth:`check` before each batch: at most every :attr:`interval_ms` it reads the table's
    state (one read) and raises :class:`BulkLoadError` unless the state is ``loading`` for
    this very load (same id, ``start_ts`` and ``commit_ts``) with at least
    :func:`writer_margin_ms` of the lease left.  Not thread-safe: one per writer."""

    def __init__(self, store: Store, table: str, state: LoadState, lease_ms: int) -> None:
        self._store = store
        self._table = table
        self._state = state
        self.margin_ms = writer_margin_ms(lease_ms)
        self.interval_ms = max(1, min(1000, lease_ms // 20))
        self._checked_ms: float | None = None

    def check(self) -> None:
        now = time.monotonic() * 1000
        if self._checked_ms is not None and now - self._checked_ms < self.interval_ms:
            return
        current, _ = read_state(self._store, self._table)
        ours = self._state
        if (
            current is None
            or not current.loading
            or (current.load_id, current.start_ts, current.commit_ts)
            != (ours.load_id, ours.start_ts, ours.commit_ts)
        ):
            what = (
                "an ordinary table"
                if current is None or not current.load_id
                else (
                    f"{current.state} by load {current.load_id!r} begun at "
                    f"{describe(current.start_ts)}"
                )
            )
            raise BulkLoadError(
                f"load {ours.load_id!r} (begun at {describe(ours.start_ts)}) no longer holds "
                f"table {self._table!r}, now {what}: this writer stops before writing more"
            )
        left_ms = current.lease_expires_ms - now_ms()
        if left_ms < self.margin_ms:
            raise BulkLoadError(
                f"the lease of load {ours.load_id!r} on table {self._table!r} runs out in "
                f"{left_ms / 1000:.1f} s (its loader stopped renewing it): this writer stops "
                "before writing more; re-run the load to finish it"
            )
        self._checked_ms = now


def check_droppable(store: Store, table: str) -> None:
    """Raise :class:`BulkLoadError` if ``table`` is fenced by a load whose lease has not
    expired: its writers may still be putting cells, which would land in whatever table
    takes the name next (module docstring, "Writers stop before the lease ends")."""
    _refuse_drop(table, read_state(store, table)[0])


def _refuse_drop(table: str, state: LoadState | None) -> None:
    if state is None:
        return
    left_ms = state.lease_expires_ms - now_ms()
    if state.loading and left_ms > 0:
        raise BulkLoadError(
            f"cannot drop table {table!r}: load {state.load_id!r} holds it and may still be "
            f"writing (its lease runs {left_ms / 1000:.1f} s more). Stop the load, and drop "
            "the table once the lease has expired"
        )
    if state.state == DROPPING and left_ms > 0:
        raise BulkLoadError(
            f"cannot drop table {table!r}: another client is dropping it (for up to "
            f"{left_ms / 1000:.0f} s more)"
        )


def release_lease(
    store: Store, table: str, state: LoadState, lease_ms: int = DEFAULT_LEASE_MS
) -> None:
    """A loader giving up (its job failed): shorten the lease to the writers' margin, so
    that they stop at their next check and the table can be dropped soon after.  The load
    stays fenced; a re-run of it takes it over as before.  Best effort: a no-op if the
    state moved on."""
    for _ in range(20):
        current, raw = read_state(store, table)
        if (
            current is None
            or not current.loading
            or (current.load_id, current.start_ts) != (state.load_id, state.start_ts)
        ):
            return
        # Just under the margin: the next check of a writer (on a clock in step) finds
        # too little.
        soon = now_ms() + writer_margin_ms(lease_ms) - 1
        if current.lease_expires_ms <= soon:
            return
        if compare_and_set_state(store, table, raw, replace(current, lease_expires_ms=soon)):
            return


def renew_lease(
    store: Store,
    table: str,
    load_id: str,
    lease_ms: int = DEFAULT_LEASE_MS,
    *,
    start_ts: int | None = None,
) -> None:
    """Extend the lease (and the GC reservation) of a running load; a no-op after the
    publish.  Raises BulkLoadError if another load took the table.  ``start_ts``: the
    load's, as begun; given, a load of the same id begun again since (the table dropped
    and loaded anew) is another load, whose lease this loader must not extend."""
    state, raw = read_state(store, table)
    if (
        state is None
        or state.load_id != load_id
        or (start_ts is not None and state.start_ts != start_ts)
    ):
        raise BulkLoadError(f"load {load_id!r} lost table {table!r}")
    if state.state != LOADING:
        return
    renewed = replace(state, lease_expires_ms=now_ms() + lease_ms)
    if compare_and_set_state(store, table, raw, renewed):
        _reserve(store, table, renewed)


def cell_puts(
    state: LoadState, row: bytes, cells: Iterable[tuple[bytes, bytes]], notify: Collection[bytes]
) -> list[Put]:
    """The puts of one loaded row: per cell its data, write record, committed lock cell and,
    for qualifiers in ``notify``, a notification.  Identical for every call with the same
    arguments (idempotent re-puts).  :class:`CellWriter` does the same for many rows."""
    return CellWriter(state, notify).puts(row, cells)


class CellWriter:
    """Builds the puts of loaded rows (the encodings are computed once per load)."""

    def __init__(self, state: LoadState, notify: Collection[bytes]) -> None:
        self._start_ts = state.start_ts
        self._commit_ts = state.commit_ts
        self._write = WriteRecord(Kind.PUT, state.start_ts).encode()
        self._lock = state.committed_lock()
        # Lock cells carry store time (milliseconds, below every hybrid timestamp: readers
        # read them with ``before=read_ts + 1``); a later compare-and-set stamps at least this.
        self._lock_version = physical_ms(state.commit_ts)
        self._notify = frozenset(notify)

    def puts(self, row: bytes, cells: Iterable[tuple[bytes, bytes]]) -> list[Put]:
        out: list[Put] = []
        for qualifier, value in cells:
            out.append(Put(row, DATA, qualifier, self._start_ts, value))
            out.append(Put(row, WRITE, qualifier, self._commit_ts, self._write))
            out.append(Put(row, LOCK, qualifier, self._lock_version, self._lock))
            if qualifier in self._notify:
                out.append(notification_put(row, qualifier, self._commit_ts))
        return out


def verify_table(store: Store, table: str, state: LoadState) -> None:
    """BulkLoadError naming the first cell not written by this load alone, or written by it
    in part (a write record without its lock cell, or a lock cell without its record).

    A write record needs its lock cell: a prewrite takes a cell with no lock cell for one
    never written and compare-and-sets it from absent, so a loaded cell whose lock cell is
    missing would let a transaction that began before the load overwrite it unchecked.
    (The lock cell's put is at store time as this host sees it; an older delete marker of
    the table's garbage collection, stamped by a store clock ahead of ours, would hide it.)
    And a lock cell of the load names a commit that readers take as visible, so one without
    its write record is a put of the load applied in part.  The two families are scanned
    side by side in row order: memory does not grow with the table."""
    lock = state.committed_lock()
    write = WriteRecord(Kind.PUT, state.start_ts).encode()
    refused = (
        f"load {state.load_id!r} is not published and table {table!r} stays fenced: drop it "
        "and load again"
    )

    def check_locks(row: bytes, locked: dict[bytes, Version], written: Collection[bytes]) -> None:
        for qualifier, (_, value) in locked.items():
            if value != lock:
                raise BulkLoadError(
                    f"cell {row!r}/{qualifier!r} holds a lock cell that is not the load's "
                    f"committed state ({_describe_lock(value)}): a transaction wrote it "
                    f"during the load; {refused}"
                )
            if qualifier not in written:
                raise BulkLoadError(
                    f"cell {row!r}/{qualifier!r} has the load's lock cell but no write record "
                    f"(a put of the load applied in part); {refused}"
                )

    locks = store.scan(table, LOCK, ScanOptions(batch_size=1000))
    writes = store.scan(table, WRITE, ScanOptions(batch_size=1000))
    lock_row: tuple[bytes, dict[bytes, Version]] | None = next(locks, None)
    for row, cells in writes:
        while lock_row is not None and lock_row[0] < row:
            check_locks(lock_row[0], lock_row[1], frozenset())
            lock_row = next(locks, None)
        locked: dict[bytes, Version] = {}
        if lock_row is not None and lock_row[0] == row:
            locked = lock_row[1]
            lock_row = next(locks, None)
        check_locks(row, locked, cells.keys())
        for qualifier, (commit_ts, value) in cells.items():
            if commit_ts != state.commit_ts or value != write:
                raise BulkLoadError(
                    f"cell {row!r}/{qualifier!r} has a commit at {describe(commit_ts)} "
                    f"that is not load {state.load_id!r}'s; {refused}"
                )
            if qualifier not in locked:
                raise BulkLoadError(
                    f"cell {row!r}/{qualifier!r} has the commit of load "
                    f"{state.load_id!r} but no lock cell (its put is hidden, if this "
                    "host's clock is behind the store's, or was applied in part); "
                    f"{refused}"
                )
    while lock_row is not None:
        check_locks(lock_row[0], lock_row[1], frozenset())
        lock_row = next(locks, None)


def _describe_lock(value: bytes) -> str:
    try:
        return str(LockCell.decode(value))
    except RecordError:
        return f"an unreadable lock cell {value[:40]!r}"


def publish_load(
    store: Store, table: str, load_id: str, *, start_ts: int | None = None
) -> LoadState:
    """Make the load visible: verify a table the load did not create, then compare-and-set
    ``loading`` to ``ready`` and drop the GC reservation.  Idempotent (a published load
    returns its state).

    ``start_ts``: the load's, as :func:`begin_load` returned it.  Given, a load of the same
    id begun again since (the table dropped and loaded anew while this loader was away) is
    refused rather than published before its writers finished."""
    for _ in range(20):
        state, raw = read_state(store, table)
        if state is None or state.load_id != load_id:
            raise BulkLoadError(f"load {load_id!r} does not hold table {table!r}")
        if start_ts is not None and state.start_ts != start_ts:
            raise BulkLoadError(
                f"load {load_id!r} of table {table!r} was begun again since this loader began "
                f"it (at {describe(start_ts)}, now at {describe(state.start_ts)}): not "
                "published by this loader"
            )
        if state.state == READY:
            break
        if state.commit_ts == 0:
            raise BulkLoadError(f"load {load_id!r} of table {table!r} has not begun: re-run it")
        if state.created != "yes":
            verify_table(store, table, state)
        if compare_and_set_state(store, table, raw, replace(state, state=READY)):
            state = replace(state, state=READY)
            break
    else:
        raise BulkLoadError(f"the state of table {table!r} kept changing; try again")
    with contextlib.suppress(Exception):  # expires with the lease anyway
        release_safe_point(store, reservation_name(table, load_id))
    return state

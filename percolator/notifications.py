"""Notifications: the notify family, the observed-column registry and the acks (design notes
§2 and §4).

This module is the only code that reads or writes the notify family
(:data:`percolator.layout.NOTIFY`), the observed-column registrations in the meta table and
the ack cells; the committer, the observers and the operator commands go through it.

Notify family
-------------
A *notification* is a version of the notify cell of an observed ``(table, row, column)``:
a hint that the column changed, its version the ``commit_ts`` of the change (or the fresh
timestamp of a trigger).  The value carries nothing.

* **put** (:func:`put_notifications`): the commit puts its notifications at ``commit_ts``
  **before its commit point**.  Written at ``start_ts`` or during prewrite, a notification
  could be deleted by an observer's cleanup while a long transaction that started earlier is
  still in flight (a delete marker masks older versions written later): lost.  Written
  after the commit point, a crash in between loses it.  Before the commit point the worst
  case is a spurious notification of an aborted transaction, which the observer run skips.
* **value** (:func:`notify_value`): the row's 32-bit hash (CRC-32) as 8 lowercase hex
  digits, so that a scan can select the notifications of a range of row hashes in the store
  (:func:`hash_ranges_filter`, a value filter the HBase region server evaluates): that is
  how a worker that holds some key groups (percolator/observers/partition.py) reads only
  theirs.  Notifications written before the hash was stored hold ``b"1"``; every hash
  filter selects them too, and the scanner's caller drops the ones that are not its own.
* **scan** (:func:`scan_notifications`, :func:`pending`): only the notify family is read
  (Percolator's separate locality group), so finding dirty cells costs in proportion to the
  dirty cells, not to the table.  A scan sees the newest version of each dirty cell: several
  changes between two runs fold into one run.
* **cleanup** (:func:`delete_notifications`): after an observer run committed (or found the
  change already acknowledged) at start timestamp ``O``, delete the versions ``<= T``, where
  ``T`` is the newest version the scanner saw - never newer.  Every write committed after
  ``O`` has ``commit_ts > O > T``, so its notification survives.  Idempotent.

Observed-column registry
------------------------
Format (version 1) of the observed set in the meta table:

=========  ================================================================================
row        ``b"observed/" + table + b"/" + column`` (UTF-8; table names have no ``/``)
family     ``META_FAMILY``, qualifier :data:`OBSERVED_QUALIFIER`
value      JSON ``{"v": 1, "observer": NAME, "weak": BOOL}``, optionally with
           ``"outputs": [[TABLE, COLUMN], ...]`` (what the observer writes, for cascading
           watermarks, percolator/watermark.py; absent: unknown), or
           :data:`OBSERVED_TOMBSTONE` once the observer was unregistered; written only by
           compare-and-set
=========  ================================================================================

Guarantee: a commit that draws its ``commit_ts`` more than one refresh interval after a
registration became visible in the store notifies: it decides which cells to notify only
after drawing ``commit_ts``, from a cached set (:class:`ObservedColumns`) whose load started
at most one interval before (percolator/committer.py).  In particular every transaction that
*starts* that long after the registration notifies.  A commit that drew its ``commit_ts``
earlier placed all its locks before the registration's catch-up scanned
(observers/catchup.py), which notifies it.  ``percolator.observers.api.register_observers``
waits one interval before the catch-up, so every change is notified by one or the other.
The interval must be the same in every process: set ``PERCOLATOR_OBSERVED_REFRESH_MS``
everywhere or nowhere.

Acks
----
A strong observer's acknowledgement of ``column`` is an ordinary transactional cell in the
same row, under the reserved column :func:`ack_column` (``!ack/<observer>/<column>``),
holding the ``commit_ts`` of the change it covers (8 bytes big-endian, :func:`encode_ack`).
Two runs for the same change both write it, so they conflict like any other writers and at
most one commits.  Only an observer transaction
(:meth:`percolator.Client.observer_transaction`) may write it.
"""

from __future__ import annotations

import json
import os
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from percolator.concurrency import renew_after_fork
from percolator.errors import ConfigError
from percolator.layout import META_FAMILY, META_TABLE, NOTIFY, ack_column
from percolator.numerals import ascii_digits
from percolator.protocol.cells import CellKey, group_by_table
from percolator.store.base import Delete, Put, ScanOptions, Store

# --------------------------------------------------------------------------- notify family

#: The value of notify cells written before the row hash was stored (still read).
LEGACY_NOTIFY_VALUE = b"1"
#: Row hashes are 32-bit: every hash is below this.
HASH_SPACE = 1 << 32


def row_hash(row: bytes) -> int:
    """The 32-bit hash of ``row`` that key groups are cut from (stable across processes,
    platforms and versions: CRC-32)."""
    return zlib.crc32(row)


def _hash_bytes(hash_value: int) -> bytes:
    """A row hash as stored in notify cells: 8 lowercase hex digits (fixed width, so byte
    order is numeric order)."""
    return b"%08x" % hash_value


def notify_value(row: bytes) -> bytes:
    """The value of ``row``'s notify cells: its :func:`row_hash`, as :func:`_hash_bytes`."""
    return _hash_bytes(row_hash(row))


def hash_ranges_filter(ranges: Iterable[tuple[int, int]]) -> list[tuple[bytes, bytes | None]]:
    """The :attr:`ScanOptions.value_ranges` that select the notifications of rows whose
    hash lies in one of the half-open ``[low, high)`` ``ranges`` (``0 <= low < high <=
    HASH_SPACE``), plus every notification written before hashes were stored."""
    found: list[tuple[bytes, bytes | None]] = [
        (_hash_bytes(low), None if high >= HASH_SPACE else _hash_bytes(high))
        for low, high in ranges
        if low < high
    ]
    if found:
        found.append((LEGACY_NOTIFY_VALUE, LEGACY_NOTIFY_VALUE + b"\x00"))
    return found


@dataclass(frozen=True, order=True)
class Notification:
    """A dirty observed cell as a scan saw it; ``notify_ts`` is the newest notify version
    seen (the cleanup bound ``T``)."""

    table: str
    row: bytes
    column: str
    notify_ts: int

    @property
    def cell(self) -> tuple[str, bytes, str]:
        return (self.table, self.row, self.column)

    def __str__(self) -> str:
        return f"{self.table}/{self.row!r}/{self.column}@{self.notify_ts}"


def notification_put(row: bytes, qualifier: bytes, notify_ts: int) -> Put:
    """The notify cell of one user cell at ``notify_ts``, for a writer that batches it with
    other puts of the same rows (the bulk loader); everyone else calls
    :func:`put_notifications`."""
    return Put(row, NOTIFY, qualifier, notify_ts, notify_value(row))


def put_notifications(store: Store, keys: Iterable[CellKey], notify_ts: int) -> None:
    """Leave a notification at ``notify_ts`` on every cell of ``keys`` (one batched blind
    put per table; idempotent).

    The commit calls this with its ``commit_ts`` before its commit point (see the module
    docstring for why neither earlier nor later); a trigger with a fresh oracle timestamp."""
    for table, group in group_by_table(keys).items():
        store.put(table, [notification_put(k.row, k.qualifier, notify_ts) for k in group])


def scan_notifications(
    store: Store,
    table: str,
    columns: Iterable[str] | None = None,
    *,
    start: bytes = b"",
    stop: bytes | None = None,
    batch_size: int = 1000,
    limit: int | None = None,
    hash_ranges: Iterable[tuple[int, int]] | None = None,
) -> Iterator[tuple[bytes, list[Notification]]]:
    """The dirty cells of ``table`` in row order, one row at a time: ``(row, notifications
    of that row)`` with the newest notify version of each cell, ordered by column.

    Reads only the notify family, from ``start`` (inclusive) to ``stop`` (exclusive, None:
    the end), ``batch_size`` rows per store round trip, at most ``limit`` rows; ``columns``
    restricts it to those columns (None: every column).  ``hash_ranges`` (None: every row)
    keeps, in the store, the rows whose :func:`row_hash` lies in one of these half-open
    ranges, and the notifications written before hashes were stored, of any row (the
    caller checks those itself).  Not a snapshot across rows."""
    qualifiers = [c.encode("utf-8") for c in columns] if columns is not None else None
    options = ScanOptions(
        start=start,
        stop=stop,
        qualifiers=qualifiers,
        batch_size=batch_size,
        limit=limit,
        value_ranges=None if hash_ranges is None else hash_ranges_filter(hash_ranges),
    )
    for row, cells in store.scan(table, NOTIFY, options):
        found = [
            Notification(table, row, qualifier.decode("utf-8"), version)
            for qualifier, (version, _) in sorted(cells.items())
        ]
        yield row, found


def pending(
    store: Store, table: str, columns: Iterable[str] | None = None, *, limit: int | None = None
) -> list[Notification]:
    """Every notification waiting in ``table`` (of ``columns``; at most ``limit`` rows), in
    row order (cost proportional to the notifications, not to the table)."""
    return [
        notification
        for _, found in scan_notifications(store, table, columns, limit=limit)
        for notification in found
    ]


def delete_notifications(store: Store, *notifications: Notification) -> None:
    """Clean ``notifications`` up: delete each cell's notify versions ``<= notify_ts``,
    never newer ones, in one batched delete per table (idempotent).

    Correct only after a run at a start timestamp ``O > notify_ts`` committed, found the
    change acknowledged, or found nothing committed (see the module docstring).  The delete
    also masks a *later* put at ``<= notify_ts``; such a put belongs to a transaction whose
    commit timestamp is below ``O``, which that run's read found committed (and covered) or
    rolled back."""
    by_table: dict[str, list[Delete]] = {}
    for n in notifications:
        by_table.setdefault(n.table, []).append(
            Delete(n.row, NOTIFY, n.column.encode("utf-8"), n.notify_ts)
        )
    for table, deletes in by_table.items():
        store.delete_versions(table, deletes)


def notified_cells_of(
    store: Store,
) -> Callable[[str, Sequence[tuple[bytes, bytes]]], set[tuple[bytes, bytes]]]:
    """For garbage collection: a function telling which of a table's ``(row, qualifier)``
    cells have a notification waiting (any notify version), in one read per call."""

    def notified(table: str, cells: Sequence[tuple[bytes, bytes]]) -> set[tuple[bytes, bytes]]:
        if not cells:
            return set()
        found = store.read_cells(table, [(row, (NOTIFY, qualifier)) for row, qualifier in cells])
        return {
            (row, qualifier)
            for row, row_cells in found.items()
            for (family, qualifier), versions in row_cells.items()
            if family == NOTIFY and versions
        }

    return notified


def collect_unobserved(store: Store, tables: Iterable[str], bound: int) -> int:
    """Garbage collection of the notify family: delete the notify versions ``<= bound`` of
    cells whose column no observer watches (nobody will ever clean them up), in batches.
    Returns how many cells were cleaned.

    Safe because no notify put at or below ``bound`` can still arrive (GC's bound is below
    every transaction that could still commit there), and a column registered later catches
    up from the data, not from old notifications."""
    observed = load_observed_columns(store)
    cleaned = 0
    for table in tables:
        deletes: list[Delete] = []
        for row, cells in store.scan(table, NOTIFY, ScanOptions(before=bound + 1, batch_size=1000)):
            for qualifier in cells:
                if (table, qualifier.decode("utf-8")) not in observed:
                    deletes.append(Delete(row, NOTIFY, qualifier, bound))
            if len(deletes) >= 1000:
                store.delete_versions(table, deletes)
                cleaned += len(deletes)
                deletes = []
        if deletes:
            store.delete_versions(table, deletes)
            cleaned += len(deletes)
    return cleaned


# --------------------------------------------------------------------------- registry

OBSERVED_ROW_PREFIX = b"observed/"
OBSERVED_QUALIFIER = b"observer"
OBSERVED_TOMBSTONE = b"-"
OBSERVED_REFRESH_ENV = "PERCOLATOR_OBSERVED_REFRESH_MS"
DEFAULT_OBSERVED_REFRESH_MS = 2000


def observed_refresh_ms() -> int:
    """The refresh interval of cached observed sets, in ms (env
    ``PERCOLATOR_OBSERVED_REFRESH_MS``, default 2000)."""
    raw = os.environ.get(OBSERVED_REFRESH_ENV, "").strip()
    if not raw:
        return DEFAULT_OBSERVED_REFRESH_MS
    if not ascii_digits(raw) or int(raw) <= 0:
        raise ConfigError(f"{OBSERVED_REFRESH_ENV} must be a positive integer (ms), got {raw!r}")
    return int(raw)


def observed_row(table: str, column: str) -> bytes:
    """The meta-table row that registers ``(table, column)`` as observed."""
    return OBSERVED_ROW_PREFIX + table.encode("utf-8") + b"/" + column.encode("utf-8")


def parse_observed_row(row: bytes) -> tuple[str, str]:
    """Inverse of :func:`observed_row`."""
    table, sep, column = row[len(OBSERVED_ROW_PREFIX) :].partition(b"/")
    if not row.startswith(OBSERVED_ROW_PREFIX) or not sep or not table or not column:
        raise ConfigError(f"malformed observed-column row {row!r} in {META_TABLE}")
    return table.decode("utf-8"), column.decode("utf-8")


def scan_observed_rows(store: Store) -> list[tuple[bytes, int, bytes]]:
    """Every observed-column registration row as ``(row, version, value)``, tombstones
    included (cost: one scan of the registrations, never of user data)."""
    # b"0" is the byte after b"/": the scan covers exactly the rows under the prefix.
    stop = OBSERVED_ROW_PREFIX[:-1] + b"0"
    options = ScanOptions(start=OBSERVED_ROW_PREFIX, stop=stop, qualifiers=[OBSERVED_QUALIFIER])
    found = []
    for row, cells in store.scan(META_TABLE, META_FAMILY, options):
        version, value = cells[OBSERVED_QUALIFIER]
        found.append((row, version, value))
    return found


def _live(value: bytes) -> bool:
    return bool(value) and value != OBSERVED_TOMBSTONE


def load_observed_columns(store: Store) -> frozenset[tuple[str, str]]:
    """The ``(table, column)`` pairs currently registered as observed."""
    return frozenset(
        parse_observed_row(row) for row, _, value in scan_observed_rows(store) if _live(value)
    )


@dataclass(frozen=True)
class Registration:
    """One observed column: which observer watches it, and in which mode."""

    table: str
    column: str
    observer: str
    weak: bool
    #: store version of the registration cell (store time in ms)
    version: int = 0
    #: the ``(table, column)`` pairs the observer writes (None: not declared)
    outputs: tuple[tuple[str, str], ...] | None = None

    def encode(self) -> bytes:
        doc: dict[str, object] = {"v": 1, "observer": self.observer, "weak": self.weak}
        if self.outputs is not None:
            doc["outputs"] = [list(pair) for pair in self.outputs]
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, table: str, column: str, value: bytes, version: int = 0) -> Registration:
        try:
            doc = json.loads(value)
            if doc.get("v") != 1:
                raise ValueError(f"unknown format version {doc.get('v')!r}")
            outputs = doc.get("outputs")
            if outputs is not None:
                outputs = tuple((str(t), str(c)) for t, c in outputs)
            return cls(table, column, str(doc["observer"]), bool(doc["weak"]), version, outputs)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ConfigError(
                f"registration of observed column {table}/{column} in {META_TABLE} is "
                f"malformed ({exc}): {value[:200]!r}"
            ) from None


def registrations(store: Store) -> dict[tuple[str, str], Registration]:
    """Every observed column, keyed by ``(table, column)`` (one scan of the meta table)."""
    found: dict[tuple[str, str], Registration] = {}
    for row, version, value in scan_observed_rows(store):
        if not _live(value):
            continue
        table, column = parse_observed_row(row)
        found[(table, column)] = Registration.decode(table, column, value, version)
    return found


def claim_column(store: Store, wanted: Registration) -> tuple[bool, int]:
    """Make ``wanted`` the registration of its column by compare-and-set.

    Returns ``(changed, version_ms)``: whether this call wrote the cell, and the store
    version of the registration (to know how long it has been visible).  Idempotent for
    the same observer; raises ConfigError if another observer holds the column."""
    row = observed_row(wanted.table, wanted.column)
    for _ in range(100):
        cells = store.read_row(META_TABLE, row, columns=[(META_FAMILY, OBSERVED_QUALIFIER)])
        versions = cells.get((META_FAMILY, OBSERVED_QUALIFIER))
        current = versions[0] if versions else None
        if current is not None and _live(current[1]):
            held = Registration.decode(wanted.table, wanted.column, current[1], current[0])
            if held.observer != wanted.observer:
                raise ConfigError(
                    f"column {wanted.table}/{wanted.column} is already watched by observer "
                    f"{held.observer!r}; observer {wanted.observer!r} cannot watch it too "
                    "(one observer per column: unregister the other first)"
                )
            if held.weak == wanted.weak and held.outputs == wanted.outputs:
                return False, current[0]
        expected = current[1] if current is not None and current[1] else None
        if store.compare_and_set(
            META_TABLE, row, META_FAMILY, OBSERVED_QUALIFIER, expected, wanted.encode()
        ):
            return True, int(time.time() * 1000)
        # Lost a race with another registration of this column: look again.
    raise ConfigError(
        f"could not register observer {wanted.observer!r} on {wanted.table}/{wanted.column}: "
        "the registration cell kept changing under us"
    )


def release_columns(store: Store, observer: str) -> list[tuple[str, str]]:
    """Replace every registration of ``observer`` by a tombstone, each by compare-and-set
    expecting the exact bytes read (a concurrent change of a registration wins).  Returns
    the ``(table, column)`` pairs released."""
    removed = []
    for row, version, value in scan_observed_rows(store):
        if not _live(value):
            continue
        table, column = parse_observed_row(row)
        if Registration.decode(table, column, value, version).observer != observer:
            continue
        if store.compare_and_set(
            META_TABLE, row, META_FAMILY, OBSERVED_QUALIFIER, value, OBSERVED_TOMBSTONE
        ):
            removed.append((table, column))
    return removed


class ObservedColumns:
    """Which ``(table, column)`` pairs leave notifications when written, as one client
    sees them: a cache of the registrations.  Thread-safe.  ``refresh_ms``: the refresh
    interval (default :func:`observed_refresh_ms`); ``clock``: monotonic seconds.

    The cache is reloaded synchronously by the commit that finds it too old: no background
    thread, and a client that is blocked or idle never commits with a stale set.

    **Freshness** (what the committer relies on, percolator/committer.py): every answer of
    :meth:`current` and :meth:`is_observed` comes from a set loaded by a read of the
    registry that *started* at most one refresh interval before the call; an older set is
    reloaded first.  The age is measured on the monotonic ``clock`` from the moment recorded
    just *before* the load's store read began (a registration that became visible after
    that moment may be missed by the read; one visible before it is not).  The committer
    asks only after its ``commit_ts`` was returned by the oracle, so a commit that misses a
    registration visible at ``R`` loaded its set before ``R`` and drew its ``commit_ts``
    before ``R`` + one interval: before the registration's catch-up looked
    (observers/catchup.py).  A fresh set costs no store read."""

    def __init__(
        self,
        store: Store,
        refresh_ms: int | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        # (observed set, clock() at which its load *started*; -inf: never loaded), replaced
        # as one tuple so that a reader without the lock never pairs a set with another
        # load's time
        self._cached: tuple[frozenset[tuple[str, str]], float] = (frozenset(), float("-inf"))
        self._lock = threading.Lock()
        self._refresh_s = (refresh_ms if refresh_ms is not None else observed_refresh_ms()) / 1000
        self._clock = clock
        renew_after_fork(self)

    def _after_fork_in_child(self) -> None:
        """A fresh lock: a parent thread may have held this one, around its cached set, at the
        fork (client.py)."""
        self._lock = threading.Lock()

    def refresh(self) -> frozenset[tuple[str, str]]:
        """Reload the observed set from the store now (one scan of the meta table) and
        return it.  Raises StoreUnavailableError if the store cannot be read; the cache is
        then left as it was (and is still stale, so the next commit tries again)."""
        started = self._clock()  # before the read begins: the age counts from here
        observed = load_observed_columns(self._store)
        with self._lock:
            # Two concurrent reloads: keep the one that started later.
            if started >= self._cached[1]:
                self._cached = (observed, started)
            return self._cached[0]

    def current(self) -> frozenset[tuple[str, str]]:
        """The observed pairs, from a set whose load started at most one refresh interval
        ago (reloaded first otherwise)."""
        observed, loaded_at = self._cached
        if self._clock() - loaded_at > self._refresh_s:
            return self.refresh()
        return observed

    def is_observed(self, key: CellKey) -> bool:
        """Whether a write of ``key`` must leave a notification (answered as
        :meth:`current` says: from a set whose load started at most one refresh interval
        before this call)."""
        return (key.table, key.column) in self.current()


# --------------------------------------------------------------------------- acks

_U64 = struct.Struct(">Q")


def encode_ack(commit_ts: int) -> bytes:
    """An ack's value: the ``commit_ts`` it covers, 8 bytes big-endian."""
    return _U64.pack(commit_ts)


def decode_ack(value: bytes | None, *, where: str = "") -> int | None:
    """Inverse of :func:`encode_ack`; ``None`` for no ack.  ``where`` names the cell in the
    ConfigError raised for a malformed value."""
    if value is None:
        return None
    if len(value) != _U64.size:
        raise ConfigError(f"ack cell {where} holds {len(value)} bytes, expected 8: {value!r}")
    ack: int = _U64.unpack(value)[0]
    return ack


class AckTransaction(Protocol):
    """What reading and writing an ack needs of a transaction: an observer transaction
    (:meth:`percolator.Client.observer_transaction`), allowed to use reserved columns."""

    def get(self, table: str, row: bytes | str, column: str) -> bytes | None: ...

    def set(self, table: str, row: bytes | str, column: str, value: bytes) -> None: ...


def read_ack(txn: AckTransaction, observer: str, table: str, row: bytes, column: str) -> int | None:
    """The ``commit_ts`` that ``observer`` acknowledged for ``(table, row, column)``, as
    ``txn`` sees it (``txn`` must be allowed reserved columns: an observer transaction)."""
    name = ack_column(observer, column)
    return decode_ack(txn.get(table, row, name), where=f"{table}/{row!r}/{name}")


def write_ack(
    txn: AckTransaction, observer: str, table: str, row: bytes, column: str, commit_ts: int
) -> None:
    """Buffer ``observer``'s acknowledgement of the change committed at ``commit_ts`` in
    ``txn`` (an observer transaction): it commits with the run, or not at all."""
    txn.set(table, row, ack_column(observer, column), encode_ack(commit_ts))

"""Live readers and the GC safe point: what keeps garbage collection from reading under them.

The reader contract: a transaction or snapshot either reads exactly its snapshot or gets
:class:`~percolator.errors.SafePointError` on that read, whatever another client or process
does with garbage collection.  Three things make it hold:

1. **Every reader registers** with its client's :class:`ReaderRegistry` before its first
   read (transactions and snapshots alike) and unregisters when it ends -- or when it is
   garbage-collected, so a transaction dropped without commit or rollback does not pin GC.
2. **Each client publishes** the oldest ``start_ts`` among its live readers in the meta table
   (row ``clients/<client id>``) with an expiry, renewed in the background while it has
   readers, so a dead process stops pinning GC once its record expires.  The first reader
   after an idle spell publishes synchronously (one put) and then reloads the safe point
   (one read); while the record stays continuously live, later readers cost nothing extra.
3. **GC honours publications twice**: it lowers its candidate safe point below every live
   record and named reservation, stores the safe point, then **re-reads** the records and
   reservations and deletes nothing at or above the oldest of them.  So a reader whose record
   was stored before GC stored its safe point is protected (GC's re-read sees the record), and
   a reader that published later loads the safe point after GC stored it, sees it above its
   ``start_ts`` and gets ``SafePointError`` instead of reading under the deletion.

A reader whose protection may have lapsed (its client could not renew the record before it
expired, e.g. the store was unreachable) checks the stored safe point freshly on every read.

**Named reservations** ("service safe points", as TiKV calls them): a long job whose readers
live in several processes over a long time (an export, a backfill) reserves a timestamp under
a name with an expiry; GC keeps its safe point at or below it until it expires or is released.
``percolator status`` lists them.

Formats (meta table, family ``m``):

* ``clients/<client id>``, qualifier ``min_start_ts``: u64 oldest start_ts (0: none) + u64
  expiry in wall-clock ms;
* ``gc/reserve/<name>``, qualifier ``ts``: u64 reserved timestamp + u64 expiry in wall ms.
"""

from __future__ import annotations

import contextlib
import logging
import struct
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from percolator.errors import InvalidArgumentError, PercolatorError, SafePointError
from percolator.layout import META_FAMILY, META_TABLE
from percolator.store.base import Delete, Put, ScanOptions, Store
from percolator.timestamps import describe, now_ms

log = logging.getLogger(__name__)

_U64 = struct.Struct(">Q")
CLIENTS_PREFIX = b"clients/"
CLIENT_QUALIFIER = b"min_start_ts"
RESERVE_PREFIX = b"gc/reserve/"
RESERVE_QUALIFIER = b"ts"
SAFE_POINT_ROW = b"gc"
SAFE_POINT_QUALIFIER = b"safe_point"

#: how long a client's publication stays valid without renewal
PUBLISH_TTL_MS = 60_000
#: how often a client with live readers renews it (well inside the TTL); also how long a
#: record may lag behind readers that ended (GC is held back that long: never wrong)
RENEW_INTERVAL_S = 2.0
#: a reader counts as protected until this long before its client's record expires: the
#: wall clocks of GC's host and of the client's may differ by up to this much (docs/gc.md)
_PROTECTION_MARGIN_MS = 15_000


def elapsed_s() -> float:
    """Seconds on a clock that keeps counting while the host is suspended (Linux's
    ``CLOCK_BOOTTIME``; elsewhere ``time.monotonic``).  A reader's protection is measured on
    it: GC judges the client's record by wall-clock expiry, which a suspended host's
    ``time.monotonic`` would not see pass."""
    return time.clock_gettime(_ELAPSED_CLOCK)


_ELAPSED_CLOCK = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)


def _prefix_stop(prefix: bytes) -> bytes:
    # The scan stop that covers exactly the rows under a prefix ending in "/".
    return prefix[:-1] + b"0"


# ------------------------------------------------------------------------ meta cells


def set_meta_cell(store: Store, row: bytes, qualifier: bytes, value: bytes) -> None:
    """Replace one meta-table cell by compare-and-set.

    Never a delete and a plain put: a delete marker hides every later put at or below its
    version (HBase semantics, which every backend follows), so a cell that is cleared and set
    again must go through compare-and-set, whose version is the store's own clock."""
    for _ in range(100):
        found = store.read_row(META_TABLE, row, columns=[(META_FAMILY, qualifier)])
        versions = found.get((META_FAMILY, qualifier))
        current = versions[0][1] if versions else None
        if current == value:
            return
        if store.compare_and_set(META_TABLE, row, META_FAMILY, qualifier, current, value):
            return
    raise RuntimeError(f"meta cell {row!r} kept changing under this update")


# ------------------------------------------------------------------------ safe point


def read_safe_point(store: Store) -> tuple[int, bytes | None]:
    """The stored safe point and its exact bytes (for compare-and-set)."""
    cells = store.read_row(
        META_TABLE, SAFE_POINT_ROW, columns=[(META_FAMILY, SAFE_POINT_QUALIFIER)]
    )
    versions = cells.get((META_FAMILY, SAFE_POINT_QUALIFIER))
    if not versions:
        return 0, None
    return _U64.unpack(versions[0][1])[0], versions[0][1]


def safe_point_error(read_ts: int, safe_point: int) -> SafePointError:
    return SafePointError(
        f"cannot read at {describe(read_ts)}: it is below the garbage-collection safe point "
        f"{describe(safe_point)}, whose older versions may be gone"
    )


# ------------------------------------------------------------------------ publications


@dataclass(frozen=True)
class Publication:
    """One client's published oldest live reader (``min_start_ts`` 0: it has none)."""

    row: bytes
    min_start_ts: int
    expires_ms: int
    #: the record's version: a delete "at or below" it removes this record and never a
    #: newer one of the same client
    version: int = 0


def encode_publication(min_start_ts: int, expires_ms: int) -> bytes:
    return _U64.pack(min_start_ts) + _U64.pack(expires_ms)


def decode_publication(value: bytes) -> tuple[int, int] | None:
    """Inverse of :func:`encode_publication` (None for a value too short to be one)."""
    if len(value) < 16:
        return None
    return _U64.unpack(value[:8])[0], _U64.unpack(value[8:16])[0]


def scan_publications(store: Store) -> list[Publication]:
    """Every client's record, expired ones included (one scan of the client rows)."""
    found = []
    options = ScanOptions(start=CLIENTS_PREFIX, stop=_prefix_stop(CLIENTS_PREFIX))
    for row, cells in store.scan(META_TABLE, META_FAMILY, options):
        value = cells.get(CLIENT_QUALIFIER)
        decoded = None if value is None else decode_publication(value[1])
        if decoded is not None and value is not None:
            found.append(Publication(row, *decoded, version=value[0]))
    return found


@dataclass(frozen=True)
class Reservation:
    """A named safe-point reservation: GC keeps its safe point at or below ``ts``."""

    name: str
    ts: int
    expires_ms: int


def _reservation_cells(store: Store) -> Iterator[tuple[bytes, int, bytes]]:
    """Every reservation record, released ones included: ``(row, version, value)``."""
    options = ScanOptions(start=RESERVE_PREFIX, stop=_prefix_stop(RESERVE_PREFIX))
    for row, cells in store.scan(META_TABLE, META_FAMILY, options):
        found = cells.get(RESERVE_QUALIFIER)
        if found is not None:
            yield row, found[0], found[1]


def scan_reservations(store: Store) -> list[Reservation]:
    found = []
    for row, _, value in _reservation_cells(store):
        decoded = decode_publication(value)
        if decoded is None or value == encode_publication(0, 0):
            continue  # malformed, or released
        found.append(Reservation(row[len(RESERVE_PREFIX) :].decode("utf-8", "replace"), *decoded))
    return found


def reserve_safe_point(store: Store, name: str, ts: int, ttl_ms: int) -> None:
    """Reserve ``ts`` under ``name`` for ``ttl_ms`` (renew by calling again).  GC passes that
    start after this returns keep their safe point at or below ``ts``; one that started
    earlier and already stored a safe point above ``ts`` has made ``ts`` unreadable, which a
    reader at ``ts`` learns as :class:`SafePointError` (check with :func:`read_safe_point`)."""
    if not isinstance(name, str) or not name or "/" in name:
        raise InvalidArgumentError(
            f"reservation name must be a non-empty str without '/': {name!r}"
        )
    if not isinstance(ttl_ms, int) or ttl_ms <= 0:
        raise InvalidArgumentError(f"ttl_ms must be a positive int, got {ttl_ms!r}")
    row = RESERVE_PREFIX + name.encode("utf-8")
    set_meta_cell(store, row, RESERVE_QUALIFIER, encode_publication(ts, now_ms() + ttl_ms))


def release_safe_point(store: Store, name: str) -> None:
    """Drop a reservation: it becomes a released record (see :func:`set_meta_cell`), which
    GC removes :data:`RESERVATION_KEEP_MS` later (:func:`collect_reservations`)."""
    row = RESERVE_PREFIX + name.encode("utf-8")
    set_meta_cell(store, row, RESERVE_QUALIFIER, encode_publication(0, 0))


#: how long a released or expired reservation's record stays before GC removes it: far
#: longer than any clock difference between the store's stamps and its clients, so that a
#: later reservation of the same name (compare-and-set, stamped with the store's clock) is
#: always newer than the delete marker and never hidden by it
RESERVATION_KEEP_MS = 3_600_000


def collect_reservations(store: Store, clock_ms: int, keep_ms: int = RESERVATION_KEEP_MS) -> int:
    """Delete the records of reservations released or expired, and last written, more than
    ``keep_ms`` before ``clock_ms``, so names used once (a bulk load's id) do not pile up.
    Returns how many were removed.  Each delete stops at the version read: a concurrent
    renewal is stamped later and survives it."""
    deletes = []
    for row, version, value in _reservation_cells(store):
        decoded = decode_publication(value)
        expires_ms = decoded[1] if decoded is not None else 0
        if version < clock_ms - keep_ms and expires_ms < clock_ms - keep_ms:
            deletes.append(Delete(row, META_FAMILY, RESERVE_QUALIFIER, version))
    if deletes:
        store.delete_versions(META_TABLE, deletes)
    return len(deletes)


@dataclass(frozen=True)
class ReadersView:
    """What GC must stay below, read from the store at one moment."""

    oldest: int | None  # the oldest live reader or reservation, None if there is none
    #: expired client records as ``(row, version)``: delete each at or below its version,
    #: so that a record its client stored since (a higher version) survives
    expired: list[tuple[bytes, int]]


def live_readers(
    store: Store, clock_ms: int, *, extra: int | None = None, own_row: bytes | None = None
) -> ReadersView:
    """The oldest ``start_ts`` of any live published reader or unexpired reservation (and
    ``extra``, the caller's own in-memory readers, whose record ``own_row`` is skipped: the
    caller knows them exactly), plus the rows of expired client records."""
    oldest = extra
    expired = []
    for pub in scan_publications(store):
        if pub.row == own_row:
            continue
        if pub.expires_ms < clock_ms:
            expired.append((pub.row, pub.version))
        elif pub.min_start_ts and (oldest is None or pub.min_start_ts < oldest):
            oldest = pub.min_start_ts
    for reservation in scan_reservations(store):
        if reservation.expires_ms >= clock_ms and (oldest is None or reservation.ts < oldest):
            oldest = reservation.ts
    return ReadersView(oldest, expired)


# ------------------------------------------------------------------------ the registry


class ReaderRegistry:
    """The live readers of one client and its publication of the oldest one.  Thread-safe.

    ``register`` is called before a reader's first read, ``check`` on each read."""

    def __init__(
        self,
        store: Store,
        client_id: str,
        *,
        safe_point_refresh_ms: int,
        clock: Callable[[], float] = elapsed_s,
    ) -> None:
        self._store = store
        #: this client's record in the meta table
        self.row = CLIENTS_PREFIX + client_id.encode()
        self._refresh_ms = safe_point_refresh_ms
        self._clock = clock
        self._lock = threading.Lock()
        self._active: dict[int, int] = {}  # start_ts -> count of live readers
        # GC passes of this client under way (collecting()): its readers do not rely on the
        # record then, which those passes skip.
        self._collecting = 0
        self._next_token = 0
        # The record in the store covers every live reader from this monotonic time until
        # _protected_until (None: no record this client can rely on).
        self._published_since: float | None = None
        self._protected_until = 0.0
        self._published_min = 0
        self._published_version = 0  # the version of this client's newest record
        self._safe_point = 0
        self._safe_point_loaded_at = float("-inf")
        self._publish_lock = threading.Lock()
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def start_over(self, client_id: str) -> None:
        """In a forked child (its client calls this): publish under a record of the child's
        own, ``client_id``'s.  Sharing the parent's record, each process would overwrite
        the other's oldest reader, and GC could pass a live reader of either.  Readers the
        child inherited stay registered (it may go on using them); until the child has
        published, none of them counts as protected (:meth:`check` reads the safe point).
        The renewal thread is the parent's and does not exist here: the next publish
        starts the child's."""
        self.row = CLIENTS_PREFIX + client_id.encode()
        self._lock = threading.Lock()
        self._publish_lock = threading.Lock()
        self._stop = threading.Event()
        self._renewer = None
        self._published_since = None
        self._protected_until = 0.0
        self._published_min = 0
        self._published_version = 0

    # ---------------------------------------------------------------- readers

    def register(self, owner: object, start_ts: int) -> Callable[[], None]:
        """Register a reader at ``start_ts`` owned by ``owner``; returns its release function
        (idempotent).  The reader is also released when ``owner`` is garbage-collected.
        Raises SafePointError if ``start_ts`` is already below the safe point."""
        with self._lock:
            self._active[start_ts] = self._active.get(start_ts, 0) + 1
        finalizer = weakref.finalize(owner, self._release, start_ts)
        try:
            self._ensure_published()
            self.check(start_ts)
        except BaseException:
            finalizer()
            raise
        return finalizer

    def _release(self, start_ts: int) -> None:
        with self._lock:
            count = self._active.get(start_ts, 0) - 1
            if count <= 0:
                self._active.pop(start_ts, None)
            else:
                self._active[start_ts] = count

    def min_active(self) -> int | None:
        with self._lock:
            return min(self._active) if self._active else None

    @contextlib.contextmanager
    def collecting(self) -> Iterator[None]:
        """Around a GC pass of this client, which counts its readers from memory
        (:meth:`min_active`) and skips its record: meanwhile no reader relies on the
        record, which may still name an older reader than any left (it is renewed every
        few seconds).  A reader that arrives during the pass checks the stored safe point:
        registered before the pass reads the readers again, it is counted; after, it finds
        the pass's safe point stored and is refused."""
        with self._lock:
            self._collecting += 1
        try:
            yield
        finally:
            with self._lock:
                self._collecting -= 1

    # ---------------------------------------------------------------- publication

    def _ensure_published(self) -> None:
        """Make sure a live record covering every registered reader is in the store."""
        if self._clock() < self._protected_until and self._published_since is not None:
            with self._lock:
                oldest = min(self._active) if self._active else 0
            if self._published_min and self._published_min <= oldest:
                return
        self.publish()
        self._start_renewer()

    def publish(self) -> None:
        """Store this client's oldest live reader now (synchronously)."""
        with self._publish_lock:
            was_since, was_until, was_min = (
                self._published_since,
                self._protected_until,
                self._published_min,
            )
            # No reader may rely on the record in force from here until the new one is
            # stored and described below: the new one is computed without the readers that
            # register meanwhile and may cover less (no reader, or only newer ones).  Such a
            # reader finds no protection, so it publishes itself (after this) and checks the
            # stored safe point.  Readers registered before this point are in ``oldest``.
            self._published_since = None
            self._protected_until = 0.0
            oldest = self.min_active() or 0
            lapsed = not (self._clock() < was_until)
            value = encode_publication(oldest, now_ms() + PUBLISH_TTL_MS)
            # Each record at a version above every earlier one of this row: GC deletes an
            # expired record "at or below" the version it read, which must never reach a
            # newer record (nor, on HBase, mask every later put of the row).
            version = max(now_ms(), self._published_version + 1)
            issued = self._clock()
            self._store.put(
                META_TABLE, [Put(self.row, META_FAMILY, CLIENT_QUALIFIER, version, value)]
            )
            self._published_version = version
            self._published_min = oldest
            if oldest != 0:
                # A new protection starts when none was in force or the record now covers
                # older readers than before; moving the minimum forward keeps it going.
                renewed = was_since is not None and not lapsed and oldest >= was_min
                self._published_since = was_since if renewed else self._clock()
                self._protected_until = issued + (PUBLISH_TTL_MS - _PROTECTION_MARGIN_MS) / 1000

    def _start_renewer(self) -> None:
        with self._lock:
            if self._renewer is not None:
                return
            self._renewer = threading.Thread(
                target=self._renew_loop, daemon=True, name="percolator-readers"
            )
            self._renewer.start()

    def _renew_loop(self) -> None:
        while not self._stop.wait(RENEW_INTERVAL_S):
            if self.min_active() is None and self._published_min == 0:
                continue
            try:
                self.publish()
            except PercolatorError as exc:
                log.warning("could not publish the oldest live reader: %s", exc)

    # ---------------------------------------------------------------- safe point

    def safe_point(self, *, refresh: bool = False) -> int:
        """The stored safe point, cached for at most the refresh interval."""
        now = self._clock()
        if refresh or (now - self._safe_point_loaded_at) * 1000 > self._refresh_ms:
            self._safe_point = read_safe_point(self._store)[0]
            self._safe_point_loaded_at = now
        return self._safe_point

    def check_stored(self, read_ts: int) -> None:
        """Raise SafePointError if ``read_ts`` is below the safe point read from the store
        now (never the cache): for a read that found data missing, to tell garbage
        collection under a reader from a damaged store."""
        safe_point = self.safe_point(refresh=True)
        if read_ts < safe_point:
            raise safe_point_error(read_ts, safe_point)

    def check(self, read_ts: int) -> None:
        """Raise SafePointError if a read at ``read_ts`` may see collected versions.

        Cheap while this client's record is live and the cached safe point was loaded after
        the record was established (GC's re-read of the records then protects the reader);
        otherwise the safe point is read from the store first."""
        now = self._clock()
        protected = (
            not self._collecting
            and self._published_since is not None
            and now < self._protected_until
            and self._safe_point_loaded_at > self._published_since
            and self._published_min != 0
            and self._published_min <= read_ts
        )
        safe_point = self.safe_point(refresh=not protected)
        if read_ts < safe_point:
            raise safe_point_error(read_ts, safe_point)

    # ---------------------------------------------------------------- lifecycle

    def close(self) -> None:
        """Stop renewing and withdraw the record (best effort: it expires anyway)."""
        self._stop.set()
        if self._published_min:
            try:
                self._store.delete_versions(
                    META_TABLE,
                    [Delete(self.row, META_FAMILY, CLIENT_QUALIFIER, self._published_version)],
                )
            except PercolatorError as exc:
                log.debug("could not withdraw the reader record: %s", exc)

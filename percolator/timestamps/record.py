"""The timestamp oracle's persisted record, and the register in the store that holds it.

Where
-----
Table ``percolator_meta``, family ``m`` (one version kept; both from
:mod:`percolator.layout`), row ``b"oracle"``, qualifier ``b"record"``.  The table is
created idempotently by whoever needs it first.

The record is changed **only** by :meth:`~percolator.store.base.Store.compare_and_set` from
the exact bytes last read to the new bytes, so every change of the record is one step of a
single total order, and a writer whose view is stale fails instead of overwriting.

Meaning
-------
``high_water``
    No timestamp above it has been issued.  Every issuer (a lease holder or a
    :class:`~percolator.timestamps.local.LocalOracle`) persists a mark at or above what it is
    going to issue **before** issuing, so a successor that starts strictly above the mark
    never repeats or goes below an issued timestamp.
``epoch``
    Bumped by every oracle server that takes the lease over.  Clients reject responses from
    a lower epoch than one they have seen.
``holder``
    Who wrote the record last: an oracle server's id (``oracle:...``) or a local oracle's
    instance id (``local:...``, see :data:`LOCAL_HOLDER_PREFIX`).
``lease_expiry_ms`` / ``lease_ms``
    Wall-clock expiry of the holder's lease, and its duration.  ``lease_ms == 0`` means
    nobody holds a lease.  Standbys use the duration to wait out a lease on their own
    monotonic clock (see :mod:`percolator.oracle.lease`, the gRPC oracle server's lease, and
    :mod:`percolator.timestamps.local` for the local oracle's short lease).

The release request
-------------------
A second cell of the same row, qualifier ``b"wanted"``, is how an instance that waits for
someone else's lease asks the holder to give it up early: the waiter replaces it (by
compare-and-set, from what it read) with a value of its own that was never written before.
A holder that finds a value other than the one it saw when it took its lease releases the
lease.  Only a hint: correctness never depends on it (a waiter that is not answered waits
the lease out).

Byte format (version 1, big-endian)
-----------------------------------
::

    offset  size  field
    0       1     format version = 1
    1       8     epoch             (unsigned)
    9       8     high_water        (unsigned)
    17      8     lease_expiry_ms   (unsigned)
    25      4     lease_ms          (unsigned)
    29      2     holder length N   (unsigned)
    31      N     holder, UTF-8

Decoders reject other versions, trailing bytes and truncation with :class:`OracleError`
naming what is wrong; a record is never rewritten by anyone who cannot decode it.
"""

from __future__ import annotations

import itertools
import struct
from dataclasses import dataclass

from percolator.errors import OracleError
from percolator.layout import META_FAMILY, META_TABLE, ensure_meta_table
from percolator.store.base import Store

ORACLE_ROW = b"oracle"
ORACLE_QUALIFIER = b"record"
WANTED_QUALIFIER = b"wanted"
#: Holder ids of local oracles start with this, those of oracle servers with ``oracle:``: a
#: local oracle waits out another local oracle's lease but refuses to run beside a server.
LOCAL_HOLDER_PREFIX = "local:"

FORMAT_VERSION = 1
_HEADER = struct.Struct(">BQQQIH")
MAX_HOLDER_BYTES = 1024
_U64 = (1 << 64) - 1


@dataclass(frozen=True)
class OracleRecord:
    """One value of the oracle record.  See the module docstring for the meaning of fields."""

    epoch: int
    high_water: int
    holder: str
    lease_expiry_ms: int = 0
    lease_ms: int = 0

    def __post_init__(self) -> None:
        for name in ("epoch", "high_water", "lease_expiry_ms"):
            value = getattr(self, name)
            if not isinstance(value, int) or not 0 <= value <= _U64:
                raise OracleError(f"oracle record field {name}={value!r} outside [0, 2**64)")
        if not isinstance(self.lease_ms, int) or not 0 <= self.lease_ms < 1 << 32:
            raise OracleError(f"oracle record field lease_ms={self.lease_ms!r} outside [0, 2**32)")
        if len(self.holder.encode("utf-8")) > MAX_HOLDER_BYTES:
            raise OracleError(f"oracle holder id longer than {MAX_HOLDER_BYTES} bytes")

    @property
    def leased(self) -> bool:
        """True if the record names a lease (which may have lapsed by now)."""
        return self.lease_ms > 0

    def encode(self) -> bytes:
        holder = self.holder.encode("utf-8")
        return (
            _HEADER.pack(
                FORMAT_VERSION,
                self.epoch,
                self.high_water,
                self.lease_expiry_ms,
                self.lease_ms,
                len(holder),
            )
            + holder
        )

    @classmethod
    def decode(cls, data: bytes) -> OracleRecord:
        if len(data) < 1:
            raise OracleError("oracle record is empty")
        if data[0] != FORMAT_VERSION:
            raise OracleError(
                f"oracle record has format version {data[0]}, this code reads only "
                f"version {FORMAT_VERSION} (newer software wrote it?)"
            )
        if len(data) < _HEADER.size:
            raise OracleError(
                f"oracle record truncated: {len(data)} bytes, header needs {_HEADER.size}"
            )
        _, epoch, high_water, expiry, lease_ms, holder_len = _HEADER.unpack_from(data)
        if len(data) != _HEADER.size + holder_len:
            raise OracleError(
                f"oracle record is {len(data)} bytes, its header says {_HEADER.size + holder_len}"
            )
        try:
            holder = data[_HEADER.size :].decode("utf-8")
        except UnicodeDecodeError as exc:
            raise OracleError(f"oracle record holder is not UTF-8: {exc}") from None
        return cls(
            epoch=epoch,
            high_water=high_water,
            holder=holder,
            lease_expiry_ms=expiry,
            lease_ms=lease_ms,
        )


@dataclass(frozen=True)
class StoredRecord:
    """What a read of the register found: the decoded record (None if absent) and its exact
    stored bytes, which are what the next compare-and-set must expect; and the release
    request cell's value (None if never written)."""

    record: OracleRecord | None
    raw: bytes | None
    wanted: bytes | None = None


class OracleRecordRegister:
    """The oracle record of one store as a compare-and-set register: read it, or replace
    the exact bytes last read.

    Thread-safe (the store is).  Nothing here retries: a compare-and-set that raises
    :class:`~percolator.errors.StoreUnavailableError` may or may not have been applied, and
    the caller decides by re-reading (see :meth:`read`).
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self._table_ready = False

    def ensure_table(self) -> None:
        """Create ``percolator_meta`` if it does not exist.  Idempotent and race-safe."""
        if not self._table_ready:
            ensure_meta_table(self.store)
            self._table_ready = True

    def read(self) -> StoredRecord:
        """One consistent read of the record and the release request (one row read)."""
        self.ensure_table()
        cells = self.store.read_row(
            META_TABLE,
            ORACLE_ROW,
            columns=[(META_FAMILY, ORACLE_QUALIFIER), (META_FAMILY, WANTED_QUALIFIER)],
        )
        wanted_versions = cells.get((META_FAMILY, WANTED_QUALIFIER), [])
        wanted = wanted_versions[0][1] if wanted_versions else None
        versions = cells.get((META_FAMILY, ORACLE_QUALIFIER), [])
        if not versions or versions[0][1] == b"":
            return StoredRecord(None, None, wanted)
        raw = versions[0][1]
        return StoredRecord(OracleRecord.decode(raw), raw, wanted)

    def compare_and_set(self, expected: bytes | None, new: OracleRecord) -> bool:
        """Write ``new`` if the register still holds exactly ``expected`` (None: absent).

        Returns False if someone else changed the record first.  May raise
        :class:`~percolator.errors.StoreUnavailableError` with an unknown outcome."""
        self.ensure_table()
        return self.store.compare_and_set(
            META_TABLE, ORACLE_ROW, META_FAMILY, ORACLE_QUALIFIER, expected, new.encode()
        )

    def ask_release(self, seen: StoredRecord, request: bytes) -> bool:
        """Ask the lease holder to release its lease: replace the release request ``seen``
        found with ``request``, a value never written before.  False if the request cell
        changed since ``seen`` was read (somebody else asked meanwhile, which serves as
        well, or ``seen`` is old).  May raise StoreUnavailableError."""
        self.ensure_table()
        return self.store.compare_and_set(
            META_TABLE, ORACLE_ROW, META_FAMILY, WANTED_QUALIFIER, seen.wanted, request
        )


def is_local_holder(holder: str) -> bool:
    """Whether ``holder`` names a local oracle instance (not an oracle server)."""
    return holder.startswith(LOCAL_HOLDER_PREFIX)


class ReleaseAsker:
    """Asks the holder of a lease someone waits on to release it, **once per lease**.

    The holder compares the release request cell with what it saw when it took (or last
    renewed) its lease, so one change of the cell is all it needs; asking on every poll
    of a waiter would only add a compare-and-set per poll.  A lease is known by its record
    bytes; it is asked again only if the request did not apply (the cell changed since the
    record was read).  Requests are ``REQUESTER#n``, never written before as long as
    ``requester`` is unique to its instance.  Not thread-safe: one waiter's state.
    """

    def __init__(self, register: OracleRecordRegister, requester: str) -> None:
        self._register = register
        self._requester = requester
        self._requests = itertools.count(1)
        # The lease (its record bytes) our request applied to.
        self._asked_of: bytes | None = None

    def ask(self, stored: StoredRecord) -> None:
        """Ask the lease in ``stored`` to end, unless this asker already did.  May raise
        StoreUnavailableError."""
        if stored.raw == self._asked_of:
            return
        request = f"{self._requester}#{next(self._requests)}".encode()
        if self._register.ask_release(stored, request):
            self._asked_of = stored.raw

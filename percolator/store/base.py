"""The store interface: exactly what a Bigtable-like store gives, and nothing more.

Every backend (``memory:``, ``embedded:PATH``, ``hbase://HOST:PORT``) implements
:class:`Store` and passes the same contract test suite (``tests/store/``).

Data model
----------
A store holds tables.  A table has column *families* fixed at creation.  A cell is
addressed by ``(row, family, qualifier)`` and holds several *versions*, each an integer
timestamp with a byte value.  Rows and qualifiers are bytes and sort as unsigned bytes.

What is atomic (this is the whole contract the transaction protocol relies on)
-----------------------------------------------------------------------------
* :meth:`Store.compare_and_set` is the **only** atomic read-modify-write: it compares
  **one** cell's newest version and, on a match, writes **one** cell.  The version of the
  written cell is chosen by the store, never by the caller: HBase 2.6 stamps the larger of
  its clock (milliseconds) and the version of the cell it compared, so the written value is
  always the newest; every backend does the same.
  Stamps of one store never go back by more than :attr:`Store.stamp_skew_ms`: a
  compare-and-set issued after another one returned is stamped at least that one's version
  minus the skew (0 on the memory and embedded stores, whose clock is one monotonic clock;
  on HBase each region server stamps with its own clock).
  ``expected=None`` matches a cell that is absent **or holds the empty value** (HBase's
  Thrift-1 ``checkAndPut`` semantics, kept identical on every backend); values that are
  compare-and-set should therefore never be empty.
  :meth:`Store.compare_and_set_many` runs many such compare-and-sets in one call: each is
  atomic on its own, the batch is not (the embedded store runs them in one write
  transaction, HBase in parallel calls).  Blind puts of the same table may ride in that
  call, in no order relative to the compare-and-sets.  On a store whose
  :attr:`Store.conditional_puts` is True (memory, embedded, HBase with a Thrift-2 gateway),
  a compare-and-set may also carry
  puts of its own row that land with it, atomically, and only if it applies
  (:attr:`CompareAndSet.then_put`).
* :meth:`Store.put` is atomic per row and version only (on HBase, cells of one row at
  different versions go in separate calls); a batch spanning rows may be applied partially
  if the call fails.  A store whose :attr:`Store.put_is_atomic` is True (memory, embedded)
  applies a whole put call at once, or none of it.  Puts are blind and idempotent:
  re-putting the same value at the same version is harmless.
* A single-row read of one version per cell sees a consistent snapshot of that row (a
  multi-version read on HBase is one call per cell, so only each cell is consistent).
  Reads of many rows and scans are **not** a consistent snapshot across rows.
* :meth:`Store.delete_versions` removes every version **at or below** a timestamp, and the
  delete also masks puts at or below that timestamp written **later** (HBase keeps that mask
  until a major compaction; the embedded and memory stores until :meth:`Store.compact_deletes`,
  which garbage collection calls).  Never rely on either: the protocol never re-puts at or
  below a version it deleted.

Version ranges
--------------
Reads take ``before`` (an **exclusive** upper bound, like HBase's timestamped reads: pass
``read_ts + 1`` to see versions ``<= read_ts``), an optional inclusive ``min_version``, and
``max_versions``.  Reading more than one version requires explicit columns (Thrift-1 cannot
name the qualifier of multi-version results of a whole family).
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from percolator.errors import InvalidArgumentError

# A version is (timestamp, value); lists of versions are always newest first.
Version = tuple[int, bytes]
# A column inside a store table: (family, qualifier).
Column = tuple[str, bytes]
# What a row read returns: column -> versions newest first (only columns that have any).
RowCells = dict[Column, list[Version]]

# Largest version a store accepts (HBase timestamps are signed 64-bit; LATEST is max).
MAX_VERSION = (1 << 63) - 2
# HBase stores the row length in a signed short; an empty row key is not a row.  HBase's
# usable limit is a little lower (its region lookup key adds the table name and 16 bytes);
# the HBase backend refuses longer rows up front.
MAX_ROW_LENGTH = 32767
#: The most cells (rows x columns) one read of :meth:`Store.read_cells` through a cross
#: product asks for: the server answers every named column of every named row that exists,
#: and HBase's Thrift gateway holds a whole answer in its heap, so a read of rows that each
#: name other columns is split (each row whole in one part) rather than sent as one product.
CROSS_PRODUCT_CELLS = 30_000


@dataclass(frozen=True)
class FamilySpec:
    """Options of one column family, set explicitly at table creation.

    ``max_versions`` is how many versions a cell keeps (older ones disappear);
    ``in_memory`` and ``block_cache`` are hints honoured by HBase and ignored elsewhere.
    """

    name: str
    max_versions: int = 2**31 - 1
    in_memory: bool = False
    block_cache: bool = True


@dataclass(frozen=True)
class Put:
    """A blind write of one version of one cell."""

    row: bytes
    family: str
    qualifier: bytes
    version: int
    value: bytes


@dataclass(frozen=True)
class CompareAndSet:
    """One cell's compare-and-set in :meth:`Store.compare_and_set_many`: if the newest
    version of the cell equals ``expected`` (``None``: absent or empty), write ``new``.

    ``then_put``: puts in the **same row**, written in the same atomic step as ``new`` and
    only if the compare-and-set applies (HBase's ``checkAndMutate``).  Only on a store whose
    :attr:`Store.conditional_puts` is True; any other store refuses a non-empty
    ``then_put`` with :class:`~percolator.errors.InvalidArgumentError` before writing."""

    row: bytes
    family: str
    qualifier: bytes
    expected: bytes | None
    new: bytes
    then_put: tuple[Put, ...] = ()


@dataclass(frozen=True)
class Delete:
    """Remove every version of one cell at or below ``at_or_below``."""

    row: bytes
    family: str
    qualifier: bytes
    at_or_below: int


@dataclass(frozen=True)
class ScanOptions:
    """Options of :meth:`Store.scan`.

    ``stop`` is exclusive; ``None`` means the end of the table.  ``columns`` restricts the
    scan to qualifiers of the scanned family.  ``batch_size`` is how many rows one store
    round trip fetches.  ``before`` is an exclusive upper bound on versions; only the newest
    version below it is returned for each cell.

    ``value_ranges`` (None: no filter) keeps only versions whose value lies in one of the
    half-open ranges ``[low, high)`` (``high`` None: no upper bound; bytes compare
    unsigned), applied to each version *before* the newest is chosen (as HBase's
    ``ValueFilter`` on the region server does), so a filtered-out newest version may leave
    an older matching one; rows left without a cell are skipped.  The store filters before
    anything is sent to the caller: what is filtered out costs no transfer.
    """

    start: bytes = b""
    stop: bytes | None = None
    qualifiers: Sequence[bytes] | None = None
    before: int | None = None
    batch_size: int = 1000
    limit: int | None = None
    value_ranges: Sequence[tuple[bytes, bytes | None]] | None = None


@dataclass
class StoreStats:
    """Counters every backend keeps, for metrics and benchmarks (round trips to the store)."""

    calls: dict[str, int] = field(default_factory=dict)

    def count(self, op: str, n: int = 1) -> None:
        self.calls[op] = self.calls.get(op, 0) + n


class Store(abc.ABC):
    """A Bigtable-like store.  See the module docstring for what is atomic.

    All methods are thread-safe.  Methods raise :class:`~percolator.errors.TableNotFoundError`
    for an unknown table, :class:`~percolator.errors.StoreUnavailableError` when the store
    cannot be reached, and :class:`~percolator.errors.InvalidArgumentError` for malformed
    arguments (before anything is written).
    """

    #: the URL this store was opened with (without secrets)
    url: str
    #: how far below an earlier compare-and-set's version (of any cell) a later one may be
    #: stamped (see the module docstring); garbage collection relies on it to delete a
    #: lock cell without a conditional delete (percolator/protocol/gc.py)
    stamp_skew_ms: int = 0
    #: True if one :meth:`put` call is applied all at once or not at all, whatever rows and
    #: versions it spans (memory, embedded); False if only per row and version (HBase).  A
    #: caller that needs one put stored before another may then send both in one call
    #: (percolator/protocol/commit.py does, for a commit-index entry and its record).
    put_is_atomic: bool = False
    #: True if a compare-and-set can carry puts of its row, applied with it and only if it
    #: applies (:attr:`CompareAndSet.then_put`; memory, embedded, and HBase with a Thrift-2
    #: gateway).  HBase through Thrift-1 alone cannot: its ``checkAndPut`` carries one
    #: unversioned mutation.
    conditional_puts: bool = False
    #: True if a :meth:`put` spanning k versions costs k round trips, one after another
    #: (HBase through Thrift-1 alone: ``mutateRowsTs`` takes one timestamp per call).  A
    #: caller writing batches of several versions may then send each version in a call of
    #: its own, concurrently (the bulk load does).
    put_call_per_version: bool = False
    #: True if calls of several threads of one process proceed in parallel, because a server
    #: does the work and the threads wait on the network (HBase); False if they take turns
    #: in this process (memory, embedded: Python runs one thread at a time, and an SQLite
    #: statement costs 3-4x the CPU with four threads issuing them), so that more threads
    #: add cost, not throughput.  The observer worker's default thread count follows it.
    calls_run_in_parallel: bool = True

    def __init__(self) -> None:
        self.stats = StoreStats()

    # ------------------------------------------------------------------ admin

    @abc.abstractmethod
    def create_table(self, name: str, families: Sequence[FamilySpec]) -> None:
        """Create a table.  Raises :class:`TableExistsError` if it exists."""

    @abc.abstractmethod
    def drop_table(self, name: str) -> None:
        """Drop a table and all its data.  Raises :class:`TableNotFoundError`."""

    @abc.abstractmethod
    def list_tables(self) -> list[str]:
        """Names of all tables, sorted."""

    def table_exists(self, name: str) -> bool:
        return name in self.list_tables()

    @abc.abstractmethod
    def table_families(self, name: str) -> list[FamilySpec]:
        """The families a table was created with."""

    # ------------------------------------------------------------------ reads

    @abc.abstractmethod
    def read_rows(
        self,
        table: str,
        rows: Sequence[bytes],
        columns: Sequence[Column] | None = None,
        families: Sequence[str] | None = None,
        *,
        before: int | None = None,
        min_version: int = 0,
        max_versions: int = 1,
    ) -> dict[bytes, RowCells]:
        """Read several rows in one round trip where the store allows it.

        Selects ``columns`` and/or whole ``families`` (both ``None`` means every family).
        Returns only rows that have at least one selected cell.  Each row is a consistent
        snapshot of that row; the rows together are not.
        """

    def read_row(
        self,
        table: str,
        row: bytes,
        columns: Sequence[Column] | None = None,
        families: Sequence[str] | None = None,
        *,
        before: int | None = None,
        min_version: int = 0,
        max_versions: int = 1,
    ) -> RowCells:
        """Read one row (a consistent snapshot of it).  Empty dict if nothing matches."""
        result = self.read_rows(
            table,
            [row],
            columns,
            families,
            before=before,
            min_version=min_version,
            max_versions=max_versions,
        )
        return result.get(row, {})

    def read_cells(
        self,
        table: str,
        cells: Sequence[tuple[bytes, Column]],
        *,
        before: int | None = None,
    ) -> dict[bytes, RowCells]:
        """The newest version below ``before`` of each ``(row, (family, qualifier))`` of
        ``cells``, keyed like :meth:`read_rows` (only cells that have such a version), in one
        round trip where the store allows it; each row a consistent snapshot of that row,
        as with :meth:`read_rows`.  Counted as a ``read_rows`` call.

        Unlike :meth:`read_rows`, which reads every column of every row asked for, this
        reads only the cells named: a transaction writing one column in each of many rows,
        each a different column, reads as many cells as it writes, not rows x columns.
        This default (HBase without a Thrift-2 gateway) sends that cross product in one
        :meth:`read_rows` (one round trip; the server finds only what exists) and keeps the
        cells asked for; a product of more than :data:`CROSS_PRODUCT_CELLS` is sent in parts
        of consecutive rows, each at most that (or one row), one round trip each.  The other
        stores read exactly the cells.  An empty ``cells`` reads nothing (no round trip).
        Raises InvalidArgumentError for a malformed cell, before anything is read."""
        rows, columns = split_cells(cells)
        if not rows:
            return {}
        return self._read_cross_product(table, cells, rows, columns, before)

    def _read_cross_product(
        self,
        table: str,
        cells: Sequence[tuple[bytes, Column]],
        rows: list[bytes],
        columns: list[Column],
        before: int | None,
    ) -> dict[bytes, RowCells]:
        """:meth:`read_cells` as :meth:`read_rows` of ``rows`` x ``columns`` (those of
        ``cells``, checked by :func:`split_cells`), keeping the cells named: one read when
        the product is at most :data:`CROSS_PRODUCT_CELLS`, else one per part of
        :func:`cross_product_parts`, after :meth:`_check_cells` of the whole read (so a
        bad row or column of a later part is refused before the first part is read)."""
        if len(rows) * len(columns) <= CROSS_PRODUCT_CELLS:
            parts = [(rows, columns)]  # read_rows checks it
        else:
            self._check_cells(table, rows, columns, before)
            parts = cross_product_parts(cells, CROSS_PRODUCT_CELLS)
        wanted = set(cells)
        result: dict[bytes, RowCells] = {}
        for part_rows, part_columns in parts:
            found = self.read_rows(table, part_rows, columns=part_columns, before=before)
            for row, row_cells in found.items():
                kept = {column: v for column, v in row_cells.items() if (row, column) in wanted}
                if kept:
                    result[row] = kept
        return result

    def _check_cells(  # noqa: B027 - optional for stores that cannot check without a read
        self, table: str, rows: list[bytes], columns: list[Column], before: int | None
    ) -> None:
        """Raise InvalidArgumentError unless every row and column of a read of ``rows`` x
        ``columns`` can be read, without reading.  The default checks nothing: each part's
        :meth:`read_rows` then checks its own part."""

    @abc.abstractmethod
    def scan(
        self, table: str, family: str, options: ScanOptions | None = None
    ) -> Iterator[tuple[bytes, dict[bytes, Version]]]:
        """Scan one family over a row range in row order, fetching ``batch_size`` rows per
        round trip.  Yields ``(row, {qualifier: (version, value)})`` with the newest version
        below ``options.before`` of each cell.  Not a snapshot across rows."""

    # ------------------------------------------------------------------ writes

    @abc.abstractmethod
    def put(self, table: str, puts: Sequence[Put]) -> None:
        """Blind-write versions, batched in as few round trips as the store allows.

        Atomic per row *and version* only (see the module docstring): a caller that needs
        one cell stored before another puts them in separate calls, in that order.
        Idempotent.  Versions must be in ``[0, MAX_VERSION]``."""

    @abc.abstractmethod
    def compare_and_set(
        self,
        table: str,
        row: bytes,
        family: str,
        qualifier: bytes,
        expected: bytes | None,
        new: bytes,
    ) -> bool:
        """Atomically: if the newest version of the cell equals ``expected`` (``None``:
        absent or empty), write ``new`` as a new version stamped by the store, and return
        True; otherwise change nothing and return False.

        If the call raises :class:`StoreUnavailableError`, the write may or may not have
        happened: the caller must re-read, never blindly re-issue."""

    def compare_and_set_many(
        self, table: str, items: Sequence[CompareAndSet], puts: Sequence[Put] = ()
    ) -> list[bool]:
        """Each item's :meth:`compare_and_set`, in one call where the backend can: whether
        each applied, in the order of the items.  Each compare-and-set is atomic on its own;
        the call as a whole is **not** (another writer may see some applied and not others
        yet), and the items may run in any order (HBase runs them in parallel), so no two
        may name one cell (InvalidArgumentError).

        ``puts``: blind puts into the same table sent with the compare-and-sets (what
        :meth:`put` does with them), in **no order** relative to them: use it only for
        puts that may land before, after or between the compare-and-sets.  It saves a
        write transaction on the embedded store and a round trip of latency on HBase.

        The backends check every item, put (and the table) before anything is written.  If
        the call raises :class:`StoreUnavailableError`, every write of it has ended (none is
        still in flight from this call), but any compare-and-set may or may not have
        applied (the caller must re-read the cells, never blindly re-issue), and any put may
        or may not have landed (puts are idempotent: re-put them).

        This default puts first, then runs the compare-and-sets one after the other through
        :meth:`compare_and_set` (so it checks each item only as it comes to it, and refuses
        ``then_put``: see :attr:`conditional_puts`); the backends override it (memory: under
        one lock; embedded: one write transaction; HBase: parallel calls)."""
        if any(isinstance(c, CompareAndSet) and c.then_put for c in items):
            raise InvalidArgumentError(
                f"store {self.url} cannot put with a compare-and-set (conditional_puts is "
                "False): send the puts in calls of their own"
            )
        if puts:
            self.put(table, puts)
        return [
            self.compare_and_set(table, c.row, c.family, c.qualifier, c.expected, c.new)
            for c in items
        ]

    @abc.abstractmethod
    def delete_versions(self, table: str, deletes: Sequence[Delete]) -> None:
        """Delete every version at or below each delete's timestamp (batched).  The deletes
        also mask later puts at or below that timestamp (see the module docstring)."""

    @abc.abstractmethod
    def compact_deletes(self, table: str) -> int:
        """Forget the delete masks of ``table``, as HBase's major compaction drops its delete
        markers: afterwards a put at or below a deleted version is stored again.  The
        protocol never relies on a mask (see the module docstring), so this is safe at any
        time.  Returns how many masks were dropped.

        HBase: does nothing and returns 0; its region servers drop markers at their own
        major compactions (``hbase.hregion.majorcompaction``, 7 days by default), and an
        on-demand one rewrites every file of the table, too heavy for each GC pass."""

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:  # noqa: B027 - optional for backends holding nothing
        """Release connections.  Idempotent."""

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def split_cells(cells: object) -> tuple[list[bytes], list[Column]]:
    """The distinct rows and columns of :meth:`Store.read_cells`'s ``cells``, in order of
    appearance, each cell's address checked.  Raises InvalidArgumentError."""
    if isinstance(cells, (str, bytes)) or not isinstance(cells, Sequence):
        raise InvalidArgumentError(f"cells must be a sequence, got {type(cells).__name__}")
    rows: dict[bytes, None] = {}
    columns: dict[Column, None] = {}
    for cell in cells:
        if not (isinstance(cell, tuple) and len(cell) == 2 and isinstance(cell[1], tuple)):
            raise InvalidArgumentError(
                f"a cell must be a (row, (family, qualifier)) tuple, got {cell!r}"
            )
        row, column = cell
        if len(column) != 2:
            raise InvalidArgumentError(
                f"a column must be a (family, qualifier) tuple, got {column!r}"
            )
        check_cell_args(row, column[0], column[1])
        rows[row] = None
        columns[column] = None
    return list(rows), list(columns)


def cross_product_parts(
    cells: Sequence[tuple[bytes, Column]], limit: int
) -> list[tuple[list[bytes], list[Column]]]:
    """``cells`` (already checked) as parts of consecutive distinct rows, in order, each
    with the columns its rows name: a part's rows x columns is at most ``limit`` unless it
    is a single row (whose product is exactly its own cells).  Every row is in one part."""
    by_row: dict[bytes, dict[Column, None]] = {}
    for row, column in cells:
        by_row.setdefault(row, {})[column] = None
    parts: list[tuple[list[bytes], list[Column]]] = []
    part_rows: list[bytes] = []
    part_columns: dict[Column, None] = {}
    for row, row_columns in by_row.items():
        added = sum(1 for column in row_columns if column not in part_columns)
        if part_rows and (len(part_rows) + 1) * (len(part_columns) + added) > limit:
            parts.append((part_rows, list(part_columns)))
            part_rows, part_columns = [], {}
        part_rows.append(row)
        part_columns.update(row_columns)
    if part_rows:
        parts.append((part_rows, list(part_columns)))
    return parts


def check_cell_args(
    row: object, family: object, qualifier: object, families: Mapping[str, object] | None = None
) -> None:
    """Validate the address of one cell; raises InvalidArgumentError naming what is wrong."""
    # The common case in one test (this runs for every cell the protocol touches); the
    # branches below name what is wrong, and accept subclasses of bytes and str.
    if (
        type(row) is bytes
        and 0 < len(row) <= MAX_ROW_LENGTH
        and type(family) is str
        and family
        and type(qualifier) is bytes
        and (families is None or family in families)
    ):
        return
    if not isinstance(row, bytes):
        raise InvalidArgumentError(f"row must be bytes, got {type(row).__name__}: {row!r}")
    if not 0 < len(row) <= MAX_ROW_LENGTH:
        raise InvalidArgumentError(
            f"row key must be 1..{MAX_ROW_LENGTH} bytes, got {len(row)} bytes"
        )
    if not isinstance(family, str) or not family:
        raise InvalidArgumentError(f"family must be a non-empty str, got {family!r}")
    if not isinstance(qualifier, bytes):
        raise InvalidArgumentError(
            f"qualifier must be bytes, got {type(qualifier).__name__}: {qualifier!r}"
        )
    if families is not None and family not in families:
        raise InvalidArgumentError(f"unknown family {family!r}; known: {sorted(families)}")


def check_version(version: object) -> None:
    if type(version) is int and 0 <= version <= MAX_VERSION:
        return
    if not isinstance(version, int) or isinstance(version, bool):
        raise InvalidArgumentError(f"version must be an int, got {version!r}")
    if not 0 <= version <= MAX_VERSION:
        raise InvalidArgumentError(f"version {version} outside [0, {MAX_VERSION}]")


def check_value(value: object) -> None:
    if type(value) is bytes:
        return
    if not isinstance(value, bytes):
        raise InvalidArgumentError(f"value must be bytes, got {type(value).__name__}")

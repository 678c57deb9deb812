"""The ``memory:`` store: the reference backend, in process dictionaries under one lock.

It has exactly the semantics of HBase through Thrift-1 described in
:mod:`percolator.store.base` (that docstring is the contract), which makes it the backend of
fast unit tests:

* reads take an **exclusive** ``before`` bound, an inclusive ``min_version`` and
  ``max_versions``; a family keeps at most its ``max_versions`` newest versions of a cell
  (older ones are pruned when a put pushes them out);
* :meth:`MemoryStore.delete_versions` removes versions at or below a timestamp and leaves a
  *delete mask* on the cell: a later put at or below the masked timestamp is dropped, also a
  compare-and-set whose store-stamped version falls under it (HBase keeps its delete markers
  until a major compaction; this store keeps the mask **forever**, for as long as the table
  exists);
* :meth:`MemoryStore.compare_and_set` compares the newest version (``None`` or ``b""`` match an
  absent cell **or** an empty value, as HBase's ``checkAndPut`` does) and stamps the new
  version like HBase 2 does: ``max(store clock, version of the cell just compared)``.  The
  store clock is milliseconds that never go backwards.  So the written value is always the
  newest version of its cell, and a later compare-and-set of a cell is never older than an
  earlier one (two in the same millisecond share a version and the later value replaces
  the earlier, as in HBase).

Everything happens under one lock, so every call is atomic as a whole (more than the contract
promises; callers must not rely on that).  Nothing is durable.

``MemoryStore.named(NAME)`` (URL ``memory:NAME``) returns the same store for the same name
within a process, so several clients can share it; named stores live until the process ends.

The argument checks at the bottom (table names, family specs, read and scan arguments) are
shared with the embedded store so both reject exactly the same inputs with the same messages.
"""

from __future__ import annotations

import bisect
import re
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from percolator.errors import InvalidArgumentError, TableExistsError, TableNotFoundError
from percolator.store.base import (
    MAX_ROW_LENGTH,
    MAX_VERSION,
    Column,
    Delete,
    FamilySpec,
    Put,
    RowCells,
    ScanOptions,
    Store,
    Version,
    check_cell_args,
    check_value,
    check_version,
)

# ``before`` is exclusive, so the largest meaningful bound is one above the largest version.
MAX_BEFORE = MAX_VERSION + 1
# The default FamilySpec.max_versions (HBase's Integer.MAX_VALUE): "keep every version".
UNLIMITED_VERSIONS = 2**31 - 1


# A cell's versions, sorted newest first: parallel lists of negated versions (for bisect)
# and values.
@dataclass
class _Cell:
    neg_versions: list[int] = field(default_factory=list)
    values: list[bytes] = field(default_factory=list)

    def versions(self) -> list[Version]:
        return [(-nv, v) for nv, v in zip(self.neg_versions, self.values, strict=True)]


@dataclass
class _Family:
    spec: FamilySpec
    # row -> qualifier -> cell
    rows: dict[bytes, dict[bytes, _Cell]] = field(default_factory=dict)
    # every row of ``rows``, kept sorted (unsigned byte order) for scans
    sorted_rows: list[bytes] = field(default_factory=list)
    # (row, qualifier) -> highest deleted version: puts at or below it are dropped
    delete_masks: dict[tuple[bytes, bytes], int] = field(default_factory=dict)


@dataclass
class _Table:
    families: dict[str, _Family]


class MemoryStore(Store):
    """An in-process store with HBase's semantics.  Thread-safe; every call is atomic."""

    _registry: ClassVar[dict[str, MemoryStore]] = {}
    _registry_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, url: str = "memory:") -> None:
        super().__init__()
        self.url = url
        self._lock = threading.Lock()
        self._tables: dict[str, _Table] = {}
        self._last_stamp_ms = 0

    @classmethod
    def named(cls, name: str) -> MemoryStore:
        """The process-wide store called ``name``, created on first use."""
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError(f"memory store name must be a non-empty str, got {name!r}")
        with cls._registry_lock:
            store = cls._registry.get(name)
            if store is None:
                store = cls(url=f"memory:{name}")
                cls._registry[name] = store
            return store

    # ------------------------------------------------------------------ admin

    def create_table(self, name: str, families: Sequence[FamilySpec]) -> None:
        check_table_name(name)
        check_family_specs(families)
        with self._lock:
            self.stats.count("create_table")
            if name in self._tables:
                raise TableExistsError(name)
            self._tables[name] = _Table({spec.name: _Family(spec) for spec in families})

    def drop_table(self, name: str) -> None:
        check_table_name(name)
        with self._lock:
            self.stats.count("drop_table")
            if self._tables.pop(name, None) is None:
                raise TableNotFoundError(name)

    def list_tables(self) -> list[str]:
        with self._lock:
            self.stats.count("list_tables")
            return sorted(self._tables)

    def table_families(self, name: str) -> list[FamilySpec]:
        check_table_name(name)
        with self._lock:
            self.stats.count("table_families")
            return [family.spec for family in self._table(name).families.values()]

    # ------------------------------------------------------------------ reads

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
        check_table_name(table)
        with self._lock:
            self.stats.count("read_rows")
            tbl = self._table(table)
            check_read_args(
                rows, columns, families, before, min_version, max_versions, tbl.families
            )
            upper = MAX_BEFORE if before is None else before
            selection = selection_by_family(columns, families, tbl.families)
            result: dict[bytes, RowCells] = {}
            for row in rows:
                cells: RowCells = {}
                for family_name, qualifiers in selection:
                    row_cells = tbl.families[family_name].rows.get(row)
                    if not row_cells:
                        continue
                    wanted = sorted(row_cells) if qualifiers is None else qualifiers
                    for qualifier in wanted:
                        cell = row_cells.get(qualifier)
                        if cell is None:
                            continue
                        versions = _versions_in_range(cell, upper, min_version, max_versions)
                        if versions:
                            cells[(family_name, qualifier)] = versions
                if cells:
                    result[row] = cells
            return result

    def scan(
        self, table: str, family: str, options: ScanOptions | None = None
    ) -> Iterator[tuple[bytes, dict[bytes, Version]]]:
        check_table_name(table)
        opts = options if options is not None else ScanOptions()
        check_scan_options(opts)
        # Check the table and family now, not at the first next(): a bad scan should fail
        # where it is written.
        with self._lock:
            check_family_name(family, self._table(table).families)
        return self._scan(table, family, opts)

    def _scan(
        self, table: str, family: str, opts: ScanOptions
    ) -> Iterator[tuple[bytes, dict[bytes, Version]]]:
        upper = MAX_BEFORE if opts.before is None else opts.before
        qualifiers = None if opts.qualifiers is None else sorted(set(opts.qualifiers))
        remaining = opts.limit
        after: bytes | None = None  # last row returned: the next batch starts above it
        while remaining is None or remaining > 0:
            want = opts.batch_size if remaining is None else min(opts.batch_size, remaining)
            batch: list[tuple[bytes, dict[bytes, Version]]] = []
            exhausted = True
            # One batch is one "round trip": taken under the lock, yielded outside it.
            with self._lock:
                self.stats.count("scan")
                fam = self._table(table).families.get(family)
                if fam is None:  # the table was dropped and re-created meanwhile
                    raise InvalidArgumentError(f"table {table!r} has no family {family!r}")
                sorted_rows = fam.sorted_rows
                if after is None:
                    index = bisect.bisect_left(sorted_rows, opts.start)
                else:
                    index = bisect.bisect_right(sorted_rows, after)
                while index < len(sorted_rows):
                    row = sorted_rows[index]
                    index += 1
                    if opts.stop is not None and row >= opts.stop:
                        break
                    found: dict[bytes, Version] = {}
                    row_cells = fam.rows[row]
                    for qualifier in qualifiers if qualifiers is not None else sorted(row_cells):
                        cell = row_cells.get(qualifier)
                        if cell is None:
                            continue
                        versions = _versions_in_range(cell, upper, 0, 1)
                        if versions:
                            found[qualifier] = versions[0]
                    if found:
                        # Like a store round trip, look one row ahead to know whether
                        # another batch is needed.
                        if len(batch) == want:
                            exhausted = False
                            break
                        batch.append((row, found))
            yield from batch
            if batch:
                after = batch[-1][0]
            if remaining is not None:
                remaining -= len(batch)
            if exhausted:
                return

    # ------------------------------------------------------------------ writes

    def put(self, table: str, puts: Sequence[Put]) -> None:
        check_table_name(table)
        with self._lock:
            self.stats.count("put")
            tbl = self._table(table)
            # Check every put before applying any: a bad batch writes nothing.
            for put in check_sequence(puts, "puts"):
                check_put(put, tbl.families)
            for put in puts:
                self._apply_put(tbl, put.row, put.family, put.qualifier, put.version, put.value)

    def compare_and_set(
        self,
        table: str,
        row: bytes,
        family: str,
        qualifier: bytes,
        expected: bytes | None,
        new: bytes,
    ) -> bool:
        check_table_name(table)
        with self._lock:
            self.stats.count("compare_and_set")
            tbl = self._table(table)
            check_cell_args(row, family, qualifier, tbl.families)
            if expected is not None:
                check_value(expected)
            check_value(new)
            cell = tbl.families[family].rows.get(row, {}).get(qualifier)
            current = cell.values[0] if cell is not None and cell.values else None
            if not cas_matches(current, expected):
                return False
            # Stamped like HBase stamps checkAndPut: store time in milliseconds, but never
            # below the version just compared, so the written value is the newest (a version
            # equal to it is replaced).  A delete mask at or above the stamp hides the write,
            # exactly as an HBase delete marker would.
            stamp = self._stamp_ms()
            if cell is not None and cell.neg_versions:
                stamp = max(stamp, -cell.neg_versions[0])
            self._apply_put(tbl, row, family, qualifier, stamp, new)
            return True

    def delete_versions(self, table: str, deletes: Sequence[Delete]) -> None:
        check_table_name(table)
        with self._lock:
            self.stats.count("delete_versions")
            tbl = self._table(table)
            for delete in check_sequence(deletes, "deletes"):
                check_delete(delete, tbl.families)
            for delete in deletes:
                fam = tbl.families[delete.family]
                key = (delete.row, delete.qualifier)
                fam.delete_masks[key] = max(fam.delete_masks.get(key, -1), delete.at_or_below)
                row_cells = fam.rows.get(delete.row)
                cell = None if row_cells is None else row_cells.get(delete.qualifier)
                if row_cells is None or cell is None:
                    continue
                # Versions are newest first: keep those above the bound.
                keep = bisect.bisect_left(cell.neg_versions, -delete.at_or_below)
                del cell.neg_versions[keep:]
                del cell.values[keep:]
                if not cell.values:
                    del row_cells[delete.qualifier]
                    if not row_cells:
                        del fam.rows[delete.row]
                        fam.sorted_rows.pop(bisect.bisect_left(fam.sorted_rows, delete.row))

    # ------------------------------------------------------------------ internals

    def _table(self, name: str) -> _Table:
        tbl = self._tables.get(name)
        if tbl is None:
            raise TableNotFoundError(name)
        return tbl

    def _stamp_ms(self) -> int:
        """Store time in milliseconds, never below a stamp handed out before (lock held)."""
        self._last_stamp_ms = max(self._last_stamp_ms, time.time_ns() // 1_000_000)
        return self._last_stamp_ms

    @staticmethod
    def _apply_put(
        tbl: _Table, row: bytes, family: str, qualifier: bytes, version: int, value: bytes
    ) -> None:
        fam = tbl.families[family]
        if version <= fam.delete_masks.get((row, qualifier), -1):
            return  # masked by an earlier delete, as in HBase
        row_cells = fam.rows.get(row)
        if row_cells is None:
            row_cells = fam.rows[row] = {}
            bisect.insort(fam.sorted_rows, row)
        cell = row_cells.get(qualifier)
        if cell is None:
            cell = row_cells[qualifier] = _Cell()
        index = bisect.bisect_left(cell.neg_versions, -version)
        if index < len(cell.neg_versions) and cell.neg_versions[index] == -version:
            cell.values[index] = value  # same version again: the later write wins
        else:
            cell.neg_versions.insert(index, -version)
            cell.values.insert(index, value)
        # A family keeps its max_versions newest versions; an older put may fall out at once.
        excess = len(cell.values) - fam.spec.max_versions
        if excess > 0:
            del cell.neg_versions[-excess:]
            del cell.values[-excess:]


def _versions_in_range(
    cell: _Cell, before: int, min_version: int, max_versions: int
) -> list[Version]:
    """The newest ``max_versions`` versions with ``min_version <= version < before``."""
    start = bisect.bisect_right(cell.neg_versions, -before)  # first version < before
    out: list[Version] = []
    for index in range(start, min(start + max_versions, len(cell.values))):
        version = -cell.neg_versions[index]
        if version < min_version:
            break
        out.append((version, cell.values[index]))
    return out


# --------------------------------------------------------------------------- shared checks

_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\Z")
MAX_TABLE_NAME_LENGTH = 200


def check_table_name(name: object) -> None:
    """Table names are portable HBase table qualifiers: ``[A-Za-z0-9_][A-Za-z0-9_.-]*``."""
    if not isinstance(name, str) or not name:
        raise InvalidArgumentError(f"table name must be a non-empty str, got {name!r}")
    if len(name) > MAX_TABLE_NAME_LENGTH or not _NAME_RE.match(name):
        raise InvalidArgumentError(
            f"table name {name!r} is not valid: use at most {MAX_TABLE_NAME_LENGTH} of "
            "A-Z a-z 0-9 _ . - and do not start with . or -"
        )


def check_family_specs(families: object) -> None:
    """A table needs at least one family; names unique and portable, options well typed."""
    if isinstance(families, (str, bytes)) or not isinstance(families, Sequence) or not families:
        raise InvalidArgumentError(
            f"families must be a non-empty sequence of FamilySpec, got {families!r}"
        )
    seen: set[str] = set()
    for spec in families:
        if not isinstance(spec, FamilySpec):
            raise InvalidArgumentError(f"families must hold FamilySpec, got {spec!r}")
        if not isinstance(spec.name, str) or not _NAME_RE.match(spec.name):
            raise InvalidArgumentError(
                f"family name {spec.name!r} is not valid: use A-Z a-z 0-9 _ . - "
                "and do not start with . or -"
            )
        if spec.name in seen:
            raise InvalidArgumentError(f"family {spec.name!r} is listed twice")
        seen.add(spec.name)
        mv = spec.max_versions
        if not isinstance(mv, int) or isinstance(mv, bool) or not 1 <= mv <= UNLIMITED_VERSIONS:
            raise InvalidArgumentError(
                f"family {spec.name!r}: max_versions must be an int in "
                f"[1, {UNLIMITED_VERSIONS}], got {mv!r}"
            )
        for option in ("in_memory", "block_cache"):
            if not isinstance(getattr(spec, option), bool):
                raise InvalidArgumentError(
                    f"family {spec.name!r}: {option} must be a bool, got {getattr(spec, option)!r}"
                )


def check_family_name(family: object, table_families: Mapping[str, object]) -> None:
    if not isinstance(family, str) or not family:
        raise InvalidArgumentError(f"family must be a non-empty str, got {family!r}")
    if family not in table_families:
        raise InvalidArgumentError(f"unknown family {family!r}; known: {sorted(table_families)}")


def check_row(row: object) -> None:
    if not isinstance(row, bytes):
        raise InvalidArgumentError(f"row must be bytes, got {type(row).__name__}: {row!r}")
    if not 0 < len(row) <= MAX_ROW_LENGTH:
        raise InvalidArgumentError(
            f"row key must be 1..{MAX_ROW_LENGTH} bytes, got {len(row)} bytes"
        )


def _check_int(name: str, value: object, low: int, high: int | None) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidArgumentError(f"{name} must be an int, got {value!r}")
    if value < low or (high is not None and value > high):
        bound = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise InvalidArgumentError(f"{name} must be {bound}, got {value}")


def check_sequence(items: object, what: str) -> Sequence[object]:
    if isinstance(items, (str, bytes)) or not isinstance(items, Sequence):
        raise InvalidArgumentError(f"{what} must be a sequence, got {type(items).__name__}")
    return items


def check_read_args(
    rows: object,
    columns: object,
    families: object,
    before: object,
    min_version: object,
    max_versions: object,
    table_families: Mapping[str, object],
) -> None:
    """The checks of :meth:`Store.read_rows`, identical on every local backend."""
    for row in check_sequence(rows, "rows"):
        check_row(row)
    if columns is not None:
        for column in check_sequence(columns, "columns"):
            if not isinstance(column, tuple) or len(column) != 2:
                raise InvalidArgumentError(
                    f"a column must be a (family, qualifier) tuple, got {column!r}"
                )
            check_family_name(column[0], table_families)
            if not isinstance(column[1], bytes):
                raise InvalidArgumentError(
                    f"qualifier must be bytes, got {type(column[1]).__name__}: {column[1]!r}"
                )
    if families is not None:
        for family in check_sequence(families, "families"):
            check_family_name(family, table_families)
    if before is not None:
        _check_int("before", before, 0, MAX_BEFORE)
    _check_int("min_version", min_version, 0, MAX_VERSION)
    _check_int("max_versions", max_versions, 1, None)
    if max_versions != 1 and (columns is None or families):
        raise InvalidArgumentError(
            f"reading max_versions={max_versions} needs explicit columns and no whole "
            "families (a multi-version read cannot name the qualifiers of a whole family)"
        )


def check_scan_options(opts: object) -> None:
    if not isinstance(opts, ScanOptions):
        raise InvalidArgumentError(f"options must be a ScanOptions, got {opts!r}")
    if not isinstance(opts.start, bytes):
        raise InvalidArgumentError(f"scan start must be bytes, got {opts.start!r}")
    if opts.stop is not None and not isinstance(opts.stop, bytes):
        raise InvalidArgumentError(f"scan stop must be bytes or None, got {opts.stop!r}")
    if opts.qualifiers is not None:
        for qualifier in check_sequence(opts.qualifiers, "scan qualifiers"):
            if not isinstance(qualifier, bytes):
                raise InvalidArgumentError(f"scan qualifiers must be bytes, got {qualifier!r}")
    if opts.before is not None:
        _check_int("scan before", opts.before, 0, MAX_BEFORE)
    _check_int("scan batch_size", opts.batch_size, 1, None)
    if opts.limit is not None:
        _check_int("scan limit", opts.limit, 0, None)


def check_put(put: object, table_families: Mapping[str, object]) -> None:
    if not isinstance(put, Put):
        raise InvalidArgumentError(f"puts must hold Put, got {put!r}")
    check_cell_args(put.row, put.family, put.qualifier, table_families)
    check_version(put.version)
    check_value(put.value)


def check_delete(delete: object, table_families: Mapping[str, object]) -> None:
    if not isinstance(delete, Delete):
        raise InvalidArgumentError(f"deletes must hold Delete, got {delete!r}")
    check_cell_args(delete.row, delete.family, delete.qualifier, table_families)
    check_version(delete.at_or_below)


def cas_matches(current: bytes | None, expected: bytes | None) -> bool:
    """HBase's checkAndPut comparison: an absent or empty ``expected`` matches a cell that is
    absent or holds the empty value; anything else must equal the newest value exactly."""
    if not expected:
        return not current
    return current == expected


def selection_by_family(
    columns: Sequence[Column] | None,
    families: Sequence[str] | None,
    table_families: Mapping[str, object],
) -> list[tuple[str, list[bytes] | None]]:
    """What a read selects, as ``(family, sorted qualifiers or None for the whole family)``
    in the table's family order.  Both ``None`` selects every family; an empty sequence
    selects nothing; a whole family wins over single columns of it."""
    if columns is None and families is None:
        return [(name, None) for name in table_families]
    whole = set(families or ())
    quals: dict[str, set[bytes]] = {}
    for family, qualifier in columns or ():
        if family not in whole:
            quals.setdefault(family, set()).add(qualifier)
    out: list[tuple[str, list[bytes] | None]] = []
    for name in table_families:
        if name in whole:
            out.append((name, None))
        elif name in quals:
            out.append((name, sorted(quals[name])))
    return out

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
  until a major compaction; this store keeps the mask until
  :meth:`MemoryStore.compact_deletes`, which garbage collection calls after each pass);
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
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from percolator.errors import InvalidArgumentError, TableExistsError, TableNotFoundError
from percolator.store.base import (
    Column,
    CompareAndSet,
    Delete,
    FamilySpec,
    Put,
    RowCells,
    ScanOptions,
    Store,
    Version,
    split_cells,
)
from percolator.store.checks import (
    MAX_BEFORE,
    cas_matches,
    check_compare_and_set,
    check_compare_and_sets,
    check_delete,
    check_family_name,
    check_family_specs,
    check_put,
    check_read_args,
    check_scan_options,
    check_sequence,
    check_table_name,
    selection_by_family,
    value_in_ranges,
)


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

    put_is_atomic = True
    conditional_puts = True
    calls_run_in_parallel = False

    _registry: ClassVar[dict[str, MemoryStore]] = {}
    _registry_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, url: str = "memory:") -> None:
        super().__init__()
        self.url = url
        self._lock = threading.Lock()
        self._tables: dict[str, _Table] = {}
        self._last_stamp_ms = 0

    @classmethod
    def exists(cls, name: str) -> bool:
        """Whether the process-wide store ``name`` was already created (an unnamed store
        never exists beforehand)."""
        with cls._registry_lock:
            return bool(name) and name in cls._registry

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

    def read_cells(
        self,
        table: str,
        cells: Sequence[tuple[bytes, Column]],
        *,
        before: int | None = None,
    ) -> dict[bytes, RowCells]:
        check_table_name(table)
        rows, columns = split_cells(cells)
        if not rows:
            return {}
        with self._lock:
            self.stats.count("read_rows")
            tbl = self._table(table)
            check_read_args(rows, columns, None, before, 0, 1, tbl.families)
            upper = MAX_BEFORE if before is None else before
            result: dict[bytes, RowCells] = {}
            for row, (family_name, qualifier) in cells:
                cell = tbl.families[family_name].rows.get(row, {}).get(qualifier)
                if cell is None:
                    continue
                versions = _versions_in_range(cell, upper, 0, 1)
                if versions:
                    result.setdefault(row, {})[(family_name, qualifier)] = versions
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
                        if opts.value_ranges is None:
                            versions = _versions_in_range(cell, upper, 0, 1)
                        else:
                            # The filter applies to each version before the newest is
                            # chosen (HBase's ValueFilter does the same).
                            versions = [
                                version
                                for version in _versions_in_range(cell, upper, 0, len(cell.values))
                                if value_in_ranges(version[1], opts.value_ranges)
                            ][:1]
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
            self._put(self._table(table), puts)

    def _put(self, tbl: _Table, puts: Sequence[Put]) -> None:
        """The puts of one call, under the lock: every one checked before any is applied,
        so a bad batch writes nothing."""
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
            item = CompareAndSet(row, family, qualifier, expected, new)
            check_compare_and_set(item, tbl.families)
            return self._compare_and_set(tbl, item)

    def compare_and_set_many(
        self, table: str, items: Sequence[CompareAndSet], puts: Sequence[Put] = ()
    ) -> list[bool]:
        check_table_name(table)
        with self._lock:
            tbl = self._table(table)
            check_compare_and_sets(items, tbl.families, conditional_puts=True)
            # _put checks the puts before applying any: a bad put raises before anything
            # of the call is written (the compare-and-sets come after it).
            self.stats.count("compare_and_set_many")
            self.stats.count("compare_and_set", len(items))
            self._put(tbl, puts)
            return [self._compare_and_set(tbl, item) for item in items]

    def _compare_and_set(self, tbl: _Table, item: CompareAndSet) -> bool:
        """One checked compare-and-set, under the lock."""
        cell = tbl.families[item.family].rows.get(item.row, {}).get(item.qualifier)
        current = cell.values[0] if cell is not None and cell.values else None
        if not cas_matches(current, item.expected):
            return False
        # Stamped like HBase stamps checkAndPut: store time in milliseconds, but never
        # below the version just compared, so the written value is the newest (a version
        # equal to it is replaced).  A delete mask at or above the stamp hides the write,
        # exactly as an HBase delete marker would.
        stamp = self._stamp_ms()
        if cell is not None and cell.neg_versions:
            stamp = max(stamp, -cell.neg_versions[0])
        self._apply_put(tbl, item.row, item.family, item.qualifier, stamp, item.new)
        for put in item.then_put:  # checked with the item
            self._apply_put(tbl, put.row, put.family, put.qualifier, put.version, put.value)
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

    def compact_deletes(self, table: str) -> int:
        check_table_name(table)
        with self._lock:
            self.stats.count("compact_deletes")
            dropped = 0
            for fam in self._table(table).families.values():
                dropped += len(fam.delete_masks)
                fam.delete_masks.clear()
            return dropped

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

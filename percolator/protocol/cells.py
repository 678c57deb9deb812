"""Addresses and raw state of user cells, shared by every protocol step.

:func:`fetch_cells` is the one place that turns a set of user cells into store reads; every
step reads through it, so "one round trip per table" (per :data:`CELLS_PER_READ` cells)
holds everywhere.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from percolator.layout import DATA, LOCK, WRITE
from percolator.records import CommitInfo, Kind, LockCell, WriteRecord
from percolator.store.base import Put, RowCells, Store

#: The most cells the protocol names in one store read.  A read is a consistent snapshot
#: of each row, but the protocol needs that only per cell (its lock cell, write record and
#: data together, which stay in one read): a read of more cells is split, so that a row of
#: an index with a column per document is not asked of the store (and of HBase's Thrift
#: gateway, which holds a whole answer in its heap) in one piece.
CELLS_PER_READ = 30_000


@dataclass(frozen=True, order=True)
class CellKey:
    """One user cell.  ``column`` is the user's column name (qualifier = its UTF-8)."""

    table: str
    row: bytes
    column: str
    # Derived once: a transaction hashes each key and encodes its qualifier many times.
    qualifier: bytes = field(init=False, repr=False, compare=False)
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "qualifier", self.column.encode("utf-8"))
        object.__setattr__(self, "_hash", hash((self.table, self.row, self.column)))

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple[type[CellKey], tuple[str, bytes, str]]:
        # Rebuilt from its fields: the cached hash of str is valid in this process only.
        return (CellKey, (self.table, self.row, self.column))

    def __str__(self) -> str:
        return f"{self.table}/{self.row!r}/{self.column}"


@dataclass(frozen=True)
class Mutation:
    """A buffered write: PUT with a value, or DELETE."""

    key: CellKey
    kind: Kind
    value: bytes = b""


@dataclass(frozen=True)
class RawCell:
    """What one Get returned for a user cell.

    ``lock_bytes`` are the exact bytes of the lock cell (the expected value of any later
    compare-and-set); ``write`` is the newest write record in the read's range as
    ``(commit_ts, record)``; ``data`` the newest data version in range as ``(start_ts, value)``.
    """

    key: CellKey
    lock_bytes: bytes | None
    lock_cell: LockCell
    write: tuple[int, WriteRecord] | None
    data: tuple[int, bytes] | None

    def latest_commit(self, read_ts: int | None = None) -> CommitInfo | None:
        """The newest commit visible at ``read_ts`` (``None``: the newest at all).

        The lock cell always knows the latest commit of the cell; the write record covers
        older commits (the protocol writes a commit's write record before the lock cell can
        forget it), so the newer of the two, if it is not above ``read_ts``, is the answer.
        """
        candidates: list[CommitInfo] = []
        last = self.lock_cell.last_commit
        if last is not None and (read_ts is None or last.commit_ts <= read_ts):
            candidates.append(last)
        if self.write is not None:
            commit_ts, record = self.write
            if read_ts is None or commit_ts <= read_ts:
                candidates.append(CommitInfo(commit_ts, record.start_ts, record.kind))
        if not candidates:
            return None
        return max(candidates, key=lambda c: c.commit_ts)


def group_by_table(keys: Iterable[CellKey]) -> dict[str, list[CellKey]]:
    groups: dict[str, list[CellKey]] = defaultdict(list)
    for key in keys:
        groups[key.table].append(key)
    return groups


def absent_cell(key: CellKey) -> RawCell:
    """The state of a cell never written (no lock cell, no history), as a read finds it."""
    return RawCell(key, None, LockCell.decode(None), None, None)


def fetch_cells(
    store: Store,
    keys: Sequence[CellKey],
    *,
    before: int | None,
    with_data: bool = True,
) -> dict[CellKey, RawCell]:
    """Read lock cell, newest write record and (optionally) newest data version of each
    cell, below ``before`` (exclusive), in one store round trip per table (per
    :data:`CELLS_PER_READ` cells of a table: each cell's own cells are always read together).

    The lock cell is stamped with store time (milliseconds), which is always far below any
    hybrid timestamp, so it is always inside the range.
    """
    result: dict[CellKey, RawCell] = {}
    families = (LOCK, WRITE, DATA) if with_data else (LOCK, WRITE)
    per_read = max(1, CELLS_PER_READ // len(families))
    for table, all_keys in group_by_table(keys).items():
        for table_keys in in_parts(all_keys, per_read):
            # Exactly these cells, not every column of every row: a transaction writing a
            # different column in each of many rows reads as many cells as it writes.
            wanted = [
                (key.row, (family, key.qualifier)) for key in table_keys for family in families
            ]
            fetched = store.read_cells(table, wanted, before=before)
            _decode_fetched(table_keys, fetched, result)
    return result


def in_parts(keys: Sequence[CellKey], size: int) -> Iterator[Sequence[CellKey]]:
    """``keys`` in order, in consecutive parts of at most ``size`` (one store read each)."""
    for first in range(0, len(keys), size):
        yield keys[first : first + size]


def _decode_fetched(
    table_keys: Sequence[CellKey], fetched: Mapping[bytes, RowCells], result: dict[CellKey, RawCell]
) -> None:
    """The :class:`RawCell` of each of ``table_keys`` from one read's answer, into ``result``."""
    for key in table_keys:
        cells = fetched.get(key.row, {})
        q = key.qualifier
        lock_versions = cells.get((LOCK, q))
        lock_bytes = lock_versions[0][1] if lock_versions else None
        write_versions = cells.get((WRITE, q))
        write = None
        if write_versions:
            write = (write_versions[0][0], WriteRecord.decode(write_versions[0][1]))
        data_versions = cells.get((DATA, q))
        data = data_versions[0] if data_versions else None
        result[key] = RawCell(key, lock_bytes, LockCell.decode(lock_bytes), write, data)


def put_by_table(store: Store, by_table: Mapping[str, Sequence[Put]]) -> None:
    """Each table's blind puts in one :meth:`Store.put` (tables without puts skipped), in
    the order of the mapping.  Idempotent, like the puts."""
    for table, puts in by_table.items():
        if puts:
            store.put(table, puts)

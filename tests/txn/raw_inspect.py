"""Judge transactions from the raw store, independently of the engine's read path.

Everything here reads the store's families directly (``l`` lock cells, ``w`` write records,
``d`` data versions) and decodes them with :mod:`percolator.records` only.  It never calls
the engine's read, resolve or commit code, so a bug there cannot hide itself from these
checks.

What counts as committed
------------------------
A transaction ``start_ts`` is committed on a cell when the cell's write history holds a
record pointing at ``start_ts``, **or** the cell's lock cell names it as its latest commit
(the primary's commit point writes only the lock cell; its write record may come later).

Marker values
-------------
The crash tests write, to every cell of one transaction, a value built by
:func:`encode_value`: a unique marker, the number of cells the transaction writes, its
``start_ts`` and a payload (a balance for account cells).  So the stored data alone tells,
for every transaction, how many cells it meant to write and whether all or none of them
committed; no report of the client is needed.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from percolator.layout import DATA, LOCK, WRITE, is_commit_index
from percolator.records import CommitInfo, Kind, LockCell, WriteRecord
from percolator.store.base import Store

# How many versions of one cell the inspection reads at most; the tests write far fewer.
MAX_VERSIONS = 1_000_000

# Engine tables (the oracle record, the safe point) are not user tables.
SYSTEM_PREFIX = "percolator_"


# --------------------------------------------------------------------------- marker values


@dataclass(frozen=True)
class Marked:
    """A decoded marker value: written by transaction ``marker`` (at ``start_ts``), which
    writes ``n_cells`` cells in all; ``payload`` is the cell's own content."""

    marker: str
    n_cells: int
    start_ts: int
    payload: str


def encode_value(marker: str, n_cells: int, start_ts: int, payload: str = "") -> bytes:
    """The value a crash-test transaction writes to each of its cells."""
    if "|" in marker:
        raise ValueError(f"marker {marker!r} must not contain '|'")
    return f"M|{marker}|{n_cells}|{start_ts}|{payload}".encode()


def decode_value(value: bytes) -> Marked:
    """Inverse of :func:`encode_value`; raises ValueError for anything else."""
    parts = value.decode().split("|", 4)
    if len(parts) != 5 or parts[0] != "M":
        raise ValueError(f"not a marker value: {value!r}")
    return Marked(parts[1], int(parts[2]), int(parts[3]), parts[4])


# --------------------------------------------------------------------------- raw cells


@dataclass(frozen=True)
class RawHistory:
    """Everything the store holds for one user cell, newest versions first."""

    table: str
    row: bytes
    column: str
    lock_bytes: bytes | None
    lock_cell: LockCell
    writes: tuple[tuple[int, WriteRecord], ...]
    data: tuple[tuple[int, bytes], ...]

    @property
    def address(self) -> tuple[str, bytes, str]:
        return (self.table, self.row, self.column)

    def commits(self) -> dict[int, int]:
        """``start_ts -> commit_ts`` of every commit this cell records (history + lock cell)."""
        found: dict[int, int] = {}
        for commit_ts, record in self.writes:
            if found.setdefault(record.start_ts, commit_ts) != commit_ts:
                raise AssertionError(
                    f"{self.address}: two write records for start_ts {record.start_ts} "
                    f"(at {found[record.start_ts]} and {commit_ts})"
                )
        last = self.lock_cell.last_commit
        if last is not None and found.setdefault(last.start_ts, last.commit_ts) != last.commit_ts:
            raise AssertionError(
                f"{self.address}: the lock cell commits start_ts {last.start_ts} at "
                f"{last.commit_ts}, its write record at {found[last.start_ts]}"
            )
        return found

    def latest_commit(self, read_ts: int | None = None) -> CommitInfo | None:
        """The newest commit at or below ``read_ts`` (``None``: the newest at all)."""
        candidates = [
            CommitInfo(commit_ts, record.start_ts, record.kind)
            for commit_ts, record in self.writes
            if read_ts is None or commit_ts <= read_ts
        ]
        last = self.lock_cell.last_commit
        if last is not None and (read_ts is None or last.commit_ts <= read_ts):
            candidates.append(last)
        return max(candidates, key=lambda c: c.commit_ts, default=None)

    def data_at(self, start_ts: int) -> bytes | None:
        for version, value in self.data:
            if version == start_ts:
                return value
        return None

    def visible_value(self, read_ts: int | None = None) -> bytes | None:
        """The value a correct snapshot read at ``read_ts`` returns, computed from raw data.

        Raises AssertionError if a commit points at a data version that is not there."""
        commit = self.latest_commit(read_ts)
        if commit is None or commit.kind == Kind.DELETE:
            return None
        value = self.data_at(commit.start_ts)
        if value is None:
            raise AssertionError(
                f"{self.table}/{self.row!r}/{self.column}: commit at {commit.commit_ts} "
                f"points at data version {commit.start_ts}, which is missing"
            )
        return value


def _discover(store: Store, table: str) -> dict[bytes, set[bytes]]:
    """Every (row, qualifier) with any version in the d, w or l family of ``table``."""
    cells: dict[bytes, set[bytes]] = {}
    for family in (DATA, WRITE, LOCK):
        for row, qualifiers in store.scan(table, family):
            # Commit-index entries (protocol/commit.py) live beside the write records.
            user = {q for q in qualifiers if not is_commit_index(q)}
            cells.setdefault(row, set()).update(user)
    return cells


def read_table(store: Store, table: str) -> list[RawHistory]:
    """The full raw history of every cell of ``table``, in row/column order."""
    histories: list[RawHistory] = []
    for row, qualifiers in sorted(_discover(store, table).items()):
        for qualifier in sorted(qualifiers):
            columns = [(LOCK, qualifier), (WRITE, qualifier), (DATA, qualifier)]
            cells = store.read_row(table, row, columns=columns, max_versions=MAX_VERSIONS)
            lock_versions = cells.get((LOCK, qualifier), [])
            lock_bytes = lock_versions[0][1] if lock_versions else None
            writes = tuple(
                (ts, WriteRecord.decode(value)) for ts, value in cells.get((WRITE, qualifier), [])
            )
            histories.append(
                RawHistory(
                    table,
                    row,
                    qualifier.decode("utf-8"),
                    lock_bytes,
                    LockCell.decode(lock_bytes),
                    writes,
                    tuple(cells.get((DATA, qualifier), [])),
                )
            )
    return histories


def user_tables(store: Store) -> list[str]:
    return [t for t in store.list_tables() if not t.startswith(SYSTEM_PREFIX)]


def read_all(store: Store, tables: Iterable[str] | None = None) -> list[RawHistory]:
    """:func:`read_table` over ``tables`` (default: every user table)."""
    names = user_tables(store) if tables is None else list(tables)
    return [h for table in names for h in read_table(store, table)]


def locked_cells(histories: Iterable[RawHistory]) -> list[RawHistory]:
    """Cells whose lock cell holds a lock."""
    return [h for h in histories if h.lock_cell.lock is not None]


# --------------------------------------------------------------------------- transactions


COMMITTED = "committed"
ROLLED_BACK = "rolled_back"  # nothing committed, nothing locked
LOCKED = "locked"  # some cell still holds its lock: undecided as far as raw data goes
PARTIAL = "partial"  # some cells committed, others not, none locked: atomicity broken
CONTRADICTED = "contradicted"  # committed somewhere, yet a lock cell marks it rolled back


@dataclass
class TxnView:
    """One transaction (``start_ts``) as the raw store shows it."""

    start_ts: int
    marker: str | None = None
    n_cells: int | None = None  # from the marker values: the cells it meant to write
    written: set[tuple[str, bytes, str]] = field(default_factory=set)  # has data version
    committed: dict[tuple[str, bytes, str], int] = field(default_factory=dict)
    locked: set[tuple[str, bytes, str]] = field(default_factory=set)
    # Cells whose lock cell carries this transaction's rollback marker.
    rollback_marked: set[tuple[str, bytes, str]] = field(default_factory=set)

    @property
    def outcome(self) -> str:
        if self.committed and self.rollback_marked:
            return CONTRADICTED
        if self.locked:
            return LOCKED
        if not self.committed:
            return ROLLED_BACK
        complete = len(self.committed) == self.n_cells and set(self.committed) == self.written
        if complete and len(set(self.committed.values())) == 1:
            return COMMITTED
        return PARTIAL

    @property
    def commit_ts(self) -> int | None:
        values = set(self.committed.values())
        return values.pop() if len(values) == 1 else None

    def describe(self) -> str:
        return (
            f"transaction {self.start_ts} (marker {self.marker}): {self.outcome}; "
            f"{len(self.written)} data versions of {self.n_cells} cells, "
            f"committed on {sorted(self.committed)}, locked on {sorted(self.locked)}, "
            f"marked rolled back on {sorted(self.rollback_marked)}"
        )


def transactions(histories: Sequence[RawHistory]) -> dict[int, TxnView]:
    """Every transaction that left marker data, a commit or a lock, by ``start_ts``.

    Marker values must be consistent: a data version at ``start_ts`` must carry that same
    ``start_ts``, and every cell of one transaction the same marker and cell count
    (AssertionError otherwise)."""
    views: dict[int, TxnView] = {}

    def view(start_ts: int) -> TxnView:
        return views.setdefault(start_ts, TxnView(start_ts))

    for h in histories:
        for version, value in h.data:
            marked = decode_value(value)
            if marked.start_ts != version:
                raise AssertionError(
                    f"{h.address}: data version {version} carries start_ts {marked.start_ts}"
                )
            v = view(version)
            if v.marker is None:
                v.marker, v.n_cells = marked.marker, marked.n_cells
            elif (v.marker, v.n_cells) != (marked.marker, marked.n_cells):
                raise AssertionError(
                    f"transaction {version} wrote two markers: {v.marker}/{v.n_cells} and "
                    f"{marked.marker}/{marked.n_cells}"
                )
            v.written.add(h.address)
        for start_ts, commit_ts in h.commits().items():
            view(start_ts).committed[h.address] = commit_ts
        lock = h.lock_cell.lock
        if lock is not None:
            view(lock.start_ts).locked.add(h.address)
        if h.lock_cell.rolled_back:
            view(h.lock_cell.rolled_back).rollback_marked.add(h.address)
    return views


def check_all_or_nothing(views: dict[int, TxnView]) -> list[str]:
    """Descriptions of every transaction that is partially committed, contradicted or still
    locked."""
    return [v.describe() for v in views.values() if v.outcome in (PARTIAL, LOCKED, CONTRADICTED)]

"""Transactions and read-only snapshots: the objects users program against.

A :class:`Transaction` is a small status machine::

    ACTIVE --commit()--> COMMITTING --> COMMITTED
       |                      |------> ROLLED_BACK   (conflict or rolled back by others)
       |                      '------> UNDETERMINED  (commit point outcome unknown)
       '--rollback()--> ROLLED_BACK

Reads happen at ``start_ts`` and see the transaction's own buffered writes.  A snapshot never
changes, so each cell is read from the store once per transaction or snapshot (later reads
of it are answered from memory), and :meth:`Snapshot.prefetch` reads many cells in one round
trip per table.  Writes are
buffered in memory until :meth:`Transaction.commit`, which runs two-phase commit
(percolator/committer.py).  Mutating methods refuse every state but ACTIVE, and every
argument is validated at the call, before anything is written.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Iterable, Iterator, Sequence

from percolator.committer import Committer
from percolator.context import EngineContext
from percolator.errors import (
    InvalidArgumentError,
    StoreError,
    StoreUnavailableError,
    TransactionStateError,
    UndeterminedCommitError,
)
from percolator.layout import (
    LOCK,
    RESERVED_PREFIX,
    check_value,
    decode_column,
    encode_column,
    encode_row,
    name_list,
)
from percolator.protocol.cells import CellKey, Mutation, RawCell
from percolator.protocol.read import read_commits
from percolator.records import CommitInfo, Kind
from percolator.store.base import ScanOptions

# How many raw cell states a transaction keeps from its reads for its prewrite.
MAX_SEEN = 10_000


class TxnStatus(enum.Enum):
    ACTIVE = "active"
    COMMITTING = "committing"
    COMMITTED = "committed"
    ROLLED_BACK = "rolled_back"
    UNDETERMINED = "undetermined"


class Snapshot:
    """Read-only view at one timestamp.  Takes no locks and writes nothing (except when it
    resolves locks of finished transactions, which any reader may do)."""

    def __init__(self, ctx: EngineContext, read_ts: int) -> None:
        self._ctx = ctx
        self.start_ts = read_ts
        # Registered before the first read, released by close()/commit/rollback or when
        # this object is garbage-collected (percolator/readers.py: the reader contract).
        self._release = ctx.readers.register(self, read_ts)

    @property
    def read_ts(self) -> int:
        return self.start_ts

    def _key(self, table: str, row: bytes | str, column: str, *, reserved: bool) -> CellKey:
        self._ctx.check_table(table)
        encode_column(column, allow_reserved=reserved)
        return CellKey(table, encode_row(row), column)

    #: raw states read so far, handed to the prewrite (None: a read-only snapshot keeps none)
    _seen: dict[CellKey, RawCell] | None = None

    def _seen_sink(self) -> dict[CellKey, RawCell] | None:
        # Bounded, so a transaction scanning a huge range does not hold every cell it saw;
        # beyond the bound the prewrite simply reads cells itself.
        if self._seen is not None and len(self._seen) < MAX_SEEN:
            return self._seen
        return None

    #: answers already read at this snapshot, key -> (value, commit); a snapshot is
    #: immutable, so a cell read twice is read from the store once (bounded like ``_seen``)
    _answers: dict[CellKey, tuple[bytes | None, CommitInfo | None]] | None = None

    def _read_commits(
        self, keys: Sequence[CellKey]
    ) -> dict[CellKey, tuple[bytes | None, CommitInfo | None]]:
        """Each key's committed value and commit as of this snapshot: from the answers
        already read, the others in one read (one store round trip per table when no lock
        is in the way)."""
        if self._answers is None:
            self._answers = {}
        answers = self._answers
        missing = [key for key in keys if key not in answers]
        if missing:
            ctx = self._ctx
            try:
                found = read_commits(
                    ctx.store,
                    ctx.resolver,
                    missing,
                    self.start_ts,
                    lock_wait_ms=ctx.options.lock_wait_ms,
                    seen=self._seen_sink(),
                )
            except StoreError as exc:
                if not isinstance(exc, StoreUnavailableError):
                    # Data a commit points at is missing: below the safe point, GC took it
                    # from under this reader (SafePointError: retry at a new snapshot),
                    # which is not the damaged store the error would otherwise report.
                    ctx.readers.check_stored(self.start_ts)
                raise
            if len(answers) < MAX_SEEN:
                answers.update(found)
        else:
            found = {}
        # After the read, not before: if garbage collection removed versions under it, the
        # safe point it stored first is what this check sees (percolator/readers.py).
        self._ctx.readers.check(self.start_ts)
        return {key: found[key] if key in found else answers[key] for key in keys}

    def _read(self, keys: Sequence[CellKey]) -> dict[CellKey, bytes | None]:
        return {key: value for key, (value, _) in self._read_commits(keys).items()}

    def prefetch(self, cells: Iterable[tuple[str, bytes | str, str]]) -> None:
        """Read ``(table, row, column)`` cells now, together (one store round trip per
        table when no lock is in the way), so that later reads of them at this snapshot
        cost no round trip."""
        self._check_usable()
        self._read_commits([self._key(t, r, c, reserved=self._allow_reserved) for t, r, c in cells])

    def get(self, table: str, row: bytes | str, column: str) -> bytes | None:
        """The value of one cell (``None`` if absent).  One store round trip when no lock
        is in the way."""
        self._check_usable()
        key = self._key(table, row, column, reserved=self._allow_reserved)
        return self._read([key])[key]

    def get_with_commit_ts(
        self, table: str, row: bytes | str, column: str
    ) -> tuple[bytes | None, int | None]:
        """The committed value of one cell as of this snapshot and the ``commit_ts`` that
        wrote it (``None`` if never written; a delete gives ``(None, commit_ts)``).  Ignores
        a transaction's own buffered writes: it answers "which commit is visible"."""
        self._check_usable()
        key = self._key(table, row, column, reserved=self._allow_reserved)
        value, commit = self._read_commits([key])[key]
        return value, (commit.commit_ts if commit is not None else None)

    def get_row(self, table: str, row: bytes | str, columns: Iterable[str]) -> dict[str, bytes]:
        """Several columns of one row in one round trip; absent columns are left out."""
        self._check_usable()
        keys = [
            self._key(table, row, c, reserved=self._allow_reserved)
            for c in name_list(columns, "columns")
        ]
        values = self._read(keys)
        return {k.column: v for k, v in values.items() if v is not None}

    def scan(
        self,
        table: str,
        start: bytes | str = b"",
        stop: bytes | str | None = None,
        columns: Iterable[str] | None = None,
        *,
        batch_size: int = 200,
    ) -> Iterator[tuple[bytes, dict[str, bytes]]]:
        """Rows in ``[start, stop)`` in row order with their visible cells.

        Finds candidate cells through the lock family (every cell ever written has a lock
        cell), then reads them at the snapshot in batches.  Reserved engine columns are left
        out unless named in ``columns``."""
        self._check_usable()
        self._ctx.check_table(table)
        start_b = encode_row(start) if start not in (b"", "") else b""
        stop_b = encode_row(stop) if stop is not None else None
        wanted = None
        if columns is not None:
            wanted = name_list(columns, "columns")
            for c in wanted:
                encode_column(c, allow_reserved=True)
        if not isinstance(batch_size, int) or batch_size <= 0:
            raise InvalidArgumentError(f"batch_size must be a positive int, got {batch_size!r}")
        yield from self._scan(table, start_b, stop_b, wanted, batch_size)

    def _scan(
        self,
        table: str,
        start: bytes,
        stop: bytes | None,
        columns: list[str] | None,
        batch_size: int,
    ) -> Iterator[tuple[bytes, dict[str, bytes]]]:
        store = self._ctx.store
        options = ScanOptions(
            start=start,
            stop=stop,
            qualifiers=[c.encode("utf-8") for c in columns] if columns is not None else None,
            batch_size=batch_size,
        )
        batch: list[CellKey] = []
        for row, cells in store.scan(table, LOCK, options):
            for qualifier in cells:
                column = decode_column(qualifier)
                if columns is None and column.startswith(RESERVED_PREFIX):
                    continue
                batch.append(CellKey(table, row, column))
            if len(batch) >= batch_size:
                yield from self._rows_of(batch)
                batch = []
        if batch:
            yield from self._rows_of(batch)

    def _rows_of(self, keys: list[CellKey]) -> Iterator[tuple[bytes, dict[str, bytes]]]:
        values = self._read(keys)
        rows: dict[bytes, dict[str, bytes]] = {}
        for key in keys:
            value = values[key]
            if value is not None:
                rows.setdefault(key.row, {})[key.column] = value
        for row in sorted(rows):
            yield row, rows[row]

    _allow_reserved = False

    def _check_usable(self) -> None:
        pass

    def __enter__(self) -> Snapshot:
        return self

    def close(self) -> None:
        """End this snapshot: garbage collection no longer keeps its versions.  Idempotent;
        also done by ``with`` and when the object is garbage-collected."""
        self._release()

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.close()


class Transaction(Snapshot):
    """A snapshot-isolation transaction.  Not thread-safe: one thread uses it at a time."""

    def __init__(self, ctx: EngineContext, start_ts: int, *, allow_reserved: bool = False) -> None:
        super().__init__(ctx, start_ts)
        self._writes: dict[CellKey, Mutation] = {}
        self._seen = {}
        self._status = TxnStatus.ACTIVE
        self._allow_reserved = allow_reserved
        self.commit_ts: int | None = None
        self._guard = threading.Lock()

    @property
    def status(self) -> TxnStatus:
        return self._status

    def _check_usable(self) -> None:
        if self._status is not TxnStatus.ACTIVE:
            raise TransactionStateError(
                f"transaction {self.start_ts} is {self._status.value}; it can no longer be used"
            )

    # ---------------------------------------------------------------- reads

    def get(self, table: str, row: bytes | str, column: str) -> bytes | None:
        self._check_usable()
        key = self._key(table, row, column, reserved=self._allow_reserved)
        own = self._writes.get(key)
        if own is not None:
            return own.value if own.kind == Kind.PUT else None
        return self._read([key])[key]

    def get_row(self, table: str, row: bytes | str, columns: Iterable[str]) -> dict[str, bytes]:
        self._check_usable()
        keys = [
            self._key(table, row, c, reserved=self._allow_reserved)
            for c in name_list(columns, "columns")
        ]
        missing = [k for k in keys if k not in self._writes]
        values = self._read(missing) if missing else {}
        out: dict[str, bytes] = {}
        for key in keys:
            own = self._writes.get(key)
            value = (own.value if own.kind == Kind.PUT else None) if own else values[key]
            if value is not None:
                out[key.column] = value
        return out

    def _scan(
        self,
        table: str,
        start: bytes,
        stop: bytes | None,
        columns: list[str] | None,
        batch_size: int,
    ) -> Iterator[tuple[bytes, dict[str, bytes]]]:
        # Merge our own buffered writes into the committed rows, in row order.
        own: dict[bytes, dict[str, Mutation]] = {}
        for key, mutation in self._writes.items():
            if key.table != table or key.row < start or (stop is not None and key.row >= stop):
                continue
            if columns is not None and key.column not in columns:
                continue
            if columns is None and key.column.startswith(RESERVED_PREFIX):
                continue
            own.setdefault(key.row, {})[key.column] = mutation
        pending = sorted(own)

        def merged(row: bytes, cells: dict[str, bytes]) -> dict[str, bytes]:
            for column, mutation in own.get(row, {}).items():
                if mutation.kind == Kind.PUT:
                    cells[column] = mutation.value
                else:
                    cells.pop(column, None)
            return cells

        for row, cells in super()._scan(table, start, stop, columns, batch_size):
            while pending and pending[0] < row:
                own_row = pending.pop(0)
                extra = merged(own_row, {})
                if extra:
                    yield own_row, extra
            if pending and pending[0] == row:
                pending.pop(0)
            result = merged(row, cells)
            if result:
                yield row, result
        for row in pending:
            extra = merged(row, {})
            if extra:
                yield row, extra

    # ---------------------------------------------------------------- writes

    def set(self, table: str, row: bytes | str, column: str, value: bytes) -> None:
        """Buffer a write of ``value``; applied atomically with the others at commit."""
        self._check_usable()
        key = self._key(table, row, column, reserved=self._allow_reserved)
        check_value(value, table=table, row=key.row, column=column)
        self._writes[key] = Mutation(key, Kind.PUT, value)

    def delete(self, table: str, row: bytes | str, column: str) -> None:
        """Buffer a delete of one cell."""
        self._check_usable()
        key = self._key(table, row, column, reserved=self._allow_reserved)
        self._writes[key] = Mutation(key, Kind.DELETE)

    def has_write(self, table: str, row: bytes | str, column: str) -> bool:
        """Whether this transaction has buffered a write (put or delete) of the cell."""
        return self._key(table, row, column, reserved=self._allow_reserved) in self._writes

    @property
    def writes(self) -> dict[CellKey, Mutation]:
        return dict(self._writes)

    # ---------------------------------------------------------------- end

    def commit(self) -> int | None:
        """Commit the buffered writes atomically.  Returns ``commit_ts`` (``None`` for a
        transaction that wrote nothing: it has nothing to commit and holds no locks).

        Raises ConflictError / TransactionAbortedError (retryable: nothing was committed) or
        UndeterminedCommitError (the outcome is unknown; never retried automatically)."""
        self._check_usable()
        self._status = TxnStatus.COMMITTING
        committer: Committer | None = None
        try:
            if not self._writes:
                self._status = TxnStatus.COMMITTED
                return None
            mutations = list(self._writes.values())
            # Which cells to notify is decided by the committer after it drew commit_ts,
            # not here: a set checked now may be stale by then (percolator/committer.py).
            committer = Committer(self._ctx, self.start_ts, mutations, known=self._seen)
            result = committer.commit()
        except UndeterminedCommitError:
            self._status = TxnStatus.UNDETERMINED
            raise
        except BaseException:
            if committer is not None and committer.undetermined:
                self._status = TxnStatus.UNDETERMINED
            elif committer is not None and committer.primary_committed:
                # Interrupted after the commit point (e.g. Ctrl-C): committed all the same.
                self.commit_ts = committer.commit_ts
                self._status = TxnStatus.COMMITTED
            else:
                self._status = TxnStatus.ROLLED_BACK
            raise
        finally:
            self._release()
        self.commit_ts = result.commit_ts
        self._status = TxnStatus.COMMITTED
        return self.commit_ts

    def rollback(self) -> None:
        """Discard the buffered writes.  Nothing was written before commit, so this writes
        nothing.  Idempotent in the ROLLED_BACK state."""
        if self._status is TxnStatus.ROLLED_BACK:
            return
        self._check_usable()
        self._writes.clear()
        self._status = TxnStatus.ROLLED_BACK
        self._release()

    def close(self) -> None:
        """Roll back if still active; after commit or rollback there is nothing to do."""
        if self._status is TxnStatus.ACTIVE:
            self.rollback()

    def __enter__(self) -> Transaction:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if self._status is not TxnStatus.ACTIVE:
            return
        if exc_type is None:
            self.commit()
        else:
            self.rollback()

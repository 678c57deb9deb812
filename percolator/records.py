"""Protocol records and their byte codecs (format version 1).

Lock cell (family ``l``; the only cell ever compare-and-set)::

    byte 0      format version (1)
    byte 1      flags: bit 0 = has lock, bit 1 = has last commit
    u64         rolled_back: start_ts of the last transaction rolled back here, or 0
    if last commit:  u64 commit_ts, u64 start_ts, u8 kind
    if lock:         u64 start_ts, u32 ttl_ms, u8 kind,
                     u16 len + primary table (UTF-8), u16 len + primary row,
                     u16 len + primary column (UTF-8)

A lock cell always holds the **latest commit** of its user cell (``last_commit``) and, while a
transaction has it prewritten, that transaction's lock.  It is never empty, so a
compare-and-set "expected absent" can never match a real lock cell.  Its bytes never repeat:
a lock carries its unique ``start_ts``, a commit its unique ``commit_ts``, and a rollback
records the rolled-back ``start_ts`` (so no ABA).

Write record (family ``w``, version ``commit_ts``)::

    byte 0      format version (1)
    u8          kind (1 = PUT, 2 = DELETE)
    u64         start_ts (the version of the data in family ``d``)

All integers are big-endian.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from percolator.timestamps import physical_ms

FORMAT_VERSION = 1

_HEADER = struct.Struct(">BBQ")
_COMMIT = struct.Struct(">QQB")
_LOCK = struct.Struct(">QIB")
_LEN = struct.Struct(">H")
_WRITE = struct.Struct(">BBQ")

_FLAG_LOCK = 1
_FLAG_COMMIT = 2


class RecordError(ValueError):
    """Bytes that are not a valid record of a known format version."""


class Kind(enum.IntEnum):
    PUT = 1
    DELETE = 2


@dataclass(frozen=True)
class CommitInfo:
    """A committed write of one cell."""

    commit_ts: int
    start_ts: int
    kind: Kind


@dataclass(frozen=True)
class LockInfo:
    """A prewrite lock.  ``primary_*`` address the transaction's primary cell, whose lock
    cell decides the transaction's fate.  ``ttl_ms`` counts from ``start_ts``'s physical time."""

    start_ts: int
    ttl_ms: int
    kind: Kind
    primary_table: str
    primary_row: bytes
    primary_column: str

    @property
    def expires_at_ms(self) -> int:
        """The wall-clock time (ms) at which the lock expires and others may roll it back."""
        return physical_ms(self.start_ts) + self.ttl_ms

    @staticmethod
    def ttl_from(start_ts: int, now_ms: int, lifetime_ms: int) -> int:
        """The ``ttl_ms`` of a lock of ``start_ts`` that must live ``lifetime_ms`` from
        ``now_ms``.  The TTL counts from ``start_ts`` (see :attr:`expires_at_ms`), so the
        time since then is added: a transaction that ran its user code for a while before
        committing must not find its fresh locks already expired."""
        return max(0, now_ms - physical_ms(start_ts)) + lifetime_ms

    def is_primary_of(self, table: str, row: bytes, column: str) -> bool:
        return (self.primary_table, self.primary_row, self.primary_column) == (
            table,
            row,
            column,
        )


@dataclass(frozen=True)
class LockCell:
    """The state of one user cell's lock cell."""

    lock: LockInfo | None = None
    last_commit: CommitInfo | None = None
    rolled_back: int = 0

    def locked_by(self, start_ts: int) -> bool:
        return self.lock is not None and self.lock.start_ts == start_ts

    def with_lock(self, lock: LockInfo) -> LockCell:
        return LockCell(lock=lock, last_commit=self.last_commit, rolled_back=self.rolled_back)

    def committed(self, commit_ts: int) -> LockCell:
        """The state after committing the lock it holds at ``commit_ts``."""
        assert self.lock is not None
        return LockCell(
            lock=None,
            last_commit=CommitInfo(commit_ts, self.lock.start_ts, self.lock.kind),
            rolled_back=0,
        )

    def rolled_back_state(self) -> LockCell:
        """The state after rolling back the lock it holds: the previous commit, plus a marker
        naming the rolled-back transaction (so the bytes differ from those before the lock)."""
        assert self.lock is not None
        return LockCell(lock=None, last_commit=self.last_commit, rolled_back=self.lock.start_ts)

    def encode(self) -> bytes:
        flags = (_FLAG_LOCK if self.lock else 0) | (_FLAG_COMMIT if self.last_commit else 0)
        parts = [_HEADER.pack(FORMAT_VERSION, flags, self.rolled_back)]
        if self.last_commit is not None:
            c = self.last_commit
            parts.append(_COMMIT.pack(c.commit_ts, c.start_ts, int(c.kind)))
        if self.lock is not None:
            lk = self.lock
            parts.append(_LOCK.pack(lk.start_ts, lk.ttl_ms, int(lk.kind)))
            for field in (
                lk.primary_table.encode("utf-8"),
                lk.primary_row,
                lk.primary_column.encode("utf-8"),
            ):
                parts.append(_LEN.pack(len(field)))
                parts.append(field)
        return b"".join(parts)

    @staticmethod
    def decode(data: bytes | None) -> LockCell:
        """Decode a lock cell; ``None`` (no cell) is the empty state."""
        if data is None:
            return LockCell()
        try:
            version, flags, rolled_back = _HEADER.unpack_from(data, 0)
            if version != FORMAT_VERSION:
                raise RecordError(f"lock cell has unknown format version {version}")
            offset = _HEADER.size
            last_commit = None
            if flags & _FLAG_COMMIT:
                commit_ts, start_ts, kind = _COMMIT.unpack_from(data, offset)
                offset += _COMMIT.size
                last_commit = CommitInfo(commit_ts, start_ts, Kind(kind))
            lock = None
            if flags & _FLAG_LOCK:
                start_ts, ttl_ms, kind = _LOCK.unpack_from(data, offset)
                offset += _LOCK.size
                fields = []
                for _ in range(3):
                    (length,) = _LEN.unpack_from(data, offset)
                    offset += _LEN.size
                    field = data[offset : offset + length]
                    if len(field) != length:
                        raise RecordError("lock cell is truncated")
                    fields.append(field)
                    offset += length
                lock = LockInfo(
                    start_ts,
                    ttl_ms,
                    Kind(kind),
                    fields[0].decode("utf-8"),
                    fields[1],
                    fields[2].decode("utf-8"),
                )
            if offset != len(data):
                raise RecordError("lock cell has trailing bytes")
        except (struct.error, ValueError) as exc:
            if isinstance(exc, RecordError):
                raise
            raise RecordError(f"malformed lock cell {data[:32]!r}: {exc}") from None
        return LockCell(lock=lock, last_commit=last_commit, rolled_back=rolled_back)


@dataclass(frozen=True)
class WriteRecord:
    """The value of a write-family cell at ``commit_ts``: what was committed and where its
    data is (``start_ts``)."""

    kind: Kind
    start_ts: int

    def encode(self) -> bytes:
        return _WRITE.pack(FORMAT_VERSION, int(self.kind), self.start_ts)

    @staticmethod
    def decode(data: bytes) -> WriteRecord:
        try:
            version, kind, start_ts = _WRITE.unpack(data)
            if version != FORMAT_VERSION:
                raise RecordError(f"write record has unknown format version {version}")
            return WriteRecord(Kind(kind), start_ts)
        except (struct.error, ValueError) as exc:
            if isinstance(exc, RecordError):
                raise
            raise RecordError(f"malformed write record {data[:32]!r}: {exc}") from None

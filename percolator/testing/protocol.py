"""Helpers for tests written as protocol scripts (``must_prewrite``, ``must_commit``, ...).

They drive the protocol steps directly against a store with explicit timestamps and a
manual clock, so a scenario reads like the protocol itself and needs no sleeps::

    h = ProtocolHarness(store)
    h.must_prewrite([(b"k", "c", b"v")], primary=(b"k", "c"), start_ts=h.ts(10))
    h.must_locked(b"k", "c", h.ts(10))
    h.must_commit_primary((b"k", "c"), h.ts(10), h.ts(11))
    h.must_get(b"k", "c", h.ts(12), b"v")

Observer authors can use :class:`ManualOracle` with the ``memory:`` store in their own tests.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from percolator.errors import ConflictError, PercolatorError
from percolator.layout import TABLE_FAMILIES
from percolator.protocol.cells import CellKey, Mutation, fetch_cells
from percolator.protocol.commit import commit_cell
from percolator.protocol.lock import commit_lock
from percolator.protocol.prewrite import prewrite
from percolator.protocol.read import read_cells
from percolator.protocol.resolve import LockResolver, TxnOutcome, TxnState, check_txn_status
from percolator.protocol.rollback import rollback_cell
from percolator.records import Kind, LockCell, LockInfo
from percolator.store.base import Store
from percolator.timestamps import TimestampOracle, compose, now_ms


class ManualOracle(TimestampOracle):
    """An in-memory oracle: strictly increasing hybrid timestamps from this machine's clock.

    For unit tests and single-process use only: it persists nothing."""

    def __init__(self) -> None:
        self._last = 0
        self._lock = threading.Lock()

    def get_timestamp(self) -> int:
        with self._lock:
            self._last = max(self._last + 1, compose(now_ms()))
            return self._last


Cell = tuple[bytes, str]


class ProtocolHarness:
    """Protocol steps with explicit timestamps against one table of ``store``.

    Timestamps are ``ts(n)`` = physical millisecond ``base + n``; the manual clock
    (``clock_ms``) decides lock expiry and starts at the physical time of ``ts(0)``."""

    def __init__(self, store: Store, table: str = "t", *, base_ms: int | None = None) -> None:
        self.store = store
        self.table = table
        self.base_ms = base_ms if base_ms is not None else now_ms()
        self.clock_ms = self.base_ms
        if not store.table_exists(table):
            store.create_table(table, TABLE_FAMILIES)
        self.resolver = LockResolver(store, clock_ms=lambda: self.clock_ms)

    def ts(self, n: int) -> int:
        return compose(self.base_ms + n)

    def key(self, row: bytes, column: str) -> CellKey:
        return CellKey(self.table, row, column)

    # ---------------------------------------------------------------- steps

    def prewrite(
        self,
        writes: Sequence[tuple[bytes, str, bytes | None]],
        *,
        primary: Cell,
        start_ts: int,
        ttl_ms: int = 3000,
    ) -> None:
        mutations = [
            Mutation(self.key(r, c), Kind.DELETE if v is None else Kind.PUT, v or b"")
            for r, c, v in writes
        ]

        def make_lock(m: Mutation) -> LockInfo:
            return LockInfo(start_ts, ttl_ms, m.kind, self.table, primary[0], primary[1])

        prewrite(self.store, self.resolver, mutations, start_ts, make_lock)

    def must_prewrite(
        self,
        writes: Sequence[tuple[bytes, str, bytes | None]],
        *,
        primary: Cell,
        start_ts: int,
        ttl_ms: int = 3000,
    ) -> None:
        self.prewrite(writes, primary=primary, start_ts=start_ts, ttl_ms=ttl_ms)
        for r, c, _ in writes:
            self.must_locked(r, c, start_ts)

    def must_prewrite_conflict(
        self,
        writes: Sequence[tuple[bytes, str, bytes | None]],
        *,
        primary: Cell,
        start_ts: int,
    ) -> ConflictError:
        try:
            self.prewrite(writes, primary=primary, start_ts=start_ts)
        except ConflictError as exc:
            return exc
        raise AssertionError(f"prewrite at {start_ts} of {writes} did not conflict")

    def must_commit_primary(self, primary: Cell, start_ts: int, commit_ts: int) -> None:
        """The commit point: CAS the primary from our lock to Committed."""
        key = self.key(*primary)
        raw = fetch_cells(self.store, [key], before=None, with_data=False)[key]
        assert raw.lock_cell.locked_by(start_ts), f"{key} is not locked by {start_ts}"
        assert raw.lock_bytes is not None
        ok = commit_lock(self.store, key, raw.lock_bytes, commit_ts)
        assert ok, f"commit of primary {key} at {commit_ts} lost its compare-and-set"

    def must_commit(self, cell: Cell, start_ts: int, commit_ts: int) -> None:
        """Roll a secondary (or any cell) forward."""
        assert commit_cell(self.store, self.key(*cell), start_ts, commit_ts)
        self.must_unlocked(*cell)

    def must_rollback(self, cell: Cell, start_ts: int) -> None:
        assert rollback_cell(self.store, self.key(*cell), start_ts)
        self.must_unlocked(*cell)

    # ---------------------------------------------------------------- checks

    def lock_cell(self, row: bytes, column: str) -> LockCell:
        key = self.key(row, column)
        return fetch_cells(self.store, [key], before=None, with_data=False)[key].lock_cell

    def must_locked(self, row: bytes, column: str, start_ts: int) -> LockInfo:
        cell = self.lock_cell(row, column)
        assert cell.lock is not None and cell.lock.start_ts == start_ts, (
            f"{row!r}/{column} expected locked by {start_ts}, found {cell}"
        )
        return cell.lock

    def must_unlocked(self, row: bytes, column: str) -> None:
        cell = self.lock_cell(row, column)
        assert cell.lock is None, f"{row!r}/{column} expected unlocked, found {cell}"

    def get(self, row: bytes, column: str, read_ts: int, *, lock_wait_ms: int = 50) -> bytes | None:
        key = self.key(row, column)
        return read_cells(self.store, self.resolver, [key], read_ts, lock_wait_ms=lock_wait_ms)[key]

    def must_get(self, row: bytes, column: str, read_ts: int, expected: bytes | None) -> None:
        value = self.get(row, column, read_ts)
        assert value == expected, f"read {row!r}/{column} at {read_ts}: {value!r} != {expected!r}"

    def must_get_blocked(self, row: bytes, column: str, read_ts: int) -> PercolatorError:
        try:
            value = self.get(row, column, read_ts)
        except PercolatorError as exc:
            return exc
        raise AssertionError(f"read {row!r}/{column} at {read_ts} was not blocked: {value!r}")

    def status(
        self, primary: Cell, start_ts: int, *, rollback_if_expired: bool = True
    ) -> TxnOutcome:
        return check_txn_status(
            self.store,
            self.key(*primary),
            start_ts,
            rollback_if_expired=rollback_if_expired,
            clock_ms=self.clock_ms,
        )

    def must_status(
        self, primary: Cell, start_ts: int, state: TxnState, commit_ts: int = 0
    ) -> None:
        status = self.status(primary, start_ts)
        assert status.state is state, f"status of {start_ts}: {status} (expected {state})"
        if commit_ts:
            assert status.commit_ts == commit_ts, f"{status} (expected commit_ts {commit_ts})"

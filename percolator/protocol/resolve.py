"""Check a transaction's status from its primary, and resolve one of its locks.

The primary's lock cell decides a transaction's fate.  Reading it gives one of:

* ``Locked{start_ts}`` not expired -> the transaction is alive (readers back off, writers
  conflict);
* ``Locked{start_ts}`` expired -> roll the primary back first (that makes the decision
  final), then the transaction is rolled back;
* ``last_commit.start_ts == start_ts`` -> committed at ``last_commit.commit_ts``;
* rollback marker for ``start_ts`` -> rolled back;
* anything else -> search the primary's write history for a record pointing at
  ``start_ts``: found -> committed; absent -> rolled back.

The last case covers a primary whose lock was rolled back and then overwritten by later
commits, and a primary that was **never written**: a lock of ``start_ts`` exists somewhere
only after its primary's prewrite succeeded (the committer guarantees that order), so a
primary with no trace of ``start_ts`` was rolled back, and any late compare-and-set of that
transaction fails because the primary's bytes have changed.

Every function here may be called concurrently by any number of clients and is idempotent.

:class:`LockResolver` is what the other actions call when they meet another transaction's
lock: it checks the transaction's outcome and resolves the lock, with a cache.  Many readers
tripping over the locks of one dead transaction would each read its primary; the resolver
remembers final outcomes (committed at ``commit_ts`` / rolled back), which never change, so
each client asks the primary about a dead transaction once.
"""

from __future__ import annotations

import enum
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from percolator import failpoints
from percolator.concurrency import renew_after_fork
from percolator.layout import WRITE, commit_index_qualifier
from percolator.protocol.cells import CellKey, RawCell, fetch_cells
from percolator.protocol.commit import commit_cell
from percolator.protocol.rollback import rollback_cell, try_rollback_cell
from percolator.records import LockInfo, WriteRecord
from percolator.store.base import Store
from percolator.timestamps import now_ms, physical_ms

_U64 = struct.Struct(">Q")


class TxnState(enum.Enum):
    """Where another transaction stands, as its primary records it."""

    ALIVE = enum.auto()  # its lock is there and not expired: wait (reader) or conflict
    COMMITTED = enum.auto()  # final
    ROLLED_BACK = enum.auto()  # final


@dataclass(frozen=True)
class TxnOutcome:
    """The answer of a status check of transaction ``start_ts`` (not to be confused with
    :class:`percolator.TxnStatus`, the state of one's own :class:`~percolator.Transaction`).

    ``commit_ts`` is set when COMMITTED, ``expires_at_ms`` when ALIVE."""

    state: TxnState
    commit_ts: int = 0
    expires_at_ms: int = 0

    @property
    def final(self) -> bool:
        """COMMITTED and ROLLED_BACK never change again (and may be cached)."""
        return self.state is not TxnState.ALIVE


def check_txn_status(
    store: Store,
    primary: CellKey,
    start_ts: int,
    *,
    rollback_if_expired: bool = True,
    clock_ms: int | None = None,
) -> TxnOutcome:
    """The status of transaction ``start_ts`` as recorded by its primary cell.

    With ``rollback_if_expired`` an expired primary lock is rolled back (and reported as
    rolled back).  ``clock_ms`` is the current wall-clock time (defaults to this machine's).
    """
    for _ in range(100):
        raw = fetch_cells(store, [primary], before=None, with_data=False)[primary]
        cell = raw.lock_cell
        if cell.lock is not None and cell.lock.start_ts == start_ts:
            expires = cell.lock.expires_at_ms
            now = now_ms() if clock_ms is None else clock_ms
            if now < expires or not rollback_if_expired:
                return TxnOutcome(TxnState.ALIVE, expires_at_ms=expires)
            failpoints.failpoint("resolve.before_roll_back")
            assert raw.lock_bytes is not None
            # One attempt only: if the primary changed (a heartbeat extended the lock, or
            # the transaction committed), its expiry must be judged again from scratch.
            if try_rollback_cell(store, primary, start_ts, raw.lock_bytes):
                return TxnOutcome(TxnState.ROLLED_BACK)
            continue
        if cell.last_commit is not None and cell.last_commit.start_ts == start_ts:
            return TxnOutcome(TxnState.COMMITTED, commit_ts=cell.last_commit.commit_ts)
        if cell.rolled_back == start_ts:
            return TxnOutcome(TxnState.ROLLED_BACK)
        commit_ts = find_commit_index(store, primary, start_ts)
        if commit_ts is not None:
            return TxnOutcome(TxnState.COMMITTED, commit_ts=commit_ts)
        return TxnOutcome(TxnState.ROLLED_BACK)
    raise RuntimeError(f"status of transaction {start_ts} at {primary} did not settle")


def find_commit_index(store: Store, primary: CellKey, start_ts: int) -> int | None:
    """The ``commit_ts`` of transaction ``start_ts`` from its primary's commit index, if it
    committed: one read of one version, however long the primary's history is.

    Sound because the entry exists before the primary's lock cell can forget the commit (it
    is written with the primary's write record, and a prewrite that replaces a commit whose
    record is missing writes both first), and GC deletes entries only below its bound, where
    no lock is left to ask about them."""
    column = (WRITE, commit_index_qualifier(primary.qualifier))
    found = store.read_row(
        primary.table, primary.row, columns=[column], min_version=start_ts, before=start_ts + 1
    ).get(column)
    if not found or found[0][0] != start_ts:
        return None
    commit_ts: int = _U64.unpack(found[0][1])[0]
    return commit_ts


def find_commit_in_history(store: Store, key: CellKey, start_ts: int) -> int | None:
    """The ``commit_ts`` of ``start_ts``'s write record on ``key`` (any cell it wrote), if
    there is one, by walking the cell's write history above ``start_ts`` in pages: the whole
    history, never a silent cap.  For tools that settle a transaction from its secondaries
    (the history checker); status checks use :func:`find_commit_index`, one read."""
    lowest = start_ts + 1
    before: int | None = None
    page = 1000
    while True:
        versions = store.read_row(
            key.table,
            key.row,
            columns=[(WRITE, key.qualifier)],
            min_version=lowest,
            before=before,
            max_versions=page,
        ).get((WRITE, key.qualifier), [])
        for commit_ts, value in versions:
            if WriteRecord.decode(value).start_ts == start_ts:
                return commit_ts
        if len(versions) < page:
            return None
        before = versions[-1][0]


def resolve_lock(
    store: Store,
    key: CellKey,
    lock: LockInfo,
    lock_bytes: bytes | None,
    outcome: TxnOutcome,
) -> bool:
    """Apply a final ``outcome`` of ``lock``'s transaction to the lock on ``key``.

    Returns True when the lock is gone (rolled forward or back).  A non-final outcome does
    nothing and returns False.
    """
    if outcome.state is TxnState.COMMITTED:
        failpoints.failpoint("resolve.before_roll_forward")
        commit_cell(store, key, lock.start_ts, outcome.commit_ts, lock_bytes)
        return True
    if outcome.state is TxnState.ROLLED_BACK:
        rollback_cell(store, key, lock.start_ts, lock_bytes)
        return True
    return False


def primary_of(lock: LockInfo) -> CellKey:
    return CellKey(lock.primary_table, lock.primary_row, lock.primary_column)


class LockResolver:
    """Thread-safe.  ``clock_ms`` is injectable so tests control lock expiry."""

    def __init__(
        self,
        store: Store,
        *,
        cache_size: int = 100_000,
        clock_ms: Callable[[], int] = now_ms,
    ) -> None:
        self._store = store
        self._cache: OrderedDict[int, TxnOutcome] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()
        self._clock_ms = clock_ms
        self._listeners: list[Callable[[float, TxnState], None]] = []
        self.rolled_forward = 0
        self.rolled_back = 0
        self.status_checks = 0
        renew_after_fork(self)

    def _after_fork_in_child(self) -> None:
        """A fresh lock: a parent thread may have held this one, around its outcome cache, at the
        fork (client.py)."""
        self._lock = threading.Lock()

    def add_listener(self, listener: Callable[[float, TxnState], None]) -> None:
        """Call ``listener(age_s, state)`` for every lock :meth:`resolve` is given: how long
        ago its transaction started, by this resolver's clock, and the state it was judged
        in.  For metrics: old locks met mean dead clients' leftovers or long transactions in
        the way.  Listeners run on the resolving thread and must be quick."""
        self._listeners.append(listener)

    def cached_status(self, start_ts: int) -> TxnOutcome | None:
        with self._lock:
            status = self._cache.get(start_ts)
            if status is not None:
                self._cache.move_to_end(start_ts)
            return status

    def remember(self, start_ts: int, status: TxnOutcome) -> None:
        if not status.final:
            return
        with self._lock:
            self._cache[start_ts] = status
            self._cache.move_to_end(start_ts)
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)

    def status(self, primary: CellKey, start_ts: int) -> TxnOutcome:
        """The status of transaction ``start_ts`` (rolling its primary back if expired)."""
        cached = self.cached_status(start_ts)
        if cached is not None:
            return cached
        with self._lock:
            self.status_checks += 1
        status = check_txn_status(self._store, primary, start_ts, clock_ms=self._clock_ms())
        self.remember(start_ts, status)
        return status

    def resolve(self, raw: RawCell) -> TxnOutcome:
        """Resolve the lock held in ``raw`` if its transaction is finished (or dead).

        Returns the transaction's outcome; ALIVE means the lock is still there and the
        caller must wait (reader) or give up (writer)."""
        lock = raw.lock_cell.lock
        assert lock is not None
        status = self.status(primary_of(lock), lock.start_ts)
        if self._listeners:
            age_s = max(0.0, (self._clock_ms() - physical_ms(lock.start_ts)) / 1000)
            for listener in self._listeners:
                listener(age_s, status.state)
        if resolve_lock(self._store, raw.key, lock, raw.lock_bytes, status):
            with self._lock:
                if status.state is TxnState.COMMITTED:
                    self.rolled_forward += 1
                else:
                    self.rolled_back += 1
        return status

"""The lock resolver: decides what to do about another transaction's lock, with a cache.

Many readers tripping over the locks of one dead transaction would each read its primary;
the resolver remembers final outcomes (committed at ``commit_ts`` / rolled back), which
never change, so each client asks the primary about a dead transaction once.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable

from percolator.protocol.cells import CellKey, RawCell
from percolator.protocol.resolve import (
    TxnOutcome,
    TxnState,
    check_txn_status,
    primary_of,
    resolve_lock,
)
from percolator.store.base import Store
from percolator.timestamps import now_ms


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
        self.rolled_forward = 0
        self.rolled_back = 0
        self.status_checks = 0

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
        if resolve_lock(self._store, raw.key, lock, raw.lock_bytes, status):
            with self._lock:
                if status.state is TxnState.COMMITTED:
                    self.rolled_forward += 1
                else:
                    self.rolled_back += 1
        return status

"""What every protocol step of one client shares: store, oracle, resolver, thread pool, options."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from percolator.heartbeats import Heartbeats
from percolator.protocol.cells import CellKey
from percolator.protocol.prewrite import AbsentCells
from percolator.protocol.resolve import LockResolver
from percolator.readers import ReaderRegistry
from percolator.store.base import Store
from percolator.timestamps import TimestampOracle


@dataclass(frozen=True)
class ClientOptions:
    """Tunables of a client, with their defaults.

    ``lock_ttl_ms``: how long a lock outlives its transaction's last sign of life before
    others may roll it back (a heartbeat extends it while the commit runs).
    ``lock_wait_ms``: the bound on how long a reader backs off on a live lock.
    ``parallelism``: threads that roll back an aborted transaction's secondaries in parallel
    (the store sends a call's compare-and-sets itself, in parallel or pipelined).
    ``safe_point_refresh_ms``: how stale the cached GC safe point may be.
    """

    lock_ttl_ms: int = 3000
    lock_wait_ms: int = 10_000
    parallelism: int = 16
    safe_point_refresh_ms: int = 10_000

    def __post_init__(self) -> None:
        from percolator.errors import InvalidArgumentError

        for name in ("lock_ttl_ms", "lock_wait_ms", "parallelism", "safe_point_refresh_ms"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise InvalidArgumentError(f"{name} must be a positive int, got {value!r}")


def _any_table(name: str) -> None:
    """The default table check: none (a context built without a client, e.g. in tests)."""


@dataclass
class EngineContext:
    """What transactions and snapshots use: they hold this, never the client that made them."""

    store: Store
    oracle: TimestampOracle
    resolver: LockResolver
    executor: ThreadPoolExecutor
    options: ClientOptions
    #: the live readers of this client and the safe point they read above
    readers: ReaderRegistry
    #: raises for an unknown or malformed table (cached by the client)
    check_table: Callable[[str], None] = field(default=_any_table)
    #: which written cells must leave a notification (observed columns); set by the client
    #: (percolator/notifications.py, ObservedColumns.is_observed).  The committer asks it
    #: only after drawing commit_ts, and it must answer from an observed set whose load
    #: started at most one refresh interval before the call (percolator/committer.py says why)
    is_observed: Callable[[CellKey], bool] = field(default=lambda key: False)
    #: the thread extending the primary locks of this client's commits in flight
    heartbeats: Heartbeats = field(default_factory=Heartbeats)
    #: per table, whether cells written without a read are prewritten from absent
    absent_cells: AbsentCells = field(default_factory=AbsentCells)

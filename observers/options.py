"""Tunables of a worker (observers/worker.py), validated when built."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from percolator.observers.partition import MAX_KEY_GROUPS
from percolator.observers.runner import RunResult

from percolator.errors import ConfigError
from percolator.notifications import Notification
from percolator.store.base import Store

#: The worker's run threads when none are given, by whether the store's calls run in
#: parallel (:attr:`Store.calls_run_in_parallel`): on HBase runs wait on the network, so
#: threads overlap them; on the embedded and memory stores they take turns in this process,
#: and one thread did the example pipeline's changes for 7.1-7.3 ms each where four needed
#: 12.4-13.8 ms (bench/results.md, "The worker's threads follow the store").
PARALLEL_STORE_THREADS = 4
LOCAL_STORE_THREADS = 1

#: The worker's notifications per transaction when none is given.  Under a backlog a batch
#: shares one transaction's timestamps, commit point and cleanup among its runs: the trivial
#: observer ran 0.50-0.69x of the raw store's get + put on embedded and 0.31-0.32x on HBase
#: in batches of 32, against 0.07-0.13x one run per transaction (four threads;
#: bench/results.md, "The worker batches by default").
#: A batch that keeps conflicting is split into single runs (observers/processor.py), so a
#: few hot cells do not hold back the others queued with them.
DEFAULT_BATCH_SIZE = 32

#: The most run threads and scanner threads a worker takes.  Each is an OS thread of this
#: one process (Python runs one at a time), so far fewer already saturate the store or the
#: CPU (docs/operations.md, "Scaling workers"); past this a mistyped count only exhausts
#: the process's memory or thread limit (``can't start new thread``) instead of failing
#: with a message.  More throughput comes from more worker processes.
MAX_THREADS = 256
MAX_SCANNERS = 256


@dataclass(frozen=True)
class WorkerOptions:
    """Tunables of a worker (see the docstrings of observers/worker.py, finder.py and
    processor.py)."""

    #: observer runs in parallel; None: by the store (:meth:`for_store`)
    threads: int | None = None
    scanners: int = 1
    failure_limit: int = 5
    backoff_base_s: float = 0.5
    backoff_max_s: float = 60.0
    conflict_backoff_s: float = 0.05
    idle_sleep_s: float = 0.05
    scan_batch: int = 500
    attempts: int = 3
    drain_timeout_s: float = 30.0
    housekeeping_s: float = 1.0
    parked_refresh_s: float = 2.0
    #: a run longer than this is reported stuck: logged, and the worker unhealthy (0: never)
    run_timeout_s: float = 600.0
    metrics_host: str = "127.0.0.1"
    #: serve metrics on this port (0: any free port); None: no endpoint
    metrics_port: int | None = None
    #: called after every committed run as ``on_commit(observer_name, notification, result)``
    #: from the runner thread (for embedding: progress displays, tests); must not raise
    on_commit: Callable[[str, Notification, RunResult], None] | None = None
    #: partitioned scanning (observers/partition.py): run only the notifications of the key
    #: groups this worker leases; False: random scanning of everything (one worker)
    partitioned: bool = False
    #: number of key groups (the same in every worker) and the lease length
    key_groups: int = 64
    lease_ms: int = 10_000
    #: at most this many queued notifications of one observer run in one transaction
    #: (observers/runner.py: process_batch); 1: one transaction per notification.  A batch
    #: is what has piled up in the queue (a run thread never waits to fill one), so an idle
    #: worker still runs each change alone; see :data:`DEFAULT_BATCH_SIZE`
    batch_size: int = DEFAULT_BATCH_SIZE

    def __post_init__(self) -> None:
        """Raises :class:`ConfigError` naming the first option out of its range (counts at
        least 1, ``threads`` at most :data:`MAX_THREADS`, ``scanners`` at most
        :data:`MAX_SCANNERS`, ``key_groups`` at most :data:`MAX_KEY_GROUPS`)."""
        # Counts: at least 1; those that start OS threads or walk every group, bounded.
        counts: tuple[tuple[str, int | None], ...] = (
            ("threads", MAX_THREADS),
            ("scanners", MAX_SCANNERS),
            ("key_groups", MAX_KEY_GROUPS),
            ("failure_limit", None),
            ("scan_batch", None),
            ("attempts", None),
            ("batch_size", None),
        )
        for name, high in counts:
            value = getattr(self, name)
            if name == "threads" and value is None:
                continue  # follows the store (for_store)
            if (
                not isinstance(value, int)
                or isinstance(value, bool)
                or value < 1
                or (high is not None and value > high)
            ):
                bound = f"in 1..{high}" if high is not None else ">= 1"
                raise ConfigError(f"worker option {name} must be an int {bound}, got {value!r}")
        for name in (
            "backoff_base_s",
            "backoff_max_s",
            "conflict_backoff_s",
            "idle_sleep_s",
            "drain_timeout_s",
            "housekeeping_s",
            "parked_refresh_s",
            "run_timeout_s",
        ):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise ConfigError(
                    f"worker option {name} must be a finite number >= 0, got {value!r}"
                )
        if not isinstance(self.lease_ms, int) or self.lease_ms < 100:
            raise ConfigError(
                f"worker option lease_ms must be an int >= 100, got {self.lease_ms!r}"
            )
        if self.partitioned and self.lease_ms < 1500 * self.housekeeping_s:
            # A worker renews its leases once per housekeeping pass and stops trusting them
            # after three quarters of a lease: shorter, they lapse between renewals, every
            # renewal takes the group anew, and a run longer than a pass never commits.
            raise ConfigError(
                f"worker option lease_ms ({self.lease_ms}) must be at least one and a half "
                f"housekeeping intervals ({1500 * self.housekeeping_s:g} ms)"
            )
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ConfigError(f"metrics port must be in 0..65535, got {self.metrics_port}")

    def for_store(self, store: Store) -> WorkerOptions:
        """These options with ``threads`` set: as given, or by the store when None (see
        :data:`PARALLEL_STORE_THREADS`)."""
        if self.threads is not None:
            return self
        threads = PARALLEL_STORE_THREADS if store.calls_run_in_parallel else LOCAL_STORE_THREADS
        return replace(self, threads=threads)

    @property
    def run_threads(self) -> int:
        """``threads`` once set (:meth:`for_store`; the worker does it)."""
        if self.threads is None:
            raise ConfigError("worker option threads is not set: use WorkerOptions.for_store")
        return self.threads

"""The worker: finds notifications and runs observers on them.

A worker wires three parts together and owns their threads and lifecycle:

* ``scanners`` (default 1) **scanner** threads (observers/finder.py) read the notify family
  of the observed tables, from random rows, jumping away from other scanners;
* a **pool** of ``threads`` threads runs observers (observers/processor.py: queue, back-off,
  failure counting and parking; observers/runner.py: one run), one notification at a time
  each; by default 4 on HBase and 1 on the embedded and memory stores
  (``WorkerOptions.for_store``).  A cell is never queued twice in one worker;
* a **housekeeper** reloads the parked set, shares scanner positions and keeps this
  worker's record in the roster current (observers/roster.py: what ``percolator status``
  lists as the running workers).

Shutdown (:meth:`Worker.stop`, SIGTERM in the CLI): scanners stop, queued notifications are
dropped (they stay in the store), runs in flight may finish for ``drain_timeout_s``; after
that a run that has not committed yet rolls back instead.  Either way the store is left
consistent: a dropped or rolled-back run's notification is still there for the next worker.

Metrics (Prometheus, observers/worker_metrics.py): backlog and parked cells per observer,
low watermark and its lag, commit-to-run latency, committed runs, skipped runs (already
acknowledged), conflicts, failures, parkings, scanner passes and jumps.  ``/healthz`` beside
them answers 503 once a thread of the worker died (:meth:`Worker.health`).

:func:`run_until_quiet` (observers/drain.py) does the same work synchronously, for tests and
batch jobs; :class:`WorkerOptions` (observers/options.py) holds the tunables.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from percolator.observers import roster
from percolator.observers.api import (
    Observer,
    check_observer_set,
    finish_registration,
    register_observers,
    wait_until_notified,
)
from percolator.observers.drain import DrainReport, run_until_quiet
from percolator.observers.finder import NotificationFinder, ScannerPositions
from percolator.observers.metrics import Labels, MetricsServer
from percolator.observers.options import WorkerOptions
from percolator.observers.parking import ParkingLot
from percolator.observers.partition import KeyGroupLeases, partition_domain
from percolator.observers.processor import NotificationProcessor
from percolator.observers.worker_metrics import LOCK_OUTCOMES, WorkerMetrics

from percolator import notifications, watermark
from percolator.errors import ConfigError, PercolatorError
from percolator.notifications import Notification
from percolator.timestamps.hybrid import physical_ms

if TYPE_CHECKING:
    from percolator.client import Client

log = logging.getLogger(__name__)

__all__ = [
    "DrainReport",
    "ScannerPositions",
    "Worker",
    "WorkerOptions",
    "run_until_quiet",
]


class Worker:
    """Runs ``observers`` on the notifications of the store ``client`` is connected to.

    ``start()`` registers the observers (waiting until every client notifies their columns)
    and starts the threads; ``stop()`` shuts down gracefully.  An observer whose ``setup`` or
    registration fails is left out and reported in :attr:`errors`; the others run.
    """

    def __init__(
        self,
        client: Client,
        observers: Sequence[Observer],
        options: WorkerOptions | None = None,
        *,
        worker_id: str | None = None,
    ) -> None:
        self.client = client
        self.options = (options or WorkerOptions()).for_store(client.store)
        self.worker_id = worker_id or (
            f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        )
        self._candidates = check_observer_set(observers)
        self.observers: list[Observer] = []
        self.errors: list[tuple[str, str]] = []
        # Filled by start() with the observers that set up, before any thread starts.
        self._by_column: dict[tuple[str, str], Observer] = {}
        self._tables: list[str] = []
        self.parking = ParkingLot(client)
        self.metrics = WorkerMetrics(
            self.backlog_by_observer,
            self.parked_by_observer,
            lambda: self._watermark_gauges()[0],
            lambda: self._watermark_gauges()[1],
        )
        locks_met = self.metrics.locks_met
        client.on_lock_met(lambda age_s, outcome: locks_met.observe(age_s, outcome=outcome))
        # Partitioned workers scan disjoint key groups: no jumping on each other's positions.
        self._positions = ScannerPositions(
            client, self.worker_id, shared=not self.options.partitioned
        )
        self._stopping = threading.Event()
        self._abort = threading.Event()
        #: the key groups this worker leases (partitioned scanning), else None
        self.leases: KeyGroupLeases | None = None
        if self.options.partitioned:
            self.leases = KeyGroupLeases(
                client,
                self.worker_id,
                groups=self.options.key_groups,
                lease_ms=self.options.lease_ms,
                domain=partition_domain(o.name for o in self._candidates),
            )
        self.processor = NotificationProcessor(
            client,
            self._by_column,
            self.options,
            self.metrics,
            self.parking,
            stopping=self._stopping,
            abort=self._abort,
            fence_for=self._fence_for if self.leases is not None else None,
        )
        self._backlog: dict[Labels, float] = {}
        self._backlog_at = float("-inf")
        self._watermarks: tuple[dict[Labels, float], dict[Labels, float]] = ({}, {})
        self._watermarks_at = float("-inf")
        self._threads: list[threading.Thread] = []
        self._runners: list[threading.Thread] = []
        self._metrics_server: MetricsServer | None = None
        self._started = False
        #: this worker's record as last published in the roster (None: not published)
        self._record: roster.WorkerRecord | None = None

    # ---------------------------------------------------------------- lifecycle

    @property
    def metrics_port(self) -> int | None:
        return self._metrics_server.port if self._metrics_server is not None else None

    def _register(self) -> None:
        """Set up and register each observer (one that fails is left out, in
        :attr:`errors`); ConfigError if none could be."""
        visible_since = 0.0
        for observer in self._candidates:
            try:
                observer.setup(self.client)
                since = register_observers(self.client, [observer], wait=False)
            except Exception as exc:  # a broken observer must not take the worker down
                log.error("observer %r left out: %s", observer.name, exc)
                self.errors.append((observer.name, f"{type(exc).__name__}: {exc}"))
                continue
            visible_since = max(visible_since, since)
            self.observers.append(observer)
            for column in observer.columns:
                self._by_column[(observer.table, column)] = observer
        if not self.observers:
            raise ConfigError(
                "no observer could be started: "
                + ("; ".join(f"{n}: {e}" for n, e in self.errors) or "none given")
            )
        # Once this returns every client notifies the registered columns; then the data
        # they held before is notified too (the catch-up a new registration owes).
        wait_until_notified(self.client, visible_since)
        finish_registration(self.client, self.observers)

    def start(self) -> None:
        """Set up and register the observers, then start scanning.  Raises ConfigError if
        no observer could be set up."""
        if self._started:
            raise ConfigError("worker already started")
        self._started = True
        if self.options.metrics_port is not None:
            # Bound first: a metrics address that cannot be served fails the start before
            # any observer is registered (a registration nobody runs would leave writers
            # notifying for nothing).
            self._metrics_server = MetricsServer(
                self.metrics.registry,
                self.options.metrics_host,
                self.options.metrics_port,
                health=self.health,
            )
        try:
            self._register()
        except BaseException:
            if self._metrics_server is not None:
                self._metrics_server.close()
                self._metrics_server = None
            raise
        self._tables = sorted({o.table for o in self.observers})
        self.processor.refresh_parked(self._tables)
        self.metrics.registry.declare(
            observer=[o.name for o in self.observers], outcome=LOCK_OUTCOMES
        )
        if self.leases is not None:
            self.leases.rebalance()
        finder = NotificationFinder(
            self.client.store,
            self._columns_by_table(),
            self._positions,
            self._offer,
            self.metrics,
            stopping=self._stopping,
            scan_batch=self.options.scan_batch,
            idle_sleep_s=self.options.idle_sleep_s,
            hash_ranges=self.leases.hash_ranges if self.leases is not None else None,
            queued=self.processor.queued,
        )
        for index in range(self.options.run_threads):
            thread = threading.Thread(
                target=self.processor.run_loop, name=f"observer-run-{index}", daemon=True
            )
            self._runners.append(thread)
        for index in range(self.options.scanners):
            thread = threading.Thread(
                target=finder.scan_loop, args=(index,), name=f"observer-scan-{index}", daemon=True
            )
            self._threads.append(thread)
        self._threads.append(
            threading.Thread(target=self._housekeeping, name="observer-housekeeping", daemon=True)
        )
        for thread in self._runners + self._threads:
            thread.start()
        self._publish_record(forget_old=True)
        log.info(
            "worker %s running %s on %d threads",
            self.worker_id,
            ", ".join(o.name for o in self.observers),
            self.options.run_threads,
        )

    def stop(self, drain_timeout_s: float | None = None) -> None:
        """Graceful shutdown (see the module docstring).  Idempotent."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        timeout = self.options.drain_timeout_s if drain_timeout_s is None else drain_timeout_s
        for thread in self._threads:
            thread.join(timeout=10)
        # Queued notifications are dropped: they stay in the store for the next worker.
        self.processor.drop_queued()
        self.processor.end_runs(len(self._runners))
        deadline = time.monotonic() + timeout
        for thread in self._runners:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        if any(t.is_alive() for t in self._runners):
            # Past the deadline: runs that have not committed yet roll back instead.
            self._abort.set()
            for thread in self._runners:
                thread.join(timeout=5)
        if self._metrics_server is not None:
            self._metrics_server.close()
        try:
            self._positions.close()
        except PercolatorError as exc:
            log.warning("could not remove scanner positions: %s", exc)
        if self.leases is not None:
            try:
                self.leases.release_all()
            except PercolatorError as exc:
                log.warning("could not release key groups (they expire): %s", exc)
        if self._record is not None:
            try:
                roster.remove(self.client.store, self._record)
            except PercolatorError as exc:
                log.warning("could not remove this worker from the roster (it ages): %s", exc)

    def _offer(self, notification: Notification) -> bool:
        """Queue a notification found by a scanner - when partitioned, only one of a key
        group this worker leases."""
        if self.leases is not None and self.leases.claim(notification.row) is None:
            return False
        return self.processor.offer(notification)

    def _fence_for(self, batch: Sequence[Notification]) -> Callable[[], bool]:
        """The check a batch of runs makes before its commit: the key group of each row is
        still leased to this worker under the sequence it held when the runs started (one
        read of the meta table for the whole batch)."""
        assert self.leases is not None
        leases = self.leases
        held: set[tuple[int, int]] = set()
        for notification in batch:
            claim = leases.claim(notification.row)
            if claim is None:
                return lambda: False  # a group already lost: nothing of the batch may commit
            held.add(claim)
        return lambda: leases.fences_hold(held)

    def stopped(self) -> bool:
        return self._stopping.is_set()

    def health(self) -> str | None:
        """None while the worker is healthy, else why not (served by ``/healthz`` with
        status 503): one of its threads (run, scanner, housekeeping) ended before
        :meth:`stop`.  Observer errors and store errors do not end threads
        (observers/processor.py, observers/finder.py), so a dead thread is an unexpected
        error, already reported (a run thread logs it; Python prints the traceback of the
        others).  The worker goes on with the threads it has left and does not replace the
        lost one: the process must be restarted (by whatever polls ``/healthz``).  So is a
        run that has taken longer than ``run_timeout_s`` (observers/processor.py: stuck
        runs)."""
        if self._stopping.is_set():
            return None
        dead = [
            t.name
            for t in self._runners + self._threads
            if t.ident is not None and not t.is_alive()
        ]
        if dead:
            return f"worker thread(s) died: {', '.join(dead)} (see the worker's log)"
        stuck = self.processor.stuck_runs()
        if stuck:
            return f"run(s) stuck: {'; '.join(stuck)}"
        return None

    def _columns_by_table(self) -> dict[str, list[str]]:
        columns: dict[str, list[str]] = {table: [] for table in self._tables}
        for table, column in self._by_column:
            columns[table].append(column)
        return columns

    def _housekeeping(self) -> None:
        while not self._stopping.wait(self.options.housekeeping_s):
            try:
                since = time.monotonic() - self.processor.parked_loaded_at
                if since >= self.options.parked_refresh_s:
                    self.processor.refresh_parked(self._tables)
                # Shared even with one scanner here: other processes have scanners too.
                self._positions.sync()
                if self.leases is not None:
                    self.leases.rebalance()
                self.processor.stuck_runs()  # logs a run the first time it is found stuck
                if self._record is None or (
                    roster.now_ms() - self._record.seen_ms >= roster.REFRESH_MS
                ):
                    self._publish_record()
            except PercolatorError as exc:
                log.warning("housekeeping: %s", exc)

    def _publish_record(self, *, forget_old: bool = False) -> None:
        """Publish (or refresh) this worker's roster record; with ``forget_old`` also delete
        the records of workers killed long ago.  The roster is informational: a store error
        is logged, never raised."""
        previous = self._record
        seen_ms = roster.now_ms()
        if previous is not None:
            seen_ms = max(seen_ms, previous.seen_ms + 1)  # a newer version replaces it
        record = roster.WorkerRecord(
            worker_id=self.worker_id,
            host=socket.gethostname(),
            pid=os.getpid(),
            observers=tuple(o.name for o in self.observers),
            threads=self.options.run_threads,
            scanners=self.options.scanners,
            batch_size=self.options.batch_size,
            partitioned=self.options.partitioned,
            key_groups=len(self.leases.owned()) if self.leases is not None else None,
            started_ms=previous.started_ms if previous is not None else seen_ms,
            seen_ms=seen_ms,
        )
        try:
            if forget_old:
                roster.forget_old(self.client.store, roster.read_roster(self.client.store))
            roster.publish(self.client.store, record)
        except PercolatorError as exc:
            log.warning("could not publish this worker in the roster: %s", exc)
            return
        self._record = record

    # ---------------------------------------------------------------- gauges

    def backlog_by_observer(self) -> dict[Labels, float]:
        """Notifications waiting per observer (recounted at most once a second; the
        count costs one scan of the notify family)."""
        if time.monotonic() - self._backlog_at < 1.0:
            return self._backlog
        counts = {o.name: 0 for o in self.observers}
        for table, columns in self._columns_by_table().items():
            for notification in notifications.pending(self.client.store, table, columns):
                if not self.processor.skips(notification):
                    counts[self._by_column[(table, notification.column)].name] += 1
        self._backlog = {(("observer", name),): float(n) for name, n in counts.items()}
        self._backlog_at = time.monotonic()
        return self._backlog

    def _watermark_gauges(self) -> tuple[dict[Labels, float], dict[Labels, float]]:
        """``(watermark as Unix seconds, lag in seconds)`` per observer of this worker,
        recomputed at most every 5 s (one computation scans the lock and notify families
        of every watched column); the last values if the store cannot be read."""
        if time.monotonic() - self._watermarks_at < 5.0:
            return self._watermarks
        try:
            results = watermark.compute_watermarks(self.client.store, self.client.oracle)
        except PercolatorError as exc:
            log.warning("computing watermarks: %s", exc)
            return self._watermarks
        mine = {o.name for o in self.observers}
        marks: dict[Labels, float] = {
            (("observer", name),): physical_ms(r.watermark) / 1000
            for name, r in results.items()
            if name in mine
        }
        lags: dict[Labels, float] = {
            (("observer", n),): r.lag_ms / 1000 for n, r in results.items() if n in mine
        }
        self._watermarks = (marks, lags)
        self._watermarks_at = time.monotonic()
        return self._watermarks

    def parked_by_observer(self) -> dict[Labels, float]:
        counts = {o.name: 0 for o in self.observers}
        for table, _, column in self.processor.parked_cells():
            observer = self._by_column.get((table, column))
            if observer is not None:
                counts[observer.name] += 1
        return {(("observer", name),): float(n) for name, n in counts.items()}

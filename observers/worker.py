"""The worker: finds notifications and runs observers on them.

Threads of one worker process:

* **scanners** (``scanners``, default 1) scan only the notify family of the observed tables
  (Percolator's separate locality group), so one pass costs in proportion to the dirty
  cells, not to the table.  Each pass starts at a random row (drawn from rows recently seen
  dirty) and wraps around.  Scanners publish where they are; one that catches up with
  another scanner (the other's position falls inside the batch it just scanned) jumps to a
  new random row instead of trailing it and racing it for the same cells.  Positions of
  scanners in other processes are shared through the meta table.
* a **pool** of ``threads`` threads runs observers (observers/runner.py), one notification
  at a time each.  A cell is never queued twice in one worker.
* a **housekeeper** reloads the parked set and shares scanner positions.

Failures: a run that fails with an exception of the observer's code counts one failure of
that cell and is retried after an exponential back-off (``backoff_base_s`` doubling up to
``backoff_max_s``, with jitter); after ``failure_limit`` failures in a row the cell is
*parked* (observers/parking.py) and skipped until an operator retries it.  Failure counts
live in the worker's memory: each worker counts its own, a restart starts from zero.
Conflicts (another run or writer won) are not failures: they are retried after a short
back-off and counted separately.

Shutdown (:meth:`Worker.stop`, SIGTERM in the CLI): scanners stop, queued notifications are
dropped (they stay in the store), runs in flight may finish for ``drain_timeout_s``; after
that a run that has not committed yet rolls back instead.  Either way the store is left
consistent: a dropped or rolled-back run's notification is still there for the next worker.

Metrics (Prometheus, observers/metrics.py): backlog and parked cells per observer,
commit-to-run latency, committed runs, skipped runs (already acknowledged), conflicts,
failures, parkings, scanner passes and jumps.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import random
import secrets
import socket
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from percolator.observers.api import (
    Observer,
    check_observer,
    register_observers,
    wait_until_notified,
)
from percolator.observers.metrics import LATENCY_BUCKETS, Labels, MetricsServer, Registry
from percolator.observers.parking import Cell, ParkingLot, pending
from percolator.observers.runner import (
    ConflictExhaustedError,
    Notification,
    Outcome,
    RunAbortedError,
    RunResult,
    process_notification,
)

from percolator.errors import ConfigError, PercolatorError, UndeterminedCommitError
from percolator.layout import META_FAMILY, META_TABLE, NOTIFY
from percolator.retry import Backoff, jittered
from percolator.store.base import Delete, Put, ScanOptions

if TYPE_CHECKING:
    from percolator.client import Client

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerOptions:
    """Tunables of a worker (see the module docstring)."""

    threads: int = 4
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
    metrics_host: str = "127.0.0.1"
    #: serve metrics on this port (0: any free port); None: no endpoint
    metrics_port: int | None = None
    #: called after every committed run as ``on_commit(observer_name, notification, result)``
    #: from the runner thread (for embedding: progress displays, tests); must not raise
    on_commit: Callable[[str, Notification, RunResult], None] | None = None

    def __post_init__(self) -> None:
        for name in ("threads", "scanners", "failure_limit", "scan_batch", "attempts"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"worker option {name} must be an int >= 1, got {value!r}")
        for name in (
            "backoff_base_s",
            "backoff_max_s",
            "conflict_backoff_s",
            "idle_sleep_s",
            "drain_timeout_s",
            "housekeeping_s",
            "parked_refresh_s",
        ):
            value = getattr(self, name)
            if not isinstance(value, int | float) or value < 0:
                raise ConfigError(f"worker option {name} must be a number >= 0, got {value!r}")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ConfigError(f"metrics port must be in 0..65535, got {self.metrics_port}")


@dataclass
class _CellState:
    failures: int = 0
    conflicts: int = 0
    not_before: float = 0.0  # time.monotonic() before which the cell is not run again
    last_error: str = ""


# --------------------------------------------------------------------------- positions

_POSITIONS_PREFIX = b"scanner/"
# A published position older than this is from a dead or stuck scanner: ignored.
_POSITION_STALE_MS = 10_000
# ... and older than this, deleted (a killed worker never removes its own rows).  Worker ids
# are never reused; a worker that was only paused publishes again at a newer version.
_POSITION_EXPIRED_MS = 600_000


@dataclass
class _Position:
    table: str
    row: bytes
    at_ms: int


class ScannerPositions:
    """Where every scanner is: this process's in memory, other processes' through the
    meta table (rows ``scanner/<worker id>/<n>``, published by :meth:`sync`)."""

    def __init__(self, client: Client, worker_id: str) -> None:
        self._client = client
        self._worker_id = worker_id
        self._lock = threading.Lock()
        self._local: dict[int, _Position] = {}
        self._remote: list[_Position] = []
        self._published_version: dict[int, int] = {}

    def _row(self, scanner: int) -> bytes:
        return _POSITIONS_PREFIX + self._worker_id.encode() + b"/" + str(scanner).encode()

    def update(self, scanner: int, table: str, row: bytes) -> None:
        with self._lock:
            self._local[scanner] = _Position(table, row, int(time.time() * 1000))

    def caught_up(self, scanner: int, table: str, before: bytes, after: bytes) -> bool:
        """Whether another scanner's position lies in ``(before, after]`` of ``table``:
        this scanner just scanned up to where the other one is."""
        now = int(time.time() * 1000)
        with self._lock:
            others = [p for i, p in self._local.items() if i != scanner] + self._remote
        return any(
            p.table == table and before < p.row <= after and now - p.at_ms < _POSITION_STALE_MS
            for p in others
        )

    def sync(self) -> None:
        """Publish this process's positions and reload the others' (two store calls)."""
        store = self._client.store
        with self._lock:
            local = dict(self._local)
        puts = []
        for scanner, position in local.items():
            version = max(position.at_ms, self._published_version.get(scanner, 0) + 1)
            self._published_version[scanner] = version
            value = json.dumps(
                {"table": position.table, "row_hex": position.row.hex(), "at_ms": position.at_ms}
            ).encode()
            puts.append(Put(self._row(scanner), META_FAMILY, b"p", version, value))
        if puts:
            store.put(META_TABLE, puts)
        own = _POSITIONS_PREFIX + self._worker_id.encode() + b"/"
        stop = _POSITIONS_PREFIX[:-1] + b"0"
        remote = []
        expired = []
        now = int(time.time() * 1000)
        options = ScanOptions(start=_POSITIONS_PREFIX, stop=stop, qualifiers=[b"p"])
        for row, cells in store.scan(META_TABLE, META_FAMILY, options):
            if row.startswith(own):
                continue
            version, value = cells[b"p"]
            try:
                doc = json.loads(value)
                position = _Position(
                    str(doc["table"]), bytes.fromhex(doc["row_hex"]), int(doc["at_ms"])
                )
            except (ValueError, KeyError, TypeError):
                log.warning("ignoring malformed scanner position %r in %s", row, META_TABLE)
                continue
            if now - position.at_ms > _POSITION_EXPIRED_MS:
                expired.append(Delete(row, META_FAMILY, b"p", version))
            else:
                remote.append(position)
        if expired:
            store.delete_versions(META_TABLE, expired)
        with self._lock:
            self._remote = remote

    def close(self) -> None:
        """Remove this process's published positions."""
        deletes = [
            Delete(self._row(scanner), META_FAMILY, b"p", version)
            for scanner, version in self._published_version.items()
        ]
        if deletes:
            self._client.store.delete_versions(META_TABLE, deletes)


# --------------------------------------------------------------------------- metrics


class WorkerMetrics:
    def __init__(self, worker: Worker) -> None:
        self.registry = registry = Registry()
        self.runs = registry.counter(
            "percolator_observer_runs_total", "Observer runs that committed."
        )
        self.skipped = registry.counter(
            "percolator_observer_skipped_total",
            "Runs that found the change already acknowledged or rolled back (cleanup only).",
        )
        self.conflicts = registry.counter(
            "percolator_observer_conflicts_total",
            "Run attempts that lost a write-write conflict (retried, not failures).",
        )
        self.failures = registry.counter(
            "percolator_observer_failures_total", "Runs that failed with an error."
        )
        self.parked = registry.counter(
            "percolator_observer_parked_total", "Notifications parked after repeated failures."
        )
        self.latency = registry.histogram(
            "percolator_observer_latency_seconds",
            "From the commit of an observed change to the commit of the run that saw it.",
            LATENCY_BUCKETS,
        )
        self.passes = registry.counter(
            "percolator_scanner_passes_total", "Complete scanner passes over a table."
        )
        self.jumps = registry.counter(
            "percolator_scanner_jumps_total",
            "Times a scanner caught up with another one and jumped to a random row.",
        )
        registry.gauge(
            "percolator_observer_backlog",
            "Notifications waiting (not parked), per observer, as of the last count.",
            worker.backlog_by_observer,
        )
        registry.gauge(
            "percolator_observer_parked",
            "Parked notifications, per observer.",
            worker.parked_by_observer,
        )


# --------------------------------------------------------------------------- worker


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
        self.options = options or WorkerOptions()
        self.worker_id = worker_id or (
            f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        )
        seen: dict[tuple[str, str], str] = {}
        names: set[str] = set()
        for observer in observers:
            check_observer(observer)
            if observer.name in names:
                raise ConfigError(f"observer {observer.name!r} is given twice")
            names.add(observer.name)
            for column in observer.columns:
                other = seen.setdefault((observer.table, column), observer.name)
                if other != observer.name:
                    raise ConfigError(
                        f"observers {other!r} and {observer.name!r} both watch "
                        f"{observer.table}/{column}; one observer per column"
                    )
        self._candidates = list(observers)
        self.observers: list[Observer] = []
        self.errors: list[tuple[str, str]] = []
        self._by_column: dict[tuple[str, str], Observer] = {}
        self._tables: list[str] = []
        self.parking = ParkingLot(client)
        self.metrics = WorkerMetrics(self)
        self._positions = ScannerPositions(client, self.worker_id)
        self._queue: queue.Queue[Notification | None] = queue.Queue(
            maxsize=self.options.threads * 4
        )
        self._lock = threading.Lock()
        self._inflight: set[Cell] = set()
        self._states: dict[Cell, _CellState] = {}
        self._parked: set[Cell] = set()
        # Cells this worker parked itself, with the monotonic time: a reload of the parked
        # set that started before the park was written must not forget them.
        self._parked_here: dict[Cell, float] = {}
        self._parked_loaded_at = float("-inf")
        self._samples: dict[str, list[bytes]] = {}
        self._backlog: dict[Labels, float] = {}
        self._backlog_at = float("-inf")
        self._stopping = threading.Event()
        self._abort = threading.Event()
        self._threads: list[threading.Thread] = []
        self._runners: list[threading.Thread] = []
        self._metrics_server: MetricsServer | None = None
        self._started = False

    # ---------------------------------------------------------------- lifecycle

    @property
    def metrics_port(self) -> int | None:
        return self._metrics_server.port if self._metrics_server is not None else None

    def start(self) -> None:
        """Set up and register the observers, then start scanning.  Raises ConfigError if
        no observer could be set up."""
        if self._started:
            raise ConfigError("worker already started")
        self._started = True
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
        # Once this returns every client notifies the registered columns.
        wait_until_notified(self.client, visible_since)
        self._tables = sorted({o.table for o in self.observers})
        self._refresh_parked()
        if self.options.metrics_port is not None:
            self._metrics_server = MetricsServer(
                self.metrics.registry, self.options.metrics_host, self.options.metrics_port
            )
        for index in range(self.options.threads):
            thread = threading.Thread(
                target=self._run_loop, name=f"observer-run-{index}", daemon=True
            )
            self._runners.append(thread)
        for index in range(self.options.scanners):
            thread = threading.Thread(
                target=self._scan_loop, args=(index,), name=f"observer-scan-{index}", daemon=True
            )
            self._threads.append(thread)
        self._threads.append(
            threading.Thread(target=self._housekeeping, name="observer-housekeeping", daemon=True)
        )
        for thread in self._runners + self._threads:
            thread.start()
        log.info(
            "worker %s running %s on %d threads",
            self.worker_id,
            ", ".join(o.name for o in self.observers),
            self.options.threads,
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
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                with self._lock:
                    self._inflight.discard(item.cell)
        for _ in self._runners:
            self._queue.put(None)
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

    def stopped(self) -> bool:
        return self._stopping.is_set()

    # ---------------------------------------------------------------- scanning

    def _random_start(self, table: str, rng: random.Random) -> bytes:
        sample = self._samples.get(table)
        return rng.choice(sample) if sample else b""

    def _remember(self, table: str, row: bytes, rng: random.Random) -> None:
        """Keep a small random sample of dirty rows per table to start passes from."""
        sample = self._samples.setdefault(table, [])
        if len(sample) < 64:
            sample.append(row)
        else:
            sample[rng.randrange(64)] = row

    def _scan_loop(self, index: int) -> None:
        rng = random.Random()
        backoff = Backoff(0.1, 5.0, jitter=0)
        while not self._stopping.is_set():
            submitted = 0
            try:
                for table in rng.sample(self._tables, len(self._tables)):
                    submitted += self._scan_table(index, table, rng)
                    if self._stopping.is_set():
                        return
                backoff.reset()
            except PercolatorError as exc:
                delay = backoff.next()
                log.warning("scanner %d: %s; retrying in %.1f s", index, exc, delay)
                self._stopping.wait(delay)
                continue
            if submitted == 0:
                self._stopping.wait(jittered(self.options.idle_sleep_s, rng=rng))

    def _scan_table(self, index: int, table: str, rng: random.Random) -> int:
        """One pass over ``table``'s notifications from a random row, wrapping around.
        Returns how many notifications it queued."""
        start = self._random_start(table, rng)
        segments: list[tuple[bytes, bytes | None]] = [(start, None)]
        if start:
            segments.append((b"", start))
        submitted = 0
        columns = [c for (t, c) in self._by_column if t == table]
        qualifiers = [c.encode("utf-8") for c in columns]
        for seg_start, seg_stop in segments:
            options = ScanOptions(
                start=seg_start,
                stop=seg_stop,
                qualifiers=qualifiers,
                batch_size=self.options.scan_batch,
            )
            batch_start = seg_start
            rows_in_batch = 0
            for row, cells in self.client.store.scan(table, NOTIFY, options):
                if self._stopping.is_set():
                    return submitted
                self._remember(table, row, rng)
                for qualifier, (version, _) in cells.items():
                    column = qualifier.decode("utf-8")
                    if self._offer(Notification(table, row, column, version)):
                        submitted += 1
                rows_in_batch += 1
                if rows_in_batch >= self.options.scan_batch:
                    self._positions.update(index, table, row)
                    if self._positions.caught_up(index, table, batch_start, row):
                        self.metrics.jumps.inc()
                        return submitted
                    batch_start, rows_in_batch = row, 0
        self.metrics.passes.inc()
        return submitted

    def _offer(self, notification: Notification) -> bool:
        """Queue a notification unless it is in flight, parked or backing off.  Blocks
        while the queue is full (back-pressure on the scanner)."""
        cell = notification.cell
        now = time.monotonic()
        with self._lock:
            if cell in self._inflight or cell in self._parked:
                return False
            state = self._states.get(cell)
            if state is not None and state.not_before > now:
                return False
            self._inflight.add(cell)
        while not self._stopping.is_set():
            try:
                self._queue.put(notification, timeout=0.2)
                return True
            except queue.Full:
                continue
        with self._lock:
            self._inflight.discard(cell)
        return False

    # ---------------------------------------------------------------- running

    def _run_loop(self) -> None:
        while True:
            notification = self._queue.get()
            if notification is None:
                return
            try:
                self._run(notification)
            except Exception:  # never lose a pool thread to a bug in the bookkeeping
                log.exception("unexpected error handling %s", notification)
            finally:
                with self._lock:
                    self._inflight.discard(notification.cell)

    def _run(self, notification: Notification) -> None:
        observer = self._by_column[(notification.table, notification.column)]
        name = observer.name
        try:
            result = process_notification(
                self.client,
                observer,
                notification,
                attempts=self.options.attempts,
                abort=self._abort,
            )
        except RunAbortedError:
            return
        except ConflictExhaustedError as exc:
            self.metrics.conflicts.inc(exc.conflicts, observer=name)
            self._back_off_conflict(notification.cell)
            return
        except UndeterminedCommitError as exc:
            # Not the observer's fault: the next run reads the ack and knows.
            log.warning("run of %s on %s: %s", name, notification, exc)
            self._back_off_conflict(notification.cell)
            return
        except Exception as exc:
            self._failed(observer, notification, exc)
            return
        if result.conflicts:
            self.metrics.conflicts.inc(result.conflicts, observer=name)
        if result.outcome is Outcome.COMMITTED:
            self.metrics.runs.inc(observer=name)
            latency = result.latency_s
            if latency is not None:
                self.metrics.latency.observe(latency, observer=name)
            if self.options.on_commit is not None:
                try:
                    self.options.on_commit(name, notification, result)
                except Exception:  # a display hook must not fail the run it reports
                    log.exception("on_commit hook failed for %s", notification)
        else:
            self.metrics.skipped.inc(observer=name)
        with self._lock:
            self._states.pop(notification.cell, None)

    def _back_off_conflict(self, cell: Cell) -> None:
        with self._lock:
            state = self._states.setdefault(cell, _CellState())
            state.conflicts += 1
            delay = Backoff(self.options.conflict_backoff_s, 5.0).delay(min(state.conflicts, 10))
            state.not_before = time.monotonic() + delay

    def _failed(self, observer: Observer, notification: Notification, exc: Exception) -> None:
        self.metrics.failures.inc(observer=observer.name)
        error = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        with self._lock:
            state = self._states.setdefault(notification.cell, _CellState())
            state.failures += 1
            state.last_error = error
            failures = state.failures
        if failures == 1:
            log.warning("observer %s failed on %s", observer.name, notification, exc_info=exc)
        else:
            log.warning(
                "observer %s failed on %s (%d in a row): %s",
                observer.name,
                notification,
                failures,
                error,
            )
        if failures >= self.options.failure_limit:
            try:
                self.parking.park(observer.name, notification, failures, error)
            except PercolatorError as park_exc:
                log.error("could not park %s: %s", notification, park_exc)
            else:
                log.error(
                    "parked %s of observer %s after %d failures; "
                    "`percolator notifications retry` re-queues it",
                    notification,
                    observer.name,
                    failures,
                )
                self.metrics.parked.inc(observer=observer.name)
                with self._lock:
                    self._parked.add(notification.cell)
                    self._parked_here[notification.cell] = time.monotonic()
                    self._states.pop(notification.cell, None)
                return
        delay = Backoff(self.options.backoff_base_s, self.options.backoff_max_s).delay(failures - 1)
        with self._lock:
            state = self._states.setdefault(notification.cell, _CellState())
            state.not_before = time.monotonic() + delay

    # ---------------------------------------------------------------- housekeeping

    def _refresh_parked(self) -> None:
        started = time.monotonic()
        parked = {cell for cell in self.parking.cells() if cell[0] in self._tables}
        with self._lock:
            # A park recorded before this reload started is in what it read (or was retried
            # since); one recorded meanwhile may not be: keep it until the next reload.
            self._parked_here = {c: t for c, t in self._parked_here.items() if t >= started}
            self._parked = parked | set(self._parked_here)
            for cell in self._parked:
                self._states.pop(cell, None)
            # Forget back-off state of cells nobody has offered for ten minutes (another
            # worker processed them).
            horizon = time.monotonic() - 600
            for cell in [c for c, s in self._states.items() if s.not_before < horizon]:
                del self._states[cell]
        self._parked_loaded_at = started

    def _housekeeping(self) -> None:
        while not self._stopping.wait(self.options.housekeeping_s):
            try:
                if time.monotonic() - self._parked_loaded_at >= self.options.parked_refresh_s:
                    self._refresh_parked()
                # Shared even with one scanner here: other processes have scanners too.
                self._positions.sync()
            except PercolatorError as exc:
                log.warning("housekeeping: %s", exc)

    # ---------------------------------------------------------------- gauges

    def backlog_by_observer(self) -> dict[Labels, float]:
        """Notifications waiting per observer (recounted at most once a second; the
        count costs one scan of the notify family)."""
        if time.monotonic() - self._backlog_at < 1.0:
            return self._backlog
        counts = {o.name: 0 for o in self.observers}
        with self._lock:
            parked = set(self._parked)
        for table in self._tables:
            columns = [c for (t, c) in self._by_column if t == table]
            for row, column, _ in pending(self.client, table, columns):
                if (table, row, column) not in parked:
                    counts[self._by_column[(table, column)].name] += 1
        self._backlog = {(("observer", name),): float(n) for name, n in counts.items()}
        self._backlog_at = time.monotonic()
        return self._backlog

    def parked_by_observer(self) -> dict[Labels, float]:
        counts = {o.name: 0 for o in self.observers}
        with self._lock:
            parked = set(self._parked)
        for table, _, column in parked:
            observer = self._by_column.get((table, column))
            if observer is not None:
                counts[observer.name] += 1
        return {(("observer", name),): float(n) for name, n in counts.items()}


# --------------------------------------------------------------------------- synchronous


@dataclass
class DrainReport:
    runs: int = 0
    skipped: int = 0
    conflicts: int = 0
    failures: list[tuple[Notification, str]] = field(default_factory=list)


def run_until_quiet(
    client: Client, observers: Sequence[Observer], *, max_rounds: int = 100
) -> DrainReport:
    """Process every notification of ``observers`` in this thread, round after round,
    until a scan finds none (observers may notify each other).  For tests, batch jobs and
    tools; it neither registers observers nor parks anything.  Raises PercolatorError if
    notifications remain after ``max_rounds`` rounds."""
    by_column = {(o.table, c): o for o in observers for c in o.columns}
    tables = sorted({o.table for o in observers})
    report = DrainReport()
    for _ in range(max_rounds):
        found = []
        for table in tables:
            columns = [c for (t, c) in by_column if t == table]
            found += [Notification(table, r, c, v) for r, c, v in pending(client, table, columns)]
        if not found:
            return report
        for notification in found:
            observer = by_column[(notification.table, notification.column)]
            try:
                result = process_notification(client, observer, notification, attempts=10)
            except ConflictExhaustedError as exc:
                report.conflicts += exc.conflicts
                continue
            except Exception as exc:
                report.failures.append((notification, f"{type(exc).__name__}: {exc}"))
                continue
            report.conflicts += result.conflicts
            if result.outcome is Outcome.COMMITTED:
                report.runs += 1
            else:
                report.skipped += 1
        if report.failures:
            raise PercolatorError(
                f"{len(report.failures)} observer run(s) failed; first: "
                f"{report.failures[0][0]}: {report.failures[0][1]}"
            )
    raise PercolatorError(f"notifications still pending after {max_rounds} rounds")


__all__ = [
    "DrainReport",
    "ScannerPositions",
    "Worker",
    "WorkerOptions",
    "run_until_quiet",
]

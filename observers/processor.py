"""Running notifications: the run pool's side of a worker (design notes §4).

A bounded queue feeds ``threads`` run threads (:meth:`NotificationProcessor.run_loop`), one
notification at a time each (observers/runner.py does the run itself), or with
``batch_size`` > 1 up to that many queued notifications of one observer in one transaction
(taken from the queue without waiting: a batch is what has piled up, so an idle worker still
runs each change at once).  A batch whose observer code raises is rolled back and its
notifications are run one by one, so failures are counted (and cells parked) per cell as
before; so is a batch that still conflicts after its attempts, so that a hot cell does not
hold back the cells batched with it.  A cell is never queued twice in one worker: it is *in
flight* from :meth:`~NotificationProcessor.offer` until its run ends.

Failures: a run that fails with an exception of the observer's code counts one failure of
that cell and is retried after an exponential back-off (``backoff_base_s`` doubling up to
``backoff_max_s``, with jitter); after ``failure_limit`` failures in a row the cell is
*parked* (observers/parking.py): that change is skipped until an operator retries it or the
cell changes again (a run of the newer change that ends deletes the record).  Failure
counts live in the worker's memory: each worker counts its own, a restart starts from zero.
Conflicts (another run or writer won) are not failures: they are retried after a short
back-off and counted separately.  An undetermined commit is not the observer's fault
either: it backs off like a conflict, and the next run reads the ack and knows.

Conflicts are retried for as long as they happen: a hot cell gets through eventually.  A
cell whose runs conflict without end (an observer that raises a retryable error itself,
say) is therefore logged at each tenfold of its streak (100, 1,000, ... conflicts in a row,
with the last error), so that it does not hide among ordinary conflicts.

A run that does not return (observer code waiting for ever) cannot be stopped from outside
its thread.  A run longer than ``run_timeout_s`` is logged once as an error and makes the
worker unhealthy (:meth:`NotificationProcessor.stuck_runs`, the worker's ``/healthz``), so
that whatever polls it restarts the process; its cells are then run elsewhere (their
notifications stay, its locks expire).

"An exception" is any :class:`BaseException`, ``SystemExit`` included (a plugin calling
``sys.exit()``): a run thread is never lost to observer code.  The worker stops its threads
with events and a sentinel in the queue, never with an exception, and a real Ctrl-C
(``KeyboardInterrupt``) is only ever raised in the main thread: only there does it propagate
(:func:`_is_interrupt`).  A run thread that dies anyway (a bug in the bookkeeping here)
logs it and gives its cells in flight back; the worker's ``/healthz`` reports it.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
import traceback
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from percolator.observers.api import Observer
from percolator.observers.options import WorkerOptions
from percolator.observers.parking import Cell, ParkingLot, skips
from percolator.observers.runner import (
    ConflictExhaustedError,
    Outcome,
    RunAbortedError,
    RunResult,
    process_batch,
)
from percolator.observers.worker_metrics import WorkerMetrics

from percolator.errors import PercolatorError, UndeterminedCommitError
from percolator.notifications import Notification
from percolator.retry import Backoff

if TYPE_CHECKING:
    from percolator.client import Client

log = logging.getLogger(__name__)


def _tenfold_crossed(before: int, after: int) -> int:
    """The largest power of ten in ``(before, after]`` (0 if none)."""
    crossed, power = 0, 1
    while power <= after:
        if power > before:
            crossed = power
        power *= 10
    return crossed


def _is_interrupt(exc: BaseException) -> bool:
    """Whether ``exc`` is a Ctrl-C to honour rather than a failure of a run: a
    ``KeyboardInterrupt`` in the main thread (Python raises it nowhere else; in another
    thread only code that raises it itself does)."""
    return isinstance(exc, KeyboardInterrupt) and (
        threading.current_thread() is threading.main_thread()
    )


@dataclass
class CellState:
    """What one worker remembers of a cell between runs."""

    failures: int = 0
    conflicts: int = 0
    not_before: float = 0.0  # time.monotonic() before which the cell is not run again
    last_error: str = ""
    conflict_streak: int = 0  # conflicts met in a row (a run meets up to ``attempts``)


@dataclass(frozen=True)
class RunInProgress:
    """A run task a run thread is in (for the stuck-run check)."""

    observer: str
    cells: tuple[Cell, ...]
    started: float  # time.monotonic()


class NotificationProcessor:
    """The queue, the cells in flight, back-off and parking of one worker.  Thread-safe.

    ``observers``: the observer of each hosted ``(table, column)`` (read at every run: the
    worker fills it before starting the threads).  ``abort``: when set, runs roll back
    instead of committing; ``stopping``: :meth:`offer` gives up waiting for queue room."""

    def __init__(
        self,
        client: Client,
        observers: Mapping[tuple[str, str], Observer],
        options: WorkerOptions,
        metrics: WorkerMetrics,
        parking: ParkingLot,
        *,
        stopping: threading.Event,
        abort: threading.Event,
        fence_for: Callable[[Sequence[Notification]], Callable[[], bool]] | None = None,
    ) -> None:
        self._client = client
        self._observers = observers
        self._options = options = options.for_store(client.store)
        self._metrics = metrics
        self._parking = parking
        self._stopping = stopping
        self._abort = abort
        # Partitioned workers: the fence a batch of runs checks before its commit (None: no
        # check).
        self._fence_for = fence_for
        # Room for every thread's next batch and the one after it.
        room = options.run_threads * max(4, 2 * options.batch_size)
        self._queue: queue.Queue[Notification | None] = queue.Queue(maxsize=room)
        self._lock = threading.Lock()
        self._inflight: set[Cell] = set()
        self._states: dict[Cell, CellState] = {}
        # Parked cells, each with the version of its parked notification (parking.skips).
        self._parked: dict[Cell, int] = {}
        # Cells this worker parked itself, with the monotonic time and the version: a
        # reload of the parked set that started before the park was written must not
        # forget them.
        self._parked_here: dict[Cell, tuple[float, int]] = {}
        #: monotonic time at which the last reload of the parked set started
        self.parked_loaded_at = float("-inf")
        # Run tasks in progress, by run thread (threading.get_ident()); and those already
        # reported stuck.
        self._running: dict[int, RunInProgress] = {}
        self._reported_stuck: set[int] = set()

    # ---------------------------------------------------------------- queue

    def offer(self, notification: Notification) -> bool:
        """Queue a notification unless it is in flight, parked (this change or a newer
        one) or backing off.  Blocks while the queue is full (back-pressure on the
        scanner)."""
        cell = notification.cell
        now = time.monotonic()
        with self._lock:
            if cell in self._inflight or skips(self._parked, notification):
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

    def queued(self) -> int:
        """How many notifications wait for a run thread (approximate: threads take and add
        meanwhile)."""
        return self._queue.qsize()

    def drop_queued(self) -> None:
        """Forget the queued notifications: they stay in the store for the next worker."""
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                with self._lock:
                    self._inflight.discard(item.cell)

    def end_runs(self, threads: int) -> None:
        """Tell ``threads`` run threads to return once the queue ahead of them is done."""
        for _ in range(threads):
            self._queue.put(None)

    # ---------------------------------------------------------------- runs

    def run_loop(self) -> None:
        """Body of a run thread: run queued notifications (in batches of up to
        ``batch_size`` of one observer) until :meth:`end_runs`.

        A batch is made of the queued notifications of one observer, wherever they are in
        the queue: a scan of a table with two observed columns offers their notifications
        interleaved (row by row), and batching only neighbours would run each alone.  The
        notifications of other observers taken meanwhile wait in ``carried`` (in order, still
        in flight) and are run by this thread next; it takes at most ``2 * batch_size`` of
        them per batch, so one thread never hoards the queue.

        A run never ends the thread: :meth:`run_batch` counts whatever the observer code
        raises as a failure of its cell, and an error of the bookkeeping is logged.  If the
        thread dies anyway (a bug in the loop itself), it logs it and gives back every cell
        it held in flight, so that other threads (or workers) run them; the worker's health
        check reports the dead thread (observers/worker.py)."""
        held: set[Cell] = set()  # taken from the queue by this thread, run not ended
        try:
            self._run_loop(held)
        except BaseException as exc:
            if _is_interrupt(exc):
                raise
            log.critical(
                "run thread %s died: it runs nothing more (the worker reports unhealthy)",
                threading.current_thread().name,
                exc_info=exc,
            )
        finally:
            with self._lock:
                self._inflight.difference_update(held)

    def _run_loop(self, held: set[Cell]) -> None:
        """The loop of :meth:`run_loop`; keeps ``held`` up to date."""
        carried: collections.deque[Notification] = collections.deque()
        ending = False
        size = self._options.batch_size
        while True:
            if not carried:
                if ending:
                    return
                first = self._queue.get()
                if first is None:
                    return
                held.add(first.cell)
                carried.append(first)
            observer = self._observers[(carried[0].table, carried[0].column)]
            batch: list[Notification] = []
            others: collections.deque[Notification] = collections.deque()
            while carried and len(batch) < size:
                item = carried.popleft()
                if self._observers[(item.table, item.column)] is observer:
                    batch.append(item)
                else:
                    others.append(item)
            taken = 0
            while not ending and len(batch) < size and taken < 2 * size:
                try:
                    queued = self._queue.get_nowait()
                except queue.Empty:
                    break
                if queued is None:
                    ending = True
                    break
                held.add(queued.cell)
                taken += 1
                if self._observers[(queued.table, queued.column)] is observer:
                    batch.append(queued)
                else:
                    others.append(queued)
            others.extend(carried)
            carried = others
            try:
                self.run_batch(observer, batch)
            except BaseException as exc:  # never lose a pool thread to a bug in the bookkeeping
                if _is_interrupt(exc):
                    raise
                log.exception("unexpected error handling %s", ", ".join(map(str, batch)))
            finally:
                with self._lock:
                    for notification in batch:
                        self._inflight.discard(notification.cell)
                        held.discard(notification.cell)

    def stuck_runs(self) -> list[str]:
        """The run tasks in progress for longer than ``run_timeout_s`` (0: never), each
        described; each is logged as an error the first time it is found here."""
        limit = self._options.run_timeout_s
        if not limit:
            return []
        now = time.monotonic()
        stuck: list[str] = []
        with self._lock:
            for ident, run in self._running.items():
                took = now - run.started
                if took <= limit:
                    continue
                cells = ", ".join(f"{t}/{r!r}/{c}" for t, r, c in run.cells[:3])
                if len(run.cells) > 1:
                    more = f", ... {len(run.cells) - 3} more" if len(run.cells) > 3 else ""
                    cells = f"a batch of {len(run.cells)} cells ({cells}{more})"
                what = (
                    f"observer {run.observer} has run on {cells} for {took:.0f} s "
                    f"(run timeout {limit:g} s)"
                )
                stuck.append(what)
                if ident not in self._reported_stuck:
                    self._reported_stuck.add(ident)
                    log.error(
                        "%s: its thread cannot be stopped from here; restart the worker to "
                        "run these cells elsewhere",
                        what,
                    )
        return stuck

    def run(self, notification: Notification) -> None:
        """One run task for one notification (a batch of one, :meth:`run_batch`)."""
        self.run_batch(self._observers[(notification.table, notification.column)], [notification])

    def run_batch(self, observer: Observer, batch: list[Notification]) -> None:
        """One run task: the notifications of ``batch`` (all ``observer``'s) in one
        transaction (observers/runner.py: process_batch), then count each outcome (metrics,
        back-off on a conflict, failure counting and parking)."""
        name = observer.name
        ident = threading.get_ident()
        run = RunInProgress(name, tuple(n.cell for n in batch), time.monotonic())
        with self._lock:
            # What this thread runs now (stuck_runs); a batch run again one by one replaces
            # it with each single run in turn, each timed from its own start.
            self._running[ident] = run
            self._reported_stuck.discard(ident)
        try:
            self._run_batch(observer, batch)
        finally:
            with self._lock:
                if self._running.get(ident) is run:
                    del self._running[ident]
                    self._reported_stuck.discard(ident)

    def _run_batch(self, observer: Observer, batch: list[Notification]) -> None:
        """:meth:`run_batch` without the bookkeeping of runs in progress."""
        name = observer.name
        fences = [self._fence_for(batch)] if self._fence_for is not None else []
        try:
            results = process_batch(
                self._client,
                observer,
                batch,
                attempts=self._options.attempts,
                abort=self._abort,
                fences=fences,
            )
        except RunAbortedError:
            return
        except ConflictExhaustedError as exc:
            self._metrics.conflicts.inc(exc.conflicts, observer=name)
            if len(batch) > 1 and not self._abort.is_set():
                # A conflict on any one cell aborts the whole batch, so a hot cell would hold
                # back every cell queued with it: only the cells that still conflict alone
                # back off.
                self._run_one_by_one(observer, batch, "kept conflicting")
                return
            for notification in batch:
                self._back_off_conflict(name, notification, exc, exc.conflicts)
            return
        except UndeterminedCommitError as exc:
            # Not the observer's fault: the next run reads the ack and knows.
            log.warning("run of %s on %s: %s", name, ", ".join(map(str, batch)), exc)
            for notification in batch:
                self._back_off_conflict(name, notification, exc, 0)
            return
        except BaseException as exc:  # SystemExit from a plugin too (module docstring)
            if _is_interrupt(exc):
                raise
            if len(batch) == 1:
                self.failed(observer, batch[0], exc)
                return
            # The failing one is counted (and parked) on its own, the others go through.
            self._run_one_by_one(observer, batch, f"failed ({exc})")
            return
        for notification, result in zip(batch, results, strict=True):
            self._count(observer, notification, result)

    def _run_one_by_one(self, observer: Observer, batch: list[Notification], why: str) -> None:
        """Run the notifications of a batch that committed nothing, each in a transaction of
        its own."""
        log.info(
            "batch of %d runs of %s %s; running them one by one", len(batch), observer.name, why
        )
        for notification in batch:
            self.run(notification)

    def _count(self, observer: Observer, notification: Notification, result: RunResult) -> None:
        """Metrics, the commit hook and the cell's state after a run that ended."""
        name = observer.name
        options = self._options
        if result.conflicts:
            self._metrics.conflicts.inc(result.conflicts, observer=name)
        if result.outcome is Outcome.COMMITTED:
            self._metrics.runs.inc(observer=name)
            latency = result.latency_s
            if latency is not None:
                self._metrics.latency.observe(latency, observer=name)
            if options.on_commit is not None:
                try:
                    options.on_commit(name, notification, result)
                except Exception:  # a display hook must not fail the run it reports
                    log.exception("on_commit hook failed for %s", notification)
        else:
            self._metrics.skipped.inc(observer=name)
        with self._lock:
            self._states.pop(notification.cell, None)
            parked_ts = self._parked.get(notification.cell)
        covered = parked_ts is not None and parked_ts <= notification.notify_ts
        if covered and result.outcome is not Outcome.DEFERRED:
            # The run read the cell's latest commit: the parked change is covered (a newer
            # change offer() let through, or the parked one itself, run here while another
            # worker parked it).
            self._unpark_covered(notification)

    def _unpark_covered(self, notification: Notification) -> None:
        """Forget the cell's parked change after a run that covered it (observers/parking.py)."""
        cell, notify_ts = notification.cell, notification.notify_ts
        try:
            in_force = self._parking.unpark_covered(cell, notify_ts)
        except PercolatorError as exc:  # the record stays; a later run or reload deletes it
            log.warning("could not delete the parked record of %s: %s", notification, exc)
            return
        with self._lock:
            parked_ts = self._parked.get(cell)
            if parked_ts is not None and parked_ts <= notify_ts:  # else parked again since
                del self._parked[cell]
                self._parked_here.pop(cell, None)
            if in_force is not None:  # a newer change was parked (by another worker)
                self._parked[cell] = max(in_force, self._parked.get(cell, in_force))
        log.info("%s ran: the parked change of its cell is covered", notification)

    def _back_off_conflict(
        self, observer: str, notification: Notification, exc: BaseException, conflicts: int
    ) -> None:
        with self._lock:
            state = self._states.setdefault(notification.cell, CellState())
            state.conflicts += 1
            delay = Backoff(self._options.conflict_backoff_s, 5.0).delay(min(state.conflicts, 10))
            state.not_before = time.monotonic() + delay
            before = state.conflict_streak
            state.conflict_streak = streak = before + conflicts
        crossed = _tenfold_crossed(before, streak)
        if crossed >= 100:
            log.warning(
                "observer %s on %s: %d conflicts in a row, still retried (last: %s); if no "
                "other writer contends for its cells, the observer may raise a retryable "
                "error itself",
                observer,
                notification,
                crossed,
                exc,
            )

    def failed(self, observer: Observer, notification: Notification, exc: BaseException) -> None:
        """Count a failure of ``observer`` on ``notification``: back off, or park the cell
        once it failed ``failure_limit`` times in a row."""
        self._metrics.failures.inc(observer=observer.name)
        error = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        with self._lock:
            state = self._states.setdefault(notification.cell, CellState())
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
        if failures >= self._options.failure_limit:
            try:
                self._parking.park(observer.name, notification, failures, error)
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
                self._metrics.parked.inc(observer=observer.name)
                with self._lock:
                    cell, parked_ts = notification.cell, notification.notify_ts
                    self._parked[cell] = parked_ts
                    self._parked_here[cell] = (time.monotonic(), parked_ts)
                    self._states.pop(cell, None)
                return
        backoff = Backoff(self._options.backoff_base_s, self._options.backoff_max_s)
        delay = backoff.delay(failures - 1)
        with self._lock:
            state = self._states.setdefault(notification.cell, CellState())
            state.not_before = time.monotonic() + delay

    # ---------------------------------------------------------------- parked set

    def refresh_parked(self, tables: Collection[str]) -> None:
        """Reload the parked cells of ``tables`` from the store (what :meth:`offer` skips)."""
        started = time.monotonic()
        records = [r for r in self._parking.records() if r.table in tables]
        # Records of changes run after all (by a worker that had not loaded them): gone.
        covered = self._parking.forget_covered(records)
        parked = {r.cell: r.notify_ts for r in records if r not in covered}
        with self._lock:
            # A park recorded before this reload started is in what it read (or was retried
            # since); one recorded meanwhile may not be: keep it until the next reload.
            self._parked_here = {c: p for c, p in self._parked_here.items() if p[0] >= started}
            for cell, (_, parked_ts) in self._parked_here.items():
                parked[cell] = max(parked_ts, parked.get(cell, parked_ts))
            before, self._parked = self._parked, parked
            for cell, parked_ts in parked.items():
                # A newly parked change ends the cell's failure count and back-off; a cell
                # parked as before keeps them: its newer change runs, and must still be
                # parked once it fails often enough.
                if before.get(cell, -1) < parked_ts:
                    self._states.pop(cell, None)
            # Forget back-off state of cells nobody has offered for ten minutes (another
            # worker processed them).
            horizon = time.monotonic() - 600
            for cell in [c for c, s in self._states.items() if s.not_before < horizon]:
                del self._states[cell]
        self.parked_loaded_at = started

    def parked_cells(self) -> set[Cell]:
        """The cells with a parked change (as of the last reload, plus those parked since)."""
        with self._lock:
            return set(self._parked)

    def skips(self, notification: Notification) -> bool:
        """Whether :meth:`offer` skips ``notification`` as parked (parking.skips)."""
        with self._lock:
            return skips(self._parked, notification)

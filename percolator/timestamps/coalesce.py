"""Request coalescing: many threads asking for timestamps share one fetch in flight.

The first caller that finds no fetch in flight becomes the *leader*: it takes every waiting
request (up to ``max_batch`` timestamps), asks the source once for their total, and hands
each waiter its slice of the returned range, in arrival order.  Callers that arrive while a
fetch is in flight queue up; as soon as the fetch returns, the leader promotes the oldest
queued caller to lead the next batch (so the next fetch overlaps the hand-out of this one).
So at most one fetch is in flight, and each fetch serves everyone who was waiting when it
started.

What bounds the rate is not the fetch but waking the waiting threads: one thread hand-off
per request.  On CPython that is tens of microseconds, so one process tops out at a few
tens of thousands of single-timestamp requests per second however large the batches are;
callers that need many timestamps should ask for them in one call.

This is also the client's last line of defence for monotonicity: a range that does not
start strictly above every timestamp this coalescer handed out before is rejected with
:class:`~percolator.errors.TimestampRegressionError`.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from percolator.concurrency import renew_after_fork
from percolator.errors import InvalidArgumentError, TimestampRegressionError
from percolator.timestamps.hybrid import describe

#: Fetches ``total`` consecutive timestamps and returns the first: the range is
#: ``[first, first + total)``.  Raises a PercolatorError on failure.
FetchRange = Callable[[int], int]


@dataclass
class CoalescerStats:
    """Counters of one coalescer (read without locking: approximate while busy)."""

    fetches: int = 0
    timestamps: int = 0
    requests: int = 0
    largest_batch: int = 0


class _Waiter:
    __slots__ = ("count", "done", "error", "lead", "result")

    def __init__(self, count: int, queued: bool) -> None:
        self.count = count
        # Held until the waiter may go on (a result, an error, or its turn to lead): a bare
        # lock is the cheapest hand-off between threads, which is what bounds the rate.
        # Only a waiter queued behind a fetch in flight has one: a leader does not wait.
        self.done: threading.Lock | None = None
        if queued:
            self.done = threading.Lock()
            self.done.acquire()
        self.lead = False
        self.result: list[int] | None = None
        self.error: BaseException | None = None

    def release(self) -> None:
        """Let the waiter go on (a leader has no lock: it is not waiting)."""
        if self.done is not None:
            self.done.release()

    def outcome(self) -> list[int]:
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


class Coalescer:
    """Coalesces concurrent :meth:`take` calls into single :data:`FetchRange` calls.

    Thread-safe.  ``fetch`` is only ever called by one thread at a time.  A failed fetch
    fails every request of its batch with the same exception; the next batch tries again.
    """

    def __init__(self, fetch: FetchRange, max_batch: int) -> None:
        if max_batch < 1:
            raise InvalidArgumentError(f"max_batch must be >= 1, got {max_batch}")
        self._fetch = fetch
        self.max_batch = max_batch
        self._lock = threading.Lock()
        self._pending: deque[_Waiter] = deque()
        self._busy = False
        self._last_seen = 0
        self.stats = CoalescerStats()
        renew_after_fork(self)

    def _after_fork_in_child(self) -> None:
        """The child's copy: no fetch in flight and nobody waiting (the parent's leader and
        waiters are threads the child does not have), a fresh lock.  ``last_seen`` stays: the
        child's timestamps come later, so above it."""
        self._lock = threading.Lock()
        self._pending = deque()
        self._busy = False

    @property
    def last_seen(self) -> int:
        """The highest timestamp handed out so far (0 before the first)."""
        return self._last_seen

    def take(self, count: int) -> list[int]:
        """``count`` >= 1 fresh timestamps, increasing.  Counts above ``max_batch`` are
        fetched in several batches (still increasing, not necessarily consecutive)."""
        if not isinstance(count, int) or isinstance(count, bool):
            raise InvalidArgumentError(f"timestamp count must be an int, got {count!r}")
        if count < 1:
            raise InvalidArgumentError(f"timestamp count must be >= 1, got {count}")
        if count <= self.max_batch:
            return self._take(count)
        result: list[int] = []
        while count > self.max_batch:
            result += self._take(self.max_batch)
            count -= self.max_batch
        return result + self._take(count)

    def _take(self, count: int) -> list[int]:
        with self._lock:
            lead = not self._busy
            waiter = _Waiter(count, queued=not lead)
            self._pending.append(waiter)
            self._busy = True
        if waiter.done is not None:
            waiter.done.acquire()
            if not waiter.lead:
                return waiter.outcome()
        self._run_batch()
        return waiter.outcome()

    def _run_batch(self) -> None:
        # Invariant: the caller is the head of the queue (a fresh leader found the queue
        # empty and not busy; a promoted one was the head), so its own request is served.
        with self._lock:
            batch: list[_Waiter] = []
            total = 0
            while self._pending and (not batch or total + self._pending[0].count <= self.max_batch):
                waiter = self._pending.popleft()
                batch.append(waiter)
                total += waiter.count
        try:
            first = self._fetch(total)
            with self._lock:
                if first <= self._last_seen:
                    raise TimestampRegressionError(
                        f"oracle returned {describe(first)}, not above "
                        f"{describe(self._last_seen)} which this client already handed out"
                    )
                self._last_seen = first + total - 1
                stats = self.stats
                stats.fetches += 1
                stats.timestamps += total
                stats.requests += len(batch)
                stats.largest_batch = max(stats.largest_batch, total)
        except BaseException as exc:  # every waiter of the batch must learn the outcome
            self._promote_next()
            for waiter in batch:
                waiter.error = exc
                waiter.release()
            return
        # The next batch's fetch starts while this batch is handed out.
        self._promote_next()
        start = first
        for waiter in batch:
            waiter.result = list(range(start, start + waiter.count))
            start += waiter.count
            waiter.release()

    def _promote_next(self) -> None:
        """Let the oldest queued caller lead the next batch, or mark the coalescer idle."""
        with self._lock:
            if self._pending:
                successor = self._pending[0]
                successor.lead = True
                successor.release()
            else:
                self._busy = False

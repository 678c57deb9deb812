"""Heartbeats of a client's transactions in flight, all run by one thread.

A transaction holding locks extends its primary's TTL every ``lock_ttl_ms / 3`` while it
commits (percolator/committer.py), so a live but slow commit is not rolled back by a reader.
Starting a thread per transaction for that cost more CPU than most transactions' own work
on the embedded store (about 0.1 ms of CPU and 0.25 ms of wall time per thread); one thread
per client runs every due beat instead.

Contract of :meth:`Heartbeats.start`: ``beat()`` is called from the heartbeat thread every
``interval_s`` (measured from the end of the previous call) until it returns False, raises,
or :meth:`Beat.stop` is called.  After ``stop()`` returns, ``beat`` is not running and never
runs again.  Beats run one at a time: a beat blocked on a slow store delays the others by as
long, which a TTL of three intervals absorbs.

After a fork the child starts without the parent's beats (their transactions belong to the
parent) and starts its own thread when it first needs one.  The child also gets a fresh
lock: the parent's heartbeat thread may have held it at the moment of the fork, and no
thread of the child would ever release that copy.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable

from percolator.concurrency import renew_after_fork
from percolator.errors import PercolatorError

log = logging.getLogger(__name__)


class Beat:
    """One transaction's heartbeat, as returned by :meth:`Heartbeats.start`."""

    def __init__(self, beat: Callable[[], bool], interval_s: float) -> None:
        self.interval_s = interval_s
        self._beat = beat
        # Held while the beat runs: stop() waits for a beat in flight.
        self._running = threading.Lock()
        self._stopped = False

    def stop(self) -> None:
        """No more beats; returns once a beat in flight has finished.  Idempotent.  Must
        not be called from inside the beat itself."""
        with self._running:
            self._stopped = True

    def _run(self) -> bool:
        """Run the beat unless stopped; whether to schedule it again."""
        with self._running:
            if self._stopped:
                return False
            try:
                again = self._beat()
            except Exception:
                log.exception("a heartbeat failed; it is not run again")
                again = False
            if not again:
                self._stopped = True
            return again


class Heartbeats:
    """The heartbeat thread of one client (see the module docstring).  Thread-safe."""

    def __init__(self, name: str = "percolator-heartbeats") -> None:
        self._name = name
        self._cond = threading.Condition()
        self._due: list[tuple[float, int, Beat]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self._closed = False
        self.wakeups = 0  # times the thread woke up (a statistic, for the tests)
        renew_after_fork(self)

    def _after_fork_in_child(self) -> None:
        """The child's copy: a fresh lock, no beats, no thread (see the module docstring)."""
        self._cond = threading.Condition()
        self._due = []
        self._thread = None
        self._pid = os.getpid()

    def start(self, beat: Callable[[], bool], interval_s: float) -> Beat:
        """Call ``beat()`` every ``interval_s`` seconds from the heartbeat thread, the first
        time ``interval_s`` from now, until it returns False or the handle is stopped."""
        handle = Beat(beat, interval_s)
        with self._cond:
            if self._closed:
                raise PercolatorError("the client is closed: no transaction can commit")
            self._ensure_thread()
            self._schedule(handle)
        return handle

    def close(self) -> None:
        """Stop the thread (beats still scheduled never run).  Idempotent."""
        with self._cond:
            self._closed = True
            thread, self._thread = self._thread, None
            self._due.clear()
            self._cond.notify()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)

    def _schedule(self, handle: Beat) -> None:
        due = time.monotonic() + handle.interval_s
        heapq.heappush(self._due, (due, next(self._order), handle))
        if self._due[0][2] is handle:
            # Due before whatever the thread sleeps for: wake it to sleep shorter.  Not
            # otherwise: a wake-up per transaction costs the committing thread a hand-off.
            self._cond.notify()

    def _ensure_thread(self) -> None:
        """Under the condition: a live thread in this process."""
        if self._pid != os.getpid():  # forked: the parent's beats and thread are not ours
            self._pid = os.getpid()
            self._due.clear()
            self._thread = None
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._closed or self._thread is not threading.current_thread():
                        return
                    # Most beats are stopped long before they are due (their commit
                    # ended): drop them now, so the thread wakes only for live ones.
                    while self._due and self._due[0][2]._stopped:
                        heapq.heappop(self._due)
                    now = time.monotonic()
                    if self._due and self._due[0][0] <= now:
                        _, _, handle = heapq.heappop(self._due)
                        break
                    self._cond.wait(self._due[0][0] - now if self._due else None)
                    self.wakeups += 1
            if handle._run():
                with self._cond:
                    self._schedule(handle)

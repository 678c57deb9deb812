"""Retrying: one jittered exponential backoff, and one rule for re-running transactions.

:class:`Backoff` is the delay between attempts everywhere in the project (a reader waiting
on a live lock, a transaction re-run after a conflict, a worker backing off a failing cell):
it doubles (or grows by ``multiplier``) from ``first_s`` up to ``max_s``, and each delay is
jittered, so clients that collided once do not retry in lock step and collide again.

:func:`retry_transaction` is the one rule for re-running a transaction (design notes §3, "no
blind retries"):

* a **retryable** error (a conflict, a transaction rolled back by another client, a lock wait
  that timed out, an unreachable store before the commit point) means nothing was committed:
  the **whole function** runs again in a **new** transaction (new ``start_ts``) after a
  backoff.  A buffered write set is never re-applied: the function reads again and decides
  again;
* :class:`~percolator.errors.UndeterminedCommitError` is **never** retried automatically and
  propagates at once: the transaction may have committed, and running it again could apply
  it twice.  Only the caller knows whether its function is safe to repeat (for example
  because it first reads a marker its earlier commit would have written) and may then call
  again on purpose;
* any other exception propagates at once.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from percolator.errors import PercolatorError, UndeterminedCommitError

T = TypeVar("T")
#: a transaction: its ``with`` block commits on a clean exit and rolls back on an exception
#: while it is still active (percolator.Transaction)
Txn = TypeVar("Txn", bound=AbstractContextManager[Any])

# Growth stops here: far beyond any useful delay, and no float overflow for huge counts.
_MAX_EXPONENT = 64


def jittered(delay_s: float, jitter: float = 0.5, rng: random.Random | None = None) -> float:
    """``delay_s`` scaled by a random factor in ``[1 - jitter, 1 + jitter)``."""
    draw = (rng or random).random()
    return delay_s * (1 - jitter + 2 * jitter * draw)


class Backoff:
    """Jittered exponential backoff.  Not thread-safe: one per retry loop.

    The ``n``-th delay (0-based) is ``min(first_s * multiplier ** n, max_s)`` scaled by a
    random factor in ``[1 - jitter, 1 + jitter)`` (``jitter=0``: no randomness)."""

    def __init__(
        self,
        first_s: float,
        max_s: float = math.inf,
        *,
        multiplier: float = 2.0,
        jitter: float = 0.5,
        rng: random.Random | None = None,
    ) -> None:
        if first_s < 0 or max_s < 0 or multiplier < 1 or not 0 <= jitter <= 1:
            raise ValueError(
                f"bad backoff: first_s={first_s}, max_s={max_s}, multiplier={multiplier}, "
                f"jitter={jitter}"
            )
        self.first_s = first_s
        self.max_s = max_s
        self.multiplier = multiplier
        self.jitter = jitter
        self._rng = rng
        #: delays handed out since the last reset
        self.attempts = 0

    def delay(self, n: int) -> float:
        """The (jittered) ``n``-th delay, 0-based, without advancing."""
        base = min(self.first_s * self.multiplier ** min(max(n, 0), _MAX_EXPONENT), self.max_s)
        return jittered(base, self.jitter, self._rng) if self.jitter else base

    def next(self) -> float:
        """The next delay (advances)."""
        delay = self.delay(self.attempts)
        self.attempts += 1
        return delay

    def sleep(self, deadline: float | None = None) -> None:
        """Sleep the next delay, but not past ``deadline`` (a ``time.monotonic()`` value)."""
        delay = self.next()
        if deadline is not None:
            delay = min(delay, max(0.0, deadline - time.monotonic()))
        time.sleep(delay)

    def wait(self, stop: threading.Event) -> bool:
        """Wait the next delay or until ``stop`` is set; returns whether it is set."""
        return stop.wait(self.next())

    def reset(self) -> None:
        """Start again from ``first_s`` (after a success)."""
        self.attempts = 0


def retry_transaction(
    begin: Callable[[], Txn],
    fn: Callable[[Txn], T],
    *,
    attempts: int,
    backoff: Backoff,
    on_retry: Callable[[int, PercolatorError], None] | None = None,
) -> T:
    """Run ``fn`` in a transaction from ``begin()`` and commit it, re-running the whole
    function in a new transaction on a retryable error as the module docstring says,
    ``attempts`` times at most; the last error propagates.

    ``fn`` may commit or roll back the transaction itself; if it leaves it active, it is
    committed when ``fn`` returns and rolled back when ``fn`` raises (the transaction's
    ``with`` block).  An error of ``begin()`` itself propagates at once: a transaction that
    cannot start (no timestamp) has nothing to re-run, and the oracle client already retries
    and fails over within its own timeout.  ``on_retry(n, exc)`` is called before attempt
    ``n + 1``."""
    if not isinstance(attempts, int) or attempts < 1:
        raise ValueError(f"attempts must be a positive int, got {attempts!r}")
    for n in range(1, attempts + 1):
        txn = begin()
        try:
            with txn:
                return fn(txn)
        except UndeterminedCommitError:
            raise  # it may have committed: never repeated behind the caller's back
        except PercolatorError as exc:
            if not exc.retryable or n == attempts:
                raise
            if on_retry is not None:
                on_retry(n, exc)
        backoff.sleep()
    raise AssertionError("unreachable")

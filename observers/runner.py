"""One observer run for one notification, or for a batch of them (design notes §4).

A *notification* is a version ``T`` of the notify cell of ``(table, row, column)``: the
newest version the scanner saw.  :func:`process_notification` does, in order:

1. begin a transaction at ``O`` (``O > T``: ``T`` was a commit timestamp already issued and
   written when the scanner saw it);
2. read the observed cell's visible commit ``C`` (this resolves any lock on it, so every
   transaction with a commit timestamp below ``O`` is decided: committed, hence covered by
   ``C``, or rolled back) and, for a strong observer, its ack;
3. if the ack already covers ``C`` (or nothing was ever committed there: a notification of an
   aborted transaction) skip to the cleanup; else run the user code and write ``ack = C``
   in the same transaction, then commit (``observer.before_commit``,
   ``observer.after_commit``).  Two runs for the same change conflict on the ack cell, so at
   most one commits;
4. cleanup (``observer.before_cleanup``): delete the notify versions ``<= T`` - never newer.
   Every write committed after ``O`` has ``commit_ts > O > T``, so its notification
   survives; a delete marker at ``T`` also masks a *later* put at ``<= T``, but such a put
   belongs to a transaction whose commit timestamp is below ``O``, which step 2 found
   committed (and the run covered) or rolled back.

What may be retried: everything.  A crash anywhere leaves either nothing (before the
commit point), or a committed run whose notification is still there (the next run finds the
ack and only cleans up).  An undetermined commit is left the same way.

**Batches** (:func:`process_batch`): several notifications of one observer in *one*
transaction - steps 2 and 3 for each in turn (the observer code of a later one sees the
buffered writes of earlier ones, as if they ran one after the other), one commit, then one
batched cleanup.  Each change still has its own ack in the same transaction, so the
guarantees are those of single runs: at most one committed run per change, and a crash or
conflict leaves every notification of the batch to be run again.  What a batch saves is
the per-transaction work: timestamps, the commit point, and store round trips that carry
the writes of all its runs together.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from percolator.observers.api import Observer

from percolator import failpoints
from percolator.errors import PercolatorError, StoreError, UndeterminedCommitError
from percolator.layout import ack_column
from percolator.notifications import (
    Notification,
    delete_notifications,
    read_ack,
    write_ack,
)
from percolator.retry import Backoff
from percolator.timestamps import physical_ms
from percolator.transaction import Transaction, TxnStatus

if TYPE_CHECKING:
    from percolator.client import Client

log = logging.getLogger(__name__)

__all__ = [
    "ConflictExhaustedError",
    "Notification",
    "Outcome",
    "RunAbortedError",
    "RunResult",
    "cleanup",
    "process_batch",
    "process_notification",
]


class Outcome(enum.Enum):
    COMMITTED = "committed"  # the user code ran and its transaction committed
    ACKED = "acked"  # the ack already covered the latest commit: cleanup only
    NOTHING = "nothing"  # no commit is visible (the write was rolled back): cleanup only
    # An earlier run of its batch wrote the observed cell: not run, and its notification
    # stays (the batch's write notifies it again), so that a run of its own sees that write
    # and acknowledges the commit that made it.
    DEFERRED = "deferred"


@dataclass(frozen=True)
class RunResult:
    outcome: Outcome
    #: the visible commit of the observed cell that the run covered (None: none visible)
    observed_commit_ts: int | None
    #: start_ts of the last attempt (O) and the run's commit_ts (None if it wrote nothing)
    start_ts: int
    commit_ts: int | None
    attempts: int
    #: retryable conflicts met on the way (each followed by a new attempt)
    conflicts: int
    cleaned: bool

    @property
    def latency_s(self) -> float | None:
        """Commit-to-run latency: from the observed commit to the run's commit."""
        if self.outcome is not Outcome.COMMITTED or self.observed_commit_ts is None:
            return None
        end = self.commit_ts if self.commit_ts is not None else None
        end_ms = physical_ms(end) if end is not None else time.time() * 1000
        return max(0.0, (end_ms - physical_ms(self.observed_commit_ts)) / 1000)


class RunAbortedError(PercolatorError):
    """The worker is shutting down: the run was rolled back before its commit."""

    retryable = True


class ConflictExhaustedError(PercolatorError):
    """Every attempt of a run met a retryable conflict; the notification stays for later."""

    retryable = True

    def __init__(self, message: str, conflicts: int) -> None:
        super().__init__(message)
        self.conflicts = conflicts


def _cells_to_read(
    observer: Observer, notifications: Sequence[Notification]
) -> list[tuple[str, bytes, str]]:
    """What a run reads first: each observed cell, for a strong observer its ack, and the
    columns of the row the observer declares it reads (``Observer.reads``) - prefetched
    together for the whole batch (one store round trip per table), so the observer's own
    reads of them are served from the transaction's answers."""
    observed = [n.cell for n in notifications]
    cells = list(observed)
    if not observer.weak:
        cells += [(t, r, ack_column(observer.name, c)) for t, r, c in observed]
    reads = observer.reads
    if reads:
        cells += [
            (t, r, c) for t, r in dict.fromkeys((t, r) for t, r, _ in observed) for c in reads
        ]
    return cells


def _check_usable(txn: Transaction, observer: Observer) -> None:
    if txn.status is not TxnStatus.ACTIVE:
        raise PercolatorError(
            f"observer {observer.name!r} left its transaction {txn.status.value}: process() "
            "must not commit or roll back the transaction it is given"
        )


def cleanup(client: Client, *notifications: Notification) -> None:
    """Delete the notify versions ``<= notify_ts`` of each notification, in one batched
    delete per table (idempotent)."""
    failpoints.failpoint("observer.before_cleanup")
    delete_notifications(client.store, *notifications)


def _what(observer: Observer, notifications: Sequence[Notification]) -> str:
    """How messages name a run or a batch."""
    if len(notifications) == 1:
        return f"run of {observer.name} on {notifications[0]}"
    return f"batch of {len(notifications)} runs of {observer.name}"


def process_notification(
    client: Client,
    observer: Observer,
    notification: Notification,
    *,
    attempts: int = 3,
    abort: threading.Event | None = None,
    fence: Callable[[], bool] | None = None,
) -> RunResult:
    """Run ``observer`` for ``notification`` and clean the notification up (a batch of one,
    :func:`process_batch`).

    Retryable errors (conflicts, unreachable store) start a new attempt, up to
    ``attempts``, then raise :class:`ConflictExhaustedError`.  An exception of the user code
    (or a non-retryable engine error) propagates at once: nothing was committed and the
    notification stays.  :class:`UndeterminedCommitError` propagates too: the next run sees
    whether the ack was written.  ``abort``: when set, the run rolls back instead of
    committing (raises :class:`RunAbortedError`); so does a ``fence`` that returns False just
    before the commit (a partitioned worker that lost the row's key group)."""
    fences = [fence] if fence is not None else []
    [result] = process_batch(
        client, observer, [notification], attempts=attempts, abort=abort, fences=fences
    )
    return result


def _batch_attempt(
    client: Client,
    observer: Observer,
    notifications: Sequence[Notification],
    abort: threading.Event | None,
    fences: Sequence[Callable[[], bool]],
) -> tuple[list[tuple[Outcome, int | None]], int, int | None]:
    """One transaction for the whole batch; returns each notification's ``(outcome, C)``,
    the start_ts and the commit_ts (None if no notification needed a run)."""
    txn = client.observer_transaction()
    try:
        txn.prefetch(_cells_to_read(observer, notifications))
        found: list[tuple[Outcome, int | None]] = []
        for notification in notifications:
            table, row, column = notification.cell
            if txn.has_write(table, row, column):
                # Its run would read this batch's buffered write yet acknowledge only the
                # commit before it, and the write's own notification would run it again
                # for the same value: two committed runs of one change.
                found.append((Outcome.DEFERRED, None))
                continue
            _, observed = txn.get_with_commit_ts(table, row, column)
            if observed is None:
                found.append((Outcome.NOTHING, None))
                continue
            if not observer.weak:
                ack = read_ack(txn, observer.name, table, row, column)
                if ack is not None and ack >= observed:
                    found.append((Outcome.ACKED, observed))
                    continue
            observer.process(txn, row, column)
            _check_usable(txn, observer)
            if not observer.weak:
                write_ack(txn, observer.name, table, row, column, observed)
            found.append((Outcome.COMMITTED, observed))
        if all(outcome is not Outcome.COMMITTED for outcome, _ in found):
            txn.rollback()
            return found, txn.start_ts, None
        failpoints.failpoint("observer.before_commit")
        if abort is not None and abort.is_set():
            raise RunAbortedError(
                f"{_what(observer, notifications)} rolled back: the worker is shutting down"
            )
        if not all(fence() for fence in fences):
            raise RunAbortedError(
                f"{_what(observer, notifications)} rolled back: this worker lost the key group "
                "of its row (observers/partition.py)"
            )
        commit_ts = txn.commit()
        failpoints.failpoint("observer.after_commit")
        return found, txn.start_ts, commit_ts
    except BaseException:
        if txn.status is TxnStatus.ACTIVE:
            txn.rollback()
        raise


def process_batch(
    client: Client,
    observer: Observer,
    notifications: Sequence[Notification],
    *,
    attempts: int = 3,
    abort: threading.Event | None = None,
    fences: Sequence[Callable[[], bool]] = (),
) -> list[RunResult]:
    """Run ``observer`` for every notification of ``notifications`` (distinct cells, all
    watched by ``observer``) in one transaction, then clean them up in one batched delete;
    returns one result per notification, in order.

    Errors as :func:`process_notification`, for the batch as a whole: a retryable conflict
    retries the whole batch (up to ``attempts``); an exception of the user code propagates
    at once with nothing committed (run the notifications one by one to find which one
    fails); ``fences`` (partitioned workers) must all hold just before the commit."""
    conflicts = 0
    backoff = Backoff(0.005, multiplier=4)
    for attempt in range(1, attempts + 1):
        try:
            found, start_ts, commit_ts = _batch_attempt(
                client, observer, notifications, abort, fences
            )
        except (UndeterminedCommitError, RunAbortedError):
            raise
        except PercolatorError as exc:
            if not exc.retryable:
                raise
            conflicts += 1
            if attempt == attempts or (abort is not None and abort.is_set()):
                raise ConflictExhaustedError(
                    f"{_what(observer, notifications)} failed {attempts} attempts: {exc}",
                    conflicts,
                ) from exc
            backoff.sleep()
            continue
        cleaned = True
        done = [
            n for n, (o, _) in zip(notifications, found, strict=True) if o is not Outcome.DEFERRED
        ]
        try:
            cleanup(client, *done)
        except StoreError as exc:
            # The runs are done; the notifications stay and the next runs only clean up.
            log.warning(
                "cleanup after %s failed (%s); it will be retried",
                _what(observer, notifications),
                exc,
            )
            cleaned = False
        return [
            RunResult(
                outcome,
                observed,
                start_ts,
                commit_ts if outcome is Outcome.COMMITTED else None,
                attempt,
                conflicts if index == 0 else 0,  # counted once for the batch
                cleaned,
            )
            for index, (outcome, observed) in enumerate(found)
        ]
    raise AssertionError("unreachable")

"""Two-phase commit of one transaction's buffered writes (design notes §3).

Order of steps, each marked with its failpoint:

0. read the state of every written cell the transaction did not read already, primary and
   secondaries in one read per table (what each prewrite would otherwise read, in two);
1. prewrite the **primary** alone (``prewrite.before_primary`` / ``prewrite.after_primary``):
   no secondary may be locked before the primary's lock exists, or a resolver could find
   a secondary whose primary shows no trace of the transaction and wrongly conclude
   "rolled back" while the transaction goes on to commit;
2. prewrite the secondaries, batched per table (one store call each, whose
   compare-and-sets the store sends in parallel or pipelined)
   (``prewrite.after_secondaries``);
3. check the GC safe point (a transaction below it may have prewritten a cell whose history
   garbage collection removed, without seeing a newer commit: SafePointError, rolled back);
   get ``commit_ts``; only then decide which written cells are observed (below), and put
   their notifications at ``commit_ts`` (``commit.before_notify``) - before the commit
   point, so a crash cannot lose them (a spurious one for an aborted transaction is
   harmless);
4. **commit point** (``commit.before_primary``, then
   :func:`percolator.protocol.commit.commit_primary` with ``commit.primary_cas`` and
   ``commit.primary_cas_applied``): compare-and-set the primary's lock cell from our exact
   lock bytes to ``Committed{commit_ts}``.  Failure means someone rolled us back: abort.  An
   unknown outcome raises :class:`UndeterminedCommitError`, never a guess;
   On a store with conditional puts the primary's write record and commit-index entry
   ride on that compare-and-set (protocol/commit.py: ``primary_commit_puts``);
5. write records of every cell at ``commit_ts`` (the primary's unless they rode on the
   commit point) in one batch per table, concurrently with the compare-and-sets of each
   secondary to ``Committed`` (``commit.after_write_records`` once both are done,
   ``commit.after_secondaries``).  Failures after the commit point are left to lazy
   roll-forward by readers.

While the locks are held, a heartbeat extends the primary's TTL so a long commit is not
rolled back by others.  On any error before the commit point, every lock this transaction
placed is rolled back, the primary first.

**Which cells to notify** is decided after ``commit_ts`` was returned by the oracle, by
``ctx.is_observed`` (percolator/notifications.py, :class:`ObservedColumns`), whose answer
comes from an observed set loaded by a read of the registry that *started* at most one
refresh interval before the moment it is asked (a monotonic clock; an older set is reloaded
first, so a fresh one costs no store read).  This is what makes a registration's catch-up
(observers/catchup.py) complete.  Let a registration become visible at ``R``; its catch-up
draws its notification timestamp and scans the lock family only after ``R`` + one refresh
interval (+ a margin).  A writer whose set was loaded (its read started) after ``R`` sees
the registration and notifies itself.  A writer whose set was loaded before ``R`` answered
at most one interval after that load, so it had ``commit_ts`` before ``R`` + one interval:
before the catch-up drew its timestamp and scanned.  All its locks were placed before
``commit_ts`` was drawn, hence before the scan: the catch-up finds the lock (or the commit)
and leaves a notification, and the run that processes it starts above the catch-up's
timestamp, so above ``commit_ts``: it resolves or waits for the lock and then sees the
commit.  Deciding at the *start* of the commit instead lets a writer with a stale set that
is slow before it draws ``commit_ts`` (a pause, a long prewrite) place its locks after the
scan, or commit above the start of the run the catch-up's notification caused: its change
would never be processed.

This module orchestrates: the phases, the heartbeat (run by the client's heartbeat thread,
percolator/heartbeats.py), the failpoints between steps and
the bookkeeping of which locks it holds.  Every step on the store is a protocol action
(percolator/protocol/prewrite.py, commit.py, rollback.py), and every change of a lock cell
goes through percolator/protocol/lock.py.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from percolator import failpoints
from percolator.concurrency import run_all
from percolator.context import EngineContext
from percolator.errors import (
    PercolatorError,
    UndeterminedCommitError,
)
from percolator.heartbeats import Beat
from percolator.notifications import put_notifications
from percolator.protocol.cells import CellKey, Mutation, RawCell, absent_cell, fetch_cells
from percolator.protocol.commit import (
    commit_primary,
    commit_secondaries,
    primary_commit_puts,
    put_index_entry,
    record_puts,
)
from percolator.protocol.lock import extend_lock
from percolator.protocol.prewrite import prewrite
from percolator.protocol.rollback import rollback_cell
from percolator.records import LockInfo
from percolator.timestamps import now_ms

log = logging.getLogger(__name__)


@dataclass
class CommitResult:
    commit_ts: int
    secondaries_committed: bool


class Committer:
    """Commits one transaction.  Not reusable: one :meth:`commit` call per instance."""

    def __init__(
        self,
        ctx: EngineContext,
        start_ts: int,
        mutations: Sequence[Mutation],
        known: Mapping[CellKey, RawCell] | None = None,
    ) -> None:
        if not mutations:
            raise ValueError("nothing to commit")
        self._ctx = ctx
        self.start_ts = start_ts
        ordered = sorted(mutations, key=lambda m: m.key)
        self.primary = ordered[0]
        self.secondaries = ordered[1:]
        #: the written cells that were notified at ``commit_ts``: decided by
        #: :meth:`_write_notifications`, after ``commit_ts`` was drawn (module docstring)
        self.notified: list[CellKey] = []
        # Raw cell states the transaction read at start_ts: prewrite skips re-reading them.
        self._known = dict(known or {})
        # Every cell we locked, with the exact lock bytes we wrote there.
        self._locked: dict[CellKey, bytes] = {}
        self._locked_guard = threading.Lock()
        # The exact bytes of our primary lock; the heartbeat replaces them, the commit
        # compare-and-set expects them.  Guarded by _primary_guard.
        self._primary_bytes: bytes | None = None
        self._primary_guard = threading.Lock()
        self._committing = False
        #: set once the primary's commit compare-and-set succeeded: from then on the
        #: transaction is committed whatever happens in this process
        self.primary_committed = False
        #: set when an interrupt struck while the commit point's compare-and-set was in
        #: flight: the transaction may or may not have committed
        self.undetermined = False
        #: the primary's write record and commit-index entry rode on the commit point
        self._primary_record_rides = False
        self.commit_ts = 0
        self._heartbeat: Beat | None = None

    # ---------------------------------------------------------------- phase 1

    def _make_lock(self, mutation: Mutation) -> LockInfo:
        ttl = self._ttl_ms()
        key = self.primary.key
        return LockInfo(self.start_ts, ttl, mutation.kind, key.table, key.row, key.column)

    def _ttl_ms(self) -> int:
        return LockInfo.ttl_from(self.start_ts, now_ms(), self._ctx.options.lock_ttl_ms)

    def _on_locked(self, key: CellKey, lock_bytes: bytes) -> None:
        with self._locked_guard:
            self._locked[key] = lock_bytes

    def prewrite_all(self) -> None:
        ctx = self._ctx
        # One read of every cell not read yet, instead of one in each prewrite.  Sound for
        # the secondaries though read before the primary is locked: a prewrite
        # compare-and-sets the exact lock bytes it checked, and every change of a cell
        # changes its lock cell, so a cell changed since fails it and is read again.  Cells
        # of tables where unread cells are mostly new are not read but taken as absent
        # (protocol/prewrite.py, AbsentCells): sound for the same reason.
        absent = ctx.absent_cells
        unread = [m.key for m in (self.primary, *self.secondaries) if m.key not in self._known]
        per_table = collections.Counter(key.table for key in unread)
        guess = {table: absent.guess(table, cells) for table, cells in per_table.items()}
        guessed = [key for key in unread if guess[key.table]]
        to_read = [key for key in unread if not guess[key.table]]
        if to_read:
            fetched = fetch_cells(ctx.store, to_read, before=None, with_data=False)
            for key, raw in fetched.items():
                absent.observe(key.table, raw.lock_bytes is None)
            self._known.update(fetched)
        self._known.update((key, absent_cell(key)) for key in guessed)
        lost: set[CellKey] = set()  # cells whose compare-and-set failed, guessed or read
        done = False
        try:
            self._prewrite_locks(lost)
            done = True
        finally:
            # A guess that met an existing cell counts against guessing even when the
            # transaction then fails on it (a conflict, a live lock): a table of such cells
            # must stop being guessed.  Guesses never tried (an earlier failure) count not.
            for key in guessed:
                if done or key in lost:
                    absent.observe(key.table, key not in lost)
        failpoints.failpoint("prewrite.after_secondaries")

    def _prewrite_locks(self, lost: set[CellKey]) -> None:
        """The primary's prewrite, then the secondaries' (MUST: primary first); ``lost``
        receives every cell whose compare-and-set failed."""
        ctx = self._ctx
        failpoints.failpoint("prewrite.before_primary")
        prewrite(
            ctx.store,
            ctx.resolver,
            [self.primary],
            self.start_ts,
            self._make_lock,
            on_locked=self._on_locked,
            known=self._known,
            lost=lost,
        )
        with self._primary_guard, self._locked_guard:
            self._primary_bytes = self._locked[self.primary.key]
        self._start_heartbeat()
        failpoints.failpoint("prewrite.after_primary")
        if self.secondaries:
            prewrite(
                ctx.store,
                ctx.resolver,
                self.secondaries,
                self.start_ts,
                self._make_lock,
                on_locked=self._on_locked,
                known=self._known,
                lost=lost,
            )

    # ---------------------------------------------------------------- heartbeat

    def _start_heartbeat(self) -> None:
        # The client's heartbeat thread runs it (percolator/heartbeats.py).
        interval_s = self._ctx.options.lock_ttl_ms / 3000
        self._heartbeat = self._ctx.heartbeats.start(self._beat, interval_s)

    def _beat(self) -> bool:
        """One heartbeat; whether to go on."""
        try:
            return self._extend_ttl()
        except PercolatorError as exc:  # the commit path will notice on its own
            log.warning(
                "heartbeat of transaction %d failed: %s",
                self.start_ts,
                exc,
                extra={"start_ts": self.start_ts},
            )
            return False

    def _extend_ttl(self) -> bool:
        """Extend the primary's TTL; whether a later extension may be needed."""
        key = self.primary.key
        with self._primary_guard:
            if self._committing or self._primary_bytes is None:
                return False
            new = extend_lock(self._ctx.store, key, self._primary_bytes, self._ttl_ms())
            if new is None:
                return False  # rolled back by someone: the commit will fail
            self._primary_bytes = new
            return True

    def _stop_heartbeat(self) -> None:
        """No heartbeat after this returns (one in flight has finished)."""
        if self._heartbeat is not None:
            self._heartbeat.stop()

    # ---------------------------------------------------------------- phase 2

    def commit(self) -> CommitResult:
        """Run both phases.  Returns the commit timestamp once the commit point passed.

        Raises ConflictError / TransactionAbortedError (nothing committed, locks rolled
        back) or UndeterminedCommitError (outcome unknown)."""
        try:
            self.prewrite_all()
            # Garbage collection may have removed the whole history of a deleted cell, so a
            # transaction below the safe point could prewrite it without seeing a newer
            # commit: it must not commit (protocol/gc.py, step 6).  Cheap while this
            # client's reader record is live (percolator/readers.py).
            self._ctx.readers.check(self.start_ts)
            # A bulk load may have fenced a table since this transaction checked it: asked
            # again now that every lock is in place, from a reading of its state at most
            # one refresh interval old (percolator/bulkload.py, "Clients re-check").
            for table in sorted({m.key.table for m in (self.primary, *self.secondaries)}):
                self._ctx.check_table(table)
            commit_ts = self._ctx.oracle.get_timestamp()
            self.commit_ts = commit_ts
            failpoints.failpoint("commit.before_notify")
            self._write_notifications(commit_ts)
            failpoints.failpoint("commit.before_primary")
            self._commit_primary(commit_ts)
        except UndeterminedCommitError:
            self._stop_heartbeat()
            raise
        except BaseException as exc:
            self._stop_heartbeat()
            if self.undetermined:
                raise  # interrupted while the commit point was in flight: touch nothing
            if not self.primary_committed:
                self._rollback_locked()
                raise
            # The commit point passed before the error: the transaction IS committed and
            # nothing may be rolled back.  An interrupt still propagates (the transaction
            # reports COMMITTED); an ordinary error must not, or a retry helper would
            # apply the transaction a second time.
            if not isinstance(exc, Exception):
                raise
            log.warning(
                "transaction %d committed at %d; error right after the commit point ignored: %s",
                self.start_ts,
                self.commit_ts,
                exc,
                extra={"start_ts": self.start_ts, "commit_ts": self.commit_ts},
            )
        done = self._commit_secondaries(self.commit_ts)
        return CommitResult(self.commit_ts, done)

    def _write_notifications(self, commit_ts: int) -> None:
        """Notify the observed cells among the written ones at ``commit_ts``.

        Called once ``commit_ts`` has been returned by the oracle, never before: each
        ``is_observed`` answer comes from an observed set whose load started at most one
        refresh interval before the call (else it reloads first, which may raise: then the
        transaction rolls back, before its commit point), so a registration this commit
        misses has a catch-up that finds its locks (module docstring)."""
        is_observed = self._ctx.is_observed
        self.notified = [m.key for m in (self.primary, *self.secondaries) if is_observed(m.key)]
        put_notifications(self._ctx.store, self.notified, commit_ts)

    def _commit_primary(self, commit_ts: int) -> None:
        # Under the primary guard: the heartbeat must not replace the lock bytes the commit
        # point expects, and must stop extending once the commit is under way.
        with self._primary_guard:
            self._committing = True
            expected = self._primary_bytes
            assert expected is not None
            then_put = primary_commit_puts(
                self._ctx.store, self.primary.key, self.primary.kind, self.start_ts, commit_ts
            )
            self._primary_record_rides = bool(then_put)
            commit_primary(
                self._ctx.store,
                self.primary.key,
                self.start_ts,
                commit_ts,
                expected,
                then_put=then_put,
                on_committed=self._on_primary_committed,
                on_undetermined=self._on_undetermined,
            )
        self._stop_heartbeat()

    def _on_primary_committed(self) -> None:
        self.primary_committed = True

    def _on_undetermined(self) -> None:
        self.undetermined = True

    def _commit_secondaries(self, commit_ts: int) -> bool:
        """Write records and roll the secondaries forward.  Errors are logged: the transaction is
        committed and readers roll forward whatever is left."""
        ctx = self._ctx
        try:
            failpoints.failpoint("commit.after_primary")
            cells = [(m.key, m.kind) for m in self.secondaries]
            primary: CellKey | None = None
            if not self._primary_record_rides:  # else it rode on the commit point
                primary = self.primary.key
                cells.insert(0, (primary, self.primary.kind))
                # The primary's commit-index entry before its record (MUST, see
                # percolator/protocol/commit.py): in a put of its own unless the store's
                # puts are atomic, then in the same put as the record.
                put_index_entry(ctx.store, primary, self.start_ts, commit_ts)
            records = record_puts(ctx.store, primary, cells, self.start_ts, commit_ts)
            with self._locked_guard:
                lock_bytes = dict(self._locked)
            # The records ride with the secondaries' compare-and-sets, one store call per
            # table (protocol/commit.py: commit_secondaries says why no order is needed).
            locked = [(m.key, lock_bytes.get(m.key)) for m in self.secondaries]
            commit_secondaries(ctx.store, locked, self.start_ts, commit_ts, records)
            failpoints.failpoint("commit.after_write_records")
            failpoints.failpoint("commit.after_secondaries")
            return True
        except Exception as exc:
            log.warning(
                "transaction %d committed at %d; finishing its secondaries failed (%s); "
                "readers will roll them forward",
                self.start_ts,
                commit_ts,
                exc,
                extra={"start_ts": self.start_ts, "commit_ts": commit_ts},
            )
            return False

    # ---------------------------------------------------------------- abort

    def _rollback_locked(self) -> None:
        """Roll back every lock we placed, the primary first (that decides the fate)."""
        with self._locked_guard:
            locked = dict(self._locked)
        ctx = self._ctx
        try:
            if self.primary.key in locked:
                with self._primary_guard:
                    primary_bytes = self._primary_bytes or locked[self.primary.key]
                if not rollback_cell(ctx.store, self.primary.key, self.start_ts, primary_bytes):
                    # The primary no longer holds our lock: it committed, or another client
                    # rolled it back and a later transaction has written the cell since.
                    # Either way its fate is decided and recorded; rolling secondaries back
                    # here could contradict a commit, so readers settle them from it.
                    log.warning(
                        "transaction %d: its primary no longer holds its lock (committed, or "
                        "rolled back by another client and written since); its secondaries "
                        "are left to readers, which settle them as the primary decided",
                        self.start_ts,
                        extra={"start_ts": self.start_ts},
                    )
                    return
                failpoints.failpoint("rollback.after_primary")
            others = [k for k in locked if k != self.primary.key]
            run_all(
                ctx.executor,
                lambda k: rollback_cell(ctx.store, k, self.start_ts, locked[k]),
                others,
            )
        except PercolatorError as exc:
            log.warning(
                "transaction %d: rollback incomplete (%s); its locks expire and are "
                "rolled back by readers",
                self.start_ts,
                exc,
                extra={"start_ts": self.start_ts},
            )

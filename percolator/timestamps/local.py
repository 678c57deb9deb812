"""An in-process timestamp oracle persisted in the store: the default for ``connect()``.

How it stays correct across processes
-------------------------------------
Every batch of timestamps is *reserved* by one compare-and-set on the oracle record
(:mod:`percolator.timestamps.record`) that raises the high-water mark to the end of the batch; the
timestamps are handed out only after that compare-and-set succeeded.  Record changes are
totally ordered (each one expects the exact bytes of the previous one), and each batch
starts strictly above the mark it replaced, so the compare-and-set is the linearisation
point: a timestamp handed out by any process, before or after a restart, is greater than
every timestamp handed out before the request for it began.  Several ``LocalOracle``
instances in several processes on one store are therefore safe together, and a crashed
process leaves nothing to wait for.

Why not reserve windows ahead per process: two processes holding disjoint windows would
hand out timestamps out of real-time order (process B's window above A's; A, later, hands
out a timestamp below one B already handed out), and snapshot isolation needs real-time
order: a transaction that starts after another committed must read its writes.

Leased blocks, validated by a read
----------------------------------
What *is* sound is a block that stays usable only while nobody else has reserved since: an
instance that made two reservations in a row (nobody else wrote the record in between)
reserves a *block* running ``block_ms`` of wall-clock time ahead (the mark becomes
``compose(wall + block_ms)``), and serves later batches from it after **one read** of the
record shows the exact bytes it wrote itself.  That read is the linearisation point: it
happens after every request of the batch began, and since the record still holds our bytes,
every timestamp any other process handed out before it came from a reservation older than
ours, so below our block.  A read costs far less than a compare-and-set (no write lock, no
log write), so a transaction's timestamps cost no compare-and-set in the steady state.
Timestamps served from a block follow the wall clock (``max(next, compose(wall))``), so lock
ages computed from them stay true; when the wall clock passes the block's end, the next
batch reserves a new block.  A reservation made right after another instance's is exact
(just the batch), so instances that alternate never push the mark more than ``block_ms``
ahead of the wall clock.  ``block_ms=0`` reserves every batch exactly, one
compare-and-set each, with the mark equal to the last timestamp handed out.

A short lease: no store access at all
-------------------------------------
An instance that has been the only one drawing timestamps for ``lease_ms`` (all its reads
and compare-and-sets found its own bytes) takes a *lease* with its next reservation: the
record names it with ``lease_ms`` and a wall-clock expiry, and the mark runs ``lease_ms``
ahead of the clock.  The lease is valid **by its own monotonic clock** until
``sent + lease_ms - margin`` (``sent`` read before the compare-and-set was sent, margin
``lease_ms / 8``).  The holder serves batches from its block with no store access at all
while that validity lasts.  From ``sent + lease_ms / 4`` on, the first batch served starts a
renewal in a thread of its own (a read of the release request and a compare-and-set from the
bytes it wrote) and is served at once: the lease is still valid for most of its length, so
no batch waits for the store's round trips.  Only a batch that finds the validity over, or
the block too small for it, waits for a renewal (the one under way, or its own).  A renewal
that fails means the holder was paused past its lease and someone took over, so it drops the
lease and serves nothing more from it.  A renewal always changes the bytes (its expiry only
grows).

Another local oracle that finds a live lease of someone else waits: it takes over (one
compare-and-set from the exact bytes it saw) only once those bytes have not changed for
``lease_ms + margin`` by *its own* monotonic clock, so the two intervals cannot overlap
whatever the wall clocks say.  When it starts waiting on a lease it asks the holder, once,
to release (:meth:`~percolator.timestamps.record.OracleRecordRegister.ask_release`), and
polls the record every 10 ms; a holder sees the request at its next renewal and writes the
record back without a lease, so a waiter normally waits at most ``lease_ms / 4``, and
``lease_ms + margin`` after a holder went idle (it renews only when asked for timestamps),
crashed or was paused; hence the short default of 100 ms (renewing costs a read and a
compare-and-set every 25 ms).  A holder that released on request leases again only after
a hold-off (a second, or ten leases) and another ``lease_ms`` alone, so whoever asked
finds the record unleased even if it polls slowly, and instances that take turns settle
on the read-validated blocks.

An oracle server waits out a local lease by its monotonic clock only (never by the wall
clocks, which would bring every client host's clock into the argument) and asks it to end
meanwhile.  ``close()`` releases the lease.  A forked child never serves from its parent's
lease or block, nor touches them: it starts as a new instance (``os.register_at_fork``).

Why it is safe: a timestamp served under the lease is checked against the validity after
its request began (a renewal under way changes nothing until it has succeeded: then the
validity counts from the renewal's own ``sent``); anyone else hands out timestamps only
after a compare-and-set over the holder's bytes, which it may make only after the validity
ended, and then above the mark.
A timestamp from the lease can therefore be below one handed out elsewhere only if the two
requests overlapped in time, which real-time order allows.

The mark is still never exceeded (a block is reserved before anything is served from it)
and a restarted instance starts above it, so a crash wastes at most the rest of a block:
a harmless gap.

Concurrent requests within one process are coalesced into one store round trip in flight
(:mod:`percolator.timestamps.coalesce`); the record's bytes from the last successful write are
cached, so an uncontended exact batch costs exactly one compare-and-set.

Living beside an oracle server
------------------------------
While an oracle server holds a live lease on the same store, a ``LocalOracle`` refuses to
hand out timestamps (the server hands out timestamps from a window without consulting the
store, so nobody else may write the record while its lease is live).  After the lease has
lapsed (wall clock past its expiry plus ``margin_ms``) a ``LocalOracle`` may continue; a
paused server that wakes up finds its lease gone and serves nothing.
"""

from __future__ import annotations

import logging
import os
import random
import secrets
import socket
import threading
import time

from percolator.concurrency import renew_after_fork
from percolator.errors import (
    ConfigError,
    InvalidArgumentError,
    OracleError,
    OracleUnavailableError,
    StoreError,
    StoreUnavailableError,
)
from percolator.layout import same_deployment
from percolator.store.base import Store
from percolator.timestamps.clock import SYSTEM_CLOCK, Clock
from percolator.timestamps.coalesce import Coalescer, CoalescerStats
from percolator.timestamps.domain import bind_timestamp_domain, check_timestamp_domain
from percolator.timestamps.hybrid import compose
from percolator.timestamps.record import (
    LOCAL_HOLDER_PREFIX,
    OracleRecord,
    OracleRecordRegister,
    ReleaseAsker,
    StoredRecord,
    is_local_holder,
)
from percolator.timestamps.source import TimestampOracle

log = logging.getLogger(__name__)

DEFAULT_MAX_BATCH = 1 << 16
#: How far ahead of the wall clock a leased block runs (see the module docstring): one
#: compare-and-set per this many milliseconds of an uncontended instance's life.
DEFAULT_BLOCK_MS = 100
#: The length of a local oracle's lease (see the module docstring): how long another
#: instance waits at most (plus the margin) when the holder went idle, crashed or was
#: paused, and how long an instance must be alone before it leases.  Short, because an idle
#: holder cannot answer a release request.  0: never lease (every batch is read-validated).
DEFAULT_LEASE_MS = 100
#: How long the thread that renews a lease in the background stays without work before it
#: ends (a busy holder renews every ``lease_ms / 4``, and keeping the thread saves starting
#: one, and opening its store connections, for each renewal).
RENEWER_IDLE_S = 1.0
#: How often an instance that waits for another's lease re-reads the record.
WAIT_POLL_MS = 10
#: After releasing its lease on request, an instance leases again no sooner than this (or
#: ten leases), so that whoever asked finds the record unleased even if it polls slowly.
RELEASE_HOLD_OFF_MS = 1000


def lease_margin_ms(lease_ms: int) -> float:
    """The allowance between a local lease's holder and its waiters (module docstring)."""
    return lease_ms / 8


def _new_instance_id() -> str:
    return f"{LOCAL_HOLDER_PREFIX}{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


class LocalOracle(TimestampOracle):
    """Timestamps reserved by compare-and-set in ``store``; see the module docstring.

    Thread-safe; many instances in many processes may share one store.  ``timeout_s``
    bounds how long one batch keeps retrying under contention or store outages before
    raising :class:`OracleUnavailableError`.  ``block_ms`` (>= 0) is how far ahead of the
    wall clock a leased block runs; 0 reserves every batch exactly (and never leases).
    ``lease_ms`` (0 or >= 8) is the length of the short lease that serves timestamps with no
    store access; 0 never leases.  ``renew_in_background`` says whether a lease due for
    renewal is renewed by a thread of its own while batches go on being served (see the
    module docstring), or by the batch that finds it due; by default in the background only
    where the store's calls run in parallel (:attr:`Store.calls_run_in_parallel`: a round
    trip is a wait, which the renewal thread overlaps; on a store whose calls take turns in
    this process it would only add a thread to take turns with, measured slower).
    """

    def __init__(
        self,
        store: Store,
        *,
        margin_ms: int = 500,
        timeout_s: float = 30.0,
        max_batch: int = DEFAULT_MAX_BATCH,
        block_ms: int = DEFAULT_BLOCK_MS,
        lease_ms: int = DEFAULT_LEASE_MS,
        clock: Clock = SYSTEM_CLOCK,
        renew_in_background: bool | None = None,
    ) -> None:
        if not isinstance(block_ms, int) or isinstance(block_ms, bool) or block_ms < 0:
            raise InvalidArgumentError(f"block_ms must be an int >= 0, got {block_ms!r}")
        if (
            not isinstance(lease_ms, int)
            or isinstance(lease_ms, bool)
            or not (lease_ms == 0 or 8 <= lease_ms < 1 << 31)
        ):
            raise InvalidArgumentError(f"lease_ms must be 0 or an int >= 8, got {lease_ms!r}")
        self.store = store
        self.instance_id = _new_instance_id()
        self._register = OracleRecordRegister(store)
        self._margin_ms = margin_ms
        self._timeout_s = timeout_s
        self._clock = clock
        # What this instance last wrote: the expected bytes of its next compare-and-set.
        # None: unknown, read the record first.
        self._known: StoredRecord | None = None
        self._block_ms = block_ms
        # The next timestamp of the block in ``_known`` not yet handed out (0: none).
        self._next = 0
        self._lease_ms = lease_ms if block_ms else 0
        self._background_renewal = (
            store.calls_run_in_parallel if renew_in_background is None else renew_in_background
        )
        # While this instance holds a lease (``_known`` is the leased record): serve without
        # the store until ``_valid_until`` (monotonic ms), starting a renewal in the
        # background from ``_renew_at`` (0 = no lease); and the release request seen when
        # the lease was taken or last renewed.
        self._renew_at = 0.0
        self._valid_until = 0.0
        self._wanted_seen: bytes | None = None
        # Since when (monotonic ms) every read and write found this instance's own bytes.
        self._alone_since: float | None = None
        # After releasing on request: no lease before this (monotonic ms).
        self._no_lease_before = 0.0
        # Waiting for another instance's lease: the bytes seen, and since when.
        self._waiting_on: bytes | None = None
        self._waiting_since = 0.0
        self._release_asker = ReleaseAsker(self._register, self.instance_id)
        # Held by whoever changes the fields above: the coalescer's leader, close(), or the
        # renewal thread.  While ``_renewing`` (a renewal asked for or under way), only the
        # renewal thread ``_renewer`` writes the record; ``_renewed`` is notified when a
        # renewal is asked for and when it ends.
        self._state_lock = threading.Lock()
        self._renewed = threading.Condition(self._state_lock)
        self._renewing = False
        self._renewer: threading.Thread | None = None
        self._closed = False
        self.reservations = 0  # successful compare-and-sets on the record
        self.validations = 0  # batches served from a block after one read
        self.leased_batches = 0  # batches served under a lease, with no store access
        self.lease_waits = 0  # polls spent waiting for another instance's lease
        # Whether the store is known to take its timestamps from this oracle (domain.py):
        # checked, and bound if unbound, before the first reservation.
        self._domain_bound = False
        self._coalescer = Coalescer(self._reserve, max_batch)
        renew_after_fork(self)  # a forked child starts as a new instance

    def _after_fork_in_child(self) -> None:
        """The child's copy: the lease and block are its parent's, which may go on serving
        from them (and a request of another parent thread may have been in flight, holding
        the locks).  Start over as an instance of its own, with fresh locks."""
        self.instance_id = _new_instance_id()
        self._release_asker = ReleaseAsker(self._register, self.instance_id)
        self._state_lock = threading.Lock()
        self._renewed = threading.Condition(self._state_lock)
        self._renewing = False  # the parent's renewal thread does not exist here
        self._renewer = None
        self._waiting_on = None
        self._drop()

    @property
    def stats(self) -> CoalescerStats:
        """``fetches`` is the number of batches served (each costs one compare-and-set, or
        one read when served from a leased block, or nothing under a lease: see
        :attr:`reservations`, :attr:`validations` and :attr:`leased_batches`)."""
        return self._coalescer.stats

    @property
    def holds_lease(self) -> bool:
        """Whether this instance holds a lease now (it may have lapsed unnoticed)."""
        return self._renew_at > 0

    def get_timestamp(self) -> int:
        return self._coalescer.take(1)[0]

    def get_timestamps(self, count: int) -> list[int]:
        return self._coalescer.take(count)

    def attach_store(self, store: Store) -> None:
        """A local oracle serves the store it reserves its timestamps in (the same
        deployment, through any :class:`Store` object): another store is refused
        (ConfigError), since the first reservation binds only this oracle's own store and
        the other would stay unbound, open to another oracle's timestamps.  A store bound
        to an oracle service is refused too (OracleError).  May create the stores' meta
        tables; writes nothing else."""
        if not same_deployment(store, self.store):
            raise ConfigError(
                f"a LocalOracle of store {self.store.url!r} cannot serve store {store.url!r}: "
                "a local oracle serves the store it keeps its record in; open it on that "
                "store, or serve this one's timestamps by an oracle server (grpc://)"
            )
        check_timestamp_domain(store, None)

    def close(self) -> None:
        """Release the lease, if this instance holds one, so others need not wait it out.
        Best effort (a failure leaves a lease that lapses by itself).  Idempotent; the
        oracle still serves afterwards, without leasing again.  Waits for a renewal under
        way for at most ``timeout_s``: one stalled on the store is left to finish (or fail)
        by itself, and the lease, not released then, lapses by itself."""
        with self._state_lock:
            self._closed = True
            if not self._await_renewal(time.monotonic() + self._timeout_s):
                log.warning(
                    "local oracle %s: closed without releasing its lease (its renewal is "
                    "still waiting for the store after %g s); it lapses by itself",
                    self.instance_id,
                    self._timeout_s,
                )
                return
            if self._renew_at and self._known is not None:
                try:
                    self._release()
                except (StoreError, OracleError):  # the lease lapses by itself
                    self._drop()

    def _reserve(self, total: int) -> int:
        """Hand out ``[first, first + total)``; returns ``first``.

        Under the lease with no store access; else from the leased block after one read
        that shows the record unchanged; else by compare-and-set.  Called by one thread at
        a time (the coalescer's leader)."""
        if not self._domain_bound:
            bind_timestamp_domain(self.store, None)  # OracleError: bound to another oracle
            self._domain_bound = True
        deadline = time.monotonic() + self._timeout_s
        attempt = 0
        last_error: Exception | None = None
        while True:
            waited = False
            try:
                with self._state_lock:
                    served = self._reserve_once(total, deadline)
                if served is not None:
                    return served
                waited = self._waiting_on is not None
                last_error = None
            except StoreUnavailableError as exc:
                last_error = exc
                with self._state_lock:
                    self._drop()
            if waited:  # another instance's live lease: ask it to release, look again
                self.lease_waits += 1
                if time.monotonic() >= deadline:
                    raise OracleUnavailableError(
                        f"local oracle could not reserve timestamps in {self.store.url} "
                        f"within {self._timeout_s:g} s: another local oracle holds a lease "
                        "and neither released it nor let it lapse"
                    )
                self._clock.sleep_ms(WAIT_POLL_MS)
                continue
            attempt += 1
            if time.monotonic() >= deadline:
                why = (
                    f"store unavailable: {last_error}"
                    if last_error
                    else (f"lost {attempt} compare-and-set races in a row")
                )
                raise OracleUnavailableError(
                    f"local oracle could not reserve timestamps in {self.store.url} "
                    f"within {self._timeout_s:g} s ({why})"
                )
            # Jitter so racing processes do not collide again in lock step.
            time.sleep(random.uniform(0, min(0.05, 0.0005 * 2 ** min(attempt, 7))))

    def _reserve_once(self, total: int, deadline: float) -> int | None:
        """One attempt: ``first``, or None to retry (a lost race, or a lease to wait for:
        then ``_waiting_on`` is set).  Holds the state lock."""
        if self._renew_at:
            served = self._serve_leased(total, deadline)
            if served is not None:
                return served
        if self._block_left():
            served = self._serve_from_block(total)
            if served is not None:
                return served
        stored = self._known if self._known is not None else self._register.read()
        if self._must_wait(stored):
            return None
        sent = self._clock.monotonic_ms()
        first, new = self._next_record(stored, total, sent)
        if new.leased:
            # The release request as it is now: only a later one asks this lease to end.
            self._wanted_seen = self._register.read().wanted
        if not self._compare_and_set(stored, new):
            self._drop()
            return None
        old = stored.record
        if self._alone_since is None or old is None or old.holder != self.instance_id:
            self._alone_since = sent  # the first of a run of our own reservations
        self._known = StoredRecord(new, new.encode())
        self._next = first + total
        self.reservations += 1
        if new.leased:
            self._hold_lease(sent)
        return first

    def _drop(self) -> None:
        """Forget what this instance believed it held: the next attempt reads the record."""
        self._known = None
        self._next = 0
        self._renew_at = 0.0
        self._valid_until = 0.0
        self._alone_since = None

    def _hold_lease(self, sent: float) -> None:
        """``_known`` is a lease written by a compare-and-set sent at ``sent`` (monotonic
        ms): it is valid until ``sent + lease - margin``, renewed from a quarter lease on."""
        self._renew_at = sent + self._lease_ms / 4
        self._valid_until = sent + self._lease_ms - lease_margin_ms(self._lease_ms)

    def _serve_leased(self, total: int, deadline: float) -> int | None:
        """``first`` of ``total`` timestamps under the lease; None once the lease is gone
        (released or lost).  From ``_renew_at`` on, renews the lease first, or (renewing in
        the background) starts a renewal and serves meanwhile, waiting for one only when the
        lease's validity is over or the block is too small."""
        while True:
            known = self._lease()
            if known is None or known.record is None:
                return None  # a renewal ended the lease (released on request, or lost)
            first = max(self._next, compose(self._clock.wall_ms()))
            needed = first + total - 1
            now = self._clock.monotonic_ms()
            urgent = now >= self._valid_until or needed > known.record.high_water
            if not (urgent and self._renewing):
                break
            # The renewal under way decides; then look again.  A renewal stalled on the
            # store must not hold this batch past the oracle's timeout.
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self._renewed.wait(remaining):
                raise OracleUnavailableError(
                    f"local oracle could not serve timestamps from {self.store.url} within "
                    f"{self._timeout_s:g} s: the renewal of its lease is still waiting for "
                    "the store"
                )
        due = now >= self._renew_at
        if urgent or (due and not self._background_renewal):
            # Renewing proves nobody wrote the record since our last write.
            if not self._renew(needed):
                return None
        elif due and not self._renewing:
            self._start_renewal()
        self._next = first + total
        self.leased_batches += 1
        return first

    def _lease(self) -> StoredRecord | None:
        """The leased record while this instance holds a lease, else None."""
        return self._known if self._renew_at else None

    def _await_renewal(self, deadline: float) -> bool:
        """Wait for a renewal under way to end, until ``deadline`` (``time.monotonic()``);
        whether none is under way now.  Holds the state lock."""
        while self._renewing:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self._renewed.wait(remaining):
                return not self._renewing
        return True

    def _start_renewal(self) -> None:
        """Have the renewal thread renew the lease (starting it if it is not running); the
        caller goes on serving from the lease, which stays valid meanwhile.  Holds the
        state lock."""
        self._renewing = True
        if self._renewer is not None:
            self._renewed.notify_all()
            return
        renewer = threading.Thread(
            target=self._renewal_loop, name="percolator-oracle-renewal", daemon=True
        )
        try:
            renewer.start()
        except RuntimeError:  # no new threads (interpreter shutting down): renew when due
            self._renewing = False
            return
        self._renewer = renewer

    def _renewal_loop(self) -> None:
        """The renewal thread: one renewal each time one is asked for; ends after
        :data:`RENEWER_IDLE_S` without one (the next request starts a new thread)."""
        try:
            while True:
                with self._state_lock:
                    while not self._renewing:
                        if not self._renewed.wait(RENEWER_IDLE_S) and not self._renewing:
                            # Under the lock: a request from here on starts a new thread.
                            self._renewer = None
                            return
                self._renew_in_background()
        finally:
            # Ending by an error: nobody may wait on a renewal this thread will not make.
            with self._state_lock:
                if self._renewer is threading.current_thread():
                    self._renewer = None
                    self._renewing = False
                    self._renewed.notify_all()

    def _renew_in_background(self) -> None:
        """One renewal, with the store's round trips made without the state lock (the
        leader serves from the lease meanwhile).  Nobody else writes the record while it
        runs (``_renewing``), so ``_known`` is still the bytes it renews from when it is done."""
        try:
            with self._state_lock:
                known = self._lease()
            if known is None or known.record is None:
                return
            wanted = self._register.read().wanted
            with self._state_lock:
                if self._release_asked(wanted):
                    # Stop serving from the lease before its end is written.
                    self._release()
                    return
            sent = self._clock.monotonic_ms()
            new = self._renewed_record(known, known.record.high_water)
            applied = self._compare_and_set(known, new)
            with self._state_lock:
                self._renewal_outcome(new, sent, applied)
        except (StoreError, OracleError) as exc:
            # Outcome unknown: forget the lease (the next batch reads the record; a lease we
            # did renew is still ours there) rather than serve from bytes we may not hold.
            log.debug("local oracle %s: renewal failed: %s", self.instance_id, exc)
            with self._state_lock:
                self._drop()
        finally:
            with self._state_lock:
                self._renewing = False
                self._renewed.notify_all()

    def _renew(self, needed: int) -> bool:
        """Renew the lease now, raising the mark to at least ``needed``; or release it when
        someone asked.  True if the lease is held afterwards.  Holds the state lock, with no
        renewal under way."""
        known = self._known
        assert known is not None and known.record is not None
        if self._release_asked(self._register.read().wanted):
            self._release()
            return False
        sent = self._clock.monotonic_ms()
        new = self._renewed_record(known, needed)
        return self._renewal_outcome(new, sent, self._compare_and_set(known, new))

    def _release_asked(self, wanted: bytes | None) -> bool:
        """Whether the lease must end rather than be renewed: the release request cell
        (``wanted``, as just read) changed since the lease was taken, or close() was
        called."""
        return wanted != self._wanted_seen or self._closed

    def _renewal_outcome(self, new: OracleRecord, sent: float, applied: bool) -> bool:
        """Hold ``new``, written by a compare-and-set sent at ``sent``, if it ``applied``;
        else the holder was paused past its lease and someone took over: serve nothing
        more from it.  True if the lease is held.  Holds the state lock."""
        if not applied:
            self._drop()
            return False
        self._known = StoredRecord(new, new.encode())
        self._hold_lease(sent)
        self.reservations += 1
        return True

    def _renewed_record(self, known: StoredRecord, needed: int) -> OracleRecord:
        """``known``'s lease renewed from now: the mark at least ``needed`` and a lease
        ahead of the wall clock."""
        assert known.record is not None
        wall = self._clock.wall_ms()
        return OracleRecord(
            epoch=known.record.epoch,
            high_water=max(known.record.high_water, needed, compose(wall + self._lease_ms) - 1),
            holder=self.instance_id,
            # Strictly later than the last expiry even if the wall clock stood still or
            # stepped back: a renewal always changes the bytes, which is what tells a
            # waiter the holder is alive.
            lease_expiry_ms=max(wall + self._lease_ms, known.record.lease_expiry_ms + 1),
            lease_ms=self._lease_ms,
        )

    def _release(self) -> None:
        """Write the record back without a lease, keeping the mark (the rest of the block
        is still ours, validated by a read like any block).  After a lost race, drop."""
        known = self._known
        assert known is not None and known.record is not None
        new = OracleRecord(
            epoch=known.record.epoch, high_water=known.record.high_water, holder=self.instance_id
        )
        self._renew_at = 0.0
        self._valid_until = 0.0
        self._alone_since = None
        # Whoever asked polls at its own pace (an oracle server every 250 ms): give it time
        # to find the record unleased before leasing again.
        self._no_lease_before = self._clock.monotonic_ms() + max(
            RELEASE_HOLD_OFF_MS, 10 * self._lease_ms
        )
        if self._compare_and_set(known, new):
            self._known = StoredRecord(new, new.encode())
        else:
            self._drop()

    def _must_wait(self, stored: StoredRecord) -> bool:
        """Whether ``stored`` is another local instance's lease that has not lapsed by our
        monotonic clock; if so, ask it to release.  Sets ``_waiting_on``."""
        record = stored.record
        if (
            record is None
            or not record.leased
            or not is_local_holder(record.holder)
            or record.holder == self.instance_id
        ):
            self._waiting_on = None
            return False
        mono = self._clock.monotonic_ms()
        if stored.raw != self._waiting_on:
            self._waiting_on = stored.raw
            self._waiting_since = mono
        elif mono - self._waiting_since > record.lease_ms + lease_margin_ms(record.lease_ms):
            self._waiting_on = None  # lapsed (holder crashed or paused): take it over
            return False
        self._release_asker.ask(stored)  # once per lease waited on
        self._known = None  # look again next time
        return True

    def _block_left(self) -> bool:
        """Whether a leased block may have timestamps left (only a read can tell for sure)."""
        known = self._known
        return (
            self._next > 0
            and known is not None
            and known.record is not None
            and self._next <= known.record.high_water
        )

    def _serve_from_block(self, total: int) -> int | None:
        """``first`` of ``total`` timestamps from the leased block, or None when the block is
        exhausted or someone else reserved since (then ``_known`` holds the fresh record,
        the expected bytes of the next compare-and-set)."""
        known = self._known
        assert known is not None and known.record is not None
        # The linearisation point: the record still holds our own bytes, so nobody handed
        # out anything above our block, and the block is still ours.
        stored = self._register.read()
        if stored.raw != known.raw:
            self._known = stored
            self._next = 0
            self._alone_since = None
            return None
        first = max(self._next, compose(self._clock.wall_ms()))
        if first + total - 1 > known.record.high_water:
            return None  # exhausted (or the wall clock passed its end): reserve anew
        self._next = first + total
        self.validations += 1
        return first

    def _next_record(
        self, stored: StoredRecord, total: int, sent: float
    ) -> tuple[int, OracleRecord]:
        old = stored.record
        wall = self._clock.wall_ms()
        if (
            old is not None
            and old.leased
            and not is_local_holder(old.holder)
            and wall <= old.lease_expiry_ms + self._margin_ms
        ):
            raise OracleError(
                f"timestamps for {self.store.url} are served by the oracle server "
                f"{old.holder!r} (epoch {old.epoch}, lease until {old.lease_expiry_ms} ms): "
                "connect with oracle='grpc://HOST:PORT' instead of the local oracle"
            )
        first = max((old.high_water if old is not None else 0) + 1, compose(wall))
        high_water = first + total - 1
        ours = old is not None and old.holder == self.instance_id
        if self._block_ms and ours:
            # Our second reservation in a row: nobody else is drawing timestamps right now,
            # so lease a block.  Only then: instances that alternate reserve exactly, so
            # the mark never runs more than block_ms ahead of the wall clock.
            high_water = max(high_water, compose(wall + self._block_ms) - 1)
        if (
            self._lease_ms
            and ours
            and not self._closed
            and self._alone_since is not None
            and sent - self._alone_since >= self._lease_ms
            and sent >= self._no_lease_before
        ):
            # Alone for a whole lease: lease, so later batches need no store access.
            return first, OracleRecord(
                epoch=old.epoch if old is not None else 0,
                high_water=max(high_water, compose(wall + self._lease_ms) - 1),
                holder=self.instance_id,
                lease_expiry_ms=wall + self._lease_ms,
                lease_ms=self._lease_ms,
            )
        return first, OracleRecord(
            epoch=old.epoch if old is not None else 0,
            high_water=high_water,
            holder=self.instance_id,
        )

    def _compare_and_set(self, stored: StoredRecord, new: OracleRecord) -> bool:
        try:
            return self._register.compare_and_set(stored.raw, new)
        except StoreUnavailableError:
            # Unknown outcome: only our own bytes in the register prove it was applied (they
            # name this instance and a mark nobody else writes).  Otherwise hand out
            # nothing from this range; a wasted range is a harmless gap.
            return self._register.read().raw == new.encode()

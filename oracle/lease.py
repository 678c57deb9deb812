"""The lease state machine of one oracle server process (no threads, no gRPC).

Roles
-----
STANDBY
    Reads the record every ``poll_ms``.  It takes the lease over only once the current
    lease has lapsed, judged two ways, either of which suffices:

    * by the wall clock: ``now > lease_expiry_ms + margin_ms``; this lets an oracle that
      restarts long after its predecessor died start at once, and assumes the oracles'
      wall clocks differ by less than ``margin_ms``;
    * by its own monotonic clock: the record has not changed for ``lease_ms + margin_ms``
      since this process first saw it; this needs no clock agreement at all.

    A live lease of a local oracle (holder ``local:...``) is waited out by the monotonic
    clock only (its expiry comes from a client host's wall clock); each poll meanwhile asks
    it to release early (see :mod:`percolator.timestamps.local`).

    Taking over is one compare-and-set from the exact bytes read, which bumps the epoch,
    names this process as holder, and sets a new high-water mark ``window_ms`` ahead.
    Everything issued afterwards is strictly above the old high-water mark.
ACTIVE
    Hands out timestamps ``max(last_issued + 1, now_ms << 18)``, never above the persisted
    high-water mark (if a request would go above it, the mark is raised by compare-and-set
    first).  Every ``renew_ms`` it renews the lease and pushes the mark ahead, again by
    compare-and-set from the bytes it last wrote.

    It serves only while its lease is valid **by its own monotonic clock**: until
    ``sent + lease_ms - margin_ms``, where ``sent`` is when the last successful
    compare-and-set was *sent* (the store applied it at or after that).  A standby's
    monotonic wait starts at or after the store applied the write, so the two intervals do
    not overlap even if wall clocks disagree.  The check runs before every allocation and
    again, through :meth:`OracleNode.confirm`, just before a response leaves, so a process
    that was paused (SIGSTOP) with a range already prepared hands out nothing on waking.
    Responses also carry the validity as a wall-clock time so clients can discard a response
    that was delayed past it.
FENCED
    Not a role of its own: a lost compare-and-set (someone else wrote the record) or a
    lapsed validity drops the process back to STANDBY at once and is logged and counted.
STOPPING
    Shutting down; serves nothing; :meth:`OracleNode.release` ends the lease early so a
    standby can take over after only ``margin_ms``.

Unknown outcomes
----------------
A compare-and-set that raises :class:`~percolator.errors.StoreUnavailableError` may have
been applied.  The node re-reads: its own new bytes mean it was applied; the old bytes mean
it was not; anything else means someone else wrote the record, so this process is fenced.
The new bytes are unique to this process (they name it), so the re-read cannot be fooled.
"""

from __future__ import annotations

import enum
import logging
import math
import threading
from dataclasses import dataclass

from percolator.errors import (
    FencedError,
    InvalidArgumentError,
    OracleError,
    OracleUnavailableError,
    StoreError,
    StoreUnavailableError,
)
from percolator.timestamps import LOGICAL_BITS, compose, describe
from percolator.timestamps.clock import SYSTEM_CLOCK, Clock
from percolator.timestamps.record import (
    OracleRecord,
    OracleRecordRegister,
    ReleaseAsker,
    StoredRecord,
    is_local_holder,
)

log = logging.getLogger("oracle")

DEFAULT_MAX_COUNT = 1 << 20


@dataclass(frozen=True)
class LeaseConfig:
    """Timing of the lease.  ``margin_ms`` is the allowance for clock drift and for the
    delay between a check and a response leaving the process."""

    lease_ms: int = 3000
    window_ms: int = 3000
    margin_ms: int = 500
    max_count: int = DEFAULT_MAX_COUNT

    def __post_init__(self) -> None:
        if self.margin_ms <= 0:
            raise InvalidArgumentError(f"margin must be > 0 ms, got {self.margin_ms}")
        if self.lease_ms < 3 * self.margin_ms:
            raise InvalidArgumentError(
                f"lease ({self.lease_ms} ms) must be at least 3x the clock margin "
                f"({self.margin_ms} ms): the lease is only trusted for lease - margin"
            )
        if self.lease_ms >= 1 << 31:
            raise InvalidArgumentError(f"lease of {self.lease_ms} ms is absurdly long")
        if not 0 < self.window_ms < 1 << 31:
            raise InvalidArgumentError(f"window must be in (0, 2**31) ms, got {self.window_ms}")
        if not 1 <= self.max_count <= 1 << 24:
            raise InvalidArgumentError(f"max count {self.max_count} out of range")

    @property
    def renew_ms(self) -> float:
        """How often an active oracle renews: three chances per trusted lease period."""
        return (self.lease_ms - self.margin_ms) / 3

    @property
    def poll_ms(self) -> float:
        """How often a standby reads the record."""
        return max(20.0, min(250.0, self.lease_ms / 4))


class Role(enum.Enum):
    STANDBY = "standby"
    ACTIVE = "active"
    STOPPING = "stopping"


@dataclass(frozen=True)
class Allocation:
    """A range ``[first, first + count)`` issued under ``epoch``, trusted by its issuer
    until wall-clock ``valid_until_ms``."""

    first: int
    count: int
    epoch: int
    valid_until_ms: int


@dataclass(frozen=True)
class NodeInfo:
    role: Role
    holder_id: str
    epoch: int
    high_water: int
    last_issued: int
    lease_expiry_ms: int
    lease_holder_id: str
    timestamps_issued: int
    allocate_calls: int
    renewals: int
    fenced: int


class OracleNode:
    """One oracle process's view of the lease.  Thread-safe.

    :meth:`step` drives elections and renewals and is called by one driver thread (or by a
    test); :meth:`allocate` and :meth:`confirm` are called by request handlers.
    """

    def __init__(
        self,
        register: OracleRecordRegister,
        holder_id: str,
        config: LeaseConfig | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        if not holder_id:
            raise InvalidArgumentError("oracle holder id must not be empty")
        self.register = register
        self.holder_id = holder_id
        self.config = config or LeaseConfig()
        self.clock = clock
        self._lock = threading.Lock()  # guards the state below; never held across I/O
        self._cas_lock = threading.Lock()  # one compare-and-set in flight at a time
        self._role = Role.STANDBY
        self._epoch = 0
        self._raw: bytes | None = None  # the bytes this process last wrote (while ACTIVE)
        self._record: OracleRecord | None = None  # the last record seen or written
        self._high_water = 0  # persisted mark of our lease; nothing above it is issued
        self._last_issued = 0
        self._valid_until_mono = -math.inf
        self._observed_raw: bytes | None = None  # standby: the record being waited out
        self._observed_since = 0.0
        self._issued = 0
        self._allocate_calls = 0
        self._renewals = 0
        self._fenced = 0
        self._release_asker = ReleaseAsker(register, holder_id)  # standby: local leases

    # ------------------------------------------------------------------ state

    @property
    def role(self) -> Role:
        return self._role

    @property
    def epoch(self) -> int:
        return self._epoch

    def info(self) -> NodeInfo:
        with self._lock:
            record = self._record
            return NodeInfo(
                role=self._role,
                holder_id=self.holder_id,
                epoch=self._epoch if self._role is Role.ACTIVE else (record.epoch if record else 0),
                high_water=record.high_water if record else 0,
                last_issued=self._last_issued,
                lease_expiry_ms=record.lease_expiry_ms if record else 0,
                lease_holder_id=record.holder if record and record.leased else "",
                timestamps_issued=self._issued,
                allocate_calls=self._allocate_calls,
                renewals=self._renewals,
                fenced=self._fenced,
            )

    # ------------------------------------------------------------------ driver

    def step(self) -> float:
        """One election or renewal step; returns milliseconds until the next one.

        Store failures are logged and retried on the next step; they never raise."""
        role = self._role
        try:
            if role is Role.ACTIVE:
                self._renew()
                return self.config.renew_ms
            if role is Role.STANDBY:
                self._try_take_over()
        except StoreError as exc:
            log.warning("oracle %s: store error (%s); retrying", self.holder_id, exc)
        except OracleError as exc:
            # A record this code cannot decode: never overwrite it, keep waiting.
            log.error("oracle %s: %s", self.holder_id, exc)
        return self.config.renew_ms if self._role is Role.ACTIVE else self.config.poll_ms

    def _target_high_water(self, base: int, wall: int) -> int:
        """A mark ``window_ms`` of physical time ahead of both ``base`` and the clock."""
        return max(base, compose(wall)) + (self.config.window_ms << LOGICAL_BITS)

    def _lapsed(self, record: OracleRecord, raw: bytes, wall: int, mono: float) -> bool:
        if raw != self._observed_raw:
            self._observed_raw = raw
            self._observed_since = mono
        margin = self.config.margin_ms
        if is_local_holder(record.holder):
            # A local oracle's lease: by our monotonic clock only.  Its expiry is from a
            # client host's wall clock, which the servers' clock margin says nothing about.
            return mono - self._observed_since > record.lease_ms + margin
        return (
            wall > record.lease_expiry_ms + margin
            or mono - self._observed_since > record.lease_ms + margin
        )

    def _try_take_over(self) -> None:
        stored = self.register.read()
        wall = self.clock.wall_ms()
        mono = self.clock.monotonic_ms()
        old = stored.record
        with self._lock:
            self._record = old
        if old is not None and old.leased:
            assert stored.raw is not None
            if not self._lapsed(old, stored.raw, wall, mono):
                if is_local_holder(old.holder):
                    # A local oracle's short lease: ask it to end early, once per lease (it
                    # is only a hint; the lapse above is what makes taking over safe).
                    self._release_asker.ask(stored)
                return
        floor = old.high_water if old is not None else 0
        with self._cas_lock:
            sent, wall = self._lease_start()
            with self._lock:
                base = max(floor, self._last_issued)
            new = OracleRecord(
                epoch=(old.epoch if old is not None else 0) + 1,
                high_water=self._target_high_water(base, wall),
                holder=self.holder_id,
                lease_expiry_ms=wall + self.config.lease_ms,
                lease_ms=self.config.lease_ms,
            )
            if not self._compare_and_set(stored, new):
                log.info("oracle %s: lost the take-over race; staying standby", self.holder_id)
                return
            with self._lock:
                self._raw = new.encode()
                self._record = new
                if self._role is not Role.STANDBY:  # stopped meanwhile: release() gives it back
                    return
                self._role = Role.ACTIVE
                self._epoch = new.epoch
                self._high_water = new.high_water
                # Strictly above everything anyone issued under earlier records.
                self._last_issued = max(self._last_issued, floor)
                self._valid_until_mono = sent + self.config.lease_ms - self.config.margin_ms
                self._observed_raw = None
        log.warning(
            "oracle %s: ACTIVE with epoch %d, issuing above %s (previous holder %r)",
            self.holder_id,
            new.epoch,
            describe(floor),
            old.holder if old is not None else None,
        )

    def _renew(self) -> None:
        self._extend(required=0)

    def _extend(self, required: int) -> None:
        """Renew the lease and push the high-water mark to at least ``required``.

        Raises nothing when fenced (the role changes instead); raises
        StoreUnavailableError when the store cannot be reached."""
        with self._cas_lock:
            sent, wall = self._lease_start()
            with self._lock:
                if self._role is not Role.ACTIVE or self._raw is None or self._record is None:
                    return
                expected = self._raw
                old = self._record
                base = max(self._last_issued, required)
                new = OracleRecord(
                    epoch=self._epoch,
                    high_water=max(self._high_water, self._target_high_water(base, wall)),
                    holder=self.holder_id,
                    lease_expiry_ms=wall + self.config.lease_ms,
                    lease_ms=self.config.lease_ms,
                )
            if new == old:
                return
            applied = self._compare_and_set(StoredRecord(old, expected), new)
            with self._lock:
                if self._raw != expected:  # fenced by a lapsed validity meanwhile
                    return
                if not applied:
                    if self._role is Role.ACTIVE:
                        self._fence_locked("another process changed the oracle record")
                    self._raw = None
                    return
                # Recorded even when stopping meanwhile, so release() expects the right bytes.
                self._raw = new.encode()
                self._record = new
                self._high_water = new.high_water
                self._valid_until_mono = sent + self.config.lease_ms - self.config.margin_ms
                self._renewals += 1

    def _lease_start(self) -> tuple[float, int]:
        """``(sent, wall)`` for a lease about to be written: the monotonic reading is taken
        first, so the lease this process trusts (``sent + lease - margin``) ends before the
        persisted expiry (``wall + lease``) however long the compare-and-set then takes, and
        the store applies the write no earlier than ``sent``."""
        sent = self.clock.monotonic_ms()
        return sent, self.clock.wall_ms()

    def _compare_and_set(self, stored: StoredRecord, new: OracleRecord) -> bool:
        """Compare-and-set; an unknown outcome is settled by re-reading (see module doc).
        Raises StoreUnavailableError if even the re-read fails."""
        try:
            return self.register.compare_and_set(stored.raw, new)
        except StoreUnavailableError as exc:
            log.warning(
                "oracle %s: compare-and-set outcome unknown (%s); re-reading", self.holder_id, exc
            )
            current = self.register.read()
            if current.raw == new.encode():
                return True
            if current.raw == stored.raw:
                raise  # certainly not applied; the next step tries again
            return False

    def _fence_locked(self, why: str) -> None:
        log.error(
            "oracle %s: FENCED at epoch %d: %s; serving nothing, back to standby",
            self.holder_id,
            self._epoch,
            why,
        )
        self._role = Role.STANDBY
        self._raw = None
        self._valid_until_mono = -math.inf
        self._fenced += 1

    # ------------------------------------------------------------------ serving

    def _check_serving_locked(self, mono: float) -> None:
        if self._role is Role.STOPPING:
            raise OracleUnavailableError(f"oracle {self.holder_id} is shutting down")
        if self._role is Role.STANDBY:
            record = self._record
            active = (
                f"; lease held by {record.holder!r} (epoch {record.epoch})"
                if (record is not None and record.leased and record.holder != self.holder_id)
                else ""
            )
            raise OracleUnavailableError(f"oracle {self.holder_id} is a standby{active}")
        if mono >= self._valid_until_mono:
            epoch = self._epoch
            self._fence_locked("its lease lapsed before it could renew it")
            raise FencedError(
                f"oracle {self.holder_id} lost its lease (epoch {epoch}): not serving"
            )
        record = self._record
        if record is not None and self.clock.wall_ms() >= record.lease_expiry_ms:
            # A standby takes over once its wall clock passes the stored expiry (plus the
            # margin); ours passing it means the wall clock stepped forward (on one host,
            # the standby's did too), and serving on would issue beside the next holder.
            epoch = self._epoch
            self._fence_locked("its wall clock passed the lease's expiry (a clock step?)")
            raise FencedError(
                f"oracle {self.holder_id} stopped serving at epoch {epoch}: its wall clock "
                "passed the lease's stored expiry"
            )

    def allocate(self, count: int) -> Allocation:
        """Issue ``count`` consecutive timestamps.

        Raises :class:`InvalidArgumentError` for a bad count, :class:`FencedError` if the
        lease lapsed, and :class:`OracleUnavailableError` if this process is not the active
        oracle or cannot persist a higher mark.  Call :meth:`confirm` just before the
        result leaves the process."""
        if not isinstance(count, int) or isinstance(count, bool):
            raise InvalidArgumentError(f"count must be an int, got {count!r}")
        if not 1 <= count <= self.config.max_count:
            raise InvalidArgumentError(
                f"count must be in [1, {self.config.max_count}], got {count}"
            )
        for attempt in range(2):
            with self._lock:
                if attempt == 0:
                    self._allocate_calls += 1
                mono = self.clock.monotonic_ms()
                self._check_serving_locked(mono)
                wall = self.clock.wall_ms()
                first = max(self._last_issued + 1, compose(wall))
                last = first + count - 1
                if last <= self._high_water:
                    self._last_issued = last
                    self._issued += count
                    return Allocation(
                        first=first,
                        count=count,
                        epoch=self._epoch,
                        valid_until_ms=wall + int(self._valid_until_mono - mono),
                    )
            # Above the persisted mark: raise it before issuing (rare: renewals keep the
            # mark window_ms ahead of the clock).
            try:
                self._extend(required=last)
            except StoreUnavailableError as exc:
                raise OracleUnavailableError(
                    f"oracle {self.holder_id} cannot persist its high-water mark: {exc}"
                ) from exc
        raise OracleUnavailableError(
            f"oracle {self.holder_id} could not raise its high-water mark to {describe(last)}"
        )

    def confirm(self, allocation: Allocation) -> None:
        """The last check before a response leaves: raises :class:`FencedError` unless the
        lease the allocation was issued under is still ours and still valid now."""
        with self._lock:
            mono = self.clock.monotonic_ms()
            if self._role is Role.ACTIVE and self._epoch == allocation.epoch:
                self._check_serving_locked(mono)
                return
        raise FencedError(
            f"oracle {self.holder_id} no longer holds the lease of epoch {allocation.epoch}: "
            "discarding a prepared range"
        )

    # ------------------------------------------------------------------ shutdown

    def stop(self) -> None:
        """Serve nothing from now on.  Idempotent."""
        with self._lock:
            self._role = Role.STOPPING

    def release(self) -> None:
        """After :meth:`stop` and after in-flight responses are out: end the lease early by
        compare-and-set, so a standby waits only ``margin_ms``.  Best effort: failing to
        release only delays the successor until the lease lapses."""
        with self._cas_lock:
            with self._lock:
                raw, record = self._raw, self._record
                self._raw = None
            if raw is None or record is None:
                return
            released = OracleRecord(
                epoch=record.epoch,
                high_water=record.high_water,
                holder=self.holder_id,
                lease_expiry_ms=self.clock.wall_ms(),
                lease_ms=record.lease_ms,
            )
            try:
                if self.register.compare_and_set(raw, released):
                    log.warning(
                        "oracle %s: released the lease of epoch %d", self.holder_id, record.epoch
                    )
            except StoreError as exc:
                log.warning("oracle %s: could not release the lease (%s)", self.holder_id, exc)

    def run(self, stop: threading.Event) -> None:
        """Drive :meth:`step` until ``stop`` is set (the server's driver thread)."""
        while not stop.is_set():
            try:
                delay_ms = self.step()
            except Exception:
                # A bug, but the driver must outlive it: without renewals the process would
                # stop serving for good.  Serving stays safe: it is bounded by the lease.
                log.exception("oracle %s: unexpected error in the lease driver", self.holder_id)
                delay_ms = self.config.poll_ms
            stop.wait(delay_ms / 1000.0)

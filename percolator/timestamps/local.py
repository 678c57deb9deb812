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

import os
import random
import secrets
import socket
import time

from percolator.errors import (
    InvalidArgumentError,
    OracleError,
    OracleUnavailableError,
    StoreUnavailableError,
)
from percolator.store.base import Store
from percolator.timestamps.clock import SYSTEM_CLOCK, Clock
from percolator.timestamps.coalesce import Coalescer, CoalescerStats
from percolator.timestamps.hybrid import compose
from percolator.timestamps.record import OracleRecord, OracleRecordRegister, StoredRecord
from percolator.timestamps.source import TimestampOracle

DEFAULT_MAX_BATCH = 1 << 16
#: How far ahead of the wall clock a leased block runs (see the module docstring): one
#: compare-and-set per this many milliseconds of an uncontended instance's life.
DEFAULT_BLOCK_MS = 100


class LocalOracle(TimestampOracle):
    """Timestamps reserved by compare-and-set in ``store``; see the module docstring.

    Thread-safe; many instances in many processes may share one store.  ``timeout_s``
    bounds how long one batch keeps retrying under contention or store outages before
    raising :class:`OracleUnavailableError`.  ``block_ms`` (>= 0) is how far ahead of the
    wall clock a leased block runs; 0 reserves every batch exactly.
    """

    def __init__(
        self,
        store: Store,
        *,
        margin_ms: int = 500,
        timeout_s: float = 30.0,
        max_batch: int = DEFAULT_MAX_BATCH,
        block_ms: int = DEFAULT_BLOCK_MS,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        if not isinstance(block_ms, int) or isinstance(block_ms, bool) or block_ms < 0:
            raise InvalidArgumentError(f"block_ms must be an int >= 0, got {block_ms!r}")
        self.store = store
        self.instance_id = f"local:{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
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
        self.reservations = 0  # successful compare-and-sets on the record
        self.validations = 0  # batches served from a block after one read
        self._coalescer = Coalescer(self._reserve, max_batch)

    @property
    def stats(self) -> CoalescerStats:
        """``fetches`` is the number of batches served (each costs one compare-and-set, or
        one read when served from a leased block: see :attr:`reservations` and
        :attr:`validations`)."""
        return self._coalescer.stats

    def get_timestamp(self) -> int:
        return self._coalescer.take(1)[0]

    def get_timestamps(self, count: int) -> list[int]:
        return self._coalescer.take(count)

    def _reserve(self, total: int) -> int:
        """Hand out ``[first, first + total)``; returns ``first``.

        From the leased block after one read that shows the record unchanged, else by
        compare-and-set.  Called by one thread at a time (the coalescer's leader)."""
        deadline = time.monotonic() + self._timeout_s
        attempt = 0
        last_error: Exception | None = None
        while True:
            try:
                if self._block_left():
                    served = self._serve_from_block(total)
                    if served is not None:
                        return served
                stored = self._known if self._known is not None else self._register.read()
                first, new = self._next_record(stored, total)
                if self._compare_and_set(stored, new):
                    self._known = StoredRecord(new, new.encode())
                    self._next = first + total
                    self.reservations += 1
                    return first
                last_error = None
            except StoreUnavailableError as exc:
                last_error = exc
            # Lost a race with another process (or the store is down): re-read and retry.
            self._known = None
            self._next = 0
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
            return None
        first = max(self._next, compose(self._clock.wall_ms()))
        if first + total - 1 > known.record.high_water:
            return None  # exhausted (or the wall clock passed its end): reserve anew
        self._next = first + total
        self.validations += 1
        return first

    def _next_record(self, stored: StoredRecord, total: int) -> tuple[int, OracleRecord]:
        old = stored.record
        wall = self._clock.wall_ms()
        if old is not None and old.leased and wall <= old.lease_expiry_ms + self._margin_ms:
            raise OracleError(
                f"timestamps for {self.store.url} are served by the oracle server "
                f"{old.holder!r} (epoch {old.epoch}, lease until {old.lease_expiry_ms} ms): "
                "connect with oracle='grpc://HOST:PORT' instead of the local oracle"
            )
        first = max((old.high_water if old is not None else 0) + 1, compose(wall))
        high_water = first + total - 1
        if self._block_ms and old is not None and old.holder == self.instance_id:
            # Our second reservation in a row: nobody else is drawing timestamps right now,
            # so lease a block.  Only then: instances that alternate reserve exactly, so
            # the mark never runs more than block_ms ahead of the wall clock.
            high_water = max(high_water, compose(wall + self._block_ms) - 1)
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

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
order: a transaction that starts after another committed must read its writes.  Windows
ahead are only sound for a single holder fenced by a lease, which is what the gRPC oracle
server does.  Here, concurrent requests within one process are coalesced into one
compare-and-set in flight (:mod:`percolator.timestamps.coalesce`), so the cost is one store
round trip per batch, not per timestamp; the record's bytes from the last successful write
are cached, so an uncontended batch costs exactly one compare-and-set.

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


class LocalOracle(TimestampOracle):
    """Timestamps reserved by compare-and-set in ``store``; see the module docstring.

    Thread-safe; many instances in many processes may share one store.  ``timeout_s``
    bounds how long one batch keeps retrying under contention or store outages before
    raising :class:`OracleUnavailableError`.
    """

    def __init__(
        self,
        store: Store,
        *,
        margin_ms: int = 500,
        timeout_s: float = 30.0,
        max_batch: int = DEFAULT_MAX_BATCH,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.store = store
        self.instance_id = f"local:{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self._register = OracleRecordRegister(store)
        self._margin_ms = margin_ms
        self._timeout_s = timeout_s
        self._clock = clock
        # What this instance last wrote: the expected bytes of its next compare-and-set.
        # None: unknown, read the record first.
        self._known: StoredRecord | None = None
        self._coalescer = Coalescer(self._reserve, max_batch)

    @property
    def stats(self) -> CoalescerStats:
        """``fetches`` is the number of successful reservations (compare-and-sets)."""
        return self._coalescer.stats

    def get_timestamp(self) -> int:
        return self._coalescer.take(1)[0]

    def get_timestamps(self, count: int) -> list[int]:
        return self._coalescer.take(count)

    def _reserve(self, total: int) -> int:
        """Reserve ``[first, first + total)`` by compare-and-set; returns ``first``.

        Called by one thread at a time (the coalescer's leader)."""
        deadline = time.monotonic() + self._timeout_s
        attempt = 0
        last_error: Exception | None = None
        while True:
            try:
                stored = self._known if self._known is not None else self._register.read()
                first, new = self._next_record(stored, total)
                if self._compare_and_set(stored, new):
                    self._known = StoredRecord(new, new.encode())
                    return first
                last_error = None
            except StoreUnavailableError as exc:
                last_error = exc
            # Lost a race with another process (or the store is down): re-read and retry.
            self._known = None
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
        return first, OracleRecord(
            epoch=old.epoch if old is not None else 0,
            high_water=first + total - 1,
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

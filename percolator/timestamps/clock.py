"""The two clocks the timestamp sources read, and how to wait on them.  Injectable: tests
need no sleeps."""

from __future__ import annotations

import time
from typing import Protocol

from percolator.timestamps.hybrid import now_ms


class Clock(Protocol):
    """The two clocks the lease logic and the local oracle use."""

    def wall_ms(self) -> int:
        """Wall-clock milliseconds since the epoch (the physical part of timestamps)."""
        ...

    def monotonic_ms(self) -> float:
        """A clock that never jumps; only differences between readings are meaningful."""
        ...

    def sleep_ms(self, ms: float) -> None:
        """Wait ``ms`` milliseconds of this clock's time."""
        ...


class SystemClock:
    def wall_ms(self) -> int:
        return now_ms()

    def monotonic_ms(self) -> float:
        return time.monotonic() * 1000.0

    def sleep_ms(self, ms: float) -> None:
        time.sleep(ms / 1000.0)


SYSTEM_CLOCK = SystemClock()

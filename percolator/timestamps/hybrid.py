"""Hybrid timestamps: the 64-bit format every timestamp of the engine has.

A timestamp is a 64-bit integer ``physical_ms << LOGICAL_BITS | logical``: the physical part
is wall-clock milliseconds, the logical part counts timestamps handed out within one
millisecond.  Lock ages and TTLs are computed from the physical part, so a lock's age needs
no clock other than the timestamps themselves.

Hybrid timestamps are always far above the millisecond server timestamps HBase stamps on
compare-and-set cells (``2**18`` times larger), which the read path relies on: a read with
an exclusive upper bound of ``read_ts + 1`` always sees the lock cell.
"""

from __future__ import annotations

import time

LOGICAL_BITS = 18
LOGICAL_MASK = (1 << LOGICAL_BITS) - 1


def compose(physical_ms: int, logical: int = 0) -> int:
    """The timestamp for a physical millisecond and a logical counter."""
    if not 0 <= logical <= LOGICAL_MASK:
        raise ValueError(f"logical part {logical} outside [0, {LOGICAL_MASK}]")
    return (physical_ms << LOGICAL_BITS) | logical


def physical_ms(ts: int) -> int:
    """Wall-clock milliseconds of a timestamp."""
    return ts >> LOGICAL_BITS


def logical(ts: int) -> int:
    return ts & LOGICAL_MASK


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def wall_timestamp(at_ms: int | None = None) -> int:
    """A timestamp for a wall-clock time (logical part 0), for TTL and safe-point arithmetic."""
    return compose(now_ms() if at_ms is None else at_ms)


def describe(ts: int) -> str:
    """Human-readable form: ``1700000000123.5`` style plus ISO time, for logs and errors."""
    ms = physical_ms(ts)
    iso = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms / 1000))
    return f"{ts} ({iso}.{ms % 1000:03d}Z +{logical(ts)})"

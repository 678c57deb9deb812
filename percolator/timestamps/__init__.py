"""Timestamps: the hybrid format, the oracle interface, and the in-process oracle.

* :mod:`~percolator.timestamps.hybrid`: the 64-bit hybrid timestamp (physical milliseconds
  and a logical counter) and its arithmetic.
* :class:`~percolator.timestamps.source.TimestampOracle`: what every timestamp source
  promises (strictly increasing across threads, processes, restarts and fail-overs).
* :class:`~percolator.timestamps.local.LocalOracle`: the in-process oracle persisted in the
  store by compare-and-set (:mod:`~percolator.timestamps.record` is the persisted record,
  :mod:`~percolator.timestamps.coalesce` shares one reservation among concurrent callers);
  the default of ``percolator.connect(oracle=None)``.
* :func:`~percolator.timestamps.factory.open_oracle`: the oracle an ``oracle=`` spec names;
  other oracles (the gRPC one in :mod:`percolator.oracle`) plug in by URL scheme.
* :mod:`~percolator.timestamps.clock`: the injectable wall and monotonic clocks.

See docs/oracle.md.
"""

from __future__ import annotations

from percolator.timestamps.hybrid import (
    LOGICAL_BITS,
    LOGICAL_MASK,
    compose,
    describe,
    logical,
    now_ms,
    physical_ms,
    wall_timestamp,
)
from percolator.timestamps.local import LocalOracle
from percolator.timestamps.source import TimestampOracle

__all__ = [
    "LOGICAL_BITS",
    "LOGICAL_MASK",
    "LocalOracle",
    "TimestampOracle",
    "compose",
    "describe",
    "logical",
    "now_ms",
    "physical_ms",
    "wall_timestamp",
]

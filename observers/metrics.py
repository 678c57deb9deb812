"""The worker's metrics, on the project's metrics mechanism (:mod:`percolator.metrics`).

The worker defines its counters, histogram and gauges on a :class:`Registry` (names in
docs/observers.md); most are labelled by ``observer``, and the worker declares its observers'
names when it starts so every series is exposed at zero before the first run.
:class:`MetricsServer` serves them at ``/metrics`` with ``/healthz``.
"""

from __future__ import annotations

from percolator.metrics import Labels, MetricsServer, Registry, parse_text

# Commit-to-run latency buckets, in seconds.
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

__all__ = ["LATENCY_BUCKETS", "Labels", "MetricsServer", "Registry", "parse_text"]

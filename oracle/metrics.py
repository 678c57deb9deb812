"""The oracle server's metrics, on the project's metrics mechanism (:mod:`percolator.metrics`).

Names and meanings are documented in docs/oracle.md.  Counters start at zero: the request
counter is declared for every (method, code) a server answers with, so a scrape shows each
series before its first request.
"""

from __future__ import annotations

from percolator.oracle.lease import OracleNode, Role

from percolator.metrics import Registry

# Batch sizes are powers of two up to the default max count; latencies 50 us .. 5 s.
BATCH_BUCKETS = [float(1 << i) for i in range(0, 21, 2)]
LATENCY_BUCKETS = [5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 0.1, 0.5, 1, 5]

#: Every (method, status code) the server answers with (see server.py's handlers).
REQUEST_OUTCOMES = [
    ("Allocate", "OK"),
    ("Allocate", "INVALID_ARGUMENT"),
    ("Allocate", "UNAVAILABLE"),
    ("Allocate", "UNAUTHENTICATED"),
    ("AllocateStream", "UNAUTHENTICATED"),
    ("AllocateStream", "RESOURCE_EXHAUSTED"),
    ("AllocateStream", "UNAVAILABLE"),
    ("Health", "OK"),
    ("Health", "UNAUTHENTICATED"),
    ("Info", "OK"),
    ("Info", "UNAUTHENTICATED"),
]


class OracleMetrics:
    """The metrics of one oracle server process; gauges read ``node`` at scrape time."""

    def __init__(self, node: OracleNode) -> None:
        self.registry = r = Registry()
        self.requests = r.counter(
            "percolator_oracle_requests_total",
            "RPCs answered, by method and status code",
            labels=("method", "code"),
        )
        for method, code in REQUEST_OUTCOMES:
            self.requests.declare(method=method, code=code)
        self.issued = r.counter(
            "percolator_oracle_timestamps_issued_total", "Timestamps handed out in responses"
        )
        self.batch_size = r.histogram(
            "percolator_oracle_batch_size", "Timestamps per Allocate response", BATCH_BUCKETS
        )
        self.latency = r.histogram(
            "percolator_oracle_rpc_latency_seconds", "Allocate handling time", LATENCY_BUCKETS
        )
        r.gauge(
            "percolator_oracle_epoch",
            "Epoch of the lease this process holds or saw",
            lambda: node.info().epoch,
        )
        r.gauge(
            "percolator_oracle_active",
            "1 while this process holds the lease",
            lambda: 1 if node.role is Role.ACTIVE else 0,
        )
        r.gauge(
            "percolator_oracle_persisted_high_water",
            "Persisted high-water mark",
            lambda: node.info().high_water,
        )
        r.gauge(
            "percolator_oracle_last_issued",
            "Highest timestamp issued by this process",
            lambda: node.info().last_issued,
        )
        r.gauge(
            "percolator_oracle_lease_renewals",
            "Successful lease renewals",
            lambda: node.info().renewals,
        )
        r.gauge(
            "percolator_oracle_fenced", "Times this process was fenced", lambda: node.info().fenced
        )

"""The metrics of a worker (Prometheus, through observers/metrics.py): backlog and parked
cells per observer, low watermark and its lag, commit-to-run latency, committed runs,
skipped runs (already acknowledged), conflicts, failures, parkings, the age of the locks its
runs met, scanner passes and jumps."""

from __future__ import annotations

from collections.abc import Callable

from percolator.observers.metrics import LATENCY_BUCKETS, Labels, Registry

#: Lock-age buckets, in seconds: a lock met within its TTL (seconds) is ordinary; one met
#: minutes after its transaction began is a dead client's leftover or a long transaction.
LOCK_AGE_BUCKETS = (0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0, 3600.0)
LOCK_OUTCOMES = ("alive", "committed", "rolled_back")


class WorkerMetrics:
    """The instruments of one worker, in their own registry.  ``backlog`` and ``parked``
    compute the two per-observer gauges when scraped."""

    def __init__(
        self,
        backlog: Callable[[], dict[Labels, float]],
        parked: Callable[[], dict[Labels, float]],
        watermark: Callable[[], dict[Labels, float]] | None = None,
        watermark_lag: Callable[[], dict[Labels, float]] | None = None,
    ) -> None:
        self.registry = registry = Registry()
        self.runs = registry.counter(
            "percolator_observer_runs_total", "Observer runs that committed.", ("observer",)
        )
        self.skipped = registry.counter(
            "percolator_observer_skipped_total",
            "Runs that found the change already acknowledged or rolled back (cleanup only).",
            ("observer",),
        )
        self.conflicts = registry.counter(
            "percolator_observer_conflicts_total",
            "Run attempts that lost a write-write conflict (retried, not failures).",
            ("observer",),
        )
        self.failures = registry.counter(
            "percolator_observer_failures_total", "Runs that failed with an error.", ("observer",)
        )
        self.parked = registry.counter(
            "percolator_observer_parked_total",
            "Notifications parked after repeated failures.",
            ("observer",),
        )
        self.latency = registry.histogram(
            "percolator_observer_latency_seconds",
            "From the commit of an observed change to the commit of the run that saw it.",
            LATENCY_BUCKETS,
            ("observer",),
        )
        self.locks_met = registry.histogram(
            "percolator_locks_met_age_seconds",
            "Age (since its transaction started) of each lock of another transaction that "
            "this worker's runs met, by what that transaction was judged: alive (waited for "
            "or conflicted with), committed or rolled_back (resolved then).",
            LOCK_AGE_BUCKETS,
            ("outcome",),
        )
        self.passes = registry.counter(
            "percolator_scanner_passes_total", "Complete scanner passes over a table."
        )
        self.jumps = registry.counter(
            "percolator_scanner_jumps_total",
            "Times a scanner caught up with another one and jumped to a random row.",
        )
        registry.gauge(
            "percolator_observer_backlog",
            "Notifications waiting (not parked), per observer, as of the last count.",
            backlog,
        )
        registry.gauge(
            "percolator_observer_parked",
            "Parked notifications, per observer.",
            parked,
        )
        if watermark is not None:
            registry.gauge(
                "percolator_observer_watermark_seconds",
                "Low watermark per observer, as Unix time: every change committed before it "
                "is processed (percolator/watermark.py; recomputed at most every 5 s).",
                watermark,
            )
        if watermark_lag is not None:
            registry.gauge(
                "percolator_observer_watermark_lag_seconds",
                "How far each observer's low watermark is behind the current time.",
                watermark_lag,
            )

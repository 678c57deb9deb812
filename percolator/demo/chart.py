"""The demo's PNG chart: four panels from a :class:`~percolator.demo.report.DemoReport`.

1. Spark backfill: rows written per second over time;
2. observers catching up: notifications pending over time;
3. live changes: the distribution (CDF) of change -> derived data latency, per observer
   and for the whole change;
4. after the change: incremental time against the full Spark recompute.

matplotlib is imported here only (the ``demo`` extra), with the ``Agg`` backend: no display.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from percolator.demo.report import DemoReport
from percolator.demo.tracking import STAGES


def _rates(samples: list[tuple[float, int]]) -> tuple[list[float], list[float]]:
    """Rows/s between consecutive samples, as a step function over time."""
    times: list[float] = []
    rates: list[float] = []
    for (t0, r0), (t1, r1) in itertools.pairwise(samples):
        if t1 > t0:
            times.append(t0)
            rates.append((r1 - r0) / (t1 - t0))
    if times:
        times.append(samples[-1][0])
        rates.append(rates[-1])
    return times, rates


def _cdf(axes: Any, values: list[float], label: str, **style: Any) -> None:
    ordered = sorted(values)
    fractions = [(i + 1) / len(ordered) for i in range(len(ordered))]
    axes.step([0.0, *ordered], [0.0, *fractions], where="post", label=label, **style)


def write_chart(report: DemoReport, path: Path) -> Path:
    """Draw the chart into ``path`` (PNG; parent directories are created)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    figure, grid = plt.subplots(2, 2, figsize=(12, 8))
    (backfill, drain), (latency, compare) = grid

    times, rates = _rates(report.backfill_samples)
    if times:
        backfill.step(times, rates, where="post", color="tab:blue")
        backfill.fill_between(times, rates, step="post", alpha=0.2, color="tab:blue")
    rows = report.backfill_samples[-1][1] if report.backfill_samples else 0
    backfill.set_title(f"Spark backfill: {rows} documents through transactions")
    backfill.set_xlabel("seconds since the write phase began")
    backfill.set_ylabel("rows written per second")
    backfill.grid(alpha=0.3)

    if report.drain_samples:
        seconds = [s[0] for s in report.drain_samples]
        drain.plot(seconds, [s[1] for s in report.drain_samples], color="tab:orange",
                   label="notifications pending")
        drain.plot(seconds, [s[2] for s in report.drain_samples], color="tab:green",
                   label="observer runs committed")
        drain.legend(loc="center right", fontsize=8)
    drain.set_title("Observers catching up with the backfill")
    drain.set_xlabel("seconds")
    drain.grid(alpha=0.3)

    measured = [c for c in report.changes if c.total_ms is not None]
    if measured:
        for stage in STAGES:
            values = [c.stages_ms[stage] for c in measured if stage in c.stages_ms]
            if values:
                _cdf(latency, values, f"{stage} (n={len(values)})", alpha=0.8)
        _cdf(latency, [c.total_ms for c in measured if c.total_ms is not None],
             f"whole change (n={len(measured)})", color="black", linewidth=2)
        latency.legend(loc="lower right", fontsize=8)
    latency.set_title("Live changes: commit -> derived data committed")
    latency.set_xlabel("milliseconds after the change's commit")
    latency.set_ylabel("fraction of changes")
    latency.set_ylim(0, 1.05)
    latency.grid(alpha=0.3)

    bars = compare.bar(["incremental", "full Spark recompute"],
                       [report.incremental_s, report.recompute_s],
                       color=["tab:green", "tab:gray"])
    compare.bar_label(bars, fmt="%.2f s")
    compare.set_title(f"{len(report.changes)} changes: incremental is "
                      f"{report.speedup:.1f}x faster")
    compare.set_ylabel("seconds")

    figure.suptitle(f"percolator demo: {report.documents} documents, store {report.store}",
                    fontsize=10)
    figure.tight_layout()
    figure.savefig(path, format="png", dpi=100)
    plt.close(figure)
    return path

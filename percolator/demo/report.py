"""What a demo run found: the summary table it ends with, and the same as JSON."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, TextIO

from percolator.demo.tracking import STAGES, ChangeLatency


@dataclass(frozen=True)
class Step:
    """One line of the summary table."""

    name: str
    seconds: float
    rows: str
    result: str


@dataclass
class DemoReport:
    """Everything the summary, the JSON and the chart show.  Filled in step by step."""

    store: str
    run_dir: str
    documents: int
    oracle: str = ""
    chart: str = ""
    steps: list[Step] = field(default_factory=list)
    changes: list[ChangeLatency] = field(default_factory=list)
    #: (seconds into the write phase, rows written) of the Spark backfill
    backfill_samples: list[tuple[float, int]] = field(default_factory=list)
    #: (seconds into the step, notifications pending, runs committed) while catching up
    drain_samples: list[tuple[float, int, int]] = field(default_factory=list)
    incremental_s: float = 0.0
    recompute_s: float = 0.0
    derived_cells: int = 0
    identical: bool = False
    matches_reference: bool = False
    problems: list[str] = field(default_factory=list)
    total_s: float = 0.0
    cleaned: bool = False

    @property
    def ok(self) -> bool:
        return self.identical and self.matches_reference

    @property
    def speedup(self) -> float:
        return self.recompute_s / self.incremental_s if self.incremental_s > 0 else 0.0

    def latencies_ms(self) -> list[float]:
        """Measured per-change latencies, sorted."""
        return sorted(c.total_ms for c in self.changes if c.total_ms is not None)


def percentile(sorted_values: list[float], fraction: float) -> float:
    """Nearest-rank percentile of an ascending list (which must not be empty)."""
    rank = max(1, math.ceil(fraction * len(sorted_values)))
    return sorted_values[rank - 1]


def _seconds(value: float) -> str:
    return f"{value:.1f} s" if value >= 0.95 else f"{value * 1000:.0f} ms"


def print_summary(report: DemoReport, out: TextIO) -> None:
    """The summary table (step, time, rows, result) and the verdict."""
    headers = ("step", "time", "rows", "result")
    rows = [(s.name, _seconds(s.seconds), s.rows, s.result) for s in report.steps]
    rows.append(("total", _seconds(report.total_s), "", ""))
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(3)]
    print("\nsummary", file=out)
    line = f"  {{:<{widths[0]}}}  {{:>{widths[1]}}}  {{:>{widths[2]}}}  {{}}"
    print(line.format(*headers), file=out)
    print(line.format("-" * widths[0], "-" * widths[1], "-" * widths[2], "-" * 6), file=out)
    for row in rows:
        print(line.format(*row).rstrip(), file=out)
    latencies = report.latencies_ms()
    if latencies:
        print(
            f"\n  change -> every derived table updated: p50 {percentile(latencies, 0.5):.0f} ms,"
            f" p95 {percentile(latencies, 0.95):.0f} ms, max {latencies[-1]:.0f} ms "
            f"({len(latencies)} changes)",
            file=out,
        )
    if report.incremental_s and report.recompute_s:
        print(
            f"  incremental {_seconds(report.incremental_s)} vs full Spark recompute "
            f"{_seconds(report.recompute_s)}: {report.speedup:.1f}x faster",
            file=out,
        )
    failures = []
    if not report.identical:
        failures.append("incremental tables != Spark recompute")
    if not report.matches_reference:
        failures.append("incremental tables != Python reference")
    verdict = (
        "FAILED - " + ", ".join(failures)
        if failures
        else "OK - incremental tables == Spark recompute == Python reference"
    )
    print(f"  result: {verdict}", file=out)
    if report.chart:
        print(f"  chart: {report.chart}", file=out)
    data = "removed (--clean)" if report.cleaned else "kept"
    print(f"  run directory: {report.run_dir} (store data {data})", file=out)
    out.flush()


def as_json(report: DemoReport) -> dict[str, Any]:
    latencies = report.latencies_ms()
    return {
        "ok": report.ok,
        "identical": report.identical,
        "matches_reference": report.matches_reference,
        "problems": report.problems,
        "store": report.store,
        "oracle": report.oracle,
        "run_dir": report.run_dir,
        "chart": report.chart,
        "cleaned": report.cleaned,
        "documents": report.documents,
        "steps": [
            {"name": s.name, "seconds": s.seconds, "rows": s.rows, "result": s.result}
            for s in report.steps
        ],
        "changes": [
            {
                "url": c.url,
                "kind": c.kind,
                "commit_ts": c.commit_ts,
                "measured": c.measured,
                "latency_ms": c.total_ms,
                "stages_ms": {stage: c.stages_ms[stage] for stage in STAGES
                              if stage in c.stages_ms},
            }
            for c in report.changes
        ],
        "latency_ms": {
            "p50": percentile(latencies, 0.5),
            "p95": percentile(latencies, 0.95),
            "max": latencies[-1],
        } if latencies else None,
        "derived_cells": report.derived_cells,
        "incremental_s": report.incremental_s,
        "recompute_s": report.recompute_s,
        "speedup": report.speedup,
        "total_s": report.total_s,
    }

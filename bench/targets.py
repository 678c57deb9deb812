"""The project's performance targets as data (the "Goals" of the targets document,
``docs/targets.md`` in the shared docs): one :class:`Target` per goal, P1 to P13.

Each target names the benchmark step that measures it (``measured_by``, a step of
``bench/run_all``; the ``embedded_by`` step runs the same benchmark on the embedded store
for context), a small *reader* that takes the figure out of that step's JSON, the goal as a
``threshold`` with a ``direction``, and the profile (``bench/profiling.py``) whose ``focus``
operations explain a miss.  ``bench/report.py`` judges and renders them all the same way.
A target no benchmark measures yet has no reader and shows as not measured.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from bench._common import fmt_rate

J = dict[str, Any]

AT_LEAST, AT_MOST = ">=", "<="


@dataclass(frozen=True)
class Fig:
    """A median with the range of the repeats."""

    median: float
    low: float
    high: float
    count: int = 1

    @staticmethod
    def of(values: Sequence[float]) -> Fig:
        return Fig(statistics.median(values), min(values), max(values), len(values))

    @staticmethod
    def from_spread(d: J) -> Fig:
        return Fig(float(d["median"]), float(d["low"]), float(d["high"]), int(d.get("count", 1)))

    def scaled(self, factor: float) -> Fig:
        return Fig(self.median * factor, self.low * factor, self.high * factor, self.count)

    def text(self, unit: str = "x", digits: int = 2) -> str:
        """``0.22x (0.20-0.25)``, ``27.8% (23.3%-35.6%)``, ``3.033 s (3.006-3.084)``; the range
        is left out for a single repeat."""

        def one(v: float) -> str:
            return f"{v:.1%}" if unit == "%" else f"{v:.{digits}f}"

        text = one(self.median) + {"x": "x", "s": " s"}.get(unit, "")
        if self.count > 1 or self.low != self.high:
            text += f" ({one(self.low)}-{one(self.high)})"
        return text


@dataclass(frozen=True)
class Reading:
    """What a reader found in a benchmark's JSON."""

    #: the value judged against the target's threshold
    value: Fig
    #: what was measured, in words with the absolute figures
    measured: str
    #: the figure as shown (default: ``value`` as a ratio)
    figure: str = ""
    #: a short form of the figure for the plot
    label: str = ""
    #: a side condition of the goal (identical results, ...) holds
    holds: bool = True


Reader = Callable[[J], Reading]


@dataclass(frozen=True)
class Target:
    id: str
    title: str
    goal: str
    anchor: str = "-"
    #: the run_all step whose JSON the figure is read from ("" if no benchmark measures it)
    measured_by: str = ""
    #: the same benchmark on the embedded store, for context
    embedded_by: str = ""
    read: Reader | None = None
    threshold: float = math.nan
    direction: str = AT_LEAST
    #: the bench/profiling.py kind that explains a miss, and its operations to show
    profile: str = ""
    focus: tuple[str, ...] = ()
    #: for a target run_all does not measure: the benchmark that does, run by hand (its
    #: figures are in the report's hand-written sections)
    measured_outside: str = ""

    def meets(self, value: float) -> bool:
        return value >= self.threshold if self.direction == AT_LEAST else value <= self.threshold

    def score(self, value: float) -> float:
        """How far the goal is met: >= 1 meets it."""
        if self.direction == AT_LEAST:
            return value / self.threshold
        return self.threshold / value if value > 0 else math.inf


# --------------------------------------------------------------------------- readers


def _rate(timings: list[J], op: str, key: str = "item_rate") -> float:
    return statistics.median(float(t[op][key]) for t in timings)


def txn_ratio(key: str, op: str, base: str, unit: str, base_unit: str) -> Reader:
    """A ratio txn_bench computes per repeat (``ratios[key]``)."""

    def read(run: J) -> Reading:
        t = run["timings"]
        return Reading(
            Fig.from_spread(run["ratios"][key]),
            f"{op} {fmt_rate(_rate(t, op))} {unit} vs {base} {fmt_rate(_rate(t, base))} "
            f"{base_unit} ({run.get('threads')} threads)",
        )

    return read


def oracle_share(run: J) -> Reading:
    shares = run.get("oracle_share") or []
    if not shares:
        raise ValueError("txn_bench reported no oracle share")
    f = Fig.of([float(s) for s in shares])
    return Reading(
        f,
        f"{run.get('threads')} threads writing 1-cell transactions at "
        f"{fmt_rate(_rate(run['timings'], 'txn_1cell'))}/s, timestamps from the "
        f"{oracle_name(run.get('oracle', '?'))}",
        f.text("%"),
    )


def oracle_name(url: str) -> str:
    """How the report names a benchmark's oracle (its address changes every run)."""
    return "oracle server (gRPC)" if url.startswith(("grpc://", "grpcs://")) else url


def oracle_ratio(cell: J, mode: str) -> Fig:
    """``mode`` / per-rpc in timestamps/s: the ratio of the medians, with the range the
    repeats allow (lowest over highest per-rpc .. highest over lowest per-rpc).  The
    ``ranged`` mode's rates are calls/s of ``range`` timestamps each."""
    b, p = cell[mode]["rate"], cell["per-rpc"]["rate"]
    scale = float(cell[mode].get("range", 1)) if mode == "ranged" else 1.0
    return Fig(
        scale * float(b["median"]) / float(p["median"]),
        scale * float(b["low"]) / float(p["high"]),
        scale * float(b["high"]) / float(p["low"]),
        int(b.get("count", 1)),
    )


def oracle_gain(waiters: int | None) -> Reader:
    """Timestamps/s with batching over one timestamp per RPC, at ``waiters`` (None: the
    most measured).  With the most waiters, the ranged allocation (one Allocate RPC for
    many timestamps) where the benchmark measured it, else the coalescing client."""

    def read(run: J) -> Reading:
        count = waiters if waiters is not None else max(int(w) for w in run["waiters"])
        cell = run["waiters"].get(str(count))
        if cell is None:
            raise ValueError(f"the oracle benchmark did not measure {count} waiters")
        mode = "ranged" if waiters is None and "ranged" in cell else "batched"
        f = oracle_ratio(cell, mode)
        per_rpc = float(cell["per-rpc"]["rate"]["median"])
        how = (
            f"Allocate(count={cell['ranged']['range']}) per call"
            if mode == "ranged"
            else "coalescing client"
        )
        return Reading(
            f,
            f"{count:,} waiters: {how} {fmt_rate(f.median * per_rpc)} ts/s vs one per RPC "
            f"{fmt_rate(per_rpc)} ts/s",
            f.text(digits=1),
        )

    return read


def observer_latency(run: J) -> Reading:
    """P5 judges the worse of p50 / 1 s and p99 / 5 s (at most 1)."""
    lat = run.get("latency")
    if lat is None:
        raise ValueError("the observer benchmark did not measure latency")
    p50 = Fig.of([float(s["p50_s"]) for s in lat["half"]])
    p99 = Fig.of([float(s["p99_s"]) for s in lat["half"]])
    sat = float(lat["saturation_writes_per_s"])
    worst = Fig(
        max(p50.median / 1.0, p99.median / 5.0),
        max(p50.low / 1.0, p99.low / 5.0),
        max(p50.high / 1.0, p99.high / 5.0),
        p50.count,
    )
    return Reading(
        worst,
        f"saturation {fmt_rate(sat)} writes/s ({lat.get('workers', 1)} worker x "
        f"{lat.get('threads', '?')} threads); at {fmt_rate(sat / 2)} writes/s: "
        f"p50 {p50.median * 1000:.0f} ms, p99 {p99.median * 1000:.0f} ms",
        f"p50 {p50.text('s', 3)}, p99 {p99.text('s', 3)}",
        f"p50 {p50.median:.3f} s, p99 {p99.median:.3f} s",
    )


def scan_growth(run: J) -> Reading:
    """Largest / smallest table's notify pass: the median ratio, and the range of the
    ratios of the repeats paired in order."""
    scan = run.get("scan")
    if scan is None:
        raise ValueError("the observer benchmark did not measure the scan")
    first, last = scan["sizes"][0], scan["sizes"][-1]
    median = float(last["notify_scan_s"]) / float(first["notify_scan_s"])
    runs_a, runs_b = first.get("notify_scan_runs_s"), last.get("notify_scan_runs_s")
    f = Fig(median, median, median)
    if runs_a and runs_b:
        ratios = [float(b) / float(a) for a, b in zip(runs_a, runs_b, strict=False)]
        f = Fig(median, min(ratios), max(ratios), len(ratios))
    return Reading(
        f,
        f"notify pass {first['notify_scan_s'] * 1000:.1f} ms at {first['rows']:,} rows -> "
        f"{last['notify_scan_s'] * 1000:.1f} ms at {last['rows']:,} rows ({last['dirty']} dirty)",
    )


def spark_rounds(incr: J) -> list[J]:
    """Per round: runner, incremental and recompute seconds, ratio.  Rounds alternate the
    runners in the order spark_bench uses (worker, drain, worker, ...)."""
    runners = ["worker", "drain"]
    taken = {k: list(v) for k, v in incr["incremental_runs"].items()}
    rounds = []
    for i, recompute in enumerate(incr["recompute_runs"]):
        runner = runners[i % len(runners)]
        if not taken.get(runner):
            continue
        seconds = float(taken[runner].pop(0))
        rounds.append(
            {
                "round": i + 1,
                "runner": runner,
                "incremental_s": seconds,
                "recompute_s": float(recompute),
                "ratio": float(recompute) / seconds,
            }
        )
    return rounds


def incremental_gain(run: J) -> Reading:
    incr = run.get("incremental")
    if incr is None:
        raise ValueError("the Spark benchmark did not measure incremental processing")
    rounds = spark_rounds(incr)
    worker = [x for x in rounds if x["runner"] == "worker"] or rounds
    f = Fig.of([x["ratio"] for x in worker])
    return Reading(
        f,
        f"{incr['changes_per_round']:.0f} changed of {incr['documents']:,} documents: "
        f"incremental (worker) {statistics.median(x['incremental_s'] for x in worker):.2f} s "
        f"vs recompute {statistics.median(x['recompute_s'] for x in worker):.2f} s; "
        f"identical: {'yes' if incr.get('identical') else 'NO'}",
        f.text(digits=1),
        holds=bool(incr.get("identical")),
    )


def backfill_ratio(run: J) -> Reading:
    load = run.get("load")
    if load is None:
        raise ValueError("the Spark benchmark did not measure the backfill")
    ratios = [
        float(b) / float(a) for a, b in zip(load["raw_runs"], load["backfill_runs"], strict=True)
    ]
    f = Fig(float(load["ratio"]), min(ratios), max(ratios), len(ratios))
    return Reading(
        f,
        f"{load['rows']:,} rows: backfill {fmt_rate(load['backfill_rows_per_s'])} rows/s vs raw "
        f"batched put {fmt_rate(load['raw_rows_per_s'])} rows/s ({load['batch']} rows per batch)",
        f.text(digits=3),
    )


def lock_cleanup(run: J) -> Reading:
    """P9 is a bound, not an average: the slowest read over its bound (at most 1)."""
    cases = run["cases"]
    parts, figures = [], []
    for case, c in sorted(cases.items(), key=lambda kv: -float(kv[1]["worst_read_s"])):
        parts.append(f"{case}: read {Fig.from_spread(c['read_s']).text('s', 3)}")
        figures.append(f"{c['worst_read_s']:.2f} s {case}")
    worst = max(cases.values(), key=lambda c: float(c["worst_read_s"]) / float(c["bound_s"]))
    share = float(worst["worst_read_s"]) / float(worst["bound_s"])
    return Reading(
        Fig(share, share, share),
        f"lock TTL {run['ttl_ms']} ms, {run['cells']} cells, client killed with SIGKILL; "
        + "; ".join(parts),
        f"slowest read: {', '.join(figures)} (bound {float(worst['bound_s']):.1f} s)",
        f"{worst['worst_read_s']:.2f} s of {worst['bound_s']:.1f} s",
        holds=bool(run["pass"]),
    )


# --------------------------------------------------------------------------- the table

_ORACLE_ANCHOR = (
    "Percolator oracle ~2,000,000 timestamps/s from one machine, by batching (paper §2.3); "
    "TiDB PD ~800k/s per client, 1-2 ms per call"
)

TARGETS: tuple[Target, ...] = (
    Target(
        "P1a", "oracle batching: timestamps/s batched / one timestamp per RPC, most waiters",
        ">= 50x", _ORACLE_ANCHOR, "oracle", "", oracle_gain(None), 50.0,
        profile="oracle", focus=("batched",),
    ),
    Target(
        "P1b", "oracle coalescing: 100 threads in one process", ">= 10x", _ORACLE_ANCHOR,
        "oracle", "", oracle_gain(100), 10.0, profile="oracle", focus=("batched",),
    ),
    Target(
        "P1c", "oracle wait / 1-cell transaction latency, at full load", "<= 10%", "-",
        "txn_hbase", "txn_embedded", oracle_share, 0.10, AT_MOST,
        profile="txn", focus=("txn_1cell",),
    ),
    Target(
        "P2", "snapshot read / raw get", ">= 0.90x",
        "Percolator reads 0.94x raw Bigtable (14,590 vs 15,513 ops/s, OSDI 2010 Fig. 8); "
        "Themis on HBase 0.89-0.94x",
        "txn_hbase", "txn_embedded",
        txn_ratio("P2 read / raw get", "txn_read", "raw_get", "reads/s", "gets/s"), 0.90,
        profile="txn", focus=("txn_read", "raw_get"),
    ),
    Target(
        "P3", "single-cell transactions/s / raw puts/s", ">= 0.30x",
        "Percolator writes 0.23x raw Bigtable (7,232 vs 31,003 ops/s); "
        "Themis on HBase 0.18-0.27x",
        "txn_hbase", "txn_embedded",
        txn_ratio("P3 1-cell txn / raw put", "txn_1cell", "raw_put", "txns/s", "puts/s"), 0.30,
        profile="txn", focus=("txn_1cell", "raw_put"),
    ),
    Target(
        "P4", "10-cell transaction cells/s / 1-cell cells/s", ">= 3x", "-",
        "txn_hbase", "txn_embedded",
        txn_ratio("P4 10-cell cells/s / 1-cell", "txn_10cell", "txn_1cell", "cells/s", "cells/s"),
        3.0, profile="txn", focus=("txn_10cell", "txn_1cell"),
    ),
    Target(
        "P5", "observer commit-to-commit latency at half of saturation",
        "p50 <= 1 s, p99 <= 5 s",
        "MillWheel delivery median 3.6 ms, p95 30 ms; exactly-once 33.7 / 93.8 ms",
        "observers", "", observer_latency, 1.0, AT_MOST,
        profile="observer", focus=("observer_run",),
    ),
    Target(
        "P6", "notification pass while the table grows 100x", "<= 2x", "-",
        "observers", "scan_embedded", scan_growth, 2.0, AT_MOST,
        profile="scan", focus=("notify_pass_small", "notify_pass_large"),
    ),
    Target(
        "P7", "full Spark recompute time / incremental time after 1% change",
        ">= 50x, identical",
        "Percolator document age ~2 s vs ~30 min with MapReduce at a 1%/h change rate "
        "(~1000x, paper Fig. 7)",
        "spark", "", incremental_gain, 50.0, profile="incremental", focus=("incremental",),
    ),
    Target(
        "P7b", "break-even change fraction, incremental vs full recompute, 100,000 documents",
        ">= 10%", "Percolator ~40% of the repository per hour (paper §3.1)",
        measured_outside="bench/cost_bench.py promise --docs 100000",
    ),
    Target(
        "P8", "Spark backfill rows/s / raw batched load rows/s", ">= 0.5x", "-",
        "spark", "", backfill_ratio, 0.5,
        profile="backfill", focus=("backfill_batch", "raw_batch"),
    ),
    Target(
        "P9", "read after a client killed holding locks", "<= lock TTL + 1 s", "-",
        "lock_hbase", "lock_embedded", lock_cleanup, 1.0, AT_MOST,
        profile="lock", focus=("resolving_read",),
    ),
    Target(
        "P10", "trivial strong observer runs/s / raw get+put pairs/s, same threads",
        ">= 0.5x embedded, >= 0.3x HBase",
        "Apache Fluo 0.90x-1.16x of raw Accumulo on this machine kind",
        measured_outside="bench/cost_bench.py p10",
    ),
    Target(
        "P11", "stored cells and bytes, first vs last tenth of a steady update run with GC",
        "<= 2x", measured_outside="bench/gc_bench.py",
    ),
    Target(
        "P12", "per-stage low-watermark lag of the example pipeline at half of saturation",
        "reported", "MillWheel 1.8 s at the first stage, < 200 ms more per later stage",
        measured_outside="bench/watermark_bench.py",
    ),
    Target(
        "P13", "worker throughput with 1, 2, 4 worker processes; scan work per committed run",
        "reported", "Apache Fluo ~41 txn/s per vCPU (stress test)",
        measured_outside="bench/partition_bench.py",
    ),
)

BY_ID = {t.id: t for t in TARGETS}

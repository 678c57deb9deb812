"""The performance report: ``bench/results.md`` and its PNG plots, from the raw results of
``bench/run_all``.

Everything the report says is computed here from the measured numbers in the raw results
(``raw.json``, which ``bench/run_all`` writes into its work directory): the verdict per
target, the ratios, the knees of the scaling curves and the explanation of every miss (from
the profiles run_all took of the missing benchmarks).  No figure is typed in by hand except
the published anchors and the goals, which are quoted from the project's targets.

Regenerate the report from saved raw results (no benchmark is run):

    python bench/report.py RUN_ALL_WORKDIR/raw.json [--out bench/results.md]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import statistics
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``bench`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import fmt_ms, fmt_rate

J = dict[str, Any]
BENCH_DIR = Path(__file__).resolve().parent

# --------------------------------------------------------------------------- targets

#: Published figures (the project's targets document, "Anchors").
ANCHOR_ORACLE = (
    "Percolator oracle ~2,000,000 timestamps/s from one machine, by batching (paper §2.3); "
    "TiDB PD ~800k/s per client, 1-2 ms per call"
)
ANCHORS = {
    "P1a": ANCHOR_ORACLE,
    "P1b": ANCHOR_ORACLE,
    "P1c": "-",
    "P2": "Percolator reads 0.94x raw Bigtable (14,590 vs 15,513 ops/s, OSDI 2010 Fig. 8); "
    "Themis on HBase 0.89-0.94x",
    "P3": "Percolator writes 0.23x raw Bigtable (7,232 vs 31,003 ops/s); "
    "Themis on HBase 0.18-0.27x",
    "P4": "-",
    "P5": "MillWheel delivery median 3.6 ms, p95 30 ms; exactly-once 33.7 / 93.8 ms",
    "P6": "-",
    "P7": "Percolator document age ~2 s vs ~30 min with MapReduce at a 1%/h change rate "
    "(~1000x, paper Fig. 7)",
    "P8": "-",
    "P9": "-",
}

#: id -> (what, goal as text).  The goals are the project's targets ("x" = engine / raw).
GOALS = {
    "P1a": ("oracle batching: batched / one timestamp per RPC, most waiters", ">= 50x"),
    "P1b": ("oracle coalescing: 100 threads in one process", ">= 10x"),
    "P1c": ("oracle wait / 1-cell transaction latency, at full load", "<= 10%"),
    "P2": ("snapshot read / raw get", ">= 0.90x"),
    "P3": ("single-cell transactions/s / raw puts/s", ">= 0.30x"),
    "P4": ("10-cell transaction cells/s / 1-cell cells/s", ">= 3x"),
    "P5": ("observer commit-to-commit latency at half of saturation", "p50 <= 1 s, p99 <= 5 s"),
    "P6": ("notification pass while the table grows 100x", "<= 2x"),
    "P7": ("full Spark recompute time / incremental time after 1% change", ">= 50x, identical"),
    "P8": ("Spark backfill rows/s / raw batched load rows/s", ">= 0.5x"),
    "P9": ("read after a client killed holding locks", "<= lock TTL + 1 s"),
}

#: which profile explains a miss of which target (run_all takes the profile of each kind
#: whose targets missed)
PROFILE_OF = {
    "P1a": "oracle",
    "P1b": "oracle",
    "P1c": "txn",
    "P2": "txn",
    "P3": "txn",
    "P4": "txn",
    "P5": "observer",
    "P6": "scan",
    "P7": "incremental",
    "P8": "backfill",
    "P9": "lock",
}

PASS, MISS, NOT_MEASURED = "PASS", "MISS", "NOT MEASURED"


@dataclass
class TargetResult:
    """One target's verdict, with the figures it was judged on (already formatted)."""

    tid: str
    what: str
    goal: str
    anchor: str
    measured: str = "-"
    figure: str = "-"
    embedded: str = "-"
    verdict: str = NOT_MEASURED
    #: how far the goal is met: >= 1 meets it (measured / goal for "at least" goals,
    #: goal / measured for "at most" ones), with the range over repeats; for the plot
    score: float | None = None
    score_low: float | None = None
    score_high: float | None = None
    notes: list[str] = field(default_factory=list)
    error: str = ""
    #: a short form of the figure for the plot (default: the figure without its range)
    label: str = ""


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


def fx(f: Fig, digits: int = 2) -> str:
    """``0.22x (0.20-0.25)``; the range is left out for a single repeat."""
    text = f"{f.median:.{digits}f}x"
    if f.count > 1 or f.low != f.high:
        text += f" ({f.low:.{digits}f}-{f.high:.{digits}f})"
    return text


def fpct(f: Fig) -> str:
    text = f"{f.median:.1%}"
    if f.count > 1 or f.low != f.high:
        text += f" ({f.low:.1%}-{f.high:.1%})"
    return text


def fsec(f: Fig) -> str:
    text = f"{f.median:.3f} s"
    if f.count > 1 or f.low != f.high:
        text += f" ({f.low:.3f}-{f.high:.3f})"
    return text


def _at_least(result: TargetResult, f: Fig, goal: float) -> None:
    result.verdict = PASS if f.median >= goal else MISS
    result.score, result.score_low, result.score_high = (
        f.median / goal,
        f.low / goal,
        f.high / goal,
    )


def _at_most(result: TargetResult, f: Fig, goal: float) -> None:
    result.verdict = PASS if f.median <= goal else MISS
    result.score = goal / f.median if f.median > 0 else math.inf
    result.score_low = goal / f.high if f.high > 0 else math.inf
    result.score_high = goal / f.low if f.low > 0 else math.inf


def run_of(raw: J, name: str) -> J | None:
    """The JSON a step produced, or None if the step did not run or failed."""
    run = raw.get("runs", {}).get(name)
    return run if isinstance(run, dict) else None


def step_error(raw: J, name: str) -> str:
    for step in raw.get("steps", []):
        if step.get("name") == name and step.get("status") != "ok":
            return f"step `{name}` {step.get('status')}: {step.get('error', '')}".strip()
    if run_of(raw, name) is None:
        return f"step `{name}` was not run"
    return ""


# --------------------------------------------------------------------------- evaluation


def _rate_median(timings: list[J], op: str, key: str = "item_rate") -> float:
    return statistics.median(float(t[op][key]) for t in timings)


def _txn_ratio(txn: J, name: str) -> Fig:
    return Fig.from_spread(txn["ratios"][name])


def _oracle_ratio_range(cell: J, mode: str = "batched") -> Fig:
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


def p1a_mode(cell: J) -> str:
    """Which oracle_bench mode P1a ("timestamps served with batching") is judged on: the
    ranged allocation (one Allocate RPC for many timestamps) where the benchmark measures
    it, else the coalescing client."""
    return "ranged" if "ranged" in cell else "batched"


def evaluate(raw: J) -> list[TargetResult]:
    """Every target's verdict from the raw results."""
    results = {
        tid: TargetResult(tid, what, goal, ANCHORS[tid]) for tid, (what, goal) in GOALS.items()
    }
    evaluators: list[tuple[Sequence[str], Callable[[J, dict[str, TargetResult]], None]]] = [
        (("P1a", "P1b"), _eval_oracle),
        (("P1c", "P2", "P3", "P4"), _eval_txn),
        (("P5", "P6"), _eval_observers),
        (("P7", "P8"), _eval_spark),
        (("P9",), _eval_lock),
    ]
    for tids, evaluator in evaluators:
        try:
            evaluator(raw, results)
        except (KeyError, TypeError, ValueError, ZeroDivisionError, IndexError) as exc:
            # A benchmark whose JSON lacks a field is reported, never guessed around.
            for tid in tids:
                if results[tid].verdict == NOT_MEASURED:
                    results[tid].error = f"cannot read the results: {type(exc).__name__}: {exc}"
    return list(results.values())


def _eval_oracle(raw: J, results: dict[str, TargetResult]) -> None:
    oracle = run_of(raw, "oracle")
    if oracle is None:
        for tid in ("P1a", "P1b"):
            results[tid].error = step_error(raw, "oracle")
        return
    waiters = oracle["waiters"]
    most = max(int(w) for w in waiters)
    for tid, count, goal in (("P1a", most, 50.0), ("P1b", 100, 10.0)):
        cell = waiters.get(str(count))
        r = results[tid]
        if cell is None:
            r.error = f"the oracle benchmark did not measure {count} waiters"
            continue
        mode = p1a_mode(cell) if tid == "P1a" else "batched"
        f = _oracle_ratio_range(cell, mode)
        served = f.median * float(cell["per-rpc"]["rate"]["median"])
        how = (f"Allocate(count={cell['ranged']['range']}) per call" if mode == "ranged"
               else "coalescing client")
        r.measured = (
            f"{count:,} waiters: {how} {fmt_rate(served)} ts/s vs one per RPC "
            f"{fmt_rate(cell['per-rpc']['rate']['median'])} ts/s"
        )
        r.figure = fx(f, 1)
        _at_least(r, f, goal)
        if tid == "P1a":
            r.what = f"oracle batching: {how} / one timestamp per RPC, {count:,} waiters"


def _eval_txn(raw: J, results: dict[str, TargetResult]) -> None:
    txn = run_of(raw, "txn_hbase")
    emb = run_of(raw, "txn_embedded")
    if txn is None:
        for tid in ("P1c", "P2", "P3", "P4"):
            results[tid].error = step_error(raw, "txn_hbase")
        return
    timings = txn["timings"]
    threads = txn.get("threads")
    specs = (
        ("P2", "P2 read / raw get", 0.90, "txn_read", "raw_get", "reads/s", "gets/s"),
        ("P3", "P3 1-cell txn / raw put", 0.30, "txn_1cell", "raw_put", "txns/s", "puts/s"),
        ("P4", "P4 10-cell cells/s / 1-cell", 3.0, "txn_10cell", "txn_1cell", "cells/s",
         "cells/s"),
    )
    for tid, key, goal, op, base, unit, base_unit in specs:
        r = results[tid]
        f = _txn_ratio(txn, key)
        r.measured = (
            f"{op} {fmt_rate(_rate_median(timings, op))} {unit} vs {base} "
            f"{fmt_rate(_rate_median(timings, base))} {base_unit} ({threads} threads)"
        )
        r.figure = fx(f)
        _at_least(r, f, goal)
        if emb is not None:
            results[tid].embedded = fx(_txn_ratio(emb, key))
    shares = txn.get("oracle_share") or []
    r = results["P1c"]
    if not shares:
        r.error = "txn_bench reported no oracle share"
        return
    f = Fig.of([float(s) for s in shares])
    t1 = _rate_median(timings, "txn_1cell")
    r.measured = (
        f"{threads} threads writing 1-cell transactions at {fmt_rate(t1)}/s, timestamps from "
        f"the {oracle_name(txn.get('oracle', '?'))}"
    )
    r.figure = fpct(f)
    _at_most(r, f, 0.10)
    if emb is not None and emb.get("oracle_share"):
        r.embedded = fpct(Fig.of([float(s) for s in emb["oracle_share"]]))


def _eval_observers(raw: J, results: dict[str, TargetResult]) -> None:
    obs = run_of(raw, "observers")
    if obs is None:
        for tid in ("P5", "P6"):
            results[tid].error = step_error(raw, "observers")
        return
    lat = obs.get("latency")
    r = results["P5"]
    if lat is None:
        r.error = "the observer benchmark did not measure latency"
    else:
        half = lat["half"]
        p50 = Fig.of([float(s["p50_s"]) for s in half])
        p99 = Fig.of([float(s["p99_s"]) for s in half])
        sat = float(lat["saturation_writes_per_s"])
        r.measured = (
            f"saturation {fmt_rate(sat)} writes/s ({lat.get('workers', 1)} worker x "
            f"{lat.get('threads', '?')} threads); at {fmt_rate(sat / 2)} writes/s: "
            f"p50 {p50.median * 1000:.0f} ms, p99 {p99.median * 1000:.0f} ms"
        )
        r.figure = f"p50 {fsec(p50)}, p99 {fsec(p99)}"
        ok = p50.median <= 1.0 and p99.median <= 5.0
        r.verdict = PASS if ok else MISS
        r.score = min(1.0 / p50.median, 5.0 / p99.median)
        r.score_low = min(1.0 / p50.high, 5.0 / p99.high)
        r.score_high = min(1.0 / p50.low, 5.0 / p99.low)
    r = results["P6"]
    scan = obs.get("scan")
    if scan is None:
        r.error = "the observer benchmark did not measure the scan"
        return
    f, first, last = _scan_growth(scan)
    r.measured = (
        f"notify pass {first['notify_scan_s'] * 1000:.1f} ms at {first['rows']:,} rows -> "
        f"{last['notify_scan_s'] * 1000:.1f} ms at {last['rows']:,} rows "
        f"({last['dirty']} dirty)"
    )
    r.figure = fx(f)
    _at_most(r, f, 2.0)
    emb = run_of(raw, "scan_embedded")
    if emb is not None and emb.get("scan"):
        r.embedded = fx(_scan_growth(emb["scan"])[0])


def _scan_growth(scan: J) -> tuple[Fig, J, J]:
    """Largest / smallest table's notify pass: median ratio, and the range of the ratios of
    the repeats paired in order."""
    sizes = scan["sizes"]
    first, last = sizes[0], sizes[-1]
    median = float(last["notify_scan_s"]) / float(first["notify_scan_s"])
    runs_a, runs_b = first.get("notify_scan_runs_s"), last.get("notify_scan_runs_s")
    if runs_a and runs_b:
        ratios = [float(b) / float(a) for a, b in zip(runs_a, runs_b, strict=False)]
        return Fig(median, min(ratios), max(ratios), len(ratios)), first, last
    return Fig(median, median, median), first, last


def _eval_spark(raw: J, results: dict[str, TargetResult]) -> None:
    spark = run_of(raw, "spark")
    if spark is None:
        for tid in ("P7", "P8"):
            results[tid].error = step_error(raw, "spark")
        return
    incr = spark.get("incremental")
    r = results["P7"]
    if incr is None:
        r.error = "the Spark benchmark did not measure incremental processing"
    else:
        rounds = spark_rounds(incr)
        worker = [x for x in rounds if x["runner"] == "worker"] or rounds
        f = Fig.of([x["ratio"] for x in worker])
        r.measured = (
            f"{incr['changes_per_round']:.0f} changed of {incr['documents']:,} documents: "
            f"incremental (worker) {statistics.median(x['incremental_s'] for x in worker):.2f} s "
            f"vs recompute {statistics.median(x['recompute_s'] for x in worker):.2f} s; "
            f"identical: {'yes' if incr.get('identical') else 'NO'}"
        )
        r.figure = fx(f, 1)
        _at_least(r, f, 50.0)
        if not incr.get("identical"):
            r.verdict = MISS
    load = spark.get("load")
    r = results["P8"]
    if load is None:
        r.error = "the Spark benchmark did not measure the backfill"
        return
    ratios = [float(b) / float(a) for a, b in zip(load["raw_runs"], load["backfill_runs"],
                                                  strict=True)]
    f = Fig(float(load["ratio"]), min(ratios), max(ratios), len(ratios))
    r.measured = (
        f"{load['rows']:,} rows: backfill {fmt_rate(load['backfill_rows_per_s'])} rows/s vs raw "
        f"batched put {fmt_rate(load['raw_rows_per_s'])} rows/s ({load['batch']} rows per batch)"
    )
    r.figure = fx(f, 3)
    _at_least(r, f, 0.5)


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


def _eval_lock(raw: J, results: dict[str, TargetResult]) -> None:
    lock = run_of(raw, "lock_hbase")
    r = results["P9"]
    if lock is None:
        r.error = step_error(raw, "lock_hbase")
        return
    r.measured, r.figure, ok, score = _lock_summary(lock)
    r.label = _lock_label(lock)
    r.verdict = PASS if ok else MISS
    r.score = r.score_low = r.score_high = score
    emb = run_of(raw, "lock_embedded")
    if emb is not None:
        r.embedded = _lock_summary(emb)[1]


def _lock_summary(lock: J) -> tuple[str, str, bool, float]:
    cases = lock["cases"]
    parts, figures = [], []
    worst_ratio, bound = 0.0, 0.0
    for case, c in sorted(cases.items(), key=lambda kv: -float(kv[1]["worst_read_s"])):
        read = Fig.from_spread(c["read_s"])
        parts.append(f"{case}: read {fsec(read)}")
        figures.append(f"{c['worst_read_s']:.2f} s {case}")
        worst_ratio = max(worst_ratio, float(c["worst_read_s"]) / float(c["bound_s"]))
        bound = float(c["bound_s"])
    measured = (f"lock TTL {lock['ttl_ms']} ms, {lock['cells']} cells, client killed with "
                "SIGKILL; " + "; ".join(parts))
    figure = f"slowest read: {', '.join(figures)} (bound {bound:.1f} s)"
    score = 1 / worst_ratio if worst_ratio > 0 else math.inf
    return measured, figure, bool(lock["pass"]), score


def _lock_label(lock: J) -> str:
    worst = max(lock["cases"].values(),
                key=lambda c: float(c["worst_read_s"]) / float(c["bound_s"]))
    return f"{worst['worst_read_s']:.2f} s of {worst['bound_s']:.1f} s"


# --------------------------------------------------------------------------- scaling maths


def knee(points: Sequence[tuple[float, float]], tolerance: float = 0.10) -> tuple[float, float]:
    """The knee of a throughput curve: the smallest x whose throughput is within
    ``tolerance`` of the best measured; returns ``(x, best throughput)``."""
    best = max(y for _, y in points)
    for x, y in sorted(points):
        if y >= (1 - tolerance) * best:
            return x, best
    raise AssertionError("unreachable")


def loglog_slope(x0: float, y0: float, x1: float, y1: float) -> float:
    """The exponent k of y ~ x^k between two points (0: flat, 1: linear)."""
    return math.log(y1 / y0) / math.log(x1 / x0)


def steps_text(points: Sequence[tuple[float, float]], unit: str) -> str:
    """``1 -> 2: 1.8x, 2 -> 4: 1.1x`` (the gain of each step of a series)."""
    pts = sorted(points)
    return ", ".join(
        f"{_num(a[0])} -> {_num(b[0])}: {b[1] / a[1]:.2f}x" for a, b in itertools.pairwise(pts)
    ) + (f" ({unit})" if unit else "")


def _num(x: float) -> str:
    return f"{x:g}"


def oracle_name(url: str) -> str:
    """How the report names a benchmark's oracle (its address changes every run)."""
    return "oracle server (gRPC)" if url.startswith(("grpc://", "grpcs://")) else url


# --------------------------------------------------------------------------- markdown


def md_table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    def cell(value: object) -> str:
        return str(value).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(cell(h) for h in headers) + " |",
             "| " + " | ".join("---" for _ in headers) + " |"]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def render(raw: J, targets: Sequence[TargetResult], plots: dict[str, str]) -> str:
    """The whole of results.md."""
    meta = raw.get("meta", {})
    out: list[str] = []
    out.append("# Performance report\n")
    out.append(
        f"Generated by `{meta.get('command', 'bench/run_all')}` on {meta.get('started', '?')} "
        f"({meta.get('mode', '?')} run, {meta.get('repeats', '?')} repeat(s) per measurement, "
        f"{meta.get('duration_s', 0) / 60:.1f} min).  Every ratio compares the engine with the "
        "raw store measured in the same run, on the same store, with the same client stack "
        "and concurrency; medians over the repeats, with the range (min-max) in parentheses.  "
        "This file is generated: edit `bench/report.py`, not this file.\n"
    )
    if meta.get("mode") == "quick":
        out.append(
            "> **Smoke run (`--quick`)**: tiny sizes and one repeat, to check that the harness "
            "works end to end.  These numbers are not the project's measurements; the full run "
            "is `bench/run_all` without `--quick`.\n"
        )
    out.append(_machine_section(raw))
    out.append(_summary_section(targets, plots, raw))
    out.append(_notes_section(raw, targets))
    out.append(_scaling_section(raw, plots))
    out.append(_why_section(raw, targets))
    out.append(_baselines_section(raw))
    out.append(_run_log_section(raw))
    return "\n".join(part.rstrip() + "\n" for part in out if part)


def _machine_section(raw: J) -> str:
    m = raw.get("machine", {})
    rows = [
        ("CPU", m.get("cpu_model", "?")),
        ("cores", f"{m.get('cores', '?')} (usable by this process: {m.get('cores_usable', '?')})"),
        ("memory", m.get("memory", "?")),
        ("OS", m.get("os", "?")),
        ("Python", m.get("python", "?")),
        ("Java", m.get("java", "?")),
        ("HBase", m.get("hbase", "?")),
        ("Spark", m.get("spark", "?")),
        ("store", m.get("store", "?")),
        ("oracle", m.get("oracle", "?")),
        ("source", m.get("source", "?")),
        ("load average at start (1/5/15 min)", _load(m.get("load_before"))),
        ("load average at end (1/5/15 min)", _load(m.get("load_after"))),
        ("date", m.get("date", "?")),
    ]
    return "## Machine\n\n" + md_table(["", ""], rows) + "\n"


def _load(value: Any) -> str:
    if not value:
        return "?"
    return " / ".join(f"{float(v):.2f}" for v in value)


def _summary_section(targets: Sequence[TargetResult], plots: dict[str, str], raw: J) -> str:
    rows = []
    for t in targets:
        verdict = f"**{t.verdict}**" if t.verdict != PASS else t.verdict
        measured = t.measured if t.verdict != NOT_MEASURED else (t.error or "not measured")
        rows.append([t.tid, t.what, t.anchor, measured, t.figure, t.goal, t.embedded, verdict])
    counts = {v: sum(1 for t in targets if t.verdict == v) for v in (PASS, MISS, NOT_MEASURED)}
    text = "## Targets\n\n"
    text += (
        f"{counts[PASS]} met, {counts[MISS]} missed, {counts[NOT_MEASURED]} not measured, "
        f"of {len(targets)}.  \"HBase\" is the figure judged; \"embedded\" is the same "
        "benchmark on the embedded store (the engine without HBase), where it is cheap to run.\n\n"
    )
    text += md_table(
        ["id", "target", "anchor (published)", "measured (HBase)", "figure (HBase)", "goal",
         "embedded", "result"],
        rows,
    )
    if "targets" in plots:
        text += f"\n\n![targets]({plots['targets']})\n\n"
        text += (
            "Each bar is the measured figure relative to its goal (>= 1 meets it; for "
            "\"at most\" goals the goal divided by the figure), log scale; the whiskers are "
            "the range over the repeats.\n"
        )
    return text


# ------------------------------------------------------------------ per-target notes


def _notes_section(raw: J, targets: Sequence[TargetResult]) -> str:
    parts = ["## Per-target details\n"]
    oracle = run_of(raw, "oracle")
    if oracle is not None:
        rows = []
        ranged = any("ranged" in c for c in oracle["waiters"].values())
        for w, cell in sorted(oracle["waiters"].items(), key=lambda kv: int(kv[0])):
            b, p = cell["batched"], cell["per-rpc"]
            row: list[object] = [
                w, fmt_rate(p["rate"]["median"]), fmt_rate(b["rate"]["median"]),
                f"{b['rpcs_per_timestamp']:.3f}",
                fmt_rate(b["rate"]["median"] * b["rpcs_per_timestamp"]),
                fmt_ms(b["p50_ms"]), fmt_ms(b["p99_ms"]), f"{cell['ratio']:.1f}x",
            ]
            if ranged:
                rg = cell.get("ranged")
                row += ["-", "-", "-"] if rg is None else [
                    fmt_rate(_oracle_ratio_range(cell, "ranged").median * p["rate"]["median"]),
                    fmt_ms(rg["p50_ms"]), fx(_oracle_ratio_range(cell, "ranged"), 1)]
            rows.append(row)
        headers = ["waiters", "per-RPC ts/s", "batched ts/s", "RPCs per ts (batched)",
                   "RPCs/s (batched)", "batched p50 ms", "batched p99 ms", "batched / per-RPC"]
        if ranged:
            headers += ["ranged ts/s", "ranged p50 ms", "ranged / per-RPC"]
        parts.append(
            "### P1 timestamp oracle\n\n"
            "An oracle server started by oracle_bench on the run's HBase, one client process; "
            "per waiter count: one timestamp per RPC (`per-RPC`), the coalescing client "
            "(`batched`)" + (", and one Allocate RPC for a range of timestamps per call "
                             "(`ranged`)" if ranged else "") + ".\n\n"
            + md_table(headers, rows) + "\n"
        )
    for label, name in (("HBase", "txn_hbase"), ("embedded", "txn_embedded")):
        txn = run_of(raw, name)
        if txn is None:
            continue
        timings = txn["timings"]
        rows = []
        known = ["raw_get", "raw_put", "txn_read", "txn_read_full", "txn_1cell", "txn_10cell"]
        for op in [o for o in known if o in timings[0]] + [o for o in timings[0]
                                                            if o not in known]:
            rows.append([
                op, fmt_rate(_rate_median(timings, op)),
                fmt_ms(statistics.median(float(t[op]["p50_ms"]) for t in timings)),
                fmt_ms(statistics.median(float(t[op]["p99_ms"]) for t in timings)),
            ])
        shares = txn.get("oracle_share") or []
        share = f"; oracle wait {statistics.median(shares):.1%} of 1-cell latency" if shares else ""
        parts.append(
            f"### P1c-P4 transactions ({label})\n\n"
            f"{txn.get('threads')} client threads, {txn.get('ops')} operations per repeat, "
            f"{txn.get('value_size', '?')}-byte values, timestamps from the "
            f"{oracle_name(txn.get('oracle', '?'))}{share}.  "
            "`raw_*` are the store's own get and put in the same repeat.\n\n"
            + md_table(["operation", "items/s", "p50 ms", "p99 ms"], rows) + "\n"
        )
    obs = run_of(raw, "observers")
    if obs is not None and obs.get("latency"):
        lat = obs["latency"]
        rows = []
        for i, s in enumerate(lat["sweep"]):
            rows.append(_step_row(f"sweep {i + 1}", s))
        for i, s in enumerate(lat["half"]):
            rows.append(_step_row(f"S/2 #{i + 1}", s))
        backlog = lat.get("backlog_runs") or [lat["backlog_runs_per_s"]]
        parts.append(
            "### P5 observer latency\n\n"
            f"One worker process x {lat.get('threads', '?')} threads.  Backlog throughput (the "
            f"worker alone on a backlog): {fmt_rate(lat['backlog_runs_per_s'])} runs/s "
            f"(repeats: {', '.join(fmt_rate(x) for x in backlog)}).  Paced single-row writes "
            "from B/16 up by 1.5x per step until the worker no longer keeps up; the saturation "
            f"point S = {fmt_rate(lat['saturation_writes_per_s'])} writes/s is the highest rate "
            "kept up with; then steps at S/2.\n\n"
            + md_table(["step", "offered/s", "writes/s", "runs/s", "p50 ms", "p99 ms",
                        "max ms", "kept up"], rows)
            + "\n"
        )
    if obs is not None and obs.get("scan"):
        parts.append("### P6 notification scan\n\n" + _scan_table(raw) + "\n\n"
                     + _scan_slopes(raw) + "  The figure is the ratio of the median passes at "
                     "the largest and the smallest size; its range is that of the ratios of the "
                     "repeated passes paired in order.\n")
    spark = run_of(raw, "spark")
    if spark is not None and spark.get("incremental"):
        incr = spark["incremental"]
        rows = [[x["round"], x["runner"], f"{x['incremental_s']:.2f}", f"{x['recompute_s']:.2f}",
                 f"{x['ratio']:.1f}x"] for x in spark_rounds(incr)]
        parts.append(
            "### P7 incremental vs full recompute\n\n"
            f"{incr['documents']:,} documents, {incr['changes_per_round']:.0f} changes per round; "
            "`worker` is a worker with runner threads, `drain` the single-threaded drain; the "
            "recompute exports the table, recomputes every derived table with Spark and writes "
            f"Parquet.  Results identical to the recompute and the reference in every round: "
            f"{'yes' if incr.get('identical') else 'NO'} ({incr.get('derived_cells')} derived "
            "cells).\n\n"
            + md_table(["round", "incremental by", "incremental s", "recompute s",
                        "recompute / incremental"], rows)
            + "\n"
        )
    if spark is not None and spark.get("load"):
        load = spark["load"]
        rows = [[i + 1, fmt_rate(a), fmt_rate(b), f"{b / a:.3f}x"]
                for i, (a, b) in enumerate(zip(load["raw_runs"], load["backfill_runs"],
                                               strict=True))]
        parts.append(
            "### P8 backfill\n\n"
            f"{load['rows']:,} rows of two values, {load['batch']} rows per batch (raw: one "
            "batched put; backfill: one transaction with its progress marker), Spark "
            f"{spark.get('master', '?')}.\n\n"
            + md_table(["repeat", "raw rows/s", "backfill rows/s", "backfill / raw"], rows)
            + "\n"
        )
    for label, name in (("HBase", "lock_hbase"), ("embedded", "lock_embedded")):
        lock = run_of(raw, name)
        if lock is None:
            continue
        rows = []
        for case, c in lock["cases"].items():
            read = Fig.from_spread(c["read_s"])
            rows.append([
                case, fsec(read), f"{Fig.from_spread(c['must_wait_s']).median:.3f}",
                f"{Fig.from_spread(c['excess_s']).median:.3f}", f"{c['round_trips']:.0f}",
                f"{c['bound_s']:.1f}", PASS if c["pass"] else MISS,
            ])
        parts.append(
            f"### P9 lock cleanup ({label})\n\n"
            f"A client writing {lock['cells']} cells (lock TTL {lock['ttl_ms']} ms) is stopped "
            "at a commit step and killed with SIGKILL; a reader then reads every cell.  "
            "\"must wait\" is what no reader can avoid (the remaining TTL before the commit "
            "point, nothing after it); \"excess\" is the read's time beyond it.\n\n"
            + md_table(["case", "read after kill", "must wait s", "excess s", "round trips",
                        "bound s", "result"], rows)
            + "\n"
        )
    return "\n".join(parts)


def _step_row(label: str, s: J) -> list[object]:
    kept = s.get("kept_up")
    return [label, fmt_rate(s["offered"]), fmt_rate(s["achieved"]), fmt_rate(s["run_rate"]),
            fmt_ms(s["p50_s"] * 1000), fmt_ms(s["p99_s"] * 1000), fmt_ms(s["max_s"] * 1000),
            "-" if kept is None else ("yes" if kept else "no")]


def _scan_table(raw: J) -> str:
    obs = run_of(raw, "observers")
    assert obs is not None
    sizes = obs["scan"]["sizes"]
    emb = run_of(raw, "scan_embedded")
    emb_sizes = {s["rows"]: s for s in emb["scan"]["sizes"]} if emb and emb.get("scan") else {}
    rows = []
    for s in sizes:
        e = emb_sizes.get(s["rows"])
        rows.append([
            f"{s['rows']:,}", s["dirty"], fmt_ms(s["notify_scan_s"] * 1000),
            fmt_ms(s["lock_scan_s"] * 1000),
            fmt_ms(e["notify_scan_s"] * 1000) if e else "-",
            fmt_ms(e["lock_scan_s"] * 1000) if e else "-",
        ])
    return md_table(["table rows", "dirty", "notify pass ms (HBase)",
                     "lock-family scan ms (HBase)", "notify pass ms (embedded)",
                     "lock-family scan ms (embedded)"], rows)


def _scan_slopes(raw: J) -> str:
    obs = run_of(raw, "observers")
    assert obs is not None
    sizes = obs["scan"]["sizes"]
    first, last = sizes[0], sizes[-1]
    if last["rows"] <= first["rows"]:
        return ""
    k_notify = loglog_slope(first["rows"], first["notify_scan_s"], last["rows"],
                            last["notify_scan_s"])
    k_lock = loglog_slope(first["rows"], first["lock_scan_s"], last["rows"], last["lock_scan_s"])
    return (
        f"From {first['rows']:,} to {last['rows']:,} rows ({last['dirty']} dirty cells "
        f"throughout) the notification pass grows as rows^{k_notify:.2f} and a scan of the lock "
        f"family (what finding dirty cells would cost without the separate notify family) as "
        f"rows^{k_lock:.2f} (0 is flat, 1 is proportional to the table)."
    )


# ------------------------------------------------------------------ scaling


def _scaling_section(raw: J, plots: dict[str, str]) -> str:
    parts = ["## Scaling\n"]
    parts.append(_scaling_observers(raw, plots))
    parts.append(_scaling_txn_threads(raw, plots))
    parts.append(_scaling_value_size(raw, plots))
    obs = run_of(raw, "observers")
    if obs is not None and obs.get("scan"):
        text = ("### Notification scan vs table size\n\nThe P6 measurement (table in the P6 "
                "details above).  " + _scan_slopes(raw) + "\n")
        if "scan" in plots:
            text += f"\n![scan vs table size]({plots['scan']})\n"
        parts.append(text)
    parts.append(_scaling_load(raw, plots))
    parts.append(_scaling_oracle(raw, plots))
    return "\n".join(p for p in parts if p)


def observer_points(raw: J) -> list[J]:
    """The observer scaling runs that succeeded, in run order."""
    found = []
    for name in raw.get("series", {}).get("observers", []):
        run = run_of(raw, name)
        if run is not None:
            found.append(run)
    return found


def _scaling_observers(raw: J, plots: dict[str, str]) -> str:
    runs = observer_points(raw)
    if not runs:
        return "### Observer throughput vs worker threads and processes\n\nNot measured.\n"
    rows = []
    for r in runs:
        step = r["step"]
        backlog = Fig.of([float(x) for x in r["backlog_runs"]])
        rows.append([
            r["workers"], r["threads"], r["workers"] * r["threads"],
            f"{fmt_rate(backlog.median)} ({fmt_rate(backlog.low)}-{fmt_rate(backlog.high)})",
            fmt_rate(step["achieved"]), fmt_ms(step["p50_s"] * 1000), fmt_ms(step["p99_s"] * 1000),
            "yes" if step["kept_up"] else "no",
        ])
    rate = runs[0]["fixed_rate"]
    text = (
        "### Observer throughput vs worker threads and processes\n\n"
        "Backlog throughput: runs/s of the worker(s) working off a backlog of "
        f"{runs[0]['flood']} notifications (median of {len(runs[0]['backlog_runs'])}).  "
        f"Latency: commit-to-observer-commit of paced single-row writes at one fixed rate for "
        f"every setting, {fmt_rate(rate)} writes/s (half the backlog throughput of the first "
        "setting), one step each.\n\n"
        + md_table(["processes", "threads each", "threads total", "backlog runs/s",
                    "writes/s at fixed rate", "p50 ms", "p99 ms", "kept up"], rows)
        + "\n"
    )
    for workers in sorted({int(r["workers"]) for r in runs}):
        pts = [(float(r["threads"]), statistics.median(r["backlog_runs"])) for r in runs
               if int(r["workers"]) == workers]
        if len(pts) < 2:
            continue
        x, best = knee(pts)
        text += (
            f"\n{workers} process(es): gain per step of threads {steps_text(pts, '')}; the knee "
            f"(fewest threads within 10% of the best, {fmt_rate(best)} runs/s) is at {x:g} "
            "thread(s) per process."
        )
    by_total: dict[int, dict[int, float]] = {}
    for r in runs:
        total = int(r["workers"]) * int(r["threads"])
        by_total.setdefault(total, {})[int(r["workers"])] = statistics.median(r["backlog_runs"])
    for total, per in sorted(by_total.items()):
        if 1 in per and len(per) > 1:
            for workers, value in sorted(per.items()):
                if workers == 1:
                    continue
                text += (
                    f"\nAt {total} threads in all, {workers} processes give {fmt_rate(value)} "
                    f"runs/s against {fmt_rate(per[1])} for one process ({value / per[1]:.2f}x)."
                )
    if "observers" in plots:
        text += f"\n\n![observer scaling]({plots['observers']})\n"
    return text


def _txn_series(raw: J, series: str) -> list[tuple[float, J]]:
    found = []
    for key, name in raw.get("series", {}).get(series, {}).items():
        run = run_of(raw, name)
        if run is not None:
            found.append((float(key), run))
    return sorted(found, key=lambda kv: kv[0])


def _scaling_txn_threads(raw: J, plots: dict[str, str]) -> str:
    series = _txn_series(raw, "txn_threads")
    if not series:
        return "### Transactions vs client threads\n\nNot measured.\n"
    rows, pts_txn, pts_raw = [], [], []
    for threads, run in series:
        t = run["timings"]
        txn1, put = _rate_median(t, "txn_1cell"), _rate_median(t, "raw_put")
        read, get = _rate_median(t, "txn_read"), _rate_median(t, "raw_get")
        pts_txn.append((threads, txn1))
        pts_raw.append((threads, put))
        rows.append([
            f"{threads:g}", fmt_rate(txn1), fmt_rate(put), f"{txn1 / put:.2f}x",
            fmt_ms(statistics.median(float(x["txn_1cell"]["p50_ms"]) for x in t)),
            fmt_ms(statistics.median(float(x["txn_1cell"]["p99_ms"]) for x in t)),
            fmt_rate(read), fmt_rate(get), f"{read / get:.2f}x",
        ])
    text = (
        "### Transactions vs client threads\n\n"
        "txn_bench on HBase at each thread count (same operations, value size and oracle as "
        "P2-P4; medians over the repeats).\n\n"
        + md_table(["threads", "1-cell txns/s", "raw puts/s", "txn / put", "txn p50 ms",
                    "txn p99 ms", "txn reads/s", "raw gets/s", "read / get"], rows)
        + "\n"
    )
    if len(series) >= 2:
        x, best = knee(pts_txn)
        xr, best_raw = knee(pts_raw)
        text += (
            f"\n1-cell transactions: {steps_text(pts_txn, 'gain per step of threads')}; knee "
            f"at {x:g} threads ({fmt_rate(best)} txns/s best).  Raw puts: "
            f"{steps_text(pts_raw, 'gain per step')}; knee at {xr:g} threads "
            f"({fmt_rate(best_raw)} puts/s best).\n"
        )
    if "txn_threads" in plots:
        text += f"\n![transactions vs threads]({plots['txn_threads']})\n"
    return text


def _scaling_value_size(raw: J, plots: dict[str, str]) -> str:
    series = _txn_series(raw, "value_size")
    if not series:
        return "### Transactions vs value size\n\nNot measured.\n"
    rows = []
    pts = []
    for size, run in series:
        t = run["timings"]
        txn1, put = _rate_median(t, "txn_1cell"), _rate_median(t, "raw_put")
        cells10 = _rate_median(t, "txn_10cell")
        pts.append((size, txn1))
        rows.append([
            _bytes(size), fmt_rate(txn1), fmt_rate(put), f"{txn1 / put:.2f}x",
            f"{txn1 * size / 1e6:.2f}", fmt_rate(cells10),
            fmt_ms(statistics.median(float(x["txn_1cell"]["p50_ms"]) for x in t)),
        ])
    text = (
        "### Transactions vs value size\n\n"
        f"txn_bench on HBase with {series[0][1].get('threads')} threads at each value size.\n\n"
        + md_table(["value size", "1-cell txns/s", "raw puts/s", "txn / put",
                    "txn payload MB/s", "10-cell txn cells/s", "txn p50 ms"], rows)
        + "\n"
    )
    if len(pts) >= 2:
        base_size, base_rate = pts[0]
        halved = next((s for s, r in pts if r < base_rate / 2), None)
        text += f"\n1-cell transactions/s by value size: {steps_text(pts, '')}; "
        text += (
            f"the rate halves (against {_bytes(base_size)}) by {_bytes(halved)}.\n"
            if halved is not None
            else f"the rate stays above half of the {_bytes(base_size)} rate up to "
            f"{_bytes(pts[-1][0])}: no knee within the measured sizes.\n"
        )
    if "value_size" in plots:
        text += f"\n![transactions vs value size]({plots['value_size']})\n"
    return text


def _bytes(n: float) -> str:
    if n >= 1024 and n % 1024 == 0:
        return f"{n / 1024:g} KiB"
    return f"{n:g} B"


def _scaling_load(raw: J, plots: dict[str, str]) -> str:
    obs = run_of(raw, "observers")
    if obs is None or not obs.get("latency"):
        return ""
    sweep = obs["latency"]["sweep"]
    base = sweep[0]["p50_s"]
    doubled = next((s for s in sweep if s["p50_s"] > 2 * base), None)
    text = (
        "### Observer latency vs offered load\n\n"
        "The P5 sweep (table above): latency against the achieved write rate.  "
        f"p50 is {base * 1000:.0f} ms at the lowest rate ({fmt_rate(sweep[0]['achieved'])} "
        "writes/s); "
    )
    text += (
        f"it first exceeds twice that at {fmt_rate(doubled['achieved'])} writes/s (the knee); "
        if doubled is not None
        else "it never exceeds twice that within the sweep; "
    )
    text += (
        f"the saturation point is {fmt_rate(obs['latency']['saturation_writes_per_s'])} "
        "writes/s.\n"
    )
    if "load" in plots:
        text += f"\n![latency vs load]({plots['load']})\n"
    return text


def _scaling_oracle(raw: J, plots: dict[str, str]) -> str:
    oracle = run_of(raw, "oracle")
    if oracle is None:
        return ""
    pts_r = [(float(w), _oracle_ratio_range(c, "ranged").median
              * float(c["per-rpc"]["rate"]["median"]))
             for w, c in oracle["waiters"].items() if "ranged" in c]
    pts_b = [(float(w), float(c["batched"]["rate"]["median"])) for w, c in
             oracle["waiters"].items()]
    pts_p = [(float(w), float(c["per-rpc"]["rate"]["median"])) for w, c in
             oracle["waiters"].items()]
    text = (
        "### Oracle throughput vs concurrent waiters\n\n"
        f"Batched: {steps_text(pts_b, 'gain per step of waiters')}.  One timestamp per RPC: "
        f"{steps_text(pts_p, 'gain per step')}.  Knee of the batched curve at "
        f"{knee(pts_b)[0]:g} waiters."
        + (f"  Ranged allocation: {steps_text(pts_r, 'gain per step')}." if len(pts_r) > 1
           else "")
        + "\n"
    )
    if "oracle" in plots:
        text += f"\n![oracle vs waiters]({plots['oracle']})\n"
    return text


# ------------------------------------------------------------------ why the misses miss


def _why_section(raw: J, targets: Sequence[TargetResult]) -> str:
    misses = [t for t in targets if t.verdict == MISS]
    if not misses:
        return "## Why the misses miss\n\nNo target was missed.\n"
    profiles = raw.get("profiles", {})
    parts = [
        "## Why the misses miss\n\n"
        "For each missed target, the missing operation was profiled in a separate process "
        "against the same store: store round trips counted by the store's own counters "
        "(`Store.stats`), timestamps drawn from the oracle, wall time per operation "
        "(single-threaded, without the profiler), and the functions with the most own time "
        "under cProfile (which slows Python code down, so compare shares, not absolute "
        "times).\n"
    ]
    for t in misses:
        kind = PROFILE_OF[t.tid]
        profile = profiles.get(kind)
        parts.append(f"### {t.tid} {t.what}: {t.figure} against {t.goal}\n")
        if not isinstance(profile, dict) or profile.get("error"):
            why = profile.get("error") if isinstance(profile, dict) else "not profiled"
            parts.append(f"No profile: {why}.\n")
            continue
        explain = _EXPLAIN.get(t.tid)
        if explain is not None:
            try:
                parts.append(explain(raw, profile) + "\n")
            except (KeyError, TypeError, ValueError, ZeroDivisionError, IndexError) as exc:
                parts.append(f"(cannot derive the explanation: {type(exc).__name__}: {exc})\n")
        parts.append(_profile_tables(profile, _FOCUS.get(t.tid)))
    return "\n".join(parts)


def _breakdown(op: J) -> str:
    """``compare_and_set 2.00, put 2.00``: round trips per operation by store call."""
    per = op["round_trips_per_op"]
    return ", ".join(f"{k} {v:.2f}" for k, v in sorted(per.items(), key=lambda kv: -kv[1]))


def _rt(op: J) -> str:
    detail = _breakdown(op)
    return f"{_total_rt(op):.2f}" + (f" ({detail})" if detail else "")


def _total_rt(op: J) -> float:
    return float(sum(op["round_trips_per_op"].values()))


def _profile_tables(profile: J, focus: Sequence[str] | None) -> str:
    ops = profile.get("ops", {})
    names = [n for n in (focus or list(ops)) if n in ops]
    rows = []
    for name in names:
        op = ops[name]
        rows.append([
            name, op.get("unit", "operation"), f"{op['ms_per_op']:.3f}", _rt(op),
            f"{op.get('timestamps_per_op', 0):.2f}", f"{op.get('oracle_ms_per_op', 0):.3f}",
        ])
    text = md_table(["operation", "one operation is", "ms per op", "store round trips per op",
                     "timestamps per op", "oracle wait ms per op"], rows) + "\n"
    for name in names:
        top = ops[name].get("top") or []
        if not top:
            continue
        clock = ops[name].get("profile_clock", "wall")
        trows = [[f"`{f['function']}`", f"{f['calls_per_op']:.2f}", f"{f['own_ms_per_op']:.3f}",
                  f"{f['cum_ms_per_op']:.3f}"] for f in top]
        text += (
            f"\nTop functions of `{name}` by own time ({clock} clock, per operation, "
            f"{ops[name].get('profiled_ops', '?')} operations profiled):\n\n"
            + md_table(["function", "calls", "own ms", "cumulative ms"], trows) + "\n"
        )
    return text


def _why_p1(raw: J, profile: J, count: int) -> str:
    oracle = run_of(raw, "oracle")
    assert oracle is not None
    cell = oracle["waiters"][str(count)]
    b, p = cell["batched"], cell["per-rpc"]
    b_rate, p_rate = float(b["rate"]["median"]), float(p["rate"]["median"])
    rpc_rate = b_rate * float(b["rpcs_per_timestamp"])
    text = (
        f"With {count:,} waiters the coalescing client drew {fmt_rate(b_rate)} timestamps/s "
        f"in {fmt_rate(rpc_rate)} RPCs/s ({1 / float(b['rpcs_per_timestamp']):.0f} timestamps "
        f"per RPC), while the same server answered {fmt_rate(p_rate)} RPCs/s when each carried "
        f"one timestamp: the batched run used {rpc_rate / p_rate:.0%} of that RPC rate, "
        f"with batches of {1 / float(b['rpcs_per_timestamp']):.0f} of the {count:,} waiters "
        "on average.  "
    )
    op = profile.get("ops", {}).get("batched")
    if op is not None and op.get("process_cpu_us_per_op"):
        cpu_us = float(op["process_cpu_us_per_op"])
        rate = 1000 / float(op["ms_per_op"])
        text += (
            f"In the profile process ({op.get('waiters', '?')} waiters, no profiler running) "
            f"the client drew {fmt_rate(rate)} timestamps/s and used {cpu_us:.0f} us of CPU "
            f"per timestamp over all its threads, keeping {cpu_us * rate / 1e6:.2f} CPU(s) "
            f"busy on a {raw.get('machine', {}).get('cores', '?')}-core machine that also runs "
            "the oracle server and HBase."
        )
    return text


def _why_p1a(raw: J, profile: J) -> str:
    oracle = run_of(raw, "oracle")
    assert oracle is not None
    most = max(int(w) for w in oracle["waiters"])
    cell = oracle["waiters"][str(most)]
    if p1a_mode(cell) == "batched":
        return _why_p1(raw, profile, most)
    rg, p = cell["ranged"], cell["per-rpc"]
    calls, single = float(rg["rate"]["median"]), float(p["rate"]["median"])
    return (
        f"With {most:,} waiters the server answered {fmt_rate(calls)} Allocate(count="
        f"{rg['range']}) RPCs/s (p50 {fmt_ms(rg['p50_ms'])} ms) against {fmt_rate(single)} "
        f"Allocate(count=1) RPCs/s (p50 {fmt_ms(p['p50_ms'])} ms): the ratio is "
        f"{rg['range']} x {calls:.0f} / {single:.0f} = {rg['range'] * calls / single:.1f}x; "
        f"50x at this range size needs ranged RPCs at {50 / rg['range']:.0%} of the rate of "
        f"single ones, and they ran at {calls / single:.0%}.  The coalescing client's "
        "profile follows (the ranged RPCs are not profiled)."
    )


def _why_p1b(raw: J, profile: J) -> str:
    return _why_p1(raw, profile, 100)


def _why_p1c(raw: J, profile: J) -> str:
    op = profile["ops"]["txn_1cell"]
    txn = run_of(raw, "txn_hbase")
    share = statistics.median(txn["oracle_share"]) if txn and txn.get("oracle_share") else None
    text = (
        f"A single-cell transaction drew {op['timestamps_per_op']:.2f} timestamps and waited "
        f"{op['oracle_ms_per_op']:.3f} ms for them, of {op['ms_per_op']:.3f} ms per transaction "
        f"({op['oracle_ms_per_op'] / op['ms_per_op']:.1%}) single-threaded"
    )
    if share is not None and txn is not None:
        text += (
            f"; in the benchmark, with {txn['threads']} threads at full load, the share was "
            f"{share:.1%}"
        )
    return text + "."


def _why_ratio(raw: J, profile: J, engine: str, base: str, what: str, base_what: str,
               target_key: str) -> str:
    ops = profile["ops"]
    e, b = ops[engine], ops[base]
    txn = run_of(raw, "txn_hbase")
    text = (
        f"{what} made {_total_rt(e):.2f} store round trips ({_breakdown(e)}) and drew "
        f"{e.get('timestamps_per_op', 0):.2f} timestamps, against {_total_rt(b):.2f} round "
        f"trip(s) for {base_what}.  Single-threaded it took {e['ms_per_op']:.3f} ms against "
        f"{b['ms_per_op']:.3f} ms ({e['ms_per_op'] / b['ms_per_op']:.2f}x the time"
    )
    if e.get("oracle_ms_per_op"):
        text += f"; {e['oracle_ms_per_op']:.3f} ms of it waiting for the oracle"
    text += ")"
    if txn is not None:
        text += (
            f"; the benchmark's ratio with {txn['threads']} threads was "
            f"{Fig.from_spread(txn['ratios'][target_key]).median:.2f}x"
        )
    return text + "."


def _why_p2(raw: J, profile: J) -> str:
    return _why_ratio(raw, profile, "txn_read", "raw_get", "A transactional read",
                      "a raw get", "P2 read / raw get")


def _why_p3(raw: J, profile: J) -> str:
    return _why_ratio(raw, profile, "txn_1cell", "raw_put", "A single-cell transaction",
                      "a raw put", "P3 1-cell txn / raw put")


def _why_p4(raw: J, profile: J) -> str:
    ops = profile["ops"]
    ten, one = ops["txn_10cell"], ops["txn_1cell"]
    time_ratio = ten["ms_per_op"] / one["ms_per_op"]
    return (
        f"A 10-cell transaction made {_total_rt(ten):.2f} store round trips "
        f"({_total_rt(ten) / 10:.2f} per cell) against {_total_rt(one):.2f} for a 1-cell "
        f"transaction, and took {ten['ms_per_op']:.3f} ms against {one['ms_per_op']:.3f} ms "
        f"single-threaded ({time_ratio:.2f}x).  Ten cells at >= 3x the cells/s of single-cell "
        f"transactions needs a 10-cell transaction to take at most {10 / 3:.2f}x the time of "
        f"a 1-cell one; single-threaded that gives {10 / time_ratio:.2f}x."
    )


def _why_p5(raw: J, profile: J) -> str:
    op = profile["ops"]["observer_run"]
    obs = run_of(raw, "observers")
    text = (
        f"One observer run (scan included) made {_total_rt(op):.2f} store round trips and drew "
        f"{op.get('timestamps_per_op', 0):.2f} timestamps; single-threaded in one process a run "
        f"took {op['ms_per_op']:.2f} ms, {1000 / op['ms_per_op']:.0f} runs/s per thread"
    )
    if obs is not None and obs.get("latency"):
        lat = obs["latency"]
        text += (
            f"; the benchmark's worker ({lat.get('threads', '?')} threads) saturated at "
            f"{fmt_rate(lat['saturation_writes_per_s'])} writes/s"
        )
    return text + "."


def _why_p6(raw: J, profile: J) -> str:
    ops = profile["ops"]
    small, large = ops.get("notify_pass_small"), ops.get("notify_pass_large")
    if small is None or large is None:
        return ""
    return (
        f"One notification pass over {small.get('rows', '?'):,} rows made {_total_rt(small):.2f} "
        f"store round trips in {small['ms_per_op']:.2f} ms; over {large.get('rows', '?'):,} rows "
        f"{_total_rt(large):.2f} round trips in {large['ms_per_op']:.2f} ms "
        f"({large['ms_per_op'] / small['ms_per_op']:.2f}x), with "
        f"{large.get('dirty', '?')} dirty cells both times."
    )


def _why_p7(raw: J, profile: J) -> str:
    op = profile["ops"]["incremental"]
    spark = run_of(raw, "spark")
    changes = float(op.get("changes", 1))
    per_change_ms = op["ms_per_op"]
    text = (
        f"After {changes:.0f} document changes, processing them to quiescence "
        f"single-threaded took {per_change_ms:.1f} ms per changed document: "
        f"{op.get('runs_per_op', 0):.2f} observer runs and {_total_rt(op):.1f} store round "
        f"trips per change ({op.get('documents', '?')}-document corpus)."
    )
    if spark is not None and spark.get("incremental"):
        incr = spark["incremental"]
        docs = float(incr["documents"])
        recompute_ms = float(incr["recompute_s"]) * 1000
        per_doc = recompute_ms / docs
        text += (
            f"  The Spark recompute took {recompute_ms / 1000:.2f} s for {docs:,.0f} documents, "
            f"{per_doc:.2f} ms per document: one change costs as much as recomputing "
            f"{per_change_ms / per_doc:.1f} documents.  At that cost per change, changing 1% of "
            f"the corpus gives recompute / incremental = 100 / {per_change_ms / per_doc:.1f} = "
            f"{100 / (per_change_ms / per_doc):.1f}x (50x needs a change to cost at most as "
            "much as recomputing 2 documents); the benchmark measured "
            f"{statistics.median(r['ratio'] for r in spark_rounds(incr)):.1f}x over all rounds."
        )
    return text


def _why_p8(raw: J, profile: J) -> str:
    ops = profile["ops"]
    fill, rawb = ops["backfill_batch"], ops["raw_batch"]
    rows = fill.get("rows", "?")
    return (
        f"A backfill batch of {rows} rows (one transaction: read the progress marker, write "
        f"every cell and the marker) made {_total_rt(fill):.1f} store round trips "
        f"({_breakdown(fill)}) and took {fill['ms_per_op']:.1f} ms single-threaded; "
        f"the raw load of the same rows made {_total_rt(rawb):.1f} round trip(s) in "
        f"{rawb['ms_per_op']:.1f} ms ({fill['ms_per_op'] / rawb['ms_per_op']:.1f}x the time)."
    )


def _why_p9(raw: J, profile: J) -> str:
    op = profile["ops"]["resolving_read"]
    return (
        f"The read took {op['ms_per_op'] / 1000:.3f} s; {op.get('must_wait_s', 0):.3f} s of it was "
        f"the lock's remaining TTL (TTL {op.get('ttl_ms', '?')} ms); it made "
        f"{_total_rt(op):.0f} store round trips."
    )


_EXPLAIN: dict[str, Callable[[J, J], str]] = {
    "P1a": _why_p1a, "P1b": _why_p1b, "P1c": _why_p1c, "P2": _why_p2, "P3": _why_p3,
    "P4": _why_p4, "P5": _why_p5, "P6": _why_p6, "P7": _why_p7, "P8": _why_p8, "P9": _why_p9,
}

#: the profiled operations shown for each target (in this order)
_FOCUS: dict[str, Sequence[str]] = {
    "P1a": ("batched",), "P1b": ("batched",), "P1c": ("txn_1cell",),
    "P2": ("txn_read", "raw_get"), "P3": ("txn_1cell", "raw_put"),
    "P4": ("txn_10cell", "txn_1cell"), "P5": ("observer_run",),
    "P6": ("notify_pass_small", "notify_pass_large"), "P7": ("incremental",),
    "P8": ("backfill_batch", "raw_batch"), "P9": ("resolving_read",),
}


# ------------------------------------------------------------------ baselines and log


def _baselines_section(raw: J) -> str:
    store = run_of(raw, "store")
    if store is None:
        return ""
    rows = []
    for url, ops in store["stores"].items():
        label = "embedded" if url.startswith("embedded") else "HBase"
        for op, s in ops.items():
            rate = Fig.from_spread(s["rate"])
            rows.append([
                label, op, fmt_rate(rate.median), f"{fmt_rate(rate.low)}-{fmt_rate(rate.high)}",
                fmt_rate(s["item_rate"]["median"]) if s["items_per_op"] > 1 else "",
                fmt_ms(s["p50_ms"]), fmt_ms(s["p99_ms"]),
            ])
    return (
        "## Raw store baselines\n\n"
        f"store_bench: {store['ops']} calls per operation, {store['threads']} thread(s), "
        f"{store['value_size']}-byte values, batches of {store['batch_cells']} cells.\n\n"
        + md_table(["store", "operation", "calls/s", "range", "cells/s", "p50 ms", "p99 ms"],
                   rows)
        + "\n"
    )


def _run_log_section(raw: J) -> str:
    rows = []
    cores = raw.get("machine", {}).get("cores") or 0
    loaded = [s["name"] for s in raw.get("steps", [])
              if cores and max(s.get("load_before", 0), s.get("load_after", 0)) > cores]
    for s in raw.get("steps", []):
        rows.append([
            s["name"], f"{s['seconds']:.0f}", f"{s.get('load_before', 0):.2f}",
            f"{s.get('load_after', 0):.2f}", s["status"] + (f": {s['error']}" if s.get("error")
                                                            else ""),
        ])
    return (
        "## Run log\n\n"
        "Every step ran as its own process; the commands and their output are in the run's "
        f"work directory (`{raw.get('meta', {}).get('workdir', '?')}`).  Load is the 1-minute "
        "load average.  `warmup` is untimed store traffic that warms the server before the "
        "first measurement.\n\n"
        + md_table(["step", "seconds", "load before", "load after", "status"], rows)
        + "\n"
        + (f"\nSteps that started or ended with a load average above the {cores} cores (other "
           f"work competing for the CPU): {', '.join(loaded)}.\n" if loaded else "")
    )


# --------------------------------------------------------------------------- plots


def make_plots(raw: J, targets: Sequence[TargetResult], plot_dir: Path, rel_to: Path
               ) -> dict[str, str]:
    """Write the PNG plots; returns name -> path relative to ``rel_to`` (for the markdown).
    Plots whose data is missing are skipped."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plot_dir.mkdir(parents=True, exist_ok=True)
    written: dict[str, str] = {}

    def save(name: str, fig: Any) -> None:
        path = plot_dir / f"{name}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written[name] = os.path.relpath(path, rel_to)

    scored = [t for t in targets if t.score is not None and math.isfinite(t.score)]
    if scored:
        fig, ax = plt.subplots(figsize=(8, 0.45 * len(scored) + 1.5))
        labels = [f"{t.tid} {t.goal}" for t in scored]
        values = [float(t.score or 0) for t in scored]
        lows = [float(t.score_low if t.score_low is not None else v) for t, v in
                zip(scored, values, strict=True)]
        highs = [float(t.score_high if t.score_high is not None else v) for t, v in
                 zip(scored, values, strict=True)]
        colors = ["tab:green" if t.verdict == PASS else "tab:red" for t in scored]
        ys = list(range(len(scored)))[::-1]
        ax.barh(ys, values, color=colors, alpha=0.8)
        ax.errorbar(values, ys, xerr=[[max(v - lo, 0) for v, lo in zip(values, lows,
                                                                         strict=True)],
                                      [max(hi - v, 0) for v, hi in zip(values, highs,
                                                                        strict=True)]],
                    fmt="none", ecolor="black", capsize=3)
        ax.axvline(1.0, color="black", linestyle="--", linewidth=1)
        ax.set_xscale("log")
        ax.set_yticks(ys)
        ax.set_yticklabels(labels)
        for y, t, v in zip(ys, scored, values, strict=True):
            ax.text(v, y, f"  {t.label or t.figure.split(' (')[0]}", va="center", fontsize=8)
        ax.set_xlabel("measured relative to goal (>= 1 meets it)")
        ax.set_title("Targets: measured / goal (HBase)")
        save("targets", fig)

    def ticks(ax: Any, values: Iterable[float]) -> None:
        from matplotlib.ticker import NullFormatter

        ax.set_xticks(sorted(set(values)))
        ax.set_xticklabels([f"{v:g}" for v in sorted(set(values))])
        ax.xaxis.set_minor_formatter(NullFormatter())

    runs = observer_points(raw)
    if runs:
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
        palette = ["tab:blue", "tab:orange", "tab:green", "tab:red"]
        for n, workers in enumerate(sorted({int(r["workers"]) for r in runs})):
            color = palette[n % len(palette)]
            mine = sorted((r for r in runs if int(r["workers"]) == workers),
                          key=lambda r: int(r["threads"]))
            totals = [int(r["threads"]) * workers for r in mine]
            med = [statistics.median(r["backlog_runs"]) for r in mine]
            lo = [m - min(r["backlog_runs"]) for m, r in zip(med, mine, strict=True)]
            hi = [max(r["backlog_runs"]) - m for m, r in zip(med, mine, strict=True)]
            a1.errorbar(totals, med, yerr=[lo, hi], marker="o", capsize=3, color=color,
                        label=f"{workers} process(es)")
            a2.plot(totals, [r["step"]["p50_s"] * 1000 for r in mine], marker="o", color=color,
                    label=f"p50, {workers} process(es)")
            a2.plot(totals, [r["step"]["p99_s"] * 1000 for r in mine], marker="x", color=color,
                    linestyle="--", label=f"p99, {workers} process(es)")
        all_totals = [int(r["threads"]) * int(r["workers"]) for r in runs]
        a1.set_xscale("log", base=2)
        ticks(a1, all_totals)
        a1.set_xlabel("worker threads in all")
        a1.set_ylabel("backlog runs/s")
        a1.set_title("Observer throughput")
        a1.legend()
        a2.set_xscale("log", base=2)
        ticks(a2, all_totals)
        a2.set_xlabel("worker threads in all")
        a2.set_ylabel("latency ms")
        a2.set_title(f"Latency at {fmt_rate(runs[0]['fixed_rate'])} writes/s")
        a2.legend(fontsize=7)
        save("observers", fig)

    series = _txn_series(raw, "txn_threads")
    if series:
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
        xs = [x for x, _ in series]
        for op, label in (("txn_1cell", "1-cell txn/s"), ("raw_put", "raw put/s"),
                          ("txn_read", "txn read/s"), ("raw_get", "raw get/s")):
            a1.plot(xs, [_rate_median(r["timings"], op) for _, r in series], marker="o",
                    label=label)
        a1.set_xscale("log", base=2)
        ticks(a1, xs)
        a1.set_yscale("log")
        a1.set_xlabel("client threads")
        a1.set_ylabel("operations/s")
        a1.legend(fontsize=8)
        a1.set_title("Transactions vs threads (HBase)")
        a2.plot(xs, [_rate_median(r["timings"], "txn_1cell") / _rate_median(r["timings"],
                                                                              "raw_put")
                     for _, r in series], marker="o", label="1-cell txn / put (P3)")
        a2.plot(xs, [_rate_median(r["timings"], "txn_read") / _rate_median(r["timings"],
                                                                             "raw_get")
                     for _, r in series], marker="o", label="read / get (P2)")
        a2.axhline(0.30, color="tab:blue", linestyle=":", linewidth=1)
        a2.axhline(0.90, color="tab:orange", linestyle=":", linewidth=1)
        a2.set_xscale("log", base=2)
        ticks(a2, xs)
        a2.set_xlabel("client threads")
        a2.set_ylabel("engine / raw")
        a2.legend(fontsize=8)
        a2.set_title("Ratios vs threads (dotted: goals)")
        save("txn_threads", fig)

    series = _txn_series(raw, "value_size")
    if series:
        fig, ax = plt.subplots(figsize=(6, 4))
        xs = [x for x, _ in series]
        for op, label in (("txn_1cell", "1-cell txn/s"), ("raw_put", "raw put/s")):
            ax.plot(xs, [_rate_median(r["timings"], op) for _, r in series], marker="o",
                    label=label)
        ax.set_xscale("log", base=2)
        ticks(ax, xs)
        ax.set_yscale("log")
        ax.set_xlabel("value size (bytes)")
        ax.set_ylabel("operations/s")
        ax.set_title("Writes vs value size (HBase)")
        ax.legend()
        save("value_size", fig)

    obs = run_of(raw, "observers")
    if obs is not None and obs.get("scan"):
        fig, ax = plt.subplots(figsize=(6, 4))
        sizes = obs["scan"]["sizes"]
        rows = [s["rows"] for s in sizes]
        ax.plot(rows, [s["notify_scan_s"] * 1000 for s in sizes], marker="o",
                label="notify pass (HBase)")
        ax.plot(rows, [s["lock_scan_s"] * 1000 for s in sizes], marker="x", linestyle="--",
                label="lock-family scan (HBase)")
        emb = run_of(raw, "scan_embedded")
        if emb is not None and emb.get("scan"):
            es = emb["scan"]["sizes"]
            ax.plot([s["rows"] for s in es], [s["notify_scan_s"] * 1000 for s in es],
                    marker="o", label="notify pass (embedded)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("table rows")
        ax.set_ylabel("ms per pass")
        ax.set_title("Finding dirty cells vs table size")
        ax.legend(fontsize=8)
        save("scan", fig)
    if obs is not None and obs.get("latency"):
        sweep = obs["latency"]["sweep"]
        fig, ax = plt.subplots(figsize=(6, 4))
        xs = [s["achieved"] for s in sweep]
        ax.plot(xs, [s["p50_s"] * 1000 for s in sweep], marker="o", label="p50")
        ax.plot(xs, [s["p99_s"] * 1000 for s in sweep], marker="x", label="p99")
        ax.axvline(obs["latency"]["saturation_writes_per_s"], color="black", linestyle="--",
                   linewidth=1, label="saturation point")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("writes/s")
        ax.set_ylabel("commit-to-observer-commit ms")
        ax.set_title("Observer latency vs load (HBase)")
        ax.legend()
        save("load", fig)
    oracle = run_of(raw, "oracle")
    if oracle is not None:
        items = sorted(oracle["waiters"].items(), key=lambda kv: int(kv[0]))
        fig, ax = plt.subplots(figsize=(6, 4))
        counts = [int(w) for w, _ in items]
        ax.plot(counts, [c["batched"]["rate"]["median"] for _, c in items], marker="o",
                label="batched (coalescing client)")
        ax.plot(counts, [c["per-rpc"]["rate"]["median"] for _, c in items], marker="x",
                label="one timestamp per RPC")
        with_range = [(int(w), c) for w, c in items if "ranged" in c]
        if with_range:
            ax.plot([w for w, _ in with_range],
                    [_oracle_ratio_range(c, "ranged").median * c["per-rpc"]["rate"]["median"]
                     for _, c in with_range], marker="s",
                    label=f"ranged, {with_range[0][1]['ranged']['range']} per RPC")
        ax.set_xscale("log")
        ticks(ax, counts)
        ax.set_yscale("log")
        ax.set_xlabel("concurrent waiters")
        ax.set_ylabel("timestamps/s")
        ax.set_title("Timestamp oracle")
        ax.legend()
        save("oracle", fig)
    return written


# --------------------------------------------------------------------------- entry points


def write_report(raw: J, out: Path, plot_dir: Path) -> list[TargetResult]:
    """Evaluate, plot and write ``out``; returns the verdicts."""
    targets = evaluate(raw)
    plots = make_plots(raw, targets, plot_dir, out.resolve().parent)
    out.write_text(render(raw, targets, plots), encoding="utf-8")
    return targets


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write results.md and plots from raw.json.")
    parser.add_argument("raw", help="raw.json from a bench/run_all work directory")
    parser.add_argument("--out", default=str(BENCH_DIR / "results.md"))
    parser.add_argument("--plots", default=str(BENCH_DIR / "plots"), help="PNG directory")
    args = parser.parse_args(argv)
    raw = json.loads(Path(args.raw).read_text(encoding="utf-8"))
    targets = write_report(raw, Path(args.out), Path(args.plots))
    for t in targets:
        print(f"{t.tid:4} {t.verdict:12} {t.figure}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

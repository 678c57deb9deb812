"""The performance report: ``bench/results.md`` and its PNG plots, from the raw results of
``bench/run_all``.

Everything the report says is computed here from the measured numbers in the raw results
(``raw.json``, which ``bench/run_all`` writes into its work directory): the verdict per
target, the ratios, the knees of the scaling curves and the explanation of every miss.
Every target of bench/targets.py is judged by :func:`judge` (its reader on its step's JSON,
against its threshold) and every miss explained by :func:`explain` (from the profile
run_all took of its workload: round trips, timestamps, time, top functions).  No figure is
typed in by hand except the published anchors and the goals, which are quoted from the
project's targets (bench/targets.py).

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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``bench`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import fmt_ms, fmt_rate, format_table, median_per_key
from bench.targets import (
    AT_LEAST,
    BY_ID,
    REPORT,
    TARGETS,
    Fig,
    Reading,
    Target,
    oracle_name,
    oracle_ratio,
    spark_rounds,
)

J = dict[str, Any]
BENCH_DIR = Path(__file__).resolve().parent

PASS, MISS, NOT_MEASURED, REPORTED = "PASS", "MISS", "NOT MEASURED", "REPORTED"


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
    error: str = ""
    #: a short form of the figure for the plot (default: the figure without its range)
    label: str = ""


def fx(f: Fig, digits: int = 2) -> str:
    return f.text(digits=digits)


def fsec(f: Fig) -> str:
    return f.text("s", 3)


def md_table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    return format_table(headers, rows, markdown=True)


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


def judged_store(raw: J) -> str:
    """What the judged steps ran on: "HBase", or "embedded" for a run on the embedded store."""
    store = str(raw.get("machine", {}).get("store", ""))
    return "embedded" if store.startswith("embedded") else "HBase"


def _rate_median(timings: list[J], op: str, key: str = "item_rate") -> float:
    return statistics.median(float(t[op][key]) for t in timings)


# --------------------------------------------------------------------------- evaluation


def evaluate(raw: J) -> list[TargetResult]:
    """Every target's verdict from the raw results: each target's reader on the JSON of
    the step that measures it, judged against its threshold."""
    return [judge(t, raw) for t in TARGETS]


def judge(target: Target, raw: J) -> TargetResult:
    r = TargetResult(target.id, target.title, target.goal, target.anchor)
    if target.read is None:
        r.error = (
            f"not run by bench/run_all: measured by hand with `{target.measured_outside}` "
            "(sections below)"
            if target.measured_outside
            else "no benchmark measures it yet"
        )
        return r
    run = run_of(raw, target.measured_by)
    if run is None:
        r.error = step_error(raw, target.measured_by)
        return r
    try:
        reading = target.read(run)
    except (KeyError, TypeError, ValueError, ZeroDivisionError, IndexError) as exc:
        # A benchmark whose JSON lacks a field is reported, never guessed around.
        r.error = f"cannot read the results: {type(exc).__name__}: {exc}"
        return r
    f = reading.value
    r.measured = reading.measured
    r.figure = reading.figure or fx(f)
    r.label = reading.label
    d = _side_reading(target, raw, target.default_by)
    if d is not None:
        r.measured += (
            f"; with the engine's default oracle (local, in the store), not judged: "
            f"{d.figure or fx(d.value)}"
        )
    e = _side_reading(target, raw, target.embedded_by)
    embedded_meets = True
    if e is not None:
        r.embedded = e.figure or fx(e.value)
        if not math.isnan(target.embedded_threshold):
            embedded_meets = target.meets(e.value.median, target.embedded_threshold)
            r.embedded += (
                f" (goal {target.direction} {target.embedded_threshold:g}x: "
                f"{'met' if embedded_meets else 'missed'})"
            )
    if target.direction == REPORT:
        r.verdict = REPORTED
        return r
    threshold = target.threshold_on(judged_store(raw))
    met = target.meets(f.median, threshold) and reading.holds and embedded_meets
    r.verdict = PASS if met else MISS
    # The worst repeat gives the lowest score: the high end for "at most" goals.
    low, high = (f.low, f.high) if target.direction == AT_LEAST else (f.high, f.low)
    r.score, r.score_low, r.score_high = (
        target.score(f.median, threshold),
        target.score(low, threshold),
        target.score(high, threshold),
    )
    return r


def _side_reading(target: Target, raw: J, step: str) -> Reading | None:
    """``target``'s reading of a step shown beside its judged one (the embedded run, the
    run with the engine's defaults), or None if that step did not run or its JSON cannot
    be read: a side figure never stops the judged one from being reported."""
    run = run_of(raw, step) if step else None
    if run is None or target.read is None:
        return None
    try:
        return target.read(run)
    except (KeyError, TypeError, ValueError, ZeroDivisionError, IndexError):
        return None


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


# --------------------------------------------------------------------------- markdown


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
        "This file is generated: edit `bench/report.py` and `bench/targets.py`, not this file.\n"
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
        verdict = f"**{t.verdict}**" if t.verdict in (MISS, NOT_MEASURED) else t.verdict
        measured = t.measured if t.verdict != NOT_MEASURED else (t.error or "not measured")
        rows.append([t.tid, t.what, t.anchor, measured, t.figure, t.goal, t.embedded, verdict])
    counts = {
        v: sum(1 for t in targets if t.verdict == v) for v in (PASS, MISS, NOT_MEASURED, REPORTED)
    }
    store = judged_store(raw)
    text = "## Targets\n\n"
    text += (
        f"{counts[PASS]} met, {counts[MISS]} missed, {counts[REPORTED]} reported (no "
        f"threshold), {counts[NOT_MEASURED]} not measured, "
        f'of {len(targets)} (bench/targets.py).  "{store}" is the figure judged'
        + (
            '; "embedded" is the same benchmark on the embedded store (the engine without '
            "HBase), where it is cheap to run; P1c-P4 there take their timestamps from its "
            "default, local oracle"
            if store == "HBase"
            else ""
        )
        + ".\n\n"
    )
    text += md_table(
        [
            "id",
            "target",
            "anchor (published)",
            f"measured ({store})",
            f"figure ({store})",
            "goal",
            "embedded",
            "result",
        ],
        rows,
    )
    if "targets" in plots:
        text += f"\n\n![targets]({plots['targets']})\n\n"
        text += (
            "Each bar is the measured figure relative to its goal (>= 1 meets it; for "
            '"at most" goals the goal divided by the figure), log scale; the whiskers are '
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
                w,
                fmt_rate(p["rate"]["median"]),
                fmt_rate(b["rate"]["median"]),
                f"{b['rpcs_per_timestamp']:.3f}",
                fmt_rate(b["rate"]["median"] * b["rpcs_per_timestamp"]),
                fmt_ms(b["p50_ms"]),
                fmt_ms(b["p99_ms"]),
                f"{cell['ratio']:.1f}x",
            ]
            if ranged:
                rg = cell.get("ranged")
                row += (
                    ["-", "-", "-"]
                    if rg is None
                    else [
                        fmt_rate(oracle_ratio(cell, "ranged").median * p["rate"]["median"]),
                        fmt_ms(rg["p50_ms"]),
                        fx(oracle_ratio(cell, "ranged"), 1),
                    ]
                )
            rows.append(row)
        headers = [
            "waiters",
            "per-RPC ts/s",
            "batched ts/s",
            "RPCs per ts (batched)",
            "RPCs/s (batched)",
            "batched p50 ms",
            "batched p99 ms",
            "batched / per-RPC",
        ]
        if ranged:
            headers += ["ranged ts/s", "ranged p50 ms", "ranged / per-RPC"]
        parts.append(
            "### P1 timestamp oracle\n\n"
            "An oracle server started by oracle_bench on the run's HBase, one client process; "
            "per waiter count: one timestamp per RPC (`per-RPC`), the coalescing client "
            "(`batched`)"
            + (
                ", and one Allocate RPC for a range of timestamps per call (`ranged`)"
                if ranged
                else ""
            )
            + ".\n\n"
            + md_table(headers, rows)
            + "\n"
        )
    for label, name in (
        (judged_store(raw), "txn_hbase"),
        (f"{judged_store(raw)}, the default local oracle", "txn_hbase_local"),
        ("embedded, the default local oracle", "txn_embedded"),
    ):
        txn = run_of(raw, name)
        if txn is None:
            continue
        timings = txn["timings"]
        rows = []
        known = ["raw_get", "raw_put", "txn_read", "txn_read_full", "txn_1cell", "txn_10cell"]
        ops = [o for o in known if o in timings[0]] + [o for o in timings[0] if o not in known]
        cpu = {
            op: median_per_key([t[op].get("cpu_ms_per_item", {}) for t in timings]) for op in ops
        }
        for op in ops:
            rows.append(
                [
                    op,
                    fmt_rate(_rate_median(timings, op)),
                    fmt_ms(statistics.median(float(t[op]["p50_ms"]) for t in timings)),
                    fmt_ms(statistics.median(float(t[op]["p99_ms"]) for t in timings)),
                ]
            )
        cpu_headers, cpu_rows = cpu_columns([cpu[op] for op in ops])
        rows = [row + extra for row, extra in zip(rows, cpu_rows, strict=True)]
        shares = txn.get("oracle_share") or []
        share = f"; oracle wait {statistics.median(shares):.1%} of 1-cell latency" if shares else ""
        parts.append(
            f"### P1c-P4 transactions ({label})\n\n"
            f"{txn.get('threads')} client threads, {txn.get('ops')} operations per repeat, "
            f"{txn.get('value_size', '?')}-byte values, timestamps from the "
            f"{oracle_name(txn.get('oracle', '?'))}{share}.  "
            "`raw_*` are the store's own get and put in the same repeat."
            + (cpu_note(parts) if cpu_headers else "")
            + "\n\n"
            + md_table(["operation", "items/s", "p50 ms", "p99 ms", *cpu_headers], rows)
            + "\n"
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
            + md_table(
                [
                    "step",
                    "offered/s",
                    "writes/s",
                    "runs/s",
                    "p50 ms",
                    "p99 ms",
                    "max ms",
                    "kept up",
                ],
                rows,
            )
            + "\n"
        )
    if obs is not None and obs.get("scan"):
        parts.append(
            "### P6 notification scan\n\n"
            + _scan_table(raw)
            + "\n\n"
            + _scan_slopes(raw)
            + "  The figure is the ratio of the median passes at "
            "the largest and the smallest size; its range is that of the ratios of the "
            "repeated passes paired in order.\n"
        )
    spark = run_of(raw, "spark")
    if spark is not None and spark.get("incremental"):
        incr = spark["incremental"]
        rows = [
            [
                x["round"],
                x["runner"],
                f"{x['incremental_s']:.2f}",
                f"{x['recompute_s']:.2f}",
                f"{x['ratio']:.1f}x",
            ]
            for x in spark_rounds(incr)
        ]
        parts.append(
            "### P7 incremental vs full recompute\n\n"
            f"{incr['documents']:,} documents, {incr['changes_per_round']:.0f} changes per round; "
            "`worker` is a worker with runner threads, `drain` the single-threaded drain; the "
            "recompute exports the table, recomputes every derived table with Spark and writes "
            f"Parquet.  Results identical to the recompute and the reference in every round: "
            f"{'yes' if incr.get('identical') else 'NO'} ({incr.get('derived_cells')} derived "
            "cells).\n\n"
            + md_table(
                [
                    "round",
                    "incremental by",
                    "incremental s",
                    "recompute s",
                    "recompute / incremental",
                ],
                rows,
            )
            + "\n"
        )
    if spark is not None and spark.get("load"):
        load = spark["load"]
        rows = [
            [i + 1, fmt_rate(a), fmt_rate(b), f"{b / a:.3f}x"]
            for i, (a, b) in enumerate(zip(load["raw_runs"], load["backfill_runs"], strict=True))
        ]
        parts.append(
            "### P8 the transactional backfill (spark_bench)\n\n"
            f"{load['rows']:,} rows of two values, {load['batch']} rows per batch (raw: one "
            "batched put; backfill: one transaction with its progress marker), Spark "
            f"{spark.get('master', '?')}: the mode for a live table, not judged (P8 judges "
            "the bulk mode, below).\n\n"
            + md_table(["repeat", "raw rows/s", "backfill rows/s", "backfill / raw"], rows)
            + "\n"
        )
    for label, name in ((judged_store(raw), "bulk"), ("embedded", "bulk_embedded")):
        bulk = run_of(raw, name)
        if bulk is None:
            continue
        runs = bulk["runs"]
        rows = [
            [i + 1, fmt_rate(a), fmt_rate(b), f"{b / a:.3f}x", fmt_rate(t), f"{t / a:.3f}x"]
            for i, (a, b, t) in enumerate(
                zip(runs["raw"], runs["bulk"], runs["transactional"], strict=True)
            )
        ]
        parts.append(
            f"### P8 bulk load ({label})\n\n"
            "The same seeded rows (a key and two values) loaded by Spark jobs "
            f"({bulk.get('master', '?')}, session warm; its start-up "
            f"{float(bulk.get('spark_startup_s', 0)):.1f} s is not in the rates), "
            f"{bulk['batch']} rows per put: raw blind puts of {bulk['rows']:,} "
            "rows; the bulk mode (check pass, fence, sort, committed cells, publish: the whole "
            f"job) of the same rows; the transactional mode of the first {bulk['txn_rows']:,}. "
            f"Load average (1 min) during the repeats: {bulk.get('load_average_1m', '?')}.\n\n"
            + md_table(
                [
                    "repeat",
                    "raw rows/s",
                    "bulk rows/s",
                    "bulk / raw",
                    "transactional rows/s",
                    "transactional / raw",
                ],
                rows,
            )
            + "\n"
        )
    for label, name in ((judged_store(raw), "lock_hbase"), ("embedded", "lock_embedded")):
        lock = run_of(raw, name)
        if lock is None:
            continue
        rows = []
        for case, c in lock["cases"].items():
            read = Fig.from_spread(c["read_s"])
            rows.append(
                [
                    case,
                    fsec(read),
                    f"{Fig.from_spread(c['must_wait_s']).median:.3f}",
                    f"{Fig.from_spread(c['excess_s']).median:.3f}",
                    f"{c['round_trips']:.0f}",
                    f"{c['bound_s']:.1f}",
                    PASS if c["pass"] else MISS,
                ]
            )
        parts.append(
            f"### P9 lock cleanup ({label})\n\n"
            f"A client writing {lock['cells']} cells (lock TTL {lock['ttl_ms']} ms) is stopped "
            "at a commit step and killed with SIGKILL; a reader then reads every cell.  "
            '"must wait" is what no reader can avoid (the remaining TTL before the commit '
            'point, nothing after it); "excess" is the read\'s time beyond it.\n\n'
            + md_table(
                [
                    "case",
                    "read after kill",
                    "must wait s",
                    "excess s",
                    "round trips",
                    "bound s",
                    "result",
                ],
                rows,
            )
            + "\n"
        )
    p10 = _p10_section(raw, parts)
    if p10:
        parts.append(p10)
    return "\n".join(parts)


CPU_NOTE = (
    "  CPU columns: milliseconds of CPU per item (cell, pair or run) spent by the benchmark's "
    "own process (`client`), by each server process the run started (`hbase`: the master "
    "and region server JVM, `thrift`/`thrift2`: the gateways, `oracle`: the oracle server) "
    "and by everything else on the machine (`rest`); `busy`: the share of all cores in use "
    "during the measurement."
)


def cpu_note(sections_so_far: Sequence[str]) -> str:
    """:data:`CPU_NOTE` for the first table with CPU columns, a reference to it after."""
    if any(CPU_NOTE in section for section in sections_so_far):
        return "  CPU columns as in the first table that has them."
    return CPU_NOTE


def cpu_columns(cpus: Sequence[J]) -> tuple[list[str], list[list[object]]]:
    """Table columns for CpuUse.per_item_ms dicts (one per row): client, each named
    process, rest, busy.  No columns if no row has CPU figures."""
    if not any(cpus):
        return [], [[] for _ in cpus]
    fixed = {"client", "rest", "machine", "busy"}
    named = sorted({k for c in cpus for k in c if k not in fixed})
    keys = ["client", *named, "rest"]
    headers = [f"{k} CPU ms" for k in keys] + ["busy"]
    rows: list[list[object]] = []
    for c in cpus:
        row: list[object] = [fmt_ms(c[k]) if k in c else "-" for k in keys]
        rows.append([*row, f"{c['busy']:.0%}" if "busy" in c else "-"])
    return headers, rows


def _p10_section(raw: J, earlier: Sequence[str] = ()) -> str:
    """P10's CPU tables; ``earlier``: the sections before it (for :func:`cpu_note`)."""
    parts: list[str] = []
    for label, name in ((judged_store(raw), "p10_hbase"), ("embedded", "p10_embedded")):
        run = run_of(raw, name)
        if run is None or not run.get("cpu_runs"):
            continue
        batch = run["default_batch_size"]
        measured = {
            "raw_pairs": ("raw get + put pair", run["runs_per_s"]["raw_pairs"]),
            "observer": (
                f"worker run (batches of up to {batch})",
                run["runs_per_s"][f"observer_block_batch{batch}"],
            ),
        }
        keys = [k for k in measured if k in run["cpu_runs"]]
        cpus = [median_per_key(run["cpu_runs"][k]) for k in keys]
        headers, cpu_rows = cpu_columns(cpus)
        rows = [
            [measured[k][0], fmt_rate(statistics.median(measured[k][1])), *extra]
            for k, extra in zip(keys, cpu_rows, strict=True)
        ]
        parts.append(
            f"### P10 trivial observer ({label})\n\n"
            f"{run['threads']} threads; medians over {run['repeats']} repeats."
            + cpu_note([*earlier, *parts])
            + "\n\n"
            + md_table(["one item is", "items/s", *headers], rows)
            + "\n"
        )
    return "\n".join(parts)


def _step_row(label: str, s: J) -> list[object]:
    kept = s.get("kept_up")
    return [
        label,
        fmt_rate(s["offered"]),
        fmt_rate(s["achieved"]),
        fmt_rate(s["run_rate"]),
        fmt_ms(s["p50_s"] * 1000),
        fmt_ms(s["p99_s"] * 1000),
        fmt_ms(s["max_s"] * 1000),
        "-" if kept is None else ("yes" if kept else "no"),
    ]


def _scan_table(raw: J) -> str:
    obs = run_of(raw, "observers")
    assert obs is not None
    sizes = obs["scan"]["sizes"]
    emb = run_of(raw, "scan_embedded")
    emb_sizes = {s["rows"]: s for s in emb["scan"]["sizes"]} if emb and emb.get("scan") else {}
    rows = []
    for s in sizes:
        e = emb_sizes.get(s["rows"])
        rows.append(
            [
                f"{s['rows']:,}",
                s["dirty"],
                fmt_ms(s["notify_scan_s"] * 1000),
                fmt_ms(s["lock_scan_s"] * 1000),
                fmt_ms(e["notify_scan_s"] * 1000) if e else "-",
                fmt_ms(e["lock_scan_s"] * 1000) if e else "-",
            ]
        )
    return md_table(
        [
            "table rows",
            "dirty",
            "notify pass ms (HBase)",
            "lock-family scan ms (HBase)",
            "notify pass ms (embedded)",
            "lock-family scan ms (embedded)",
        ],
        rows,
    )


def _scan_slopes(raw: J) -> str:
    obs = run_of(raw, "observers")
    assert obs is not None
    sizes = obs["scan"]["sizes"]
    first, last = sizes[0], sizes[-1]
    if last["rows"] <= first["rows"]:
        return ""
    k_notify = loglog_slope(
        first["rows"], first["notify_scan_s"], last["rows"], last["notify_scan_s"]
    )
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
        text = (
            "### Notification scan vs table size\n\nThe P6 measurement (table in the P6 "
            "details above).  " + _scan_slopes(raw) + "\n"
        )
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
        rows.append(
            [
                r["workers"],
                r["threads"],
                r["workers"] * r["threads"],
                f"{fmt_rate(backlog.median)} ({fmt_rate(backlog.low)}-{fmt_rate(backlog.high)})",
                fmt_rate(step["achieved"]),
                fmt_ms(step["p50_s"] * 1000),
                fmt_ms(step["p99_s"] * 1000),
                "yes" if step["kept_up"] else "no",
            ]
        )
    rate = runs[0]["fixed_rate"]
    text = (
        "### Observer throughput vs worker threads and processes\n\n"
        "Backlog throughput: runs/s of the worker(s) working off a backlog of "
        f"{runs[0]['flood']} notifications (median of {len(runs[0]['backlog_runs'])}).  "
        f"Latency: commit-to-observer-commit of paced single-row writes at one fixed rate for "
        f"every setting, {fmt_rate(rate)} writes/s (half the backlog throughput of the first "
        "setting), one step each.\n\n"
        + md_table(
            [
                "processes",
                "threads each",
                "threads total",
                "backlog runs/s",
                "writes/s at fixed rate",
                "p50 ms",
                "p99 ms",
                "kept up",
            ],
            rows,
        )
        + "\n"
    )
    for workers in sorted({int(r["workers"]) for r in runs}):
        pts = [
            (float(r["threads"]), statistics.median(r["backlog_runs"]))
            for r in runs
            if int(r["workers"]) == workers
        ]
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
        rows.append(
            [
                f"{threads:g}",
                fmt_rate(txn1),
                fmt_rate(put),
                f"{txn1 / put:.2f}x",
                fmt_ms(statistics.median(float(x["txn_1cell"]["p50_ms"]) for x in t)),
                fmt_ms(statistics.median(float(x["txn_1cell"]["p99_ms"]) for x in t)),
                fmt_rate(read),
                fmt_rate(get),
                f"{read / get:.2f}x",
            ]
        )
    text = (
        "### Transactions vs client threads\n\n"
        "txn_bench on HBase at each thread count (same operations, value size and oracle as "
        "P2-P4; medians over the repeats).\n\n"
        + md_table(
            [
                "threads",
                "1-cell txns/s",
                "raw puts/s",
                "txn / put",
                "txn p50 ms",
                "txn p99 ms",
                "txn reads/s",
                "raw gets/s",
                "read / get",
            ],
            rows,
        )
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
        rows.append(
            [
                _bytes(size),
                fmt_rate(txn1),
                fmt_rate(put),
                f"{txn1 / put:.2f}x",
                f"{txn1 * size / 1e6:.2f}",
                fmt_rate(cells10),
                fmt_ms(statistics.median(float(x["txn_1cell"]["p50_ms"]) for x in t)),
            ]
        )
    text = (
        "### Transactions vs value size\n\n"
        f"txn_bench on HBase with {series[0][1].get('threads')} threads at each value size.\n\n"
        + md_table(
            [
                "value size",
                "1-cell txns/s",
                "raw puts/s",
                "txn / put",
                "txn payload MB/s",
                "10-cell txn cells/s",
                "txn p50 ms",
            ],
            rows,
        )
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
        f"the saturation point is {fmt_rate(obs['latency']['saturation_writes_per_s'])} writes/s.\n"
    )
    if "load" in plots:
        text += f"\n![latency vs load]({plots['load']})\n"
    return text


def _scaling_oracle(raw: J, plots: dict[str, str]) -> str:
    oracle = run_of(raw, "oracle")
    if oracle is None:
        return ""
    pts_r = [
        (float(w), oracle_ratio(c, "ranged").median * float(c["per-rpc"]["rate"]["median"]))
        for w, c in oracle["waiters"].items()
        if "ranged" in c
    ]
    pts_b = [
        (float(w), float(c["batched"]["rate"]["median"])) for w, c in oracle["waiters"].items()
    ]
    pts_p = [
        (float(w), float(c["per-rpc"]["rate"]["median"])) for w, c in oracle["waiters"].items()
    ]
    text = (
        "### Oracle throughput vs concurrent waiters\n\n"
        f"Batched: {steps_text(pts_b, 'gain per step of waiters')}.  One timestamp per RPC: "
        f"{steps_text(pts_p, 'gain per step')}.  Knee of the batched curve at "
        f"{knee(pts_b)[0]:g} waiters."
        + (f"  Ranged allocation: {steps_text(pts_r, 'gain per step')}." if len(pts_r) > 1 else "")
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
        target = BY_ID[t.tid]
        profile = profiles.get(target.profile)
        parts.append(f"### {t.tid} {t.what}: {t.figure} against {t.goal}\n")
        if not isinstance(profile, dict) or profile.get("error"):
            why = profile.get("error") if isinstance(profile, dict) else "not profiled"
            parts.append(f"No profile: {why}.\n")
            continue
        ops = profile.get("ops", {})
        focus = [ops[name] | {"name": name} for name in target.focus if name in ops]
        try:
            parts.append(explain(focus, raw.get("machine", {}).get("cores")) + "\n")
        except (KeyError, TypeError, ValueError, ZeroDivisionError, IndexError) as exc:
            parts.append(f"(cannot derive the explanation: {type(exc).__name__}: {exc})\n")
        parts.append(_profile_tables(profile, target.focus))
    return "\n".join(parts)


#: keys of a profiled operation that every explanation states in its own words
_COST_KEYS = {
    "unit",
    "count",
    "ms_per_op",
    "round_trips_per_op",
    "timestamps_per_op",
    "oracle_ms_per_op",
    "top",
    "profiled_ops",
    "profile_clock",
    "name",
}


def explain(ops: Sequence[J], cores: object = None) -> str:
    """Why an operation costs what it costs, from its profile: for each operation its round
    trips, timestamps, oracle wait and time; with two (the engine's and the baseline it is
    compared with) how many times the round trips and the time; the functions that take
    the largest share of the time; and any other figure the profile measured."""
    sentences = [_cost(op) for op in ops]
    if len(ops) == 2:
        sentences.append(_compare(ops[0], ops[1]))
    if ops:
        sentences.append(_hot_functions(ops[0]))
        extra = _extra_figures(ops[0])
        if extra:
            sentences.append(extra)
        cpu = ops[0].get("process_cpu_us_per_op")
        if cpu:
            busy = float(cpu) * 1000 / float(ops[0]["ms_per_op"]) / 1e6
            sentences.append(
                f"Those {float(cpu):.0f} us of CPU per operation keep {busy:.2f} CPU(s) busy, "
                f"on a {cores or '?'}-core machine that also runs the servers."
            )
    return "  ".join(s for s in sentences if s)


def _cost(op: J) -> str:
    text = (
        f"`{op['name']}` ({op.get('unit', 'one operation')}) made {_rt(op)} store round "
        f"trip(s) and drew {float(op.get('timestamps_per_op', 0)):.2f} timestamps in "
        f"{float(op['ms_per_op']):.3f} ms single-threaded"
    )
    oracle_ms = float(op.get("oracle_ms_per_op", 0))
    if oracle_ms:
        text += (
            f", {oracle_ms:.3f} ms of it ({oracle_ms / float(op['ms_per_op']):.0%}) waiting "
            "for the oracle"
        )
    return text + "."


def _compare(op: J, base: J) -> str:
    trips, base_trips = _total_rt(op), _total_rt(base)
    ratio = f"{trips / base_trips:.1f}x the round trips and " if base_trips else ""
    return (
        f"`{op['name']}` costs {ratio}{float(op['ms_per_op']) / float(base['ms_per_op']):.2f}x "
        f"the time of `{base['name']}`."
    )


def _hot_functions(op: J, n: int = 3) -> str:
    top = op.get("top") or []
    own = sum(float(f["own_ms_per_op"]) for f in top)
    if not own:
        return ""
    named = ", ".join(f"`{f['function']}` {float(f['own_ms_per_op']) / own:.0%}" for f in top[:n])
    return f"Of the own time of its {len(top)} costliest functions, the first take {named}."


def _extra_figures(op: J) -> str:
    figures = [
        f"{key.replace('_', ' ')} {value:,.3g}"
        for key, value in sorted(op.items())
        if key not in _COST_KEYS
        and isinstance(value, int | float)
        and not isinstance(value, bool)
        and key != "process_cpu_us_per_op"
    ]
    return "Also measured: " + "; ".join(figures) + "." if figures else ""


def _breakdown(op: J) -> str:
    """``compare_and_set 2.00, put 2.00``: round trips per operation by store call."""
    per = op["round_trips_per_op"]
    return ", ".join(f"{k} {v:.2f}" for k, v in sorted(per.items(), key=lambda kv: -kv[1]))


def _rt(op: J) -> str:
    detail = _breakdown(op)
    return f"{_total_rt(op):.2f}" + (f" ({detail})" if detail else "")


def _total_rt(op: J) -> float:
    return float(sum(op["round_trips_per_op"].values()))


def _profile_tables(profile: J, focus: Sequence[str]) -> str:
    ops = profile.get("ops", {})
    names = [n for n in (focus or list(ops)) if n in ops]
    rows = [
        [
            name,
            ops[name].get("unit", "operation"),
            f"{ops[name]['ms_per_op']:.3f}",
            _rt(ops[name]),
            f"{ops[name].get('timestamps_per_op', 0):.2f}",
            f"{ops[name].get('oracle_ms_per_op', 0):.3f}",
        ]
        for name in names
    ]
    text = (
        md_table(
            [
                "operation",
                "one operation is",
                "ms per op",
                "store round trips per op",
                "timestamps per op",
                "oracle wait ms per op",
            ],
            rows,
        )
        + "\n"
    )
    for name in names:
        top = ops[name].get("top") or []
        if not top:
            continue
        clock = ops[name].get("profile_clock", "wall")
        trows = [
            [
                f"`{f['function']}`",
                f"{f['calls_per_op']:.2f}",
                f"{f['own_ms_per_op']:.3f}",
                f"{f['cum_ms_per_op']:.3f}",
            ]
            for f in top
        ]
        text += (
            f"\nTop functions of `{name}` by own time ({clock} clock, per operation, "
            f"{ops[name].get('profiled_ops', '?')} operations profiled):\n\n"
            + md_table(["function", "calls", "own ms", "cumulative ms"], trows)
            + "\n"
        )
    return text


# ------------------------------------------------------------------ baselines and log


def _baselines_section(raw: J) -> str:
    store = run_of(raw, "store")
    if store is None:
        return ""
    rows = []
    # store_bench's order; the JSON read back has its keys sorted, the run's own dict not.
    known = ["get", "put", "batch_put", "cas"]
    for url, ops in store["stores"].items():
        label = "embedded" if url.startswith("embedded") else "HBase"
        order = [op for op in known if op in ops] + sorted(op for op in ops if op not in known)
        for op in order:
            s = ops[op]
            rate = Fig.from_spread(s["rate"])
            rows.append(
                [
                    label,
                    op,
                    fmt_rate(rate.median),
                    f"{fmt_rate(rate.low)}-{fmt_rate(rate.high)}",
                    fmt_rate(s["item_rate"]["median"]) if s["items_per_op"] > 1 else "",
                    fmt_ms(s["p50_ms"]),
                    fmt_ms(s["p99_ms"]),
                ]
            )
    return (
        "## Raw store baselines\n\n"
        f"store_bench: {store['ops']} calls per operation, {store['threads']} thread(s), "
        f"{store['value_size']}-byte values, batches of {store['batch_cells']} cells.\n\n"
        + md_table(["store", "operation", "calls/s", "range", "cells/s", "p50 ms", "p99 ms"], rows)
        + "\n"
    )


def _run_log_section(raw: J) -> str:
    rows = []
    cores = raw.get("machine", {}).get("cores") or 0
    loaded = [
        s["name"]
        for s in raw.get("steps", [])
        if cores and max(s.get("load_before", 0), s.get("load_after", 0)) > cores
    ]
    for s in raw.get("steps", []):
        rows.append(
            [
                s["name"],
                f"{s['seconds']:.0f}",
                f"{s.get('load_before', 0):.2f}",
                f"{s.get('load_after', 0):.2f}",
                s["status"] + (f": {s['error']}" if s.get("error") else ""),
            ]
        )
    return (
        "## Run log\n\n"
        "Every step ran as its own process; the commands and their output are in the run's "
        f"work directory (`{raw.get('meta', {}).get('workdir', '?')}`).  Load is the 1-minute "
        "load average.  `warmup` and `warmup_txn` are untimed store and transaction traffic "
        "that warms the servers before the first measurement.\n\n"
        + md_table(["step", "seconds", "load before", "load after", "status"], rows)
        + "\n"
        + (
            f"\nSteps that started or ended with a load average above the {cores} cores (other "
            f"work competing for the CPU): {', '.join(loaded)}.\n"
            if loaded
            else ""
        )
    )


# --------------------------------------------------------------------------- plots


def make_plots(
    raw: J, targets: Sequence[TargetResult], plot_dir: Path, rel_to: Path
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
        lows = [
            float(t.score_low if t.score_low is not None else v)
            for t, v in zip(scored, values, strict=True)
        ]
        highs = [
            float(t.score_high if t.score_high is not None else v)
            for t, v in zip(scored, values, strict=True)
        ]
        colors = ["tab:green" if t.verdict == PASS else "tab:red" for t in scored]
        ys = list(range(len(scored)))[::-1]
        ax.barh(ys, values, color=colors, alpha=0.8)
        ax.errorbar(
            values,
            ys,
            xerr=[
                [max(v - lo, 0) for v, lo in zip(values, lows, strict=True)],
                [max(hi - v, 0) for v, hi in zip(values, highs, strict=True)],
            ],
            fmt="none",
            ecolor="black",
            capsize=3,
        )
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
            mine = sorted(
                (r for r in runs if int(r["workers"]) == workers), key=lambda r: int(r["threads"])
            )
            totals = [int(r["threads"]) * workers for r in mine]
            med = [statistics.median(r["backlog_runs"]) for r in mine]
            lo = [m - min(r["backlog_runs"]) for m, r in zip(med, mine, strict=True)]
            hi = [max(r["backlog_runs"]) - m for m, r in zip(med, mine, strict=True)]
            a1.errorbar(
                totals,
                med,
                yerr=[lo, hi],
                marker="o",
                capsize=3,
                color=color,
                label=f"{workers} process(es)",
            )
            a2.plot(
                totals,
                [r["step"]["p50_s"] * 1000 for r in mine],
                marker="o",
                color=color,
                label=f"p50, {workers} process(es)",
            )
            a2.plot(
                totals,
                [r["step"]["p99_s"] * 1000 for r in mine],
                marker="x",
                color=color,
                linestyle="--",
                label=f"p99, {workers} process(es)",
            )
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
        for op, label in (
            ("txn_1cell", "1-cell txn/s"),
            ("raw_put", "raw put/s"),
            ("txn_read", "txn read/s"),
            ("raw_get", "raw get/s"),
        ):
            a1.plot(
                xs, [_rate_median(r["timings"], op) for _, r in series], marker="o", label=label
            )
        a1.set_xscale("log", base=2)
        ticks(a1, xs)
        a1.set_yscale("log")
        a1.set_xlabel("client threads")
        a1.set_ylabel("operations/s")
        a1.legend(fontsize=8)
        a1.set_title("Transactions vs threads (HBase)")
        a2.plot(
            xs,
            [
                _rate_median(r["timings"], "txn_1cell") / _rate_median(r["timings"], "raw_put")
                for _, r in series
            ],
            marker="o",
            label="1-cell txn / put (P3)",
        )
        a2.plot(
            xs,
            [
                _rate_median(r["timings"], "txn_read") / _rate_median(r["timings"], "raw_get")
                for _, r in series
            ],
            marker="o",
            label="read / get (P2)",
        )
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
            ax.plot(
                xs, [_rate_median(r["timings"], op) for _, r in series], marker="o", label=label
            )
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
        ax.plot(
            rows,
            [s["notify_scan_s"] * 1000 for s in sizes],
            marker="o",
            label="notify pass (HBase)",
        )
        ax.plot(
            rows,
            [s["lock_scan_s"] * 1000 for s in sizes],
            marker="x",
            linestyle="--",
            label="lock-family scan (HBase)",
        )
        emb = run_of(raw, "scan_embedded")
        if emb is not None and emb.get("scan"):
            es = emb["scan"]["sizes"]
            ax.plot(
                [s["rows"] for s in es],
                [s["notify_scan_s"] * 1000 for s in es],
                marker="o",
                label="notify pass (embedded)",
            )
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
        ax.axvline(
            obs["latency"]["saturation_writes_per_s"],
            color="black",
            linestyle="--",
            linewidth=1,
            label="saturation point",
        )
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
        ax.plot(
            counts,
            [c["batched"]["rate"]["median"] for _, c in items],
            marker="o",
            label="batched (coalescing client)",
        )
        ax.plot(
            counts,
            [c["per-rpc"]["rate"]["median"] for _, c in items],
            marker="x",
            label="one timestamp per RPC",
        )
        with_range = [(int(w), c) for w, c in items if "ranged" in c]
        if with_range:
            ax.plot(
                [w for w, _ in with_range],
                [
                    oracle_ratio(c, "ranged").median * c["per-rpc"]["rate"]["median"]
                    for _, c in with_range
                ],
                marker="s",
                label=f"ranged, {with_range[0][1]['ranged']['range']} per RPC",
            )
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


#: Everything from this line on in an existing report is kept when the report is rewritten:
#: sections measured by other scripts (bench/cost_bench.py) and written by hand.
KEPT_MARKER = "<!-- kept: the sections below are not generated; bench/report.py keeps them -->"


def kept_sections(out: Path) -> str:
    """The hand-kept tail of an existing report (from :data:`KEPT_MARKER`), or ''."""
    try:
        text = out.read_text(encoding="utf-8")
    except FileNotFoundError:
        return ""
    at = text.find(KEPT_MARKER)
    return "" if at < 0 else "\n" + text[at:]


def write_report(raw: J, out: Path, plot_dir: Path) -> list[TargetResult]:
    """Evaluate, plot and write ``out`` (keeping its hand-kept tail); returns the verdicts."""
    targets = evaluate(raw)
    plots = make_plots(raw, targets, plot_dir, out.resolve().parent)
    kept = kept_sections(out)
    out.write_text(render(raw, targets, plots) + kept, encoding="utf-8")
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

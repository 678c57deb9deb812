"""What a change costs: the trivial observer against the raw store (P10), single-cell
transactions with each timestamp mode, and the break-even change fraction (P7b), side by side
in one run on one store.

``p10``      A backlog of ``--backlog`` notifications of the trivial strong observer (one read,
             one write: :class:`bench.workloads.LatencyObserver`) worked off by the production
             :class:`~percolator.observers.worker.Worker` with ``--threads`` threads, from its
             start to an empty backlog, against the raw store doing the same get + put pairs
             with the same threads.  Then single-cell transactions with the same threads.  Each
             engine measurement runs once per in-process timestamp mode (``exact``: one
             compare-and-set per batch; ``block``: leased blocks validated by one read, the
             default) so a lever's effect is measured in the same run as its baseline.
``promise``  The example pipeline at ``--docs`` documents: the cost per changed document
             processed incrementally (a steady-state worker working off a backlog of
             ``--fraction`` changes) against the cost per document of the full Spark recompute
             (export at one snapshot, recompute, write Parquet), both on the same store
             (:func:`bench.spark_bench.measure_incremental`, which also checks both results are
             identical), and the break-even change fraction::

                 break_even = recompute_s / (incremental_s_per_change * docs)

Everything is repeated ``--repeats`` times; medians are printed with the machine's load
average at the start and end (these machines are shared).

    python bench/cost_bench.py p10 --store embedded:/tmp/x --threads 4
    python bench/cost_bench.py p10 --store 'hbase://127.0.0.1:9090?prefix=cost_' --threads 4
    python bench/cost_bench.py promise --docs 10000 --fraction 0.01
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``bench`` and the packages importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from percolator.observers.options import DEFAULT_BATCH_SIZE, WorkerOptions
from percolator.observers.parking import pending
from percolator.observers.worker import Worker

import percolator
from bench import workloads as w
from bench._common import (
    CpuMeter,
    Timing,
    add_cpu_of_argument,
    median_per_key,
    run_timed,
    watch_cpu_of,
)
from percolator.store import Store, open_store
from percolator.store.base import Put
from percolator.timestamps.local import DEFAULT_BLOCK_MS, LocalOracle

MODES = {"exact": 0, "block": DEFAULT_BLOCK_MS}
PIPELINE_TABLES = ("documents", "doc_clusters", "doc_index", "doc_inlinks", "backfill_progress")


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"{one:.2f} (1 min) {five:.2f} (5 min) on {os.cpu_count()} cores"


def _client(store: Store, block_ms: int) -> percolator.Client:
    return percolator.connect(store, oracle=LocalOracle(store, block_ms=block_ms))


def raw_pairs(store: Store, table: str, threads: int, count: int) -> Timing:
    """``count`` get + put pairs on ``table`` with ``threads`` threads, timed."""
    value = b"x" * 16

    def pair(i: int) -> None:
        row = w.raw_row(i)
        store.read_row(table, row, columns=[("d", b"q")])
        store.put(table, [Put(row, "d", b"q", i + 1, value)])

    return run_timed(pair, count, threads=threads)


def _lock_stats(store: Store) -> dict[str, float]:
    stats = getattr(store, "write_lock", None)  # the embedded store's write mutex
    return stats.snapshot() if stats is not None else {}


def observer_runs(
    store: Store, block_ms: int, threads: int, backlog: int, tag: str, batch_size: int = 1
) -> tuple[float, dict[str, float], dict[str, float]]:
    """Runs/s of the worker working off ``backlog`` fresh notifications; per run, the store
    calls, the CPU milliseconds (``cpu_ms``: this process; ``cpu_ms_<name>``: see
    :meth:`bench._common.CpuUse.per_item_ms`) and (embedded) the milliseconds writers queued
    for and held the write mutex; and the CPU per run as ``CpuUse.per_item_ms`` gives it."""
    client = _client(store, block_ms)
    try:
        observer = w.latency_observer(client)
        rows = w.write_events(client, tag, backlog)
        before = dict(store.stats.calls)
        locks = _lock_stats(store)
        meter = CpuMeter()
        # The worker's commits are counted through its hook, so the benchmark sends no
        # store traffic of its own while the worker works: polling for what is pending is a
        # notification scan, on HBase a cost for the region server that the worker would
        # be charged for.  Once every change has committed, what is pending is checked.
        committed = itertools.count(1)
        all_committed = threading.Event()

        def count(*_: object) -> None:
            if next(committed) >= len(rows):
                all_committed.set()

        options = WorkerOptions(
            threads=threads,
            idle_sleep_s=0.005,
            housekeeping_s=3600,
            batch_size=batch_size,
            on_commit=count,
        )
        worker = Worker(client, [observer], options)
        started = time.perf_counter()
        worker.start()
        try:
            deadline = time.monotonic() + 600
            if not all_committed.wait(600):
                raise RuntimeError("the backlog was not worked off within 600 s")
            while pending(client, w.EVENTS, limit=1):  # the last batches' clean-ups
                if time.monotonic() > deadline:
                    raise RuntimeError("the backlog was not cleaned up within 600 s")
                time.sleep(0.005)
            elapsed = time.perf_counter() - started
            cpu = meter.stop().per_item_ms(len(rows))
            locks_after = _lock_stats(store)
        finally:
            worker.stop()
        after = store.stats.calls
        calls = {
            op: (n - before.get(op, 0)) / len(rows)
            for op, n in after.items()
            if n != before.get(op, 0)
        }
        keys = {"client": "cpu_ms", "busy": "machine_busy"}
        calls.update({keys.get(name, f"cpu_ms_{name}"): value for name, value in cpu.items()})
        for key in ("wait_s", "held_s", "group_wait_s"):
            if key in locks:
                calls[f"lock_{key[:-2]}_ms"] = (locks_after[key] - locks[key]) * 1000 / len(rows)
        return len(rows) / elapsed, calls, cpu
    finally:
        client.close()


def txn_rate(store: Store, block_ms: int, threads: int, count: int) -> float:
    client = _client(store, block_ms)
    try:
        with w.txn_table(client, f"cost_txn{block_ms}") as table:
            op = w.txn_write_op(client, table, b"v" * 64)
            run_timed(op, 20, threads=threads)  # warm up: connections, the first block
            return run_timed(op, count, threads=threads).rate
    finally:
        client.close()


def run_p10(args: argparse.Namespace) -> dict[str, Any]:
    store = open_store(args.store)
    started_load = load()
    results: dict[str, list[float]] = {}
    calls_seen: dict[str, dict[str, float]] = {}
    # CPU per item of the two measurements P10 compares, per repeat (CpuUse.per_item_ms)
    cpu_runs: dict[str, list[dict[str, float]]] = {}
    # The production worker's own setting is always measured: it is the figure P10 judges.
    batch_sizes = sorted({*args.batch_sizes, DEFAULT_BATCH_SIZE})

    def note(key: str, value: float) -> None:
        results.setdefault(key, []).append(value)

    try:
        with w.raw_table(store, "cost_raw") as raw:
            w.raw_load(store, raw, args.pairs, b"x" * 16)
            for repeat in range(args.repeats):
                pairs = raw_pairs(store, raw, args.threads, args.pairs)
                note("raw_pairs", pairs.rate)
                if pairs.cpu is not None:
                    cpu_runs.setdefault("raw_pairs", []).append(pairs.cpu_per_item())
                for mode, block_ms in MODES.items():
                    rate, calls, cpu = observer_runs(
                        store, block_ms, args.threads, args.backlog, f"r{repeat}{mode}"
                    )
                    note(f"observer_{mode}", rate)
                    calls_seen[mode] = calls
                    note(f"txn1_{mode}", txn_rate(store, block_ms, args.threads, args.txns))
                for batch_size in batch_sizes:
                    rate, calls, cpu = observer_runs(
                        store,
                        DEFAULT_BLOCK_MS,
                        args.threads,
                        args.backlog,
                        f"r{repeat}b{batch_size}",
                        batch_size,
                    )
                    note(f"observer_block_batch{batch_size}", rate)
                    calls_seen[f"block_batch{batch_size}"] = calls
                    if batch_size == DEFAULT_BATCH_SIZE:
                        cpu_runs.setdefault("observer", []).append(cpu)
                note("raw_put", _raw_put_rate(store, raw, args.threads, args.pairs))
                default_interval = sys.getswitchinterval()
                for interval in args.switch_intervals:
                    # How long a thread waits for the GIL before forcing a hand-off: a writer
                    # holding the store's write mutex waits this long for the GIL after each
                    # statement while other threads run Python.
                    sys.setswitchinterval(interval)
                    try:
                        rate, calls, cpu = observer_runs(
                            store,
                            DEFAULT_BLOCK_MS,
                            args.threads,
                            args.backlog,
                            f"r{repeat}s{interval}",
                        )
                    finally:
                        sys.setswitchinterval(default_interval)
                    note(f"observer_block_switch{interval * 1000:g}ms", rate)
                    calls_seen[f"block_switch{interval * 1000:g}ms"] = calls
                print(
                    f"repeat {repeat + 1}: "
                    + ", ".join(f"{k} {v[-1]:.0f}/s" for k, v in results.items()),
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        store.close()
    med = {k: statistics.median(v) for k, v in results.items()}
    out: dict[str, Any] = {
        "store": args.store.split("?")[0],
        "threads": args.threads,
        "backlog": args.backlog,
        "repeats": args.repeats,
        "load_start": started_load,
        "load_end": load(),
        "median_per_s": med,
        "runs_per_s": results,
        "store_calls_per_run": calls_seen,
        "p10": {m: med[f"observer_{m}"] / med["raw_pairs"] for m in MODES},
        "p10_batch": {n: med[f"observer_block_batch{n}"] / med["raw_pairs"] for n in batch_sizes},
        # P10 as the worker runs by default (leased timestamp blocks, batches of
        # ``default_batch_size``): per repeat, runs/s over the raw pairs/s of that repeat.
        "default_batch_size": DEFAULT_BATCH_SIZE,
        "p10_default_runs": [
            runs / pairs
            for runs, pairs in zip(
                results[f"observer_block_batch{DEFAULT_BATCH_SIZE}"],
                results["raw_pairs"],
                strict=True,
            )
        ],
        "p3": {m: med[f"txn1_{m}"] / med["raw_put"] for m in MODES},
        # where the CPU went, per raw pair and per run of the worker with its defaults
        "cpu_runs": cpu_runs,
    }
    print(f"load: start {out['load_start']}, end {out['load_end']}")
    print(f"raw get+put pairs/s ({args.threads} threads): {med['raw_pairs']:.0f}")
    print(f"raw puts/s: {med['raw_put']:.0f}")
    for interval in args.switch_intervals:
        key = f"switch{interval * 1000:g}ms"
        print(
            f"[block, GIL switch interval {interval * 1000:g} ms] trivial observer "
            f"{med[f'observer_block_{key}']:.1f} runs/s = "
            f"{med[f'observer_block_{key}'] / med['raw_pairs']:.3f}x raw pairs; per run "
            + ", ".join(f"{k} {v:.2f}" for k, v in sorted(calls_seen[f"block_{key}"].items()))
        )
    for batch_size in batch_sizes:
        key = f"block_batch{batch_size}"
        print(
            f"[block, batches of up to {batch_size}] trivial observer "
            f"{med[f'observer_{key}']:.1f} runs/s = "
            f"{med[f'observer_{key}'] / med['raw_pairs']:.3f}x raw pairs (P10); per run "
            + ", ".join(f"{k} {v:.2f}" for k, v in sorted(calls_seen[key].items()))
        )
    for key, runs in cpu_runs.items():
        print(f"[CPU per {'raw pair' if key == 'raw_pairs' else 'run'}, {key}] " + _cpu_text(runs))
    for mode in MODES:
        print(
            f"[{mode:5}] trivial observer {med[f'observer_{mode}']:.1f} runs/s = "
            f"{out['p10'][mode]:.3f}x raw pairs (P10); 1-cell txn {med[f'txn1_{mode}']:.0f}/s "
            f"= {out['p3'][mode]:.3f}x raw puts (P3); store calls per run "
            + ", ".join(f"{k} {v:.2f}" for k, v in sorted(calls_seen[mode].items()))
        )
    return out


def _cpu_text(runs: list[dict[str, float]]) -> str:
    """Medians over repeats of CpuUse.per_item_ms dicts, as text."""
    return ", ".join(
        f"{k} {v:.0%}" if k == "busy" else f"{k} {v:.2f} ms"
        for k, v in median_per_key(runs).items()
    )


def _raw_put_rate(store: Store, table: str, threads: int, count: int) -> float:
    return run_timed(w.raw_put_op(store, table, b"v" * 64), count, threads=threads).rate


def run_ceiling(args: argparse.Namespace) -> dict[str, Any]:
    """The store's primitives with 1..N threads: gets, puts and compare-and-sets per second
    (fresh rows, never contended; where the store has conditional puts, also a
    compare-and-set carrying a put, as a prewrite's lock carries its data), and, given a
    ``p10`` run's JSON, the observer rate they bound: a run of the worker with its defaults
    costs ``calls`` of each (measured there), so at best ``1 / sum(calls[op] / rate[op])``
    runs/s if the store were the only cost."""
    store = open_store(args.store)
    started_load = load()
    rates: dict[str, dict[str, list[float]]] = {}
    # CPU per operation (CpuUse.per_item_ms), per thread count and operation, per repeat
    cpu: dict[str, dict[str, list[dict[str, float]]]] = {}
    offsets = itertools.count()
    try:
        with w.raw_table(store, "cost_ceiling") as raw:
            w.raw_load(store, raw, args.count, b"x" * 16)
            cas_op = w.raw_cas_op(store, raw, b"v" * 64)
            cas_put_op = w.raw_cas_put_op(store, raw, b"v" * 64)
            for _ in range(args.repeats):
                for threads in args.threads:
                    per = rates.setdefault(str(threads), {})
                    offset = next(offsets) * args.count  # fresh rows: never contended

                    def cas(i: int, offset: int = offset) -> None:
                        cas_op(offset + i)

                    def cas_put(i: int, offset: int = offset) -> None:
                        cas_put_op(offset + i)

                    ops = [
                        ("get", w.raw_get_op(store, raw, args.count)),
                        ("put", w.raw_put_op(store, raw, b"v" * 64)),
                        ("compare_and_set", cas),
                    ]
                    if store.conditional_puts:
                        ops.append(("compare_and_set_put", cas_put))
                    for name, op in ops:
                        timing = run_timed(op, args.count, threads=threads)
                        per.setdefault(name, []).append(timing.rate)
                        cpu.setdefault(str(threads), {}).setdefault(name, []).append(
                            timing.cpu_per_item()
                        )
    finally:
        store.close()
    med = {t: {op: statistics.median(v) for op, v in per.items()} for t, per in rates.items()}
    print(f"load: start {started_load}, end {load()}")
    out: dict[str, Any] = {
        "store": args.store.split("?")[0],
        "load_start": started_load,
        "load_end": load(),
        "median_per_s": med,
        "runs": rates,
        "cpu_runs": cpu,
    }
    for t, per_op in cpu.items():
        for op_name, runs in per_op.items():
            print(f"[CPU per {op_name}, {t} threads] {_cpu_text(runs)}")
    calls = _observer_calls(args.p10_json) if args.p10_json else None
    bound: dict[str, float] = {}
    for t, r in med.items():
        line = f"{t} threads: " + ", ".join(f"{op} {rate:.0f}/s" for op, rate in r.items())
        if calls is not None:
            cas_rate = r.get("compare_and_set_put", r["compare_and_set"])
            per_run_s = (
                calls["get"] / r["get"]
                + calls["put"] / r["put"]
                + calls["compare_and_set"] / cas_rate
            )
            bound[t] = 1 / per_run_s
            line += f"; bound on the worker's runs/s from the store alone: {bound[t]:.0f}"
        print(line)
    if calls is not None:
        out["observer_calls"] = calls
        out["observer_bound_per_s"] = bound
    return out


def _observer_calls(path: str) -> dict[str, float]:
    """Store calls per run of the worker with its default batches, from a ``p10`` JSON:
    reads, blind writes (puts and deletes) and compare-and-sets."""
    run = json.loads(Path(path).read_text())
    per_run = run["store_calls_per_run"][f"block_batch{run['default_batch_size']}"]
    return {
        "get": per_run.get("read_rows", 0.0),
        "put": per_run.get("put", 0.0) + per_run.get("delete_versions", 0.0),
        "compare_and_set": per_run.get("compare_and_set", 0.0),
    }


def run_promise(args: argparse.Namespace) -> dict[str, Any]:
    from percolator.spark_jobs.session import build_session

    from bench.spark_bench import ROOT, measure_incremental

    # Executors import the benchmark's functions by name: make the repository importable.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p
    )
    started_load = load()
    with tempfile.TemporaryDirectory(prefix="cost-bench-") as workdir:
        store_url = args.store or f"embedded:{workdir}/store"
        spark = build_session(args.master, app_name="percolator-cost-bench")
        try:
            result = measure_incremental(
                spark,
                store_url,
                workdir,
                docs=args.docs,
                fraction=args.fraction,
                threads=args.threads,
                seed=args.seed,
                rounds=args.rounds,
                batch_size=args.batch,
                initial_timeout_s=args.initial_timeout,
            )
        finally:
            spark.stop()
            if args.store:  # a shared store keeps nothing of ours
                with open_store(args.store) as store:
                    for table in PIPELINE_TABLES:
                        if store.table_exists(table):
                            store.drop_table(table)
    changes = result["changes_per_round"]
    per_change = {r: t / max(changes, 1) for r, t in result["incremental_s"].items()}
    per_doc = result["recompute_s"] / args.docs
    break_even = {r: result["recompute_s"] / (t * args.docs) for r, t in per_change.items()}
    result.update(
        {
            "store": (args.store or "embedded:").split("?")[0],
            "batch": args.batch,
            "load_start": started_load,
            "load_end": load(),
            "incremental_s_per_change": per_change,
            "recompute_s_per_doc": per_doc,
            "cost_ratio_per_doc": {r: t / per_doc for r, t in per_change.items()},
            "break_even_fraction": break_even,
        }
    )
    print(f"load: start {started_load}, end {result['load_end']}")
    print(
        f"{args.docs} documents, {changes:.0f} changed per round; full recompute "
        f"{result['recompute_s']:.2f} s = {per_doc * 1000:.2f} ms per document"
    )
    for runner, t in per_change.items():
        print(
            f"[{runner}] incremental {result['incremental_s'][runner]:.2f} s = "
            f"{t * 1000:.1f} ms per changed document ({t / per_doc:.1f}x a recomputed "
            f"document); speed-up {result['ratio'][runner]:.1f}x; break-even change "
            f"fraction {break_even[runner] * 100:.2f}%"
        )
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    p10 = sub.add_parser("p10", help="trivial observer and 1-cell txns against the raw store")
    p10.add_argument("--store", required=True, help="store URL (use a private ?prefix=)")
    p10.add_argument("--threads", type=int, default=4)
    p10.add_argument(
        "--backlog",
        type=int,
        default=2000,
        help="notifications per measurement (400 batched runs last ~0.15 s on embedded, "
        "mostly the worker's start and tail: use enough for a steady state)",
    )
    p10.add_argument("--pairs", type=int, default=2000, help="raw get+put pairs per measurement")
    p10.add_argument("--txns", type=int, default=400, help="1-cell transactions per measurement")
    p10.add_argument("--repeats", type=int, default=3)
    p10.add_argument(
        "--batch-sizes",
        type=lambda s: [int(x) for x in s.split(",") if x],
        default=[],
        help="also measure workers running up to N notifications per transaction (e.g. 4,16); "
        "the worker's default is always measured",
    )
    p10.add_argument(
        "--switch-intervals",
        type=lambda text: [float(x) for x in text.split(",") if x],
        default=[],
        metavar="S,S",
        help="also run the observer (block mode) with these sys.setswitchinterval values",
    )
    promise = sub.add_parser("promise", help="incremental vs full recompute, break-even")
    promise.add_argument("--store", help="store URL (default: embedded store in a temp dir)")
    promise.add_argument("--docs", type=int, default=10_000)
    promise.add_argument("--fraction", type=float, default=0.01)
    promise.add_argument(
        "--threads", type=int, default=None, help="worker threads (default: the worker's)"
    )
    promise.add_argument("--rounds", type=int, default=2)
    promise.add_argument("--seed", type=int, default=1)
    promise.add_argument("--master", default="local[2]")
    promise.add_argument(
        "--initial-timeout",
        type=float,
        default=3600,
        metavar="S",
        help="seconds the worker may take to process the loaded corpus before the rounds "
        "(default: %(default)s; 100,000 documents on HBase need more)",
    )
    promise.add_argument(
        "--batch",
        type=int,
        default=DEFAULT_BATCH_SIZE,
        help="the worker's notifications per transaction (default: the worker's, %(default)s)",
    )
    ceiling = sub.add_parser("ceiling", help="the store's get/put/compare-and-set rates")
    ceiling.add_argument("--store", required=True, help="store URL (use a private ?prefix=)")
    ceiling.add_argument(
        "--threads", type=lambda t: [int(x) for x in t.split(",")], default=[1, 4, 8]
    )
    ceiling.add_argument("--count", type=int, default=1000, help="operations per measurement")
    ceiling.add_argument("--repeats", type=int, default=3)
    ceiling.add_argument(
        "--p10-json", help="a p10 run's JSON: bound the worker's runs/s by its store calls"
    )
    for p in (p10, ceiling):
        add_cpu_of_argument(p)
    for p in (p10, promise, ceiling):
        p.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    if args.mode in ("p10", "ceiling"):
        watch_cpu_of(parser, args.cpu_of)
    modes = {"p10": run_p10, "promise": run_promise, "ceiling": run_ceiling}
    result = modes[args.mode](args)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

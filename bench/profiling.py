"""What one operation costs: store round trips, timestamps, time, and the functions that
spend it.  ``bench/run_all`` profiles the workload behind every missed target with this
module, in a separate process against the same store:

    python bench/run_all.py profile --kind {txn,oracle,observer,scan,incremental,backfill,lock} \
        --store URL [--oracle grpc://HOST:PORT] --json OUT ...

Every profile wraps a workload of :mod:`bench.workloads` (the same operations the
benchmarks time): :func:`measure_op` runs it single-threaded, first counted by a
:class:`~bench._common.Probe` (the store's own call counters, a
:class:`~bench._common.CountingOracle`, wall time), then under cProfile for the top
functions by own time.
"""

from __future__ import annotations

import argparse
import cProfile
import itertools
import json
import os
import pstats
import re
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench import workloads as w
from bench._common import Probe, counted_client, run_timed

J = dict[str, Any]
ROOT = Path(__file__).resolve().parent.parent


def _short_path(filename: str) -> str:
    if filename == "~":
        return ""
    if "site-packages/" in filename:
        return filename.split("site-packages/", 1)[1]
    root = str(ROOT) + os.sep
    if filename.startswith(root):
        return filename[len(root) :]
    match = re.search(r"/lib/python3[.\d]*/(.*)$", filename)
    return match.group(1) if match else filename


def top_functions(source: cProfile.Profile | pstats.Stats, per: float, n: int = 12) -> list[J]:
    """The ``n`` functions with the most own time, per operation."""
    stats = source if isinstance(source, pstats.Stats) else pstats.Stats(source)
    entries: dict[tuple[str, int, str], tuple[Any, ...]] = stats.stats  # type: ignore[attr-defined]
    ranked = sorted(entries.items(), key=lambda kv: -kv[1][2])[:n]
    out = []
    for (filename, line, name), (_cc, calls, own, cumulative, _callers) in ranked:
        where = _short_path(filename)
        out.append(
            {
                "function": f"{where}:{line}({name})" if where else name,
                "calls_per_op": calls / per,
                "own_ms_per_op": own * 1000 / per,
                "cum_ms_per_op": cumulative * 1000 / per,
            }
        )
    return out


def profiled(work: Callable[[], object]) -> cProfile.Profile:
    """``work()`` under cProfile (wall clock)."""
    profiler = cProfile.Profile()
    profiler.enable()
    try:
        work()
    finally:
        profiler.disable()
    return profiler


def measure_op(op: w.Op, *, count: int, probe: Probe, unit: str, warmup: int = 3) -> J:
    """Cost of ``op``: ``warmup`` untimed calls, ``count`` timed calls (no profiler), then
    ``count`` calls under cProfile for the top functions.  Single-threaded, so round trips
    and time per call are those of one operation.  ``op(i)`` gets a fresh ``i`` per call."""
    indexes = itertools.count()
    for _ in range(warmup):
        op(next(indexes))
    probe.start()
    for _ in range(count):
        op(next(indexes))
    result = probe.stop(count, unit)

    def again() -> None:
        for _ in range(count):
            op(next(indexes))

    profiler = profiled(again)
    return result | {
        "top": top_functions(profiler, count),
        "profiled_ops": count,
        "profile_clock": "wall",
    }


def measure_drain(
    probe: Probe, unit: str, prepare: Callable[[], int], drain: Callable[[], object]
) -> J:
    """Cost of processing work to quiescence: ``prepare()`` makes ``n`` units of work
    (untimed) and ``drain()`` processes them, once counted, once under cProfile."""
    changed = prepare()
    probe.start()
    drain()
    result = probe.stop(max(changed, 1), unit)
    changed = prepare()
    profiler = profiled(drain)
    return result | {
        "top": top_functions(profiler, max(changed, 1)),
        "profiled_ops": changed,
        "profile_clock": "wall",
    }


# --------------------------------------------------------------------------- the kinds


def profile_txn(args: argparse.Namespace) -> J:
    """Raw get and put against a transactional read, 1-cell and 10-cell transactions."""
    value = b"v" * args.value_size
    rows = 2 * args.ops + 10
    with counted_client(args.store, args.oracle) as (client, store, oracle):
        probe = Probe(store, oracle)
        with w.raw_table(store) as raw, w.txn_table(client) as table:
            w.raw_load(store, raw, rows, value)
            w.txn_load(client, table, rows, value)
            ops = {
                "raw_get": measure_op(
                    w.raw_get_op(store, raw, rows), count=args.ops, probe=probe, unit="one get"
                ),
                "raw_put": measure_op(
                    w.raw_put_op(store, raw, value), count=args.ops, probe=probe, unit="one put"
                ),
            }
            with w.txn_reads(client, table) as read:
                ops["txn_read"] = measure_op(
                    read, count=args.ops, probe=probe, unit="get in an open transaction"
                )
            ops["txn_1cell"] = measure_op(
                w.txn_write_op(client, table, value),
                count=args.ops,
                probe=probe,
                unit="1-cell transaction",
            )
            ops["txn_10cell"] = measure_op(
                w.txn_write_op(client, table, value, cells=10),
                count=max(5, args.ops // 5),
                probe=probe,
                unit="10-cell transaction",
            )
    return {"ops": ops, "value_size": args.value_size}


def profile_oracle(args: argparse.Namespace) -> J:
    """The coalescing client under ``--waiters`` threads: rate and RPCs per timestamp
    without a profiler, then CPU per timestamp by function (a thread-CPU-time profiler in
    every waiting thread, merged)."""
    waiters = args.waiters
    with w.oracle_ops(args.oracle) as oracle:
        stats, batched = oracle.client.stats, oracle.batched
        run_timed(batched, max(2 * waiters, 1000), threads=waiters)
        fetches, stamps = stats.fetches, stats.timestamps
        count = max(20 * waiters, 5000)
        cpu_started = time.process_time()
        timing = run_timed(batched, count, threads=waiters)
        # CPU of this whole process (waiters and gRPC threads), without a profiler running.
        process_cpu_s = time.process_time() - cpu_started
        rpcs_per_ts = (stats.fetches - fetches) / max(stats.timestamps - stamps, 1)
        profiles = [cProfile.Profile(time.thread_time) for _ in range(waiters)]
        barrier = threading.Barrier(waiters)

        def waiter(t: int) -> None:
            barrier.wait()
            profiles[t].enable()
            for i in range(t, count, waiters):
                batched(i)
            profiles[t].disable()

        pool = [threading.Thread(target=waiter, args=(t,)) for t in range(waiters)]
        for th in pool:
            th.start()
        for th in pool:
            th.join()
    merged = pstats.Stats(profiles[0])
    for p in profiles[1:]:
        merged.add(p)
    entries: dict[Any, tuple[Any, ...]] = merged.stats  # type: ignore[attr-defined]
    cpu_s = sum(v[2] for v in entries.values())
    return {
        "ops": {
            "batched": {
                "unit": "timestamp (coalescing client)",
                "count": count,
                "waiters": waiters,
                "ms_per_op": 1000 / timing.rate,
                "round_trips_per_op": {},
                "rpcs_per_timestamp": rpcs_per_ts,
                "timestamps_per_op": 1.0,
                "oracle_ms_per_op": 0.0,
                "cpu_us_per_op": cpu_s * 1e6 / count,
                "process_cpu_us_per_op": process_cpu_s * 1e6 / count,
                "top": top_functions(merged, count),
                "profiled_ops": count,
                "profile_clock": "thread CPU",
            }
        }
    }


def profile_observer(args: argparse.Namespace) -> J:
    """Observer runs of the benchmark's light observer, scan included, drained in one
    thread."""
    from percolator.observers.worker import run_until_quiet

    with counted_client(args.store, args.oracle) as (client, store, oracle):
        observer = w.latency_observer(client)
        rounds = itertools.count()
        w.write_events(client, "warm", 10)
        run_until_quiet(client, [observer])
        result = measure_drain(
            Probe(store, oracle),
            "observer run, scan included",
            lambda: len(w.write_events(client, f"round{next(rounds)}", args.ops)),
            lambda: run_until_quiet(client, [observer]),
        )
    return {"ops": {"observer_run": result}}


def profile_scan(args: argparse.Namespace) -> J:
    """One notification pass at the smallest and the largest table size."""
    from percolator.layout import NOTIFY

    ops: J = {}
    with counted_client(args.store, args.oracle) as (client, store, oracle):
        w.scan_setup(client, args.dirty)
        loaded = 0
        for label, size in (
            ("notify_pass_small", args.scan_base),
            ("notify_pass_large", args.scan_base * args.scan_growth),
        ):
            w.load_scan_rows(client, loaded, size)
            loaded = size
            result = measure_op(
                w.scan_pass_op(store, NOTIFY),
                count=max(3, args.repeats),
                probe=Probe(store, oracle),
                unit="notification pass",
                warmup=1,
            )
            ops[label] = result | {"rows": size, "dirty": args.dirty}
    return {"ops": ops}


def profile_incremental(args: argparse.Namespace) -> J:
    """Changed documents of the example pipeline processed to quiescence in one thread."""
    with counted_client(args.store, args.oracle) as (client, store, oracle):
        documents = w.ChangingCorpus(args.docs, seed=1)
        documents.setup(client)
        documents.write_all(client)
        documents.process(client)  # the initial processing, untimed
        seeds = itertools.count(2)
        runs: list[int] = []
        changes: list[int] = []

        def prepare() -> int:
            changes.append(documents.change(client, args.fraction, next(seeds)))
            return changes[-1]

        def drain() -> None:
            runs.append(documents.process(client).runs)

        result = measure_drain(
            Probe(store, oracle), "changed document, processed to quiescence", prepare, drain
        )
    result.update(
        {"changes": changes[0], "runs_per_op": runs[0] / max(changes[0], 1), "documents": args.docs}
    )
    return {"ops": {"incremental": result}}


def profile_backfill(args: argparse.Namespace) -> J:
    """A transaction shaped like one backfill batch against a raw batched put of the same
    rows."""
    value = b"v" * args.value_size
    count = max(3, args.ops // 20)
    unit = f"batch of {args.batch} rows"
    with counted_client(args.store, args.oracle) as (client, store, oracle):
        probe = Probe(store, oracle)
        with (
            w.txn_table(client, "prof_fill") as table,
            w.txn_table(client, "prof_progress") as progress,
            w.raw_table(store, "prof_rawfill") as raw,
        ):
            fill = w.backfill_batch_op(client, table, progress, args.batch, value)
            fill_result = measure_op(fill, count=count, probe=probe, unit=unit, warmup=1)
            raw_op = w.raw_rows_op(store, raw, args.batch, value)
            raw_result = measure_op(raw_op, count=count, probe=probe, unit=unit, warmup=1)
    return {
        "ops": {
            "backfill_batch": fill_result | {"rows": args.batch},
            "raw_batch": raw_result | {"rows": args.batch},
        }
    }


def profile_lock(args: argparse.Namespace) -> J:
    """The read that resolves the locks of a client killed before its commit point."""
    import percolator
    from bench.lock_bench import run_trial
    from percolator.context import ClientOptions

    ttl = ClientOptions().lock_ttl_ms
    client = percolator.connect(args.store, oracle=None, lock_ttl_ms=ttl, lock_wait_ms=ttl + 10_000)
    try:
        profiler = cProfile.Profile()
        trial = run_trial(
            client,
            args.store,
            None,
            case="before-commit-point",
            cells=args.cells,
            ttl_ms=ttl,
            profiler=profiler,
        )
    finally:
        client.close()
    return {
        "ops": {
            "resolving_read": {
                "unit": f"read of {args.cells} cells locked by a killed client",
                "count": 1,
                "ms_per_op": trial.read_s * 1000,
                "round_trips_per_op": {k: float(v) for k, v in trial.round_trips.items()},
                "timestamps_per_op": 0.0,
                "oracle_ms_per_op": 0.0,
                "must_wait_s": trial.must_wait_s,
                "ttl_ms": trial.ttl_ms,
                "top": top_functions(profiler, 1),
                "profiled_ops": 1,
                "profile_clock": "wall",
            }
        }
    }


PROFILES: dict[str, Callable[[argparse.Namespace], J]] = {
    "txn": profile_txn,
    "oracle": profile_oracle,
    "observer": profile_observer,
    "scan": profile_scan,
    "incremental": profile_incremental,
    "backfill": profile_backfill,
    "lock": profile_lock,
}


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="run_all.py profile")
    parser.add_argument("--kind", required=True, choices=sorted(PROFILES))
    parser.add_argument("--store", required=True, help="store URL (a fresh table prefix)")
    parser.add_argument("--oracle", help="grpc://HOST:PORT")
    parser.add_argument("--ops", type=int, default=200, help="operations per measurement")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--value-size", type=int, default=64)
    parser.add_argument("--waiters", type=int, default=1000)
    parser.add_argument("--scan-base", type=int, default=1000)
    parser.add_argument("--scan-growth", type=int, default=100)
    parser.add_argument("--dirty", type=int, default=1000)
    parser.add_argument("--docs", type=int, default=300)
    parser.add_argument("--fraction", type=float, default=0.02)
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument("--cells", type=int, default=5)
    parser.add_argument("--json", required=True)
    args = parser.parse_args(argv)
    if args.kind == "oracle" and not args.oracle:
        parser.error("--kind oracle needs --oracle grpc://HOST:PORT")
    result = PROFILES[args.kind](args)
    result["kind"] = args.kind
    result["store"] = args.store.split("?")[0]
    for name, op in result["ops"].items():
        trips = sum(op["round_trips_per_op"].values())
        print(f"{name}: {op['ms_per_op']:.3f} ms, {trips:.2f} round trips per {op['unit']}")
    Path(args.json).write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    return 0

"""Raw store rates: the baselines every engine benchmark divides by.

Measures, on each store backend, single-cell get, single-cell put, batched put (many cells
across rows in one call) and compare-and-set: calls per second and latency percentiles,
as the median of several repeats with their spread.

    python bench/store_bench.py                          # embedded store in a temp dir
    python bench/store_bench.py --store hbase://127.0.0.1:9090
    python bench/store_bench.py --hbase                  # also start a local HBase
    python bench/store_bench.py --ops 2000 --threads 4 --repeats 5 --json out.json

The operations are the raw-store workloads of :mod:`bench.workloads`.  Other benchmarks
reuse :func:`measure_raw` (one run) and :func:`measure_raw_repeated` (medians over repeats)
to get the same baselines in-process.

What one operation is
---------------------
``get``        ``read_row`` of one existing row, one column (one RPC on HBase)
``put``        ``put`` of one cell (one RPC)
``batch_put``  ``put`` of ``--batch`` cells, one per row, all at one version (one RPC);
               the table also shows cells/s
``cas``        ``compare_and_set`` of a fresh cell from absent to a value (one RPC; never
               contended, so it measures the primitive, not conflicts)

Each run uses a fresh table (dropped afterwards) and first makes ``--warmup`` untimed calls
of each kind, to open connections and warm the server.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make ``bench`` and ``percolator`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import workloads as w
from bench._common import (
    Summary,
    Timing,
    fmt_ms,
    fmt_rate,
    fmt_spread,
    print_table,
    run_timed,
    summarize,
)
from percolator.store import Store, open_store

OPERATIONS = ("get", "put", "batch_put", "cas")
DEFAULT_WARMUP = 100


def measure_raw(
    store: Store,
    *,
    ops: int = 1000,
    threads: int = 1,
    batch_cells: int = 100,
    value_size: int = 64,
    operations: Sequence[str] = OPERATIONS,
    warmup: int = DEFAULT_WARMUP,
) -> dict[str, Timing]:
    """One run of the raw operations on ``store``; returns a :class:`Timing` per operation.

    ``get``, ``put`` and ``cas`` make ``ops`` calls each; ``batch_put`` makes
    ``max(1, ops // 10)`` calls of ``batch_cells`` cells, after ``warmup`` untimed calls of
    each single-cell kind (a freshly started JVM is slow for a while).  Uses its own fresh
    table.
    Raises if any operation misbehaves (a read that finds nothing, a failed
    compare-and-set), so broken numbers are never reported.
    """
    unknown = set(operations) - set(OPERATIONS)
    if unknown:
        raise ValueError(f"unknown operation(s) {sorted(unknown)}; known: {list(OPERATIONS)}")
    if ops < 1 or threads < 1 or batch_cells < 1 or value_size < 0 or warmup < 0:
        raise ValueError("ops, threads and batch_cells must be >= 1; value_size, warmup >= 0")
    value = os.urandom(value_size)
    results: dict[str, Timing] = {}
    with w.raw_table(store) as table:
        w.raw_warmup(store, table, warmup, value)
        # The rows ``get`` reads: written by the ``put`` run, or here if it is not measured.
        if "put" in operations:
            results["put"] = run_timed(w.raw_put_op(store, table, value), ops, threads=threads)
        elif "get" in operations:
            w.raw_load(store, table, ops, value)
        if "get" in operations:
            results["get"] = run_timed(w.raw_get_op(store, table, ops), ops, threads=threads)
        if "batch_put" in operations:
            results["batch_put"] = run_timed(
                w.raw_batch_put_op(store, table, batch_cells, value),
                max(1, ops // 10),
                threads=threads,
                items_per_op=batch_cells,
            )
        if "cas" in operations:
            results["cas"] = run_timed(w.raw_cas_op(store, table, value), ops, threads=threads)
    return {op: results[op] for op in OPERATIONS if op in results}


def measure_raw_repeated(
    store: Store,
    *,
    repeats: int = 3,
    ops: int = 1000,
    threads: int = 1,
    batch_cells: int = 100,
    value_size: int = 64,
    operations: Sequence[str] = OPERATIONS,
    warmup: int = DEFAULT_WARMUP,
    on_repeat: Callable[[int, dict[str, Timing]], None] | None = None,
) -> dict[str, Summary]:
    """:func:`measure_raw` ``repeats`` times; the median (and spread) per operation."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    runs: list[dict[str, Timing]] = []
    for n in range(repeats):
        run = measure_raw(
            store,
            ops=ops,
            threads=threads,
            batch_cells=batch_cells,
            value_size=value_size,
            operations=operations,
            warmup=warmup,
        )
        runs.append(run)
        if on_repeat is not None:
            on_repeat(n, run)
    return {op: summarize([run[op] for run in runs]) for op in runs[0]}


def _table_rows(backend: str, summaries: dict[str, Summary]) -> list[list[str]]:
    rows = []
    for op, s in summaries.items():
        cells = fmt_rate(s.item_rate.median) if s.items_per_op > 1 else ""
        rows.append(
            [
                backend,
                op,
                fmt_rate(s.rate.median),
                fmt_spread(s.rate),
                cells,
                fmt_ms(s.p50_ms),
                fmt_ms(s.p95_ms),
                fmt_ms(s.p99_ms),
            ]
        )
    return rows


HEADERS = ["store", "op", "calls/s", "spread", "cells/s", "p50 ms", "p95 ms", "p99 ms"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="store_bench",
        description="Raw store rates and latencies (the baselines of the engine benchmarks).",
    )
    parser.add_argument(
        "--store",
        action="append",
        default=[],
        metavar="URL",
        help="a store to measure (repeatable).  The embedded store in a temporary directory "
        "is measured too unless a non-HBase --store is given.",
    )
    parser.add_argument(
        "--hbase",
        action="store_true",
        help="also start a local HBase (percolator.testing.localhbase) and measure it",
    )
    parser.add_argument("--ops", type=int, default=1000, help="calls per operation and repeat")
    parser.add_argument("--threads", type=int, default=1, help="client threads (default 1)")
    parser.add_argument("--repeats", type=int, default=3, help="repeats; the median is shown")
    parser.add_argument("--batch", type=int, default=100, help="cells per batched put")
    parser.add_argument("--value-size", type=int, default=64, help="bytes per value")
    parser.add_argument(
        "--warmup",
        type=int,
        default=DEFAULT_WARMUP,
        help=f"untimed calls of each kind before each repeat (default {DEFAULT_WARMUP})",
    )
    parser.add_argument(
        "--ops-only",
        default=",".join(OPERATIONS),
        help=f"comma-separated operations to run (default: {','.join(OPERATIONS)})",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    operations = [op.strip() for op in args.ops_only.split(",") if op.strip()]
    unknown = set(operations) - set(OPERATIONS)
    if unknown:
        print(f"store_bench: unknown operation(s) {sorted(unknown)}", file=sys.stderr)
        return 2
    for flag in ("ops", "threads", "repeats", "batch"):
        if getattr(args, flag) < 1:
            print(f"store_bench: --{flag} must be >= 1", file=sys.stderr)
            return 2

    with ExitStack() as stack:
        urls: list[tuple[str, str]] = []  # (label, url)
        if all(u.lower().startswith("hbase:") for u in args.store):
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="store-bench-"))
            urls.append(("embedded", f"embedded:{tmp}/store"))
        urls += [(u.split(":", 1)[0].lower(), u) for u in args.store]
        if args.hbase:
            try:
                from percolator.testing.localhbase.launcher import LocalHBase
            except ImportError:
                print("store_bench: --hbase needs percolator.testing.localhbase", file=sys.stderr)
                return 2
            workdir = stack.enter_context(tempfile.TemporaryDirectory(prefix="store-bench-hbase-"))
            local = stack.enter_context(LocalHBase(workdir))
            urls.append(("hbase(local)", local.url))

        print(
            f"store_bench: {args.ops} calls per operation ({max(1, args.ops // 10)} batched "
            f"puts of {args.batch} cells), {args.threads} thread(s), {args.repeats} repeats, "
            f"{args.value_size}-byte values; medians shown",
            file=sys.stderr,
        )
        table_rows: list[list[str]] = []
        report: dict[str, object] = {
            "ops": args.ops,
            "threads": args.threads,
            "repeats": args.repeats,
            "batch_cells": args.batch,
            "value_size": args.value_size,
            "stores": {},
        }
        for label, url in urls:
            with open_store(url) as store:
                print(f"store_bench: measuring {store.url}", file=sys.stderr)
                summaries = measure_raw_repeated(
                    store,
                    repeats=args.repeats,
                    ops=args.ops,
                    threads=args.threads,
                    batch_cells=args.batch,
                    value_size=args.value_size,
                    operations=operations,
                    warmup=args.warmup,
                    on_repeat=lambda n, _run: print(
                        f"store_bench:   repeat {n + 1}/{args.repeats} done", file=sys.stderr
                    ),
                )
            table_rows += _table_rows(label, summaries)
            stores = report["stores"]
            assert isinstance(stores, dict)
            stores[url] = {op: s.as_dict() for op, s in summaries.items()}
        print_table(HEADERS, table_rows)
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

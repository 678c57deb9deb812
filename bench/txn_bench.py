"""Transactions against the raw store, side by side in one run (targets P2, P3, P4).

Each repeat measures, on the same store, with the same client stack and the same number of
threads, first the raw operations (:func:`bench.store_bench.measure_raw`) and then the
engine's:

``txn_read``      ``txn.get`` of an existing cell inside an open transaction (P2: >= 0.90x
                  a raw get; an uncontended read is one store round trip)
``txn_read_full`` a whole read-only transaction: start_ts from the oracle, one get (context)
``txn_1cell``     a transaction writing one fresh cell, start to commit (P3: >= 0.30x raw
                  puts/s on HBase, >= 0.15x on the embedded store; Percolator reached 0.23x)
``txn_10cell``    a transaction writing ten cells in ten rows (P4: cells/s >= 3x those of
                  single-cell transactions)

During ``txn_1cell`` the time spent waiting for timestamps is added up and divided by the
total transaction latency: P1's "oracle wait <= 10% of transaction latency at peak load"
(run with ``--oracle grpc://...`` to measure the oracle service).

Ratios are computed per repeat and reported as the median over repeats, with their spread.

    python bench/txn_bench.py                                # embedded store in a temp dir
    python bench/txn_bench.py --store hbase://127.0.0.1:9090 --threads 4
    python bench/txn_bench.py --hbase                        # start a local HBase first
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make ``bench`` and ``percolator`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import workloads as w
from bench._common import (
    CountingOracle,
    Timing,
    add_cpu_of_argument,
    counted_client,
    fmt_ms,
    fmt_rate,
    median_per_key,
    print_table,
    run_timed,
    spread,
    watch_cpu_of,
)
from bench.store_bench import measure_raw
from bench.targets import BY_ID
from percolator.client import Client
from percolator.store import Store, open_store
from percolator.store.embedded import EmbeddedStore

#: the ratios this benchmark reports (keys of its JSON ``ratios``) and their targets
TARGETS = {
    "P2 read / raw get": BY_ID["P2"],
    "P3 1-cell txn / raw put": BY_ID["P3"],
    "P4 10-cell cells/s / 1-cell": BY_ID["P4"],
}


def measure_engine(
    client: Client, *, ops: int, threads: int, value: bytes
) -> tuple[dict[str, Timing], float | None]:
    """One run of the engine operations on a fresh table: a Timing per operation, and the
    share of ``txn_1cell`` latency spent waiting for timestamps (None unless the client's
    oracle is a :class:`CountingOracle`)."""
    with w.txn_table(client) as table:
        w.txn_load(client, table, ops, value)
        results: dict[str, Timing] = {}
        with w.txn_reads(client, table, threads) as read:
            results["txn_read"] = run_timed(read, ops, threads=threads)
        results["txn_read_full"] = run_timed(
            w.txn_read_full_op(client, table), ops, threads=threads
        )
        counted = client.oracle if isinstance(client.oracle, CountingOracle) else None
        waited_before = counted.waited_s if counted else 0.0
        results["txn_1cell"] = run_timed(w.txn_write_op(client, table, value), ops, threads=threads)
        share = None
        if counted is not None:
            # P1: the share of transaction latency spent waiting for the oracle, at the
            # transaction load of this run (all threads writing as fast as they can).
            t = results["txn_1cell"]
            total_latency_s = t.ops / t.rate * t.threads if t.rate else 0.0
            waited = counted.waited_s - waited_before
            share = waited / total_latency_s if total_latency_s else 0.0
        results["txn_10cell"] = run_timed(
            w.txn_write_op(client, table, value, cells=10),
            max(1, ops // 10),
            threads=threads,
            items_per_op=10,
        )
        return results, share


def ratios(raw: dict[str, Timing], engine: dict[str, Timing]) -> dict[str, float]:
    return {
        "P2 read / raw get": engine["txn_read"].rate / raw["get"].rate,
        "P3 1-cell txn / raw put": engine["txn_1cell"].rate / raw["put"].rate,
        "P4 10-cell cells/s / 1-cell": engine["txn_10cell"].item_rate
        / engine["txn_1cell"].item_rate,
    }


def run(
    store: Store,
    *,
    oracle: str | None,
    ops: int,
    threads: int,
    repeats: int,
    value_size: int,
) -> dict[str, object]:
    value = b"v" * value_size
    per_repeat: list[dict[str, float]] = []
    timings: list[dict[str, Timing]] = []
    shares: list[float] = []
    with counted_client(store, oracle) as (client, _, _):
        for n in range(repeats):
            raw = measure_raw(
                store,
                ops=ops,
                threads=threads,
                value_size=value_size,
                operations=("get", "put"),
            )
            engine, share = measure_engine(client, ops=ops, threads=threads, value=value)
            if share is not None:
                shares.append(share)
            r = ratios(raw, engine)
            per_repeat.append(r)
            timings.append({**{f"raw_{k}": v for k, v in raw.items()}, **engine})
            print(
                f"repeat {n + 1}/{repeats}: " + ", ".join(f"{k} = {v:.2f}x" for k, v in r.items()),
                flush=True,
            )
    summary = {name: spread([r[name] for r in per_repeat]) for name in TARGETS}
    rows = []
    for op in timings[0]:
        rates = [t[op].item_rate for t in timings]
        cpu = median_per_key([t[op].cpu_per_item() for t in timings])
        rows.append(
            [
                op,
                fmt_rate(statistics.median(rates)),
                fmt_ms(statistics.median(t[op].p50_ms for t in timings)),
                fmt_ms(statistics.median(t[op].p99_ms for t in timings)),
                fmt_ms(cpu.get("client", math.nan)),
                fmt_ms(cpu.get("machine", math.nan)),
                f"{cpu['busy']:.0%}" if "busy" in cpu else "-",
            ]
        )
    print()
    print_table(
        [
            "operation",
            "items/s (median)",
            "p50",
            "p99",
            "client CPU ms/item",
            "machine CPU ms/item",
            "machine busy",
        ],
        rows,
    )
    print()
    ratio_rows = []
    # A goal may differ by store (P3: 0.30x on HBase, 0.15x on the embedded store).
    kind = "embedded" if isinstance(store, EmbeddedStore) else "HBase"
    for name, target in TARGETS.items():
        s = summary[name]
        goal = target.threshold_on(kind)
        ratio_rows.append(
            [
                name,
                f"{s.median:.2f}x",
                f"{s.low:.2f}-{s.high:.2f}",
                f">= {goal:g}x ({kind})",
                "pass" if target.meets(s.median, goal) else "MISS",
            ]
        )
    if shares:
        oracle_share = spread(shares)
        ratio_rows.append(
            [
                "P1 oracle wait / txn latency",
                f"{oracle_share.median:.1%}",
                f"{oracle_share.low:.1%}-{oracle_share.high:.1%}",
                f"<= {BY_ID['P1c'].threshold:.0%}",
                "pass" if BY_ID["P1c"].meets(oracle_share.median) else "MISS",
            ]
        )
    print_table(["ratio", "median", "spread", "target", "result"], ratio_rows)
    return {
        "ratios": {k: v.as_dict() for k, v in summary.items()},
        # P1: the share of 1-cell transaction latency spent waiting for timestamps, per repeat
        "oracle_share": list(shares),
        "oracle": oracle or "local (in the store)",
        "value_size": value_size,
        "timings": [{k: v.as_dict() for k, v in t.items()} for t in timings],
        "threads": threads,
        "ops": ops,
        "store": store.url,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", help="store URL (default: embedded in a temp dir)")
    parser.add_argument("--hbase", action="store_true", help="start a local HBase and use it")
    parser.add_argument("--oracle", help="grpc://HOST:PORT (default: in-process oracle)")
    parser.add_argument("--ops", type=int, default=500)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--value-size", type=int, default=64)
    add_cpu_of_argument(parser)
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    watch_cpu_of(parser, args.cpu_of)
    with ExitStack() as stack:
        url = args.store
        if args.hbase:
            from percolator.testing.localhbase.launcher import LocalHBase

            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            hbase = stack.enter_context(LocalHBase(workdir))
            url = hbase.url
        if url is None:
            url = f"embedded:{stack.enter_context(tempfile.TemporaryDirectory())}/store"
        store = open_store(url)
        stack.callback(store.close)
        print(f"store {url}, {args.threads} threads, {args.ops} ops, {args.repeats} repeats")
        result = run(
            store,
            oracle=args.oracle,
            ops=args.ops,
            threads=args.threads,
            repeats=args.repeats,
            value_size=args.value_size,
        )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Timestamp oracle: what batching buys (target P1).

Starts an oracle server process (on a fresh embedded store unless ``--oracle`` names a
running one) and, in this one client process, measures with 1, 100 and 1,000 concurrent
waiters, side by side in one run:

``batched``     every waiter calls ``get_timestamp()`` on one shared
                :class:`~percolator.oracle.client.GrpcOracleClient`, which coalesces concurrent
                requests into one Allocate RPC in flight
``per-rpc``     every waiter sends its own ``Allocate(count=1)`` on one shared channel:
                one timestamp per RPC, as many RPCs in flight as waiters
``ranged``      every waiter sends its own ``Allocate(count=RANGE)`` (``--range``, default
                100): a caller that needs many timestamps at once (a bulk job numbering
                its batches) takes them in one RPC; the server's batched capacity

and prints timestamps/s (median of ``--repeats`` runs, with their spread), per-call latency
percentiles, RPCs per timestamp, and the ratio batched / per-rpc for each waiter count.

    python bench/oracle_bench.py
    python bench/oracle_bench.py --waiters 1,100,1000 --repeats 5 --seconds 2
    python bench/oracle_bench.py --oracle grpc://127.0.0.1:7070 --json out.json
    python bench/oracle_bench.py --local   # also the in-process LocalOracle, for context

Targets (docs/targets.md, P1): timestamps served with batching >= 50x one timestamp per
RPC with the same concurrent clients (``ranged`` / ``per-rpc``), and >= 10x through request
coalescing with 100 waiters in one process (``batched`` / ``per-rpc``).  With one waiter
there is nothing to coalesce: that ratio is ~1x by construction and is shown for context.
The share of transaction latency spent waiting for timestamps (the third part of P1)
needs the transaction engine and is measured by bench/txn_bench.py.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

if __package__ in (None, ""):  # run as a script: make ``bench`` and the packages importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    Summary,
    fmt_ms,
    fmt_rate,
    fmt_spread,
    print_table,
    run_timed,
    summarize,
)
from bench.targets import BY_ID
from bench.workloads import OracleOps, oracle_ops
from percolator.store import open_store
from percolator.timestamps import LocalOracle

ROOT = Path(__file__).resolve().parent.parent
TARGETS = {100: BY_ID["P1b"].threshold}  # waiters -> minimum gain, batched / per-rpc
RANGED_TARGET = BY_ID["P1a"].threshold  # minimum ranged / per-rpc with the same waiters
_READY = re.compile(r"oracle: listening on (\S+) ")


class OracleServer(NamedTuple):
    """A running oracle server process: its ``HOST:PORT`` and its pid."""

    address: str
    pid: int


@contextmanager
def oracle_server(store_url: str) -> Iterator[OracleServer]:
    """An oracle server process on ``store_url``; stops it after."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "percolator",
            "oracle",
            "serve",
            "--create",
            "--store",
            store_url,
            "--listen",
            "127.0.0.1:0",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        match = _READY.search(line)
        if not match:
            raise SystemExit(f"oracle_bench: the oracle did not start: {line!r}")
        yield OracleServer(match.group(1), proc.pid)
    finally:
        proc.terminate()
        proc.wait(30)


def measure(op: Callable[[int], object], waiters: int, seconds: float, repeats: int) -> Summary:
    """Calibrate the count on a warm-up run, then ``repeats`` runs of about ``seconds``."""
    warm = run_timed(op, max(waiters * 2, 200), threads=waiters)
    count = int(min(max(warm.rate * seconds, waiters * 5, 200), 5_000_000))
    return summarize([run_timed(op, count, threads=waiters) for _ in range(repeats)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--oracle", help="grpc://HOST:PORT of a running oracle (default: start one)"
    )
    parser.add_argument(
        "--store",
        help="store URL for the oracle started here "
        "(default: a fresh embedded store in a temp dir)",
    )
    parser.add_argument(
        "--waiters",
        default="1,100,1000",
        help="comma-separated concurrent waiter counts (default %(default)s)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per cell (median)")
    parser.add_argument("--seconds", type=float, default=1.5, help="target length of one run")
    parser.add_argument(
        "--range",
        type=int,
        default=100,
        help="timestamps per Allocate in the ranged mode (default %(default)s)",
    )
    parser.add_argument(
        "--local", action="store_true", help="also measure LocalOracle on a fresh embedded store"
    )
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON")
    args = parser.parse_args(argv)
    waiter_counts = [int(w) for w in args.waiters.split(",")]

    with tempfile.TemporaryDirectory(prefix="oracle-bench-") as scratch:
        store_url = args.store or f"embedded:{scratch}/store"
        if args.oracle:
            results = run(args.oracle, waiter_counts, args)
        else:
            with oracle_server(store_url) as server:
                results = run(f"grpc://{server.address}", waiter_counts, args)
        if args.local:
            results["local"] = run_local(f"embedded:{scratch}/local", waiter_counts, args)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


def run(oracle_url: str, waiter_counts: list[int], args: argparse.Namespace) -> dict[str, object]:
    with oracle_ops(oracle_url, args.range) as ops:
        return _run(ops, oracle_url, waiter_counts, args)


def _run(
    ops: OracleOps, oracle_url: str, waiter_counts: list[int], args: argparse.Namespace
) -> dict[str, object]:
    client = ops.client
    print(
        f"oracle {oracle_url}; {os.cpu_count()} cores; median of {args.repeats} runs of "
        f"~{args.seconds:g} s each",
        flush=True,
    )
    rows = []
    per_waiters: dict[str, object] = {}
    results: dict[str, object] = {"oracle": oracle_url, "waiters": per_waiters}
    verdicts = []
    for waiters in waiter_counts:
        cell: dict[str, object] = {}
        rates = {}
        for mode, op in (("per-rpc", ops.per_rpc), ("batched", ops.batched)):
            fetches_before, stamps_before = client.stats.fetches, client.stats.timestamps
            summary = measure(op, waiters, args.seconds, args.repeats)
            rates[mode] = summary.rate.median
            if mode == "batched":
                fetched = client.stats.timestamps - stamps_before
                rpcs_per_ts = (client.stats.fetches - fetches_before) / max(fetched, 1)
            else:
                rpcs_per_ts = 1.0
            rows.append(
                [
                    f"{waiters} waiters, {mode}",
                    fmt_rate(summary.rate.median),
                    fmt_spread(summary.rate),
                    fmt_ms(summary.p50_ms),
                    fmt_ms(summary.p95_ms),
                    fmt_ms(summary.p99_ms),
                    f"{rpcs_per_ts:.3f}",
                ]
            )
            cell[mode] = {**summary.as_dict(), "rpcs_per_timestamp": rpcs_per_ts}
        # One RPC carries args.range timestamps: the rate of timestamps is range x calls/s.
        summary = measure(ops.ranged, waiters, args.seconds, args.repeats)
        ranged_rate = summary.rate.median * args.range
        low, high = summary.rate.low * args.range, summary.rate.high * args.range
        rows.append(
            [
                f"{waiters} waiters, ranged x{args.range}",
                fmt_rate(ranged_rate),
                f"{fmt_rate(low)}-{fmt_rate(high)}",
                fmt_ms(summary.p50_ms),
                fmt_ms(summary.p95_ms),
                fmt_ms(summary.p99_ms),
                f"{1 / args.range:.3f}",
            ]
        )
        cell["ranged"] = {**summary.as_dict(), "range": args.range, "timestamps_per_s": ranged_rate}
        ranged_ratio = ranged_rate / rates["per-rpc"]
        cell["ranged_ratio"] = ranged_ratio
        ratio = rates["batched"] / rates["per-rpc"]
        cell["ratio"] = ratio
        per_waiters[str(waiters)] = cell
        target = TARGETS.get(waiters)
        verdict = (
            "context only"
            if target is None
            else (f"target >= {target:g}x: {'met' if ratio >= target else 'NOT met'}")
        )
        verdicts.append(f"coalescing gain with {waiters} waiters: {ratio:.1f}x ({verdict})")
        verdicts.append(
            f"ranged (x{args.range} per RPC) gain with {waiters} waiters: "
            f"{ranged_ratio:.1f}x (target >= {RANGED_TARGET:g}x: "
            f"{'met' if ranged_ratio >= RANGED_TARGET else 'NOT met'})"
        )
        print(f"  measured {waiters} waiters", flush=True)
    print()
    print_table(["oracle", "timestamps/s", "spread", "p50 ms", "p95 ms", "p99 ms", "RPCs/ts"], rows)
    print()
    for line in verdicts:
        print(line)
    return results


def run_local(store_url: str, waiter_counts: list[int], args: argparse.Namespace) -> object:
    """LocalOracle for context: one compare-and-set per coalesced batch."""
    store = open_store(store_url)
    oracle = LocalOracle(store)
    oracle.get_timestamp()
    rows, results = [], {}
    for waiters in waiter_counts:
        fetches, stamps = oracle.stats.fetches, oracle.stats.timestamps
        summary = measure(lambda _: oracle.get_timestamp(), waiters, args.seconds, args.repeats)
        cas_per_ts = (oracle.stats.fetches - fetches) / max(oracle.stats.timestamps - stamps, 1)
        rows.append(
            [
                f"{waiters} waiters",
                fmt_rate(summary.rate.median),
                fmt_spread(summary.rate),
                fmt_ms(summary.p50_ms),
                fmt_ms(summary.p99_ms),
                f"{cas_per_ts:.3f}",
            ]
        )
        results[str(waiters)] = {**summary.as_dict(), "cas_per_timestamp": cas_per_ts}
    store.close()
    print()
    print(f"LocalOracle on {store_url} (in-process, for context)")
    print_table(["local oracle", "timestamps/s", "spread", "p50 ms", "p99 ms", "CAS/ts"], rows)
    return results


if __name__ == "__main__":
    sys.exit(main())

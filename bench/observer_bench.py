"""Observers: commit-to-observer-commit latency and notification scan cost (targets P5, P6).

    python bench/observer_bench.py                       # embedded store in a temp dir
    python bench/observer_bench.py --store 'hbase://127.0.0.1:9090?prefix=obsbench_'
    python bench/observer_bench.py --only latency --threads 8 --step-seconds 10
    python bench/observer_bench.py --only scan --scan-base 1000 --scan-growth 100 --json out.json
    python bench/observer_bench.py --oracle local     # each process reserves timestamps itself

Timestamps come from an oracle server started for the run (``--oracle serve``, the default):
the writer and the worker are separate processes, and with the in-store oracle
(``--oracle local``) every process reserves its batches by compare-and-set on one cell, which
on HBase caps the throughput of both.

Latency (P5)
------------
A worker process (``percolator worker``, the real CLI) runs a light observer that copies
the commit timestamp it saw.  Every write goes to a fresh row, so each write is covered by
exactly one run, and latency is measured from the store: from the write's ``commit_ts`` to
the ``commit_ts`` of the observer run that covered it (both hybrid timestamps, physical ms).

1. **backlog throughput**: a flood of writes (batched transactions) gives the worker a
   backlog; the rate at which its runs commit, with no writer competing for the CPU, is an
   upper bound B (printed for context).
2. **sweep**: single-row transactions paced open-loop (four writer threads) from B/16 up by
   1.5x per step of ``--step-seconds`` (at least 30 writes), until the worker no longer keeps
   up: its backlog grows during the step (the median latency of the last third of the
   writes exceeds twice that of the first third plus 0.5 s).  The **saturation point** S is
   the highest write rate it kept up with.  Per step: offered and achieved write rate, run
   throughput, latency p50/p99/max.  The backlog is drained between steps.
3. **half of saturation**: ``--half-repeats`` steps at S/2; the medians of their p50 and
   p99 are the figures for the target.

Target: p50 <= 1 s and p99 <= 5 s at S/2.  The writers run on the same machine as the
worker (and, on HBase, the server): on a two-core machine they compete for the CPU, which is
why S is measured with them running rather than taken from the flood.

Scan (P6)
---------
One table grows from ``--scan-base`` rows by ``--scan-growth`` (default 1,000 -> 100,000 rows,
loaded straight into the data, write and lock families), always with the same ``--dirty``
notifications spread over the key space.  Per size: the time of one notification pass (the
scanner's scan of the notify family, median of ``--scan-repeats``), and for contrast one
scan of the lock family (what finding dirty cells would cost without a separate family).
Target: the notification pass stays within 2x while the table grows 100x.

Scaling point
-------------
:func:`scaling_main` (``python bench/run_all.py observer-scaling ...``) measures one point of
bench/run_all's observer scaling series: the backlog throughput of ``--workers`` worker
processes with ``--threads`` threads each, then the latency at one fixed write rate.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make ``bench`` and the packages importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from percolator.observers.parking import pending

import percolator
from bench._common import fmt_ms, fmt_rate, percentile, print_table
from bench.workloads import (
    EVENTS,
    OUT,
    SCAN_TABLE,
    latency_observer,
    load_scan_rows,
    scan_pass_op,
    scan_setup,
    write_events,
)
from percolator.layout import LOCK, META_TABLE, NOTIFY
from percolator.store import open_store
from percolator.timestamps import physical_ms

PROJECT_ROOT = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------- worker


@contextmanager
def worker_process(
    store_url: str, threads: int, workers: int, oracle: str | None
) -> Iterator[None]:
    """Start ``workers`` worker processes running :class:`LatencyObserver` (declared as a
    plugin through a dist-info directory on their PYTHONPATH)."""
    with tempfile.TemporaryDirectory(prefix="obsbench-plugins-") as tmp:
        info = Path(tmp) / "obsbench-0.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: obsbench\nVersion: 0.0\n")
        (info / "entry_points.txt").write_text(
            "[percolator.observers]\nbench-latency = bench.workloads:LatencyObserver\n"
        )
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [tmp, str(PROJECT_ROOT), *filter(None, [env.get("PYTHONPATH")])]
        )
        procs = []
        logs = []
        try:
            for i in range(workers):
                log = open(Path(tmp) / f"worker{i}.log", "w+b")  # noqa: SIM115
                logs.append(log)
                procs.append(
                    subprocess.Popen(
                        [
                            sys.executable,
                            "-m",
                            "percolator",
                            "worker",
                            "--store",
                            store_url,
                            "--observer",
                            "bench-latency",
                            "--threads",
                            str(threads),
                            "--log-level",
                            "WARNING",
                            *(["--oracle", oracle] if oracle else []),
                        ],
                        cwd=PROJECT_ROOT,
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                )
            for proc, log in zip(procs, logs, strict=True):
                deadline = time.monotonic() + 120
                while b"worker ready" not in Path(log.name).read_bytes():
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(
                            "worker did not start:\n" + Path(log.name).read_text(errors="replace")
                        )
                    time.sleep(0.05)
            yield
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                proc.wait(timeout=60)
            for log in logs:
                log.close()


def wait_drained(client: percolator.Client, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while pending(client, EVENTS, limit=1):
        if time.monotonic() > deadline:
            raise RuntimeError(f"backlog not drained after {timeout} s")
        time.sleep(0.1)


def run_commits(client: percolator.Client, rows: list[bytes]) -> dict[bytes, tuple[int, int]]:
    """``row -> (covered write commit_ts, run commit_ts)`` for every processed row."""
    found = {}
    snapshot = client.snapshot()
    for row in rows:
        value, run_commit = snapshot.get_with_commit_ts(OUT, row, "covers")
        if value is not None and run_commit is not None:
            found[row] = (int(value), run_commit)
    return found


def saturation(client: percolator.Client, rows_n: int, prefix: str) -> float:
    """Runs/s of the worker(s) working off a backlog of ``rows_n`` notifications."""
    rows = write_events(client, prefix, rows_n)
    wait_drained(client)
    commits = sorted(physical_ms(run) for _, run in run_commits(client, rows).values())
    if len(commits) < rows_n:
        raise RuntimeError(f"only {len(commits)} of {rows_n} rows were processed")
    # The middle 80 %: the first and last runs see the ramp-up and the tail.
    low, high = commits[len(commits) // 10], commits[len(commits) * 9 // 10]
    return (len(commits) * 0.8) / max((high - low) / 1000, 1e-3)


def paced_writes(
    client: percolator.Client, rate: float, seconds: float, prefix: str, threads: int = 4
) -> tuple[list[bytes], dict[bytes, int], float]:
    """Open-loop single-row writes at ``rate``/s for ``seconds``; returns rows, their commit
    timestamps and the achieved rate."""
    total = max(1, int(rate * seconds))
    rows = [f"{prefix}-{i:07d}".encode() for i in range(total)]
    commits: dict[bytes, int] = {}
    lock = threading.Lock()
    start = time.monotonic() + 0.05

    def writer(t: int) -> None:
        for i in range(t, total, threads):
            delay = start + i / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            with client.transaction() as txn:
                txn.set(EVENTS, rows[i], "value", b"x")
            assert txn.commit_ts is not None
            with lock:
                commits[rows[i]] = txn.commit_ts

    pool = [threading.Thread(target=writer, args=(t,)) for t in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    achieved = total / max(time.monotonic() - start, 1e-3)
    return rows, commits, achieved


@dataclass
class Step:
    offered: float
    achieved: float
    run_rate: float
    writes: int
    processed: int
    p50_s: float
    p99_s: float
    max_s: float
    #: median latency of the first and of the last third of the writes
    early_p50_s: float
    late_p50_s: float

    @property
    def kept_up(self) -> bool:
        """The backlog did not grow: a worker slower than the writes builds a queue that
        grows for as long as the writes go on, so the last writes wait much longer than the
        first ones; a worker that keeps up shows the same latency throughout."""
        return self.processed == self.writes and self.late_p50_s <= 2 * self.early_p50_s + 0.5

    def row(self, label: str) -> list[object]:
        return [
            label,
            fmt_rate(self.offered),
            fmt_rate(self.achieved),
            fmt_rate(self.run_rate),
            f"{self.processed}/{self.writes}",
            fmt_ms(self.p50_s * 1000),
            fmt_ms(self.p99_s * 1000),
            fmt_ms(self.max_s * 1000),
            "yes" if self.kept_up else "no",
        ]


STEP_HEADERS = [
    "step",
    "offered/s",
    "writes/s",
    "runs/s",
    "processed",
    "p50 ms",
    "p99 ms",
    "max ms",
    "kept up",
]


def measure_step(client: percolator.Client, rate: float, seconds: float, prefix: str) -> Step:
    # At least 30 writes per step, so low rates still give percentiles.
    rows, commits, achieved = paced_writes(client, rate, max(seconds, 30 / rate), prefix)
    wait_drained(client)
    runs = run_commits(client, rows)
    in_write_order = sorted(
        (commits[row], (physical_ms(run) - physical_ms(commits[row])) / 1000)
        for row, (covered, run) in runs.items()
        if covered == commits[row]
    )
    latencies = [latency for _, latency in in_write_order]
    third = max(1, len(latencies) // 3)
    run_times = sorted(physical_ms(run) for _, run in runs.values())
    span = (run_times[-1] - run_times[0]) / 1000 if len(run_times) > 1 else 0.0
    return Step(
        offered=rate,
        achieved=achieved,
        run_rate=(len(run_times) - 1) / span if span else float("nan"),
        writes=len(rows),
        processed=len(latencies),
        p50_s=percentile(latencies, 50),
        p99_s=percentile(latencies, 99),
        max_s=max(latencies) if latencies else float("nan"),
        early_p50_s=percentile(latencies[:third], 50),
        late_p50_s=percentile(latencies[-third:], 50),
    )


def bench_latency(
    args: argparse.Namespace, client: percolator.Client, oracle_url: str | None
) -> dict[str, object]:
    """Sweep write rates up to saturation, then measure at half of it."""
    latency_observer(client)
    result: dict[str, object] = {}
    with worker_process(args.store, args.threads, args.workers, oracle_url):
        saturation(client, 100, "warm")  # connections, caches
        # The worker alone on a backlog: an upper bound, with no writer competing for CPU.
        flood_runs = [
            saturation(client, args.flood, f"flood{i}") for i in range(args.flood_repeats)
        ]
        flood = statistics.median(flood_runs)
        print(
            f"backlog throughput (no concurrent writer): {fmt_rate(flood)} runs/s "
            f"({args.workers} worker(s) x {args.threads} threads)"
        )
        # Rates from flood/16 up by 1.5x until the worker stops keeping up.
        rate = flood / 16
        sweep: list[Step] = []
        rows_table = []
        while True:
            step = measure_step(client, rate, args.step_seconds, f"sweep{len(sweep)}")
            sweep.append(step)
            rows_table.append(step.row(f"sweep {len(sweep)}"))
            print(
                f"  sweep {len(sweep)}: {fmt_rate(step.achieved)} writes/s, "
                f"{fmt_rate(step.run_rate)} runs/s, p50 {fmt_ms(step.p50_s * 1000)} ms, "
                f"p99 {fmt_ms(step.p99_s * 1000)} ms, kept up: {step.kept_up}",
                flush=True,
            )
            if not step.kept_up or rate > 2 * flood:
                break
            rate *= 1.5
        kept = [s for s in sweep if s.kept_up]
        saturation_rate = max(s.achieved for s in kept) if kept else sweep[0].achieved
        print(f"saturation point: {fmt_rate(saturation_rate)} writes/s (highest rate kept up)")
        half = [
            measure_step(client, saturation_rate / 2, args.step_seconds, f"half{i}")
            for i in range(args.half_repeats)
        ]
        for i, step in enumerate(half):
            rows_table.append(step.row(f"S/2 #{i + 1}"))
    print_table(STEP_HEADERS, rows_table)
    p50 = statistics.median(s.p50_s for s in half)
    p99 = statistics.median(s.p99_s for s in half)
    ok = p50 <= 1.0 and p99 <= 5.0
    print(
        f"P5 at half of saturation ({fmt_rate(saturation_rate / 2)} writes/s, median of "
        f"{len(half)}): p50 {p50:.3f} s, p99 {p99:.3f} s -> {'PASS' if ok else 'FAIL'} "
        "(target p50 <= 1 s, p99 <= 5 s)"
    )
    result["backlog_runs_per_s"] = flood
    result["backlog_runs"] = flood_runs
    result["threads"] = args.threads
    result["workers"] = args.workers
    result["saturation_writes_per_s"] = saturation_rate
    result["sweep"] = [asdict(s) | {"kept_up": s.kept_up} for s in sweep]
    result["half"] = [asdict(s) for s in half]
    result["p5"] = {"p50_s": p50, "p99_s": p99, "pass": ok}
    return result


# --------------------------------------------------------------------------- scan


def timed_scan(client: percolator.Client, family: str, repeats: int) -> list[float]:
    """The times of ``repeats`` scans of ``family`` (seconds), after an untimed one (caches,
    and the embedded store's write-ahead log after a bulk load)."""
    one_pass = scan_pass_op(client.store, family)
    one_pass(0)
    times = []
    for i in range(repeats):
        started = time.perf_counter()
        one_pass(i)
        times.append(time.perf_counter() - started)
    return times


def bench_scan(args: argparse.Namespace, client: percolator.Client) -> dict[str, object]:
    scan_setup(client, args.dirty)
    sizes = [args.scan_base]
    while sizes[-1] * 10 <= args.scan_base * args.scan_growth:
        sizes.append(sizes[-1] * 10)
    loaded = 0
    results = []
    rows_table = []
    for size in sizes:
        load_scan_rows(client, loaded, size)
        loaded = size
        notify_runs = timed_scan(client, NOTIFY, args.scan_repeats)
        notify = statistics.median(notify_runs)
        found = len(pending(client, SCAN_TABLE))
        full_runs = timed_scan(client, LOCK, max(1, min(args.scan_repeats, 3)))
        full = statistics.median(full_runs)
        results.append(
            {
                "rows": size,
                "dirty": found,
                "notify_scan_s": notify,
                "lock_scan_s": full,
                "notify_scan_runs_s": notify_runs,
                "lock_scan_runs_s": full_runs,
            }
        )
        rows_table.append([f"{size:,}", found, fmt_ms(notify * 1000), fmt_ms(full * 1000)])
    print_table(["table rows", "dirty", "notify pass ms", "full scan ms"], rows_table)
    ratio = results[-1]["notify_scan_s"] / results[0]["notify_scan_s"]
    ok = ratio <= 2.0
    print(
        f"P6: notify pass at {sizes[-1]:,} rows / at {sizes[0]:,} rows = {ratio:.2f}x -> "
        f"{'PASS' if ok else 'FAIL'} (target <= 2x)"
    )
    return {"sizes": results, "growth_ratio": ratio, "pass": ok}


# ------------------------------------------------------------------ scaling point (run_all)


def scaling_main(argv: Sequence[str]) -> int:
    """Backlog throughput (median of ``--repeats``) of ``--workers`` worker processes with
    ``--threads`` threads each, then the commit-to-observer-commit latency of paced writes
    at ``--at-rate`` (writes/s, or ``Fx`` for F times the measured backlog throughput)."""
    parser = argparse.ArgumentParser(prog="run_all.py observer-scaling")
    parser.add_argument("--store", required=True)
    parser.add_argument("--oracle", required=True)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--flood", type=int, default=400, help="notifications per backlog")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--at-rate", default="0.5x")
    parser.add_argument("--step-seconds", type=float, default=5.0)
    parser.add_argument("--json", required=True)
    args = parser.parse_args(argv)
    match = re.fullmatch(r"([0-9.]+)(x?)", args.at_rate)
    if match is None:
        parser.error(f"--at-rate must be a rate or a multiple like 0.5x, got {args.at_rate!r}")

    client = percolator.connect(args.store, oracle=args.oracle)
    try:
        latency_observer(client)
        with worker_process(args.store, args.threads, args.workers, args.oracle):
            saturation(client, min(100, args.flood), "warm")  # connections, caches
            backlog = [saturation(client, args.flood, f"flood{i}") for i in range(args.repeats)]
            value = float(match.group(1))
            rate = value * statistics.median(backlog) if match.group(2) else value
            step = measure_step(client, rate, args.step_seconds, "fixed")
    finally:
        client.close()
    result = {
        "threads": args.threads,
        "workers": args.workers,
        "flood": args.flood,
        "backlog_runs": backlog,
        "backlog_runs_per_s": statistics.median(backlog),
        "fixed_rate": rate,
        "step": asdict(step) | {"kept_up": step.kept_up},
    }
    print(
        f"{args.workers} worker(s) x {args.threads} threads: backlog "
        f"{statistics.median(backlog):.1f} runs/s; at {rate:.1f} writes/s p50 "
        f"{step.p50_s * 1000:.0f} ms, p99 {step.p99_s * 1000:.0f} ms"
    )
    Path(args.json).write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    return 0


# --------------------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", help="store URL (default: embedded store in a temp dir)")
    parser.add_argument("--only", choices=["latency", "scan"], help="run one part")
    parser.add_argument(
        "--oracle",
        default="serve",
        help="'serve': start an oracle server on the store for this run (default); 'local': "
        "the oracle persisted in the store, one per process; or grpc://HOST:PORT",
    )
    parser.add_argument("--threads", type=int, default=8, help="worker threads")
    parser.add_argument("--workers", type=int, default=1, help="worker processes")
    parser.add_argument("--flood", type=int, default=1500, help="writes of the flood")
    parser.add_argument("--flood-repeats", type=int, default=3)
    parser.add_argument("--step-seconds", type=float, default=8.0)
    parser.add_argument(
        "--half-repeats", type=int, default=3, help="steps at half of saturation (median)"
    )
    parser.add_argument("--scan-base", type=int, default=1000)
    parser.add_argument("--scan-growth", type=int, default=100)
    parser.add_argument("--dirty", type=int, default=1000, help="notifications in the table")
    parser.add_argument("--scan-repeats", type=int, default=15)
    parser.add_argument("--json", help="write the results to this file")
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]  # progress in logs
    with tempfile.TemporaryDirectory(prefix="obsbench-") as tmp, contextlib.ExitStack() as stack:
        if args.store is None:
            args.store = f"embedded:{tmp}/store"
        oracle_url: str | None = None
        if args.oracle == "serve":
            from bench.oracle_bench import oracle_server

            oracle_url = "grpc://" + stack.enter_context(oracle_server(args.store)).address
        elif args.oracle != "local":
            oracle_url = args.oracle
        print(f"store: {args.store}\noracle: {oracle_url or 'local (in the store)'}", flush=True)
        results = run(args, oracle_url)
    if args.store.startswith("hbase"):
        # The namespace is the benchmark's own: leave nothing behind on a shared HBase
        # (the oracle server, which keeps its record there, has stopped by now).
        with open_store(args.store) as store:
            if store.table_exists(META_TABLE):
                store.drop_table(META_TABLE)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, sort_keys=True))
    return 0


def run(args: argparse.Namespace, oracle_url: str | None) -> dict[str, object]:
    client = percolator.connect(args.store, oracle=oracle_url)
    results: dict[str, object] = {"store": args.store, "oracle": oracle_url or "local"}
    try:
        if args.only in (None, "latency"):
            results["latency"] = bench_latency(args, client, oracle_url)
        if args.only in (None, "scan"):
            results["scan"] = bench_scan(args, client)
    finally:
        if args.store.startswith("hbase"):
            for table in (EVENTS, OUT, SCAN_TABLE):
                if client.store.table_exists(table):
                    client.drop_table(table)
        client.close()
    return results


if __name__ == "__main__":
    sys.exit(main())

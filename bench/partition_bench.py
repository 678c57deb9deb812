"""Partitioned vs random notification scanning with several worker processes (target P13).

    python bench/partition_bench.py                         # embedded store, 1 2 4 workers
    python bench/partition_bench.py --workers 1,2,4,8 --rows 800 --json out.json
    python bench/partition_bench.py --hbase hbase://127.0.0.1:9090   # a fresh prefix per run

For each worker count N and each mode (``random``: every worker scans and runs everything,
jumping away from other scanners; ``partitioned``: key groups leased to workers,
observers/partition.py), on a fresh store: N worker processes run one trivial strong
observer (one read, one write), the parent writes ``--rows`` rows (20 per transaction) once
the workers are ready (partitioned: once every worker holds groups), waits for the
observer's watermark to pass them, then stops the workers, which report their counters:

* **scanned/run**: notifications the scanners read (offered or not) per committed run;
* **nothing/run**: runs that found nothing to do (already acknowledged) per committed run;
* **conflicts/run**: run attempts that lost a write-write conflict per committed run;
* the time from the first write to the watermark passing (throughput, for context).

All processes share the machine (and an embedded store's file): the load average is
printed with the figures.  The time for groups to move after a worker is killed is measured
by tests/observers/test_partition.py (within the lease plus one housekeeping interval).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``bench`` and the packages importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from percolator.observers.api import Observer, register_observers
from percolator.observers.worker import Worker, WorkerOptions

import percolator
from percolator.layout import META_FAMILY, META_TABLE
from percolator.notifications import Notification
from percolator.store.backends import with_table_prefix
from percolator.store.base import ScanOptions
from percolator.transaction import Transaction

ROOT = Path(__file__).resolve().parent.parent
TABLE = "pbench"
OUT = "pbench_out"
GROUPS = 64


class Copy(Observer):
    name = "pbench-copy"
    table = TABLE
    columns = ("v",)
    outputs = ((OUT, "v"),)

    def setup(self, client: percolator.Client) -> None:
        client.create_table(TABLE)
        client.create_table(OUT)

    def process(self, txn: Transaction, row: bytes, column: str) -> None:
        txn.set(OUT, row, "v", txn.get(TABLE, row, column) or b"")


class CountingWorker(Worker):
    """A worker that counts the notifications its scanners read."""

    scanned = 0

    def _offer(self, notification: Notification) -> bool:
        self.scanned += 1
        return super()._offer(notification)


def child(url: str, mode: str) -> int:
    client = percolator.connect(url)
    options = WorkerOptions(
        threads=2,
        idle_sleep_s=0.01,
        housekeeping_s=0.2,
        partitioned=mode == "partitioned",
        key_groups=GROUPS,
        lease_ms=3000,
    )
    worker = CountingWorker(client, [Copy()], options)
    worker.start()
    print("ready", flush=True)
    sys.stdin.read()  # the parent closes stdin to stop us
    worker.stop(drain_timeout_s=5)
    metrics = worker.metrics
    name = Copy.name
    counters = {
        "scanned": worker.scanned,
        "runs": metrics.runs.value(observer=name),
        "nothing": metrics.skipped.value(observer=name),
        "conflicts": metrics.conflicts.value(observer=name),
    }
    print(json.dumps(counters), flush=True)
    client.close()
    return 0


def lease_owners(client: percolator.Client) -> set[str]:
    options = ScanOptions(start=b"keygroup/", stop=b"keygroup0", qualifiers=[b"l"])
    owners = set()
    now_ms = int(time.time() * 1000)
    for _, cells in client.store.scan(META_TABLE, META_FAMILY, options):
        doc = json.loads(cells[b"l"][1])
        if doc["owner"] and doc["expires_ms"] > now_ms:
            owners.add(doc["owner"])
    return owners


def one_run(workers: int, mode: str, rows: int, hbase: str | None = None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="pbench-") as tmp:
        url = f"embedded:{tmp}/store"
        if hbase is not None:
            # A fresh table prefix per run: the runs must not see each other's leftovers.
            url = with_table_prefix(hbase, f"pb{os.getpid()}_{workers}{mode[0]}_")
        client = percolator.connect(url)
        Copy().setup(client)
        register_observers(client, [Copy()])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "bench.partition_bench", "--child", url, mode],
                cwd=ROOT,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            for _ in range(workers)
        ]
        try:
            for proc in procs:
                assert proc.stdout is not None
                line = proc.stdout.readline().strip()
                if line != "ready":
                    raise RuntimeError(f"worker did not start: {line!r}")
            if mode == "partitioned":
                deadline = time.monotonic() + 30
                while len(lease_owners(client)) < workers and time.monotonic() < deadline:
                    time.sleep(0.2)
            started = time.monotonic()
            for first in range(0, rows, 20):
                with client.transaction() as txn:
                    for i in range(first, min(rows, first + 20)):
                        txn.set(TABLE, b"r%06d" % i, "v", b"x")
            client.wait_for(observers=[Copy.name], timeout=600)
            elapsed = time.monotonic() - started
        finally:
            totals = {"scanned": 0.0, "runs": 0.0, "nothing": 0.0, "conflicts": 0.0}
            for proc in procs:
                out, _ = proc.communicate(input="", timeout=120)
                for key, value in json.loads(out.strip().splitlines()[-1]).items():
                    totals[key] += value
            if hbase is not None:  # once the workers are gone
                for table in (TABLE, OUT):
                    client.drop_table(table)
            client.close()
    runs = max(totals["runs"], 1.0)
    return {
        "workers": workers,
        "mode": mode,
        "rows": rows,
        "seconds": round(elapsed, 2),
        "runs": int(totals["runs"]),
        "scanned_per_run": round(totals["scanned"] / runs, 2),
        "nothing_per_run": round(totals["nothing"] / runs, 3),
        "conflicts_per_run": round(totals["conflicts"] / runs, 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", nargs=2, metavar=("URL", "MODE"), help=argparse.SUPPRESS)
    parser.add_argument("--workers", default="1,2,4", help="comma-separated worker counts")
    parser.add_argument("--rows", type=int, default=400)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--hbase", default=None, help="HBase URL (default: embedded stores)")
    args = parser.parse_args(argv)
    if args.child:
        return child(*args.child)
    results = []
    print(
        f"{'workers':>7} {'mode':12} {'rows':>5} {'s':>7} {'runs':>5} {'scanned/run':>11} "
        f"{'nothing/run':>11} {'conflicts/run':>13}"
    )
    for workers in (int(n) for n in args.workers.split(",")):
        for mode in ("random", "partitioned"):
            r = one_run(workers, mode, args.rows, args.hbase)
            results.append(r)
            print(
                f"{r['workers']:>7} {r['mode']:12} {r['rows']:>5} {r['seconds']:>7.2f} "
                f"{r['runs']:>5} {r['scanned_per_run']:>11.2f} {r['nothing_per_run']:>11.3f} "
                f"{r['conflicts_per_run']:>13.3f}",
                flush=True,
            )
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs")
    if args.json is not None:
        doc = {
            "store": "hbase" if args.hbase else "embedded",
            "results": results,
            "load_average": list(load),
            "cpus": os.cpu_count(),
        }
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

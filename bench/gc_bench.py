"""P11 bounded storage: a steady update workload with periodic GC keeps the store flat.

A fixed set of cells (``--cells``) is rewritten in transactions for ``--seconds``; every
``--gc-every`` seconds a GC pass with life time ``--life-time`` runs (from a second client,
as an operator's ``percolator gc`` would).  With life time 0 the bound is the writer's
published oldest reader, which is renewed every 2 s (``RENEW_INTERVAL_S``): the size then
swings with the phase between GC passes and renewals (up to 2 s of writes kept), which a
life time above the renewal interval (default 5 s) turns into a steady lag.  The store's
size is counted from the raw store after every pass -- every version of every cell in every
family of the table, and their bytes -- and, once every cell has been written (the steady
state), the median size of the first tenth of the samples is compared with the last tenth
(target: within 2x).  Also GC
throughput: cells collected per second by the GC passes, against a raw batched delete of the
same number of cells in the same run.

``--churn`` makes the key space move, as a derived index's does: each transaction writes a
new row and deletes the row written ``--cells`` transactions earlier, so the live cells stay
at ``--cells`` while every row is eventually deleted.  Storage then stays flat only if GC
removes deleted cells entirely, lock cells included (on HBase, only lock cells older than
the store's clock skew allowance, 60 s, go: size settles after that long).

    python bench/gc_bench.py --store embedded:/tmp/gcb --seconds 60
    python bench/gc_bench.py --store hbase://127.0.0.1:9090?prefix=gcb_ --seconds 60
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import percolator
from percolator.layout import TABLE_FAMILIES
from percolator.store.base import Delete, FamilySpec, Put, Store

TABLE = "gcbench"


@dataclass
class Size:
    at_s: float
    cells: int
    bytes: int


def measure_size(store: Store, table: str) -> Size:
    """Every version of every cell in every family of ``table``, counted raw (the rows and
    qualifiers are found by a scan of each family, then every version is read)."""
    columns: set[tuple[str, bytes]] = set()
    found_rows: set[bytes] = set()
    for family in TABLE_FAMILIES:
        for row, found_cells in store.scan(table, family.name):
            found_rows.add(row)
            columns.update((family.name, q) for q in found_cells)
    rows = sorted(found_rows)
    cells = 0
    size = 0
    for start in range(0, len(rows), 200):
        found = store.read_rows(
            table, rows[start : start + 200], columns=sorted(columns), max_versions=1_000_000
        )
        for by_column in found.values():
            for (_, qualifier), versions in by_column.items():
                cells += len(versions)
                size += sum(len(qualifier) + 8 + len(value) for _, value in versions)
    return Size(0.0, cells, size)


def raw_delete_rate(store: Store, n: int) -> float:
    """Raw batched deletes per second of ``n`` cells (one version each) on a plain table."""
    name = "gcbench_raw"
    if not store.table_exists(name):
        store.create_table(name, [FamilySpec("d")])
    rows = [b"r%07d" % i for i in range(n)]
    for start in range(0, n, 1000):
        store.put(name, [Put(r, "d", b"q", 5, b"x" * 32) for r in rows[start : start + 1000]])
    began = time.perf_counter()
    for start in range(0, n, 1000):
        store.delete_versions(name, [Delete(r, "d", b"q", 5) for r in rows[start : start + 1000]])
    return n / (time.perf_counter() - began)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", default=None, help="store URL (default: a temporary embedded)")
    parser.add_argument("--cells", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--gc-every", type=float, default=2.0)
    parser.add_argument("--value-size", type=int, default=100)
    parser.add_argument("--life-time", type=float, default=5.0, help="GC life time, seconds")
    parser.add_argument(
        "--churn", action="store_true", help="write new rows and delete old ones (see above)"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    url = args.store or f"embedded:{tempfile.mkdtemp(prefix='gcbench-')}/store"
    load_before = os.getloadavg()

    app = percolator.connect(url)
    operator = percolator.connect(url)
    app.create_table(TABLE)
    rows = [b"row%05d" % i for i in range(args.cells)]
    value = b"v" * args.value_size
    stop = threading.Event()
    commits = [0]

    def write(txn: percolator.Transaction, row: bytes, payload: bytes, gone: bytes | None) -> None:
        txn.set(TABLE, row, "c", payload)
        if gone is not None:
            txn.delete(TABLE, gone, "c")

    def writer() -> None:
        i = 0
        while not stop.is_set():
            if args.churn:
                row = b"row%09d" % i
                gone = b"row%09d" % (i - len(rows)) if i >= len(rows) else None
            else:
                row, gone = rows[i % len(rows)], None
            payload = value + str(i).encode()
            app.run(functools.partial(write, row=row, payload=payload, gone=gone))
            commits[0] += 1
            i += 1

    thread = threading.Thread(target=writer)
    thread.start()
    # Steady state starts once every cell was written: before that the store only fills up.
    while commits[0] < len(rows):
        time.sleep(0.1)
    samples: list[Size] = []
    collected = 0
    removed = 0
    gc_seconds = 0.0
    began = time.monotonic()
    try:
        while time.monotonic() - began < args.seconds:
            time.sleep(args.gc_every)
            started = time.perf_counter()
            report = operator.gc(life_time_ms=int(args.life_time * 1000), tables=[TABLE])
            gc_seconds += time.perf_counter() - started
            collected += report.cells_collected
            removed += report.dead_cells_removed
            size = measure_size(app.store, TABLE)
            size.at_s = time.monotonic() - began
            samples.append(size)
    finally:
        stop.set()
        thread.join()
    raw_rate = raw_delete_rate(app.store, max(1000, collected))
    app.close()
    operator.close()

    tenth = max(1, len(samples) // 10)
    first = statistics.median(s.cells for s in samples[:tenth])
    last = statistics.median(s.cells for s in samples[-tenth:])
    first_b = statistics.median(s.bytes for s in samples[:tenth])
    last_b = statistics.median(s.bytes for s in samples[-tenth:])
    families = len(TABLE_FAMILIES)
    print(
        f"store {url}; {args.cells} cells x {families} families"
        f"{' (churn: each commit writes a new row, deletes an old one)' if args.churn else ''}; "
        f"{commits[0]} commits in "
        f"{args.seconds:.0f} s; GC life time {args.life_time:g} s every {args.gc_every:g} s, "
        f"{len(samples)} passes; load {load_before} -> "
        f"{os.getloadavg()}"
    )
    for s in samples[:: max(1, len(samples) // 10)]:
        print(f"  t={s.at_s:6.1f} s  versions {s.cells:7d}  bytes {s.bytes:9d}")
    ratio = last / first if first else float("inf")
    ratio_b = last_b / first_b if first_b else float("inf")
    verdict = "PASS" if ratio <= 2 and ratio_b <= 2 else "MISS"
    print(
        f"P11 stored versions last/first tenth: {last:.0f}/{first:.0f} = {ratio:.2f}x; "
        f"bytes {last_b:.0f}/{first_b:.0f} = {ratio_b:.2f}x (target <= 2x): {verdict}"
    )
    gc_rate = collected / gc_seconds if gc_seconds else 0.0
    print(
        f"GC throughput: {collected} cells collected in {gc_seconds:.2f} s of GC = "
        f"{gc_rate:.0f} cells/s; raw batched delete {raw_rate:.0f} cells/s; "
        f"ratio {gc_rate / raw_rate:.3f}x; {removed} deleted cells removed entirely"
    )
    if args.json is not None:
        doc = {
            "store": url.split(":")[0],
            "cells": args.cells,
            "churn": args.churn,
            "seconds": args.seconds,
            "commits": commits[0],
            "gc_every_s": args.gc_every,
            "life_time_s": args.life_time,
            "passes": len(samples),
            "versions_first": first,
            "versions_last": last,
            "bytes_first": first_b,
            "bytes_last": last_b,
            "versions_ratio": ratio,
            "bytes_ratio": ratio_b,
            "gc_cells_per_s": gc_rate,
            "raw_delete_cells_per_s": raw_rate,
            "load_before": list(load_before),
            "load_after": list(os.getloadavg()),
        }
        args.json.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Bulk load (P8): the backfill's bulk mode against a raw batched put of the same rows.

In one Spark session (local mode by default), the same seeded Parquet input (a key and two
value columns) is loaded, each time into a fresh table, by Spark jobs with the same
parallelism:

* ``raw``: executors blind-put the rows straight into the store, ``--batch`` rows per
  ``Store.put`` (two cells per row, one version; no timestamps, no retry safety);
* ``bulk``: :func:`percolator.spark_jobs.bulk.run_bulk_load` - the input check pass, the
  fence, the bucketing sort, then the committed state of every cell (data, write record,
  lock cell) put in batches of ``--batch`` rows, and the publish;
* ``transactional``: :func:`percolator.spark_jobs.backfill.run_backfill` on the first
  ``--txn-rows`` rows (it is ~30x slower: the full input would take hours).

Reported: rows/s of each (median of ``--repeats``; whole job wall time, Spark session
already warm), bulk / raw (target >= 0.5) and transactional / raw, the Spark session's
start-up time apart, and the machine's load average.

    python bench/bulk_bench.py --rows 200000
    python bench/bulk_bench.py --store 'hbase://127.0.0.1:43025?prefix=bench_' --rows 100000
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``bench`` and the packages importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import percolator
from bench._common import print_table
from bench.spark_bench import RAW_FAMILIES, _import_packages, _make_input, _raw_partition
from bench.targets import BY_ID
from percolator.store import open_store

ROOT = Path(__file__).resolve().parent.parent


def _drop(store_url: str, *tables: str) -> None:
    with percolator.connect(store_url) as client:
        for table in tables:
            if client.store.table_exists(table):
                client.drop_table(table)


def measure(
    spark: Any,
    store_url: str,
    workdir: str,
    *,
    rows: int,
    txn_rows: int,
    batch: int,
    repeats: int,
    value_size: int,
) -> dict[str, Any]:
    from percolator.spark_jobs.backfill import run_backfill
    from percolator.spark_jobs.bulk import run_bulk_load
    from percolator.spark_jobs.prepare import BackfillOptions, ColumnMapping

    parallelism = spark.sparkContext.defaultParallelism
    source = os.path.join(workdir, "load.parquet")
    _make_input(spark, source, rows, files=2 * parallelism, value_size=value_size)
    small = os.path.join(workdir, "small.parquet")
    spark.read.parquet(source).limit(txn_rows).write.parquet(small)
    # Untimed warm-up: JVM class loading, Python workers importing the packages.
    spark.read.parquet(source).rdd.map(tuple).mapPartitions(_import_packages).collect()

    def load_options(table: str, path: str, **extra: Any) -> BackfillOptions:
        return BackfillOptions(
            store=store_url,
            table=table,
            inputs=(path,),
            key="id",
            columns=(ColumnMapping("a"), ColumnMapping("b")),
            batch_size=batch,
            progress_interval_s=3600,
            **extra,
        )

    rates: dict[str, list[float]] = {"raw": [], "bulk": [], "transactional": []}
    loads: list[tuple[float, ...]] = []
    with open_store(store_url) as store:
        for repeat in range(repeats):
            loads.append(os.getloadavg())
            table = f"bench_raw_{uuid.uuid4().hex[:10]}"
            store.create_table(table, RAW_FAMILIES)
            try:
                started = time.perf_counter()
                written = sum(
                    spark.read.parquet(source)
                    .rdd.map(tuple)
                    .mapPartitions(lambda it, t=table: _raw_partition(store_url, t, batch, it))
                    .collect()
                )
                rates["raw"].append(written / (time.perf_counter() - started))
                assert written == rows, f"raw load wrote {written} rows, expected {rows}"
            finally:
                store.drop_table(table)

            table = f"bench_bulk_{uuid.uuid4().hex[:10]}"
            try:
                started = time.perf_counter()
                report = run_bulk_load(spark, load_options(table, source, job_id=table))
                rates["bulk"].append(report.rows_written / (time.perf_counter() - started))
                assert report.rows_written == rows, f"bulk wrote {report.rows_written}"
            finally:
                _drop(store_url, table)

            table = f"bench_txn_{uuid.uuid4().hex[:10]}"
            progress = f"bench_progress_{uuid.uuid4().hex[:10]}"
            try:
                started = time.perf_counter()
                report = run_backfill(spark, load_options(table, small, progress_table=progress))
                rates["transactional"].append(report.rows_written / (time.perf_counter() - started))
                assert report.rows_written == txn_rows
            finally:
                _drop(store_url, table, progress)
            print(
                f"repeat {repeat + 1}: "
                + ", ".join(f"{name} {runs[-1]:.0f} rows/s" for name, runs in rates.items()),
                file=sys.stderr,
                flush=True,
            )
            loads.append(os.getloadavg())
    medians = {name: statistics.median(runs) for name, runs in rates.items()}
    return {
        "rows": rows,
        "txn_rows": txn_rows,
        "batch": batch,
        "rows_per_s": medians,
        "runs": rates,
        "bulk_ratio": medians["bulk"] / medians["raw"],
        "transactional_ratio": medians["transactional"] / medians["raw"],
        "target": BY_ID["P8"].threshold,
        "load_average_1m": [round(load[0], 2) for load in loads],
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--store", help="store URL (default: embedded store in a temp dir)")
    parser.add_argument("--master", default="local[*]", help="Spark master (%(default)s)")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--rows", type=int, default=100_000, help="rows loaded (%(default)s)")
    parser.add_argument(
        "--txn-rows", type=int, default=2_000, help="rows of the transactional load (%(default)s)"
    )
    parser.add_argument("--batch", type=int, default=500, help="rows per put (%(default)s)")
    parser.add_argument("--value-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)

    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p
    )
    from percolator.spark_jobs.session import build_session, parse_conf

    started = time.perf_counter()
    spark = build_session(args.master, parse_conf(args.conf), app_name="percolator-bulk-bench")
    spark.sparkContext.parallelize([0], 1).count()  # the first job starts the executors
    startup_s = time.perf_counter() - started
    with tempfile.TemporaryDirectory(prefix="bulk-bench-") as workdir:
        store_url = args.store or f"embedded:{os.path.join(workdir, 'store')}"
        results = measure(
            spark,
            store_url,
            workdir,
            rows=args.rows,
            txn_rows=args.txn_rows,
            batch=args.batch,
            repeats=args.repeats,
            value_size=args.value_size,
        )
    spark.stop()
    results.update(
        {"store": store_url.split("?")[0], "master": args.master, "spark_startup_s": startup_s}
    )
    rates = results["rows_per_s"]
    print_table(
        ["load", "rows", "rows/s", "runs", "/ raw"],
        [
            [
                name,
                str(args.txn_rows if name == "transactional" else args.rows),
                f"{rates[name]:.0f}",
                " ".join(f"{r:.0f}" for r in results["runs"][name]),
                f"{rates[name] / rates['raw']:.3f}",
            ]
            for name in ("raw", "bulk", "transactional")
        ],
    )
    print(
        f"bulk / raw = {results['bulk_ratio']:.3f} (target >= 0.5); Spark start-up "
        f"{startup_s:.1f} s (not in the rates); load average {results['load_average_1m']} "
        f"[{results['store']}, {args.batch} rows per put]"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())

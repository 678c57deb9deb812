"""Spark jobs: what transactions cost a bulk load, and what incremental processing saves.

Two measurements, in one Spark session (local mode by default):

``load``
    The same rows (a seeded Parquet input: a key and two value columns) loaded twice into
    fresh tables, each by a Spark job with the same parallelism and rows per round trip:

    * ``raw``: executors blind-put the mapped rows straight into the store in batches (one
      ``Store.put`` per batch, no transactions, no timestamps, no retry safety);
    * ``backfill``: :func:`percolator.spark_jobs.backfill.run_backfill` - the input check pass, then
      one transaction per batch with its progress marker, timestamps from the oracle.

    Reported: rows/s of each (median of ``--repeats``, whole job wall time, Spark session
    already warm) and backfill / raw.  Target: >= 0.5.

``incremental``
    A seeded corpus of the example pipeline (bench/example.py) is backfilled into
    ``documents`` and the pipeline's observers bring the derived tables up to date
    (untimed), and one untimed recompute warms the JVM.  Then, for each of ``--rounds``
    rounds, about 1 % of the documents change (the corpus's ``mutate``; written untimed,
    no worker running), and two ways of getting the derived tables right are timed:

    * ``incremental``: the notifications are processed until none is left, alternately by
      a worker with ``--threads`` runner threads (started for the round) and by the
      synchronous single-threaded drain ``percolator.observers.worker.run_until_quiet``;
    * ``recompute``: export ``documents`` at a snapshot, recompute every derived table with
      Spark (the example's recompute) and write them as Parquet.

    The two results are compared cell for cell, and with the example's reference (they must
    be identical, or the benchmark fails).  Reported: the medians over the rounds and
    recompute / incremental.  Target: >= 50.

    python bench/spark_bench.py                                  # embedded store, temp dir
    python bench/spark_bench.py --store 'hbase://127.0.0.1:9090?prefix=bench_'
    python bench/spark_bench.py --rows 50000 --docs 5000 --repeats 3 --json out.json
    python bench/spark_bench.py --only load --master 'local[4]'

Every table the benchmark creates is dropped at the end (HBase: use a ``prefix``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``bench`` and the packages importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import percolator
from bench._common import print_table
from bench.targets import BY_ID
from bench.workloads import ChangingCorpus, row_puts
from percolator.store import FamilySpec, Put, open_store

ROOT = Path(__file__).resolve().parent.parent
RAW_FAMILIES = [FamilySpec("d")]
#: how the incremental rounds process notifications, alternately: a live worker with
#: runner threads, and the synchronous single-threaded drain
#: (percolator.observers.worker.run_until_quiet)
RUNNERS = ("worker", "drain")


# --------------------------------------------------------------------------- load


def _make_input(spark: Any, path: str, rows: int, files: int, value_size: int) -> None:
    """A seeded Parquet input: ``id``, ``a`` and ``b`` (``value_size`` ASCII bytes each)."""
    rng = random.Random(42)
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"

    def value() -> str:
        return "".join(rng.choices(alphabet, k=value_size))

    data = [(f"row{rng.getrandbits(48):012x}{i:08d}", value(), value()) for i in range(rows)]
    df = spark.createDataFrame(data, "id STRING, a STRING, b STRING")
    df.repartition(files).write.parquet(path)


def _raw_partition(store_url: str, table: str, batch: int, rows: Iterable[Any]) -> Iterator[int]:
    """Blind puts of mapped rows, ``batch`` rows per call (runs on the executors)."""
    written = 0
    store = open_store(store_url)
    try:
        puts: list[Put] = []
        count = 0
        for key, a, b in rows:
            puts += row_puts(key.encode(), a.encode(), b.encode())
            count += 1
            if count == batch:
                store.put(table, puts)
                written += count
                puts, count = [], 0
        if puts:
            store.put(table, puts)
            written += count
    finally:
        store.close()
    yield written


def _import_packages(rows: Iterable[Any]) -> Iterator[int]:
    import percolator.spark_jobs.backfill  # noqa: F401 - imported for its side effect: warm workers

    yield sum(1 for _ in rows)


def measure_load(
    spark: Any,
    store_url: str,
    workdir: str,
    *,
    rows: int,
    batch: int,
    repeats: int,
    value_size: int,
) -> dict[str, Any]:
    from percolator.spark_jobs.backfill import run_backfill
    from percolator.spark_jobs.prepare import BackfillOptions, ColumnMapping

    parallelism = spark.sparkContext.defaultParallelism
    source = os.path.join(workdir, "load.parquet")
    _make_input(spark, source, rows, files=2 * parallelism, value_size=value_size)
    # Untimed: the first jobs of a JVM load classes and compile code; the Python workers
    # import the packages.  Neither belongs in a rate.
    spark.read.parquet(source).rdd.map(tuple).mapPartitions(_import_packages).collect()
    raw_rates: list[float] = []
    backfill_rates: list[float] = []
    with open_store(store_url) as store:
        for repeat in range(repeats):
            # raw: one blind batch put per `batch` rows, straight from the input partitions
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
                raw_rates.append(written / (time.perf_counter() - started))
                if written != rows:
                    raise AssertionError(f"raw load wrote {written} rows, expected {rows}")
            finally:
                store.drop_table(table)
            # backfill: the same rows through transactions, exactly once
            table = f"bench_fill_{uuid.uuid4().hex[:10]}"
            progress = f"bench_progress_{uuid.uuid4().hex[:10]}"
            try:
                started = time.perf_counter()
                report = run_backfill(
                    spark,
                    BackfillOptions(
                        store=store_url,
                        table=table,
                        inputs=(source,),
                        key="id",
                        columns=(ColumnMapping("a"), ColumnMapping("b")),
                        batch_size=batch,
                        progress_table=progress,
                        progress_interval_s=3600,
                    ),
                )
                backfill_rates.append(report.rows_written / (time.perf_counter() - started))
                if report.rows_written != rows:
                    raise AssertionError(f"backfill wrote {report.rows_written} rows")
            finally:
                for name in (table, progress):
                    if store.table_exists(name):
                        store.drop_table(name)
            print(
                f"load repeat {repeat + 1}: raw {raw_rates[-1]:.0f} rows/s, "
                f"backfill {backfill_rates[-1]:.0f} rows/s",
                file=sys.stderr,
                flush=True,
            )
    raw, fill = statistics.median(raw_rates), statistics.median(backfill_rates)
    return {
        "rows": rows,
        "batch": batch,
        "raw_rows_per_s": raw,
        "backfill_rows_per_s": fill,
        "raw_runs": raw_rates,
        "backfill_runs": backfill_rates,
        "ratio": fill / raw,
        "target": BY_ID["P8"].threshold,
    }


# --------------------------------------------------------------------------- incremental


def _quiet(client: percolator.Client, columns: Sequence[tuple[str, str]]) -> bool:
    """No notification left.  ``columns`` lists upstream observed columns before downstream
    ones: a run writes its downstream notification before its commit point and deletes its
    own after, so a scan in that order cannot miss work in flight."""
    from percolator.observers.parking import pending

    return all(not pending(client, table, [column], limit=1) for table, column in columns)


def _wait_quiet(
    client: percolator.Client, columns: Sequence[tuple[str, str]], timeout_s: float = 3600
) -> None:
    deadline = time.monotonic() + timeout_s
    while not _quiet(client, columns):
        if time.monotonic() > deadline:
            raise TimeoutError(f"observers did not reach quiescence within {timeout_s:.0f} s")
        time.sleep(0.01)


def measure_incremental(
    spark: Any,
    store_url: str,
    workdir: str,
    *,
    docs: int,
    fraction: float,
    threads: int | None,
    seed: int,
    rounds: int,
    batch_size: int = 1,
    initial_timeout_s: float = 3600,
) -> dict[str, Any]:
    from percolator.observers.worker import Worker, WorkerOptions
    from percolator.spark_jobs.backfill import run_backfill
    from percolator.spark_jobs.prepare import BackfillOptions

    from bench.example import collect_tables, reference

    documents = ChangingCorpus(docs, seed)
    source = os.path.join(workdir, "docs.jsonl")
    documents.write_jsonl(source)
    observers = documents.observers()
    # Upstream first: documents/body feeds doc_clusters/canonical.
    observed = [("documents", "body"), ("documents", "links"), ("doc_clusters", "canonical")]
    if sorted(observed) != sorted((o.table, c) for o in observers for c in o.columns):
        raise AssertionError("the pipeline's observed columns changed; update the benchmark")
    options = WorkerOptions(
        threads=threads, idle_sleep_s=0.01, backoff_base_s=0.05, batch_size=batch_size
    )
    with percolator.connect(store_url) as client:
        documents.setup(client)
        started = time.perf_counter()
        run_backfill(
            spark,
            BackfillOptions(
                store=store_url,
                table=reference.DOCUMENTS,
                inputs=(source,),
                key="url",
                progress_interval_s=3600,
            ),
        )
        worker = Worker(client, observers, options)
        worker.start()
        try:
            _wait_quiet(client, observed, initial_timeout_s)
        finally:  # also on a timeout: its threads must not outlive the client
            worker.stop()
        initial_s = time.perf_counter() - started
        print(
            f"initial load and processing of {docs} documents: {initial_s:.1f} s",
            file=sys.stderr,
            flush=True,
        )

        # One untimed recompute first: the first run of a query in a JVM spends most of its
        # time loading classes and compiling; a user's recurring batch job would not.
        _recompute_to_parquet(spark, store_url, workdir)
        incremental_runs: dict[str, list[float]] = {r: [] for r in RUNNERS}
        recompute_runs: list[float] = []
        changes_runs: list[int] = []
        changed = 0
        for round_no in range(rounds):
            changes = documents.change(client, fraction, seed + 1 + round_no)
            changed += changes
            changes_runs.append(changes)
            runner = RUNNERS[round_no % len(RUNNERS)]
            started = time.perf_counter()
            if runner == "worker":
                worker = Worker(client, documents.observers(), options)
                worker.start()
                try:
                    _wait_quiet(client, observed)
                    elapsed = time.perf_counter() - started
                finally:
                    worker.stop()
            else:
                documents.process(client)
                elapsed = time.perf_counter() - started
            incremental_runs[runner].append(elapsed)
            # Said before the checks below, which read every derived table: a figure
            # measured is kept in the log even if they fail (a gateway timeout on a large
            # table, say: give the store URL a larger timeout_ms).
            print(
                f"round {round_no + 1}: {changes} changes, incremental ({runner}) {elapsed:.2f} s",
                file=sys.stderr,
                flush=True,
            )
            incremental = reference.read_derived(client.snapshot())

            started = time.perf_counter()
            output = _recompute_to_parquet(spark, store_url, workdir)
            recompute_runs.append(time.perf_counter() - started)
            recomputed = collect_tables(spark.read.parquet(output).collect())
            problems = reference.diff(recomputed, incremental)
            if problems:
                raise AssertionError(
                    "incremental and recomputed tables differ:\n" + "\n".join(problems)
                )
            if reference.diff(documents.expected(), recomputed):
                raise AssertionError("the recompute differs from the reference")
            print(
                f"round {round_no + 1}: recompute {recompute_runs[-1]:.2f} s, identical",
                file=sys.stderr,
                flush=True,
            )
        cell_count = sum(len(c) for t in recomputed.values() for c in t.values())
    recompute_s = statistics.median(recompute_runs)
    incremental_s = {r: statistics.median(runs) for r, runs in incremental_runs.items() if runs}
    return {
        "documents": docs,
        "changes_per_round": changed / rounds,
        "rounds": rounds,
        "derived_cells": cell_count,
        "incremental_s": incremental_s,
        "recompute_s": recompute_s,
        "incremental_runs": incremental_runs,
        "recompute_runs": recompute_runs,
        #: changed documents per round, in round order (runners alternate as RUNNERS)
        "changes_runs": changes_runs,
        "ratio": {r: recompute_s / t for r, t in incremental_s.items()},
        "identical": True,
        "target": BY_ID["P7"].threshold,
    }


def _recompute_to_parquet(spark: Any, store_url: str, workdir: str) -> str:
    """Export ``documents`` at a fresh snapshot, recompute, write Parquet; the output path."""
    from percolator.spark_jobs.export import ExportOptions, export_table

    from bench.example import recompute, reference

    output = os.path.join(workdir, f"derived-{uuid.uuid4().hex[:8]}.parquet")
    export = export_table(
        spark, ExportOptions(store_url, reference.DOCUMENTS, columns=("body", "links"))
    )
    recompute(spark, export.df).write.parquet(output)
    return output


# --------------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--store", help="store URL (default: embedded store in a temp dir)")
    parser.add_argument("--master", default="local[*]", help="Spark master (%(default)s)")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--only", choices=("load", "incremental"))
    parser.add_argument("--rows", type=int, default=20_000, help="rows loaded (%(default)s)")
    parser.add_argument(
        "--batch", type=int, default=200, help="rows per round trip / transaction (%(default)s)"
    )
    parser.add_argument("--value-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--docs", type=int, default=2000, help="corpus size (%(default)s)")
    parser.add_argument("--fraction", type=float, default=0.01)
    parser.add_argument(
        "--rounds",
        type=int,
        default=4,
        help="change-then-process rounds, alternating worker and drain "
        "(medians reported; default %(default)s)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="observer runner threads (default: the worker's, by the store)",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)

    # Executors import this module's functions by name: make the repository importable.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p
    )
    from percolator.spark_jobs.session import build_session, parse_conf

    spark = build_session(args.master, parse_conf(args.conf), app_name="percolator-bench")
    results: dict[str, Any] = {"master": args.master}
    with tempfile.TemporaryDirectory(prefix="spark-bench-") as workdir:
        store_url = args.store or f"embedded:{os.path.join(workdir, 'store')}"
        results["store"] = store_url.split("?")[0]
        if args.only in (None, "load"):
            load = measure_load(
                spark,
                store_url,
                workdir,
                rows=args.rows,
                batch=args.batch,
                repeats=args.repeats,
                value_size=args.value_size,
            )
            results["load"] = load
            print_table(
                ["load", "rows/s", "runs"],
                [
                    [
                        "raw batched put",
                        f"{load['raw_rows_per_s']:.0f}",
                        " ".join(f"{r:.0f}" for r in load["raw_runs"]),
                    ],
                    [
                        "backfill",
                        f"{load['backfill_rows_per_s']:.0f}",
                        " ".join(f"{r:.0f}" for r in load["backfill_runs"]),
                    ],
                ],
            )
            print(
                f"backfill / raw = {load['ratio']:.3f} (target >= 0.5) "
                f"[{args.rows} rows, {args.batch} per batch, {results['store']}]\n"
            )
        if args.only in (None, "incremental"):
            incr = measure_incremental(
                spark,
                store_url,
                workdir,
                docs=args.docs,
                fraction=args.fraction,
                threads=args.threads,
                seed=args.seed,
                rounds=args.rounds,
            )
            results["incremental"] = incr
            rows = [
                [
                    f"incremental ({runner})",
                    f"{seconds:.2f}",
                    " ".join(f"{r:.2f}" for r in incr["incremental_runs"][runner]),
                    f"{incr['ratio'][runner]:.1f}x",
                ]
                for runner, seconds in incr["incremental_s"].items()
            ]
            rows.append(
                [
                    "full recompute (Spark)",
                    f"{incr['recompute_s']:.2f}",
                    " ".join(f"{r:.2f}" for r in incr["recompute_runs"]),
                    "",
                ]
            )
            print_table(
                [f"after changing {args.fraction:.0%}", "seconds", "runs", "recompute / this"], rows
            )
            print(
                f"target: recompute / incremental >= 50x; results identical "
                f"({incr['derived_cells']} derived cells) [{args.docs} documents, "
                f"{incr['changes_per_round']:.0f} changes per round]"
            )
        if args.store:
            with open_store(args.store) as store:
                for table in (
                    "documents",
                    "doc_clusters",
                    "doc_index",
                    "doc_inlinks",
                    "backfill_progress",
                ):
                    if store.table_exists(table):
                        store.drop_table(table)
    spark.stop()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())

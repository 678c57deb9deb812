"""``percolator backfill`` and ``percolator export``: the Spark jobs on the command line
(entry points of the ``percolator.commands`` group, see pyproject.toml).

Both run in local mode (``local[*]``) unless ``--master`` names a cluster (or the command was
started by ``spark-submit``); ``--conf KEY=VALUE`` passes any Spark setting through.
Arguments that can be checked without Spark (missing input paths, unknown format, bad
names) fail before the JVM starts.  Progress goes to stderr; the final report to stdout
(``--json`` for a machine-readable one).

Exit codes: 0 done; 2 an error of the project's tree (printed as one ``percolator: error:``
line, followed for bad rows by their counts and examples).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from percolator.command_options import (
    NON_NEGATIVE_INT,
    POSITIVE_INT,
    TIMESTAMP,
    add_oracle_option,
    add_store_option,
    float_option,
)
from percolator.errors import ConfigError, PercolatorError


def _add_spark_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--master", default=None, help="Spark master URL (default local[*], or spark-submit's)"
    )
    parser.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting, passed through (repeatable)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def _pairs(values: Sequence[str], what: str) -> dict[str, str]:
    out = {}
    for pair in values:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"{what} {pair!r} must look like KEY=VALUE")
        out[key] = value
    return out


def register_backfill(subparsers: Any) -> None:
    backfill: argparse.ArgumentParser = subparsers.add_parser(
        "backfill",
        help="load Parquet/CSV/JSON into a table with Spark, exactly once",
        description="Load rows into a table with Spark.  Transactional mode (default): one "
        "transaction per batch, with its progress marker, so a re-run (or a retried task) "
        "never writes a row twice.  Bulk mode (--mode bulk): a new or empty table is fenced "
        "and each cell's committed state is put directly at the load's timestamps, then "
        "published at once.  The whole input is checked before anything is written.",
    )
    backfill.add_argument(
        "inputs", nargs="+", metavar="INPUT", help="files, directories or URLs Spark can read"
    )
    add_store_option(backfill)
    add_oracle_option(backfill)
    backfill.add_argument("--table", required=True, help="target table (created if missing)")
    backfill.add_argument("--key", required=True, help="input column holding the row key")
    backfill.add_argument(
        "--column",
        action="append",
        default=[],
        metavar="SRC[=TARGET]",
        help="value column to store, optionally renamed (repeatable; "
        "default: every column but the key)",
    )
    backfill.add_argument(
        "--format",
        choices=("parquet", "csv", "json"),
        help="input format (default: from the file extension)",
    )
    backfill.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="Spark reader option, e.g. sep=; (repeatable)",
    )
    backfill.add_argument("--schema", help="input schema as DDL, e.g. 'id STRING, n INT'")
    backfill.add_argument(
        "--job-id", help="names the job's progress (default: derived from input, table and mapping)"
    )
    backfill.add_argument(
        "--progress-table",
        default="backfill_progress",
        help="table of progress markers (default %(default)s)",
    )
    backfill.add_argument(
        "--batch-size",
        type=POSITIVE_INT,
        help="rows per transaction (default 200); with --mode bulk, rows per put (default 500)",
    )
    backfill.add_argument(
        "--buckets", type=POSITIVE_INT, help="number of write tasks (default: from the row count)"
    )
    backfill.add_argument(
        "--max-bad-rows",
        type=NON_NEGATIVE_INT,
        help="fail if more rows than this cannot be mapped (default 0)",
    )
    backfill.add_argument(
        "--max-bad-fraction",
        type=float_option(0, 1),
        help="fail if more than this fraction of rows cannot be mapped",
    )
    backfill.add_argument(
        "--max-value-bytes",
        type=POSITIVE_INT,
        help="larger values make their row bad (default 64 MiB)",
    )
    backfill.add_argument(
        "--progress-interval",
        type=float_option(0, above=True),
        default=5.0,
        metavar="SECONDS",
        help="how often progress is printed (default %(default)s)",
    )
    backfill.add_argument(
        "--mode",
        choices=("transactional", "bulk"),
        default="transactional",
        help="transactional (default; live tables: one transaction per "
        "batch) or bulk (a new or empty table, fenced until the load is "
        "published, at the speed of batched puts)",
    )
    backfill.add_argument(
        "--no-notify",
        action="store_true",
        help="bulk mode: leave no notifications (observers will not "
        "process the loaded rows; the report says so)",
    )
    backfill.add_argument(
        "--forget",
        action="store_true",
        help="delete the progress of --job-id instead of loading (a later "
        "run then writes every row again)",
    )
    _add_spark_options(backfill)
    backfill.set_defaults(func=run_backfill_command)


def register_export(subparsers: Any) -> None:
    export: argparse.ArgumentParser = subparsers.add_parser(
        "export",
        help="write a consistent snapshot of a table to Parquet (Spark)",
        description="Read a table at one snapshot timestamp, in row ranges read in parallel, "
        "and write it as Parquet: exactly the transactions committed before the export began.",
    )
    add_store_option(export)
    add_oracle_option(export)
    export.add_argument("--table", required=True, help="table to export")
    export.add_argument("--output", required=True, help="Parquet output path or URL")
    export.add_argument(
        "--column",
        action="append",
        default=[],
        metavar="COLUMN",
        help="column to export (repeatable; default: every cell); the export fails if "
        "one has no cell at the snapshot",
    )
    export.add_argument(
        "--layout",
        choices=("wide", "cells"),
        help="one row per table row (wide, needs --column) or one per cell",
    )
    export.add_argument("--read-ts", type=TIMESTAMP, help="snapshot timestamp (default: now)")
    export.add_argument("--splits", type=POSITIVE_INT, help="row ranges (default: four per core)")
    export.add_argument(
        "--strings", action="store_true", help="decode rows and values as UTF-8 strings"
    )
    export.add_argument(
        "--mode",
        choices=("error", "overwrite"),
        default="error",
        help="if the output exists: fail (default) or overwrite",
    )
    _add_spark_options(export)
    export.set_defaults(func=run_export_command)


def _session(args: argparse.Namespace, app_name: str) -> Any:
    from percolator.spark_jobs.session import build_session, import_pyspark

    import_pyspark()
    conf = _pairs(args.conf, "--conf")
    try:
        return build_session(args.master, conf, app_name=app_name)
    except PercolatorError:
        raise
    except Exception as exc:  # the JVM did not start: no Java, bad conf, ...
        from percolator.spark_jobs.session import SparkJobError, spark_failure_reason

        raise SparkJobError(f"cannot start Spark: {spark_failure_reason(exc)}") from None


def _progress(name: str) -> Any:
    def emit(message: str) -> None:
        print(f"{name}: {message}", file=sys.stderr, flush=True)

    return emit


def run_backfill_command(args: argparse.Namespace) -> int:
    from percolator.spark_jobs.backfill import forget_job, run_backfill
    from percolator.spark_jobs.prepare import (
        BackfillOptions,
        ColumnMapping,
        check_inputs_exist,
        detect_format,
    )

    if args.no_notify and args.mode != "bulk":
        raise ConfigError("--no-notify applies to --mode bulk only")
    if args.forget:
        if not args.job_id:
            raise ConfigError("--forget needs --job-id")
        from percolator.command_options import connect_existing

        with connect_existing(args.store, args.oracle) as client:
            removed = forget_job(client, args.job_id, args.progress_table)
        print(f"removed {removed} progress rows of job {args.job_id}")
        return 0
    options = BackfillOptions(
        store=args.store,
        table=args.table,
        inputs=tuple(args.inputs),
        key=args.key,
        columns=tuple(ColumnMapping.parse(c) for c in args.column),
        format=args.format,
        reader_options=_pairs(args.option, "--option"),
        schema=args.schema,
        oracle=args.oracle,
        job_id=args.job_id,
        progress_table=args.progress_table,
        batch_size=args.batch_size,
        buckets=args.buckets,
        max_bad_rows=args.max_bad_rows,
        max_bad_fraction=args.max_bad_fraction,
        progress_interval_s=args.progress_interval,
        **({} if args.max_value_bytes is None else {"max_value_bytes": args.max_value_bytes}),
    )
    # Checked before the JVM starts (tens of seconds): a typo fails at once.
    check_inputs_exist(options.inputs)
    if options.format is None:
        detect_format(options.inputs)
    spark = _session(args, "percolator-backfill")
    if args.mode == "bulk":
        from percolator.spark_jobs.bulk import run_bulk_load

        report = run_bulk_load(
            spark, options, progress=_progress("backfill"), notify=not args.no_notify
        )
    else:
        report = run_backfill(spark, options, progress=_progress("backfill"))
    print(json.dumps(report.as_dict(), sort_keys=True) if args.json else report.summary())
    return 0


def run_export_command(args: argparse.Namespace) -> int:
    from percolator.spark_jobs.export import ExportOptions, check_output, write_export

    from percolator.layout import encode_column

    for column in args.column:
        try:
            encode_column(column)  # reserved (!...), empty, too long or not UTF-8
        except ConfigError as exc:
            raise ConfigError(f"--column: {exc}") from None
    options = ExportOptions(
        store=args.store,
        table=args.table,
        columns=tuple(args.column) or None,
        layout=args.layout,
        read_ts=args.read_ts,
        oracle=args.oracle,
        splits=args.splits,
        strings=args.strings,
    )
    from percolator.command_options import open_existing_store

    mode = "overwrite" if args.mode == "overwrite" else "errorifexists"
    check_output(args.output, mode, args.store)  # before the JVM starts
    open_existing_store(args.store).close()  # a missing store is an error, never created
    spark = _session(args, "percolator-export")
    _progress("export")(f"exporting {args.table} to {args.output}")
    report = write_export(spark, options, args.output, mode=mode)
    if args.json:
        print(json.dumps(report.__dict__, sort_keys=True))
    else:
        print(report.summary())
    return 0

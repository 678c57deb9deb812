"""Backfill: load Parquet, CSV or JSON into a table through transactions, exactly once.

    from percolator.spark_jobs.backfill import run_backfill
    from percolator.spark_jobs.prepare import BackfillOptions, ColumnMapping
    report = run_backfill(spark, BackfillOptions(
        store="hbase://zk:9090", table="documents", inputs=("s3a://bucket/docs/",),
        key="url", columns=(ColumnMapping("body"), ColumnMapping("outlinks", "links"))))

This module is the transactional mode's write pass and job record.  The options and the
input's reading, mapping and check pass, which the bulk mode (:mod:`percolator.spark_jobs.bulk`)
shares, are in :mod:`percolator.spark_jobs.prepare`, with how an input row becomes cells
and what makes a row bad.

Exactly once
------------
Rows are assigned to *buckets* by a hash of their key (CRC-32 modulo the bucket count),
sorted within the bucket by ``(key, digest of the row)``, and cut into batches of about
``batch_size`` rows (a batch never splits equal keys).  A batch is therefore identified by
``(bucket, ordinal)`` and its content depends only on the input's content - not on file
splits, partition counts, executor counts or the order Spark reads files in.

Each batch is written by one transaction that first reads the batch's *progress marker*
(a cell in the progress table, default ``backfill_progress``) and:

* marker present -> the batch was committed earlier (by a previous attempt, a Spark task
  retry, a speculative copy or an earlier run of the job): write nothing;
* marker absent -> write the batch's cells **and** the marker, and commit.

The marker and the rows commit atomically, so a batch is either fully written with its
marker or not at all.  Two attempts running the same batch at once both write the marker,
so snapshot isolation makes one of them conflict; it re-runs, sees the marker, and skips.
An undetermined commit (connection lost at the commit point) is resolved the same way: the
re-run reads the marker.  Hence every input row is written by exactly one committed
transaction, so observers of the written columns run once per row.

The bucket count and batch size are pinned in a *job record* (row ``JOB/job`` of the
progress table) on the first run, with the number of good rows and an order-independent
digest of the input.  A re-run with the same job id adopts them; if the input's digest
differs it fails before writing (the old markers would not describe the new batches).
The job id defaults to a hash of the inputs, format, table, key and mapping.

What may be retried: everything (a task, the job, with any parallelism).  What is not
undone: batches committed by a failed run stay committed; the re-run completes the rest.

Once every batch committed, the driver marks the job *done* (column ``done`` of the job
row) and then removes its batch markers (:func:`remove_batch_markers`), so a finished job
keeps only its job row.  Every batch transaction also reads ``done`` and writes nothing
once it is set, which keeps a concurrent or later run of the same job exactly once without
the markers: a batch transaction that began before ``done`` committed still sees every
marker (they all committed before ``done`` was written), or writes a marker that the
removal also writes, and so conflicts and re-runs into ``done``.  A driver that dies
between the two leaves markers that the next run of the job removes.
:func:`forget_job` removes a job's row and markers (after which a re-run would load
everything again).

Progress (rows written, rate, remaining) is reported on the driver as tasks finish.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from percolator.spark_jobs.prepare import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_PROGRESS_TABLE,
    BackfillOptions,
    BackfillReport,
    Cells,
    InjectedFailure,
    PreparedInput,
    ProgressReporter,
    bucketed,
    check_job_id,
    default_buckets,
    inject_failure,
    prepare_input,
    row_digest,
)
from percolator.spark_jobs.session import (
    SparkJobError,
    spark_failure_reason,
)

import percolator
from percolator.errors import (
    ConfigError,
    PercolatorError,
    UndeterminedCommitError,
)
from percolator.retry import Backoff, retry_transaction
from percolator.transaction import Transaction

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)


MARKER_COLUMN = "batch"
JOB_COLUMN = "job"
DONE_COLUMN = "done"
_BATCH_ATTEMPTS = 30


# --------------------------------------------------------------------------- write pass


@dataclass(frozen=True)
class _WritePlan:
    """Everything a write task needs; pickled into the tasks (no connections: each task
    opens its own)."""

    store: str
    oracle: str | None
    client_options: Mapping[str, int]
    table: str
    progress_table: str
    job_id: str
    batch_size: int
    inject: InjectedFailure | None


@dataclass
class _WriteStats:
    partition: int = 0
    rows_written: int = 0
    rows_skipped: int = 0
    batches_written: int = 0
    batches_skipped: int = 0
    duplicates: int = 0
    conflicts: int = 0
    error: str = ""


def marker_row(job_id: str, bucket: int, ordinal: int) -> bytes:
    return f"{job_id}/batch/{bucket:05d}/{ordinal:09d}".encode()


def job_row(job_id: str) -> bytes:
    return f"{job_id}/job".encode()


def _batches(
    items: Iterable[tuple[tuple[int, bytes, bytes], Cells]], batch_size: int
) -> Iterator[list[tuple[bytes, Cells]]]:
    """Cut a bucket's sorted rows into batches of at least ``batch_size`` rows (the last may
    be smaller) that never split rows of one key."""
    batch: list[tuple[bytes, Cells]] = []
    for (_, key, _), cells in items:
        if len(batch) >= batch_size and batch[-1][0] != key:
            yield batch
            batch = []
        batch.append((key, cells))
    if batch:
        yield batch


def _batch_digest(rows: Sequence[tuple[bytes, Cells]]) -> str:
    h = hashlib.sha256()
    for key, cells in rows:
        h.update(row_digest(key, cells))
    return h.hexdigest()


class _InputChanged(Exception):
    pass


def _write_batch(
    client: percolator.Client,
    plan: _WritePlan,
    marker: bytes,
    rows: Sequence[tuple[bytes, Cells]],
    stats: _WriteStats,
) -> bool:
    """Write one batch with its marker in one transaction, unless the marker shows it was
    committed already.  Returns True if this call committed it.

    Re-running the whole function is always safe, because it reads the marker first: after
    a conflict, after an undetermined commit (a re-read resolves it), after anything."""
    digest = _batch_digest(rows)
    merged: dict[bytes, dict[str, bytes]] = {}
    for key, cells in rows:
        if key in merged:
            stats.duplicates += 1
        merged.setdefault(key, {}).update(cells)
    record = json.dumps({"v": 1, "rows": len(rows), "digest": digest}, sort_keys=True).encode()

    def attempt(txn: Transaction) -> bool:
        if txn.get(plan.progress_table, job_row(plan.job_id), DONE_COLUMN) is not None:
            return False  # the job finished: every batch committed (see the module docstring)
        existing = txn.get(plan.progress_table, marker, MARKER_COLUMN)
        if existing is not None:
            if json.loads(existing).get("digest") != digest:
                raise _InputChanged(
                    f"batch {marker.decode()} was committed earlier with different rows; "
                    "the input changed since - run it as a new job (another job id)"
                )
            return False
        for key, cells in merged.items():
            for column, value in cells.items():
                txn.set(plan.table, key, column, value)
        txn.set(plan.progress_table, marker, MARKER_COLUMN, record)
        return True

    backoff = Backoff(0.01, 2.0)

    def count_conflict(n: int, exc: PercolatorError) -> None:
        stats.conflicts += 1

    for undetermined in range(1, _BATCH_ATTEMPTS + 1):
        try:
            return retry_transaction(
                client.transaction,
                attempt,
                attempts=_BATCH_ATTEMPTS,
                backoff=backoff,
                on_retry=count_conflict,
            )
        except UndeterminedCommitError as exc:
            # The commit may or may not have happened.  Re-running is safe here, and done on
            # purpose: the next attempt reads the marker and finds out (waiting out or
            # resolving our own lock if need be).
            if undetermined == _BATCH_ATTEMPTS:
                raise
            log.warning("batch %s: %s; re-checking", marker.decode(), exc)
            stats.conflicts += 1
        backoff.sleep()
    raise AssertionError("unreachable")


def _write_partition(
    plan: _WritePlan,
    progress: Any,
    partition: int,
    items: Iterable[tuple[tuple[int, bytes, bytes], Cells]],
) -> Iterator[_WriteStats]:
    stats = _WriteStats(partition=partition)
    client = percolator.connect(plan.store, oracle=plan.oracle, **plan.client_options)
    try:
        inject_failure(plan.inject, partition, 0)
        for ordinal, rows in enumerate(_batches(items, plan.batch_size)):
            marker = marker_row(plan.job_id, partition, ordinal)
            try:
                wrote = _write_batch(client, plan, marker, rows, stats)
            except _InputChanged as exc:
                stats.error = str(exc)
                break
            if wrote:
                stats.batches_written += 1
                stats.rows_written += len(rows)
            else:
                stats.batches_skipped += 1
                stats.rows_skipped += len(rows)
            progress.add(len(rows))
            inject_failure(plan.inject, partition, ordinal + 1)
    finally:
        client.close()
    yield stats


# --------------------------------------------------------------------------- job record


def _adopt_job_record(
    options: BackfillOptions, job_id: str, existing: bytes, record: dict[str, Any]
) -> dict[str, Any]:
    """The existing job record ``existing`` if this run (``record``) may resume the job;
    ConfigError naming the difference if not (other input, table, mapping or pinned
    bucket count or batch size)."""
    old: dict[str, Any] = json.loads(existing)
    if (old["rows"], old["digest"]) != (record["rows"], record["digest"]):
        raise ConfigError(
            f"backfill job {job_id!r} ran before on different input ({old['rows']} rows, "
            f"digest {old['digest'][:12]}; now {record['rows']} rows, digest "
            f"{record['digest'][:12]}): its progress markers do not describe this input. "
            "Run it as a new job (pass another job id)"
        )
    if old["table"] != record["table"] or old["mapping"] != record["mapping"]:
        raise ConfigError(
            f"backfill job {job_id!r} ran before into table {old['table']!r} with mapping "
            f"{old['mapping']}; now {record['table']!r} with {record['mapping']}"
        )
    for name in ("buckets", "batch_size"):
        asked = getattr(options, name)
        if asked is not None and asked != old[name]:
            raise ConfigError(
                f"backfill job {job_id!r} was started with {name}={old[name]}; a re-run "
                f"must use the same value (asked for {asked}), or leave it unset"
            )
    return old


def _check_job_record(
    client: percolator.Client,
    options: BackfillOptions,
    job_id: str,
    record: dict[str, Any],
) -> None:
    """Raise ConfigError if the job ran before and this run may not resume it (see
    :func:`_adopt_job_record`).  Reads only: the check that counts is the one in
    :func:`_settle_job_record`; this one refuses before the target table is created."""
    with client.snapshot() as snapshot:
        existing = snapshot.get(options.progress_table, job_row(job_id), JOB_COLUMN)
    if existing is not None:
        _adopt_job_record(options, job_id, existing, record)


def _settle_job_record(
    client: percolator.Client,
    options: BackfillOptions,
    job_id: str,
    record: dict[str, Any],
) -> dict[str, Any]:
    """Create the job record, or check the input against the existing one and adopt its
    pinned bucket count and batch size.  One transaction: two drivers starting the same job
    at once agree on one record."""
    row = job_row(job_id)

    def settle(txn: Transaction) -> dict[str, Any]:
        existing = txn.get(options.progress_table, row, JOB_COLUMN)
        if existing is None:
            txn.set(options.progress_table, row, JOB_COLUMN, json.dumps(record).encode())
            return record
        return _adopt_job_record(options, job_id, existing, record)

    return client.run(settle)


def remove_batch_markers(
    client: percolator.Client, job_id: str, progress_table: str = DEFAULT_PROGRESS_TABLE
) -> int:
    """Delete the batch markers of a job marked done (transactionally, in chunks), keeping
    its job row; returns how many were removed.  Refuses a job that is not done: its markers
    are what keeps its batches exactly once.  Idempotent."""
    check_job_id(job_id)
    with client.snapshot() as snapshot:
        done = snapshot.get(progress_table, job_row(job_id), DONE_COLUMN)
    if done is None:
        raise ConfigError(f"backfill job {job_id!r} is not done: its batch markers are needed")
    return _delete_rows(client, progress_table, f"{job_id}/batch/".encode())


def _delete_rows(client: percolator.Client, table: str, prefix: bytes) -> int:
    """Delete every row under ``prefix`` (ending in ``/``), 500 rows per transaction."""
    stop = prefix[:-1] + b"0"  # b"0" follows b"/": exactly the rows under the prefix
    removed = 0
    while True:
        with client.snapshot() as snapshot:  # released before the deletes commit
            chunk = list(itertools.islice(snapshot.scan(table, prefix, stop), 500))
        if not chunk:
            return removed

        def delete(txn: Transaction, chunk: list[tuple[bytes, dict[str, bytes]]] = chunk) -> None:
            for row, cells in chunk:
                for column in cells:
                    txn.delete(table, row, column)

        client.run(delete)
        removed += len(chunk)


def forget_job(
    client: percolator.Client, job_id: str, progress_table: str = DEFAULT_PROGRESS_TABLE
) -> int:
    """Delete a job's record and progress markers (transactionally, in chunks); returns how
    many rows were removed.  Afterwards a re-run of the job writes every row again."""
    check_job_id(job_id)
    return _delete_rows(client, progress_table, f"{job_id}/".encode())


# --------------------------------------------------------------------------- the job


def run_backfill(
    spark: SparkSession,
    options: BackfillOptions,
    *,
    progress: Callable[[str], None] | None = None,
    df: DataFrame | None = None,
) -> BackfillReport:
    """Run (or resume) a transactional backfill of ``options.inputs`` (or of ``df``); see
    the module docstring for the guarantees.

    Raises ConfigError before anything is written for bad arguments, missing or unreadable
    input, a mapping that does not fit the schema, or input that changed since an earlier
    run of the same job; :class:`BadRowsError` (nothing written) when too many rows cannot
    be mapped; :class:`SparkJobError` if the write job fails (batches committed so far stay
    committed: re-run to finish)."""
    emit = progress or (lambda message: log.info("%s", message))
    # Persisted: the write pass writes the rows the check pass mapped and counted, not a
    # second reading of the input (a file replaced in between would be written unchecked).
    prepared = prepare_input(spark, options, emit, df)
    try:
        return _write_checked(spark, options, prepared, emit)
    finally:
        prepared.rows.unpersist()


def _write_checked(
    spark: SparkSession,
    options: BackfillOptions,
    prepared: PreparedInput,
    emit: Callable[[str], None],
) -> BackfillReport:
    """The write pass of :func:`run_backfill` over the checked, persisted rows."""
    store, plan, rows, checked = prepared.store, prepared.plan, prepared.rows, prepared.checked
    job_id, report, started = prepared.job_id, prepared.report, prepared.started

    with percolator.connect(options.store, oracle=options.oracle, **options.client_options) as c:
        c.create_table(options.progress_table)
        batch_size = options.batch_size or DEFAULT_BATCH_SIZE
        wanted = {
            "v": 1,
            "table": options.table,
            "mapping": plan.fingerprint(),
            "rows": checked.good,
            "digest": checked.digest,
            "buckets": options.buckets
            or default_buckets(checked.good, batch_size, spark.sparkContext.defaultParallelism),
            "batch_size": batch_size,
        }
        # A run the job record refuses (the job ran into another table, or on other input)
        # must not leave a new empty table behind, so it is checked before the target table
        # is created; and the record is written only once the table exists, so a table that
        # cannot be created (not an engine table, being bulk-loaded) pins nothing.
        _check_job_record(c, options, job_id, wanted)
        c.create_table(options.table)
        record = _settle_job_record(c, options, job_id, wanted)
    report.buckets, report.batch_size = int(record["buckets"]), int(record["batch_size"])

    # Pass 2: bucket by key, sort, cut into batches, write each batch exactly once.
    buckets = report.buckets
    write_plan = _WritePlan(
        store=store,
        oracle=options.oracle,
        client_options=dict(options.client_options),
        table=options.table,
        progress_table=options.progress_table,
        job_id=job_id,
        batch_size=report.batch_size,
        inject=options.inject_failure,
    )

    accumulator = spark.sparkContext.accumulator(0)
    sorted_rows = bucketed(rows, buckets)
    emit(
        f"writing {checked.good} rows into {options.table} as job {job_id} "
        f"({buckets} buckets, {report.batch_size} rows per transaction)"
    )
    with ProgressReporter(accumulator, checked.good, options.progress_interval_s, emit):
        try:
            results = sorted_rows.mapPartitionsWithIndex(
                lambda index, it: _write_partition(write_plan, accumulator, index, it)
            ).collect()
        except Exception as exc:
            raise SparkJobError(
                f"backfill {job_id} failed: {spark_failure_reason(exc)}. Batches committed "
                "so far stay committed; re-run the same job to finish it"
            ) from None
    errors = [r.error for r in results if r.error]
    for result in results:
        report.rows_written += result.rows_written
        report.rows_skipped += result.rows_skipped
        report.batches_written += result.batches_written
        report.batches_skipped += result.batches_skipped
        report.duplicate_keys += result.duplicates
        report.conflicts += result.conflicts
    report.seconds = time.monotonic() - started
    if errors:
        raise SparkJobError(f"backfill {job_id} failed: {errors[0]}")
    with percolator.connect(options.store, oracle=options.oracle, **options.client_options) as c:
        done = json.dumps(
            {
                "v": 1,
                "finished_ms": int(time.time() * 1000),
                "rows": report.rows_good,
                "bad_rows": report.bad_rows,
            }
        ).encode()
        c.run(lambda txn: txn.set(options.progress_table, job_row(job_id), DONE_COLUMN, done))
        report.done = True
        report.markers_removed = remove_batch_markers(c, job_id, options.progress_table)
    emit(report.summary())
    return report

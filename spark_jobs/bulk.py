"""Bulk mode of the backfill: load a new or empty table at the speed of batched puts.

    from percolator.spark_jobs.bulk import backfill
    report = backfill("s3a://bucket/docs/", store="hbase://zk:9090", table="documents",
                      key="url", mode="bulk")
    report = backfill(df, store=..., table="documents", key="url", mode="bulk")

The whole load is **one transaction written without the two-phase commit**
(percolator/bulkload.py): the driver fences the table (state ``loading`` in the meta table,
with a lease it renews), draws the load's ``start_ts`` and ``commit_ts`` once and records
them; the executors put each cell's committed state (data, write record, committed lock
cell and, for observed columns, a notification at ``commit_ts``) in batches of plain puts;
the driver then publishes (``loading`` -> ``ready``, compare-and-set).  Until the publish
transactions refuse the table (``TableLoadingError``); afterwards they see every row.

Exactly once: the input is checked, mapped, bucketed and sorted exactly as in the
transactional mode (rows of one key always meet in one task and merge the same way), and
every cell is put at the load's timestamps, so a retried task, a speculative copy or a
re-run of a killed job (the same load id: the same timestamps) re-puts identical cells at
identical versions: each cell ends with one version per family, and observers see one
change per cell.  A re-run after the publish writes nothing and says so.

The load's state records a fingerprint of what it writes (the check pass's row count and
digest, the values the transactional mode's job record compares).  The default load id
hashes the input *paths*, so a re-run after the file at a path was replaced has the same
id: it is refused ("ran before on different input") rather than taking over the old load
(which would publish rows of both inputs) or reporting the old input's publish as its own.

Which mode when: ``bulk`` for the initial load of a table nobody uses yet (new or empty;
it is unreadable until the load is published); ``transactional`` (the default) for a table
that is live, or to add rows to one that already holds data.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from percolator.spark_jobs.backfill import run_backfill
from percolator.spark_jobs.prepare import (
    BackfillOptions,
    BackfillReport,
    Cells,
    ColumnMapping,
    InjectedFailure,
    PreparedInput,
    ProgressReporter,
    bucketed,
    default_buckets,
    inject_failure,
    prepare_input,
)
from percolator.spark_jobs.session import SparkJobError, spark_failure_reason

import percolator
from percolator.bulkload import (
    DEFAULT_LEASE_MS,
    BulkLoadError,
    CellWriter,
    LeaseCheck,
    begin_load,
    publish_load,
    release_lease,
    renew_lease,
)
from percolator.errors import ConfigError, PercolatorError
from percolator.notifications import load_observed_columns
from percolator.store import open_store
from percolator.store.base import Put
from percolator.tablestate import LoadState

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

MODES = ("transactional", "bulk")
DEFAULT_BULK_BATCH_SIZE = 500


@dataclass(frozen=True)
class _BulkPlan:
    """What a bulk write task needs (pickled into the tasks; each opens its own store)."""

    store: str
    table: str
    state: LoadState
    notify: frozenset[bytes]
    batch_size: int
    inject: InjectedFailure | None
    lease_ms: int


@dataclass
class _BulkStats:
    partition: int = 0
    rows_written: int = 0
    cells_written: int = 0
    batches: int = 0
    duplicates: int = 0


def _merged(
    items: Iterable[tuple[tuple[int, bytes, bytes], Cells]], stats: _BulkStats
) -> Iterator[tuple[bytes, dict[str, bytes]]]:
    """Rows of one key (adjacent after the sort) merged in ``(key, row digest)`` order, later
    columns winning: the same merge as the transactional mode's batches."""
    current: bytes | None = None
    cells: dict[str, bytes] = {}
    for (_, key, _), row_cells in items:
        if key == current:
            stats.duplicates += 1
            cells.update(row_cells)
            continue
        if current is not None:
            yield current, cells
        current, cells = key, dict(row_cells)
    if current is not None:
        yield current, cells


def _bulk_partition(
    plan: _BulkPlan,
    progress: Any,
    partition: int,
    items: Iterable[tuple[tuple[int, bytes, bytes], Cells]],
) -> Iterator[_BulkStats]:
    """Put the committed state of every row of one bucket, ``batch_size`` rows per call.

    One batch is in flight while the next one is built.  Idempotent: a retry puts the same
    cells at the same versions.  Before each batch the task checks that its load still
    holds the table with enough lease left (percolator.bulkload.LeaseCheck), and fails
    otherwise: a task that outlived its load writes nothing into the table's next use."""
    stats = _BulkStats(partition=partition)
    store = open_store(plan.store)
    # A store that sends each version of a put in a call of its own (Store.put_call_per_version)
    # gets a batch's three versions as three concurrent calls instead.
    split_versions = store.put_call_per_version
    pool = ThreadPoolExecutor(3 if split_versions else 1, thread_name_prefix="bulk-put")
    pending: list[Future[None]] = []
    lease = LeaseCheck(store, plan.table, plan.state, plan.lease_ms)

    def flush(puts: list[Put]) -> None:
        # One batch in flight while the next one is built.
        for future in pending:
            future.result()
        pending.clear()
        lease.check()
        if not split_versions:
            pending.append(pool.submit(store.put, plan.table, puts))
            return
        by_version: dict[int, list[Put]] = {}
        for put in puts:
            by_version.setdefault(put.version, []).append(put)
        pending.extend(pool.submit(store.put, plan.table, group) for group in by_version.values())

    try:
        inject_failure(plan.inject, partition, 0)
        writer = CellWriter(plan.state, plan.notify)
        puts: list[Put] = []
        rows = 0
        for key, cells in _merged(items, stats):
            puts += writer.puts(key, [(c.encode("utf-8"), v) for c, v in cells.items()])
            stats.cells_written += len(cells)
            rows += 1
            if rows >= plan.batch_size:
                flush(puts)
                stats.rows_written += rows
                stats.batches += 1
                progress.add(rows)
                puts, rows = [], 0
                inject_failure(plan.inject, partition, stats.batches)
        if puts:
            flush(puts)
            stats.rows_written += rows
            stats.batches += 1
            progress.add(rows)
        for future in pending:
            future.result()
    finally:
        pool.shutdown(wait=True)
        store.close()
    yield stats


class _LeaseRenewer:
    """Renews the load's lease (and GC reservation) from the driver while the job runs:
    this load's, as begun (``state``), never a load of the same id begun again since."""

    def __init__(self, store_url: str, table: str, state: LoadState, lease_ms: int) -> None:
        self._args = (store_url, table, state, lease_ms)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="bulk-lease")

    def __enter__(self) -> _LeaseRenewer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        url, table, state, lease_ms = self._args
        with open_store(url) as store:
            while not self._stop.wait(lease_ms / 3000):
                try:
                    renew_lease(store, table, state.load_id, lease_ms, start_ts=state.start_ts)
                except Exception as exc:  # keep renewing: a lapsed lease fails the whole load
                    log.warning("could not renew the lease of load %s: %s", state.load_id, exc)


def run_bulk_load(
    spark: SparkSession,
    options: BackfillOptions,
    *,
    progress: Callable[[str], None] | None = None,
    df: DataFrame | None = None,
    notify: bool = True,
    lease_ms: int = DEFAULT_LEASE_MS,
) -> BackfillReport:
    """Bulk-load ``options.inputs`` (or ``df``) into a new or empty table; see the module
    docstring.  The load id is the job id (``options.job_id`` or derived from the input).

    Raises ConfigError / BadRowsError before anything is written (bad arguments or input,
    a table that holds cells or is fenced by another load, a load id that ran before on
    different input: BulkLoadError); SparkJobError if the write job
    fails (the table stays fenced: re-run the same load to finish it); BulkLoadError if the
    publish finds cells the load did not write."""
    emit = progress or (lambda message: log.info("%s", message))
    prepared = prepare_input(spark, options, emit, df)
    try:
        return _load(spark, options, prepared, emit, notify, lease_ms)
    finally:
        prepared.rows.unpersist()


def _load(
    spark: SparkSession,
    options: BackfillOptions,
    prepared: PreparedInput,
    emit: Callable[[str], None],
    notify: bool,
    lease_ms: int,
) -> BackfillReport:
    plan, rows, checked = prepared.plan, prepared.rows, prepared.checked
    load_id, report, started = prepared.job_id, prepared.report, prepared.started
    report.mode = "bulk"
    with percolator.connect(options.store, oracle=options.oracle) as client:
        begun = begin_load(
            client.store,
            client.oracle.get_timestamp,
            options.table,
            load_id,
            lease_ms=lease_ms,
            fingerprint=checked.fingerprint(),
        )
        observed = {
            column
            for table, column in load_observed_columns(client.store)
            if table == options.table
        }
    state = begun.state
    report.load_start_ts, report.load_commit_ts = state.start_ts, state.commit_ts
    if begun.published:
        report.rows_skipped = checked.good
        report.seconds = time.monotonic() - started
        emit(f"load {load_id} was published before: nothing written")
        emit(report.summary())
        return report
    targets = [c for c in plan.targets if c in observed]
    report.notified_columns = targets if notify else []
    report.unnotified_columns = [] if notify else targets
    notify_q = frozenset(c.encode("utf-8") for c in report.notified_columns)
    batch_size = options.batch_size or DEFAULT_BULK_BATCH_SIZE
    parallelism = spark.sparkContext.defaultParallelism
    # A multiple of the cores: no last wave of tasks that leaves cores idle.
    buckets = options.buckets or parallelism * math.ceil(
        default_buckets(checked.good, batch_size, parallelism) / parallelism
    )
    report.buckets, report.batch_size = buckets, batch_size
    bulk_plan = _BulkPlan(
        store=prepared.store,
        table=options.table,
        state=state,
        notify=notify_q,
        batch_size=batch_size,
        inject=options.inject_failure,
        lease_ms=lease_ms,
    )

    accumulator = spark.sparkContext.accumulator(0)
    sorted_rows = bucketed(rows, buckets)
    emit(
        f"bulk-loading {checked.good} rows into {options.table} as load {load_id} "
        f"({buckets} buckets, {batch_size} rows per put)"
    )
    failure: str | None = None
    with (
        _LeaseRenewer(prepared.store, options.table, state, lease_ms),
        ProgressReporter(accumulator, checked.good, options.progress_interval_s, emit),
    ):
        try:
            results = sorted_rows.mapPartitionsWithIndex(
                lambda index, it: _bulk_partition(bulk_plan, accumulator, index, it)
            ).collect()
        except Exception as exc:
            failure = spark_failure_reason(exc)
    if failure is not None:
        # The renewer has stopped (the block above ended): shorten the lease, so that tasks
        # still running stop at their next lease check and the table can be dropped once
        # the short lease ran out.
        with contextlib.suppress(PercolatorError), open_store(prepared.store) as store:
            release_lease(store, options.table, state, lease_ms)
        raise SparkJobError(
            f"bulk load {load_id} failed: {failure}. The table stays fenced (unreadable); "
            "re-run the same load to finish it"
        )
    for result in results:
        # Input rows (a key given twice is two rows, merged into one table row).
        report.rows_written += result.rows_written + result.duplicates
        report.batches_written += result.batches
        report.duplicate_keys += result.duplicates
    with open_store(prepared.store) as store:
        publish_load(store, options.table, load_id, start_ts=state.start_ts)
    report.seconds = time.monotonic() - started
    emit(report.summary())
    return report


def backfill(
    source: DataFrame | str | Sequence[str],
    *,
    store: str,
    table: str,
    key: str,
    mode: str = "transactional",
    spark: SparkSession | None = None,
    columns: Sequence[ColumnMapping | str] = (),
    notify: bool = True,
    progress: Callable[[str], None] | None = None,
    **options: Any,
) -> BackfillReport:
    """Load a Spark DataFrame, or Parquet/CSV/JSON paths, into ``table``.

    ``mode``: ``"transactional"`` (default; for live tables: one transaction per batch) or
    ``"bulk"`` (new or empty tables only, at batched-put speed; see the module docstring).
    ``columns``: value columns (``"src"``, ``"src=target"`` or :class:`ColumnMapping`).
    ``notify=False`` (bulk only) leaves no notifications: observers will not process the
    loaded rows (the report names the observed columns left unnotified).
    ``options``: further :class:`BackfillOptions` fields (``job_id``, ``batch_size``, ...).
    """
    if mode not in MODES:
        raise ConfigError(f"backfill mode {mode!r} is not one of {list(MODES)}")
    if not notify and mode != "bulk":
        raise ConfigError("notify=False applies to the bulk mode only (transactions notify)")
    from pyspark.sql import DataFrame as SparkDataFrame

    mappings = tuple(c if isinstance(c, ColumnMapping) else ColumnMapping.parse(c) for c in columns)
    df: DataFrame | None = None
    if isinstance(source, SparkDataFrame):
        df = source
        inputs: tuple[str, ...] = ()
        spark = spark or source.sparkSession
    elif isinstance(source, str):
        inputs = (source,)
    else:
        inputs = tuple(source)
    if spark is None:
        from pyspark.sql import SparkSession as Session

        spark = Session.getActiveSession()
        if spark is None:
            raise ConfigError("no active SparkSession: pass spark=")
    opts = BackfillOptions(
        store=store, table=table, inputs=inputs, key=key, columns=mappings, **options
    )
    if mode == "bulk":
        return run_bulk_load(spark, opts, progress=progress, df=df, notify=notify)
    return run_backfill(spark, opts, progress=progress, df=df)


__all__ = ["MODES", "BulkLoadError", "backfill", "run_bulk_load"]

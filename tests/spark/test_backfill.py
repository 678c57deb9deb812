"""Backfill: rows land once, retries and re-runs skip what committed, observers run once."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from percolator.observers.worker import Worker, WorkerOptions, run_until_quiet
from percolator.spark_jobs.backfill import job_row, run_backfill
from percolator.spark_jobs.prepare import (
    DEFAULT_PROGRESS_TABLE,
    BackfillOptions,
    ColumnMapping,
    InjectedFailure,
    bucket_of,
)
from percolator.spark_jobs.session import SparkJobError

from percolator.errors import ConfigError
from percolator.layout import NOTIFY
from percolator.store.base import ScanOptions
from tests.spark.helpers import (
    ITEMS,
    RunCounter,
    connect,
    rows_after_failed_job,
    runs_per_row,
    table_rows,
    write_records,
)

pytestmark = pytest.mark.spark

ROWS = 240


def item_rows(count: int = ROWS, *, tag: str = "v") -> list[tuple[str, str, int]]:
    return [(f"item{i:05d}", f"{tag}{i}", i % 7) for i in range(count)]


def write_parquet(spark: Any, path: Path, rows: list[tuple[str, str, int]], files: int) -> str:
    df = spark.createDataFrame(rows, "id STRING, value STRING, rank INT")
    df.repartition(files).write.mode("overwrite").parquet(str(path))
    return str(path)


def write_json(path: Path, rows: list[tuple[str, str, int]], files: int) -> str:
    """The rows as JSON lines spread over ``files`` files of one directory (written here,
    without a Spark job: cheaper than Parquet for the tests that only need some input)."""
    path.mkdir()
    for f in range(files):
        lines = [json.dumps({"id": k, "value": v, "rank": r}) for k, v, r in rows[f::files]]
        (path / f"part-{f:03d}.json").write_text("\n".join(lines) + "\n")
    return str(path)


def options(url: str, path: str, **extra: Any) -> BackfillOptions:
    base: dict[str, Any] = {
        "store": url,
        "table": ITEMS,
        "inputs": (path,),
        "key": "id",
        "columns": (ColumnMapping("value"), ColumnMapping("rank", "rank")),
        "batch_size": 20,
        "buckets": 4,
        "client_options": {"lock_ttl_ms": 1000, "lock_wait_ms": 10_000},
        "progress_interval_s": 0.2,
        "schema": "id STRING, value STRING, rank INT",
    }
    base.update(extra)
    return BackfillOptions(**base)


def check_written_once(url: str, rows: list[tuple[str, str, int]]) -> None:
    with connect(url) as client:
        stored = table_rows(client, ITEMS)
        assert stored == {
            key.encode(): {"value": value.encode(), "rank": str(rank).encode()}
            for key, value, rank in rows
        }
        keys = [key.encode() for key, _, _ in rows]
        for column in ("value", "rank"):
            commits = write_records(client, ITEMS, keys, column)
            twice = {k: n for k, n in commits.items() if n != 1}
            assert not twice, f"cells of {column} not written exactly once: {twice}"


def test_backfill_parquet_writes_every_row_once(
    spark: Any, shared_store_url: str, tmp_path: Path
) -> None:
    rows = item_rows()
    path = write_parquet(spark, tmp_path / "in.parquet", rows, files=3)
    lines: list[str] = []
    report = run_backfill(spark, options(shared_store_url, path), progress=lines.append)
    assert (report.rows_read, report.rows_good, report.rows_written) == (ROWS, ROWS, ROWS)
    assert report.rows_skipped == 0 and report.bad_rows == 0
    assert report.batches_written >= ROWS // 20
    check_written_once(shared_store_url, rows)
    assert any("rows done" in line for line in lines) or report.seconds < 0.2
    assert "240 written" in lines[-1]
    # Done: the batch markers are gone, only the job row stays.
    assert report.done and report.markers_removed == report.batches_written
    assert progress_rows(shared_store_url) == [job_row(report.job_id)]

    # A re-run of the finished job writes nothing and skips every batch.
    again = run_backfill(spark, options(shared_store_url, path))
    assert (again.rows_written, again.rows_skipped) == (0, ROWS)
    assert again.batches_skipped == report.batches_written
    assert again.job_id == report.job_id
    assert (again.done, again.markers_removed) == (True, 0)
    check_written_once(shared_store_url, rows)
    assert progress_rows(shared_store_url) == [job_row(report.job_id)]


def progress_rows(url: str) -> list[bytes]:
    with connect(url) as client:
        return [row for row, _ in client.snapshot().scan(DEFAULT_PROGRESS_TABLE)]


def test_task_failing_on_first_attempt_is_retried_without_rewriting(
    spark: Any, embedded_url: str, tmp_path: Path
) -> None:
    rows = item_rows()
    path = write_json(tmp_path / "in", rows, files=2)
    inject = InjectedFailure(after_batches=1, action="raise", attempts=1)
    report = run_backfill(spark, options(embedded_url, path, inject_failure=inject))
    check_written_once(embedded_url, rows)
    # Every task committed one batch, failed, and its retry skipped that batch.
    assert report.batches_skipped == 4
    assert report.rows_written + report.rows_skipped == ROWS


def test_killed_python_worker_is_retried_without_rewriting(
    spark: Any, embedded_url: str, tmp_path: Path
) -> None:
    rows = item_rows()
    path = write_json(tmp_path / "in", rows, files=2)
    inject = InjectedFailure(after_batches=2, action="kill", attempts=1, partitions=(1, 2))
    report = run_backfill(spark, options(embedded_url, path, inject_failure=inject))
    check_written_once(embedded_url, rows)
    assert report.batches_skipped == 4  # two batches in each of the two killed tasks


def test_rerun_after_failed_job_writes_each_row_once_and_observers_run_once(
    spark: Any, shared_store_url: str, tmp_path: Path
) -> None:
    rows = item_rows()
    path = write_json(tmp_path / "in", rows, files=2)
    with connect(shared_store_url) as client:
        # Live observers run while the job writes: a row written twice would be seen twice.
        worker = Worker(client, [RunCounter()], WorkerOptions(threads=2, idle_sleep_s=0.02))
        worker.start()
        try:
            # Partition 0 fails on every attempt Spark allows: the job fails, the batches
            # committed by the other tasks (and by partition 0's attempts) stay committed.
            inject = InjectedFailure(after_batches=1, action="raise", attempts=4, partitions=(0,))
            with pytest.raises(SparkJobError, match="injected failure in partition 0"):
                run_backfill(spark, options(shared_store_url, path, inject_failure=inject))
            partial = rows_after_failed_job(client, ITEMS)
            assert 0 < len(partial) < ROWS
            report = run_backfill(spark, options(shared_store_url, path))
            assert report.rows_skipped == len(partial)
            assert report.rows_written + report.rows_skipped == ROWS
        finally:
            worker.stop(drain_timeout_s=10)
        run_until_quiet(client, [RunCounter()])
        check_written_once(shared_store_url, rows)
        counts = runs_per_row(client)
        assert set(counts) == {key.encode() for key, _, _ in rows}
        assert set(counts.values()) == {1}, {k: n for k, n in counts.items() if n != 1}
        leftover = list(client.store.scan(ITEMS, NOTIFY, ScanOptions()))
        assert leftover == []


def test_rerun_with_different_file_layout_still_skips_committed_batches(
    spark: Any, embedded_url: str, tmp_path: Path
) -> None:
    """Batches are defined by key, not by file splits: the same rows in other files (and
    read by other partitions) map to the same batches."""
    rows = item_rows()
    path = write_json(tmp_path / "in", rows, files=1)
    inject = InjectedFailure(after_batches=2, action="raise", attempts=4, partitions=(0, 3))
    with pytest.raises(SparkJobError):
        run_backfill(spark, options(embedded_url, path, job_id="layout", inject_failure=inject))
    with connect(embedded_url) as client:
        committed = len(rows_after_failed_job(client, ITEMS))
    assert 0 < committed < ROWS
    shutil.rmtree(path)
    write_json(tmp_path / "in", list(reversed(rows)), files=5)
    report = run_backfill(spark, options(embedded_url, path, job_id="layout"))
    assert report.rows_skipped == committed
    assert report.rows_written + report.rows_skipped == ROWS
    check_written_once(embedded_url, rows)


def test_changed_input_under_the_same_job_id_fails_before_writing(
    spark: Any, embedded_url: str, tmp_path: Path
) -> None:
    rows = item_rows(60)
    path = write_json(tmp_path / "in", rows, files=1)
    run_backfill(spark, options(embedded_url, path, job_id="same"))
    changed = [(k, v + "!", r) for k, v, r in rows]
    (tmp_path / "in" / "part-000.json").write_text(
        "".join(json.dumps({"id": k, "value": v, "rank": r}) + "\n" for k, v, r in changed)
    )
    with pytest.raises(Exception, match="ran before on different input"):
        run_backfill(spark, options(embedded_url, path, job_id="same"))
    check_written_once(embedded_url, rows)  # untouched


def test_a_job_id_reused_for_another_table_fails_without_creating_it(
    spark: Any, embedded_url: str, tmp_path: Path
) -> None:
    """The job record is checked before the target table is created: a refused run leaves
    no new empty table behind."""
    rows = item_rows(20)
    path = write_json(tmp_path / "in", rows, files=1)
    run_backfill(spark, options(embedded_url, path, job_id="J1"))
    with pytest.raises(ConfigError, match=f"ran before into table {ITEMS!r}"):
        run_backfill(spark, options(embedded_url, path, job_id="J1", table="other_items"))
    with connect(embedded_url) as client:
        assert "other_items" not in client.list_tables()
    check_written_once(embedded_url, rows)  # untouched


def test_bucket_of_is_stable() -> None:
    # CRC-32 of the key: the same on every machine and in every Python process.
    assert bucket_of(b"item00001", 4) == bucket_of(b"item00001", 4)
    assert [bucket_of(b"%d" % i, 1000) for i in range(3)] == [
        __import__("zlib").crc32(b"%d" % i) % 1000 for i in range(3)
    ]


def test_csv_and_json_inputs(spark: Any, embedded_url: str, tmp_path: Path) -> None:
    csv = tmp_path / "in.csv"
    csv.write_text("id,value,rank\na,007,1\nb,x y,2\n")
    report = run_backfill(spark, options(embedded_url, str(csv), buckets=None))
    assert report.rows_written == 2
    json_path = tmp_path / "in.jsonl"
    json_path.write_text(
        "\n".join(json.dumps({"id": f"j{i}", "value": f"w{i}", "rank": i}) for i in range(5))
    )
    report = run_backfill(spark, options(embedded_url, str(json_path), buckets=None))
    assert report.rows_written == 5
    with connect(embedded_url) as client:
        stored = table_rows(client, ITEMS)
    # CSV columns are strings, stored as written ("007" stays "007").
    assert stored[b"a"] == {"value": b"007", "rank": b"1"}
    assert stored[b"j3"] == {"value": b"w3", "rank": b"3"}

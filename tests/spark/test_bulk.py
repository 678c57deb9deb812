"""Bulk mode: one committed version per cell whatever Spark retries, a fence that refuses
transactions until the publish, observers run once per loaded row, same contents as the
transactional mode."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from percolator.observers.api import register_observers
from percolator.observers.worker import run_until_quiet
from percolator.spark_jobs.bulk import backfill, run_bulk_load
from percolator.spark_jobs.prepare import InjectedFailure
from percolator.spark_jobs.session import SparkJobError

from percolator.bulkload import TableLoadingError
from percolator.layout import DATA, LOCK, NOTIFY, WRITE
from percolator.store import open_store
from percolator.store.backends import without_url_options
from percolator.store.base import ScanOptions
from percolator.tablestate import read_state
from tests.spark.helpers import ITEMS, RUNS, RunCounter, connect, runs_per_row, table_rows
from tests.spark.test_backfill import ROWS, item_rows, options, write_json, write_parquet
from tests.spark.test_cli import JOB_MARKER, kill_marked

pytestmark = pytest.mark.spark

COLUMNS = ("value", "rank")


def expected(rows: list[tuple[str, str, int]]) -> dict[bytes, dict[str, bytes]]:
    return {k.encode(): {"value": v.encode(), "rank": str(r).encode()} for k, v, r in rows}


def check_loaded_once(url: str, rows: list[tuple[str, str, int]], table: str = ITEMS) -> None:
    """Read through a snapshot and count versions in the raw store: every cell exactly one
    data version, one write record and one notification-free committed lock cell."""
    with connect(url) as client:
        assert table_rows(client, table) == expected(rows)
        keys = [k.encode() for k, _, _ in rows]
        columns = [(f, c.encode()) for f in (DATA, WRITE) for c in COLUMNS]
        found = client.store.read_rows(table, keys, columns=columns, max_versions=1000)
        counts = {
            (key, f, q): len(found.get(key, {}).get((f, q), [])) for key in keys for f, q in columns
        }
        wrong = {cell: n for cell, n in counts.items() if n != 1}
        assert not wrong, f"cells without exactly one version: {dict(list(wrong.items())[:5])}"
        locks = sum(len(cells) for _, cells in client.store.scan(table, LOCK, ScanOptions()))
        assert locks == len(rows) * len(COLUMNS)


def test_bulk_load_of_a_dataframe_writes_every_cell_once_and_rerun_writes_nothing(
    spark: Any, shared_store_url: str
) -> None:
    rows = item_rows()
    df = spark.createDataFrame(rows, "id STRING, value STRING, rank INT").repartition(3)
    lines: list[str] = []
    report = backfill(
        df,
        store=shared_store_url,
        table=ITEMS,
        key="id",
        mode="bulk",
        batch_size=20,
        buckets=4,
        progress=lines.append,
    )
    assert (report.rows_read, report.rows_written, report.mode) == (ROWS, ROWS, "bulk")
    assert report.load_start_ts < report.load_commit_ts
    check_loaded_once(shared_store_url, rows)
    with connect(shared_store_url) as client:
        state, _ = read_state(client.store, ITEMS)
        assert state is not None and state.state == "ready" and state.load_id == report.job_id
        # The loaded cells are one ordinary commit: a transaction updates one of them.
        _, commit_ts = client.snapshot().get_with_commit_ts(ITEMS, b"item00001", "value")
        assert commit_ts == report.load_commit_ts
        client.run(lambda txn: txn.set(ITEMS, b"item00001", "value", b"new"))
        assert client.snapshot().get(ITEMS, b"item00001", "value") == b"new"
        client.run(lambda txn: txn.set(ITEMS, b"item00001", "value", b"v1"))

    again = backfill(
        df,
        store=shared_store_url,
        table=ITEMS,
        key="id",
        mode="bulk",
        batch_size=20,
        buckets=4,
        progress=lines.append,
    )
    assert (again.rows_written, again.rows_skipped, again.job_id) == (0, ROWS, report.job_id)
    assert "published before: nothing written" in "\n".join(lines)


@pytest.mark.parametrize(
    "inject",
    [
        InjectedFailure(after_batches=1, action="raise", attempts=1),
        InjectedFailure(after_batches=2, action="kill", attempts=1, partitions=(1, 2)),
    ],
    ids=["task-fails-first-attempt", "python-worker-killed"],
)
def test_retried_tasks_leave_each_cell_once(
    spark: Any, embedded_url: str, tmp_path: Path, inject: InjectedFailure
) -> None:
    rows = item_rows()
    path = write_parquet(spark, tmp_path / "in.parquet", rows, files=3)
    report = run_bulk_load(spark, options(embedded_url, path, inject_failure=inject))
    assert report.rows_written == ROWS
    check_loaded_once(embedded_url, rows)


def test_failed_job_leaves_the_table_fenced_and_a_rerun_finishes_it(
    spark: Any, embedded_url: str, tmp_path: Path
) -> None:
    rows = item_rows()
    path = write_json(tmp_path / "in", rows, files=2)
    inject = InjectedFailure(after_batches=1, action="raise", attempts=4, partitions=(0,))
    with pytest.raises(SparkJobError, match="stays fenced"):
        run_bulk_load(spark, options(embedded_url, path, inject_failure=inject))
    with connect(embedded_url) as client:
        with pytest.raises(TableLoadingError, match="being bulk-loaded"):
            client.snapshot().get(ITEMS, b"item00001", "value")
        assert any(True for _ in client.store.scan(ITEMS, DATA, ScanOptions(limit=1)))
    report = run_bulk_load(spark, options(embedded_url, path))
    assert report.rows_written == ROWS
    check_loaded_once(embedded_url, rows)


_DRIVER = textwrap.dedent(
    """
    import os, signal, sys
    from percolator.spark_jobs.session import build_session
    from percolator.spark_jobs.prepare import BackfillOptions, ColumnMapping
    from percolator.spark_jobs.bulk import run_bulk_load

    url, path = sys.argv[1], sys.argv[2]
    spark = build_session("local[2]", {"spark.default.parallelism": "2"},
                          app_name="killed-driver", log_level="ERROR")

    def progress(line):
        print(line, flush=True)
        if "rows done" in line and not line.startswith("0/"):
            os.kill(os.getpid(), signal.SIGKILL)  # the driver dies mid-load

    run_bulk_load(spark, BackfillOptions(
        store=url, table="items", inputs=(path,), key="id",
        columns=(ColumnMapping("value"), ColumnMapping("rank")), batch_size=5, buckets=8,
        schema="id STRING, value STRING, rank INT", progress_interval_s=0.02,
    ), progress=progress, lease_ms=3000)
    print("FINISHED", flush=True)
    """
)


@pytest.mark.slow
def test_killed_driver_then_rerun_leaves_each_row_once(
    spark: Any, embedded_url: str, tmp_path: Path
) -> None:
    rows = item_rows(4000)
    path = write_json(tmp_path / "in", rows, files=2)
    script = tmp_path / "driver.py"
    script.write_text(_DRIVER)
    marker = uuid.uuid4().hex
    try:
        proc = subprocess.run(
            [sys.executable, str(script), embedded_url, path],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, JOB_MARKER: marker},
        )
    finally:
        kill_marked(marker)  # the dead driver's JVM and Python workers, if any are left
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr
    assert "FINISHED" not in proc.stdout
    with connect(embedded_url) as client:
        state, _ = read_state(client.store, ITEMS)
        assert state is not None and state.state == "loading"  # died before the publish
    time.sleep(1)  # executors of the dead driver stop writing (they re-put the same cells)
    report = run_bulk_load(spark, options(embedded_url, path, buckets=8, batch_size=5))
    assert report.load_start_ts == state.start_ts and report.load_commit_ts == state.commit_ts
    check_loaded_once(embedded_url, rows)


def test_observers_process_bulk_loaded_rows_exactly_once(
    spark: Any, shared_store_url: str, tmp_path: Path
) -> None:
    rows = item_rows()
    path = write_parquet(spark, tmp_path / "in.parquet", rows, files=2)
    with connect(shared_store_url) as client:
        register_observers(client, [RunCounter()])
        client.create_table(RUNS)
        report = run_bulk_load(spark, options(shared_store_url, path))
        assert report.notified_columns == ["value"]
        notified = sum(1 for _ in client.store.scan(ITEMS, NOTIFY, ScanOptions()))
        assert notified == ROWS
        run_until_quiet(client, [RunCounter()])
        counts = runs_per_row(client)
        assert set(counts) == {k.encode() for k, _, _ in rows}
        assert set(counts.values()) == {1}
        assert list(client.store.scan(ITEMS, NOTIFY, ScanOptions())) == []
        # A re-run after success writes nothing, so it notifies nothing.
        again = run_bulk_load(spark, options(shared_store_url, path))
        assert again.rows_written == 0
        assert list(client.store.scan(ITEMS, NOTIFY, ScanOptions())) == []


def test_no_notify_is_reported(spark: Any, embedded_url: str, tmp_path: Path) -> None:
    rows = item_rows(40)
    path = write_parquet(spark, tmp_path / "in.parquet", rows, files=1)
    with connect(embedded_url) as client:
        register_observers(client, [RunCounter()])
        report = run_bulk_load(spark, options(embedded_url, path), notify=False)
        assert report.unnotified_columns == ["value"] and report.notified_columns == []
        assert "NOT notified" in report.summary()
        assert list(client.store.scan(ITEMS, NOTIFY, ScanOptions())) == []


@pytest.mark.hbase
def test_bulk_load_into_hbase_equals_the_transactional_load(
    spark: Any, hbase_store_url: str, tmp_path: Path
) -> None:
    rows = item_rows()
    rows.append(("item00003", "duplicate", 9))  # a repeated key merges the same way in both
    path = write_parquet(spark, tmp_path / "in.parquet", rows, files=3)
    from percolator.spark_jobs.backfill import run_backfill

    run_backfill(spark, options(hbase_store_url, path, table="by_txn"))
    run_bulk_load(spark, options(hbase_store_url, path, table="by_bulk"))
    # Through Thrift-1 alone each version of a batch goes in a call of its own.
    thrift1_url = without_url_options(hbase_store_url, "thrift2_port")
    with open_store(thrift1_url) as thrift1:
        assert thrift1.put_call_per_version
    run_bulk_load(spark, options(thrift1_url, path, table="by_bulk_thrift1"))
    with connect(hbase_store_url) as client:
        snapshot = client.snapshot()
        by_txn = dict(snapshot.scan("by_txn"))
        by_bulk = dict(snapshot.scan("by_bulk"))
        by_bulk_thrift1 = dict(snapshot.scan("by_bulk_thrift1"))
    assert len(by_bulk) == ROWS
    assert by_bulk == by_txn
    assert by_bulk_thrift1 == by_txn


def test_cli_bulk_mode_loads_and_no_notify_needs_it(
    spark: Any,
    embedded_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import argparse

    from percolator.spark_jobs.cli import register_backfill, run_backfill_command

    from percolator.errors import ConfigError

    rows = item_rows(30)
    path = write_json(tmp_path / "in", rows, files=1)
    parser = argparse.ArgumentParser()
    register_backfill(parser.add_subparsers())
    base = [
        path,
        "--store",
        embedded_url,
        "--table",
        ITEMS,
        "--key",
        "id",
        "--format",
        "json",
        "--column",
        "value",
        "--column",
        "rank",
        "--json",
    ]
    with pytest.raises(ConfigError, match="--no-notify applies to --mode bulk only"):
        run_backfill_command(parser.parse_args(["backfill", *base, "--no-notify"]))
    args = parser.parse_args(["backfill", *base, "--mode", "bulk", "--no-notify"])
    assert args.mode == "bulk"
    # The test session's warm Spark instead of a new JVM.
    monkeypatch.setattr("percolator.spark_jobs.cli._session", lambda args, name: spark)
    assert run_backfill_command(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["mode"], report["rows_written"]) == ("bulk", 30)
    check_loaded_once(embedded_url, [(k, v, r) for k, v, r in rows])

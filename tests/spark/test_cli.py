"""``percolator backfill`` / ``percolator export`` on the command line, and a backfill whose
whole driver (JVM and Python workers included) is SIGKILLed, then re-run."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from percolator.spark_jobs.cli import register_backfill, register_export

from percolator.cli import main
from tests.spark.helpers import ITEMS, connect, table_rows, write_records

REPO = Path(__file__).resolve().parents[2]
JOB_MARKER = "PERCOLATOR_TEST_JOB"


def write_items(path: Path, count: int) -> None:
    path.write_text(
        "".join(json.dumps({"id": f"item{i:05d}", "value": f"v{i}"}) + "\n" for i in range(count))
    )


def kill_marked(marker: str) -> None:
    """SIGKILL every process whose environment holds ``JOB_MARKER=marker``: the driver, its
    JVM and Spark's Python daemon and workers (which leave the driver's process group, and
    are re-parented if their parent dies first) - a crash of the whole job."""
    needle = f"{JOB_MARKER}={marker}".encode()
    for _ in range(3):  # again, for anything forked while the first round ran
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                with open(f"/proc/{entry}/environ", "rb") as environ:
                    if needle not in environ.read().split(b"\0"):
                        continue
                os.kill(int(entry), signal.SIGKILL)
            except (OSError, ProcessLookupError):
                continue
        time.sleep(0.2)


def test_missing_input_fails_before_spark_starts(tmp_path: Path) -> None:
    missing = tmp_path / "missing.parquet"
    started = time.monotonic()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "percolator",
            "backfill",
            str(missing),
            "--store",
            f"embedded:{tmp_path / 'store'}",
            "--table",
            ITEMS,
            "--key",
            "id",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.strip() == f"percolator: error: input path(s) not found: {missing}"
    assert result.stdout == ""
    # No JVM was started: nothing Spark-like was printed, and it was quick even here.
    assert time.monotonic() - started < 60


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        (
            ["value=!ack"],
            "value column 'value': column '!ack' is reserved: names starting with '!' belong "
            "to the engine",
        ),
        (["value=x", "id=x"], "two input columns map to table column 'x'"),
        (["value="], "column mapping 'value=' must look like SOURCE or SOURCE=TARGET"),
    ],
)
def test_bad_target_columns_fail_before_spark_starts(
    columns: list[str],
    message: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The mapping's own mistakes need no input schema: they are found before the JVM.
    def no_spark(args: argparse.Namespace, app_name: str) -> Any:
        raise AssertionError("Spark was started for a mapping that cannot work")

    monkeypatch.setattr("percolator.spark_jobs.cli._session", no_spark)
    source = tmp_path / "in.jsonl"
    write_items(source, 3)
    store = f"embedded:{tmp_path / 'store'}"
    args = ["backfill", str(source), "--store", store, "--table", ITEMS, "--key", "id"]
    for column in columns:
        args += ["--column", column]
    assert main(args) == 2
    assert capsys.readouterr().err == f"percolator: error: {message}\n"
    assert not (tmp_path / "store").exists()


def test_options_keep_the_column_mappings_they_checked() -> None:
    from percolator.spark_jobs.prepare import BackfillOptions, ColumnMapping

    mappings = (ColumnMapping(name) for name in ("a", "b"))  # an iterator, read once
    options = BackfillOptions("embedded:/nowhere", "t", ("in.csv",), "k", columns=mappings)  # type: ignore[arg-type]
    assert options.columns == (ColumnMapping("a"), ColumnMapping("b"))


def test_register_adds_both_commands() -> None:
    parser = argparse.ArgumentParser()
    subparsers = parser.add_subparsers()
    register_backfill(subparsers)
    register_export(subparsers)
    args = parser.parse_args(
        [
            "backfill",
            "in.json",
            "--table",
            "t",
            "--key",
            "k",
            "--column",
            "a=b",
            "--conf",
            "spark.x=1",
        ]
    )
    assert args.func.__name__ == "run_backfill_command"
    assert args.column == ["a=b"] and args.conf == ["spark.x=1"]
    args = parser.parse_args(["export", "--table", "t", "--output", "o"])
    assert args.func.__name__ == "run_export_command"


@pytest.mark.spark
def test_backfill_then_export_on_the_command_line(
    spark: Any, embedded_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "in.json"
    write_items(source, 30)
    code = main(
        [
            "backfill",
            str(source),
            "--store",
            embedded_url,
            "--table",
            ITEMS,
            "--key",
            "id",
            "--column",
            "value=text",
            "--batch-size",
            "7",
            "--json",
            "--master",
            "local[2,4]",
            "--job-id",
            "cli-job",
        ]
    )
    out = capsys.readouterr()
    assert code == 0, out.err
    report = json.loads(out.out)
    assert report["rows_written"] == 30 and report["job_id"] == "cli-job"
    assert "backfill: writing 30 rows into items as job cli-job" in out.err

    output = tmp_path / "out.parquet"
    code = main(
        [
            "export",
            "--store",
            embedded_url,
            "--table",
            ITEMS,
            "--column",
            "text",
            "--strings",
            "--output",
            str(output),
        ]
    )
    out = capsys.readouterr()
    assert code == 0, out.err
    assert out.out.startswith("exported 30 rows of items at read_ts ")
    rows = {r["row"]: r["text"] for r in spark.read.parquet(str(output)).collect()}
    assert rows == {f"item{i:05d}": f"v{i}" for i in range(30)}

    # The same output again: refused, one line.
    code = main(["export", "--store", embedded_url, "--table", ITEMS, "--output", str(output)])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert (
        err == f"percolator: error: export output {output} already exists; remove it or "
        "overwrite it"
    )

    # A mistyped column: one line naming it, the table and its columns; no output left.
    typo_output = tmp_path / "typo.parquet"
    typo = ["--table", ITEMS, "--column", "txet", "--output", str(typo_output)]
    code = main(["export", "--store", embedded_url, *typo])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err[-1].startswith(
        "percolator: error: export of 'items': column 'txet' has no cell in the table at "
    ), err
    assert err[-1].endswith(f"its columns: 'text'; nothing was exported ({typo_output} removed)")
    assert not typo_output.exists()

    code = main(
        [
            "backfill",
            "--forget",
            "--job-id",
            "cli-job",
            "--store",
            embedded_url,
            "--table",
            ITEMS,
            "--key",
            "id",
            str(source),
        ]
    )
    assert code == 0
    assert "removed" in capsys.readouterr().out


@pytest.mark.spark
@pytest.mark.slow
def test_killed_driver_then_rerun_writes_each_row_once(
    spark: Any, embedded_url: str, tmp_path: Path
) -> None:
    count = 3000
    source = tmp_path / "in.json"
    write_items(source, count)
    command = [
        sys.executable,
        "-m",
        "percolator",
        "backfill",
        str(source),
        "--store",
        embedded_url,
        "--table",
        ITEMS,
        "--key",
        "id",
        "--job-id",
        "crash",
        "--batch-size",
        "20",
        "--buckets",
        "12",
        "--progress-interval",
        "0.5",
        "--master",
        "local[2]",
        "--conf",
        "spark.ui.enabled=false",
    ]
    marker = uuid.uuid4().hex
    env = {**os.environ, "PYTHONPATH": str(REPO), JOB_MARKER: marker}
    proc = subprocess.Popen(
        command, cwd=REPO, env=env, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    assert proc.stderr is not None
    try:
        for line in proc.stderr:
            # Kill the whole job (driver, JVM, Python workers) once some tasks finished.
            if "rows done" in line and not line.startswith("backfill: 0/"):
                kill_marked(marker)
                break
        proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            kill_marked(marker)
    assert proc.returncode == -signal.SIGKILL
    with connect(embedded_url) as client:
        committed = len(table_rows(client, ITEMS))
    assert 0 < committed < count

    from percolator.spark_jobs.backfill import run_backfill
    from percolator.spark_jobs.prepare import BackfillOptions

    report = run_backfill(
        spark,
        BackfillOptions(
            store=embedded_url,
            table=ITEMS,
            inputs=(str(source),),
            key="id",
            job_id="crash",
            client_options={"lock_ttl_ms": 1000},
        ),
    )
    # A batch whose commit point passed before the kill is visible (rolled forward) and
    # skipped; one that had not passed it was rolled back and is written now.
    assert report.rows_skipped == committed
    assert report.rows_written + report.rows_skipped == count
    with connect(embedded_url) as client:
        assert len(table_rows(client, ITEMS)) == count
        keys = [f"item{i:05d}".encode() for i in range(count)]
        assert set(write_records(client, ITEMS, keys, "value").values()) == {1}

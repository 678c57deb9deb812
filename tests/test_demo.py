"""``percolator demo`` end to end: the README's first command, run as users run it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from docpipeline import reference

import percolator
from percolator.store import open_store
from percolator.store.backends import with_table_prefix

ROOT = Path(__file__).resolve().parent.parent
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def demo(*args: str, cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PERCOLATOR_")}
    return subprocess.run(
        [sys.executable, "-m", "percolator", "demo", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def check_run(result: subprocess.CompletedProcess[str], store_url: str | None) -> dict[str, Any]:
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary: dict[str, Any] = json.loads(result.stdout)
    assert summary["identical"] is True and summary["matches_reference"] is True
    assert summary["changes"] >= 2 and summary["observer_runs_live"] >= summary["changes"]
    assert summary["incremental_s"] > 0 and summary["recompute_s"] > 0
    per_change = summary["incremental_s"] / summary["changes"]
    expected = summary["recompute_s"] / (per_change * summary["documents"])
    assert abs(summary["break_even_fraction"] - expected) < 1e-9
    assert "break-even change fraction" in result.stderr
    steps = [step["name"] for step in summary["steps"]]
    assert steps == [
        "oracle",
        "generate corpus",
        "Spark backfill",
        "observers to quiescence",
        "incremental update",
        "Spark full recompute",
        "compare",
    ]
    assert "summary" in result.stderr and "result: OK" in result.stderr
    # Independently of what the demo says: the stored derived tables equal the reference
    # recomputed here from the stored documents.
    with percolator.connect(store_url or summary["store"]) as client, client.snapshot() as snap:
        documents = reference.read_documents(snap)
        derived = reference.read_derived(snap)
    assert len(documents) == 200
    assert reference.diff(reference.compute(documents), derived) == []
    return summary


@pytest.mark.spark
def test_demo_on_the_embedded_default(tmp_path: Path) -> None:
    result = demo("--documents", "200", "--json", "--work-dir", str(tmp_path / "out"), cwd=tmp_path)
    summary = check_run(result, None)
    chart = Path(summary["chart"])
    assert chart.read_bytes()[:8] == PNG_MAGIC and chart.stat().st_size > 10_000
    assert summary["store"].startswith(f"embedded:{tmp_path / 'out'}")
    assert summary["oracle"].startswith("grpc://127.0.0.1:")
    # The live step printed updates with their latency.
    assert "updated" in result.stderr and "ms after its change" in result.stderr


@pytest.mark.spark
@pytest.mark.hbase
def test_demo_on_hbase(tmp_path: Path, hbase_url: str) -> None:
    store = with_table_prefix(hbase_url, f"demo{uuid.uuid4().hex[:8]}_")
    result = demo(
        "--documents",
        "200",
        "--json",
        "--store",
        store,
        "--work-dir",
        str(tmp_path / "out"),
        "--chart",
        str(tmp_path / "chart.png"),
        cwd=tmp_path,
    )
    try:
        summary = check_run(result, store)
        assert summary["store"] == store
        assert (tmp_path / "chart.png").read_bytes()[:8] == PNG_MAGIC
        # A second run on the same store refuses to touch the existing tables.
        again = demo("--store", store, "--work-dir", str(tmp_path / "out"), cwd=tmp_path)
        assert again.returncode == 2
        assert "already has demo tables" in again.stderr
    finally:
        s = open_store(store)
        for table in s.list_tables():
            s.drop_table(table)
        s.close()


def test_demo_bad_configuration_is_one_clear_line(tmp_path: Path) -> None:
    result = demo("--bogus", cwd=tmp_path)
    assert result.returncode == 2 and "unrecognized arguments: --bogus" in result.stderr
    result = demo("--store", "hbase://127.0.0.1:1", "--work-dir", str(tmp_path), cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "percolator: error: cannot reach HBase Thrift gateway at 127.0.0.1:1: connection refused"
    )
    result = demo("--oracle", "grpc://127.0.0.1:1", "--work-dir", str(tmp_path), cwd=tmp_path)
    assert result.returncode == 2
    assert "no timestamp oracle among ['127.0.0.1:1'] answered" in result.stderr
    for option, value, message in (
        ("--change-fraction", "2", "expected a finite number in (0, 1]"),
        ("--change-fraction", "nan", "'nan' is not finite"),
        ("--documents", "5", "expected an integer >= 10"),
        ("--threads", "0", "expected an integer >= 1"),
    ):
        result = demo(option, value, cwd=tmp_path)
        assert result.returncode == 2 and f"argument {option}: " in result.stderr, result.stderr
        assert message in result.stderr, result.stderr

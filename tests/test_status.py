"""``percolator status``: a scenario with a stuck lock, pending, parked and unobserved
notifications, a GC run and an oracle record, read back by the real CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from percolator.observers.api import Observer, register_observers
from percolator.observers.parking import ParkingLot
from percolator.observers.runner import Notification

import percolator
from percolator import notifications
from percolator.committer import Committer
from percolator.layout import NOTIFY
from percolator.store import open_store
from percolator.store.backends import with_table_prefix
from percolator.store.base import Put
from percolator.transaction import Transaction

ROOT = Path(__file__).resolve().parent.parent


class Watcher(Observer):
    name = "status-watcher"
    table = "docs"
    columns = ("body",)

    def process(self, txn: Transaction, row: bytes, column: str) -> None:
        raise AssertionError("not run in this test")


def status(store_url: str, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PERCOLATOR_")}
    return subprocess.run(
        [sys.executable, "-m", "percolator", "status", "--store", store_url, *extra],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def make_scenario(store_url: str) -> dict[str, Any]:
    """Write the state the report must show; returns what the test expects."""
    os.environ["PERCOLATOR_OBSERVED_REFRESH_MS"] = "100"  # registration waits this long
    try:
        client = percolator.connect(store_url, lock_ttl_ms=300)
        client.create_table("docs")
        client.create_table("other")
        register_observers(client, [Watcher()])
        for i in range(3):
            with client.transaction() as txn:
                txn.set("docs", f"d{i}", "body", b"text")
        gc = client.gc(life_time_ms=0)
        # A lock left behind by a client that died between prewrite and commit.
        stuck = client.transaction()
        stuck.set("other", b"\xff\x00binary", "c", b"v")
        committer = Committer(client._ctx, stuck.start_ts, list(stuck._writes.values()))
        committer.prewrite_all()
        committer._stop_heartbeat()  # the client "dies": nothing extends the lock any more
        # One notification parked after repeated failures (d0), one on a column nobody
        # watches; and d1 parked at an older change, so its newer one is pending.
        [d0] = [n for n in notifications.pending(client.store, "docs") if n.row == b"d0"]
        ParkingLot(client).park("status-watcher", d0, 5, "boom")
        ParkingLot(client).park("status-watcher", Notification("docs", b"d1", "body", 1), 5, "x")
        client.store.put("other", [Put(b"x", NOTIFY, b"c", 1, b"1")])
        client.close()
    finally:
        del os.environ["PERCOLATOR_OBSERVED_REFRESH_MS"]
    time.sleep(0.5)  # the stuck lock outlives its 300 ms TTL
    return {"safe_point": gc.safe_point, "stuck_start_ts": stuck.start_ts}


def check_report(report: dict[str, Any], expected: dict[str, Any]) -> None:
    locks = report["locks"]
    assert locks["count"] == 1 and locks["expired"] == 1
    (lock,) = locks["oldest"]
    assert lock["table"] == "other" and lock["row"] == "0x" + b"\xff\x00binary".hex()
    assert lock["start_ts"] == expected["stuck_start_ts"] and lock["expired"] is True
    assert sum(locks["by_age"].values()) == 1
    (observed,) = report["notifications"]["observers"]
    assert observed == {
        "observer": "status-watcher",
        "table": "docs",
        "column": "body",
        "pending": 2,
        "parked": 2,
        "live_workers": 0,
    }
    assert report["notifications"]["unobserved"] == [
        {"table": "other", "column": "c", "pending": 1}
    ]
    # One scan per table of its notify family: the parked cell keeps its notification.
    scans = {scan["table"]: scan for scan in report["notifications"]["scans"]}
    assert {t: scan["notifications"] for t, scan in scans.items()} == {"docs": 3, "other": 1}
    assert all(0 <= scan["seconds"] < 60 for scan in scans.values())
    record = report["oracle"]["record"]
    # Written by the in-process oracle (servers hold epochs >= 1 and leases).
    assert record is not None and record["holder"].startswith("local:")
    assert record["limit"] >= expected["stuck_start_ts"]
    assert report["gc"]["safe_point"] == expected["safe_point"] > 0
    problems = " ".join(report["problems"])
    assert "1 expired lock" in problems
    assert "2 parked notification(s) of observer 'status-watcher'" in problems
    assert "other/c, which no observer is registered for" in problems


def test_status_reports_locks_notifications_oracle_and_gc(tmp_path: Path) -> None:
    url = f"embedded:{tmp_path / 'store'}"
    expected = make_scenario(url)
    result = status(url, "--json")
    assert result.returncode == 1, result.stderr  # problems found
    check_report(json.loads(result.stdout), expected)

    text = status(url)
    assert text.returncode == 1
    assert "locks: 1 held, 1 expired" in text.stdout
    assert "status-watcher" in text.stdout
    assert "2 pending, 2 parked, no live worker runs it" in text.stdout
    assert "EXPIRED other/0xff0062696e617279/c" in text.stdout
    assert "notify scans: 4 notification(s) in " in text.stdout

    only_docs = json.loads(status(url, "--json", "--table", "docs").stdout)
    assert only_docs["locks"]["count"] == 0 and only_docs["tables"] == ["docs"]


def test_status_of_a_healthy_store_exits_0(tmp_path: Path) -> None:
    url = f"embedded:{tmp_path / 'store'}"
    with percolator.connect(url) as client:
        client.create_table("t")
        with client.transaction() as txn:
            txn.set("t", b"r", "c", b"v")
    result = status(url, "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["problems"] == [] and report["locks"]["count"] == 0


def test_status_asks_a_live_oracle_server(tmp_path: Path) -> None:
    from tests.oracle.procs import OracleProcess

    url = f"embedded:{tmp_path / 'store'}"
    server = OracleProcess(url, tmp_path / "oracle.log").start()
    try:
        result = status(url, "--json", "--oracle", f"grpc://{server.address}")
    finally:
        server.stop()
    assert result.returncode == 0, result.stdout + result.stderr
    oracle = json.loads(result.stdout)["oracle"]
    (answer,) = oracle["servers"]
    assert answer["role"] == "active" and answer["epoch"] >= 1
    assert oracle["record"]["epoch"] == answer["epoch"] and oracle["record"]["lease_live"]


def test_status_bad_inputs_are_one_line(tmp_path: Path) -> None:
    url = f"embedded:{tmp_path / 'store'}"
    result = status("hbase://127.0.0.1:1")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "percolator: error: cannot reach HBase Thrift gateway at 127.0.0.1:1: connection refused"
    ]
    result = status(url, "--oldest", "-1")
    assert result.returncode == 2 and "argument --oldest: '-1' is out of range" in result.stderr
    percolator.connect(url).close()  # status never creates a store: make an empty one
    result = status(url, "--table", "nope")
    assert result.returncode == 2 and "no such percolator table 'nope'" in result.stderr
    # An unreachable oracle is a problem in the report, not a crash.
    result = status(url, "--json", "--oracle", "grpc://127.0.0.1:1")
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    assert "error" in report["oracle"]["servers"][0]
    assert any("no active oracle" in p for p in report["problems"])


@pytest.mark.hbase
def test_status_on_hbase(hbase_url: str) -> None:
    url = with_table_prefix(hbase_url, f"st{uuid.uuid4().hex[:8]}_")
    expected = make_scenario(url)
    result = status(url, "--json")
    assert result.returncode == 1, result.stderr
    check_report(json.loads(result.stdout), expected)
    store = open_store(url)
    for table in store.list_tables():
        store.drop_table(table)
    store.close()

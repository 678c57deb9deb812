"""The worker roster (observers/roster.py) and what ``percolator status`` shows of it: each
running worker with its observers, threads, scanners, batch size and key groups; a worker
that stopped gracefully is gone, one that vanished is listed as not seen, and a record of a
worker gone long ago is deleted when a worker starts."""

from __future__ import annotations

import json
import os
from pathlib import Path

from percolator.observers import roster
from percolator.observers.roster import WorkerRecord

import percolator
from percolator.layout import META_FAMILY, META_TABLE, ensure_meta_table
from percolator.store.base import Put
from tests.observers import helpers
from tests.observers.conftest import connect
from tests.observers.procs import WorkerProcess, run_cli


def record(worker_id: str, seen_ms: int, **changes: object) -> WorkerRecord:
    fields: dict[str, object] = {
        "worker_id": worker_id,
        "host": "gone-host",
        "pid": 4242,
        "observers": ("run-logger",),
        "threads": 4,
        "scanners": 1,
        "batch_size": 32,
        "partitioned": False,
        "key_groups": None,
        "started_ms": seen_ms - 60_000,
        "seen_ms": seen_ms,
    }
    fields.update(changes)
    return WorkerRecord(**fields)  # type: ignore[arg-type]


def test_records_round_trip_age_and_are_forgotten_when_old(
    memory_client: percolator.Client,
) -> None:
    store = memory_client.store
    ensure_meta_table(store)
    now = roster.now_ms()
    fresh = record("fresh", now - 1_000, partitioned=True, key_groups=16)
    quiet = record("quiet", now - roster.LIVE_MS - 1)
    ancient = record("ancient", now - roster.FORGET_MS - 1)
    for each in (fresh, quiet, ancient):
        roster.publish(store, each)
    store.put(META_TABLE, [Put(b"worker/broken", META_FAMILY, b"w", 1, b"{not json")])

    entries = {e.record.worker_id: e for e in roster.read_roster(store, at_ms=now)}
    assert set(entries) == {"fresh", "quiet", "ancient"}  # the malformed one left out
    assert entries["fresh"].record == fresh and entries["fresh"].live
    assert entries["fresh"].age_ms == 1_000
    assert not entries["quiet"].live and not entries["ancient"].live

    assert roster.forget_old(store, list(entries.values())) == 1
    roster.remove(store, fresh)
    assert [e.record.worker_id for e in roster.read_roster(store)] == ["quiet"]


def test_status_lists_running_workers_and_the_ones_not_seen(
    shared_store_url: str, plugin_dir: Path, tmp_path: Path
) -> None:
    url = shared_store_url
    client = connect(url)
    helpers.create_tables(client)
    ensure_meta_table(client.store)
    now = roster.now_ms()
    roster.publish(client.store, record("crashed", now - 120_000))
    roster.publish(client.store, record("long-gone", now - roster.FORGET_MS - 60_000))
    worker = WorkerProcess(
        url,
        ["run-logger"],
        tmp_path / "worker.log",
        plugin_dir=plugin_dir,
        threads=2,
        extra_args=["--batch", "5", "--scanners", "2", "--partitioned", "--key-groups", "8"],
    )
    try:
        worker.wait_ready()
        result = run_cli(["status", "--store", url, "--json"], plugin_dir)
        assert result.returncode == 0, result.stdout + result.stderr
        report = json.loads(result.stdout)
        workers = {w["worker_id"]: w for w in report["workers"]}
        (logger,) = report["notifications"]["observers"]
        assert (logger["observer"], logger["live_workers"]) == ("run-logger", 1)
        (running,) = [w for w in workers.values() if w["pid"] == worker.proc.pid]
        assert running["live"] is True and running["seen_ago_ms"] < roster.LIVE_MS
        assert (running["threads"], running["scanners"], running["batch_size"]) == (2, 2, 5)
        assert running["observers"] == ["run-logger"] and running["partitioned"] is True
        assert running["key_groups"] == 8  # the only worker leases every group
        assert running["host"] == os.uname().nodename
        assert workers["crashed"]["live"] is False
        assert "long-gone" not in workers  # deleted when the worker started
        assert len(workers) == 2

        text = run_cli(["status", "--store", url], plugin_dir)
        assert "workers: 1 live, 1 not seen" in text.stdout, text.stdout
        assert "threads 2, scanners 2, batch 5, key groups 8; seen" in text.stdout
        assert "crashed (pid 4242): run-logger; threads 4" in text.stdout
        assert "NOT SEEN for 2 min" in text.stdout
        assert worker.terminate() == 0, worker.output()
    finally:
        worker.kill()
    # A graceful stop removes the worker's own record.
    after = json.loads(run_cli(["status", "--store", url, "--json"], plugin_dir).stdout)
    assert [w["worker_id"] for w in after["workers"]] == ["crashed"]
    (logger,) = after["notifications"]["observers"]
    assert logger["live_workers"] == 0  # the crashed worker's record is not live
    client.close()

"""Bulk mode re-run under the same load id after the input changed: refused, never merged.

The default load id names the input *paths*, not their content, so a load that failed
part-way and is re-run after the file at the same path was replaced would otherwise take
the old load over and publish rows of both inputs.  The load's state records a fingerprint
of what it writes (the check pass's row count and digest, as the transactional job record),
and a take-over or a "published before" re-run with another fingerprint is refused."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from percolator.spark_jobs.bulk import run_bulk_load
from percolator.spark_jobs.prepare import InjectedFailure
from percolator.spark_jobs.session import SparkJobError

from percolator.bulkload import (
    BulkLoadError,
    TableLoadingError,
    begin_load,
    publish_load,
)
from percolator.layout import DATA
from percolator.store import open_store
from percolator.store.base import ScanOptions, Store
from percolator.tablestate import LoadState, read_state
from percolator.timestamps import now_ms
from percolator.watermark import _decode_load
from tests.spark.helpers import ITEMS, connect
from tests.spark.test_backfill import item_rows, options, write_json
from tests.spark.test_bulk import check_loaded_once

OLD = "240 rows, digest " + "a" * 64
NEW = "120 rows, digest " + "b" * 64


def test_begin_load_refuses_the_same_load_id_with_another_fingerprint(embedded_url: str) -> None:
    store = open_store(embedded_url)
    with connect(embedded_url) as client:
        ts = client.oracle.get_timestamp
        first = begin_load(store, ts, ITEMS, "load-1", fingerprint=OLD).state
        assert first.fingerprint == OLD and first.commit_ts > 0
        _, raw = read_state(store, ITEMS)
        assert raw is not None
        # The watermark's own decoding of the state row still finds the load.
        assert _decode_load(raw) is not None
        with pytest.raises(BulkLoadError, match="ran before on different input") as refused:
            begin_load(store, ts, ITEMS, "load-1", fingerprint=NEW)
        assert "drop the table" in str(refused.value).lower()
        assert read_state(store, ITEMS)[1] == raw  # not taken over: nothing changed
        # The same input takes the load over as before (same timestamps).
        again = begin_load(store, ts, ITEMS, "load-1", fingerprint=OLD).state
        assert (again.start_ts, again.commit_ts, again.fingerprint) == (
            first.start_ts,
            first.commit_ts,
            OLD,
        )
        assert publish_load(store, ITEMS, "load-1").fingerprint == OLD
        assert begin_load(store, ts, ITEMS, "load-1", fingerprint=OLD).published
        with pytest.raises(BulkLoadError, match="ran before on different input"):
            begin_load(store, ts, ITEMS, "load-1", fingerprint=NEW)
        # A caller that gives no fingerprint is not checked (as before).
        assert begin_load(store, ts, ITEMS, "load-1").published
    store.close()


def test_a_state_recorded_without_a_fingerprint_is_taken_over_and_then_checked(
    embedded_url: str,
) -> None:
    store = open_store(embedded_url)
    with connect(embedded_url) as client:
        ts = client.oracle.get_timestamp
        # A load begun without a fingerprint (as by a version before the check): the record
        # has the earlier format exactly, and reads back with the fingerprint unknown.
        begin_load(store, ts, ITEMS, "load-1")
        state, raw = read_state(store, ITEMS)
        assert state is not None and raw is not None
        assert "fingerprint" not in json.loads(raw) and state.fingerprint == ""
        # Unknown is accepted (the earlier behaviour), and the take-over records ours...
        assert begin_load(store, ts, ITEMS, "load-1", fingerprint=NEW).state.fingerprint == NEW
        # ...so from then on another input is refused.
        with pytest.raises(BulkLoadError, match="ran before on different input"):
            begin_load(store, ts, ITEMS, "load-1", fingerprint=OLD)
    store.close()


def _raw_cells(store: Store) -> int:
    return sum(len(cells) for _, cells in store.scan(ITEMS, DATA, ScanOptions()))


def _quiet(url: str, quiet_s: float = 1.0, timeout_s: float = 60.0) -> None:
    """Wait until the failed job's remaining tasks stopped putting (Spark reports the job
    failed without waiting for its other running tasks)."""
    deadline = time.monotonic() + timeout_s
    with open_store(url) as store:
        count = _raw_cells(store)
        while time.monotonic() < deadline:
            time.sleep(quiet_s)
            again = _raw_cells(store)
            if again == count:
                return
            count = again
    raise AssertionError("the failed job kept writing")


def _state(url: str) -> LoadState:
    with open_store(url) as store:
        state, _ = read_state(store, ITEMS)
    assert state is not None
    return state


@pytest.mark.spark
def test_rerun_on_changed_input_under_the_same_load_id_is_refused(
    spark: Any, embedded_url: str, tmp_path: Path
) -> None:
    v1 = item_rows(240, tag="old")
    v2 = item_rows(120, tag="new")  # corrected: half the rows, other values
    path = write_json(tmp_path / "in", v1, files=2)
    inject = InjectedFailure(after_batches=1, action="raise", attempts=4, partitions=(0,))
    with pytest.raises(SparkJobError, match="stays fenced"):
        run_bulk_load(spark, options(embedded_url, path, inject_failure=inject), lease_ms=4000)
    _quiet(embedded_url)
    fenced = _state(embedded_url)
    assert fenced.state == "loading"
    # The failed job shortened its lease to a quarter (1 s): the table can be dropped soon.
    assert fenced.lease_expires_ms <= now_ms() + 1000

    # The same command (same paths: the same load id) after the file was replaced.
    shutil.rmtree(path)
    write_json(tmp_path / "in", v2, files=2)
    with pytest.raises(BulkLoadError, match="ran before on different input") as refused:
        run_bulk_load(spark, options(embedded_url, path))
    assert "drop the table" in str(refused.value).lower()
    assert _state(embedded_url) == fenced  # not taken over, nothing published
    with connect(embedded_url) as client:
        with pytest.raises(TableLoadingError):
            client.snapshot().get(ITEMS, b"item00001", "value")
        # What the message says to do: drop the table (once the lease has run out), then
        # the load starts afresh.
        time.sleep(max(0, fenced.lease_expires_ms - now_ms()) / 1000 + 0.01)
        client.drop_table(ITEMS)
    report = run_bulk_load(spark, options(embedded_url, path))
    assert report.rows_written == 120
    check_loaded_once(embedded_url, v2)

    # After the publish: the input changes again, and the re-run must not claim it was
    # "published before" - it was not, this input.
    shutil.rmtree(path)
    write_json(tmp_path / "in", v1, files=2)
    lines: list[str] = []
    with pytest.raises(BulkLoadError, match="ran before on different input"):
        run_bulk_load(spark, options(embedded_url, path), progress=lines.append)
    assert not any("nothing written" in line for line in lines)
    check_loaded_once(embedded_url, v2)
    # The input it was published from still re-runs as "published before".
    shutil.rmtree(path)
    write_json(tmp_path / "in", v2, files=2)
    again = run_bulk_load(spark, options(embedded_url, path), progress=lines.append)
    assert (again.rows_written, again.rows_skipped) == (0, 120)
    assert "published before: nothing written" in "\n".join(lines)


def test_old_format_state_row_is_readable() -> None:
    doc = {
        "v": 1,
        "state": "loading",
        "load_id": "l",
        "start_ts": 5,
        "commit_ts": 0,
        "lease_expires_ms": 7,
        "created": "yes",
    }
    state = LoadState.decode(json.dumps(doc).encode())
    assert state.fingerprint == ""
    assert json.loads(state.encode()) == doc  # re-encoded without the unknown fingerprint

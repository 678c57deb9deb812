"""A finished backfill job keeps only its job row: its batch markers are removed once it is
done, and no batch is written again, by a later run or by one that raced the removal.

No Spark here: the batch transactions are the ones the write tasks run."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from percolator.spark_jobs.backfill import (
    DONE_COLUMN,
    MARKER_COLUMN,
    _write_batch,
    _WritePlan,
    _WriteStats,
    job_row,
    marker_row,
    remove_batch_markers,
)

import percolator
from percolator.errors import ConfigError, ConflictError
from tests.spark.helpers import write_records

PROGRESS = "progress"


@pytest.fixture
def driver(local_store_url: str) -> Iterator[percolator.Client]:
    with percolator.connect(local_store_url) as c:
        c.create_table("items")
        c.create_table(PROGRESS)
        yield c


def plan(url: str) -> _WritePlan:
    return _WritePlan(url, None, {}, "items", PROGRESS, "job", 2, None)


def progress_rows(client: percolator.Client) -> list[bytes]:
    return [row for row, _ in client.snapshot().scan(PROGRESS)]


def mark_done(client: percolator.Client) -> None:
    client.run(lambda txn: txn.set(PROGRESS, job_row("job"), DONE_COLUMN, b"{}"))


ROWS = [(b"a", (("v", b"1"),)), (b"b", (("v", b"2"),))]


def test_a_done_job_keeps_only_its_job_row_and_writes_no_batch_again(
    driver: percolator.Client, local_store_url: str
) -> None:
    client = driver
    marker = marker_row("job", 0, 0)
    assert _write_batch(client, plan(local_store_url), marker, ROWS, _WriteStats())
    assert not _write_batch(client, plan(local_store_url), marker, ROWS, _WriteStats())
    with pytest.raises(ConfigError, match="not done"):
        remove_batch_markers(client, "job", PROGRESS)
    mark_done(client)
    assert remove_batch_markers(client, "job", PROGRESS) == 1
    assert progress_rows(client) == [job_row("job")]
    assert remove_batch_markers(client, "job", PROGRESS) == 0  # idempotent
    # Without its marker the batch is still known to be committed: the job is done.
    assert not _write_batch(client, plan(local_store_url), marker, ROWS, _WriteStats())
    assert write_records(client, "items", [b"a", b"b"], "v") == {b"a": 1, b"b": 1}


def test_a_batch_transaction_racing_the_end_of_the_job_conflicts(
    driver: percolator.Client, local_store_url: str
) -> None:
    client = driver
    """A second run's batch transaction that began before the first run committed that
    batch, marked the job done and removed the markers saw neither the marker nor ``done``;
    its marker write conflicts, and its retry finds the job done."""
    marker = marker_row("job", 0, 0)
    late = client.transaction()
    assert late.get(PROGRESS, job_row("job"), DONE_COLUMN) is None
    assert late.get(PROGRESS, marker, MARKER_COLUMN) is None
    assert _write_batch(client, plan(local_store_url), marker, ROWS, _WriteStats())
    mark_done(client)
    remove_batch_markers(client, "job", PROGRESS)
    # What the batch transaction writes when it saw neither (backfill._write_batch).
    for key, cells in ROWS:
        for column, value in cells:
            late.set("items", key, column, value)
    late.set(PROGRESS, marker, MARKER_COLUMN, b"{}")
    with pytest.raises(ConflictError):
        late.commit()
    assert not _write_batch(client, plan(local_store_url), marker, ROWS, _WriteStats())
    assert write_records(client, "items", [b"a", b"b"], "v") == {b"a": 1, b"b": 1}
    assert progress_rows(client) == [job_row("job")]

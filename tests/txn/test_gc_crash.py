"""A garbage-collection pass killed (SIGKILL) at each of its steps leaves nothing that the
next pass cannot collect, judged from the raw cells afterwards.

The workload leaves, in two tables: cells overwritten several times, cells deleted for
good, a deleted cell with a rolled-back write on top, a cell only ever rolled back, a
transaction committed at its primary whose secondary lock stayed, and a cell deleted and
written again.  A separate process runs ``Client.gc`` and is killed at one step; a full pass
then runs here, and the raw store must hold exactly what one uninterrupted pass leaves.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

import percolator
from percolator import failpoints
from percolator.layout import DATA, LOCK, WRITE, commit_index_qualifier
from percolator.records import LockCell
from percolator.store import open_store

STEPS = ["gc.after_safe_point", "gc.after_versions", "gc.before_lock_cells", "gc.after_table"]
TABLES = ("a", "b")

# The pass killed at a step: a process of its own, on the same store.  One clock on these
# test stores, so lock cells may go as soon as they are older than the store's clock reading.
GC_PROCESS = """
import sys
import percolator
from percolator.store import open_store
store = open_store(sys.argv[1])
store.stamp_skew_ms = 0
with percolator.connect(store) as client:
    client.gc(life_time_ms=0)
"""


def _workload(client: percolator.Client) -> dict[tuple[str, bytes], bytes | None]:
    """Write the workload; returns the value every touched cell must read afterwards."""
    expected: dict[tuple[str, bytes], bytes | None] = {}
    for table in TABLES:
        for i in range(3):
            client.run(lambda t, i=i, tb=table: t.set(tb, b"overwritten", "c", b"v%d" % i))
        expected[table, b"overwritten"] = b"v2"
        client.run(lambda t, tb=table: t.set(tb, b"deleted", "c", b"v"))
        client.run(lambda t, tb=table: t.delete(tb, b"deleted", "c"))
        expected[table, b"deleted"] = None
        client.run(lambda t, tb=table: t.set(tb, b"back", "c", b"v"))
        client.run(lambda t, tb=table: t.delete(tb, b"back", "c"))
        client.run(lambda t, tb=table: t.set(tb, b"back", "c", b"again"))
        expected[table, b"back"] = b"again"
        client.run(lambda t, tb=table: t.delete(tb, b"rolled-back", "c"))
        _roll_back_a_write(client, table, b"rolled-back")
        expected[table, b"rolled-back"] = None
        _roll_back_a_write(client, table, b"never")
        expected[table, b"never"] = None
    # Committed at a/half, its secondary b/half left locked for GC to roll forward.
    failpoints.enable("commit.after_primary", "raise")
    try:
        with client.transaction() as txn:
            txn.set("a", b"half", "c", b"x")
            txn.set("b", b"half", "c", b"y")
    except failpoints.FailpointError:
        pass
    finally:
        failpoints.disable()
    expected["a", b"half"] = b"x"
    expected["b", b"half"] = b"y"
    return expected


def _roll_back_a_write(client: percolator.Client, table: str, row: bytes) -> None:
    failpoints.enable("commit.before_primary", "raise")
    try:
        txn = client.transaction()
        txn.set(table, row, "c", b"never")
        with pytest.raises(failpoints.FailpointError):
            txn.commit()
    finally:
        failpoints.disable()


def _raw(store: percolator.Store, table: str) -> dict[bytes, dict[str, int]]:
    """Versions per protocol family of every row's cell ``c``, and its commit-index entries."""
    rows = {row for family in (LOCK, WRITE, DATA) for row, _ in store.scan(table, family)}
    columns = {
        LOCK: (LOCK, b"c"),
        WRITE: (WRITE, b"c"),
        DATA: (DATA, b"c"),
        "index": (WRITE, commit_index_qualifier(b"c")),
    }
    found = {}
    for row in rows:
        cells = store.read_row(table, row, columns=list(columns.values()), max_versions=1000)
        found[row] = {name: len(cells.get(column, [])) for name, column in columns.items()}
    return found


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("backend", ["embedded", pytest.param("hbase", marks=pytest.mark.hbase)])
def test_gc_killed_at_a_step_leaves_nothing_uncollectable(
    backend: str, step: str, request: pytest.FixtureRequest
) -> None:
    url = request.getfixturevalue("embedded_url" if backend == "embedded" else "hbase_store_url")
    store = open_store(url)
    store.stamp_skew_ms = 0
    client = percolator.connect(store, lock_ttl_ms=200)
    try:
        for table in TABLES:
            client.create_table(table)
        expected = _workload(client)
        time.sleep(0.3)  # the secondary lock's TTL lapses; lock cells older than the clock
        client.publish_min_start_ts()  # "no live reader here" now, not at the next renewal

        env = {**os.environ, failpoints.ENV_VAR: f"{step}=crash"}
        killed = subprocess.run(
            [sys.executable, "-c", GC_PROCESS, url], env=env, capture_output=True, timeout=120
        )
        assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()[-2000:]

        report = client.gc(life_time_ms=0)

        assert report.locks_orphaned == 0
        for (table, row), value in expected.items():
            assert client.snapshot().get(table, row, "c") == value, (table, row)
        for table in TABLES:
            raw = _raw(store, table)
            for row, families in raw.items():
                # What one uninterrupted pass leaves: a live cell keeps its lock cell (its
                # latest commit), at most one write record (a primary whose committer died
                # right after the commit point has none: its lock cell holds the commit)
                # and one data version; a dead cell, nothing.
                assert families[WRITE] <= 1, (step, table, row, families)
                assert {**families, WRITE: 1} == {LOCK: 1, WRITE: 1, DATA: 1, "index": 0}, (
                    step,
                    table,
                    row,
                    families,
                )
                lock_cell = store.read_row(table, row, columns=[(LOCK, b"c")])[(LOCK, b"c")]
                assert LockCell.decode(lock_cell[0][1]).lock is None
            live = {row for (tb, row), value in expected.items() if tb == table and value}
            assert set(raw) == live, (step, table)
    finally:
        client.close()
        store.close()

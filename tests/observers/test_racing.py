"""Racing worker processes (R6): several ``percolator worker`` processes with many threads on
the same notifications.  Each change commits at most one observer run, counted from the
run rows committed with the acks; after quiescence every ack covers its cell's latest write.
The first worker runs one notification per transaction (``--batch 1``), the others the
default batches, so single runs race with batches as well as with each other.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

from tests.observers import helpers
from tests.observers.conftest import connect
from tests.observers.helpers import EVENTS, MIRROR, runs
from tests.observers.procs import WorkerProcess, wait_quiet

# (workers, threads each, cells, rounds of writes) per backend
SCALE = {"embedded": (3, 6, 30, 8), "hbase": (2, 4, 12, 4)}


def test_racing_workers_commit_at_most_one_run_per_change(
    shared_store_url: str, plugin_dir: Path, tmp_path: Path
) -> None:
    workers_n, threads, cells_n, rounds = SCALE[
        "hbase" if shared_store_url.startswith("hbase") else "embedded"
    ]
    client = connect(shared_store_url)
    helpers.create_tables(client)
    observers = ["run-logger", "mirror", "mirror-logger"]
    workers = [
        WorkerProcess(
            shared_store_url,
            observers,
            tmp_path / f"worker{i}.log",
            plugin_dir=plugin_dir,
            threads=threads,
            extra_args=["--scanners", "2", *(["--batch", "1"] if i == 0 else [])],
            env={helpers.SLEEP_ENV: "5"},  # runs overlap more
        )
        for i in range(workers_n)
    ]
    try:
        for worker in workers:
            worker.wait_ready()
        rng = random.Random(7)
        rows = [b"cell%03d" % i for i in range(cells_n)]
        for round_ in range(rounds):
            for start in range(0, cells_n, 5):
                with client.transaction() as txn:
                    for row in rows[start : start + 5]:
                        txn.set(EVENTS, row, "value", b"v%d" % round_)
                        if rng.random() < 0.3:
                            txn.set(EVENTS, row, "chain", b"c%d" % round_)
            time.sleep(rng.uniform(0, 0.2))
        wait_quiet(client, [EVENTS, MIRROR], workers=workers)
        metrics = [w.metrics() for w in workers]
        for worker in workers:
            assert worker.terminate() == 0, worker.output()
    finally:
        for worker in workers:
            worker.kill()

    snapshot = client.snapshot()
    covered = runs(snapshot)
    assert set(covered) == set(rows)
    for prefix in (b"log:", b"chain:", b"mirror:"):
        assert helpers.duplicate_runs(runs(snapshot, prefix)) == []
    assert helpers.uncovered(client, "run-logger", EVENTS, "value", rows) == []
    assert helpers.uncovered(client, "mirror", EVENTS, "chain", rows) == []
    mirrored = sorted(runs(snapshot, b"chain:"))
    assert helpers.uncovered(client, "mirror-logger", MIRROR, "value", mirrored) == []
    # The workers did race: some runs found the change already acknowledged by another
    # worker, or lost the ack conflict to it.
    raced = sum(
        value
        for m in metrics
        for key, value in m.items()
        if key.startswith(("percolator_observer_skipped_total", "percolator_observer_conflicts"))
    )
    committed = sum(
        value
        for m in metrics
        for key, value in m.items()
        if key.startswith("percolator_observer_runs_total")
    )
    assert committed == sum(
        len(v) for p in (b"log:", b"chain:", b"mirror:") for v in runs(snapshot, p).values()
    )
    assert raced > 0
    client.close()

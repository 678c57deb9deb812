"""Workers killed with SIGKILL at random moments (R6): the example pipeline's derived tables
end up equal, byte for byte, to a from-scratch computation over the same documents.

Each trial loads a seeded corpus and then changes it while two worker processes run the
pipeline; meanwhile workers are killed at random moments - some by SIGKILL from the test,
some by a ``crash`` failpoint at an observer step (before the commit, between commit and
cleanup, right after the engine's commit point) - and restarted.  After quiescence the
stored tables are compared with docpipeline/reference.py over the documents as stored, and
those documents with the ones the test wrote.

The workers scan at random (each scans everything) running one notification per
transaction (``--batch 1``), partitioned (key groups leased with a short lease, each worker
reading only its groups' notifications; a killed worker's groups move when its lease ends;
the worker's default batches), or at random running up to 8 notifications per transaction
(batched).  Default runs a few trials; ``-m slow`` runs many.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
from docpipeline import corpus, pipeline, reference

from tests.observers.conftest import connect
from tests.observers.procs import WorkerProcess, wait_quiet

OBSERVERS = ["doc-clusters", "doc-index", "doc-inlinks"]
CRASH_POINTS = [
    "observer.before_commit",
    "observer.after_commit",
    "observer.before_cleanup",
    "commit.after_primary",
    "prewrite.after_primary",
]
TRIALS = (
    [pytest.param(seed, "random", id=f"trial{seed}") for seed in range(2)]
    + [pytest.param(2, "partitioned", id="partitioned-trial2")]
    + [
        pytest.param(seed, "random", id=f"trial{seed}", marks=pytest.mark.slow)
        for seed in range(3, 14)
    ]
    + [
        pytest.param(seed, "partitioned", id=f"partitioned-trial{seed}", marks=pytest.mark.slow)
        for seed in range(14, 20)
    ]
    + [pytest.param(20, "batched", id="batched-trial20")]
    + [
        pytest.param(seed, "batched", id=f"batched-trial{seed}", marks=pytest.mark.slow)
        for seed in range(21, 27)
    ]
)
# Partitioned workers: a short lease, so a killed worker's groups move within a second or two.
PARTITIONED = ("--partitioned", "--key-groups", "16", "--lease-ms", "1500")
MODE_ARGS = {"random": ("--batch", "1"), "partitioned": PARTITIONED, "batched": ("--batch", "8")}


def _start(
    url: str, log: Path, rng: random.Random, plugin_dir: Path, mode: str, *, crash: bool = True
) -> WorkerProcess:
    env = {}
    if crash and rng.random() < 0.5:
        point = rng.choice(CRASH_POINTS)
        env["PERCOLATOR_FAILPOINTS"] = f"{point}=count:{rng.randint(1, 40)}:crash"
    return WorkerProcess(
        url, OBSERVERS, log, plugin_dir=plugin_dir, threads=4, env=env, extra_args=MODE_ARGS[mode]
    )


@pytest.mark.parametrize(("seed", "mode"), TRIALS)
def test_killed_workers_leave_the_derived_tables_exact(
    shared_store_url: str, plugin_dir: Path, tmp_path: Path, seed: int, mode: str
) -> None:
    small = shared_store_url.startswith("hbase")
    rng = random.Random(seed)
    client = connect(shared_store_url)
    pipeline.create_tables(client)
    docs = corpus.generate(40 if small else 60, seed=seed)
    batches: list[list[corpus.Change | corpus.Document]] = [list(docs)]
    current = list(docs)
    for round_ in range(2 if small else 3):
        changes = corpus.mutate(current, fraction=0.2, seed=seed * 100 + round_)
        batches.append(list(changes))
        current = corpus.apply_changes(current, changes)

    logs = iter(tmp_path / f"worker{i}.log" for i in range(1000))
    workers = [_start(shared_store_url, next(logs), rng, plugin_dir, mode) for _ in range(2)]
    kills = 0
    try:
        for worker in workers:
            worker.wait_ready()
        for batch in batches:
            for start in range(0, len(batch), 10):
                corpus.write_documents(client, batch[start : start + 10], batch=5)
                time.sleep(rng.uniform(0, 0.3))
                for i, worker in enumerate(workers):
                    if not worker.alive():  # a crash failpoint fired
                        kills += 1
                        workers[i] = _start(shared_store_url, next(logs), rng, plugin_dir, mode)
                if rng.random() < 0.5:
                    i = rng.randrange(len(workers))
                    workers[i].kill()
                    kills += 1
                    workers[i] = _start(shared_store_url, next(logs), rng, plugin_dir, mode)
        # Let the workers get into the backlog, then one last kill in the middle of it.
        time.sleep(rng.uniform(0.2, 1.0))
        for worker in workers:
            worker.kill()
        kills += len(workers)
        workers = [
            _start(shared_store_url, next(logs), rng, plugin_dir, mode, crash=False)
            for _ in range(2)
        ]
        for worker in workers:
            worker.wait_ready()
        wait_quiet(client, pipeline.TABLES, timeout=300, workers=workers)
        for worker in workers:
            assert worker.terminate() == 0, worker.output()
    finally:
        for worker in workers:
            worker.kill()

    assert kills >= 2
    snapshot = client.snapshot()
    stored_input = reference.read_documents(snapshot)
    assert stored_input == corpus.as_input(current)
    expected = reference.compute(stored_input)
    actual = reference.read_derived(snapshot)
    assert reference.diff(expected, actual) == []
    assert actual == expected
    client.close()

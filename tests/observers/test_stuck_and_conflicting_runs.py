"""Runs that never end and runs that never get through (observers/processor.py): a run
longer than ``run_timeout_s`` makes the worker unhealthy and is logged once; a cell whose
runs keep conflicting is logged at each tenfold of its streak."""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable

import pytest
from percolator.observers.api import Observer
from percolator.observers.options import WorkerOptions
from percolator.observers.processor import _tenfold_crossed
from percolator.observers.worker import Worker

import percolator
from percolator.errors import ConflictError
from percolator.transaction import Transaction
from tests.observers import helpers
from tests.observers.helpers import EVENTS, runs
from tests.observers.test_observer_base_exception import healthz, write

FAST = WorkerOptions(
    threads=2,
    idle_sleep_s=0.01,
    housekeeping_s=0.05,
    metrics_port=0,
)


class Hangs(Observer):
    """Watches ``obs_events/hang``: waits for ``release`` on the value ``hang``, else logs."""

    name = "hangs"
    table = EVENTS
    columns = ("hang",)

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()

    def setup(self, client: percolator.Client) -> None:
        helpers.create_tables(client)

    def process(self, txn: Transaction, row: bytes, column: str) -> None:
        if txn.get(EVENTS, row, column) == b"hang":
            self.entered.set()
            self.release.wait(60)
        helpers.log_run(txn, EVENTS, row, column, prefix=b"hang:")


class AlwaysConflicts(Observer):
    """Raises a retryable ConflictError itself on every run."""

    name = "always-conflicts"
    table = EVENTS
    columns = ("conflict",)

    def setup(self, client: percolator.Client) -> None:
        helpers.create_tables(client)

    def process(self, txn: Transaction, row: bytes, column: str) -> None:
        raise ConflictError("made up by the observer")


def test_a_run_past_the_run_timeout_makes_the_worker_unhealthy_until_it_ends(
    local_client: percolator.Client,
    start_worker: Callable[..., Worker],
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = local_client
    observer = Hangs()
    worker = start_worker([observer], dataclasses.replace(FAST, run_timeout_s=0.3))
    write(client, "hang", {b"stuck": b"hang"})
    assert observer.entered.wait(20)
    assert worker.health() is None  # not yet past the timeout
    helpers.wait_for(lambda: worker.health() is not None, timeout=20, what="unhealthy")
    why = worker.health()
    assert why is not None and "observer hangs has run on obs_events/b'stuck'/hang" in why
    status, body = healthz(worker)
    assert status == 503 and "run timeout 0.3 s" in body
    # The other thread still runs other cells meanwhile.
    write(client, "hang", {b"fine": b"x"})
    helpers.wait_for(lambda: b"fine" in runs(client.snapshot(), b"hang:"), timeout=20)
    helpers.wait_for(
        lambda: any("restart the worker" in r.getMessage() for r in caplog.records),
        timeout=20,
        what="the stuck run logged",
    )
    logged = [r for r in caplog.records if "restart the worker" in r.getMessage()]
    assert len(logged) == 1 and logged[0].levelno == logging.ERROR
    observer.release.set()
    helpers.wait_for(lambda: worker.health() is None, timeout=20, what="healthy again")
    helpers.wait_for(lambda: b"stuck" in runs(client.snapshot(), b"hang:"), timeout=20)


def test_no_run_timeout_when_it_is_zero(
    local_client: percolator.Client, start_worker: Callable[..., Worker]
) -> None:
    observer = Hangs()
    worker = start_worker([observer], dataclasses.replace(FAST, run_timeout_s=0))
    write(local_client, "hang", {b"stuck": b"hang"})
    assert observer.entered.wait(20)
    assert worker.processor.stuck_runs() == [] and worker.health() is None
    observer.release.set()


@pytest.mark.parametrize("attempts", [1, 3])
def test_a_cell_that_conflicts_without_end_is_logged_at_each_tenfold(
    local_client: percolator.Client,
    start_worker: Callable[..., Worker],
    caplog: pytest.LogCaptureFixture,
    attempts: int,
) -> None:
    options = dataclasses.replace(FAST, threads=1, conflict_backoff_s=0, attempts=attempts)
    worker = start_worker([AlwaysConflicts()], options)
    write(local_client, "conflict", {b"r": b"x"})
    helpers.wait_for(
        lambda: any("100 conflicts in a row" in r.getMessage() for r in caplog.records),
        timeout=60,
        what="the streak logged",
    )
    [logged] = [r for r in caplog.records if "conflicts in a row" in r.getMessage()]
    message = logged.getMessage()
    assert "always-conflicts" in message and "made up by the observer" in message
    # Logged when the streak reached 100 conflicts (the metric counts each of them), not
    # 100 runs of ``attempts`` conflicts each.
    counted = worker.metrics.conflicts.value(observer="always-conflicts")
    assert counted >= 100, counted
    assert worker.health() is None  # conflicts are retried, not a failure of the worker


def test_tenfold_crossed() -> None:
    assert [_tenfold_crossed(b, a) for b, a in [(0, 1), (97, 100), (99, 102), (100, 103)]] == [
        1,
        100,
        100,
        0,
    ]
    assert _tenfold_crossed(98, 1001) == 1000


def test_a_stuck_batch_is_named_as_a_batch(
    local_client: percolator.Client, start_worker: Callable[..., Worker]
) -> None:
    observer = Hangs()
    options = dataclasses.replace(FAST, threads=1, run_timeout_s=0.2, batch_size=8)
    worker = start_worker([observer], options)
    write(local_client, "hang", {b"a1": b"x", b"a2": b"x", b"zz": b"hang"})
    assert observer.entered.wait(20)
    helpers.wait_for(lambda: worker.health() is not None, timeout=20, what="unhealthy")
    why = worker.health() or ""
    assert "a batch of 3 cells" in why or "obs_events/b'zz'/hang" in why, why
    observer.release.set()
    helpers.wait_for(lambda: worker.health() is None, timeout=20, what="healthy again")


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0])
def test_durations_must_be_finite_and_not_negative(value: float) -> None:
    from percolator.errors import ConfigError

    with pytest.raises(ConfigError, match="run_timeout_s must be a finite number >= 0"):
        WorkerOptions(run_timeout_s=value)

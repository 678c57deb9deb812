"""Observer code that raises a BaseException that is not an Exception (``SystemExit`` from a
plugin calling ``sys.exit()``, a ``KeyboardInterrupt`` raised by code in a run thread): it
is a failure of that cell like any other (counted, logged, parked after the limit) and the
run threads, the other rows and the other observers go on (observers/processor.py).  Only a
real Ctrl-C - a ``KeyboardInterrupt`` in the main thread - propagates.  A worker thread that
dies anyway is logged and makes ``/healthz`` answer 503 (observers/worker.py)."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable

import pytest
from percolator.observers.api import Observer
from percolator.observers.options import WorkerOptions
from percolator.observers.parking import ParkingLot, pending
from percolator.observers.processor import NotificationProcessor
from percolator.observers.worker import Worker
from percolator.observers.worker_metrics import WorkerMetrics

import percolator
from percolator.notifications import Notification
from percolator.transaction import Transaction
from tests.observers import helpers
from tests.observers.helpers import EVENTS, runs

FAST = WorkerOptions(
    failure_limit=3,
    backoff_base_s=0.01,
    backoff_max_s=0.05,
    idle_sleep_s=0.01,
    housekeeping_s=0.1,
    parked_refresh_s=0.2,
    metrics_port=0,
)

GOOD = [b"good%d" % i for i in range(6)]
BAD = b"bad"


class _Quit(BaseException):
    """A BaseException of the observer's own, neither Exception nor SystemExit."""


class Quits(Observer):
    """Watches ``obs_events/exit``: raises ``raising`` (a BaseException) on the value
    ``bad``, else logs the run (prefix ``exit:``)."""

    name = "quits"
    table = EVENTS
    columns = ("exit",)

    def __init__(self, raising: Callable[[], BaseException] = lambda: SystemExit("gave up")):
        self.raising = raising

    def setup(self, client: percolator.Client) -> None:
        helpers.create_tables(client)

    def process(self, txn: Transaction, row: bytes, column: str) -> None:
        if txn.get(EVENTS, row, column) == b"bad":
            raise self.raising()
        helpers.log_run(txn, EVENTS, row, column, prefix=b"exit:")


def wait_for(condition: Callable[[], object], what: str = "") -> None:
    helpers.wait_for(condition, timeout=20, what=what)


def healthz(worker: Worker) -> tuple[int, str]:
    url = f"http://127.0.0.1:{worker.metrics_port}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def write(client: percolator.Client, column: str, values: dict[bytes, bytes]) -> list[Notification]:
    """Write ``values`` in one transaction; returns their notifications (what a scanner
    would offer once the column is registered)."""
    with client.transaction() as txn:
        for row, value in values.items():
            txn.set(EVENTS, row, column, value)
    assert txn.commit_ts is not None
    return [Notification(EVENTS, row, column, txn.commit_ts) for row in values]


@pytest.mark.parametrize(
    ("threads", "raising"),
    [
        (1, lambda: SystemExit("gave up")),
        (4, lambda: SystemExit("gave up")),
        (4, lambda: KeyboardInterrupt("raised by code, not by Ctrl-C")),
        (2, lambda: _Quit("quit")),
    ],
    ids=["SystemExit-1-thread", "SystemExit-4-threads", "KeyboardInterrupt-4-threads", "other"],
)
def test_an_observer_raising_a_base_exception_fails_its_cell_and_the_worker_goes_on(
    local_client: percolator.Client,
    start_worker: Callable[..., Worker],
    caplog: pytest.LogCaptureFixture,
    threads: int,
    raising: Callable[[], BaseException],
) -> None:
    client = local_client
    options = dataclasses.replace(FAST, threads=threads)
    worker = start_worker([Quits(raising), helpers.RunLogger()], options)
    lot = ParkingLot(client)
    # The bad cell first (alone: every re-offer of it meets a run thread), then one
    # transaction of good and bad ones (a batch that raises, run again one by one).
    write(client, "exit", {BAD: b"bad"})
    time.sleep(0.3)
    write(client, "exit", {row: b"x" for row in GOOD})
    write(client, "value", {row: b"y" for row in [*GOOD, BAD]})

    wait_for(lambda: len(lot.records()) == 1, what="the bad cell parked")
    [record] = lot.records()
    assert (record.observer, record.row, record.column) == ("quits", BAD, "exit")
    assert record.failures == options.failure_limit
    assert type(raising()).__name__ in record.last_error
    assert worker.metrics.failures.value(observer="quits") == options.failure_limit
    assert worker.metrics.parked.value(observer="quits") == 1
    # Every healthy cell of both observers ran, once.
    wait_for(
        lambda: (
            set(runs(client.snapshot(), b"exit:")) == set(GOOD)
            and set(runs(client.snapshot(), b"log:")) == {*GOOD, BAD}
        ),
        what="the healthy runs",
    )
    assert helpers.uncovered(client, "quits", EVENTS, "exit", GOOD) == []
    assert helpers.uncovered(client, "run-logger", EVENTS, "value", [*GOOD, BAD]) == []
    # The failures were logged with the observer and the cell.
    failed = [
        r.getMessage() for r in caplog.records if "observer quits failed on" in r.getMessage()
    ]
    assert failed and all("bad" in message for message in failed)
    # The run threads are alive and the worker healthy; only the parked notification is
    # left, and nothing stays in flight.
    assert [t.is_alive() for t in worker._runners] == [True] * threads
    assert worker.health() is None
    assert healthz(worker) == (200, "ok\n")
    wait_for(lambda: not worker.processor._inflight, what="nothing in flight")
    wait_for(
        lambda: [r for r, _, _ in pending(client, EVENTS, ["exit", "value"])] == [BAD],
        what="only the parked notification left",
    )
    # And later changes still run.
    write(client, "exit", {b"later": b"x"})
    write(client, "value", {b"later": b"y"})
    wait_for(
        lambda: (
            b"later" in runs(client.snapshot(), b"exit:")
            and b"later" in runs(client.snapshot(), b"log:")
        ),
        what="later runs",
    )


def test_a_batch_with_a_system_exit_in_the_test_thread_fails_only_that_cell(
    memory_client: percolator.Client,
) -> None:
    """Driven in this (main) thread, as the pool would: SystemExit is a failure here too;
    the batch is run again one by one and the others commit."""
    client = memory_client
    observer = Quits()
    metrics = WorkerMetrics(dict, dict)
    pool = NotificationProcessor(
        client,
        {(EVENTS, "exit"): observer},
        WorkerOptions(failure_limit=5, backoff_base_s=60),
        metrics,
        ParkingLot(client),
        stopping=threading.Event(),
        abort=threading.Event(),
    )
    for notification in write(client, "exit", {BAD: b"bad", **{row: b"x" for row in GOOD}}):
        assert pool.offer(notification)
    pool.end_runs(1)
    pool.run_loop()
    assert metrics.failures.value(observer="quits") == 1
    assert set(runs(client.snapshot(), b"exit:")) == set(GOOD)
    assert pool._inflight == set()
    assert not pool.offer(Notification(EVENTS, BAD, "exit", 1))  # backing off


def test_a_keyboard_interrupt_in_the_main_thread_still_propagates(
    memory_client: percolator.Client,
) -> None:
    """A KeyboardInterrupt in the main thread is a Ctrl-C: honoured, not counted; the
    cells the thread held are given back."""
    client = memory_client
    observer = Quits(lambda: KeyboardInterrupt())
    metrics = WorkerMetrics(dict, dict)
    pool = NotificationProcessor(
        client,
        {(EVENTS, "exit"): observer},
        WorkerOptions(batch_size=1),
        metrics,
        ParkingLot(client),
        stopping=threading.Event(),
        abort=threading.Event(),
    )
    for notification in write(client, "exit", {BAD: b"bad", b"good": b"x"}):
        assert pool.offer(notification)
    pool.end_runs(1)
    assert threading.current_thread() is threading.main_thread()
    with pytest.raises(KeyboardInterrupt):
        pool.run_loop()
    assert metrics.failures.value(observer="quits") == 0
    # The interrupted run's cell is not left in flight (a queued one may still be).
    assert (EVENTS, BAD, "exit") not in pool._inflight


def test_a_run_thread_that_dies_is_logged_and_makes_the_worker_unhealthy(
    local_client: percolator.Client,
    start_worker: Callable[..., Worker],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A bug in the worker's own code (here: a notification of a column no observer of the
    worker watches reaches a run thread) ends the thread: it is logged, ``/healthz`` answers
    503 naming it, and its cell is not left in flight."""
    options = dataclasses.replace(FAST, threads=2)
    worker = start_worker([helpers.RunLogger()], options)
    assert worker.health() is None
    assert healthz(worker) == (200, "ok\n")
    stray = Notification(EVENTS, b"stray", "nobody-watches-this", 12345)
    with caplog.at_level(logging.CRITICAL, logger="percolator.observers.processor"):
        assert worker.processor.offer(stray)
        wait_for(lambda: worker.health() is not None, what="the worker unhealthy")
    problem = worker.health()
    assert problem is not None and "observer-run-" in problem
    status, text = healthz(worker)
    assert status == 503 and "observer-run-" in text
    assert any("died" in r.getMessage() for r in caplog.records if r.levelno == logging.CRITICAL)
    assert stray.cell not in worker.processor._inflight
    # The other thread goes on.
    write(local_client, "value", {b"after": b"y"})
    wait_for(lambda: b"after" in runs(local_client.snapshot()), what="a run on the other thread")
    worker.stop(drain_timeout_s=5)
    assert worker.health() is None  # stopping, not dead

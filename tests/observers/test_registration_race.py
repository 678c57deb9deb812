"""A registration racing a commit in flight (percolator/committer.py, "Which cells to
notify"; observers/catchup.py, "Why that is complete").

A writer loads its observed set, begins its commit and is held (a failpoint hook) while an
observer of the column it writes is registered and caught up.  A commit that decided which
cells to notify at its start, from that set, would leave no notification, and:

(a) held before its prewrite: its lock is placed after the catch-up scanned, so nothing
    notifies the change;
(b) held after its primary's prewrite: the catch-up notifies the locked cell, the run
    starts at ``O``, waits on the live lock, and the writer commits above ``O``: the run
    acks the older commit and cleans the notification up.

Either way the change would never be processed.  Deciding after ``commit_ts`` was drawn,
from a set loaded at most one refresh interval earlier, makes the writer reload its set
(the hold outlasts the interval the registration waits) and notify itself.  Each test checks
from the store that the change was processed: the ack and a committed run cover the latest
commit, and no notification is left after draining.  Deterministic: the hold and the run's
start are events, not sleeps; the fast refresh interval of tests/observers/conftest.py keeps
the registration's wait short.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from percolator.observers.api import register_observers
from percolator.observers.drain import run_until_quiet
from percolator.observers.runner import Outcome, process_notification

import percolator
from percolator import failpoints
from percolator.testing import ManualOracle
from percolator.transaction import Transaction
from tests.observers import helpers
from tests.observers.conftest import OBSERVER_CLIENT
from tests.observers.helpers import EVENTS, RunLogger

ROW = b"raced"
OLD_ROW = b"old"
_TIMEOUT_S = 30


class WriterHold:
    """Holds the writer thread at failpoint ``point`` (its first hit there) until
    :attr:`release` is set; every other thread and failpoint goes through as before."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, point: str) -> None:
        assert point in failpoints.POINTS
        self.point = point
        self.reached = threading.Event()
        self.release = threading.Event()
        self.thread: threading.Thread | None = None
        original: Callable[[str], None] = failpoints.failpoint

        def hook(name: str) -> None:
            if (
                name == self.point
                and threading.current_thread() is self.thread
                and not self.reached.is_set()
            ):
                self.reached.set()
                if not self.release.wait(_TIMEOUT_S):
                    raise AssertionError(f"the writer was never released from {name}")
            original(name)

        monkeypatch.setattr(failpoints, "failpoint", hook)

    def start_writer(self, writer: percolator.Client, value: bytes) -> dict[str, Any]:
        """Commit ``value`` to ``ROW`` in a thread, with the writer's observed set loaded
        just before (nothing observed yet); returns once the writer is held."""
        result: dict[str, Any] = {}

        def write() -> None:
            try:
                writer.refresh_observed()  # loaded now: before the registration
                txn = writer.transaction()
                txn.set(EVENTS, ROW, "value", value)
                result["commit_ts"] = txn.commit()
            except BaseException as exc:  # reported by join()
                result["error"] = exc
                self.reached.set()

        self.thread = threading.Thread(target=write, name="racing-writer", daemon=True)
        self.thread.start()
        assert self.reached.wait(_TIMEOUT_S), "the writer never reached " + self.point
        assert "error" not in result, result
        return result

    def join(self, result: dict[str, Any]) -> int:
        self.release.set()
        assert self.thread is not None
        self.thread.join(_TIMEOUT_S)
        assert not self.thread.is_alive(), "the writer did not finish"
        if "error" in result:
            raise result["error"]
        commit_ts = result["commit_ts"]
        assert isinstance(commit_ts, int)
        return commit_ts


@pytest.fixture
def clients(local_store_url: str) -> Iterator[tuple[percolator.Client, percolator.Client]]:
    """(registrar, writer): two clients of one store and one oracle (on memory the manual
    oracle lives in the client, so the writer shares the registrar's)."""
    memory = local_store_url.startswith("memory:")
    settings = {
        "lock_ttl_ms": OBSERVER_CLIENT.lock_ttl_ms,
        "lock_wait_ms": OBSERVER_CLIENT.lock_wait_ms,
    }
    registrar = percolator.connect(
        local_store_url, oracle=ManualOracle() if memory else None, **settings
    )
    writer = percolator.connect(
        local_store_url, oracle=registrar.oracle if memory else None, **settings
    )
    try:
        helpers.create_tables(registrar)
        yield registrar, writer
    finally:
        writer.close()
        registrar.close()


def commit(client: percolator.Client, row: bytes, value: bytes) -> int:
    with client.transaction() as txn:
        txn.set(EVENTS, row, "value", value)
    assert txn.commit_ts is not None
    return txn.commit_ts


def check_processed(client: percolator.Client, row: bytes, value: bytes, commit_ts: int) -> None:
    """From the store: ``row``'s latest commit is ``commit_ts`` with ``value``, the
    observer's ack covers it, a committed run covered it, and no notification is left."""
    txn: Transaction = client.observer_transaction()
    try:
        stored, latest = txn.get_with_commit_ts(EVENTS, row, "value")
        covered = helpers.runs(txn).get(row, [])
    finally:
        txn.rollback()
    assert (stored, latest) == (value, commit_ts)
    assert helpers.uncovered(client, RunLogger.name, EVENTS, "value", [row]) == []
    assert commit_ts in covered, f"no committed run covered {commit_ts}: runs covered {covered}"
    assert helpers.pending_events(client) == []


def test_a_commit_held_before_its_prewrite_across_registration_and_catch_up_is_processed(
    clients: tuple[percolator.Client, percolator.Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    """(a): the writer's lock is placed only after the catch-up scanned; it must notify
    itself."""
    registrar, writer = clients
    old_ts = commit(writer, OLD_ROW, b"old")
    hold = WriterHold(monkeypatch, "prewrite.before_primary")
    result = hold.start_writer(writer, b"new")
    observer = RunLogger()
    register_observers(registrar, [observer])  # waits one interval, then catches up
    # The catch-up found the old row only: the writer has no lock yet.
    assert [n.row for n in helpers.pending_events(registrar)] == [OLD_ROW]
    commit_ts = hold.join(result)
    run_until_quiet(registrar, [observer])
    check_processed(registrar, OLD_ROW, b"old", old_ts)
    check_processed(registrar, ROW, b"new", commit_ts)


def test_a_commit_held_after_its_primary_lock_and_committing_above_the_run_is_processed(
    clients: tuple[percolator.Client, percolator.Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    """(b): the catch-up notifies the locked cell; the run starts at O while the writer is
    held, waits on its lock, and the writer commits above O.  The run covers the old commit
    only; the writer's own notification must survive its cleanup."""
    registrar, writer = clients
    old_ts = commit(writer, ROW, b"old")
    hold = WriterHold(monkeypatch, "prewrite.after_primary")
    result = hold.start_writer(writer, b"new")
    observer = RunLogger()
    register_observers(registrar, [observer])
    [notification] = helpers.pending_events(registrar)  # the catch-up met the lock
    assert notification.row == ROW
    # Release the writer once the run has its start timestamp O (so its commit_ts > O).
    original = registrar.observer_transaction
    run_began = threading.Event()

    def observer_transaction() -> Transaction:
        txn = original()
        run_began.set()
        return txn

    monkeypatch.setattr(registrar, "observer_transaction", observer_transaction)

    def release_when_the_run_began() -> None:
        if run_began.wait(_TIMEOUT_S):
            hold.release.set()

    releaser = threading.Thread(target=release_when_the_run_began, daemon=True)
    releaser.start()
    run = process_notification(registrar, observer, notification)  # waits on the lock
    commit_ts = hold.join(result)
    releaser.join(_TIMEOUT_S)
    # The race was hit: the run began below the writer's commit and covered the old one.
    assert run.start_ts < commit_ts
    assert (run.outcome, run.observed_commit_ts) == (Outcome.COMMITTED, old_ts)
    run_until_quiet(registrar, [observer])
    check_processed(registrar, ROW, b"new", commit_ts)

"""The client's heartbeat thread (percolator/heartbeats.py): beats run on schedule from one
thread whatever the number of transactions, stop() waits for a beat in flight, and a
transaction whose commit outlives its lock TTL keeps its lock alive."""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time
import uuid

import pytest

import percolator
from percolator.errors import PercolatorError
from percolator.heartbeats import Heartbeats
from percolator.testing import ManualOracle


def test_a_beat_runs_every_interval_until_stopped() -> None:
    beats = Heartbeats()
    try:
        times: list[float] = []
        handle = beats.start(lambda: times.append(time.monotonic()) is None, 0.02)
        deadline = time.monotonic() + 5
        while len(times) < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        handle.stop()
        count = len(times)
        assert count >= 5
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert min(gaps) >= 0.015, gaps
        time.sleep(0.1)
        assert len(times) == count, "a stopped beat ran again"
    finally:
        beats.close()


def test_beats_started_and_stopped_between_due_times_do_not_wake_the_thread() -> None:
    """Transactions start a beat each and stop it at commit, long before it is due: the
    thread must neither wake for every start nor for every stopped beat's due time (each
    wake-up costs a committing thread a hand-off), yet still run a live beat on time."""
    beats = Heartbeats()
    try:
        ran = threading.Event()
        live = beats.start(lambda: bool(ran.set()), 1.0)  # the thread now sleeps ~1 s
        time.sleep(0.05)
        before = beats.wakeups
        for k in range(1, 201):  # due after the live one, 5 ms apart: no reason to wake
            beats.start(lambda: True, 1.0 + k * 0.005).stop()
        time.sleep(0.05)
        assert beats.wakeups == before, "a started beat woke the thread"
        assert ran.wait(5), "the live beat did not run"
        # Waking for the live beat, the thread dropped the 200 stopped ones behind it at
        # once instead of waking for each of their due times.
        time.sleep(1.5)
        assert beats.wakeups <= before + 2, beats.wakeups - before
        live.stop()
    finally:
        beats.close()


def test_stop_waits_for_a_beat_in_flight() -> None:
    beats = Heartbeats()
    try:
        inside = threading.Event()
        events: list[str] = []

        def slow() -> bool:
            inside.set()
            time.sleep(0.2)
            events.append("beat done")
            return True

        handle = beats.start(slow, 0.01)
        assert inside.wait(5)
        handle.stop()
        events.append("stopped")
        assert events == ["beat done", "stopped"]
    finally:
        beats.close()


def test_a_beat_that_returns_false_or_raises_is_not_run_again() -> None:
    beats = Heartbeats()
    try:
        calls = {"false": 0, "raises": 0}

        def once() -> bool:
            calls["false"] += 1
            return False

        def boom() -> bool:
            calls["raises"] += 1
            raise RuntimeError("store gone")

        beats.start(once, 0.01)
        beats.start(boom, 0.01)
        time.sleep(0.2)
        assert calls == {"false": 1, "raises": 1}
    finally:
        beats.close()


def test_many_transactions_share_one_heartbeat_thread() -> None:
    beats = Heartbeats()
    try:
        ran: set[int] = set()
        lock = threading.Lock()
        threads_before = threading.active_count()

        def beat_of(i: int) -> bool:
            with lock:
                ran.add(i)
            return True

        handles = [beats.start(lambda i=i: beat_of(i), 0.02) for i in range(50)]
        deadline = time.monotonic() + 5
        while len(ran) < 50 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(ran) == 50
        assert threading.active_count() == threads_before + 1
        for handle in handles:
            handle.stop()
    finally:
        beats.close()


def test_a_closed_client_starts_no_heartbeat() -> None:
    beats = Heartbeats()
    beats.close()
    with pytest.raises(PercolatorError, match="closed"):
        beats.start(lambda: True, 0.01)


def _die_within(seconds: int) -> None:
    """In a forked child: be killed by the kernel after ``seconds`` (the default action of
    SIGALRM; the parent's handler, such as pytest-timeout's, cannot run in a blocked child)."""
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    signal.alarm(seconds)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_runs_its_own_beats() -> None:
    beats = Heartbeats()
    try:
        parent_handle = beats.start(lambda: True, 0.01)
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: the parent's thread did not come along
            _die_within(10)  # a hung child fails the test instead of hanging it
            ok = threading.Event()
            beats.start(lambda: ok.set() is not None, 0.01)
            os._exit(0 if ok.wait(5) else 1)
        os.close(read_end)
        os.close(write_end)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        parent_handle.stop()
    finally:
        beats.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_fork_while_the_heartbeat_lock_is_held_leaves_the_child_a_usable_lock() -> None:
    """The parent's heartbeat thread may hold the lock at the moment of a fork; the child
    must not inherit it held (it would wait for it forever)."""
    beats = Heartbeats()
    held, release = threading.Event(), threading.Event()

    def hold_the_lock() -> None:
        with beats._cond:
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold_the_lock)
    holder.start()
    try:
        assert held.wait(5)
        pid = os.fork()
        if pid == 0:
            _die_within(10)  # without the fix the child blocks in start(): fail, not hang
            ok = threading.Event()
            beats.start(lambda: ok.set() is not None, 0.01)
            os._exit(0 if ok.wait(5) else 1)
        release.set()
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, "the child hung or failed"
    finally:
        release.set()
        holder.join()
        beats.close()


def test_a_commit_slower_than_the_lock_ttl_keeps_its_lock() -> None:
    """A transaction paused after its prewrite for three TTLs is not rolled back by a
    reader: the heartbeat extended its primary lock; it then commits."""
    url = f"memory:{uuid.uuid4().hex}"
    writer = percolator.connect(url, oracle=ManualOracle(), lock_ttl_ms=300)
    reader = percolator.connect(url, oracle=writer.oracle, lock_ttl_ms=300, lock_wait_ms=100)
    try:
        writer.create_table("t")
        from percolator.committer import Committer

        txn = writer.transaction()
        txn.set("t", b"k", "c", b"slow")
        committer = Committer(writer._ctx, txn.start_ts, list(txn._writes.values()))
        committer.prewrite_all()
        time.sleep(0.9)  # three TTLs
        # The reader meets a live lock (its TTL extended), so it cannot roll it back.
        with pytest.raises(PercolatorError):
            reader.snapshot().get("t", b"k", "c")
        committer.commit()
        assert reader.snapshot().get("t", b"k", "c") == b"slow"
    finally:
        reader.close()
        writer.close()

"""The scanners' part of a worker (observers/finder.py): passes over the notify family from
random rows, wrapping around, jumping away from another scanner; scanner positions shared in
and across processes."""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from percolator.observers import finder as finder_module
from percolator.observers.finder import NotificationFinder, ScannerPositions
from percolator.observers.worker_metrics import WorkerMetrics

import percolator
from percolator.layout import META_FAMILY, META_TABLE
from percolator.notifications import Notification, put_notifications, scan_notifications
from percolator.protocol.cells import CellKey
from percolator.store.base import Put
from tests.observers.helpers import EVENTS

ROWS = [b"r%d" % i for i in range(6)]


def finder(
    client: percolator.Client, positions: ScannerPositions, offered: list[Notification]
) -> tuple[NotificationFinder, WorkerMetrics]:
    metrics = WorkerMetrics(dict, dict)

    def offer(notification: Notification) -> bool:
        offered.append(notification)
        return True

    made = NotificationFinder(
        client.store,
        {EVENTS: ["value"]},
        positions,
        offer,
        metrics,
        stopping=threading.Event(),
        scan_batch=2,
        idle_sleep_s=0,
    )
    return made, metrics


def test_a_pass_offers_every_dirty_cell_and_the_next_starts_at_a_random_row_and_wraps(
    memory_client: percolator.Client,
) -> None:
    client = memory_client
    put_notifications(client.store, [CellKey(EVENTS, r, "value") for r in ROWS], 7)
    put_notifications(client.store, [CellKey(EVENTS, b"r0", "other")], 7)  # not hosted
    offered: list[Notification] = []
    scanners, metrics = finder(client, ScannerPositions(client, "w"), offered)
    rng = random.Random(3)
    assert scanners.scan_table(0, EVENTS, rng) == 6
    assert offered == [Notification(EVENTS, r, "value", 7) for r in ROWS]
    assert metrics.passes.value() == 1
    for _ in range(5):
        offered.clear()
        assert scanners.scan_table(0, EVENTS, rng) == 6
        first = ROWS.index(offered[0].row)
        assert [n.row for n in offered] == ROWS[first:] + ROWS[:first]
    assert metrics.passes.value() == 6


def test_a_scanner_that_catches_up_with_another_jumps(memory_client: percolator.Client) -> None:
    client = memory_client
    put_notifications(client.store, [CellKey(EVENTS, r, "value") for r in ROWS], 7)
    positions = ScannerPositions(client, "w")
    positions.update(1, EVENTS, b"r3")  # scanner 1 is at r3
    offered: list[Notification] = []
    scanners, metrics = finder(client, positions, offered)
    # Batches of two rows from the start: r0-r1, then r2-r3 passes scanner 1: jump.
    assert scanners.scan_table(0, EVENTS, random.Random(3)) == 4
    assert [n.row for n in offered] == ROWS[:4]
    assert metrics.jumps.value() == 1
    assert metrics.passes.value() == 0


def test_scanner_positions_detect_catching_up_in_and_across_processes(
    local_client: percolator.Client,
) -> None:
    here = ScannerPositions(local_client, "worker-a")
    here.update(0, "t", b"m")
    # Scanner 1 of the same process scanned from b"a" to b"p": it passed scanner 0.
    assert here.caught_up(1, "t", b"a", b"p")
    assert not here.caught_up(1, "t", b"n", b"p")  # scanner 0 is behind that batch
    assert not here.caught_up(1, "other", b"a", b"p")
    assert not here.caught_up(0, "t", b"a", b"p")  # its own position does not count

    there = ScannerPositions(local_client, "worker-b")
    assert not there.caught_up(0, "t", b"a", b"p")
    here.sync()
    there.sync()
    assert there.caught_up(0, "t", b"a", b"p")  # seen through the store
    here.close()
    there.sync()
    assert not there.caught_up(0, "t", b"a", b"p")


def test_positions_of_dead_workers_are_ignored_then_removed(
    local_client: percolator.Client,
) -> None:
    store = local_client.store
    stale = json.dumps({"table": "t", "row_hex": b"m".hex(), "at_ms": 1}).encode()
    store.put(META_TABLE, [Put(b"scanner/dead-worker/0", META_FAMILY, b"p", 5, stale)])
    positions = ScannerPositions(local_client, "alive")
    positions.sync()
    assert not positions.caught_up(0, "t", b"a", b"p")
    assert store.read_row(META_TABLE, b"scanner/dead-worker/0") == {}


def test_after_a_pass_with_nothing_new_the_next_waits_until_the_queue_is_empty(
    memory_client: percolator.Client,
) -> None:
    """A pass while notifications still wait for a run thread would find them again (and
    on HBase walk every deleted notification of the table to do so): the scanner waits."""
    client = memory_client
    put_notifications(client.store, [CellKey(EVENTS, r, "value") for r in ROWS], 7)
    queued = [len(ROWS)]  # what the run threads have not taken yet
    seen: set[bytes] = set()
    stopping = threading.Event()
    metrics = WorkerMetrics(dict, dict)

    def offer(notification: Notification) -> bool:
        if notification.row in seen:
            return False  # in flight: not offered again
        seen.add(notification.row)
        return True

    scanners = NotificationFinder(
        client.store,
        {EVENTS: ["value"]},
        ScannerPositions(client, "w", shared=False),
        offer,
        metrics,
        stopping=stopping,
        scan_batch=100,
        idle_sleep_s=0,
        queued=lambda: queued[0],
    )
    thread = threading.Thread(target=scanners.scan_loop, args=(0,), daemon=True)
    thread.start()
    try:
        # The first pass offers all six; the second finds them in flight and stops there.
        deadline = time.monotonic() + 5
        while metrics.passes.value() < 2 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert metrics.passes.value() == 2
        time.sleep(0.2)  # idle_sleep_s is 0: without the wait, hundreds of passes by now
        assert metrics.passes.value() == 2
        queued[0] = 0  # the run threads took everything: scanning resumes
        deadline = time.monotonic() + 5
        while metrics.passes.value() < 5 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert metrics.passes.value() >= 5
    finally:
        stopping.set()
        thread.join(5)
    assert not thread.is_alive()


class _RecordedWaits(threading.Event):
    def __init__(self) -> None:
        super().__init__()
        self.timeouts: list[float | None] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.timeouts.append(timeout)
        return super().wait(timeout)


def _idle_waits(
    client: percolator.Client,
    monkeypatch: pytest.MonkeyPatch,
    pass_seconds: Callable[[int], float],
    passes: int,
) -> list[float]:
    """Run one scanner over an empty notify family whose n-th pass (0-based) takes
    ``pass_seconds(n)``; the waits it asked for after its first ``passes`` passes."""
    calls = [0]

    def slow_scan(*args: Any, **kwargs: Any) -> Any:
        time.sleep(pass_seconds(calls[0]))  # what walking many delete markers costs
        calls[0] += 1
        return scan_notifications(*args, **kwargs)

    monkeypatch.setattr(finder_module, "scan_notifications", slow_scan)
    stopping = _RecordedWaits()
    metrics = WorkerMetrics(dict, dict)
    scanners = NotificationFinder(
        client.store,
        {EVENTS: ["value"]},
        ScannerPositions(client, "w", shared=False),
        lambda notification: True,
        metrics,
        stopping=stopping,
        scan_batch=100,
        idle_sleep_s=0.001,
    )
    thread = threading.Thread(target=scanners.scan_loop, args=(0,), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while metrics.passes.value() < passes + 1 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        stopping.set()
        thread.join(10)
    assert not thread.is_alive()  # stopping interrupts a wait
    waits = [t for t in stopping.timeouts if t is not None]
    assert len(waits) >= passes
    return waits[:passes]


def test_an_idle_scanner_waits_about_as_long_as_its_passes_take(
    memory_client: percolator.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pass over a notify family full of deleted notifications (HBase, until a major
    compaction) finds nothing and still costs the store: an idle scanner must not start the
    next one at once, whatever ``idle_sleep_s`` says."""
    waits = _idle_waits(memory_client, monkeypatch, lambda n: 0.1, passes=3)
    # jittered by a factor in [0.5, 1.5) around the pass time, not the 1 ms configured
    assert all(0.05 <= wait < 0.3 for wait in waits), waits


def test_one_slow_pass_does_not_stretch_the_idle_wait(
    memory_client: percolator.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store hiccup makes one pass slow; the waits follow the median of recent passes."""
    waits = _idle_waits(memory_client, monkeypatch, lambda n: 0.6 if n == 2 else 0.0, passes=4)
    assert max(waits[2:]) < 0.1, waits  # after the slow third pass: back to idle_sleep_s


def test_the_idle_wait_is_capped(
    memory_client: percolator.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(finder_module, "_IDLE_WAIT_MAX_S", 0.05)
    waits = _idle_waits(memory_client, monkeypatch, lambda n: 0.2, passes=2)
    assert all(wait < 0.08 for wait in waits), waits

"""Partitioned scanning (observers/partition.py): key groups leased to live workers, moved
when a worker dies, and fenced so that a paused worker commits nothing for a group it lost.

Workers here share one in-process client (one oracle); a "killed" worker stops renewing
its leases and heartbeat without releasing anything, as SIGKILL would leave them.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Iterator

import pytest
from percolator.observers.api import register_observers
from percolator.observers.partition import (
    KeyGroupLeases,
    group_hash_range,
    group_of,
    merged_hash_ranges,
)
from percolator.observers.runner import RunResult
from percolator.observers.worker import Worker, WorkerOptions

import percolator
from percolator.errors import ConfigError
from percolator.layout import META_TABLE, NOTIFY
from percolator.notifications import (
    HASH_SPACE,
    LEGACY_NOTIFY_VALUE,
    Notification,
    row_hash,
    scan_notifications,
)
from percolator.store.base import Put
from tests.observers import helpers
from tests.observers.conftest import connect
from tests.observers.helpers import EVENTS, Gate, RunLogger, runs

GROUPS = 16
LEASE_MS = 1000


def options(
    on_commit: Callable[[str, Notification, RunResult], None] | None = None,
) -> WorkerOptions:
    return WorkerOptions(
        threads=2,
        idle_sleep_s=0.01,
        housekeeping_s=0.1,
        partitioned=True,
        key_groups=GROUPS,
        lease_ms=LEASE_MS,
        on_commit=on_commit,
    )


def until(condition: Callable[[], bool], timeout: float, what: str) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if condition():
            return time.monotonic() - started
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def kill(worker: Worker) -> None:
    """Stop a worker the way SIGKILL would: no lease released, no heartbeat any more."""
    assert worker.leases is not None
    worker.leases.rebalance = lambda: {}  # type: ignore[method-assign]
    worker.leases.release_all = lambda: None  # type: ignore[method-assign]
    worker.stop(drain_timeout_s=0)


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    started: list[Worker] = []
    yield started
    for worker in started:
        worker.stop(drain_timeout_s=2)


def test_the_key_group_of_a_row_is_a_stable_hash() -> None:
    assert group_of(b"row", 64) == zlib.crc32(b"row") * 64 >> 32
    assert {group_of(b"r%d" % i, 8) for i in range(200)} == set(range(8))


@pytest.mark.parametrize("groups", [1, 3, 7, 16, 64])
def test_a_groups_hash_range_holds_exactly_its_rows(groups: int) -> None:
    ranges = [group_hash_range(g, groups) for g in range(groups)]
    assert ranges[0][0] == 0 and ranges[-1][1] == HASH_SPACE
    assert all(ranges[g][1] == ranges[g + 1][0] for g in range(groups - 1))
    for i in range(500):
        row = b"r%d" % i
        low, high = ranges[group_of(row, groups)]
        assert low <= row_hash(row) < high
    for g, (low, high) in enumerate(ranges):  # the bounds themselves
        assert group_of_hash(low, groups) == g and group_of_hash(high - 1, groups) == g


def group_of_hash(value: int, groups: int) -> int:
    return value * groups // HASH_SPACE


def test_held_groups_merge_into_few_hash_ranges() -> None:
    assert merged_hash_ranges([], 4) == []
    assert merged_hash_ranges([3, 0, 1], 4) == [(0, 1 << 31), (3 << 30, 1 << 32)]
    assert merged_hash_ranges(range(4), 4) == [(0, 1 << 32)]


def test_a_hash_filter_selects_exactly_the_held_groups_rows_in_the_store(
    local_client: percolator.Client,
) -> None:
    _hash_filter_selects_held_groups(local_client)


@pytest.mark.hbase
def test_a_hash_filter_selects_exactly_the_held_groups_rows_on_hbase(hbase_store_url: str) -> None:
    client = connect(hbase_store_url)
    try:
        helpers.create_tables(client)
        _hash_filter_selects_held_groups(client)
    finally:
        client.close()


def test_notifications_written_before_hashes_reach_their_groups_owner(
    local_client: percolator.Client, workers: list[Worker]
) -> None:
    client = local_client
    register_observers(client, [RunLogger()])
    rows = [b"old%02d" % i for i in range(20)]
    with client.transaction() as txn:
        for row in rows:
            txn.set(EVENTS, row, "value", b"x")
    # Rewrite them as the previous format did: same version, value b"1".
    legacy = [
        Put(n.row, NOTIFY, b"value", n.notify_ts, LEGACY_NOTIFY_VALUE)
        for n in pending_in(client, None)
    ]
    client.store.put(EVENTS, legacy)
    held = [0, 1, 2]
    assert {n.row for n in pending_in(client, merged_hash_ranges(held, GROUPS))} == set(rows)
    a = Worker(client, [RunLogger()], options())
    b = Worker(client, [RunLogger()], options())
    for worker in (a, b):
        worker.start()
        workers.append(worker)
    client.wait_for(observers=["run-logger"], timeout=60)
    covered = runs(client.snapshot())
    assert helpers.duplicate_runs(covered) == [] and sorted(covered) == rows


def _hash_filter_selects_held_groups(client: percolator.Client) -> None:
    register_observers(client, [RunLogger()])
    rows = [b"row%03d" % i for i in range(200)]
    with client.transaction() as txn:
        for row in rows:
            txn.set(EVENTS, row, "value", b"x")
    for held in ([0], [1, 2], [0, 5, 6, 15], list(range(GROUPS)), []):
        ranges = merged_hash_ranges(held, GROUPS)
        found = [n.row for n in pending_in(client, ranges)]
        assert found == [r for r in rows if group_of(r, GROUPS) in held], held


def pending_in(
    client: percolator.Client, ranges: list[tuple[int, int]] | None
) -> list[Notification]:
    return [
        n
        for _, found in scan_notifications(client.store, EVENTS, ["value"], hash_ranges=ranges)
        for n in found
    ]


def test_bad_partitioning_options_are_refused(local_client: percolator.Client) -> None:
    with pytest.raises(ConfigError, match="key_groups"):
        WorkerOptions(partitioned=True, key_groups=0)
    with pytest.raises(ConfigError, match="lease"):
        KeyGroupLeases(local_client, "w", groups=4, lease_ms=10)
    # Shorter, leases would lapse between two renewals.
    with pytest.raises(ConfigError, match="at least one and a half housekeeping intervals"):
        WorkerOptions(partitioned=True, lease_ms=1000, housekeeping_s=1.0)


class OtherLogger(RunLogger):
    name = "other-logger"
    columns = ("other",)  # type: ignore[assignment]
    prefix = b"other:"


def test_workers_running_different_observers_each_cover_every_group(
    local_client: percolator.Client, workers: list[Worker]
) -> None:
    """Key groups are shared only by workers running the same observers: a group leased to
    a worker running another observer would leave this one's notifications in it to
    nobody."""
    client = local_client
    a = Worker(client, [RunLogger()], options())
    b = Worker(client, [OtherLogger()], options())
    workers += [a, b]
    a.start()
    b.start()
    assert a.leases is not None and b.leases is not None
    assert a.leases.domain != b.leases.domain
    until(lambda: len(a.leases.owned()) == len(b.leases.owned()) == GROUPS, 10, "all groups")
    rows = [b"row%03d" % i for i in range(40)]
    with client.transaction() as txn:
        for row in rows:
            txn.set(EVENTS, row, "value", b"x")
            txn.set(EVENTS, row, "other", b"y")
    until(
        lambda: (
            len(runs(client.snapshot())) == len(rows)
            and len(runs(client.snapshot(), b"other:")) == len(rows)
        ),
        30,
        "every row run by both observers",
    )


def test_a_worker_that_stops_hands_its_groups_over_at_the_next_rebalance(
    local_client: percolator.Client, workers: list[Worker]
) -> None:
    """Stopping, a worker releases its groups and withdraws its heartbeat, so the others
    count one worker fewer at once instead of waiting out its last heartbeat (a lease)."""
    client = local_client
    slow = WorkerOptions(
        threads=1,
        idle_sleep_s=0.01,
        housekeeping_s=0.1,
        partitioned=True,
        key_groups=GROUPS,
        lease_ms=5000,
    )
    a, b = Worker(client, [RunLogger()], slow), Worker(client, [RunLogger()], slow)
    workers.append(a)
    a.start()
    b.start()
    assert a.leases is not None
    until(lambda: len(a.leases.owned()) == GROUPS // 2, 10, "an even split")
    b.stop(drain_timeout_s=2)
    took = until(lambda: len(a.leases.owned()) == GROUPS, 10, "every group")
    assert took < 2.5, f"{took:.1f} s: the stopped worker still counted as live"
    assert a.leases.live_workers() == [a.worker_id]


def test_heartbeats_of_workers_long_gone_are_removed(local_client: percolator.Client) -> None:
    """Every worker start adds a heartbeat row; a worker killed leaves it. Any worker
    removes one ten leases old, so the rows do not pile up."""
    clock = [time.time()]
    gone = KeyGroupLeases(local_client, "gone", groups=4, lease_ms=1000, clock=lambda: clock[0])
    gone.rebalance()  # heartbeat, then killed
    clock[0] += 5
    alive = KeyGroupLeases(local_client, "alive", groups=4, lease_ms=1000, clock=lambda: clock[0])
    alive.rebalance()
    assert alive.live_workers() == ["alive"]  # gone: not live, not yet stale
    member = b"member//gone"
    assert local_client.store.read_row(META_TABLE, member)
    clock[0] += 10
    alive.rebalance()
    assert local_client.store.read_row(META_TABLE, member) == {}


def test_two_workers_split_the_groups_and_each_runs_only_its_own(
    local_client: percolator.Client, workers: list[Worker]
) -> None:
    client = local_client
    seen: dict[str, list[bytes]] = {"a": [], "b": []}

    def recorder(key: str) -> Callable[[str, Notification, RunResult], None]:
        return lambda _, notification, __: seen[key].append(notification.row)

    a = Worker(client, [RunLogger()], options(recorder("a")))
    b = Worker(client, [RunLogger()], options(recorder("b")))
    # What each worker's scanners read (before the worker's own check of the group).
    read: dict[str, list[bytes]] = {"a": [], "b": []}
    for key, worker in (("a", a), ("b", b)):
        offer = worker._offer

        def counting(notification: Notification, key: str = key, offer=offer) -> bool:  # type: ignore[no-untyped-def]
            read[key].append(notification.row)
            return offer(notification)

        worker._offer = counting  # type: ignore[method-assign]
    for worker in (a, b):
        worker.start()
        workers.append(worker)
    assert a.leases is not None and b.leases is not None
    leases_a, leases_b = a.leases, b.leases
    until(
        lambda: len(leases_a.owned()) == len(leases_b.owned()) == GROUPS // 2,
        10,
        "an even split of the key groups",
    )
    groups_a, groups_b = set(leases_a.owned()), set(leases_b.owned())
    assert not groups_a & groups_b and groups_a | groups_b == set(range(GROUPS))
    rows = [b"row%03d" % i for i in range(40)]
    with client.transaction() as txn:
        for row in rows:
            txn.set(EVENTS, row, "value", b"x")
    client.wait_for(observers=["run-logger"], timeout=60)
    assert {group_of(r, GROUPS) for r in seen["a"]} <= groups_a
    assert {group_of(r, GROUPS) for r in seen["b"]} <= groups_b
    # Each worker read only its own groups' notifications: the store filtered the rest.
    assert {group_of(r, GROUPS) for r in read["a"]} <= groups_a
    assert {group_of(r, GROUPS) for r in read["b"]} <= groups_b
    assert sorted(seen["a"] + seen["b"]) == rows
    covered = runs(client.snapshot())
    assert helpers.duplicate_runs(covered) == [] and sorted(covered) == rows
    assert helpers.uncovered(client, "run-logger", EVENTS, "value", rows) == []


def _killed_workers_groups_are_taken_over(client: percolator.Client, workers: list[Worker]) -> None:
    a = Worker(client, [RunLogger()], options())
    a.start()
    workers.append(a)
    assert a.leases is not None
    leases_a = a.leases
    until(lambda: len(leases_a.owned()) == GROUPS, 5, "the only worker to hold every group")
    kill(a)
    killed_at = time.monotonic()
    b = Worker(client, [RunLogger()], options())
    b.start()
    workers.append(b)
    assert b.leases is not None
    leases_b = b.leases
    until(lambda: len(leases_b.owned()) == GROUPS, 10, "the survivor to take every group")
    took = time.monotonic() - killed_at
    # The dead worker's leases and heartbeat end one lease after their last renewal; the
    # survivor looks every housekeeping interval (0.1 s).
    assert took <= LEASE_MS / 1000 + 0.5, f"took {took:.2f} s"
    with client.transaction() as txn:
        txn.set(EVENTS, b"after", "value", b"x")
    client.wait_for(observers=["run-logger"], timeout=30)
    assert runs(client.snapshot()) == {b"after": [txn.commit_ts]}


def test_a_killed_workers_groups_are_taken_over_within_the_lease(
    local_client: percolator.Client, workers: list[Worker]
) -> None:
    _killed_workers_groups_are_taken_over(local_client, workers)


@pytest.mark.hbase
def test_a_killed_workers_groups_are_taken_over_on_hbase(
    hbase_store_url: str, workers: list[Worker]
) -> None:
    client = connect(hbase_store_url)
    try:
        helpers.create_tables(client)
        _killed_workers_groups_are_taken_over(client, workers)
    finally:
        for worker in workers:
            worker.stop(drain_timeout_s=2)
        client.close()


def test_a_paused_worker_that_lost_its_group_commits_nothing_for_it(
    local_client: percolator.Client, workers: list[Worker]
) -> None:
    client = local_client
    committed: dict[str, list[bytes]] = {"a": [], "b": []}

    def recorder(key: str) -> Callable[[str, Notification, RunResult], None]:
        return lambda _, notification, __: committed[key].append(notification.row)

    gate_a, gate_b = Gate(), Gate()
    a = Worker(client, [gate_a], options(recorder("a")))
    a.start()
    workers.append(a)
    assert a.leases is not None
    leases_a = a.leases
    until(lambda: len(leases_a.owned()) == GROUPS, 5, "worker a to hold every group")
    with client.transaction() as txn:
        txn.set(EVENTS, b"held", "gated", b"x")
    assert gate_a.entered.wait(10), "worker a never started the run"
    # a is "paused" in the middle of its run: it renews nothing any more.
    leases_a.rebalance = lambda: {}  # type: ignore[method-assign]
    b = Worker(client, [gate_b], options(recorder("b")))
    b.start()
    workers.append(b)
    assert b.leases is not None
    leases_b = b.leases
    until(lambda: leases_b.claim(b"held") is not None, 10, "worker b to take the row's group")
    assert gate_b.entered.wait(10), "worker b never ran the notification"
    # a wakes up before b commits: without the fence its run would commit (no conflict yet).
    gate_a.release.set()
    until(lambda: not a.processor._inflight, 10, "worker a's run to end")
    assert committed["a"] == []
    gate_b.release.set()
    client.wait_for(observers=["gate"], timeout=30)
    assert committed["b"] == [b"held"]
    assert runs(client.snapshot(), b"gate:") == {b"held": [txn.commit_ts]}


def test_a_batch_checks_the_fences_of_all_its_groups_in_one_read(
    local_client: percolator.Client,
) -> None:
    """The check before a batch's commit reads every lease the batch ran under at once, and
    fails if any one of them moved (another sequence, another owner or expired)."""
    from tests.txn.test_round_trips import delta, reads_and_writes

    client = local_client
    leases = KeyGroupLeases(client, "w1", groups=GROUPS, lease_ms=LEASE_MS)
    held = leases.rebalance()
    assert len(held) == GROUPS
    claims = {(group, held[group]) for group in (0, 3, 7, 11)}
    before = reads_and_writes(client)
    assert leases.fences_hold(claims)
    assert delta(before, reads_and_writes(client)) == {"read_rows": 1}
    moved = {*claims - {(7, held[7])}, (7, held[7] + 1)}
    assert not leases.fences_hold(moved)
    other = KeyGroupLeases(client, "w2", groups=GROUPS, lease_ms=LEASE_MS)
    assert not other.fences_hold(claims)  # the leases name w1
    later = KeyGroupLeases(
        client, "w1", groups=GROUPS, lease_ms=LEASE_MS, clock=lambda: time.time() + 60
    )
    assert not later.fences_hold(claims)  # expired by then

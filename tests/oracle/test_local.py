"""LocalOracle: timestamps reserved by compare-and-set, safe across threads and processes."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest
from percolator.oracle.lease import LeaseConfig, OracleNode, Role

from percolator.errors import OracleError, OracleUnavailableError
from percolator.store import open_store
from percolator.testing import FaultyStore
from percolator.timestamps import LocalOracle, compose
from percolator.timestamps.record import OracleRecord, OracleRecordRegister
from tests.oracle.conftest import FakeClock
from tests.oracle.procs import REPO, Call, check_real_time_order


def mark(store: FaultyStore) -> int:
    record = OracleRecordRegister(store).read().record
    assert record is not None
    return record.high_water


def test_timestamps_increase_and_never_exceed_the_persisted_mark(store: FaultyStore) -> None:
    oracle = LocalOracle(store)
    seen = [oracle.get_timestamp() for _ in range(50)] + oracle.get_timestamps(100)
    assert seen == sorted(set(seen))
    assert mark(store) == seen[-1], "the mark is exactly what was reserved and issued"
    assert seen[0] >= compose(int(time.time() * 1000) - 5_000)


def test_an_uncontended_batch_costs_one_compare_and_set(store: FaultyStore) -> None:
    oracle = LocalOracle(store)
    oracle.get_timestamp()
    before = dict(store.stats.calls)
    for _ in range(10):
        oracle.get_timestamp()
    assert store.stats.calls["compare_and_set"] - before["compare_and_set"] == 10
    assert store.stats.calls.get("read_rows", 0) == before.get("read_rows", 0)


def test_a_restarted_oracle_starts_above_the_mark(store: FaultyStore, clock: FakeClock) -> None:
    first = LocalOracle(store, clock=clock)
    last = first.get_timestamps(1000)[-1]
    clock.advance(-60_000)  # even if the clock went back a minute
    again = LocalOracle(store, clock=clock)
    assert again.get_timestamp() == last + 1


def test_two_instances_interleaved_stay_in_real_time_order(store: FaultyStore) -> None:
    # Disjoint windows reserved ahead would fail exactly this: each call must see the
    # other instance's latest reservation.
    a, b = LocalOracle(store), LocalOracle(store)
    seen = []
    for i in range(200):
        seen.append((a if i % 2 else b).get_timestamp())
    assert seen == sorted(seen) and len(set(seen)) == len(seen)


def test_threads_are_coalesced_into_few_compare_and_sets(embedded_url: str) -> None:
    # A real store: its compare-and-set takes real time, during which other threads queue.
    store = open_store(embedded_url)
    oracle = LocalOracle(store)
    calls: list[Call] = []
    lock = threading.Lock()

    def work() -> None:
        mine = []
        for _ in range(50):
            start = time.monotonic_ns()
            ts = oracle.get_timestamp()
            mine.append(Call(start, time.monotonic_ns(), ts))
        with lock:
            calls.extend(mine)

    threads = [threading.Thread(target=work) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    store.close()
    check_real_time_order(calls)
    assert oracle.stats.timestamps == 1000
    print("compare-and-sets for 1000 timestamps from 20 threads:", oracle.stats.fetches)
    assert oracle.stats.fetches <= 1000 / 4


def test_refuses_while_an_oracle_server_holds_a_live_lease(
    store: FaultyStore, clock: FakeClock
) -> None:
    server = OracleNode(OracleRecordRegister(store), "server-1", LeaseConfig(), clock)
    server.step()
    assert server.role is Role.ACTIVE
    oracle = LocalOracle(store, clock=clock, margin_ms=500)
    with pytest.raises(OracleError, match=r"served by the oracle server 'server-1'.*grpc://"):
        oracle.get_timestamp()
    issued = server.allocate(5)
    clock.advance(3_000 + 500)  # the server died: its lease lapses (+ margin)
    with pytest.raises(OracleError):
        oracle.get_timestamp()
    clock.advance(1)
    assert oracle.get_timestamp() > issued.first + 4
    # The server, waking up, serves nothing.
    with pytest.raises(OracleError):
        server.allocate(1)


def test_an_unknown_outcome_that_was_applied_is_used(store: FaultyStore) -> None:
    oracle = LocalOracle(store)
    t1 = oracle.get_timestamp()
    store.fail("compare_and_set", applied=True)
    t2 = oracle.get_timestamp()
    assert t2 == mark(store) and t2 > t1


def test_an_unknown_outcome_that_was_not_applied_is_retried(store: FaultyStore) -> None:
    oracle = LocalOracle(store)
    t1 = oracle.get_timestamp()
    store.fail("compare_and_set", times=2)
    t2 = oracle.get_timestamp()
    assert t2 == mark(store) and t2 > t1


def test_an_unknown_outcome_overtaken_by_another_writer_is_not_used(store: FaultyStore) -> None:
    a, b = LocalOracle(store), LocalOracle(store)
    a.get_timestamp()
    # a's write is applied, the reply lost, and b writes on top before a re-reads: a cannot
    # prove its range was reserved, so it must reserve another one.
    store.fail("compare_and_set", applied=True)
    # b takes its timestamp just before a's first read after that: a's re-read.
    store.before("read_rows", lambda _: b.get_timestamp(), times=1)
    t_a = a.get_timestamp()
    assert t_a == mark(store)
    assert store.stats.calls["compare_and_set"] >= 4


def test_a_store_that_stays_down_gives_a_clear_error(store: FaultyStore) -> None:
    oracle = LocalOracle(store, timeout_s=0.2)
    oracle.get_timestamp()
    store.fail("compare_and_set", times=None)
    store.fail("read_rows", times=None)
    with pytest.raises(OracleUnavailableError, match="could not reserve timestamps in memory:"):
        oracle.get_timestamp()


def test_processes_sharing_an_embedded_store_stay_in_real_time_order(embedded_url: str) -> None:
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.oracle.local_worker", embedded_url, "300", "4"],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    calls = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        for line in out.strip().splitlines():
            start, end, ts = (int(x) for x in line.split())
            calls.append(Call(start, end, ts))
    assert len(calls) == 3 * 300 * 4
    check_real_time_order(calls)
    with open_store(embedded_url) as s:
        record = OracleRecordRegister(s).read().record
        assert isinstance(record, OracleRecord)
        assert record.high_water == max(c.ts for c in calls)
        # ... and a new process starts above everything.
        assert LocalOracle(s).get_timestamp() > record.high_water

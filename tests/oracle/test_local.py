"""LocalOracle: timestamps reserved by compare-and-set, safe across threads and processes."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
from percolator.oracle.lease import LeaseConfig, OracleNode, Role

from percolator.errors import InvalidArgumentError, OracleError, OracleUnavailableError
from percolator.store import open_store
from percolator.testing import FaultyStore
from percolator.timestamps import LocalOracle, compose
from percolator.timestamps.local import DEFAULT_BLOCK_MS
from percolator.timestamps.record import (
    LOCAL_HOLDER_PREFIX,
    OracleRecord,
    OracleRecordRegister,
    StoredRecord,
)
from tests.oracle.conftest import FakeClock
from tests.oracle.procs import REPO, Call, check_real_time_order


def mark(store: FaultyStore) -> int:
    record = OracleRecordRegister(store).read().record
    assert record is not None
    return record.high_water


def test_timestamps_increase_and_never_exceed_the_persisted_mark(store: FaultyStore) -> None:
    oracle = LocalOracle(store, block_ms=0)
    seen = [oracle.get_timestamp() for _ in range(50)] + oracle.get_timestamps(100)
    assert seen == sorted(set(seen))
    assert mark(store) == seen[-1], "the mark is exactly what was reserved and issued"
    assert seen[0] >= compose(int(time.time() * 1000) - 5_000)


def test_leased_blocks_never_exceed_the_mark_nor_run_far_ahead_of_the_clock(
    store: FaultyStore,
) -> None:
    oracle = LocalOracle(store)
    seen = [oracle.get_timestamp() for _ in range(50)] + oracle.get_timestamps(100)
    assert seen == sorted(set(seen))
    assert seen[-1] <= mark(store), "nothing is handed out above the persisted mark"
    assert mark(store) < compose(int(time.time() * 1000) + DEFAULT_BLOCK_MS + 1)
    assert seen[0] >= compose(int(time.time() * 1000) - 5_000)


def test_an_uncontended_batch_costs_one_compare_and_set(store: FaultyStore) -> None:
    oracle = LocalOracle(store, block_ms=0)
    oracle.get_timestamp()
    before = dict(store.stats.calls)
    for _ in range(10):
        oracle.get_timestamp()
    assert store.stats.calls["compare_and_set"] - before["compare_and_set"] == 10
    assert store.stats.calls.get("read_rows", 0) == before.get("read_rows", 0)


def test_a_leased_block_serves_timestamps_with_one_read_and_no_compare_and_set(
    store: FaultyStore, clock: FakeClock
) -> None:
    oracle = LocalOracle(store, clock=clock, block_ms=100)
    oracle.get_timestamp()  # first reservation: exact (someone else may have been last)
    oracle.get_timestamp()  # second in a row: a block up to 100 ms ahead of the clock
    block_end = mark(store)
    assert block_end == compose(clock.wall + 100) - 1
    before = dict(store.stats.calls)
    seen = [oracle.get_timestamp() for _ in range(20)]
    assert store.stats.calls["compare_and_set"] == before["compare_and_set"], (
        "the steady state draws no compare-and-set per timestamp"
    )
    assert store.stats.calls["read_rows"] - before["read_rows"] == 20, "one read per batch"
    assert seen == sorted(set(seen)) and seen[-1] <= block_end
    # Timestamps from the block follow the wall clock (lock ages stay true)...
    clock.advance(50)
    assert oracle.get_timestamp() == compose(clock.wall)
    # ... and once the clock passes the block's end, the next batch reserves a new one.
    clock.advance(60)
    after = oracle.get_timestamp()
    assert after == compose(clock.wall)
    assert store.stats.calls["compare_and_set"] == before["compare_and_set"] + 1
    assert mark(store) == compose(clock.wall + 100) - 1


def test_a_block_is_dropped_as_soon_as_another_instance_reserves(
    store: FaultyStore, clock: FakeClock
) -> None:
    a = LocalOracle(store, clock=clock)
    b = LocalOracle(store, clock=clock)
    a.get_timestamp()
    a.get_timestamp()  # a holds a block ahead of the clock
    t_b = b.get_timestamp()  # b's exact reservation lands above a's block
    assert t_b == mark(store)
    t_a = a.get_timestamp()  # a's read sees b's record: no timestamp from the old block
    assert t_a > t_b
    # Alternating instances reserve exactly: the mark does not ratchet ahead of the clock.
    for i in range(100):
        (a if i % 2 else b).get_timestamp()
    assert mark(store) <= compose(clock.wall + DEFAULT_BLOCK_MS) + 200


def test_a_block_with_a_failing_read_is_not_used(store: FaultyStore, clock: FakeClock) -> None:
    oracle = LocalOracle(store, clock=clock, timeout_s=5)
    oracle.get_timestamp()
    t1 = oracle.get_timestamp()
    store.fail("read_rows", times=1)  # the validation read fails: re-read, then reserve
    t2 = oracle.get_timestamp()
    assert t1 < t2 <= mark(store)


def test_block_ms_must_be_a_non_negative_int(store: FaultyStore) -> None:
    for bad in (-1, 1.5, True, "100"):
        with pytest.raises(InvalidArgumentError, match="block_ms"):
            LocalOracle(store, block_ms=bad)  # type: ignore[arg-type]


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


@pytest.mark.parametrize("block_ms", [0, DEFAULT_BLOCK_MS])
def test_threads_are_coalesced_into_few_compare_and_sets(
    embedded_url: str, block_ms: int, clock: FakeClock
) -> None:
    # A real store: its compare-and-set takes real time, during which other threads queue.
    # At least 2 ms: an uncontended compare-and-set of the embedded store takes ~0.1 ms, and
    # on a loaded machine thread wake-ups can take longer than that, so how many callers
    # queue behind one would measure the machine's load rather than the coalescing.
    # With leased blocks the clock stands still, so the first block never runs out.
    store = FaultyStore(open_store(embedded_url))
    store.before("compare_and_set", lambda _: time.sleep(0.002))
    oracle = (
        LocalOracle(store, block_ms=0)
        if block_ms == 0
        else LocalOracle(store, block_ms=block_ms, clock=clock)
    )
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
    if block_ms == 0:
        print("compare-and-sets for 1000 timestamps from 20 threads:", oracle.stats.fetches)
        assert oracle.stats.fetches <= 1000 / 4
        assert oracle.reservations == oracle.stats.fetches
    else:
        # One exact reservation, then one block; every later batch is one read.  A read is
        # shorter than a compare-and-set, so fewer threads queue behind it: more batches.
        print("batches (reads) for 1000 timestamps from 20 threads:", oracle.stats.fetches)
        assert oracle.reservations == 2
        assert oracle.validations == oracle.stats.fetches - 2


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
    oracle = LocalOracle(store, block_ms=0)
    t1 = oracle.get_timestamp()
    store.fail("compare_and_set", applied=True)
    t2 = oracle.get_timestamp()
    assert t2 == mark(store) and t2 > t1


def test_an_unknown_outcome_that_was_not_applied_is_retried(store: FaultyStore) -> None:
    oracle = LocalOracle(store, block_ms=0)
    t1 = oracle.get_timestamp()
    store.fail("compare_and_set", times=2)
    t2 = oracle.get_timestamp()
    assert t2 == mark(store) and t2 > t1


def test_an_unknown_outcome_overtaken_by_another_writer_is_not_used(store: FaultyStore) -> None:
    a, b = LocalOracle(store, block_ms=0), LocalOracle(store, block_ms=0)
    a.get_timestamp()
    # a's write is applied, the reply lost, and b writes on top before a re-reads: a cannot
    # prove its range was reserved, so it must reserve another one.
    store.fail("compare_and_set", applied=True)
    # b takes its timestamp just before a's first read after that: a's re-read.
    store.before("read_rows", lambda _: b.get_timestamp(), times=1)
    t_a = a.get_timestamp()
    assert t_a == mark(store)
    assert store.stats.calls["compare_and_set"] >= 4


def test_an_unknown_outcome_of_a_block_reservation(store: FaultyStore) -> None:
    oracle = LocalOracle(store)
    t1 = oracle.get_timestamp()
    store.fail("compare_and_set", applied=True)  # the block is reserved, the reply lost
    t2 = oracle.get_timestamp()
    assert t1 < t2 <= mark(store)
    cas = store.stats.calls["compare_and_set"]
    t3 = oracle.get_timestamp()  # served from the block the re-read proved ours
    assert t2 < t3 <= mark(store)
    assert store.stats.calls["compare_and_set"] == cas


def test_a_store_that_stays_down_gives_a_clear_error(store: FaultyStore) -> None:
    oracle = LocalOracle(store, timeout_s=0.2)
    oracle.get_timestamp()
    store.fail("compare_and_set", times=None)
    store.fail("read_rows", times=None)
    with pytest.raises(OracleUnavailableError, match="could not reserve timestamps in memory:"):
        oracle.get_timestamp()


@pytest.mark.parametrize("block_ms", [0, DEFAULT_BLOCK_MS])
def test_processes_sharing_an_embedded_store_stay_in_real_time_order(
    embedded_url: str, block_ms: int
) -> None:
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.oracle.local_worker",
                embedded_url,
                "300",
                "4",
                str(block_ms),
            ],
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
        if block_ms == 0:
            assert record.high_water == max(c.ts for c in calls)
        else:  # the rest of a leased block may be left over, never more
            assert max(c.ts for c in calls) <= record.high_water
            assert record.high_water < compose(int(time.time() * 1000) + block_ms + 1)
        # ... and a new process starts above everything.
        assert LocalOracle(s).get_timestamp() > record.high_water


def test_a_transaction_draws_no_compare_and_set_for_its_timestamps(store: FaultyStore) -> None:
    import percolator
    from percolator.layout import META_TABLE

    # Today's wall clock, standing still: the block never runs out, lock ages stay true.
    clock = FakeClock(int(time.time() * 1000))

    oracle_cas: list[str] = []
    store.before(
        "compare_and_set",
        lambda call: oracle_cas.append(call["table"]),
        when=lambda call: call["table"] == META_TABLE,
    )
    client = percolator.connect(store, oracle=LocalOracle(store, clock=clock))
    try:
        client.create_table("t")
        for i in range(3):  # the first reservations: exact, then the block
            with client.transaction() as txn:
                txn.set("t", b"warm%d" % i, "c", b"v")
        before = len(oracle_cas)
        for i in range(20):
            with client.transaction() as txn:
                txn.set("t", b"row%d" % i, "c", b"v")
        assert len(oracle_cas) == before, "steady state: no compare-and-set per timestamp"
        with client.snapshot() as snap:
            assert snap.get("t", b"row19", "c") == b"v"
    finally:
        client.close()


# ------------------------------------------------------------------ the short lease


def lease_now(oracle: LocalOracle, clock: FakeClock) -> None:
    """Draw timestamps as the only instance until ``oracle`` holds its lease."""
    for _ in range(100):
        oracle.get_timestamp()
        if oracle.holds_lease:
            return
        clock.advance(50)
    raise AssertionError("an instance alone for a whole lease never leased")


#: a lease test run with the renewal made by the batch that finds it due, and in the background
both_renewals = pytest.mark.parametrize("background", [False, True], ids=["inline", "background"])


def renewal_done(oracle: LocalOracle) -> None:
    """Wait for the renewal ``oracle`` may have started in the background to end."""
    with oracle._state_lock:
        assert oracle._await_renewal(time.monotonic() + 30), "the renewal did not end in 30 s"


@both_renewals
def test_an_instance_alone_for_a_lease_serves_with_no_store_access(
    store: FaultyStore, clock: FakeClock, background: bool
) -> None:
    oracle = LocalOracle(store, clock=clock, lease_ms=400, renew_in_background=background)
    lease_now(oracle, clock)
    record = OracleRecordRegister(store).read().record
    assert record is not None and record.leased and record.holder == oracle.instance_id
    before = dict(store.stats.calls)
    seen = [oracle.get_timestamp() for _ in range(50)] + oracle.get_timestamps(50)
    assert dict(store.stats.calls) == before, "under the lease: no store access at all"
    assert seen == sorted(set(seen)) and seen[-1] <= record.high_water
    # A quarter lease later the next batch starts a renewal: one read (the release
    # request), one compare-and-set; the mark stays a lease ahead of the clock.
    clock.advance(100)
    t = oracle.get_timestamp()
    assert t == compose(clock.wall) and t > seen[-1]
    renewal_done(oracle)
    assert store.stats.calls["compare_and_set"] == before["compare_and_set"] + 1
    assert store.stats.calls["read_rows"] == before["read_rows"] + 1
    assert mark(store) == compose(clock.wall + 400) - 1
    assert oracle.holds_lease


def hold_up_next_compare_and_set(store: FaultyStore) -> tuple[threading.Event, threading.Event]:
    """``(reached, go)``: the next compare-and-set on ``store`` waits for ``go``;
    ``reached`` is set once it has reached the store."""
    reached, go = threading.Event(), threading.Event()
    store.before("compare_and_set", lambda call: reached.set(), times=1)
    store.hang("compare_and_set", until=go)
    return reached, go


def served_at_once(oracle: LocalOracle, count: int = 1) -> list[int]:
    """``count`` timestamps, each drawn without waiting for the store (else fail)."""
    served: list[int] = []
    drawing = threading.Thread(
        target=lambda: served.extend(oracle.get_timestamp() for _ in range(count)), daemon=True
    )
    drawing.start()
    drawing.join(5)
    if drawing.is_alive():
        pytest.fail("a batch under a valid lease waited for the store")
    return served


def renewal_held_up(store: FaultyStore, clock: FakeClock) -> tuple[LocalOracle, threading.Event]:
    """An oracle renewing in the background, holding its lease, whose renewal has started
    and whose compare-and-set is held at the store until the returned event is set."""
    oracle = LocalOracle(store, clock=clock, lease_ms=400, renew_in_background=True)
    lease_now(oracle, clock)
    reached, go = hold_up_next_compare_and_set(store)
    try:
        clock.advance(100)  # a quarter lease: a renewal is due
        served_at_once(oracle)
        assert reached.wait(5), "no renewal was started"
    except BaseException:
        go.set()
        raise
    return oracle, go


def test_a_batch_due_for_renewal_does_not_wait_for_the_store(
    store: FaultyStore, clock: FakeClock
) -> None:
    """The renewal runs in the background while the lease is still valid: batches go on
    being served from it.  Only a batch that finds the validity over waits for it."""
    oracle = LocalOracle(store, clock=clock, lease_ms=400, renew_in_background=True)
    lease_now(oracle, clock)
    first = oracle.get_timestamp()
    started: list[object] = []
    store.before("compare_and_set", started.append)
    reached, go = hold_up_next_compare_and_set(store)
    late: list[int] = []
    try:
        clock.advance(100)  # a quarter lease: a renewal is due
        served = served_at_once(oracle, 2)
        assert reached.wait(5), "no renewal was started"
        clock.advance(200)  # still inside the validity (400 - 50 after the lease was sent)
        served += served_at_once(oracle)
        assert served == sorted(set(served)) and served[0] > first
        # Past the validity a batch must wait: the renewal under way decides.
        clock.advance(100)
        waiting = threading.Thread(target=lambda: late.append(oracle.get_timestamp()), daemon=True)
        waiting.start()
        waiting.join(0.3)
        assert waiting.is_alive() and not late, "served past the validity without a renewal"
        # One renewal under way: the batches served meanwhile did not start another.
        assert len(started) == 1
    finally:
        go.set()
    waiting.join(10)
    assert late and late[0] > served[-1]
    assert oracle.holds_lease and late[0] <= mark(store)


def test_a_renewal_that_fails_in_the_background_ends_the_lease(
    store: FaultyStore, clock: FakeClock
) -> None:
    oracle = LocalOracle(store, clock=clock, lease_ms=400, renew_in_background=True)
    lease_now(oracle, clock)
    last = oracle.get_timestamp()
    store.fail("compare_and_set")  # lost on the way: the record keeps the old bytes
    clock.advance(100)
    assert served_at_once(oracle)[0] > last  # from the lease, still valid
    renewal_done(oracle)
    assert not oracle.holds_lease
    after = oracle.get_timestamp()  # reserves again from the record
    assert after > last and after <= mark(store)


def test_a_renewal_that_finds_the_record_taken_over_ends_the_lease(
    store: FaultyStore, clock: FakeClock
) -> None:
    oracle, go = renewal_held_up(store, clock)
    register = OracleRecordRegister(store)
    try:
        # Someone else writes the record meanwhile (as a waiter does once the lease
        # lapsed by its clock): the renewal's compare-and-set must fail.
        seen = register.read()
        assert seen.record is not None
        taken = OracleRecord(
            epoch=seen.record.epoch,
            high_water=seen.record.high_water + 1_000,
            holder=LOCAL_HOLDER_PREFIX + "someone-else",
        )
        assert register.compare_and_set(seen.raw, taken)
    finally:
        go.set()
    renewal_done(oracle)
    assert not oracle.holds_lease
    assert oracle.get_timestamp() > taken.high_water, "nothing more from the old lease"


def test_close_waits_for_a_renewal_under_way_then_releases(
    store: FaultyStore, clock: FakeClock
) -> None:
    oracle, go = renewal_held_up(store, clock)
    closing = threading.Thread(target=oracle.close, daemon=True)
    try:
        closing.start()
        closing.join(0.3)
        assert closing.is_alive(), "close() did not wait for the renewal under way"
    finally:
        go.set()
    closing.join(10)
    assert not closing.is_alive() and not oracle.holds_lease
    record = OracleRecordRegister(store).read().record
    assert record is not None and not record.leased


def test_a_lease_is_taken_only_after_a_whole_lease_alone(
    store: FaultyStore, clock: FakeClock
) -> None:
    a, b = LocalOracle(store, clock=clock), LocalOracle(store, clock=clock)
    for _ in range(40):  # 2 s of taking turns: neither ever leases
        a.get_timestamp()
        b.get_timestamp()
        clock.advance(50)
    assert not a.holds_lease and not b.holds_lease
    assert a.leased_batches == b.leased_batches == 0


class _HolderKeepsDrawing:
    """The waiter's clock: each poll lets time pass and the holder draw a timestamp, as a
    holder busy in another process would."""

    def __init__(self, clock: FakeClock, holder: LocalOracle, drawn: list[int]) -> None:
        self._clock = clock
        self._holder = holder
        self._drawn = drawn
        self.waited_ms = 0.0

    def wall_ms(self) -> int:
        return self._clock.wall_ms()

    def monotonic_ms(self) -> float:
        return self._clock.monotonic_ms()

    def sleep_ms(self, ms: float) -> None:
        self._clock.advance(ms)
        self.waited_ms += ms
        self._drawn.append(self._holder.get_timestamp())
        # A busy holder's renewal takes a round trip or two, far less than a poll.
        renewal_done(self._holder)


@both_renewals
def test_a_waiter_asks_the_holder_to_release_and_gets_in_within_a_quarter_lease(
    store: FaultyStore, clock: FakeClock, background: bool
) -> None:
    holder = LocalOracle(store, clock=clock, lease_ms=400, renew_in_background=background)
    lease_now(holder, clock)
    drawn = [holder.get_timestamp()]
    waiter_clock = _HolderKeepsDrawing(clock, holder, drawn)
    waiter = LocalOracle(store, clock=waiter_clock, lease_ms=400)
    t = waiter.get_timestamp()
    # The holder saw the request at its next renewal (a quarter lease) and released; the
    # waiter did not have to wait the lease out.
    assert waiter_clock.waited_ms <= 100 + 2 * 10
    assert waiter.lease_waits > 0 and not holder.holds_lease
    assert t > max(drawn), "the waiter's timestamp is above everything the holder handed out"
    assert holder.get_timestamp() > t
    record = OracleRecordRegister(store).read().record
    assert record is not None and not record.leased


@both_renewals
def test_a_paused_holder_is_waited_out_and_serves_nothing_from_its_lease_after(
    store: FaultyStore, clock: FakeClock, background: bool
) -> None:
    holder = LocalOracle(store, clock=clock, lease_ms=400, renew_in_background=background)
    lease_now(holder, clock)
    last = holder.get_timestamp()
    leased_at, wall_at_pause = clock.mono, clock.wall
    # The holder is paused: it never renews nor answers.  The waiter waits until the
    # holder's bytes have been unchanged for lease + margin by its own clock.
    waiter = LocalOracle(store, clock=clock, lease_ms=400)
    t = waiter.get_timestamp()
    assert clock.mono - leased_at > 400 + 400 / 8
    assert t > last
    # The holder wakes up, and its wall clock has stepped back to when it paused, so its
    # block looks unused: only its monotonic clock says the lease is over.  Its renewal
    # fails (someone else wrote the record), so nothing comes from the old lease.
    clock.wall = wall_at_pause
    before = holder.leased_batches
    again = holder.get_timestamp()
    assert again > t and holder.leased_batches == before and not holder.holds_lease


def test_a_waiter_asks_for_release_once_per_lease_not_on_every_poll(
    store: FaultyStore, clock: FakeClock
) -> None:
    """The request is a compare-and-set on the oracle's row: written once per lease waited
    on, not on each 10 ms poll (a paused holder is waited out over dozens of polls)."""
    holder = LocalOracle(store, clock=clock, lease_ms=400)
    lease_now(holder, clock)
    last = holder.get_timestamp()
    waiter = LocalOracle(store, clock=clock, lease_ms=400)
    asked: list[bytes] = []
    ask = waiter._register.ask_release

    def counting(seen: StoredRecord, request: bytes) -> bool:
        asked.append(request)
        return ask(seen, request)

    waiter._register.ask_release = counting  # type: ignore[method-assign]
    assert waiter.get_timestamp() > last
    assert waiter.lease_waits > 10, "the paused holder's lease was waited out, polling"
    assert len(asked) == 1, asked


@both_renewals
def test_close_releases_the_lease_so_nobody_waits(
    store: FaultyStore, clock: FakeClock, background: bool
) -> None:
    holder = LocalOracle(store, clock=clock, renew_in_background=background)
    lease_now(holder, clock)
    last = holder.get_timestamp()
    holder.close()
    record = OracleRecordRegister(store).read().record
    assert record is not None and not record.leased
    other = LocalOracle(store, clock=clock)
    mono = clock.mono
    assert other.get_timestamp() > last
    assert other.lease_waits == 0 and clock.mono == mono
    # A closed instance still serves, without leasing again.
    for _ in range(20):
        holder.get_timestamp()
        clock.advance(50)
    assert not holder.holds_lease


@both_renewals
def test_an_oracle_server_asks_a_local_lease_to_end_then_takes_over(
    store: FaultyStore, clock: FakeClock, background: bool
) -> None:
    local = LocalOracle(store, clock=clock, lease_ms=400, renew_in_background=background)
    lease_now(local, clock)
    last = local.get_timestamp()
    server = OracleNode(OracleRecordRegister(store), "oracle:server-1", LeaseConfig(), clock)
    server.step()  # the local lease is live: the server stays standby and asks
    assert server.role is Role.STANDBY
    clock.advance(100)
    local.get_timestamp()  # the local oracle's renewal sees the request and releases
    renewal_done(local)
    assert not local.holds_lease
    server.step()
    assert server.role is Role.ACTIVE
    assert server.allocate(1).first > last
    with pytest.raises(OracleError, match="served by the oracle server 'oracle:server-1'"):
        local.get_timestamp()


def test_an_oracle_server_asks_a_local_lease_to_end_once_not_on_every_poll(
    store: FaultyStore, clock: FakeClock
) -> None:
    """A paused local holder never answers: the server polls until the lease lapses by its
    own clock, writing its release request once."""
    local = LocalOracle(store, clock=clock, lease_ms=400)
    lease_now(local, clock)
    last = local.get_timestamp()
    register = OracleRecordRegister(store)
    asked: list[bytes] = []
    ask = register.ask_release

    def counting(seen: StoredRecord, request: bytes) -> bool:
        asked.append(request)
        return ask(seen, request)

    register.ask_release = counting  # type: ignore[method-assign]
    server = OracleNode(register, "oracle:server-1", LeaseConfig(), clock)
    polls = 0
    while server.role is not Role.ACTIVE:
        server.step()
        clock.advance(50)
        polls += 1
        assert polls < 100, "the paused local lease was never waited out"
    assert polls > 5 and len(asked) == 1, (polls, asked)
    assert server.allocate(1).first > last


def test_a_forked_child_starts_as_a_new_instance_with_fresh_locks(
    store: FaultyStore, clock: FakeClock
) -> None:
    """A real fork while the parent holds its lease and has a request in flight (the state
    lock held): the child does not hang, serves nothing from the parent's lease, and its
    close() leaves the record alone."""
    parent = LocalOracle(store, clock=clock, lease_ms=400)
    lease_now(parent, clock)
    parent_id, last = parent.instance_id, parent.get_timestamp()
    limit = mark(store)
    read_fd, write_fd = os.pipe()
    with parent._state_lock:  # as if another thread's request were in flight
        pid = os.fork()
    if pid == 0:  # the child: its store is a copy of the parent's memory
        code = 1
        try:
            fresh = parent.instance_id != parent_id and not parent.holds_lease
            before = store.stats.calls.get("compare_and_set", 0)
            parent.close()  # holds no lease: writes nothing
            untouched = store.stats.calls.get("compare_and_set", 0) == before
            t = parent.get_timestamp()  # waits the parent's lease out on the fake clock
            os.write(write_fd, f"{int(fresh)} {int(untouched)} {t}".encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_fd)
    ready, _, _ = select.select([read_fd], [], [], 30)
    if not ready:  # a hung child must not hang the suite
        os.kill(pid, signal.SIGKILL)
    with os.fdopen(read_fd) as pipe:
        answer = pipe.read() if ready else "the child hung"
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, answer
    fresh, untouched, child_ts = (int(x) for x in answer.split())
    assert fresh and untouched
    assert child_ts > limit > last, "above everything the parent's lease could hand out"
    assert parent.holds_lease and parent.instance_id == parent_id


def test_an_oracle_server_gets_in_beside_a_busy_local_holder(
    store: FaultyStore, clock: FakeClock
) -> None:
    """The holder keeps drawing timestamps; the server polls every 250 ms.  A holder that
    leased again right after releasing could make the server miss every window."""
    local = LocalOracle(store, clock=clock)
    server = OracleNode(OracleRecordRegister(store), "oracle:server-1", LeaseConfig(), clock)
    lease_now(local, clock)
    for step in range(400):  # 4 s of fake time, 10 ms per step
        try:
            local.get_timestamp()
        except OracleError:
            break  # the server took over: the local oracle refuses
        if step % 25 == 0:
            server.step()
        clock.advance(10)
    assert server.role is Role.ACTIVE, "the server never found the record unleased"


def test_an_oracle_server_ignores_a_local_lease_s_wall_clock_expiry(
    store: FaultyStore, clock: FakeClock
) -> None:
    """The expiry in a local lease comes from a client host's wall clock, which may run far
    behind the server's: only the server's monotonic clock may decide that it lapsed."""
    local = LocalOracle(store, clock=clock, lease_ms=400)
    lease_now(local, clock)
    server = OracleNode(OracleRecordRegister(store), "oracle:server-1", LeaseConfig(), clock)
    clock.wall += 60_000  # as seen by a server whose clock is a minute ahead
    server.step()
    assert server.role is Role.STANDBY


@both_renewals
def test_a_renewal_changes_the_record_even_if_the_wall_clock_stands_still(
    store: FaultyStore, clock: FakeClock, background: bool
) -> None:
    """Waiters judge a holder alive by its bytes changing."""
    oracle = LocalOracle(store, clock=clock, lease_ms=400, renew_in_background=background)
    lease_now(oracle, clock)
    oracle.get_timestamp()
    seen = OracleRecordRegister(store).read().raw
    clock.mono += 150  # the wall clock stands still: a renewal is due
    oracle.get_timestamp()
    renewal_done(oracle)
    assert oracle.holds_lease
    assert OracleRecordRegister(store).read().raw != seen


def test_lease_ms_must_be_zero_or_at_least_8(store: FaultyStore) -> None:
    for bad in (-1, 1, 7, 1.5, True, "400"):
        with pytest.raises(InvalidArgumentError, match="lease_ms"):
            LocalOracle(store, lease_ms=bad)  # type: ignore[arg-type]
    assert not LocalOracle(store, lease_ms=0).holds_lease


def test_a_process_paused_while_holding_the_lease_breaks_no_real_time_order(
    embedded_url: str,
) -> None:
    """Adversarial, with real processes and clocks: one process takes timestamps under its
    lease and is stopped (SIGSTOP) mid-run; another waits the lease out and takes its
    own; the first resumes.  Every call of both is checked for real-time order."""

    def worker(count: int, pace_ms: int) -> subprocess.Popen[str]:
        args = [embedded_url, str(count), "1", str(DEFAULT_BLOCK_MS), str(pace_ms)]
        return subprocess.Popen(
            [sys.executable, "-m", "tests.oracle.local_worker", *args],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    holder = worker(count=600, pace_ms=2)
    try:
        assert holder.stderr is not None
        line = holder.stderr.readline()
        assert line.strip() == "ready", line + holder.stderr.read()
        holder.send_signal(signal.SIGSTOP)
        other = worker(count=200, pace_ms=0)
        out_other, err_other = other.communicate(timeout=60)
        assert other.returncode == 0, err_other
        holder.send_signal(signal.SIGCONT)
        out_holder, err_holder = holder.communicate(timeout=60)
        assert holder.returncode == 0, err_holder
    finally:
        holder.kill()
        holder.wait()
    assert "lease_waits=0" not in err_other, "the second process never met the lease"
    assert "leased_batches=0" not in err_holder
    calls = [
        Call(*(int(x) for x in line.split()))
        for line in (out_holder + out_other).strip().splitlines()
    ]
    assert len(calls) == 800
    check_real_time_order(calls)


@contextlib.contextmanager
def stalled_renewal() -> Iterator[LocalOracle]:
    """A local oracle (``timeout_s`` 0.5, renewing in the background) that holds a lease
    and has just started a renewal, which stalls on the store until the block ends (at
    most 5 s); then the store answers again and the oracle is closed."""
    from percolator.store.memory import MemoryStore

    stall = threading.Event()
    released = threading.Event()

    class StallingStore(MemoryStore):
        def read_row(self, *args: object, **kwargs: object):  # type: ignore[no-untyped-def]
            if stall.is_set() and threading.current_thread().name.endswith("renewal"):
                released.wait(5)
            return super().read_row(*args, **kwargs)  # type: ignore[arg-type]

    oracle = LocalOracle(StallingStore(), timeout_s=0.5, renew_in_background=True)
    try:
        until = time.monotonic() + 0.3
        while time.monotonic() < until:  # takes and renews the lease
            oracle.get_timestamp()
        assert oracle.holds_lease
        stall.set()
        time.sleep(0.03)
        oracle.get_timestamp()  # due: starts the renewal, which stalls
        yield oracle
    finally:
        released.set()
        stall.clear()
        oracle.close()


def test_a_renewal_stalled_on_the_store_does_not_hold_a_batch_past_the_timeout() -> None:
    """A batch that finds the lease's validity over waits for the background renewal under
    way, but no longer than the oracle's ``timeout_s``: then OracleUnavailableError."""
    with stalled_renewal() as oracle:
        time.sleep(0.15)  # the lease's validity is over
        started = time.monotonic()
        with pytest.raises(OracleUnavailableError, match="renewal of its lease"):
            oracle.get_timestamp()
        assert time.monotonic() - started < 1.5


def test_close_does_not_wait_past_the_timeout_for_a_stalled_renewal() -> None:
    """``close`` waits for a renewal under way before it releases the lease, but no longer
    than the oracle's ``timeout_s``: then it returns without releasing (the lease lapses)."""
    with stalled_renewal() as oracle:
        started = time.monotonic()
        oracle.close()
        assert time.monotonic() - started < 1.5

"""The lease state machine, step by step, with deterministic clocks and scripted store faults."""

from __future__ import annotations

import pytest
from percolator.oracle.lease import LeaseConfig, OracleNode, Role

from percolator.errors import FencedError, InvalidArgumentError, OracleUnavailableError
from percolator.layout import META_FAMILY, META_TABLE
from percolator.testing import FaultyStore
from percolator.timestamps import LOGICAL_BITS, compose
from percolator.timestamps.record import (
    ORACLE_QUALIFIER,
    ORACLE_ROW,
    OracleRecord,
    OracleRecordRegister,
)
from tests.oracle.conftest import FakeClock

CONFIG = LeaseConfig(lease_ms=600, window_ms=600, margin_ms=100, max_count=10_000)


def node(store: FaultyStore, clock: FakeClock, name: str = "a") -> OracleNode:
    return OracleNode(OracleRecordRegister(store), name, CONFIG, clock)


def persisted(store: FaultyStore) -> OracleRecord:
    record = OracleRecordRegister(store).read().record
    assert record is not None
    return record


def must_allocate(n: OracleNode, store: FaultyStore, count: int = 1) -> list[int]:
    """Allocate and check the central invariant: nothing issued above the persisted mark."""
    a = n.allocate(count)
    n.confirm(a)
    assert a.first + a.count - 1 <= persisted(store).high_water
    return list(range(a.first, a.first + a.count))


def test_first_oracle_on_an_empty_store_becomes_active(
    store: FaultyStore, clock: FakeClock
) -> None:
    a = node(store, clock)
    assert a.info().role is Role.STANDBY
    a.step()
    assert a.role is Role.ACTIVE
    record = persisted(store)
    assert (record.epoch, record.holder, record.lease_ms) == (1, "a", 600)
    assert record.lease_expiry_ms == clock.wall + 600
    assert record.high_water == compose(clock.wall + 600)
    ts = must_allocate(a, store, 3)
    assert ts[0] == compose(clock.wall), "hybrid: the physical part is the clock"
    assert must_allocate(a, store)[0] == ts[-1] + 1


def test_timestamps_follow_the_clock_and_renewals_push_the_mark_ahead(
    store: FaultyStore, clock: FakeClock
) -> None:
    a = node(store, clock)
    a.step()
    seen = []
    for _ in range(20):
        clock.advance(CONFIG.renew_ms)
        a.step()
        seen += must_allocate(a, store, 5)
        assert persisted(store).high_water >= compose(clock.wall + 600)
    assert seen == sorted(set(seen))
    assert a.info().renewals == 20


def test_a_standby_waits_while_the_active_oracle_renews(
    store: FaultyStore, clock: FakeClock
) -> None:
    a, b = node(store, clock, "a"), node(store, clock, "b")
    a.step()
    b.step()
    for _ in range(30):  # 30 renewal periods: far longer than a lease
        clock.advance(CONFIG.renew_ms)
        a.step()
        b.step()
        assert b.role is Role.STANDBY
    with pytest.raises(OracleUnavailableError, match=r"standby.*lease held by 'a'"):
        b.allocate(1)
    assert persisted(store).epoch == 1


def test_a_standby_takes_over_after_the_lease_lapses_and_issues_above_the_old_mark(
    store: FaultyStore, clock: FakeClock
) -> None:
    a, b = node(store, clock, "a"), node(store, clock, "b")
    a.step()
    issued_by_a = must_allocate(a, store, 100)
    old = persisted(store)
    b.step()
    # a dies: no more renewals.  Until expiry + margin, b must not take over.
    clock.advance(600 + 100)
    b.step()
    assert b.info().role is Role.STANDBY, "not before expiry + margin"
    clock.advance(1)
    b.step()
    assert b.role is Role.ACTIVE
    new = persisted(store)
    assert new.epoch == old.epoch + 1 and new.holder == "b"
    first_of_b = must_allocate(b, store)[0]
    assert first_of_b > old.high_water > issued_by_a[-1]


def test_takeover_by_the_monotonic_clock_needs_no_wall_clock_agreement(store: FaultyStore) -> None:
    a_clock = FakeClock()
    b_clock = FakeClock(wall_ms=a_clock.wall - 3_600_000)  # b's wall clock is an hour late
    a, b = node(store, a_clock, "a"), node(store, b_clock, "b")
    a.step()
    b.step()  # b first sees a's record now
    for c in (a_clock, b_clock):
        c.advance(600 + 100)
    b.step()
    assert b.info().role is Role.STANDBY
    for c in (a_clock, b_clock):
        c.advance(1)
    b.step()
    assert b.role is Role.ACTIVE, "lease + margin of b's own monotonic time since it saw it"
    # ... and by then a has stopped serving by its own monotonic clock.
    with pytest.raises(FencedError, match="lost its lease"):
        a.allocate(1)


def test_a_paused_oracle_serves_nothing_on_waking(store: FaultyStore, clock: FakeClock) -> None:
    a, b = node(store, clock, "a"), node(store, clock, "b")
    a.step()
    must_allocate(a, store)
    b.step()
    clock.advance(5_000)  # a is paused (SIGSTOP): no steps, no renewals
    b.step()
    assert b.role is Role.ACTIVE
    # a wakes and a request arrives before its driver thread runs.
    with pytest.raises(FencedError):
        a.allocate(1)
    assert a.role is Role.STANDBY
    assert a.info().fenced == 1


def test_a_range_prepared_before_a_pause_is_not_handed_out(
    store: FaultyStore, clock: FakeClock
) -> None:
    a = node(store, clock, "a")
    a.step()
    prepared = a.allocate(10)
    a.confirm(prepared)  # fine while the lease is valid
    clock.advance(600 - 100)  # paused between allocate() and the response leaving
    with pytest.raises(FencedError, match=r"lost its lease|no longer holds"):
        a.confirm(prepared)


def test_validity_ends_a_margin_before_the_persisted_expiry(
    store: FaultyStore, clock: FakeClock
) -> None:
    a = node(store, clock, "a")
    a.step()
    allocation = a.allocate(1)
    assert allocation.valid_until_ms == persisted(store).lease_expiry_ms - 100
    clock.advance(600 - 100 - 1)
    a.confirm(allocation)
    clock.advance(1)
    with pytest.raises(FencedError):
        a.confirm(allocation)


def test_a_lost_compare_and_set_fences_at_once(store: FaultyStore, clock: FakeClock) -> None:
    a = node(store, clock, "a")
    a.step()
    must_allocate(a, store)
    # Someone else rewrites the record (an operator, a buggy peer): a's renewal must fail.
    stored = OracleRecordRegister(store).read()
    assert stored.record is not None
    OracleRecordRegister(store).compare_and_set(
        stored.raw, OracleRecord(epoch=9, high_water=stored.record.high_water, holder="x")
    )
    clock.advance(CONFIG.renew_ms)
    a.step()
    assert a.role is Role.STANDBY
    with pytest.raises(OracleUnavailableError, match="standby"):
        a.allocate(1)


def test_an_unknown_renewal_outcome_that_was_applied_counts_as_renewed(
    store: FaultyStore, clock: FakeClock
) -> None:
    a = node(store, clock, "a")
    a.step()
    store.fail("compare_and_set", applied=True)
    clock.advance(CONFIG.renew_ms)
    a.step()
    assert a.role is Role.ACTIVE and a.info().renewals == 1
    clock.advance(CONFIG.renew_ms)
    a.step()  # expects the bytes it wrote: no false fencing
    assert a.role is Role.ACTIVE and a.info().renewals == 2


def test_an_unknown_renewal_outcome_that_was_not_applied_is_retried(
    store: FaultyStore, clock: FakeClock
) -> None:
    a = node(store, clock, "a")
    a.step()
    store.fail("compare_and_set")
    clock.advance(CONFIG.renew_ms)
    a.step()
    assert a.role is Role.ACTIVE and a.info().renewals == 0
    must_allocate(a, store)  # still within its validity
    clock.advance(CONFIG.renew_ms)
    a.step()
    assert a.info().renewals == 1


def test_an_unknown_outcome_with_a_foreign_record_fences(
    store: FaultyStore, clock: FakeClock
) -> None:
    a = node(store, clock, "a")
    a.step()

    def someone_else_writes() -> None:
        stored = OracleRecordRegister(store).read()
        assert stored.record is not None
        OracleRecordRegister(store).compare_and_set(
            stored.raw, OracleRecord(epoch=7, high_water=stored.record.high_water, holder="z")
        )

    store.before("compare_and_set", lambda _: someone_else_writes(), times=1)
    store.fail("compare_and_set")
    clock.advance(CONFIG.renew_ms)
    a.step()
    assert a.role is Role.STANDBY


def test_a_store_outage_stops_serving_when_validity_runs_out(
    store: FaultyStore, clock: FakeClock
) -> None:
    a = node(store, clock, "a")
    a.step()
    store.fail("compare_and_set", times=3)
    store.fail("read_rows", times=3)
    for _ in range(3):  # three renewal periods: the validity (lease - margin) is used up
        clock.advance(CONFIG.renew_ms)
        a.step()  # renewal fails, the unknown-outcome re-read fails too
    clock.advance(1)
    with pytest.raises(FencedError):
        a.allocate(1)


def test_a_request_beyond_the_mark_raises_the_mark_first(
    store: FaultyStore, clock: FakeClock
) -> None:
    # A window of 4 ms holds 4 * 2**18 timestamps: five requests of 2**18 exhaust it.
    config = LeaseConfig(lease_ms=600, window_ms=4, margin_ms=100, max_count=1 << 18)
    a = OracleNode(OracleRecordRegister(store), "a", config, clock)
    a.step()
    marks = {persisted(store).high_water}
    last = 0
    for _ in range(5):
        allocation = a.allocate(1 << 18)
        assert allocation.first > last
        last = allocation.first + allocation.count - 1
        assert last <= persisted(store).high_water
        marks.add(persisted(store).high_water)
    assert len(marks) == 2, "the fifth request moved the mark once, before issuing"


def test_nothing_is_issued_above_the_mark_when_it_cannot_be_raised(
    store: FaultyStore, clock: FakeClock
) -> None:
    small = LeaseConfig(lease_ms=600, window_ms=1, margin_ms=100, max_count=1 << 18)
    a = OracleNode(OracleRecordRegister(store), "a", small, clock)
    a.step()
    room = persisted(store).high_water - compose(clock.wall) + 1  # one millisecond's worth
    assert room == (1 << LOGICAL_BITS) + 1
    a.allocate(room - 1)
    store.fail("compare_and_set")
    with pytest.raises(OracleUnavailableError, match="cannot persist"):
        a.allocate(2)
    assert a.info().last_issued == persisted(store).high_water - 1


def test_release_lets_a_standby_take_over_after_only_the_margin(
    store: FaultyStore, clock: FakeClock
) -> None:
    a, b = node(store, clock, "a"), node(store, clock, "b")
    a.step()
    last = must_allocate(a, store)[-1]
    b.step()
    a.stop()
    with pytest.raises(OracleUnavailableError, match="shutting down"):
        a.allocate(1)
    a.release()
    clock.advance(100 + 1)
    b.step()
    assert b.role is Role.ACTIVE
    assert must_allocate(b, store)[0] > last


def test_an_unleased_record_of_the_local_oracle_is_taken_over_at_once(
    store: FaultyStore, clock: FakeClock
) -> None:
    local = OracleRecord(epoch=4, high_water=compose(clock.wall + 50_000), holder="local:x")
    assert OracleRecordRegister(store).compare_and_set(None, local)
    a = node(store, clock, "a")
    a.step()
    assert a.role is Role.ACTIVE and persisted(store).epoch == 5
    assert must_allocate(a, store)[0] > local.high_water


def test_a_record_that_cannot_be_decoded_is_never_overwritten(
    store: FaultyStore, clock: FakeClock
) -> None:
    OracleRecordRegister(store).ensure_table()
    store.compare_and_set(META_TABLE, ORACLE_ROW, META_FAMILY, ORACLE_QUALIFIER, None, b"\x09?")
    a = node(store, clock, "a")
    for _ in range(5):
        a.step()
        clock.advance(10_000)
    assert a.role is Role.STANDBY
    value = store.read_row(META_TABLE, ORACLE_ROW)[(META_FAMILY, ORACLE_QUALIFIER)][0][1]
    assert value == b"\x09?"


def test_two_standbys_racing_produce_one_active(store: FaultyStore, clock: FakeClock) -> None:
    a, b, c = (node(store, clock, n) for n in "abc")
    a.step()
    b.step()
    c.step()
    clock.advance(2_000)  # a died
    b.step()
    c.step()
    assert [n.role for n in (b, c)].count(Role.ACTIVE) == 1


@pytest.mark.parametrize("count", [0, -3, CONFIG.max_count + 1])
def test_bad_counts_are_refused(store: FaultyStore, clock: FakeClock, count: int) -> None:
    a = node(store, clock, "a")
    a.step()
    with pytest.raises(InvalidArgumentError, match=r"count must be in \[1, 10000\]"):
        a.allocate(count)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"margin_ms": 0},
        {"lease_ms": 200, "margin_ms": 100},
        {"window_ms": 0},
        {"max_count": 0},
    ],
)
def test_bad_lease_configs_are_refused(kwargs: dict[str, int]) -> None:
    with pytest.raises(InvalidArgumentError):
        LeaseConfig(**kwargs)


def test_a_wall_clock_step_on_the_host_stops_the_holder_before_a_standby_takes_over(
    store: FaultyStore, clock: FakeClock
) -> None:
    """Two servers on one host share its wall clock: when it steps forward past the lease's
    stored expiry, the standby takes over by it while the holder's monotonic validity still
    runs.  The holder stops serving at its own stored expiry, so it never issues below the
    new holder's timestamps."""
    config = LeaseConfig(lease_ms=3000, window_ms=10_000, margin_ms=500, max_count=10_000)
    register = OracleRecordRegister(store)
    a, b = OracleNode(register, "a", config, clock), OracleNode(register, "b", config, clock)
    a.step()
    must_allocate(a, store)
    b.step()
    clock.advance(800)
    a.step()  # renews
    must_allocate(a, store)
    clock.wall += 4000  # an NTP step; the monotonic clock does not move
    clock.advance(100)
    b.step()
    assert b.role is Role.ACTIVE
    issued_by_b = must_allocate(b, store)[0]
    with pytest.raises(FencedError, match="wall clock passed the lease's stored expiry"):
        a.allocate(1)
    assert a.role is Role.STANDBY
    assert issued_by_b > 0

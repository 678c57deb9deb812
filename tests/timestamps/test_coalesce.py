"""Request coalescing: one fetch in flight, each fetch serving every waiter."""

from __future__ import annotations

import threading
import time

import pytest

from percolator.errors import InvalidArgumentError, OracleUnavailableError, TimestampRegressionError
from percolator.timestamps.coalesce import Coalescer


class Source:
    """A fetch function handing out consecutive ranges; can be held or made to fail."""

    def __init__(self, start: int = 1000) -> None:
        self.next = start
        self.calls: list[int] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.hold = threading.Event()
        self.hold.set()
        self.entered = threading.Event()
        self.fail_next: Exception | None = None
        self.lock = threading.Lock()

    def __call__(self, total: int) -> int:
        with self.lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        self.entered.set()
        self.hold.wait()
        try:
            self.calls.append(total)
            if self.fail_next is not None:
                exc, self.fail_next = self.fail_next, None
                raise exc
            first = self.next
            self.next += total
            return first
        finally:
            with self.lock:
                self.in_flight -= 1


def wait_queued(coalescer: Coalescer, n: int) -> None:
    deadline = time.monotonic() + 10
    while len(coalescer._pending) < n:
        assert time.monotonic() < deadline, "threads did not queue"
        time.sleep(0.001)


def test_sequential_requests_get_consecutive_ranges() -> None:
    source = Source()
    c = Coalescer(source, max_batch=100)
    assert c.take(1) == [1000]
    assert c.take(3) == [1001, 1002, 1003]
    assert source.calls == [1, 3]
    assert c.last_seen == 1003


def test_waiters_behind_a_fetch_in_flight_share_the_next_fetch() -> None:
    source = Source()
    c = Coalescer(source, max_batch=1000)
    source.hold.clear()
    results: dict[int, list[int]] = {}

    def ask(i: int) -> None:
        results[i] = c.take(2)

    leader = threading.Thread(target=ask, args=(-1,))
    leader.start()
    assert source.entered.wait(5)
    threads = [threading.Thread(target=ask, args=(i,)) for i in range(50)]
    for t in threads:
        t.start()
    wait_queued(c, 50)
    source.hold.set()
    for t in [leader, *threads]:
        t.join(10)
    assert source.calls == [2, 100], "one fetch for the leader, one for all 50 waiters"
    assert source.max_in_flight == 1
    every = sorted(ts for r in results.values() for ts in r)
    assert every == list(range(1000, 1102))
    for r in results.values():
        assert r[1] == r[0] + 1


def test_batches_are_capped_at_max_batch_and_large_requests_split() -> None:
    source = Source()
    c = Coalescer(source, max_batch=10)
    values = c.take(25)
    assert values == list(range(1000, 1025))
    assert source.calls == [10, 10, 5]


def test_a_failed_fetch_fails_its_whole_batch_and_the_next_batch_still_runs() -> None:
    source = Source()
    c = Coalescer(source, max_batch=1000)
    source.hold.clear()
    outcomes: list[object] = []
    lock = threading.Lock()

    def ask() -> None:
        try:
            r: object = c.take(1)
        except OracleUnavailableError as exc:
            r = exc
        with lock:
            outcomes.append(r)

    leader = threading.Thread(target=ask)
    leader.start()
    assert source.entered.wait(5)
    source.fail_next = OracleUnavailableError("down")
    source.hold.set()
    leader.join(5)
    assert isinstance(outcomes[0], OracleUnavailableError)
    assert c.take(1) == [1000], "a failure does not stick"


def test_a_range_not_above_what_was_handed_out_is_a_regression() -> None:
    firsts = iter([500, 400, 501, 600])
    c = Coalescer(lambda total: next(firsts), max_batch=10)
    assert c.take(2) == [500, 501]
    with pytest.raises(TimestampRegressionError, match="not above"):
        c.take(1)  # 400 <= 501
    with pytest.raises(TimestampRegressionError):
        c.take(1)  # 501 <= 501: equal is a regression too
    assert c.take(1) == [600]


@pytest.mark.parametrize("count", [0, -1, True, 1.5])
def test_bad_counts_are_refused(count: object) -> None:
    c = Coalescer(Source(), max_batch=10)
    with pytest.raises(InvalidArgumentError):
        c.take(count)  # type: ignore[arg-type]

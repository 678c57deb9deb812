"""The fault-injecting store wrapper (percolator/testing/faults.py) does what it promises:
a lost request changes nothing, a lost reply has changed the store, counts and predicates
pick the calls, hooks run in order and may use the store themselves."""

from __future__ import annotations

import threading

import pytest

from percolator.errors import StoreUnavailableError
from percolator.store.base import FamilySpec, Put
from percolator.store.memory import MemoryStore
from percolator.testing import Call, FaultyStore


@pytest.fixture
def faulty() -> FaultyStore:
    store = FaultyStore(MemoryStore())
    store.create_table("t", [FamilySpec("d")])
    return store


def value(store: FaultyStore) -> bytes | None:
    versions = store.inner.read_row("t", b"r").get(("d", b"q"), [])
    return versions[0][1] if versions else None


def test_a_lost_request_changes_nothing(faulty: FaultyStore) -> None:
    faulty.fail("compare_and_set")
    with pytest.raises(StoreUnavailableError, match="before it reached the store"):
        faulty.compare_and_set("t", b"r", "d", b"q", None, b"1")
    assert value(faulty) is None
    assert faulty.compare_and_set("t", b"r", "d", b"q", None, b"1")  # used up


def test_a_lost_reply_has_changed_the_store(faulty: FaultyStore) -> None:
    faulty.fail("compare_and_set", applied=True)
    with pytest.raises(StoreUnavailableError, match="reply was lost"):
        faulty.compare_and_set("t", b"r", "d", b"q", None, b"1")
    assert value(faulty) == b"1"
    assert faulty.stats.calls["compare_and_set"] == 1  # the inner store's counters


def test_counts_predicates_and_errors_pick_the_calls(faulty: FaultyStore) -> None:
    rule = faulty.fail("put", times=2, when=lambda call: call["table"] == "t")
    for _ in range(2):
        with pytest.raises(StoreUnavailableError):
            faulty.put("t", [Put(b"r", "d", b"q", 1, b"v")])
    faulty.put("t", [Put(b"r", "d", b"q", 1, b"v")])
    assert rule.hits == 2 and rule.remaining == 0
    faulty.fail("read_rows", times=None, error=KeyboardInterrupt)
    for _ in range(3):
        with pytest.raises(KeyboardInterrupt):
            faulty.read_row("t", b"r")  # read_row goes through read_rows
    faulty.clear()
    assert faulty.read_row("t", b"r") == {("d", b"q"): [(1, b"v")]}


def test_read_cells_is_a_read_rows_call_for_the_rules(faulty: FaultyStore) -> None:
    faulty.put("t", [Put(b"r", "d", b"q", 1, b"v")])
    seen: list[Call] = []
    faulty.before("read_rows", seen.append, times=None)
    faulty.fail("read_rows", when=lambda call: call["rows"] == [b"r"])
    with pytest.raises(StoreUnavailableError):
        faulty.read_cells("t", [(b"r", ("d", b"q"))])
    assert faulty.read_cells("t", [(b"r", ("d", b"q"))]) == {b"r": {("d", b"q"): [(1, b"v")]}}
    assert [(call["rows"], call["columns"], call["cells"]) for call in seen] == [
        ([b"r"], [("d", b"q")], [(b"r", ("d", b"q"))])
    ] * 2


def test_the_oldest_matching_fault_takes_the_call(faulty: FaultyStore) -> None:
    faulty.fail("list_tables", error=ValueError("first"))
    faulty.fail("list_tables", error=ValueError("second"))
    for expected in ("first", "second"):
        with pytest.raises(ValueError, match=expected):
            faulty.list_tables()
    assert faulty.list_tables() == ["t"]


def test_hooks_run_around_the_call_and_may_use_the_store(faulty: FaultyStore) -> None:
    seen: list[str] = []

    def another_writer(call: Call) -> None:
        seen.append(f"before {call.method}")
        # Through the wrapper: the fault below was already taken by the outer call.
        assert faulty.compare_and_set("t", b"r", "d", b"q", None, b"other")

    faulty.before("compare_and_set", another_writer, times=1)
    faulty.fail("compare_and_set", applied=True)
    faulty.after("compare_and_set", lambda call, result: seen.append(f"after {result}"))
    with pytest.raises(StoreUnavailableError):
        faulty.compare_and_set("t", b"r", "d", b"q", None, b"mine")
    assert value(faulty) == b"other"  # ours lost its compare-and-set, and then its reply
    assert faulty.compare_and_set("t", b"r", "d", b"q", b"other", b"mine")
    # The other writer's call, then ours (no after hook: its reply was lost), then the retry.
    assert seen == ["before compare_and_set", "after True", "after True"]


def test_a_hanging_call_waits_for_its_release(faulty: FaultyStore) -> None:
    faulty.put("t", [Put(b"r", "d", b"q", 1, b"v")])
    gate = threading.Event()
    faulty.hang("scan", until=gate)
    rows: list[bytes] = []
    scanner = threading.Thread(target=lambda: rows.extend(r for r, _ in faulty.scan("t", "d")))
    scanner.start()
    scanner.join(0.2)
    assert scanner.is_alive() and rows == []
    gate.set()
    scanner.join(5)
    assert rows == [b"r"]


def test_an_unknown_method_is_refused(faulty: FaultyStore) -> None:
    with pytest.raises(ValueError, match="unknown store method"):
        faulty.fail("compare_and_swap")
    with pytest.raises(ValueError, match="times"):
        faulty.fail("put", times=0)

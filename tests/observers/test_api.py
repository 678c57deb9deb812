"""Declaring observers and registering the columns they watch (observers/api.py, on the
registry of percolator/notifications.py, whose own scenarios are in test_notifications.py)."""

from __future__ import annotations

import time
from collections.abc import Sequence

import pytest
from percolator.observers.api import (
    Observer,
    check_observer,
    forget_observer,
    register_observers,
    trigger,
    unregister_observer,
)
from percolator.observers.drain import run_until_quiet
from percolator.observers.parking import pending

import percolator
from percolator.errors import ConfigError, InvalidArgumentError
from percolator.notifications import registrations
from percolator.transaction import Transaction
from tests.observers import helpers
from tests.observers.conftest import REFRESH_MS, connect
from tests.observers.helpers import EVENTS, RunLogger


def notified(client: percolator.Client, column: str = "value") -> list[bytes]:
    return [row for row, _, _ in pending(client, EVENTS, [column])]


def test_registration_is_stored_and_read_back(client: percolator.Client) -> None:
    register_observers(client, [RunLogger(), helpers.WeakRunLogger()])
    found = registrations(client.store)
    assert found[(EVENTS, "value")].observer == "run-logger"
    assert found[(EVENTS, "value")].weak is False
    assert found[(EVENTS, "weak")].weak is True
    assert {(EVENTS, "value"), (EVENTS, "weak")} <= client.observed_columns()


def test_a_client_that_cached_the_set_before_registration_notifies_once_it_returns(
    store_url: str,
) -> None:
    """The guarantee: every transaction that starts after register_observers returned
    notifies, in every client - also one whose cached observed set predates it."""
    registrar, writer = connect(store_url), connect(store_url)
    try:
        helpers.create_tables(registrar)
        with writer.transaction() as txn:  # loads the writer's cache: nothing observed
            txn.set(EVENTS, b"before", "value", b"x")
        assert notified(writer) == []
        # No catch-up: only the writer's own notifications are looked at here.
        register_observers(registrar, [RunLogger()], catch_up=False)
        with writer.transaction() as txn:
            txn.set(EVENTS, b"after", "value", b"x")
        assert notified(writer) == [b"after"]
    finally:
        registrar.close()
        writer.close()


def test_registration_waits_one_refresh_interval_and_re_registration_does_not(
    memory_client: percolator.Client,
) -> None:
    started = time.monotonic()
    register_observers(memory_client, [RunLogger()])
    assert time.monotonic() - started >= REFRESH_MS / 1000
    # Found in place: dated by the store's clock, allowing one second of clock skew.
    time.sleep(1 + REFRESH_MS / 1000)
    started = time.monotonic()
    register_observers(memory_client, [RunLogger()])  # visible for long enough already
    assert time.monotonic() - started < REFRESH_MS / 1000


def test_one_observer_per_column(memory_client: percolator.Client) -> None:
    register_observers(memory_client, [RunLogger()])

    class Another(RunLogger):
        name = "another"

    with pytest.raises(ConfigError, match="already watched by observer 'run-logger'"):
        register_observers(memory_client, [Another()])
    assert registrations(memory_client.store)[(EVENTS, "value")].observer == "run-logger"


def test_a_conflict_on_one_column_registers_nothing(memory_client: percolator.Client) -> None:
    """All or nothing: an observer (or a list of them) with one column already taken
    leaves no other column registered."""
    register_observers(memory_client, [RunLogger()])

    class Wider(RunLogger):
        name = "wider"
        columns: Sequence[str] = ("weak", "value")

    class First(RunLogger):
        name = "first"
        columns: Sequence[str] = ("other",)

    with pytest.raises(ConfigError, match="nothing was registered"):
        register_observers(memory_client, [First(), Wider()])
    assert set(registrations(memory_client.store)) == {(EVENTS, "value")}

    class Twin(First):
        name = "twin"

    with pytest.raises(ConfigError, match="already watched by observer 'first'"):
        register_observers(memory_client, [First(), Twin()])
    assert set(registrations(memory_client.store)) == {(EVENTS, "value")}


def test_trigger_refuses_a_single_row_given_as_rows(memory_client: percolator.Client) -> None:
    register_observers(memory_client, [RunLogger()], catch_up=False)
    for single in ("row1", b"row1"):
        with pytest.raises(InvalidArgumentError, match="single row"):
            trigger(memory_client, EVENTS, single, "value")
    assert notified(memory_client) == []


def test_unregister_stops_notifications_and_allows_another_observer(
    memory_client: percolator.Client,
) -> None:
    client = memory_client
    register_observers(client, [RunLogger()])
    assert unregister_observer(client, "run-logger") == [(EVENTS, "value")]
    assert (EVENTS, "value") not in client.observed_columns()
    with client.transaction() as txn:
        txn.set(EVENTS, b"r", "value", b"x")
    assert notified(client) == []

    class Another(RunLogger):
        name = "another"

    register_observers(client, [Another()])
    assert registrations(client.store)[(EVENTS, "value")].observer == "another"


def test_a_delete_made_while_its_observer_was_away_outlives_gc_until_it_is_run(
    local_client: percolator.Client,
) -> None:
    """Unregistered, an observer gets no notification of a delete; registered again, it
    catches up from the cell's lock cell (observers/catchup.py).  GC must not remove that
    dead cell meanwhile, since the observer's ack predates the delete, or the delete is lost
    to the observer for good.  Once a run has seen it, the cell goes."""
    client = local_client
    observer = RunLogger()
    register_observers(client, [observer])
    with client.transaction() as txn:
        txn.set(EVENTS, b"gone", "value", b"x")
    written = txn.commit_ts
    run_until_quiet(client, [observer])
    assert unregister_observer(client, "run-logger")
    with client.transaction() as txn:
        txn.delete(EVENTS, b"gone", "value")
    deleted = txn.commit_ts
    assert notified(client) == []  # nobody watches the column: no notification
    time.sleep(0.01)  # the lock cell's stamp falls below the store's clock (docs/gc.md)
    report = client.gc(life_time_ms=0)
    assert report.bound > deleted
    assert (report.dead_cells_removed, report.dead_cells_owed) == (0, 1)

    register_observers(client, [observer])
    run_until_quiet(client, [observer])
    assert helpers.runs(client.snapshot())[b"gone"] == [written, deleted]
    time.sleep(0.01)
    report = client.gc(life_time_ms=0)
    assert (report.dead_cells_removed, report.dead_cells_owed) == (1, 0)


def test_forgetting_an_observer_removed_for_good_lets_gc_remove_what_it_kept(
    local_client: percolator.Client,
) -> None:
    client = local_client
    observer = RunLogger()
    register_observers(client, [observer])
    with client.transaction() as txn:
        txn.set(EVENTS, b"gone", "value", b"x")
    run_until_quiet(client, [observer])
    with pytest.raises(ConfigError, match="is registered"):
        forget_observer(client, "run-logger")
    assert unregister_observer(client, "run-logger")
    with client.transaction() as txn:
        txn.delete(EVENTS, b"gone", "value")
    time.sleep(0.01)  # the lock cell's stamp falls below the store's clock (docs/gc.md)
    assert client.gc(life_time_ms=0).dead_cells_owed == 1
    done: list[tuple[str, int]] = []
    assert forget_observer(client, "run-logger", progress=lambda *t: done.append(t)) == 1
    assert (EVENTS, 1) in done and sorted(t for t, _ in done) == sorted(client.list_tables())
    assert forget_observer(client, "run-logger") == 0  # idempotent
    time.sleep(0.01)
    report = client.gc(life_time_ms=0)
    # The deleted cell, and the ack cell, deleted now.
    assert (report.dead_cells_owed, report.dead_cells_removed) == (0, 2)


def test_trigger_notifies_existing_data(memory_client: percolator.Client) -> None:
    client = memory_client
    with client.transaction() as txn:
        txn.set(EVENTS, b"old", "value", b"written before registration")
    register_observers(client, [RunLogger()], catch_up=False)
    assert notified(client) == []
    notify_ts = trigger(client, EVENTS, [b"old", "other"], "value")
    assert [(r, v) for r, _, v in pending(client, EVENTS)] == [
        (b"old", notify_ts),
        (b"other", notify_ts),
    ]


class _Good(Observer):
    name = "good"
    table = "t"
    columns: Sequence[str] = ("a",)

    def process(self, txn: Transaction, row: bytes, column: str) -> None:
        pass


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("name", "bad name!", "name 'bad name!' is invalid"),
        ("name", "", "name '' is invalid"),
        ("table", "percolator_meta", "reserved"),
        ("table", 7, "table name must be a str"),
        ("columns", (), "non-empty sequence"),
        ("columns", "a", "non-empty sequence"),
        ("columns", ("!ack",), "reserved"),
        ("columns", ("a", "a"), "repeat"),
        ("weak", "yes", "weak must be True or False"),
        ("reads", "title", "reads must be a sequence of column names"),
        ("reads", ("!ack",), "reads: .*reserved"),
    ],
)
def test_malformed_declarations_are_rejected_naming_the_problem(
    field: str, value: object, message: str
) -> None:
    observer = _Good()
    setattr(observer, field, value)
    with pytest.raises(InvalidArgumentError, match=message):
        check_observer(observer)


def test_something_else_is_not_an_observer() -> None:
    with pytest.raises(
        InvalidArgumentError, match=r"subclass percolator\.observers\.api\.Observer"
    ):
        check_observer(object())
    assert check_observer(_Good()).name == "good"


def test_trigger_refuses_a_column_no_observer_watches(memory_client: percolator.Client) -> None:
    register_observers(memory_client, [RunLogger()], catch_up=False)
    for table, column in ((EVENTS, "valeu"), ("evnets", "value")):
        with pytest.raises(InvalidArgumentError, match=f"no observer watches {table}/{column}"):
            trigger(memory_client, table, [b"r"], column)
    assert notified(memory_client) == []
    assert unregister_observer(memory_client, "run-logger")
    with pytest.raises(InvalidArgumentError, match="observed columns: none"):
        trigger(memory_client, EVENTS, [b"r"], "value")
    assert notified(memory_client) == []

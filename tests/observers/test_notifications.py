"""The notification protocol's home (percolator/notifications.py), script by script on the
memory store: the notify family's put, scan and cleanup, the observed-column registry and
its cached set, and the ack codec with the observer transaction."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import percolator
from percolator import failpoints
from percolator.errors import ConfigError, InvalidArgumentError, PercolatorError
from percolator.failpoints import FailpointError
from percolator.layout import (
    META_FAMILIES,
    META_FAMILY,
    META_TABLE,
    TABLE_FAMILIES,
    ack_column,
    acked_qualifier,
)
from percolator.notifications import (
    OBSERVED_QUALIFIER,
    OBSERVED_TOMBSTONE,
    Notification,
    ObservedColumns,
    Registration,
    claim_column,
    decode_ack,
    delete_notifications,
    encode_ack,
    load_observed_columns,
    observed_refresh_ms,
    observed_row,
    parse_observed_row,
    pending,
    put_notifications,
    read_ack,
    registrations,
    release_columns,
    scan_notifications,
    write_ack,
)
from percolator.protocol.cells import CellKey
from percolator.store import open_store
from percolator.store.base import Store
from tests.observers.conftest import REFRESH_MS
from tests.observers.helpers import EVENTS, MIRROR


@pytest.fixture
def store(memory_url: str) -> Iterator[Store]:
    with open_store(memory_url) as store:
        store.create_table(EVENTS, TABLE_FAMILIES)
        store.create_table(MIRROR, TABLE_FAMILIES)
        store.create_table(META_TABLE, META_FAMILIES)
        yield store


def key(row: bytes, column: str = "value", table: str = EVENTS) -> CellKey:
    return CellKey(table, row, column)


def must_pending(store: Store, table: str, *expected: tuple[bytes, str, int]) -> None:
    assert [(n.row, n.column, n.notify_ts) for n in pending(store, table)] == list(expected)


# --------------------------------------------------------------------------- put and scan


def test_put_leaves_one_notification_per_cell_at_the_given_timestamp(store: Store) -> None:
    put_notifications(store, [key(b"b"), key(b"a", "x"), key(b"a"), key(b"m", table=MIRROR)], 7)
    must_pending(store, EVENTS, (b"a", "value", 7), (b"a", "x", 7), (b"b", "value", 7))
    must_pending(store, MIRROR, (b"m", "value", 7))
    put_notifications(store, [], 8)  # nothing to notify: no store call, no error
    put_notifications(store, [key(b"b")], 7)  # idempotent
    must_pending(store, EVENTS, (b"a", "value", 7), (b"a", "x", 7), (b"b", "value", 7))


def test_a_scan_sees_the_newest_version_so_changes_fold(store: Store) -> None:
    for ts in (5, 9, 7):
        put_notifications(store, [key(b"r")], ts)
    assert pending(store, EVENTS) == [Notification(EVENTS, b"r", "value", 9)]


def test_scan_goes_row_by_row_within_bounds_and_columns(store: Store) -> None:
    put_notifications(store, [key(r, c) for r in (b"a", b"b", b"c") for c in ("x", "y")], 3)
    rows = list(scan_notifications(store, EVENTS, ["y"], start=b"b", batch_size=1))
    assert rows == [
        (b"b", [Notification(EVENTS, b"b", "y", 3)]),
        (b"c", [Notification(EVENTS, b"c", "y", 3)]),
    ]
    rows = list(scan_notifications(store, EVENTS, stop=b"b"))
    assert rows == [(b"a", [Notification(EVENTS, b"a", c, 3) for c in ("x", "y")])]
    assert [n.row for n in pending(store, EVENTS, ["x"], limit=2)] == [b"a", b"b"]


# --------------------------------------------------------------------------- cleanup


def test_cleanup_deletes_up_to_the_version_seen_never_newer(store: Store) -> None:
    put_notifications(store, [key(b"r")], 5)
    [seen] = pending(store, EVENTS)
    put_notifications(store, [key(b"r")], 9)  # a commit after the scan
    delete_notifications(store, seen)
    must_pending(store, EVENTS, (b"r", "value", 9))
    delete_notifications(store, seen)  # idempotent
    must_pending(store, EVENTS, (b"r", "value", 9))
    delete_notifications(store, Notification(EVENTS, b"r", "value", 9))
    must_pending(store, EVENTS)


def test_cleanup_masks_a_later_put_at_or_below_its_bound(store: Store) -> None:
    """Why notifications are put at commit_ts: one put at an older timestamp (a start_ts)
    after a cleanup at T >= that timestamp is lost."""
    put_notifications(store, [key(b"r")], 10)
    delete_notifications(store, Notification(EVENTS, b"r", "value", 10))
    put_notifications(store, [key(b"r")], 4)
    must_pending(store, EVENTS)
    put_notifications(store, [key(b"r")], 11)
    must_pending(store, EVENTS, (b"r", "value", 11))


def test_a_commit_notifies_at_commit_ts_before_its_commit_point(
    memory_client: percolator.Client,
) -> None:
    client = memory_client
    claim_column(client.store, Registration(EVENTS, "value", "obs", False))
    client.refresh_observed()
    with client.transaction() as txn:
        txn.set(EVENTS, b"r", "value", b"x")
        txn.set(EVENTS, b"r", "other", b"x")  # not observed: no notification
    must_pending(client.store, EVENTS, (b"r", "value", txn.commit_ts or 0))
    failpoints.enable("commit.before_primary", "raise")
    try:
        with pytest.raises(FailpointError), client.transaction() as aborted:
            aborted.set(EVENTS, b"s", "value", b"x")
    finally:
        failpoints.disable()
    # Written before the commit point, so a crash there cannot lose it; a spurious one
    # for the aborted transaction is harmless (its run finds nothing committed).
    assert [n.row for n in pending(client.store, EVENTS)] == [b"r", b"s"]


# --------------------------------------------------------------------------- registry


def test_observed_rows_round_trip_and_malformed_ones_are_named() -> None:
    assert parse_observed_row(observed_row("t", "a/b")) == ("t", "a/b")
    with pytest.raises(ConfigError, match="malformed observed-column row"):
        parse_observed_row(b"observed/no-column")


def test_registration_codec_round_trips() -> None:
    reg = Registration("t", "a/b", "obs", True)
    assert Registration.decode("t", "a/b", reg.encode()) == reg
    assert reg.encode() == b'{"observer":"obs","v":1,"weak":true}'


def test_a_malformed_registration_is_a_clear_error(memory_client: percolator.Client) -> None:
    memory_client.store.compare_and_set(
        META_TABLE, observed_row(EVENTS, "x"), META_FAMILY, OBSERVED_QUALIFIER, None, b"{oops"
    )
    with pytest.raises(ConfigError, match=f"{EVENTS}/x .*malformed"):
        registrations(memory_client.store)


def test_claim_is_idempotent_exclusive_and_release_leaves_a_tombstone(store: Store) -> None:
    strong = Registration(EVENTS, "value", "obs", False)
    assert claim_column(store, strong)[0] is True
    assert claim_column(store, strong)[0] is False  # already held: nothing written
    assert claim_column(store, Registration(EVENTS, "value", "obs", True))[0] is True
    assert registrations(store)[(EVENTS, "value")].weak is True
    with pytest.raises(ConfigError, match="already watched by observer 'obs'"):
        claim_column(store, Registration(EVENTS, "value", "other", False))
    claim_column(store, Registration(MIRROR, "value", "other", False))
    assert load_observed_columns(store) == {(EVENTS, "value"), (MIRROR, "value")}

    assert release_columns(store, "obs") == [(EVENTS, "value")]
    assert release_columns(store, "obs") == []
    cells = store.read_row(META_TABLE, observed_row(EVENTS, "value"))
    assert cells[(META_FAMILY, OBSERVED_QUALIFIER)][0][1] == OBSERVED_TOMBSTONE
    assert load_observed_columns(store) == {(MIRROR, "value")}
    assert claim_column(store, Registration(EVENTS, "value", "other", False))[0] is True


def test_the_cached_set_is_reloaded_by_the_first_use_after_the_interval(store: Store) -> None:
    now = [100.0]
    cache = ObservedColumns(store, refresh_ms=2000, clock=lambda: now[0])
    assert cache.current() == frozenset()  # never loaded: loads now
    claim_column(store, Registration(EVENTS, "value", "obs", False))
    now[0] += 2.0
    assert not cache.is_observed(key(b"r"))  # within the interval: the cached set
    now[0] += 0.001
    assert cache.is_observed(key(b"r"))  # past it: reloaded before answering
    release_columns(store, "obs")
    assert cache.refresh() == frozenset()  # an explicit refresh does not wait


def test_the_refresh_interval_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert observed_refresh_ms() == REFRESH_MS
    # "²" and "٣" pass str.isdigit(); int() refuses the first, and neither is a number here
    for bad in ("soon", "²", "٣"):
        monkeypatch.setenv("PERCOLATOR_OBSERVED_REFRESH_MS", bad)
        with pytest.raises(ConfigError, match="PERCOLATOR_OBSERVED_REFRESH_MS"):
            observed_refresh_ms()
    monkeypatch.delenv("PERCOLATOR_OBSERVED_REFRESH_MS")
    assert observed_refresh_ms() == 2000


# --------------------------------------------------------------------------- acks


def test_ack_codec_and_column_name() -> None:
    assert ack_column("obs", "a/b") == "!ack/obs/a/b"
    assert acked_qualifier(b"!ack/obs/a/b") == b"a/b"
    assert acked_qualifier(b"a/b") is None and acked_qualifier(b"!ack/obs") is None
    assert acked_qualifier(b"!txn/a") is None
    assert encode_ack(1 << 40) == b"\x00\x00\x01\x00\x00\x00\x00\x00"
    assert decode_ack(encode_ack(1 << 40)) == 1 << 40
    assert decode_ack(None) is None
    with pytest.raises(ConfigError, match="ack cell t/r holds 3 bytes"):
        decode_ack(b"abc", where="t/r")


def test_only_an_observer_transaction_writes_acks(memory_client: percolator.Client) -> None:
    client = memory_client
    with client.transaction() as txn, pytest.raises(InvalidArgumentError, match="reserved"):
        write_ack(txn, "obs", EVENTS, b"r", "value", 5)
    txn = client.observer_transaction()
    assert read_ack(txn, "obs", EVENTS, b"r", "value") is None
    write_ack(txn, "obs", EVENTS, b"r", "value", 5)
    assert txn.commit() is not None
    reader = client.observer_transaction()
    assert read_ack(reader, "obs", EVENTS, b"r", "value") == 5
    reader.rollback()


def test_a_closed_client_gives_no_observer_transaction(memory_url: str) -> None:
    client = percolator.connect(memory_url)
    client.close()
    with pytest.raises(PercolatorError, match="closed"):
        client.observer_transaction()

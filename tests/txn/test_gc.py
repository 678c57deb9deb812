"""Garbage collection: safe point, lock resolution below it, old versions removed."""

from __future__ import annotations

import time

import pytest

import percolator
from percolator import failpoints
from percolator.errors import SafePointError
from percolator.layout import DATA, LOCK, META_FAMILY, META_TABLE, WRITE
from percolator.protocol.gc import lock_report, owes_delete
from percolator.readers import (
    RESERVATION_KEEP_MS,
    RESERVE_PREFIX,
    collect_reservations,
    read_safe_point,
    scan_reservations,
)
from percolator.records import CommitInfo, Kind, LockCell, LockInfo
from percolator.store.base import ScanOptions
from percolator.timestamps import now_ms

# Garbage collection on every backend, and with every kind of oracle.
pytestmark = pytest.mark.every_oracle


def versions(client: percolator.Client, family: str, row: bytes, column: str) -> list[int]:
    cells = client.store.read_row("t", row, columns=[(family, column.encode())], max_versions=1000)
    return [ts for ts, _ in cells.get((family, column.encode()), [])]


def test_gc_keeps_newest_version_below_safe_point(client: percolator.Client) -> None:
    commits = []
    for i in range(5):
        txn = client.transaction()
        txn.set("t", b"k", "c", f"v{i}".encode())
        txn.set("t", b"other", "c", b"x" if i == 0 else f"o{i}".encode())
        commits.append(txn.commit())
    assert len(versions(client, DATA, b"k", "c")) == 5

    report = client.gc(life_time_ms=0)

    assert report.safe_point >= commits[-1]
    assert read_safe_point(client.store)[0] == report.safe_point
    assert versions(client, DATA, b"k", "c") == [versions(client, DATA, b"k", "c")[0]]
    assert len(versions(client, WRITE, b"k", "c")) == 1
    assert client.snapshot().get("t", b"k", "c") == b"v4"
    # Reads below the safe point are refused with a clear error, not a wrong answer.
    with pytest.raises(SafePointError, match="safe point"):
        client.snapshot(commits[0])
    # A second run has nothing left to collect.
    assert client.gc(life_time_ms=0).cells_collected == 0


def test_gc_resolves_dead_locks_first(client: percolator.Client) -> None:
    from percolator.testing import ProtocolHarness

    client.run(lambda t: t.set("t", b"k", "c", b"committed"))
    h = ProtocolHarness(client.store, "t")
    start_ts = client.oracle.get_timestamp()
    h.must_prewrite([(b"k", "c", b"dead")], primary=(b"k", "c"), start_ts=start_ts, ttl_ms=1)
    assert len(lock_report(client.store, "t")) == 1
    time.sleep(0.01)  # let the 1 ms TTL lapse on the real clock the GC uses
    report = client.gc(life_time_ms=0)
    assert report.locks_resolved == 1
    assert lock_report(client.store, "t") == []
    assert client.snapshot().get("t", b"k", "c") == b"committed"


def test_gc_safe_point_stays_below_live_lock(client: percolator.Client) -> None:
    from percolator.testing import ProtocolHarness

    h = ProtocolHarness(client.store, "t")
    start_ts = client.oracle.get_timestamp()
    h.must_prewrite([(b"k", "c", b"live")], primary=(b"k", "c"), start_ts=start_ts, ttl_ms=60_000)
    report = client.gc(life_time_ms=0)
    assert report.locks_alive == 1
    assert report.safe_point <= start_ts
    h.must_locked(b"k", "c", start_ts)


def test_gc_safe_point_stays_below_published_transaction(client: percolator.Client) -> None:
    long_txn = client.transaction()
    long_txn.get("t", b"k", "c")
    client.publish_min_start_ts()
    client.run(lambda t: t.set("t", b"k", "c", b"later"))
    report = client.gc(life_time_ms=0)
    assert report.safe_point <= long_txn.start_ts
    assert long_txn.get("t", b"k", "c") is None  # its snapshot is intact
    long_txn.rollback()


def test_gc_safe_point_never_moves_back(client: percolator.Client) -> None:
    client.run(lambda t: t.set("t", b"k", "c", b"v"))
    first = client.gc(life_time_ms=0).safe_point
    second = client.gc(life_time_ms=3_600_000).safe_point
    assert second == first


def test_gc_forgets_the_delete_masks_it_leaves_behind(client: percolator.Client) -> None:
    for i in range(3):
        with client.transaction() as txn:
            txn.set("t", b"k%d" % i, "c", b"v")
            txn.set("t", b"k0", "c", b"v%d" % i)
    report = client.gc(life_time_ms=0)
    assert report.cells_collected >= 2
    if client.store.url.startswith("hbase:"):
        # HBase's own major compactions drop its delete markers.
        assert report.delete_masks_dropped == 0
    else:
        # The pass's own deletes (old versions of k0, the commit index) left masks: all gone.
        assert report.delete_masks_dropped >= 2
        assert all(client.store.compact_deletes(t) == 0 for t in client.store.list_tables())
    assert client.snapshot().get("t", b"k0", "c") == b"v2"


def test_a_named_reservation_holds_gc_until_released(client: percolator.Client) -> None:
    with client.transaction() as txn:
        txn.set("t", b"k", "c", b"old")
    held = client.oracle.get_timestamp()
    client.reserve_safe_point("export-1", held, ttl_ms=60_000)
    with client.transaction() as txn:
        txn.set("t", b"k", "c", b"new")
    report = client.gc(life_time_ms=0)
    assert report.safe_point <= held
    assert client.snapshot(held).get("t", b"k", "c") == b"old"
    assert [r.name for r in scan_reservations(client.store)] == ["export-1"]
    client.release_safe_point("export-1")
    assert scan_reservations(client.store) == []
    assert client.gc(life_time_ms=0).safe_point > held
    with pytest.raises(SafePointError):
        client.snapshot(held).get("t", b"k", "c")


def reservation_rows(client: percolator.Client) -> list[bytes]:
    options = ScanOptions(start=RESERVE_PREFIX, stop=RESERVE_PREFIX[:-1] + b"0")
    return [row for row, _ in client.store.scan(META_TABLE, META_FAMILY, options)]


def test_gc_removes_reservation_records_long_released_or_expired(client: percolator.Client) -> None:
    store = client.store
    ts = client.oracle.get_timestamp()
    client.reserve_safe_point("once", ts, ttl_ms=60_000)
    client.release_safe_point("once")
    client.reserve_safe_point("lapsed", ts, ttl_ms=1)
    client.reserve_safe_point("live", ts, ttl_ms=RESERVATION_KEEP_MS * 3)
    assert len(reservation_rows(client)) == 3
    # Within the keep time nothing goes (a GC pass runs it with the current clock).
    assert client.gc(life_time_ms=0).reservations_removed == 0
    assert len(reservation_rows(client)) == 3
    later = now_ms() + RESERVATION_KEEP_MS + 60_000
    assert collect_reservations(store, later) == 2
    assert reservation_rows(client) == [RESERVE_PREFIX + b"live"]
    assert collect_reservations(store, later) == 0
    # A name used again afterwards is a reservation like any other (its compare-and-set is
    # stamped after the delete, so the delete marker does not hide it).
    time.sleep(0.01)
    client.reserve_safe_point("once", ts, ttl_ms=60_000)
    assert {r.name for r in scan_reservations(store)} == {"once", "live"}


# ---------------------------------------------------------------- cells deleted for good


def raw_cell(client: percolator.Client, row: bytes) -> dict[str, int]:
    """How many versions of ``t/<row>/c`` each protocol family holds, read raw."""
    columns = [(family, b"c") for family in (LOCK, WRITE, DATA)]
    cells = client.store.read_row("t", row, columns=columns, max_versions=1000)
    return {family: len(cells.get((family, b"c"), [])) for family in (LOCK, WRITE, DATA)}


def roll_back_a_write(client: percolator.Client, row: bytes) -> None:
    """A transaction that prewrites ``t/<row>/c`` and is rolled back before its commit point:
    its data and a rollback marker stay."""
    failpoints.enable("commit.before_primary", "raise")
    try:
        txn = client.transaction()
        txn.set("t", row, "c", b"never")
        with pytest.raises(failpoints.FailpointError):
            txn.commit()
    finally:
        failpoints.disable()


def test_gc_removes_deleted_cells_with_their_lock_cells(
    client: percolator.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(client.store, "stamp_skew_ms", 0)  # one clock here, HBase's too
    for value in (b"v1", b"v2"):
        client.run(lambda t, v=value: t.set("t", b"gone", "c", v))
    client.run(lambda t: t.delete("t", b"gone", "c"))
    client.run(lambda t: t.set("t", b"gone-twice", "c", b"v"))
    client.run(lambda t: t.delete("t", b"gone-twice", "c"))
    roll_back_a_write(client, b"gone-twice")  # newer data than the delete, rolled back
    roll_back_a_write(client, b"never-written")  # a lock cell and data, no commit at all
    client.run(lambda t: t.set("t", b"kept", "c", b"v"))
    client.run(lambda t: t.delete("t", b"kept", "c"))
    client.run(lambda t: t.set("t", b"kept", "c", b"back"))
    assert raw_cell(client, b"gone") == {LOCK: 1, WRITE: 3, DATA: 2}
    time.sleep(0.005)  # the lock cells' stamps below the store clock GC reads

    report = client.gc(life_time_ms=0)

    assert report.dead_cells_removed == 3
    for row in (b"gone", b"gone-twice", b"never-written"):
        assert raw_cell(client, row) == {LOCK: 0, WRITE: 0, DATA: 0}, row
        assert client.snapshot().get("t", row, "c") is None
    assert raw_cell(client, b"kept") == {LOCK: 1, WRITE: 1, DATA: 1}
    assert client.snapshot().get("t", b"kept", "c") == b"back"
    # A removed cell is an ordinary new cell afterwards.
    client.run(lambda t: t.set("t", b"gone", "c", b"again"))
    assert client.snapshot().get("t", b"gone", "c") == b"again"
    assert client.gc(life_time_ms=0).dead_cells_removed == 0


def test_gc_keeps_lock_cells_stamped_within_the_stores_clock_skew(
    client: percolator.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a conditional delete, a lock cell is deleted "at or below the version read":
    only safe if every later compare-and-set is stamped above it, which a store whose
    clocks may be skewed promises only for cells older than the skew."""
    monkeypatch.setattr(client.store, "stamp_skew_ms", 600_000)
    client.run(lambda t: t.set("t", b"k", "c", b"v"))
    client.run(lambda t: t.delete("t", b"k", "c"))

    report = client.gc(life_time_ms=0)

    assert report.dead_cells_removed == 0
    assert raw_cell(client, b"k") == {LOCK: 1, WRITE: 1, DATA: 0}
    monkeypatch.setattr(client.store, "stamp_skew_ms", 0)
    time.sleep(0.005)
    assert client.gc(life_time_ms=0).dead_cells_removed == 1
    assert raw_cell(client, b"k") == {LOCK: 0, WRITE: 0, DATA: 0}


def test_a_dead_cell_is_owed_to_an_observer_whose_ack_predates_its_delete() -> None:
    """GC keeps a dead cell while an ack of it was written by a run that started before the
    delete committed (it covers an earlier change), or is being written now."""
    dead = LockCell(last_commit=CommitInfo(commit_ts=100, start_ts=90, kind=Kind.DELETE))

    def ack(start_ts: int, *, locked: bool = False) -> LockCell:
        lock = LockInfo(start_ts + 20, 1000, Kind.PUT, "t", b"r", "!ack/o/c") if locked else None
        return LockCell(lock=lock, last_commit=CommitInfo(start_ts + 5, start_ts, Kind.PUT))

    assert not owes_delete(dead, [])
    assert not owes_delete(dead, [ack(101)])  # its run saw the delete
    assert owes_delete(dead, [ack(95)])  # its run started before the delete committed
    assert owes_delete(dead, [ack(101), ack(50)])  # one of two observers owes it
    assert owes_delete(dead, [ack(101, locked=True)])  # a run is writing it now
    assert not owes_delete(LockCell(rolled_back=80), [ack(50)])  # never committed
    forgotten = LockCell(last_commit=CommitInfo(60, 55, Kind.DELETE))
    assert not owes_delete(dead, [forgotten])  # a deleted ack is no ack

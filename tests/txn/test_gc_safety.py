"""Garbage collection never causes a silent wrong read, whatever another client collects.

Each test reproduces one failure class seen when an operator ran ``gc`` beside a live
application: committed data rolled back by a GC of a subset of tables, live transactions and
snapshots reading ``None`` where they read a value before, status checks that lose a commit
in a long history, an interrupt at the commit point reported as a rollback, a dropped table
that stops GC store-wide, versions that are never collected, and an abandoned transaction
that pins GC for ever.  A reader must read exactly its snapshot or get ``SafePointError``.
"""

from __future__ import annotations

import contextlib
import gc as python_gc
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import percolator
from percolator import failpoints, notifications, readers
from percolator.errors import SafePointError, StoreError, UndeterminedCommitError
from percolator.layout import DATA
from percolator.protocol.cells import CellKey, fetch_cells
from percolator.protocol.commit import commit_cell, commit_secondaries, record_puts
from percolator.protocol.gc import advance_safe_point, lock_report
from percolator.records import Kind, LockCell
from percolator.store import Store, open_store
from percolator.store.backends import with_table_prefix
from percolator.store.base import Delete
from percolator.testing.faults import FaultyStore
from tests.txn.raw_inspect import read_table

BACKENDS = [
    pytest.param("memory", id="memory"),
    pytest.param("embedded", id="embedded"),
    pytest.param("hbase", id="hbase", marks=pytest.mark.hbase),
]


@pytest.fixture(params=BACKENDS)
def shared_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """One store that two clients (the application and an operator's GC) share."""
    if request.param == "memory":
        url = f"memory:{uuid.uuid4().hex}"
    elif request.param == "embedded":
        url = f"embedded:{tmp_path / 'store'}"
    else:
        url = with_table_prefix(request.getfixturevalue("hbase_url"), f"g{uuid.uuid4().hex[:10]}_")
    store = open_store(url)
    yield store
    if url.startswith("hbase"):
        for table in store.list_tables():
            store.drop_table(table)
    store.close()


@pytest.fixture
def app(shared_store: Store) -> Iterator[percolator.Client]:
    client = percolator.connect(shared_store, lock_ttl_ms=500, lock_wait_ms=3000)
    for table in ("a", "b"):
        client.create_table(table)
    yield client
    client.close()


@pytest.fixture
def operator(shared_store: Store, app: percolator.Client) -> Iterator[percolator.Client]:
    """A second client on the same store, as `percolator gc` run by an operator would be."""
    client = percolator.connect(shared_store)
    yield client
    client.close()


@pytest.fixture(autouse=True)
def _no_failpoints() -> Iterator[None]:
    yield
    failpoints.disable()


def _commit_leaving_secondary_locked(app: percolator.Client) -> int:
    """Commit a transaction whose primary is a/k and whose secondary b/k stays locked (the
    client dies right after the commit point, before it commits the secondary)."""
    failpoints.enable("commit.after_primary", "raise")
    txn = app.transaction()
    txn.set("a", b"k", "c", b"committed-a")
    txn.set("b", b"k", "c", b"committed-b")
    commit_ts = txn.commit()
    failpoints.disable()
    assert commit_ts is not None
    return commit_ts


# ---------------------------------------------------------------- 1. gc of a subset of tables


def test_gc_of_one_table_never_rolls_back_a_committed_secondary_elsewhere(
    app: percolator.Client, operator: percolator.Client
) -> None:
    _commit_leaving_secondary_locked(app)
    # Later commits of the primary cell push the transaction out of its lock cell.
    app.run(lambda t: t.set("a", b"k", "c", b"later-1"))
    app.run(lambda t: t.set("a", b"k", "c", b"later-2"))

    operator.gc(life_time_ms=0, tables=["a"])

    with operator.snapshot() as snap:
        assert snap.get("b", b"k", "c") == b"committed-b"


# ---------------------------------------------------------------- 2. live readers


def test_live_transaction_reads_its_snapshot_or_gets_safe_point_error(
    app: percolator.Client, operator: percolator.Client
) -> None:
    app.run(lambda t: t.set("a", b"k", "c", b"v1"))
    txn = app.transaction()
    assert txn.get("a", b"k", "c") == b"v1"
    app.run(lambda t: t.set("a", b"k", "c", b"v2"))

    operator.gc(life_time_ms=0)

    try:
        value = txn.get("a", b"k", "c")
    except SafePointError:
        return
    assert value == b"v1"
    txn.rollback()


def test_live_snapshot_reads_its_snapshot_or_gets_safe_point_error(
    app: percolator.Client, operator: percolator.Client
) -> None:
    app.run(lambda t: t.set("a", b"k", "c", b"v1"))
    snap = app.snapshot()
    assert snap.get("a", b"k", "c") == b"v1"
    app.run(lambda t: t.set("a", b"k", "c", b"v2"))

    operator.gc(life_time_ms=0)

    try:
        value = snap.get("a", b"k", "c")
    except SafePointError:
        return
    assert value == b"v1"


def test_a_reader_registering_while_its_client_publishes_is_not_passed_by_gc(
    app: percolator.Client, operator: percolator.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader that registers while its client is storing a record computed before it
    (here: "no live reader", the renewal after the last reader ended) must not rely on the
    record that was in force before: it publishes itself or meets the safe point."""
    app.run(lambda t: t.set("a", b"k", "c", b"v1"))
    first = app.transaction()
    assert first.get("a", b"k", "c") == b"v1"  # published: this client protects its readers
    registry = app._readers  # type: ignore[attr-defined]
    stored, release = threading.Event(), threading.Event()
    put = registry._store.put

    def put_then_pause(table: str, puts: list[Any]) -> None:
        put(table, puts)
        if threading.current_thread().name == "publisher":
            stored.set()  # the record is in the store; the publisher is descheduled here
            release.wait(30)

    monkeypatch.setattr(registry._store, "put", put_then_pause)
    first.rollback()
    publisher = threading.Thread(target=registry.publish, name="publisher")
    publisher.start()
    assert stored.wait(10)
    outcome: list[object] = []
    registered, read_now = threading.Event(), threading.Event()

    def new_reader() -> None:
        try:
            txn = app.transaction()
            outcome.append(txn)
            registered.set()
            read_now.wait(30)
            outcome.append(txn.get("a", b"k", "c"))
        except SafePointError as exc:
            outcome.append(exc)

    reader = threading.Thread(target=new_reader)
    reader.start()
    # It may wait for the publisher (which waits for us): give it a moment either way.
    registered.wait(0.5)
    # Another client writes v2 after the reader started, and collects all it may.
    operator.run(lambda t: t.set("a", b"k", "c", b"v2"))
    operator.gc(life_time_ms=0)
    read_now.set()
    release.set()
    publisher.join()
    reader.join(10)
    assert outcome, "the reader never finished"
    if isinstance(outcome[-1], SafePointError):
        return
    txn, value = outcome
    assert value == b"v1", f"read {value!r} below the safe point without SafePointError"
    assert isinstance(txn, percolator.Transaction)
    txn.rollback()


def _short_lived_records(monkeypatch: pytest.MonkeyPatch) -> None:
    """Client records that expire 300 ms after they are stored and are not renewed (a
    client paused, or idle for a minute, in little time)."""
    monkeypatch.setattr(readers, "PUBLISH_TTL_MS", 300)
    monkeypatch.setattr(readers, "_PROTECTION_MARGIN_MS", 100)
    monkeypatch.setattr(readers, "RENEW_INTERVAL_S", 3600.0)


def test_a_lapsed_transaction_cannot_miss_a_conflict_on_a_cell_gc_removed(
    app: percolator.Client, operator: percolator.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GC removes a deleted cell's whole history, lock cell included.  A transaction that
    started before the delete and whose reader record lapsed (as if its process had been
    paused) then writes the cell blind: no history is left to conflict with, so only the
    safe point check before the commit point stops a lost update."""
    _short_lived_records(monkeypatch)
    monkeypatch.setattr(app.store, "stamp_skew_ms", 0)
    app.run(lambda t: t.set("a", b"k", "c", b"v1"))
    txn = app.transaction()
    operator.run(lambda t: t.delete("a", b"k", "c"))
    time.sleep(0.5)  # the application's reader record expires

    assert operator.gc(life_time_ms=0).dead_cells_removed == 1

    txn.set("a", b"k", "c", b"written over a delete it never saw")
    with pytest.raises(SafePointError, match="safe point"):
        txn.commit()
    assert operator.snapshot().get("a", b"k", "c") is None
    assert lock_report(app.store, "a") == []


def test_own_gc_protects_the_clients_live_transactions(app: percolator.Client) -> None:
    app.run(lambda t: t.set("a", b"k", "c", b"v1"))
    txn = app.transaction()
    assert txn.get("a", b"k", "c") == b"v1"
    app.run(lambda t: t.set("a", b"k", "c", b"v2"))

    report = app.gc(life_time_ms=0)

    assert report.safe_point <= txn.start_ts
    assert txn.get("a", b"k", "c") == b"v1"
    txn.rollback()


def test_a_reader_arriving_during_its_own_clients_gc_reads_its_snapshot_or_is_refused(
    app: percolator.Client,
) -> None:
    """The client's record still names a closed snapshot's start_ts (it is renewed every
    few seconds), so a new reader at that start_ts would count as covered by it; the
    client's own GC pass skips that record and counts its readers from memory, where the
    closed snapshot is gone.  A reader arriving in the middle of the pass (here: after the
    versions were collected) must read its snapshot or get SafePointError, never None."""
    app.run(lambda t: t.set("a", b"k", "c", b"v1"))
    old = app.snapshot()
    assert old.get("a", b"k", "c") == b"v1"  # publishes the record, loads the safe point
    old_ts = old.start_ts
    app.run(lambda t: t.set("a", b"k", "c", b"v2"))
    old.close()
    answers: list[object] = []

    def arrive(message: str) -> None:
        if message.startswith("safe point") and not answers:  # the pass's summary
            try:
                with app.snapshot(read_ts=old_ts) as late:
                    answers.append(late.get("a", b"k", "c"))
            except SafePointError as exc:
                answers.append(exc)

    report = app.gc(life_time_ms=0, progress=arrive)
    assert report.bound > old_ts  # the pass went past it
    assert len(answers) == 1
    assert answers[0] == b"v1" or isinstance(answers[0], SafePointError), answers


def test_a_reader_whose_host_slept_does_not_trust_its_clients_record(
    app: percolator.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GC judges a client's record by wall-clock expiry; a host that was suspended wakes up
    with ``time.monotonic`` not having moved.  The protection is measured on a clock that
    counts the suspend (``CLOCK_BOOTTIME``), so after it a reader checks the stored safe
    point, and a GC that passed the lapsed record in the meantime refuses it."""
    app.run(lambda t: t.set("a", b"k", "c", b"v1"))
    old = app.snapshot()
    assert old.get("a", b"k", "c") == b"v1"  # the record is stored, the reader protected
    real = time.clock_gettime
    boottime = getattr(time, "CLOCK_BOOTTIME", None)
    if boottime is None:
        pytest.skip("no CLOCK_BOOTTIME on this platform")
    # Two minutes of suspend: only the clock that counts it moves.
    monkeypatch.setattr(
        readers.time, "clock_gettime", lambda clock: real(clock) + (120 if clock == boottime else 0)
    )
    # Meanwhile a GC elsewhere found the record expired and went past the reader.
    advance_safe_point(app.store, old.start_ts + 1)
    with pytest.raises(SafePointError):
        old.get("a", b"k", "c")


def test_a_lapsed_reader_that_finds_its_data_collected_gets_safe_point_error(
    app: percolator.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader whose protection lapsed (its host slept) while GC went past it may find a
    write record whose data GC already deleted (a pass between its two deletes, or the
    Thrift-1 gateway's): that is SafePointError, retryable at a new snapshot, not the
    "store damaged" error of data missing above the safe point."""
    app.run(lambda t: (t.set("a", b"k1", "c", b"v1"), t.set("a", b"k2", "c", b"v2")))
    old = app.snapshot()
    assert old.get("a", b"k1", "c") == b"v1"  # the record is stored, the reader protected
    [(data_ts, _)] = app.store.read_row("a", b"k2", columns=[(DATA, b"c")])[(DATA, b"c")]
    real = time.clock_gettime
    boottime = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)
    monkeypatch.setattr(
        readers.time, "clock_gettime", lambda clock: real(clock) + (120 if clock == boottime else 0)
    )
    advance_safe_point(app.store, old.start_ts + 1)
    app.store.delete_versions("a", [Delete(b"k2", DATA, b"c", data_ts)])  # GC, half done
    fresh = app.snapshot()  # above the safe point, missing data is damage
    with pytest.raises(StoreError, match="missing although a commit points at it"):
        fresh.get("a", b"k2", "c")
    fresh.close()
    with pytest.raises(SafePointError):
        old.get("a", b"k2", "c")


# ---------------------------------------------------------------- 3. long primary history


def test_status_check_finds_a_commit_behind_a_long_history(
    app: percolator.Client, operator: percolator.Client
) -> None:
    from percolator.layout import WRITE
    from percolator.records import Kind, WriteRecord
    from percolator.store.base import Put

    commit_ts = _commit_leaving_secondary_locked(app)
    # 100,001 later commits of the primary cell (written raw: what matters is the history
    # a status check has to look through, not how it got there).  The bounded lookup does
    # not depend on the store; on HBase a shorter history keeps the test quick.
    later = 3_000 if app.store.url.startswith("hbase") else 100_001
    record = WriteRecord(Kind.PUT, commit_ts).encode()
    puts = [Put(b"k", WRITE, b"c", commit_ts + 1 + i, record) for i in range(later)]
    for start in range(0, len(puts), 10_000):
        app.store.put("a", puts[start : start + 10_000])
    app.run(lambda t: t.set("a", b"k", "c", b"later"))

    with operator.snapshot() as snap:
        assert snap.get("b", b"k", "c") == b"committed-b"


# ---------------------------------------------------------------- 4. interrupt at the commit point


@pytest.mark.parametrize("applied", [True, False], ids=["applied", "not-applied"])
@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_interrupt_during_the_primary_commit_is_undetermined(
    shared_store: Store, applied: bool, error: type[BaseException]
) -> None:
    """Anything that breaks while the commit point's compare-and-set is out -- here a bug or
    a Ctrl-C raised after (or before) the server applied it -- leaves the outcome unknown:
    the transaction reports UNDETERMINED, never ROLLED_BACK, and a later read shows it."""
    from percolator.layout import LOCK
    from percolator.testing import Call, FaultyStore

    store = FaultyStore(shared_store)
    client = percolator.connect(store)
    try:
        client.create_table("a")
        txn = client.transaction()
        txn.set("a", b"k", "c", b"v")
        # The first compare-and-set on the lock family is the primary's prewrite; the
        # second is the commit point.
        lock_cas = [0]

        def second_lock_cas(call: Call) -> bool:
            if call["family"] != LOCK:
                return False
            lock_cas[0] += 1
            return lock_cas[0] == 2

        store.fail("compare_and_set", when=second_lock_cas, applied=applied, error=error)
        expected = UndeterminedCommitError if error is RuntimeError else KeyboardInterrupt
        with pytest.raises(expected):
            txn.commit()
        assert txn.status is percolator.TxnStatus.UNDETERMINED
        store.clear()
        with client.snapshot() as snap:
            assert snap.get("a", b"k", "c") == (b"v" if applied else None)
    finally:
        client.close()


# ---------------------------------------------------------------- 5. dropped tables


def test_drop_table_holding_primaries_of_locked_secondaries_is_refused_or_resolved(
    app: percolator.Client, operator: percolator.Client
) -> None:
    _commit_leaving_secondary_locked(app)
    with contextlib.suppress(percolator.errors.PercolatorError):
        app.drop_table("a")  # refused while b holds locks whose primary is in a
    # Either way b stays readable, and GC of b goes on.
    with operator.snapshot() as snap:
        assert snap.get("b", b"k", "c") == b"committed-b"
    operator.gc(life_time_ms=0, tables=["b"])


def test_tables_the_engine_did_not_create_are_neither_listed_nor_touched(
    app: percolator.Client, shared_store: Store
) -> None:
    """A store (or an HBase prefix) may also hold its users' own tables: listing, GC and
    dropping an engine table must pass over them instead of failing on their families."""
    from percolator.store.base import FamilySpec, Put

    shared_store.create_table("theirs", [FamilySpec("d")])
    shared_store.put("theirs", [Put(b"r", "d", b"q", 1, b"raw")])
    app.run(lambda t: t.set("a", b"k", "c", b"v"))
    assert set(app.list_tables()) == {"a", "b"}
    app.gc(life_time_ms=0)
    app.drop_table("a")
    assert app.list_tables() == ["b"]
    assert shared_store.read_row("theirs", b"r")[("d", b"q")] == [(1, b"raw")]


def test_a_deployment_under_a_longer_prefix_is_not_this_ones(
    app: percolator.Client, shared_store: Store
) -> None:
    """On HBase a deployment under this one's prefix plus ``eu_`` has its tables under this
    prefix too (``eu_accounts``): listing, GC and observers must leave them to it (its
    meta table marks it), or GC would resolve its locks by primaries looked up under the
    wrong prefix and collect below a safe point its readers never saw."""
    from percolator.layout import META_FAMILIES, META_TABLE, TABLE_FAMILIES

    if shared_store.url.startswith("hbase"):
        nested = percolator.connect(with_table_prefix(shared_store.url, "eu_"))
        nested.create_table("accounts")
        nested.run(lambda t: t.set("accounts", b"k", "c", b"theirs"))
    else:  # no prefixes here: the same table names, made by hand
        shared_store.create_table("eu_" + META_TABLE, META_FAMILIES)
        shared_store.create_table("eu_accounts", TABLE_FAMILIES)
        nested = None
    assert "eu_accounts" in shared_store.list_tables()
    assert set(app.list_tables()) == {"a", "b"}
    report = app.gc(life_time_ms=0)
    assert set(report.tables) == {"a", "b"}
    if nested is not None:
        assert nested.snapshot().get("accounts", b"k", "c") == b"theirs"
        nested.close()


# ---------------------------------------------------------------- 6. nothing uncollectable


def test_gc_of_one_table_does_not_leave_other_tables_uncollected(
    app: percolator.Client, operator: percolator.Client
) -> None:
    from percolator.layout import WRITE

    for value in (b"1", b"2", b"3"):
        app.run(lambda t, v=value: t.set("b", b"k", "c", v))
    app.run(lambda t: t.set("a", b"k", "c", b"x"))
    app.publish_min_start_ts()  # its record says "no live reader" now, not in 2 s

    operator.gc(life_time_ms=0, tables=["a"])  # moves the safe point past b's history
    operator.gc(life_time_ms=0)

    versions = app.store.read_row("b", b"k", columns=[(WRITE, b"c")], max_versions=100)
    assert len(versions[(WRITE, b"c")]) == 1


# ---------------------------------------------------------------- 7. abandoned transactions


def test_dropped_transaction_does_not_pin_gc(app: percolator.Client) -> None:
    txn = app.transaction()
    txn.get("a", b"k", "c")
    start_ts = txn.start_ts
    del txn
    python_gc.collect()
    app.run(lambda t: t.set("a", b"k", "c", b"v"))
    assert app.gc(life_time_ms=0).safe_point > start_ts


# ---------------------------------------------------------------- storage


def test_gc_cleans_notifications_of_columns_nobody_observes(app: percolator.Client) -> None:
    from percolator.layout import NOTIFY
    from percolator.notifications import Registration, claim_column, put_notifications
    from percolator.protocol.cells import CellKey

    claimed, _ = claim_column(app.store, Registration("a", "watched", "o", False))
    assert claimed
    stamp = app.oracle.get_timestamp()
    put_notifications(app.store, [CellKey("a", b"r", "watched"), CellKey("a", b"r", "gone")], stamp)

    report = app.gc(life_time_ms=0)

    assert report.notifications_collected == 1
    left = app.store.read_row("a", b"r", families=[NOTIFY])
    assert set(left) == {(NOTIFY, b"watched")}


# ---------------------------------------------------------------- 8. records GC removed


def _expire_the_apps_record(app: percolator.Client, monkeypatch: pytest.MonkeyPatch) -> None:
    """The application reads once with a short-lived record and lets it expire (as a client
    idle for a minute does); later records live for the usual minute."""
    _short_lived_records(monkeypatch)
    with app.snapshot() as snap:
        assert snap.get("a", b"k1", "c") == b"v1"
    time.sleep(0.5)
    monkeypatch.setattr(readers, "PUBLISH_TTL_MS", 60_000)
    monkeypatch.setattr(readers, "_PROTECTION_MARGIN_MS", 15_000)


def _published_reader_survives_gc(
    app: percolator.Client, operator: percolator.Client, snap: percolator.Snapshot
) -> None:
    """``snap`` (of ``app``, which read k1 through it) is in its client's stored record;
    k1 and k2 are overwritten and GC collects all it may: it stays below ``snap``, which
    still reads its own k2."""
    published = {p.row: p.min_start_ts for p in readers.scan_publications(app.store)}
    assert published.get(app._readers.row) == snap.read_ts  # type: ignore[attr-defined]
    operator.run(lambda t: (t.set("a", b"k1", "c", b"v2"), t.set("a", b"k2", "c", b"v2")))
    report = operator.gc(life_time_ms=0)
    assert report.bound <= snap.read_ts, "GC passed a reader whose client published it"
    assert snap.get("a", b"k2", "c") == b"v1"


def test_a_clients_record_stored_after_gc_removed_its_expired_one_stays_in_force(
    app: percolator.Client, operator: percolator.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GC removes an idle client's expired record.  The delete must not hide the client's
    later records: on HBase a delete marker stays until a major compaction and hides every
    put at or below its version (kept here on every backend)."""
    monkeypatch.setattr(operator.store, "compact_deletes", lambda table: 0)
    operator.run(lambda t: (t.set("a", b"k1", "c", b"v1"), t.set("a", b"k2", "c", b"v1")))
    _expire_the_apps_record(app, monkeypatch)
    assert operator.gc(life_time_ms=600_000).clients_expired == 1

    snap = app.snapshot()
    assert snap.get("a", b"k1", "c") == b"v1"  # registers: publishes, then protected
    _published_reader_survives_gc(app, operator, snap)


def test_gc_removing_an_expired_record_spares_the_one_its_client_stored_meanwhile(
    app: percolator.Client, operator: percolator.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GC found a client's record expired in both of its reads; the client stores a fresh
    one (a new reader) before GC gets to removing the expired one: the fresh one stays."""
    operator.run(lambda t: (t.set("a", b"k1", "c", b"v1"), t.set("a", b"k2", "c", b"v1")))
    _expire_the_apps_record(app, monkeypatch)
    opened: list[percolator.Snapshot] = []

    def open_reader_once(message: str) -> None:
        if message.startswith("collecting versions") and not opened:
            snap = app.snapshot()
            assert snap.get("a", b"k1", "c") == b"v1"
            opened.append(snap)

    assert operator.gc(life_time_ms=600_000, progress=open_reader_once).clients_expired == 1
    (snap,) = opened
    _published_reader_survives_gc(app, operator, snap)


def test_a_transaction_no_record_protects_cannot_lose_its_secondary_to_gc(
    app: percolator.Client, operator: percolator.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A transaction whose record lapsed locks its cells after GC scanned their table for
    locks, passes its commit check against the previous safe point, commits its primary
    and dies.  GC stores a safe point above it and collects the primary's commit-index
    entry: it must first settle the secondary lock, or the secondary later resolves as
    rolled back once the primary's lock cell has moved on (a half-committed transaction)."""
    operator.run(lambda t: (t.set("a", b"p", "c", b"p0"), t.set("a", b"s", "c", b"s0")))
    _short_lived_records(monkeypatch)
    txn = app.transaction()
    assert txn.get("a", b"p", "c") == b"p0"
    time.sleep(0.5)  # its record lapses (a paused process, a failed renewal)
    committed: list[int | None] = []

    def commit_during_the_lock_scans(message: str) -> None:
        # After table a was scanned for locks, before the safe point is stored.
        if message.startswith("resolving locks") and message.endswith(" in b") and not committed:
            txn.set("a", b"p", "c", b"p1")
            txn.set("a", b"s", "c", b"s1")
            failpoints.enable("commit.after_primary", "raise")  # as if it died there
            committed.append(txn.commit())
            failpoints.disable()

    report = operator.gc(life_time_ms=0, progress=commit_during_the_lock_scans)
    assert committed and committed[0] is not None
    assert report.bound > txn.start_ts  # nothing protected it: its history below may go
    assert lock_report(app.store, "a") == []  # its secondary was settled, not left
    operator.run(lambda t: t.set("a", b"p", "c", b"p2"))
    with operator.snapshot() as snap:
        assert snap.get("a", b"p", "c") == b"p2"
        assert snap.get("a", b"s", "c") == b"s1"


def test_gc_keeps_a_deleted_cell_whose_delete_is_still_notified(
    app: percolator.Client, operator: percolator.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An observer notified of a delete must find it: GC removes a dead cell (latest commit
    a delete) only once no notification waits on it."""
    monkeypatch.setattr(app.store, "stamp_skew_ms", 0)
    # Written by the collecting client: no other client's record holds GC back.
    operator.run(lambda t: t.set("a", b"k", "c", b"v1"))
    deleting = operator.transaction()
    deleting.delete("a", b"k", "c")
    delete_ts = deleting.commit()
    assert delete_ts is not None
    notifications.put_notifications(app.store, [CellKey("a", b"k", "c")], delete_ts)
    time.sleep(0.01)  # the lock cell's stamp falls below the store's clock

    first = operator.gc(life_time_ms=0)
    assert (first.dead_cells_removed, first.dead_cells_notified) == (0, 1)
    with operator.transaction() as txn:
        assert txn.get_with_commit_ts("a", b"k", "c") == (None, delete_ts)
    # Nobody observes the column: GC cleaned the notification up, so the next pass removes it.
    assert first.notifications_collected == 1
    second = operator.gc(life_time_ms=0)
    assert (second.dead_cells_removed, second.dead_cells_notified) == (1, 0)


def test_a_resolver_stalled_across_gc_leaves_no_wrong_read_and_no_lasting_record(
    app: percolator.Client, operator: percolator.Client
) -> None:
    """A resolver reads a secondary's lock, learns that its primary committed, and stalls
    before it rolls the cell forward.  Meanwhile a reader rolls the cell forward, the cell is
    committed twice more, and GC collects everything below its latest commit.  The stalled
    resolver's record rides on its compare-and-set, which finds the lock gone: nothing lands,
    and every read stays exact."""
    assert app.store.conditional_puts  # every backend here; Thrift-1 alone: docs/gc.md
    commit_ts = _commit_leaving_secondary_locked(app)
    key = CellKey("b", b"k", "c")
    stale = fetch_cells(app.store, [key], before=None)[key].lock_bytes
    lock = LockCell.decode(stale).lock
    assert lock is not None  # the secondary is still locked: what the resolver read
    with operator.snapshot() as snap:  # another reader rolls it forward meanwhile
        assert snap.get("b", b"k", "c") == b"committed-b"
    operator.run(lambda t: t.set("b", b"k", "c", b"v2"))
    operator.run(lambda t: t.set("b", b"k", "c", b"v3"))
    app.publish_min_start_ts()  # its record says "no live reader" now, not in 2 s
    operator.gc(life_time_ms=0)
    [history] = read_table(app.store, "b")
    assert commit_ts not in dict(history.writes)  # collected below the kept commit

    # The resolver wakes up and finds the lock already moved on.
    assert commit_cell(app.store, key, lock.start_ts, commit_ts, stale)
    [history] = read_table(app.store, "b")
    assert commit_ts not in dict(history.writes)

    with operator.snapshot() as snap:
        assert snap.get("b", b"k", "c") == b"v3"
        assert snap.get("a", b"k", "c") == b"committed-a"
    assert history.visible_value() == b"v3"
    with pytest.raises(SafePointError), operator.snapshot(read_ts=commit_ts) as old:
        old.get("b", b"k", "c")


def _stalled_until_the_cell_is_gone(
    app: percolator.Client, operator: percolator.Client, monkeypatch: pytest.MonkeyPatch
) -> tuple[CellKey, bytes, int, int]:
    """A committed transaction's secondary b/k/c, its lock bytes as a stalled client read
    them, then: rolled forward by a reader, deleted by a later transaction and removed by GC
    as a dead cell.  Returns (key, stale lock bytes, start_ts, commit_ts)."""
    commit_ts = _commit_leaving_secondary_locked(app)
    key = CellKey("b", b"k", "c")
    stale = fetch_cells(app.store, [key], before=None)[key].lock_bytes
    lock = LockCell.decode(stale).lock
    assert stale is not None and lock is not None
    with operator.snapshot() as snap:
        assert snap.get("b", b"k", "c") == b"committed-b"
    operator.run(lambda t: t.delete("b", b"k", "c"))
    monkeypatch.setattr(app.store, "stamp_skew_ms", 0)  # one clock here, HBase's too
    time.sleep(0.05)  # the lock cell is stamped below GC's stamp limit (docs/gc.md)
    app.publish_min_start_ts()
    assert operator.gc(life_time_ms=0).dead_cells_removed >= 1
    assert read_table(app.store, "b") == []
    return key, stale, lock.start_ts, commit_ts


def _still_gone(app: percolator.Client, operator: percolator.Client) -> None:
    assert read_table(app.store, "b") == []  # nothing came back
    with operator.snapshot() as snap:
        assert snap.get("b", b"k", "c") is None
        assert snap.get("a", b"k", "c") == b"committed-a"
    for _ in range(2):  # and no pass trips over anything left
        time.sleep(0.05)
        app.publish_min_start_ts()
        operator.gc(life_time_ms=0)
    with operator.snapshot() as snap:
        assert snap.get("b", b"k", "c") is None


def test_a_stalled_resolver_cannot_revive_a_cell_gc_removed(
    app: percolator.Client, operator: percolator.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stalled resolver wakes after the cell was deleted and GC removed it entirely.  A
    blind put of its write record would now be the cell's only history, pointing at data GC
    deleted: every later read of the cell would fail, and no GC pass would find it (dead
    cells are found by their lock cells).  Its record rides on its compare-and-set instead."""
    key, stale, start_ts, commit_ts = _stalled_until_the_cell_is_gone(app, operator, monkeypatch)
    assert commit_cell(app.store, key, start_ts, commit_ts, stale)
    _still_gone(app, operator)


@pytest.mark.parametrize("bytes_known", [True, False], ids=["lock-bytes-known", "unknown"])
def test_a_stalled_committer_cannot_revive_a_cell_gc_removed(
    app: percolator.Client,
    operator: percolator.Client,
    monkeypatch: pytest.MonkeyPatch,
    bytes_known: bool,
) -> None:
    """The same for the committer finishing its secondaries after a pause (its reader
    record lapsed, so GC passed it): when its batched compare-and-set's reply is lost, or
    when it does not know a cell's lock bytes, the records must not be put blind."""
    key, stale, start_ts, commit_ts = _stalled_until_the_cell_is_gone(app, operator, monkeypatch)
    store = FaultyStore(app.store)
    if bytes_known:
        store.fail("compare_and_set")  # the batch's reply is lost: settled one by one
    records = record_puts(store, None, [(key, Kind.PUT)], start_ts, commit_ts)
    locked = [(key, stale if bytes_known else None)]
    assert commit_secondaries(store, locked, start_ts, commit_ts, records) == [True]
    _still_gone(app, operator)

"""The bulk-load fence (percolator/bulkload.py) without Spark: transactions racing it are
refused, never silently overwritten; take-over, publish, GC and drop."""

from __future__ import annotations

import re
import threading
import time
from typing import Any

import pytest

from percolator import failpoints
from percolator.bulkload import (
    BulkLoadError,
    LeaseCheck,
    TableLoadingError,
    begin_load,
    cell_puts,
    publish_load,
    release_lease,
    renew_lease,
)
from percolator.layout import DATA, LOCK, TABLE_FAMILIES, WRITE
from percolator.readers import live_readers, scan_reservations
from percolator.store import open_store
from percolator.store.base import Put
from percolator.tablestate import read_state
from percolator.timestamps import now_ms
from tests.spark.helpers import ITEMS, connect


def test_transaction_racing_the_fence_is_refused(embedded_url: str) -> None:
    store = open_store(embedded_url)
    with connect(embedded_url) as client, connect(embedded_url) as racer:
        # A table the load creates: every client finds it loading.
        begun = begin_load(store, client.oracle.get_timestamp, ITEMS, "load-1")
        assert begun.state.created == "yes"
        for attempt in (
            lambda: racer.run(lambda t: t.set(ITEMS, b"r", "value", b"x"), max_attempts=1),
            lambda: racer.snapshot().get(ITEMS, b"r", "value"),
            lambda: racer.create_table(ITEMS),
        ):
            with pytest.raises(TableLoadingError, match="'items' is being bulk-loaded"):
                attempt()
        # GC holds its safe point below the running load.
        oldest = live_readers(store, now_ms()).oldest
        assert oldest is not None and oldest <= begun.state.start_ts
        client.gc(life_time_ms=0)
        assert client.safe_point(refresh=True) <= begun.state.start_ts
        publish_load(store, ITEMS, "load-1")
        racer.run(lambda t: t.set(ITEMS, b"r", "value", b"x"), max_attempts=1)

        # An existing empty table a client already uses: the client re-checks the table's
        # state, and the load waited that long before it could write, so the client's
        # reads and writes are refused like everyone's.
        client.create_table("empty")
        racer.create_table("empty")
        begun = begin_load(store, client.oracle.get_timestamp, "empty", "load-2")
        assert begun.state.created == "no"
        store.put("empty", cell_puts(begun.state, b"r", [(b"value", b"loaded")], ()))
        with pytest.raises(TableLoadingError):
            racer.snapshot().get("empty", b"r", "value")
        with pytest.raises(TableLoadingError):
            racer.run(lambda t: t.set("empty", b"r", "value", b"racer"), max_attempts=1)
        publish_load(store, "empty", "load-2")
        with connect(embedded_url) as fresh:
            assert fresh.snapshot().get("empty", b"r", "value") == b"loaded"
        # A table holding cells cannot be bulk-loaded at all.
        with pytest.raises(BulkLoadError, match="already holds cells"):
            begin_load(store, client.oracle.get_timestamp, ITEMS, "load-3")
    store.close()


def test_take_over_publish_and_rerun(embedded_url: str) -> None:
    store = open_store(embedded_url)
    with connect(embedded_url) as client:
        ts = client.oracle.get_timestamp
        first = begin_load(store, ts, ITEMS, "load-1", lease_ms=60_000).state
        store.put(ITEMS, cell_puts(first, b"r1", [(b"value", b"a")], ()))
        # Another load is refused while the lease runs, and after it expired.
        with pytest.raises(BulkLoadError, match="being bulk-loaded by load 'load-1'; its lease"):
            begin_load(store, ts, ITEMS, "load-2")
        # The same load takes over at once with the same timestamps (its writers agree).
        again = begin_load(store, ts, ITEMS, "load-1", lease_ms=1).state
        time.sleep(0.005)  # the 1 ms lease runs out
        assert (again.start_ts, again.commit_ts) == (first.start_ts, first.commit_ts)
        with pytest.raises(BulkLoadError, match="lease expired"):
            begin_load(store, ts, ITEMS, "load-2")
        renew_lease(store, ITEMS, "load-1")
        store.put(ITEMS, cell_puts(again, b"r1", [(b"value", b"a")], ()))  # a retried put
        store.put(ITEMS, cell_puts(again, b"r2", [(b"value", b"b")], ()))
        publish_load(store, ITEMS, "load-1")
        publish_load(store, ITEMS, "load-1")  # idempotent
        assert dict(client.snapshot().scan(ITEMS)) == {
            b"r1": {"value": b"a"},
            b"r2": {"value": b"b"},
        }
        versions = store.read_rows(
            ITEMS, [b"r1"], columns=[(DATA, b"value"), (WRITE, b"value")], max_versions=10
        )[b"r1"]
        assert [len(v) for v in versions.values()] == [1, 1]
        assert begin_load(store, ts, ITEMS, "load-1").published
        # The reservation that held GC back is gone after the publish (clients' own reader
        # records aside: this test's client published its snapshots).
        assert [r for r in scan_reservations(store) if r.name.startswith("bulkload:")] == []
        # A table whose load may still be writing is not dropped; once its lease expired
        # it is, and dropping forgets its load state: the name can be loaded again.
        begin_load(store, ts, "other", "load-3")
        with pytest.raises(BulkLoadError, match="may still be writing"):
            client.drop_table("other")
        renew_lease(store, "other", "load-3", lease_ms=1)
        time.sleep(0.005)
        client.drop_table("other")
        assert read_state(store, "other")[0] is not None
        assert not begin_load(store, ts, "other", "load-4").published
    store.close()


def test_a_loaded_cell_without_its_lock_cell_is_not_published(embedded_url: str) -> None:
    """A write record without its lock cell (the lock cell's put hidden, e.g. by a newer
    delete marker of garbage collection) would let a prewrite take the cell as never
    written: the publish into a table the load did not create checks every loaded cell has
    one, scanning the two families side by side."""
    store = open_store(embedded_url)
    with connect(embedded_url) as client:
        client.create_table("existing")
        state = begin_load(store, client.oracle.get_timestamp, "existing", "load-1").state
        for row in (b"r1", b"r2", b"r3"):
            puts = cell_puts(state, row, [(b"a", b"1"), (b"b", b"2")], ())
            if row == b"r2":  # r2/b's lock cell is missing
                puts = [p for p in puts if not (p.family == LOCK and p.qualifier == b"b")]
            store.put("existing", puts)
        with pytest.raises(
            BulkLoadError, match="r2'/b'b' has the commit of load 'load-1' but no lock cell"
        ):
            publish_load(store, "existing", "load-1")
        assert not begin_load(store, client.oracle.get_timestamp, "existing", "load-1").published
    store.close()


def test_a_foreign_lock_cell_after_the_last_loaded_row_is_found(embedded_url: str) -> None:
    store = open_store(embedded_url)
    with connect(embedded_url) as client:
        client.create_table("existing")
        state = begin_load(store, client.oracle.get_timestamp, "existing", "load-1").state
        store.put("existing", cell_puts(state, b"r1", [(b"a", b"1")], ()))
        store.put("existing", [Put(b"r9", LOCK, b"a", now_ms(), b"not the load's lock cell")])
        with pytest.raises(BulkLoadError, match="r9'/b'a' holds a lock cell that is not the"):
            publish_load(store, "existing", "load-1")
    store.close()


#: (where, extra lock cell, the error's words): a cell whose lock cell is not the load's
#: committed state, or is the load's but without a write record beside it
PARTIAL_OR_FOREIGN = [
    ("before the loaded rows", b"r0", b"a", "foreign", "holds a lock cell that is not"),
    ("between loaded rows", b"r1\x00", b"a", "foreign", "holds a lock cell that is not"),
    ("on a loaded cell", b"r2", b"a", "foreign", "holds a lock cell that is not"),
    ("in a loaded row", b"r2", b"z", "load's", "has the load's lock cell but no write record"),
    ("in a row of its own", b"r2a", b"a", "load's", "has the load's lock cell but no write"),
    ("after the loaded rows", b"r9", b"a", "load's", "has the load's lock cell but no write"),
]


@pytest.mark.parametrize(
    ("row", "qualifier", "lock", "words"),
    [case[1:] for case in PARTIAL_OR_FOREIGN],
    ids=[case[0] for case in PARTIAL_OR_FOREIGN],
)
def test_a_lock_cell_that_is_not_one_of_the_loads_values_is_found(
    embedded_url: str, row: bytes, qualifier: bytes, lock: str, words: str
) -> None:
    """The publish of a table the load did not create refuses any lock cell that is not the
    load's committed state beside the load's write record, wherever it is in the scan."""
    store = open_store(embedded_url)
    with connect(embedded_url) as client:
        client.create_table("existing")
        state = begin_load(store, client.oracle.get_timestamp, "existing", "load-1").state
        for loaded in (b"r1", b"r2", b"r3"):
            store.put("existing", cell_puts(state, loaded, [(b"a", b"1"), (b"b", b"2")], ()))
        value = state.committed_lock() if lock == "load's" else b"a transaction's lock"
        store.put("existing", [Put(row, LOCK, qualifier, now_ms(), value)])
        with pytest.raises(BulkLoadError, match=re.escape(f"{row!r}/{qualifier!r} {words}")):
            publish_load(store, "existing", "load-1")
        assert not begin_load(store, client.oracle.get_timestamp, "existing", "load-1").published
    store.close()


def test_a_client_that_used_a_table_dropped_and_loaded_again_is_refused(
    embedded_url: str,
) -> None:
    """A client knew the table before it was dropped and bulk-loaded again under its name:
    it re-checks the table's state, so it reads none of the unpublished load and cannot
    write into it."""
    store = open_store(embedded_url)
    with connect(embedded_url) as user, connect(embedded_url) as operator:
        user.create_table(ITEMS)
        user.run(lambda t: t.set(ITEMS, b"r", "value", b"old"))
        assert user.snapshot().get(ITEMS, b"r", "value") == b"old"
        operator.drop_table(ITEMS)
        begun = begin_load(store, operator.oracle.get_timestamp, ITEMS, "reload")
        assert begun.state.created == "yes"
        store.put(ITEMS, cell_puts(begun.state, b"r", [(b"value", b"loaded")], ()))
        with pytest.raises(TableLoadingError):
            user.snapshot().get(ITEMS, b"r", "value")
        with pytest.raises(TableLoadingError):
            user.run(lambda t: t.set(ITEMS, b"zz", "value", b"user"), max_attempts=1)
        publish_load(store, ITEMS, "reload")
        with user.snapshot() as snap:
            assert dict(snap.scan(ITEMS)) == {b"r": {"value": b"loaded"}}
    store.close()


def test_a_write_prewritten_before_the_fence_makes_the_load_refuse(
    embedded_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer whose check of the table predates the fence (here: a client that trusts
    it for a minute) locks a cell while the load waits out the clients' re-checks: the
    load's lock check then refuses the load, and the writer commits into an ordinary
    table."""
    import percolator.bulkload as bulkload
    import percolator.client as client_module

    monkeypatch.setattr(client_module, "TABLE_STATE_REFRESH_MS", 60_000)
    store = open_store(embedded_url)
    with connect(embedded_url) as writer, connect(embedded_url) as loader:
        writer.create_table("empty")
        fenced, locked, go_on = threading.Event(), threading.Event(), threading.Event()
        real_failpoint, real_sleep = failpoints.failpoint, time.sleep

        def hold_the_writer(name: str) -> None:
            real_failpoint(name)
            if name == "commit.before_notify" and threading.current_thread().name == "w":
                locked.set()
                go_on.wait(30)

        def wait_for_the_writer(seconds: float) -> None:
            if threading.current_thread() is not threading.main_thread():
                return real_sleep(seconds)  # another thread's sleep: not the load's wait
            fenced.set()  # the load's fence is in place: let the writer prewrite
            assert locked.wait(30)
            real_sleep(seconds)

        monkeypatch.setattr(failpoints, "failpoint", hold_the_writer)
        monkeypatch.setattr(bulkload.time, "sleep", wait_for_the_writer)
        outcome: list[Any] = []

        def write() -> None:
            try:
                txn = writer.transaction()
                txn.set("empty", b"r", "value", b"writer")  # checks the table: usable
                assert fenced.wait(30)
                outcome.append(txn.commit())
            except Exception as exc:  # reported below
                outcome.append(exc)

        thread = threading.Thread(target=write, name="w")
        thread.start()
        with pytest.raises(BulkLoadError, match="was written while the load began"):
            begin_load(store, loader.oracle.get_timestamp, "empty", "late")
        go_on.set()
        thread.join(10)
        assert outcome and isinstance(outcome[0], int), outcome
        state = read_state(store, "empty")[0]
        assert state is None or state.state != "loading"
        assert loader.snapshot().get("empty", b"r", "value") == b"writer"
    store.close()


def test_a_writer_that_outlived_its_load_writes_nothing_into_the_next_load(
    embedded_url: str,
) -> None:
    """Load A's writer is paused past A's lease; meanwhile the operator drops the table and
    the name is loaded again under the same load id (a re-run after the drop).  When A's
    writer resumes, its lease check stops it before its next batch, and A's driver cannot
    publish the new load: the new table holds no cell of A."""
    from percolator.spark_jobs.bulk import _bulk_partition, _BulkPlan

    lease_ms = 400
    store = open_store(embedded_url)
    with connect(embedded_url) as client:
        ts = client.oracle.get_timestamp
        first = begin_load(store, ts, ITEMS, "load-1", lease_ms=lease_ms).state
        plan = _BulkPlan(
            store=embedded_url,
            table=ITEMS,
            state=first,
            notify=frozenset(),
            batch_size=1,
            inject=None,
            lease_ms=lease_ms,
        )
        again: list[Any] = []

        def rows() -> Any:
            for i in range(4):
                if i == 2:  # row 0 is written, row 1 is about to be: the writer pauses
                    time.sleep(lease_ms * 1.5 / 1000)
                    client.drop_table(ITEMS)  # allowed: A's lease has expired
                    again.append(begin_load(store, ts, ITEMS, "load-1").state)
                key = b"r%d" % i
                yield (0, key, b""), {"value": b"from load A"}

        class _Progress:
            def add(self, n: int) -> None:
                pass

        with pytest.raises(BulkLoadError, match="no longer holds table"):
            list(_bulk_partition(plan, _Progress(), 0, rows()))
        second = again[0]
        assert second.start_ts != first.start_ts
        with pytest.raises(BulkLoadError, match="was begun again since"):
            publish_load(store, ITEMS, "load-1", start_ts=first.start_ts)
        # Nothing of A in the new table: the raw cells, every family.
        for family in TABLE_FAMILIES:
            assert list(store.scan(ITEMS, family.name)) == [], family.name
        assert read_state(store, ITEMS)[0] == second
    store.close()


def test_lease_check_and_release(embedded_url: str) -> None:
    """The check passes while the load holds the table with a quarter of its lease left;
    a released lease stops the writers at once and lets the table be dropped a quarter of
    a lease later; a published load stops them too."""
    lease_ms = 2000
    store = open_store(embedded_url)
    with connect(embedded_url) as client:
        state = begin_load(
            store, client.oracle.get_timestamp, ITEMS, "load-1", lease_ms=lease_ms
        ).state
        LeaseCheck(store, ITEMS, state, lease_ms).check()
        release_lease(store, ITEMS, state, lease_ms)
        with pytest.raises(BulkLoadError, match="runs out in"):
            LeaseCheck(store, ITEMS, state, lease_ms).check()
        with pytest.raises(BulkLoadError, match="may still be writing"):
            client.drop_table(ITEMS)
        renew_lease(store, ITEMS, "load-1", lease_ms)  # a re-run took it over
        LeaseCheck(store, ITEMS, state, lease_ms).check()
        publish_load(store, ITEMS, "load-1", start_ts=state.start_ts)
        with pytest.raises(BulkLoadError, match="no longer holds table"):
            LeaseCheck(store, ITEMS, state, lease_ms).check()
        client.drop_table(ITEMS)  # published: an ordinary table
    store.close()


def _expired_load(store: Any, ts: Any, load_id: str = "load-x") -> Any:
    """A load of ITEMS whose lease has expired (its loader stopped renewing)."""
    state = begin_load(store, ts, ITEMS, load_id, lease_ms=1).state
    time.sleep(0.005)
    return state


def test_a_take_over_racing_a_drop_is_refused_or_refuses_the_drop(
    embedded_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The drop holds the name from the very state it checked: a re-run of the load that
    takes it over before that refuses the drop; one that comes after is refused itself, and
    the old load's writers fail their check."""
    import percolator.client as client_module

    store = open_store(embedded_url)
    with connect(embedded_url) as client:
        ts = client.oracle.get_timestamp
        # Taken over between the drop's first check and its fence: the drop is refused.
        old = _expired_load(store, ts)
        real_fence = client_module.fence_for_drop

        def take_over_first(store_: Any, table: str) -> Any:
            begin_load(store, ts, ITEMS, "load-x")  # renews the lease: live again
            return real_fence(store_, table)

        monkeypatch.setattr(client_module, "fence_for_drop", take_over_first)
        with pytest.raises(BulkLoadError, match="may still be writing"):
            client.drop_table(ITEMS)
        monkeypatch.undo()
        assert store.table_exists(ITEMS)
        state = read_state(store, ITEMS)[0]
        assert state is not None and state.loading and state.start_ts == old.start_ts
        # A take-over attempted while the table is being dropped is refused, and the old
        # writers' checks fail.
        renew_lease(store, ITEMS, "load-x", lease_ms=1)
        time.sleep(0.005)
        real_drop = store.drop_table
        seen: list[BaseException] = []

        def drop_while_someone_takes_over(name: str) -> None:
            with pytest.raises(BulkLoadError, match="being dropped") as refused:
                begin_load(store, ts, ITEMS, "load-x")
            seen.append(refused.value)
            with pytest.raises(BulkLoadError, match="no longer holds table"):
                LeaseCheck(store, ITEMS, old, 60_000).check()
            real_drop(name)

        monkeypatch.setattr(client.store, "drop_table", drop_while_someone_takes_over)
        client.drop_table(ITEMS)
        assert seen and not store.table_exists(ITEMS)
        state = read_state(store, ITEMS)[0]
        assert state is not None and state.state == "ready" and not state.load_id
    store.close()


def test_a_drop_that_fails_puts_the_state_back(
    embedded_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(embedded_url)
    with connect(embedded_url) as client:
        old = _expired_load(store, client.oracle.get_timestamp)
        before = read_state(store, ITEMS)

        def broken(name: str) -> None:
            raise RuntimeError("the store went away")

        monkeypatch.setattr(client.store, "drop_table", broken)
        with pytest.raises(RuntimeError, match="went away"):
            client.drop_table(ITEMS)
        assert read_state(store, ITEMS) == before
        assert read_state(store, ITEMS)[0] is not None
        assert old.start_ts == before[0].start_ts  # type: ignore[union-attr]
    store.close()


def test_release_survives_a_racing_renewal_and_renewal_keeps_to_its_incarnation(
    embedded_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import percolator.bulkload as bulkload

    lease_ms = 60_000
    store = open_store(embedded_url)
    with connect(embedded_url) as client:
        state = begin_load(
            store, client.oracle.get_timestamp, ITEMS, "load-1", lease_ms=lease_ms
        ).state
        real_read = bulkload.read_state
        renewed: list[bool] = []

        def renewal_right_after_the_read(store_: Any, table: str) -> Any:
            found = real_read(store_, table)
            if not renewed:
                renewed.append(True)
                renew_lease(store, ITEMS, "load-1", lease_ms)  # the driver's renewer
            return found

        monkeypatch.setattr(bulkload, "read_state", renewal_right_after_the_read)
        release_lease(store, ITEMS, state, lease_ms)
        monkeypatch.undo()
        assert renewed
        left = read_state(store, ITEMS)[0].lease_expires_ms - now_ms()  # type: ignore[union-attr]
        assert left < lease_ms // 4, left
        with pytest.raises(BulkLoadError, match="lost table"):
            renew_lease(store, ITEMS, "load-1", lease_ms, start_ts=state.start_ts + 1)
    store.close()


@pytest.mark.parametrize(
    "field", [("lease_expires_ms", "soon"), ("start_ts", True), ("load_id", 7)]
)
def test_a_state_with_a_field_of_the_wrong_type_is_unreadable(
    embedded_url: str, field: tuple[str, Any]
) -> None:
    import json

    from percolator.errors import ConfigError
    from percolator.layout import META_FAMILY, META_TABLE
    from percolator.store.base import Put
    from percolator.tablestate import STATE_QUALIFIER, LoadState, state_row

    doc = json.loads(LoadState("loading", "l", 5, 6, 7, "yes").encode())
    doc[field[0]] = field[1]
    store = open_store(embedded_url)
    with connect(embedded_url) as client:
        client.create_table(ITEMS)
        row = state_row(ITEMS)
        store.put(META_TABLE, [Put(row, META_FAMILY, STATE_QUALIFIER, 1, json.dumps(doc).encode())])
        with pytest.raises(ConfigError, match="wrong type"):
            client.drop_table(ITEMS)
    store.close()

"""The bulk-load fence (percolator/bulkload.py) without Spark: transactions racing it are
refused, never silently overwritten; take-over, publish, GC and drop."""

from __future__ import annotations

import time

import pytest

from percolator.bulkload import (
    BulkLoadError,
    TableLoadingError,
    begin_load,
    cell_puts,
    publish_load,
    read_state,
    renew_lease,
)
from percolator.layout import DATA, WRITE
from percolator.readers import live_readers, scan_reservations
from percolator.store import open_store
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

        # An existing empty table a client already uses: a write racing the load is found at
        # the publish, which refuses; the table stays fenced, nothing silently overwritten.
        client.create_table("empty")
        racer.create_table("empty")
        begun = begin_load(store, client.oracle.get_timestamp, "empty", "load-2")
        assert begun.state.created == "no"
        racer.run(lambda t: t.set("empty", b"r", "value", b"racer"), max_attempts=1)
        with pytest.raises(BulkLoadError, match="written by a transaction during load"):
            publish_load(store, "empty", "load-2")
        with connect(embedded_url) as fresh, pytest.raises(TableLoadingError):
            fresh.snapshot().get("empty", b"r", "value")
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
        # Dropping a table forgets its load state; the name can be loaded again.
        begin_load(store, ts, "other", "load-3")
        client.drop_table("other")
        assert read_state(store, "other")[0] is not None
        assert not begin_load(store, ts, "other", "load-4").published
    store.close()

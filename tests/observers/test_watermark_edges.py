"""Low watermarks that must not claim completeness too early (percolator/watermark.py):
a catch-up floor after GC truncated the history, a computation racing a catch-up (the
published record's compare-and-set, the registrations it scans), and bulk loads.

Each test judges the watermark against the stored data: every committed change of a watched
column below it must be covered by the observer's ack.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import cast

import pytest
from percolator.observers.api import register_observers, unregister_observer
from percolator.observers.drain import run_until_quiet
from percolator.observers.runner import process_notification

import percolator
from percolator import bulkload, tablestate, watermark
from percolator.layout import META_FAMILY, META_TABLE
from percolator.notifications import read_ack
from percolator.store.base import Put, Store
from percolator.tablestate import LoadState
from percolator.timestamps.source import TimestampOracle
from percolator.watermark import WatermarkTimeoutError, compute_watermarks
from tests.observers.helpers import EVENTS, RunLogger, pending_events

LOADED = "obs_loaded"


class WideRunLogger(RunLogger):
    """``run-logger`` registered again with one more column."""

    columns = ("value", "extra")  # type: ignore[assignment]


class LoadedLogger(RunLogger):
    name = "loaded-logger"
    table = LOADED
    columns = ("value",)


class DeclaredRunLogger(RunLogger):
    outputs = ()  # type: ignore[assignment]


def _ack(client: percolator.Client, observer: str, row: bytes, column: str) -> int | None:
    txn = client.observer_transaction()
    try:
        return read_ack(txn, observer, EVENTS, row, column)
    finally:
        txn.rollback()


def _commit(client: percolator.Client, row: bytes, column: str, value: bytes) -> int:
    with client.transaction() as txn:
        txn.set(EVENTS, row, column, value)
    assert txn.commit_ts is not None
    return txn.commit_ts


# --------------------------------------------------------------------------- catch-up and GC


def test_catch_up_floor_without_ack_covers_history_gc_removed(
    local_client: percolator.Client,
) -> None:
    client = local_client
    commits = [_commit(client, b"r", "value", b"%d" % i) for i in range(3)]
    client.gc(life_time_ms=0)  # keeps only the newest commit: commits[2]
    commits.append(_commit(client, b"r", "value", b"3"))
    register_observers(client, [RunLogger()])  # a new observer: it owes every commit
    held = compute_watermarks(client.store, client.oracle)["run-logger"]
    assert _ack(client, "run-logger", b"r", "value") is None
    assert held.watermark <= commits[0], "watermark above changes the catch-up owes"
    run_until_quiet(client, [RunLogger()])
    passed = client.wait_for(commits[-1], observers=["run-logger"], timeout=30)
    assert passed["run-logger"].watermark > commits[-1]


def test_catch_up_floor_with_ack_covers_history_gc_removed(
    local_client: percolator.Client,
) -> None:
    client = local_client
    # Declared: it writes no watched column, so work it left for itself (the origin bound
    # of an observer upstream of itself) does not hold its watermark.
    observer = DeclaredRunLogger()
    register_observers(client, [observer])
    acked = _commit(client, b"r", "value", b"0")
    run_until_quiet(client, [observer])
    assert _ack(client, "run-logger", b"r", "value") == acked
    assert unregister_observer(client, "run-logger")
    # Written while unwatched: owed from missed[0] on; GC keeps only missed[1] and later.
    missed = [_commit(client, b"r", "value", b"%d" % i) for i in (1, 2)]
    client.gc(life_time_ms=0)
    missed.append(_commit(client, b"r", "value", b"3"))
    register_observers(client, [observer])
    held = compute_watermarks(client.store, client.oracle)["run-logger"]
    assert held.watermark <= missed[0], "watermark above changes the catch-up owes"
    run_until_quiet(client, [observer])
    assert _ack(client, "run-logger", b"r", "value") == missed[-1]
    # The retained history now reaches back to the ack: the floor is exact again.
    assert unregister_observer(client, "run-logger")
    again = _commit(client, b"r", "value", b"4")
    register_observers(client, [observer])
    exact = compute_watermarks(client.store, client.oracle)["run-logger"]
    assert exact.watermark == again


# --------------------------------------------------------------------------- catch-up races


class _RegisterDuring:
    """Registers run-logger again with one more column, with its whole catch-up, once: as
    another process would, inside one watermark computation."""

    def __init__(self, client: percolator.Client) -> None:
        self.client = client
        self.fired = False

    def fire(self) -> None:
        if not self.fired:
            self.fired = True
            register_observers(self.client, [WideRunLogger()])


class _HookedStore:
    """The computing process's store: the hook fires at its first scan of ``table`` (after
    the published record and the floor were read)."""

    def __init__(self, store: Store, hook: _RegisterDuring, table: str) -> None:
        self._store, self._hook, self._table = store, hook, table

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)

    def scan(self, table: str, *args: object, **kwargs: object) -> Iterator[object]:
        if table == self._table:
            self._hook.fire()
        return self._store.scan(table, *args, **kwargs)  # type: ignore[arg-type]


class _HookedOracle:
    """The computing process's oracle: the hook fires at its first timestamp (after it read
    the registrations, before the published record and the floor)."""

    def __init__(self, oracle: TimestampOracle, hook: _RegisterDuring) -> None:
        self._oracle, self._hook = oracle, hook

    def __getattr__(self, name: str) -> object:
        return getattr(self._oracle, name)

    def get_timestamp(self) -> int:
        self._hook.fire()
        return self._oracle.get_timestamp()


def _unprocessed(client: percolator.Client, row: bytes, column: str, commit: int, w: int) -> bool:
    ack = _ack(client, "run-logger", row, column)
    return commit < w and (ack is None or ack < commit)


def test_a_computation_racing_a_catch_up_does_not_publish_past_its_floor(
    local_client: percolator.Client,
) -> None:
    client = local_client
    old = _commit(client, b"old", "extra", b"1")  # not watched yet, never processed
    register_observers(client, [RunLogger()])  # catch-up 1: nothing owed
    hook = _RegisterDuring(client)
    # The computation reads the published record, then (scanning EVENTS) another
    # process registers run-logger again with "extra" and runs its whole catch-up.
    raced = compute_watermarks(cast(Store, _HookedStore(client.store, hook, EVENTS)), client.oracle)
    assert hook.fired
    assert raced["run-logger"].watermark <= old, "returned a value the reset superseded"
    after = compute_watermarks(client.store, client.oracle)["run-logger"]
    assert not _unprocessed(client, b"old", "extra", old, after.watermark)
    # Every reset is unique (a nonce), and records without one still read.
    assert watermark._decode_published(b'{"v":1,"w":7,"h":[[9,7]]}') == (7, [(9, 7)])
    resets = {watermark._encode_published(0, nonce=str(i)) for i in range(2)}
    assert len(resets) == 2


def test_a_computation_scans_the_columns_of_the_floor_it_applies(
    local_client: percolator.Client,
) -> None:
    client = local_client
    old = _commit(client, b"old", "extra", b"1")
    register_observers(client, [RunLogger()])
    hook = _RegisterDuring(client)
    # Between the computation's read of the registrations and of the floor, another
    # process registers "extra" and finishes its catch-up.
    raced = compute_watermarks(
        client.store, cast(TimestampOracle, _HookedOracle(client.oracle, hook))
    )
    assert hook.fired
    assert raced["run-logger"].watermark <= old, "floor applied to columns not scanned"
    after = compute_watermarks(client.store, client.oracle)["run-logger"]
    assert not _unprocessed(client, b"old", "extra", old, after.watermark)
    run_until_quiet(client, [WideRunLogger()])
    client.wait_for(old, observers=["run-logger"], timeout=30)


# --------------------------------------------------------------------------- bulk loads


def _load_rows(client: percolator.Client, state: LoadState, rows: int) -> None:
    writer = bulkload.CellWriter(state, {b"value"})
    puts = []
    for i in range(rows):
        puts += writer.puts(b"r%d" % i, [(b"value", b"v%d" % i)])
    client.store.put(LOADED, puts)


def test_a_bulk_load_holds_the_watermark_at_its_commit_ts(local_client: percolator.Client) -> None:
    client = local_client
    client.create_table(LOADED)
    observer = LoadedLogger()
    register_observers(client, [observer])
    begun = bulkload.begin_load(client.store, client.oracle.get_timestamp, LOADED, "load-1")
    commit_ts = begun.state.commit_ts
    during = compute_watermarks(client.store, client.oracle)["loaded-logger"]
    assert during.watermark <= commit_ts
    assert "bulk-loaded" in during.describe()
    _load_rows(client, begun.state, 3)
    bulkload.publish_load(client.store, LOADED, "load-1")
    with pytest.raises(WatermarkTimeoutError):
        client.wait_for(commit_ts, observers=["loaded-logger"], timeout=0.3)
    run_until_quiet(client, [observer])
    assert client.wait_for(commit_ts, observers=["loaded-logger"], timeout=30)


def test_a_watermark_computed_while_a_load_begins_stays_below_it(
    local_client: percolator.Client,
) -> None:
    client = local_client
    client.create_table(LOADED)
    register_observers(client, [LoadedLogger()])
    seen: list[int] = []

    def timestamp() -> int:
        # Each timestamp the load draws, then a whole watermark computation (published).
        ts = client.oracle.get_timestamp()
        seen.append(compute_watermarks(client.store, client.oracle)["loaded-logger"].watermark)
        return ts

    begun = bulkload.begin_load(client.store, timestamp, LOADED, "load-1")
    commit_ts = begun.state.commit_ts
    assert begun.state.start_ts < commit_ts
    assert all(w <= commit_ts for w in seen), (seen, commit_ts)
    _load_rows(client, begun.state, 2)
    bulkload.publish_load(client.store, LOADED, "load-1")
    with pytest.raises(WatermarkTimeoutError):
        client.wait_for(commit_ts, observers=["loaded-logger"], timeout=0.3)


@pytest.mark.parametrize(
    "record",
    [b"not json", b'{"v": 2, "state": "ready"}', b'{"v": 1, "state": "loading"}', b"[1]"],
)
def test_a_state_record_the_engine_cannot_read_holds_the_watermark(
    local_client: percolator.Client, record: bytes
) -> None:
    """A table state this version cannot read cannot rule a load out: the watermark of the
    table's observers stays at 0 and says why; a readable ``ready`` record lets it go."""
    client = local_client
    client.create_table(LOADED)
    register_observers(client, [LoadedLogger()])
    row = tablestate.state_row(LOADED)
    client.store.put(META_TABLE, [Put(row, META_FAMILY, tablestate.STATE_QUALIFIER, 1, record)])
    held = compute_watermarks(client.store, client.oracle)["loaded-logger"]
    assert held.watermark == 0
    assert "bulk-loaded" in held.describe()
    ready = tablestate.LoadState(tablestate.READY, "", 0, 0, 0, "no").encode()
    client.store.put(META_TABLE, [Put(row, META_FAMILY, tablestate.STATE_QUALIFIER, 2, ready)])
    passed = compute_watermarks(client.store, client.oracle)["loaded-logger"]
    assert passed.watermark > 0


# --------------------------------------------------------------------------- cascades


class Copier(RunLogger):
    """Copies ``obs_events/chain`` to ``obs_events/copied`` (declared)."""

    name = "copier"
    columns = ("chain",)  # type: ignore[assignment]
    outputs = ((EVENTS, "copied"),)

    def process(self, txn: percolator.Transaction, row: bytes, column: str) -> None:
        super().process(txn, row, column)
        txn.set(EVENTS, row, "copied", txn.get(EVENTS, row, column) or b"")


class CopierV2(Copier):
    name = "copier-v2"


class CopyLogger(RunLogger):
    name = "copy-logger"
    columns = ("copied",)  # type: ignore[assignment]
    outputs = ()  # type: ignore[assignment]


def test_a_redeployed_upstream_observer_holds_its_downstream_again(
    local_client: percolator.Client,
) -> None:
    """While the upstream observer is unregistered (a redeploy under a new name), nothing
    upstream owes the downstream one anything and its published watermark rises past a
    change the upstream has not processed; published watermarks only rise, so registering
    the new upstream must reset the downstream one, or ``wait_for`` that change returns
    before its derived data exists."""
    client = local_client
    register_observers(client, [Copier(), CopyLogger()])
    change = _commit(client, b"r", "chain", b"1")
    held = compute_watermarks(client.store, client.oracle)["copy-logger"]
    assert held.watermark <= change and held.held_by == "copier"
    assert unregister_observer(client, "copier")
    gap = compute_watermarks(client.store, client.oracle)["copy-logger"]
    assert gap.watermark > change  # no upstream owes it anything now
    register_observers(client, [CopierV2()])
    again = compute_watermarks(client.store, client.oracle)["copy-logger"]
    assert again.watermark <= change, "downstream watermark past a change still owed to it"
    with pytest.raises(WatermarkTimeoutError):
        client.wait_for(change + 1, observers=["copy-logger"], timeout=0)
    run_until_quiet(client, [CopierV2(), CopyLogger()])
    assert client.wait_for(change + 1, observers=["copy-logger"], timeout=30)
    assert client.snapshot().get(EVENTS, b"r", "copied") == b"1"


class Propagator(RunLogger):
    """Writes the column it watches: row ``r1``'s value goes on to row ``r2``."""

    name = "propagator"
    columns = ("value",)  # type: ignore[assignment]
    outputs = ((EVENTS, "value"),)

    def process(self, txn: percolator.Transaction, row: bytes, column: str) -> None:
        super().process(txn, row, column)
        if row == b"r1":
            txn.set(EVENTS, b"r2", column, txn.get(EVENTS, row, column) or b"")


def test_work_an_observer_leaves_for_itself_holds_its_watermark_at_the_origin(
    local_client: percolator.Client,
) -> None:
    """A run derived from a change at ``c`` leaves a notification at its own, later commit
    timestamp; the observer's watermark must stay at or below ``c`` until that derived work
    is done too, as for a cycle through two observers."""
    client = local_client
    observer = Propagator()
    register_observers(client, [observer])
    compute_watermarks(client.store, client.oracle)
    change = _commit(client, b"r1", "value", b"v")
    compute_watermarks(client.store, client.oracle)  # published while the change waits
    [first] = [n for n in pending_events(client) if n.row == b"r1"]
    process_notification(client, observer, first)
    derived = compute_watermarks(client.store, client.oracle)["propagator"]
    assert [n.row for n in pending_events(client)] == [b"r2"]
    assert derived.watermark <= change, "watermark past a change whose derived work waits"
    run_until_quiet(client, [observer])
    assert client.wait_for(change + 1, observers=["propagator"], timeout=30)

"""The public transaction API on every backend."""

from __future__ import annotations

import threading

import pytest

import percolator
from percolator.errors import (
    ConflictError,
    InvalidArgumentError,
    TableNotFoundError,
    TransactionStateError,
)
from percolator.protocol.gc import lock_report
from percolator.timestamps.hybrid import compose
from percolator.transaction import TxnStatus

# The client API on every backend, and with every kind of oracle.
pytestmark = pytest.mark.every_oracle


def test_set_get_delete_and_commit_timestamps(client: percolator.Client) -> None:
    with client.transaction() as txn:
        assert txn.get("t", b"alice", "balance") is None
        txn.set("t", b"alice", "balance", b"10")
        txn.set("t", "bob", "balance", b"5")  # str rows are UTF-8
        assert txn.get("t", b"alice", "balance") == b"10"  # own writes are visible
    assert txn.status is TxnStatus.COMMITTED
    assert txn.commit_ts is not None and txn.commit_ts > txn.start_ts
    with client.transaction() as txn2:
        assert txn2.start_ts > txn.commit_ts
        assert txn2.get("t", b"bob", "balance") == b"5"
        txn2.delete("t", b"bob", "balance")
        assert txn2.get("t", b"bob", "balance") is None
    with client.snapshot() as snap:
        assert snap.get("t", b"alice", "balance") == b"10"
        assert snap.get("t", b"bob", "balance") is None


def test_snapshot_does_not_see_later_commits(client: percolator.Client) -> None:
    client.run(lambda t: t.set("t", b"k", "c", b"old"))
    snap = client.snapshot()
    client.run(lambda t: t.set("t", b"k", "c", b"new"))
    assert snap.get("t", b"k", "c") == b"old"
    assert client.snapshot().get("t", b"k", "c") == b"new"


def test_a_snapshot_at_a_timestamp_the_oracle_has_not_handed_out_is_refused(
    client: percolator.Client,
) -> None:
    """Transactions may still commit below such a timestamp: two reads there could see
    different data (an export reading its ranges at it would mix snapshots)."""
    client.run(lambda t: t.set("t", b"k", "c", b"old"))
    with client.transaction() as txn:
        txn.set("t", b"k", "c", b"new")
    assert txn.commit_ts is not None
    assert client.snapshot(txn.commit_ts).get("t", b"k", "c") == b"new"  # handed out: fine
    ahead = client.oracle.get_timestamp() + compose(10_000)  # ten seconds ahead
    with pytest.raises(InvalidArgumentError, match="above every timestamp the oracle"):
        client.snapshot(ahead)
    for bad in (0, -1, "5", True):
        with pytest.raises(InvalidArgumentError, match="read_ts must be a positive int"):
            client.snapshot(bad)  # type: ignore[arg-type]


def test_one_bare_string_where_a_list_of_names_is_expected_is_refused(
    client: percolator.Client,
) -> None:
    """Taken letter by letter, ``columns="c"`` would silently read nothing."""
    client.run(lambda t: t.set("t", b"k", "c", b"v"))
    snapshot = client.snapshot()
    with pytest.raises(InvalidArgumentError, match=r"columns=\['c'\] for one"):
        list(snapshot.scan("t", columns="c"))
    with pytest.raises(InvalidArgumentError, match="columns must be a list of names"):
        snapshot.get_row("t", b"k", "c")
    with pytest.raises(InvalidArgumentError, match="columns must be a list of names"):
        client.transaction().get_row("t", b"k", "c")
    with pytest.raises(InvalidArgumentError, match="tables must be a list of names"):
        client.gc(tables="t")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="observers must be a list of names"):
        client.wait_for(observers="x", timeout=0)
    assert snapshot.get_row("t", b"k", ["c"]) == {"c": b"v"}
    assert client.gc(life_time_ms=0, tables=["t", "t"]).tables == ["t"]  # once, not twice


def test_exception_rolls_back_and_writes_nothing(client: percolator.Client) -> None:
    with pytest.raises(RuntimeError), client.transaction() as txn:
        txn.set("t", b"k", "c", b"v")
        raise RuntimeError("user code failed")
    assert txn.status is TxnStatus.ROLLED_BACK
    assert client.snapshot().get("t", b"k", "c") is None
    assert client.store.read_row("t", b"k") == {}


def test_use_after_commit_is_refused(client: percolator.Client) -> None:
    txn = client.transaction()
    txn.set("t", b"k", "c", b"v")
    txn.commit()
    with pytest.raises(TransactionStateError):
        txn.set("t", b"k", "c", b"w")
    with pytest.raises(TransactionStateError):
        txn.get("t", b"k", "c")
    with pytest.raises(TransactionStateError):
        txn.commit()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("t", 5, "c", b"v"), "row must be bytes or str"),
        (("t", b"", "c", b"v"), "row key must be"),
        (("t", b"k", "", b"v"), "column name must not be empty"),
        (("t", b"k", b"c", b"v"), "column must be a str"),
        (("t", b"k", "c", "text"), "must be bytes"),
        (("t", b"k", "!ack/x", b"v"), "reserved"),
        (("bad name", b"k", "c", b"v"), "table name"),
    ],
)
def test_bad_arguments_raise_at_the_call(
    client: percolator.Client, args: tuple[object, ...], message: str
) -> None:
    txn = client.transaction()
    with pytest.raises(InvalidArgumentError, match=message):
        txn.set(*args)  # type: ignore[arg-type]
    txn.set("t", b"ok", "c", b"v")
    txn.commit()
    assert client.snapshot().get("t", b"ok", "c") == b"v"


def test_unknown_table_raises_before_writing(client: percolator.Client) -> None:
    txn = client.transaction()
    with pytest.raises(TableNotFoundError, match="nope"):
        txn.set("nope", b"k", "c", b"v")
    with pytest.raises(TableNotFoundError):
        txn.get("nope", b"k", "c")


def test_create_table_is_idempotent(client: percolator.Client) -> None:
    client.create_table("t")
    client.create_table("u")
    assert {"t", "u"} <= set(client.list_tables())
    with pytest.raises(InvalidArgumentError, match="reserved"):
        client.create_table("percolator_x")


def test_write_write_conflict_names_both_timestamps(client: percolator.Client) -> None:
    t1 = client.transaction()
    t2 = client.transaction()
    t1.set("t", b"k", "c", b"1")
    t2.set("t", b"k", "c", b"2")
    t1.commit()
    with pytest.raises(ConflictError) as info:
        t2.commit()
    assert info.value.start_ts == t2.start_ts
    assert info.value.conflict_ts == t1.commit_ts
    assert info.value.row == b"k" and info.value.table == "t"
    assert t2.status is TxnStatus.ROLLED_BACK
    assert client.snapshot().get("t", b"k", "c") == b"1"
    assert lock_report(client.store, "t") == []


def test_failed_multi_cell_commit_leaves_no_lock(client: percolator.Client) -> None:
    blocker = client.transaction()
    blocker.set("t", b"m", "c", b"x")
    blocker.commit()
    t = client.transaction()
    # Start t before the blocker's next commit so the secondary conflicts.
    other = client.transaction()
    other.set("t", b"z", "c", b"other")
    t.set("t", b"a", "c", b"1")
    t.set("t", b"z", "c", b"2")  # secondary, conflicts with `other`
    other.commit()
    with pytest.raises(ConflictError):
        t.commit()
    assert lock_report(client.store, "t") == []
    snap = client.snapshot()
    assert snap.get("t", b"a", "c") is None
    assert snap.get("t", b"z", "c") == b"other"


def test_run_retries_the_whole_function(client: percolator.Client) -> None:
    client.run(lambda t: t.set("t", b"n", "c", b"0"))
    attempts = []
    barrier = threading.Barrier(2)

    def increment(txn: percolator.Transaction) -> int:
        attempts.append(txn.start_ts)
        value = int(txn.get("t", b"n", "c") or b"0")
        if len(attempts) == 1:
            # Let a competing increment commit between our read and our commit.
            barrier.wait()
            barrier.wait()
        txn.set("t", b"n", "c", str(value + 1).encode())
        return value + 1

    def competitor() -> None:
        barrier.wait()
        client.run(
            lambda t: t.set("t", b"n", "c", str(int(t.get("t", b"n", "c") or 0) + 1).encode())
        )
        barrier.wait()

    thread = threading.Thread(target=competitor)
    thread.start()
    result = client.run(increment, max_attempts=5)
    thread.join()
    assert len(attempts) == 2 and attempts[1] > attempts[0]
    assert result == 2
    assert client.snapshot().get("t", b"n", "c") == b"2"


def test_run_gives_up_after_max_attempts(client: percolator.Client) -> None:
    def always_conflicts(txn: percolator.Transaction) -> None:
        raise ConflictError("synthetic", table="t", row=b"k", column="c")

    with pytest.raises(ConflictError):
        client.run(always_conflicts, max_attempts=3)
    with pytest.raises(InvalidArgumentError):
        client.run(always_conflicts, max_attempts=0)


def test_concurrent_increments_lose_nothing(client: percolator.Client) -> None:
    client.run(lambda t: t.set("t", b"ctr", "n", b"0"))
    threads, per_thread = 4, 15

    def increment(txn: percolator.Transaction) -> None:
        value = int(txn.get("t", b"ctr", "n") or b"0")
        txn.set("t", b"ctr", "n", str(value + 1).encode())

    def worker() -> None:
        for _ in range(per_thread):
            client.run(increment, max_attempts=1000, backoff_ms=1)

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert client.snapshot().get("t", b"ctr", "n") == str(threads * per_thread).encode()


def test_scan_merges_own_writes_and_skips_deleted(client: percolator.Client) -> None:
    def setup(txn: percolator.Transaction) -> None:
        for row in (b"a", b"b", b"c", b"d"):
            txn.set("t", row, "x", row.upper())
        txn.set("t", b"b", "y", b"by")

    client.run(setup)
    with client.transaction() as txn:
        txn.delete("t", b"c", "x")
        txn.set("t", b"bb", "x", b"new")
        txn.set("t", b"a", "x", b"A2")
        rows = list(txn.scan("t", start=b"a", stop=b"d"))
        assert rows == [
            (b"a", {"x": b"A2"}),
            (b"b", {"x": b"B", "y": b"by"}),
            (b"bb", {"x": b"new"}),
        ]
        assert list(txn.scan("t", columns=["y"])) == [(b"b", {"y": b"by"})]
    snap_rows = list(client.snapshot().scan("t"))
    assert [r for r, _ in snap_rows] == [b"a", b"b", b"bb", b"d"]


def test_multi_table_transaction(client: percolator.Client) -> None:
    client.create_table("u")
    with client.transaction() as txn:
        txn.set("t", b"k", "c", b"in t")
        txn.set("u", b"k", "c", b"in u")
    snap = client.snapshot()
    assert snap.get("t", b"k", "c") == b"in t"
    assert snap.get("u", b"k", "c") == b"in u"


def test_read_only_transaction_commits_nothing(client: percolator.Client) -> None:
    with client.transaction() as txn:
        txn.get("t", b"k", "c")
    assert txn.commit_ts is None and txn.status is TxnStatus.COMMITTED


def test_uncontended_read_is_one_round_trip(client: percolator.Client) -> None:
    client.run(lambda t: t.set("t", b"k", "c", b"v"))
    with client.transaction() as txn:
        before = dict(client.store.stats.calls)
        assert txn.get("t", b"k", "c") == b"v"
        after = dict(client.store.stats.calls)
    delta = {op: after.get(op, 0) - before.get(op, 0) for op in after}
    assert sum(delta.values()) == 1, delta


def test_large_and_empty_values(client: percolator.Client) -> None:
    big = bytes(range(256)) * 8192  # 2 MiB
    with client.transaction() as txn:
        txn.set("t", b"big", "c", big)
        txn.set("t", b"empty", "c", b"")
    snap = client.snapshot()
    assert snap.get("t", b"big", "c") == big
    assert snap.get("t", b"empty", "c") == b""


def test_connect_rejects_unknown_options() -> None:
    with pytest.raises(InvalidArgumentError, match="lock_ttl"):
        percolator.connect("memory:", oracle=percolator.testing.ManualOracle(), lock_tll_ms=5)


def test_get_with_commit_ts_names_the_visible_commit(client: percolator.Client) -> None:
    with client.transaction() as first:
        first.set("t", b"k", "c", b"v1")
    with client.transaction() as second:
        second.delete("t", b"k", "c")
    with client.transaction() as txn:
        assert txn.get_with_commit_ts("t", b"k", "c") == (None, second.commit_ts)
        assert txn.get_with_commit_ts("t", b"never", "c") == (None, None)
        txn.set("t", b"k", "c", b"mine")  # own writes do not change the visible commit
        assert txn.get_with_commit_ts("t", b"k", "c") == (None, second.commit_ts)
    assert client.snapshot(first.commit_ts).get_with_commit_ts("t", b"k", "c") == (
        b"v1",
        first.commit_ts,
    )

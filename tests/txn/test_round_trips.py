"""Round trips of the commit path, counted by the store, and the shortcuts staying correct.

A transaction that read a cell hands what it read to its prewrite, which then skips its
own read of that cell; a prewrite with no missing history puts data and locks at once.
These tests pin the round-trip counts (so a regression in the hot path shows) and show the
shortcut cannot hide a write-write conflict: the lock compare-and-set expects the bytes
the transaction read, so a commit in between fails it and the cell is re-read.
"""

from __future__ import annotations

import pytest

import percolator
from percolator.errors import ConflictError
from tests.conftest import ClientSettings

pytestmark = pytest.mark.usefixtures("steady_table_checks")


@pytest.fixture
def client_settings() -> ClientSettings:
    return ClientSettings(lock_ttl_ms=2000, lock_wait_ms=2000)


def reads_and_writes(client: percolator.Client) -> dict[str, int]:
    return dict(client._ctx.store.stats.calls)


def delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {op: n - before.get(op, 0) for op, n in after.items() if n != before.get(op, 0)}


def test_read_then_write_skips_the_prewrite_read(client: percolator.Client) -> None:
    with client.transaction() as txn:
        txn.set("t", b"k", "c", b"1")
    blind = reads_and_writes(client)
    with client.transaction() as txn:
        txn.set("t", b"k", "c", b"2")
    blind_calls = delta(blind, reads_and_writes(client))

    before = reads_and_writes(client)
    with client.transaction() as txn:
        value = txn.get("t", b"k", "c")
        txn.set("t", b"k", "c", (value or b"") + b"!")
    rmw_calls = delta(before, reads_and_writes(client))
    # Same number of store reads as the blind write: the transaction's own read replaced
    # the prewrite's read (a blind write reads once, in its prewrite).
    blind_reads = sum(n for op, n in blind_calls.items() if op.startswith(("read", "get")))
    rmw_reads = sum(n for op, n in rmw_calls.items() if op.startswith(("read", "get")))
    assert blind_reads >= 1
    assert rmw_reads == blind_reads, (blind_calls, rmw_calls)
    with client.snapshot() as snap:
        assert snap.get("t", b"k", "c") == b"2!"


def test_stale_read_still_conflicts(client: percolator.Client) -> None:
    with client.transaction() as txn:
        txn.set("t", b"k", "c", b"0")
    slow = client.transaction()
    assert slow.get("t", b"k", "c") == b"0"
    with client.transaction() as fast:  # commits after `slow` read the cell
        fast.set("t", b"k", "c", b"fast")
    slow.set("t", b"k", "c", b"slow")
    with pytest.raises(ConflictError, match="write-write conflict"):
        slow.commit()
    with client.snapshot() as snap:
        assert snap.get("t", b"k", "c") == b"fast"


def test_stale_read_of_a_cell_locked_since_conflicts(client: percolator.Client) -> None:
    with client.transaction() as txn:
        txn.set("t", b"k", "c", b"0")
    slow = client.transaction()
    assert slow.get("t", b"k", "c") == b"0"
    holder = client.transaction()
    holder.set("t", b"k", "c", b"held")
    from percolator.committer import Committer

    committer = Committer(client._ctx, holder.start_ts, list(holder._writes.values()))
    committer.prewrite_all()  # a live lock, placed after `slow` read the cell
    slow.set("t", b"k", "c", b"slow")
    with pytest.raises(ConflictError):
        slow.commit()
    committer.commit()
    with client.snapshot() as snap:
        assert snap.get("t", b"k", "c") == b"held"


def test_a_cell_read_twice_at_one_snapshot_is_read_from_the_store_once(
    client: percolator.Client,
) -> None:
    with client.transaction() as txn:
        txn.set("t", b"k", "c", b"1")
        txn.set("t", b"j", "c", b"2")
    with client.transaction() as txn:
        before = reads_and_writes(client)
        txn.prefetch([("t", b"k", "c"), ("t", b"j", "c")])
        assert txn.get_with_commit_ts("t", b"k", "c")[0] == b"1"
        assert txn.get("t", b"k", "c") == b"1"
        assert txn.get_row("t", b"j", ["c"]) == {"c": b"2"}
        reads = delta(before, reads_and_writes(client))
        assert reads == {"read_rows": 1}, reads
        # Repeatable: a commit after this snapshot changes nothing it reads again.
        with client.transaction() as later:
            later.set("t", b"k", "c", b"later")
        assert txn.get("t", b"k", "c") == b"1"
        txn.set("t", b"x", "c", b"-")


def test_a_blind_write_of_many_rows_reads_only_the_cells_it_writes(
    client: percolator.Client,
) -> None:
    # One column in each of many rows, each a different column (an inverted index's
    # postings): the prewrite reads each written cell's lock and write record, not every
    # column of every row, and all of them in one read (the primary's with the
    # secondaries', not one read before the primary's lock and one after).
    store = client._ctx.store
    cells_read: list[int] = []
    original = store.read_cells

    def counting(table: str, cells: list[tuple[bytes, tuple[str, bytes]]], **kw: object) -> object:
        cells_read.append(len(cells))
        return original(table, cells, **kw)  # type: ignore[arg-type]

    store.read_cells = counting  # type: ignore[method-assign]
    try:
        with client.transaction() as txn:
            for i in range(40):
                txn.set("t", b"token%02d" % i, f"cluster{i:02d}", b"p")
    finally:
        del store.read_cells
    assert cells_read == [2 * 40], cells_read  # lock and write record of each cell
    with client.snapshot() as snap:
        assert snap.get("t", b"token07", "cluster07") == b"p"
        assert snap.get("t", b"token07", "cluster08") is None

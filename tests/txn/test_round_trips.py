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
from percolator.errors import ConflictError, PercolatorError
from percolator.protocol.prewrite import AbsentCells
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


def insert(client: percolator.Client, rows: list[bytes], table: str = "t") -> None:
    with client.transaction() as txn:
        for row in rows:
            txn.set(table, row, "c", b"new")


def test_inserts_into_a_table_of_new_cells_skip_the_prewrite_read(
    client: percolator.Client,
) -> None:
    """Once a table's unread written cells have mostly been new (AbsentCells), a blind
    write takes them as absent: no read, the compare-and-sets from absent apply."""
    for i in range(AbsentCells.MIN_SEEN):
        insert(client, [b"warm%02d" % i])
    before = reads_and_writes(client)
    insert(client, [b"fresh"])
    one = delta(before, reads_and_writes(client))
    assert not any(op.startswith(("read", "get", "scan")) for op in one), one
    before = reads_and_writes(client)
    insert(client, [b"fresh%02d" % i for i in range(10)])
    ten = delta(before, reads_and_writes(client))
    assert not any(op.startswith(("read", "get", "scan")) for op in ten), ten
    with client.snapshot() as snap:
        assert snap.get("t", b"fresh", "c") == b"new"
        assert snap.get("t", b"fresh07", "c") == b"new"


def test_a_guess_that_meets_an_existing_cell_reads_it_and_still_conflicts(
    client: percolator.Client,
) -> None:
    """Taken as absent, a cell that exists fails its compare-and-set from absent and is
    read: a write-write conflict is still found, and a blind update still commits."""
    insert(client, [b"k"])
    for i in range(AbsentCells.MIN_SEEN):
        insert(client, [b"warm%02d" % i])
    assert client._ctx.absent_cells.guess("t")
    stale = client.transaction()
    with client.transaction() as txn:
        txn.set("t", b"k", "c", b"committed after stale began")
    stale.set("t", b"k", "c", b"lost update")
    with pytest.raises(ConflictError, match="write-write conflict"):
        stale.commit()
    insert(client, [b"k", b"new-too"])  # an update taken as absent, with a real insert
    with client.snapshot() as snap:
        assert snap.get("t", b"k", "c") == b"new"
        assert snap.get("t", b"new-too", "c") == b"new"


def test_a_table_of_blind_updates_keeps_reading_first(client: percolator.Client) -> None:
    """Where unread written cells exist, guessing would cost a failed compare-and-set
    each: such a table is never guessed, and one that turns to updates stops being."""
    rows = [b"u%02d" % i for i in range(4)]
    insert(client, rows)
    for _ in range(3 * AbsentCells.MIN_SEEN):
        insert(client, rows)
    assert not client._ctx.absent_cells.guess("t")
    before = reads_and_writes(client)
    insert(client, rows)
    calls = delta(before, reads_and_writes(client))
    assert sum(n for op, n in calls.items() if op.startswith("read")) == 1, calls

    for i in range(2 * AbsentCells.MIN_SEEN):  # inserts for a while: guessed
        insert(client, [b"i%02d" % i])
    assert client._ctx.absent_cells.guess("t")
    for _ in range(5):  # then updates again: the failed guesses turn it back
        insert(client, rows)
    assert not client._ctx.absent_cells.guess("t")


def test_guesses_that_end_in_a_conflict_still_count(client: percolator.Client) -> None:
    """A guessed cell that exists and is locked by a live transaction fails its
    compare-and-set and then the transaction (a conflict): that failure counts too, so a
    table of such cells stops being guessed instead of paying a failed round each time."""
    for i in range(AbsentCells.MIN_SEEN):
        insert(client, [b"warm%02d" % i])
    assert client._ctx.absent_cells.guess("t")
    holder = client.transaction()
    holder.set("t", b"hot", "c", b"held")
    holder.set("t", b"hot2", "c", b"held")
    from percolator.committer import Committer

    committer = Committer(client._ctx, holder.start_ts, list(holder._writes.values()))
    committer.prewrite_all()  # holder's locks stay: a live transaction
    for n in range(10):
        txn = client.transaction()
        txn.set("t", b"new%02d" % n, "c", b"x")
        txn.set("t", b"hot", "c", b"x")
        txn.set("t", b"hot2", "c", b"x")
        with pytest.raises(PercolatorError):
            txn.commit()
        if not client._ctx.absent_cells.guess("t", 3):
            break
    else:
        pytest.fail("a table whose guesses keep failing is still guessed")
    committer.commit()


def test_a_guess_covers_every_cell_of_a_table_or_none() -> None:
    """One existing cell among many guessed costs a failed round and a read: a transaction's
    cells of a table are guessed only if all of them are likely absent."""
    absent = AbsentCells()
    assert not absent.guess("t")  # nothing seen yet
    for _ in range(AbsentCells.MIN_SEEN):
        absent.observe("t", True)
    assert absent.guess("t", 1) and absent.guess("t", 10)
    absent.observe("t", False)  # share 0.9
    assert absent.guess("t", 1) and not absent.guess("t", 10)
    assert not absent.guess("other")


def test_a_read_of_many_cells_is_split_and_each_row_comes_whole(
    client: percolator.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read of more than CELLS_PER_READ cells goes to the store in several reads (each
    cell's lock cell, write record and data in the same one), so a wide row is never asked
    of the store in one piece; the reader still gets every value, and a scan each row whole."""
    from percolator.protocol import cells as cells_module

    columns = [f"c{i}" for i in range(7)]
    with client.transaction() as txn:
        for row in (b"a", b"b"):
            for column in columns:
                txn.set("t", row, column, row + column.encode())
    monkeypatch.setattr(cells_module, "CELLS_PER_READ", 6)  # 2 cells with their 3 families
    before = reads_and_writes(client)
    with client.snapshot() as snap:
        assert snap.get_row("t", b"a", columns) == {c: b"a" + c.encode() for c in columns}
        reads = delta(before, reads_and_writes(client))
        assert reads == {"read_rows": 4}, reads  # 7 cells, 2 per read
        assert list(snap.scan("t")) == [
            (row, {c: row + c.encode() for c in columns}) for row in (b"a", b"b")
        ]

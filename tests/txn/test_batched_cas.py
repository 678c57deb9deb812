"""Lock compare-and-sets sent in batches (``Store.compare_and_set_many``): a prewrite sends
its locks in one call per table, and the committer the secondaries' commits.  What a batch
broken half-way leaves must still be all or nothing, judged from the raw store:

* a prewrite whose batch fails (the request of one compare-and-set lost, or its reply lost
  after it applied) either finds every lock its own and commits, or aborts and rolls back
  every lock it placed: the client is told which, truthfully;
* a secondaries' batch that fails after the commit point leaves nothing locked: the
  committer rolls each unsettled cell forward on its own, re-reading it first;
* the number of store calls a commit makes is pinned: one batch per table for the locks,
  one for the secondaries;
* puts riding in a batch (the prewrite's data, the commit's write records) and lost with
  it are put again.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable, Iterator, Sequence

import pytest

import percolator
from percolator.errors import PercolatorError, StoreUnavailableError
from percolator.layout import LOCK, WRITE, commit_index_qualifier
from percolator.store import Store
from percolator.store.base import CompareAndSet, Put
from percolator.testing import FaultyStore, ManualOracle
from percolator.testing.faults import Call
from tests.txn.raw_inspect import (
    COMMITTED,
    ROLLED_BACK,
    encode_value,
    locked_cells,
    read_all,
    transactions,
)

TABLES = ("ba", "bb")
# Three cells of table ``ba`` (the first is the primary), one of ``bb``.  Lock
# compare-and-sets in order: the primary's lock (1, alone), the secondaries' locks 2-3
# (``ba``) and 4 (``bb``), the commit point (5), the secondaries' commits 6-7 (``ba``) and 8
# (``bb``).
CELLS = [("ba", "a", "x"), ("ba", "a", "y"), ("ba", "b", "x"), ("bb", "b", "y")]
PREWRITE = (1, 2, 3, 4)
SECONDARIES = (6, 7, 8)


@pytest.fixture
def faulty(store: Store) -> Iterator[FaultyStore]:
    yield FaultyStore(store)


def connect(store: Store) -> percolator.Client:
    client = percolator.connect(store, oracle=ManualOracle(), lock_ttl_ms=300, lock_wait_ms=5000)
    for table in TABLES:
        client.create_table(table)
    return client


def nth_lock_cas(n: int) -> Callable[[Call], bool]:
    """A rule predicate matching the ``n``-th compare-and-set of a lock cell of ``TABLES``."""
    seen = itertools.count(1)
    return lambda call: call["table"] in TABLES and call["family"] == LOCK and next(seen) == n


def commit_counting_calls(store: Store, txn: percolator.Transaction) -> dict[str, int]:
    """Commit ``txn``; the store calls the commit made, by operation."""
    before = dict(store.stats.calls)
    txn.commit()
    return {op: n - before.get(op, 0) for op, n in store.stats.calls.items()}


def value_of(txn: percolator.Transaction) -> bytes:
    return encode_value(f"b{txn.start_ts}", len(CELLS), txn.start_ts)


def write_cells(client: percolator.Client) -> tuple[percolator.Transaction, list[tuple]]:
    tag = uuid.uuid4().hex[:8]
    cells = [(t, f"{r}-{tag}".encode(), c) for t, r, c in CELLS]
    txn = client.transaction()
    for table, row, column in cells:
        txn.set(table, row, column, value_of(txn))
    return txn, cells


@pytest.mark.parametrize("applied", [False, True], ids=["request-lost", "reply-lost"])
@pytest.mark.parametrize("position", PREWRITE)
def test_a_prewrite_batch_broken_half_way_is_all_or_nothing(
    faulty: FaultyStore, position: int, applied: bool
) -> None:
    client = connect(faulty)
    try:
        txn, cells = write_cells(client)
        rule = faulty.fail("compare_and_set", when=nth_lock_cas(position), applied=applied)
        try:
            txn.commit()
            told = "committed"
        except PercolatorError as exc:
            assert exc.retryable, exc
            told = "rolled back"
        assert rule.hits == 1
        # Straight from the raw store, before any reader resolves anything.
        stored = read_all(faulty.inner, TABLES)
        assert not locked_cells(stored), "the committer left locks behind"
        found = transactions(stored).get(txn.start_ts)
        if found is None:
            # No trace at all: where data rides on its lock (conditional puts), a transaction
            # none of whose locks landed stored nothing.
            assert told == "rolled back" and faulty.conditional_puts
        else:
            outcome = found.outcome
            assert outcome == (COMMITTED if told == "committed" else ROLLED_BACK), (told, outcome)
        # A failing call stops the compare-and-sets after it (the rest of its batch, and the
        # next table's batch), so only a reply lost on the last one of a round leaves every
        # lock placed: then it commits.
        assert (told == "committed") == (applied and position in (1, 4)), told
        with client.snapshot() as snap:
            values = {snap.get(*cell) for cell in cells}
        assert values == ({value_of(txn)} if told == "committed" else {None})
    finally:
        client.close()


@pytest.mark.parametrize("applied", [False, True], ids=["request-lost", "reply-lost"])
@pytest.mark.parametrize("position", SECONDARIES)
def test_a_secondaries_batch_broken_half_way_leaves_nothing_locked(
    faulty: FaultyStore, position: int, applied: bool
) -> None:
    client = connect(faulty)
    try:
        txn, cells = write_cells(client)
        rule = faulty.fail("compare_and_set", when=nth_lock_cas(position), applied=applied)
        txn.commit()  # past the commit point: the error is the committer's to settle
        assert rule.hits == 1
        stored = read_all(faulty.inner, TABLES)
        assert not locked_cells(stored), "a secondary was left locked"
        # Including the write records that rode on compare-and-sets that never ran.
        assert_committed_with_records(faulty.inner, client, txn, cells)
    finally:
        client.close()


def test_a_commit_sends_one_lock_batch_per_table(store: Store) -> None:
    client = connect(store)
    try:
        txn, _ = write_cells(client)
        calls = commit_counting_calls(store, txn)
        # Prewrite: the primary's lock first (1 batch), then the secondaries' locks, one
        # batch per table (2); the commit point alone (a batch of one where it carries the
        # primary's record); the secondaries' commits, one batch per table (2).
        assert calls.get("compare_and_set_many") == 5 + store.conditional_puts, calls
        assert calls.get("compare_and_set") == 4 + 1 + 3, calls
    finally:
        client.close()


def test_a_one_cell_commit_makes_two_write_calls_where_puts_are_conditional(
    store: Store,
) -> None:
    client = connect(store)
    try:
        txn = client.transaction()
        row_written = uuid.uuid4().hex.encode()
        txn.set("ba", row_written, "c", b"v")
        calls = commit_counting_calls(store, txn)
        if store.conditional_puts:
            # The lock with the data put in one call; the commit point with the write
            # record and the commit-index entry riding on it: two write calls.
            assert calls.get("compare_and_set_many") == 2, calls
            assert calls.get("compare_and_set") == 2, calls
            assert calls.get("put", 0) == 0, calls
        else:
            # The lock with the data put, the commit point, then the commit-index entry in
            # a put of its own and the record (protocol/commit.py: MUST).
            assert calls.get("compare_and_set_many") == 1, calls
            assert calls.get("compare_and_set") == 2, calls
            assert calls.get("put", 0) >= 2, calls
        # From the stored data: committed, unlocked, the record and index entry in place.
        stored = read_all(store, ["ba"])
        assert not locked_cells(stored)
        [history] = [h for h in stored if h.row == row_written]
        assert [commit_ts for commit_ts, _ in history.writes] == [txn.commit_ts]
        index = store.read_row("ba", row_written, [(WRITE, commit_index_qualifier(b"c"))])
        assert index[(WRITE, commit_index_qualifier(b"c"))][0][0] == txn.start_ts
    finally:
        client.close()


# Call 2 (the secondaries' locks of ``ba``) is left out: its failure stops ``bb``'s batch,
# so the prewrite aborts (all or nothing: the tests above).
@pytest.mark.parametrize("call_no", [1, 3, 4, 5])
def test_puts_lost_by_a_broken_batch_are_put_again(faulty: FaultyStore, call_no: int) -> None:
    """On a store without conditional puts (HBase without its Thrift-2 gateway: the wrapper
    hides the inner store's), the ``call_no``-th lock batch carrying puts (1-3: the
    prewrite's data with the primary's lock, then the secondaries' locks of ``ba`` and
    ``bb``; 4-5: the write records with the secondaries' commits of ``ba`` and ``bb``) fails
    after its compare-and-sets applied and before its puts landed, as a call whose puts and
    compare-and-sets run concurrently (HBase) may.  The prewrite finds the locks its own and
    puts its data again; the committer puts the records again: committed, every record
    stored."""
    faulty.conditional_puts = False
    real = faulty.compare_and_set_many
    seen = itertools.count(1)

    def losing_puts(
        table: str, items: Sequence[CompareAndSet], puts: Sequence[Put] = ()
    ) -> list[bool]:
        assert not any(item.then_put for item in items), "a put rode where none can"
        if puts and table in TABLES and next(seen) == call_no:
            real(table, items)  # the compare-and-sets land, the puts do not
            raise StoreUnavailableError("connection lost after the compare-and-sets")
        return real(table, items, puts)

    faulty.compare_and_set_many = losing_puts  # type: ignore[method-assign]
    client = connect(faulty)
    try:
        txn, cells = write_cells(client)
        txn.commit()
        assert next(seen) > call_no, "the batch to break was never sent"
        assert_committed_with_records(faulty.inner, client, txn, cells)
    finally:
        client.close()


def test_every_put_rides_on_a_lock_where_puts_are_conditional(faulty: FaultyStore) -> None:
    """Where puts are conditional no lock batch carries a loose put: each cell's data rides
    on its lock, each secondary's write record on its commit, and the primary's record and
    commit-index entry on the commit point; each lands exactly with its compare-and-set."""
    assert faulty.conditional_puts, "every test backend has conditional puts"
    real = faulty.compare_and_set_many
    riders: list[int] = []
    loose: list[Put] = []

    def counting(
        table: str, items: Sequence[CompareAndSet], puts: Sequence[Put] = ()
    ) -> list[bool]:
        if table in TABLES:
            riders.extend(len(item.then_put) for item in items)
            loose.extend(puts)
        return real(table, items, puts)

    faulty.compare_and_set_many = counting  # type: ignore[method-assign]
    client = connect(faulty)
    try:
        txn, cells = write_cells(client)
        calls = commit_counting_calls(faulty, txn)
        assert loose == []
        # Four locks with their data, three secondaries' commits with their records, and
        # the commit point with two.
        assert sorted(riders) == [1, 1, 1, 1, 1, 1, 1, 2], riders
        assert calls.get("put", 0) == 0, calls
        assert_committed_with_records(faulty.inner, client, txn, cells)
    finally:
        client.close()


def assert_committed_with_records(
    store: Store, client: percolator.Client, txn: percolator.Transaction, cells: list[tuple]
) -> None:
    """From the raw store: ``txn`` committed, nothing locked, every cell's write record
    stored; and a snapshot reads its value in every cell."""
    stored = read_all(store, TABLES)
    assert not locked_cells(stored)
    assert transactions(stored)[txn.start_ts].outcome == COMMITTED
    for table, row, column in cells:
        records = store.read_row(table, row, [(WRITE, column.encode())])
        assert records, f"no write record for {table}/{row!r}/{column}"
    with client.snapshot() as snap:
        assert {snap.get(*cell) for cell in cells} == {value_of(txn)}

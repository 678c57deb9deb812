"""The commit index survives a crash between any two puts (percolator/protocol/commit.py).

A status check finds a committed transaction from its primary's commit-index entry once the
primary's lock cell has moved on to a later commit, and a prewrite that replaces the lock
cell's commit re-puts a missing record and entry, judging "missing" by the record alone.  So
every writer of a primary's write record must store the entry first, in an earlier put: a
put is atomic per row *and version* only, and on HBase the entry (at ``start_ts``) and the
record (at ``commit_ts``) go in separate calls.  When they did not, a worker killed between
the two left a committed transaction whose remaining secondaries were later rolled back
(the example pipeline's kill test saw an acknowledgement committed while the same run's
``links_applied`` was rolled back).

Here the store splits every put per (row, version) and has no conditional puts, as HBase
without its Thrift-2 gateway (where nothing rides on a compare-and-set, so every record and
entry is a put of its own), and a client "dies" after each write-family put in turn: from
then on nothing it sends reaches the store.  Then another client commits over the primary,
and every cell of the dead transaction must read as committed.
"""

from __future__ import annotations

import contextlib
import itertools
import uuid
from collections.abc import Callable

import pytest

import percolator
from percolator.layout import WRITE
from percolator.protocol.cells import CellKey, fetch_cells
from percolator.protocol.resolve import TxnOutcome, TxnState, resolve_lock
from percolator.protocol.rollback import rollback_cell
from percolator.records import LockCell
from percolator.store.memory import MemoryStore
from percolator.testing import FaultyStore, ManualOracle, ProtocolHarness
from percolator.testing.faults import Call

TABLES = ("ua", "ub")


class Died(BaseException):
    """The client process is gone: nothing after this reaches the store."""


_WRITING = ("put", "compare_and_set", "read_rows", "delete_versions")


def _is_write_put(call: Call) -> bool:
    return call.method == "put" and any(p.family == WRITE for p in call["puts"])


def _die_after(store: FaultyStore, n: int, counts: Callable[[Call], bool]) -> list[bool]:
    """After the ``n``-th call for which ``counts`` is true has reached the store, every
    call raises :class:`Died` before reaching it (all threads of the client: the
    secondaries' compare-and-sets run beside the record puts).  Returns a flag list:
    ``[True]`` once it died."""
    died: list[bool] = []
    seen = itertools.count(1)

    def after(call: Call, _result: object) -> None:
        if not died and counts(call) and next(seen) == n:
            died.append(True)
            raise Died

    def refuse(_call: Call) -> None:
        if died:
            raise Died

    for method in _WRITING:
        store.after(method, after)
        store.before(method, refuse)
    return died


def _die_after_write_put(store: FaultyStore, n: int) -> list[bool]:
    """:func:`_die_after` the ``n``-th put carrying a write-family cell."""
    return _die_after(store, n, _is_write_put)


CELLS = [("ua", "a", "x"), ("ua", "a", "y"), ("ua", "b", "x"), ("ub", "b", "y")]


def _trial(
    n: int, counts: Callable[[Call], bool] = _is_write_put, *, conditional_puts: bool = True
) -> bool:
    """Commit a transaction over :data:`CELLS` with its client dying after its ``n``-th
    call that ``counts``, then check it from another client: all of it or none of it, and
    all of it if it died after the commit point.  False: it never got that far.
    ``conditional_puts=False``: the dying client's store has none (puts ride on nothing)."""
    inner = MemoryStore()
    store = FaultyStore(inner, split_puts=True)
    store.conditional_puts = conditional_puts
    oracle = ManualOracle()
    dying = percolator.connect(store, oracle=oracle, lock_ttl_ms=200)
    survivor = percolator.connect(inner, oracle=oracle, lock_ttl_ms=200)
    try:
        for table in TABLES:
            survivor.create_table(table)
        tag = uuid.uuid4().hex[:8]
        # The primary is the first in sort order (ua/a/x); two rows of the primary's table
        # and one of another, so the records go out in several (row, version) puts.
        cells = [(table, f"{row}-{tag}".encode(), column) for table, row, column in CELLS]
        txn = dying.transaction()
        for table, row, column in cells:
            txn.set(table, row, column, b"v-" + column.encode())
        # Whether the commit point (the primary's compare-and-set to Committed) applied.
        point: list[bool] = []
        store.after(
            "compare_and_set",
            lambda call, applied: point.append(bool(applied)),
            when=lambda call: (
                (call["table"], call["row"]) == cells[0][:2]
                and call["qualifier"] == b"x"
                and LockCell.decode(call["new"]).lock is None
            ),
        )
        died = _die_after(store, n, counts)
        with contextlib.suppress(Died):
            txn.commit()
        if not died:
            return False
        # Another client commits over the primary (once the dead lock expired, if the
        # commit point was not reached): its lock cell forgets the dead transaction.
        primary = cells[0]
        survivor.run(lambda t: t.set(*primary, b"later"), max_attempts=50)
        snapshot = survivor.snapshot()
        found = {cell: snapshot.get(*cell) for cell in cells}
        committed = {cell: b"v-" + cell[2].encode() for cell in cells} | {primary: b"later"}
        rolled_back = {cell: None for cell in cells} | {primary: b"later"}
        expected = committed if any(point) else rolled_back
        assert found == expected, f"client died after call {n} (commit point: {point})"
        return True
    finally:
        store.clear()  # the dead client may unregister now
        dying.close()
        survivor.close()


def test_client_dying_after_any_record_put_leaves_its_transaction_committed() -> None:
    n = 1
    while _trial(n, conditional_puts=False):
        n += 1
    # The primary's index, its row's records, the other row's, the other table's.
    assert n > 3, f"only {n - 1} write-family puts: the store no longer splits them"


def test_client_dying_after_any_store_call_leaves_all_or_nothing() -> None:
    """The same at every store call of the commit, reads and compare-and-sets included,
    with the records riding on the compare-and-sets and without."""
    for conditional_puts in (True, False):
        n = 1
        while _trial(n, lambda call: True, conditional_puts=conditional_puts):
            n += 1
        assert n > 10, f"only {n - 1} store calls: the commit no longer reached the store?"


def test_prewrite_dying_while_repairing_history_keeps_the_old_commit_findable() -> None:
    """A prewrite that re-puts a dead committer's record and index dies half-way; a third
    transaction then replaces the commit: the first one is still found committed."""
    store = FaultyStore(MemoryStore(), split_puts=True)
    h = ProtocolHarness(store)
    p = (b"p", "c")
    h.must_prewrite([(b"p", "c", b"P"), (b"s", "c", b"S")], primary=p, start_ts=h.ts(10))
    h.must_commit_primary(p, h.ts(10), h.ts(11))  # the committer dies here: no record
    died = _die_after_write_put(store, 1)
    with pytest.raises(Died):
        h.prewrite([(b"p", "c", b"P2")], primary=p, start_ts=h.ts(20))
    assert died
    store.clear()
    h.must_prewrite([(b"p", "c", b"P3")], primary=p, start_ts=h.ts(30))
    h.must_commit_primary(p, h.ts(30), h.ts(31))
    h.must_get(b"s", "c", h.ts(40), b"S")


def test_a_committed_transaction_that_lost_a_secondary_says_so_loudly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The tripwire for the bug above: if another client ever rolls back a secondary of a
    transaction whose primary committed, the committer logs an error naming the cell."""
    inner = MemoryStore()
    store = FaultyStore(inner)
    client = percolator.connect(store, oracle=ManualOracle())
    try:
        for table in TABLES:
            client.create_table(table)
        txn = client.transaction()
        txn.set("ua", b"a", "x", b"primary")
        txn.set("ub", b"b", "y", b"secondary")
        secondary = CellKey("ub", b"b", "y")

        def roll_back_secondary(call: Call) -> None:
            rollback_cell(inner, secondary, txn.start_ts)

        # Just before the secondary's commit compare-and-set (the primary has committed).
        store.before(
            "compare_and_set",
            roll_back_secondary,
            times=1,
            when=lambda call: (
                call["table"] == "ub"
                and call["row"] == b"b"
                and LockCell.decode(call["new"]).lock is None
            ),
        )
        txn.commit()
        errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
        assert any("atomicity is broken" in e and "ub/b'b'/y" in e for e in errors), errors
    finally:
        client.close()


def test_a_resolver_finding_a_committed_cell_rolled_back_says_so_loudly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    h = ProtocolHarness(MemoryStore())
    p = (b"p", "c")
    h.must_prewrite([(b"p", "c", b"P"), (b"s", "c", b"S")], primary=p, start_ts=h.ts(10))
    stale = h.must_locked(b"s", "c", h.ts(10))
    h.must_commit_primary(p, h.ts(10), h.ts(11))
    raw = fetch_cells(h.store, [h.key(b"s", "c")], before=None, with_data=False)
    rollback_cell(h.store, h.key(b"s", "c"), h.ts(10))  # what only a protocol bug does
    committed = TxnOutcome(TxnState.COMMITTED, commit_ts=h.ts(11))
    resolve_lock(h.store, h.key(b"s", "c"), stale, raw[h.key(b"s", "c")].lock_bytes, committed)
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert any("atomicity is broken" in e and "t/b's'/c" in e for e in errors), errors

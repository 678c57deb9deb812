"""The store contract: the same tests run against every backend (memory, embedded, HBase).

The contract is the module docstring of :mod:`percolator.store.base`.  The facts about HBase
it encodes (exclusive ``before``, deletes that mask later puts, ``checkAndPut`` matching an
absent *or* empty cell, server-stamped compare-and-set) are checked here against a real
HBase, so the memory and embedded stores are held to what HBase really does.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from percolator.errors import InvalidArgumentError, TableExistsError, TableNotFoundError
from percolator.store import (
    MAX_VERSION,
    CompareAndSet,
    Delete,
    FamilySpec,
    Put,
    RowCells,
    ScanOptions,
    Store,
)
from percolator.store.base import MAX_ROW_LENGTH
from tests.conftest import StoreNamespace
from tests.store._store_worker import cas_chain, cas_counter, read_cell

REPO_ROOT = Path(__file__).resolve().parents[2]

# The table most tests use: a multi-version data family, a second family, and a lock-like
# family keeping one version (the "l" family is also what the CAS workers use).
FAMILIES = [FamilySpec("d"), FamilySpec("w"), FamilySpec("l", max_versions=1, in_memory=True)]


@pytest.fixture
def table(store: Store) -> str:
    store.create_table("t", FAMILIES)
    return "t"


def versions_of(
    store: Store, table: str, row: bytes, family: str, qualifier: bytes
) -> list[tuple[int, bytes]]:
    """Every version of one cell, newest first."""
    return store.read_row(table, row, [(family, qualifier)], max_versions=1000).get(
        (family, qualifier), []
    )


def now_ms() -> int:
    return time.time_ns() // 1_000_000


# --------------------------------------------------------------------------- table admin


def test_create_list_exists_drop(store: Store) -> None:
    assert store.list_tables() == []
    store.create_table("beta", [FamilySpec("d")])
    store.create_table("alpha", [FamilySpec("d")])
    assert store.list_tables() == ["alpha", "beta"]
    assert store.table_exists("alpha")
    assert not store.table_exists("gamma")
    store.drop_table("alpha")
    assert store.list_tables() == ["beta"]
    assert not store.table_exists("alpha")


def test_family_options_are_stored(store: Store) -> None:
    specs = [
        FamilySpec("d", max_versions=2**31 - 1),
        FamilySpec("l", max_versions=1, in_memory=True, block_cache=True),
        FamilySpec("n", max_versions=5, in_memory=False, block_cache=False),
    ]
    store.create_table("t", specs)
    got = sorted(store.table_families("t"), key=lambda spec: spec.name)
    assert got == specs


def test_duplicate_and_unknown_tables_raise(store: Store, table: str) -> None:
    with pytest.raises(TableExistsError):
        store.create_table(table, [FamilySpec("d")])
    with pytest.raises(TableNotFoundError):
        store.drop_table("missing")
    with pytest.raises(TableNotFoundError):
        store.table_families("missing")
    with pytest.raises(TableNotFoundError):
        store.read_rows("missing", [b"r"])
    with pytest.raises(TableNotFoundError):
        store.put("missing", [Put(b"r", "d", b"q", 1, b"v")])
    with pytest.raises(TableNotFoundError):
        store.compare_and_set("missing", b"r", "d", b"q", None, b"v")
    with pytest.raises(TableNotFoundError):
        store.delete_versions("missing", [Delete(b"r", "d", b"q", 1)])
    with pytest.raises(TableNotFoundError):
        list(store.scan("missing", "d"))


def test_drop_removes_the_data(store: Store, table: str) -> None:
    store.put(table, [Put(b"r", "d", b"q", 5, b"v")])
    store.drop_table(table)
    store.create_table(table, FAMILIES)
    assert store.read_row(table, b"r") == {}
    assert list(store.scan(table, "d")) == []


BAD_TABLES = [
    ("", [FamilySpec("d")]),
    ("bad/name", [FamilySpec("d")]),
    ("bad name", [FamilySpec("d")]),
    ("good", []),
    ("good", [FamilySpec("d"), FamilySpec("d")]),
    ("good", [FamilySpec("d", max_versions=0)]),
    ("good", [FamilySpec("bad:family")]),
    ("good", [FamilySpec("")]),
]


def test_create_table_rejects_bad_arguments(store: Store) -> None:
    for name, families in BAD_TABLES:
        must_reject((name, families), store.create_table, name, families)
    assert store.list_tables() == []


def test_family_max_versions_is_honoured(store: Store) -> None:
    store.create_table("t", [FamilySpec("one", max_versions=1), FamilySpec("two", max_versions=2)])
    store.put("t", [Put(b"r", "one", b"q", v, b"v%d" % v) for v in (1, 2, 3)])
    store.put("t", [Put(b"r", "two", b"q", v, b"v%d" % v) for v in (1, 2, 3, 4)])
    assert versions_of(store, "t", b"r", "one", b"q") == [(3, b"v3")]
    assert versions_of(store, "t", b"r", "two", b"q") == [(4, b"v4"), (3, b"v3")]
    # A put older than the kept versions does not come back.
    store.put("t", [Put(b"r", "two", b"q", 1, b"old")])
    assert versions_of(store, "t", b"r", "two", b"q") == [(4, b"v4"), (3, b"v3")]


def test_compare_and_set_on_one_version_family_keeps_one(store: Store, table: str) -> None:
    expected = None
    for i in range(5):
        assert store.compare_and_set(table, b"r", "l", b"q", expected, b"v%d" % i)
        expected = b"v%d" % i
    versions = versions_of(store, table, b"r", "l", b"q")
    assert [value for _, value in versions] == [b"v4"]


# --------------------------------------------------------------------------- puts and reads


def test_versions_and_bounds(store: Store, table: str) -> None:
    store.put(table, [Put(b"r", "d", b"q", v, b"v%d" % v) for v in (10, 20, 30)])
    col = [("d", b"q")]

    def read(
        before: int | None = None, min_version: int = 0, max_versions: int = 1
    ) -> list[tuple[int, bytes]]:
        cells = store.read_row(
            table, b"r", col, before=before, min_version=min_version, max_versions=max_versions
        )
        return cells.get(("d", b"q"), [])

    assert read() == [(30, b"v30")]
    # ``before`` is exclusive.
    assert read(before=31) == [(30, b"v30")]
    assert read(before=30) == [(20, b"v20")]
    assert read(before=11) == [(10, b"v10")]
    assert read(before=10) == []
    assert read(before=0) == []
    assert read(max_versions=3) == [(30, b"v30"), (20, b"v20"), (10, b"v10")]
    assert read(max_versions=2) == [(30, b"v30"), (20, b"v20")]
    assert read(max_versions=2, before=30) == [(20, b"v20"), (10, b"v10")]
    # ``min_version`` is inclusive.
    assert read(max_versions=5, min_version=20) == [(30, b"v30"), (20, b"v20")]
    assert read(min_version=20, before=25) == [(20, b"v20")]
    assert read(min_version=21, before=30) == []
    assert read(min_version=30) == [(30, b"v30")]


def test_extreme_versions(store: Store, table: str) -> None:
    store.put(table, [Put(b"r", "d", b"q", 0, b"zero"), Put(b"r", "d", b"q", MAX_VERSION, b"max")])
    assert versions_of(store, table, b"r", "d", b"q") == [(MAX_VERSION, b"max"), (0, b"zero")]
    assert store.read_row(table, b"r", before=MAX_VERSION) == {("d", b"q"): [(0, b"zero")]}
    assert store.read_row(table, b"r", before=MAX_VERSION + 1) == {
        ("d", b"q"): [(MAX_VERSION, b"max")]
    }


def test_read_selection(store: Store, table: str) -> None:
    store.put(
        table,
        [
            Put(b"r", "d", b"a", 1, b"da"),
            Put(b"r", "d", b"b", 1, b"db"),
            Put(b"r", "w", b"a", 1, b"wa"),
        ],
    )
    everything = {
        ("d", b"a"): [(1, b"da")],
        ("d", b"b"): [(1, b"db")],
        ("w", b"a"): [(1, b"wa")],
    }
    assert store.read_row(table, b"r") == everything
    assert store.read_row(table, b"r", families=["d", "w", "l"]) == everything
    assert store.read_row(table, b"r", families=["w"]) == {("w", b"a"): [(1, b"wa")]}
    assert store.read_row(table, b"r", [("d", b"b")]) == {("d", b"b"): [(1, b"db")]}
    assert store.read_row(table, b"r", [("d", b"b"), ("d", b"missing")]) == {
        ("d", b"b"): [(1, b"db")]
    }
    assert store.read_row(table, b"r", [("d", b"a")], ["w"]) == {
        ("d", b"a"): [(1, b"da")],
        ("w", b"a"): [(1, b"wa")],
    }
    # An explicitly empty selection selects nothing.
    assert store.read_row(table, b"r", columns=[]) == {}
    assert store.read_row(table, b"r", families=[]) == {}
    assert store.read_row(table, b"r", families=["l"]) == {}


def test_read_rows_many_with_missing(store: Store, table: str) -> None:
    present = [b"row%04d" % i for i in range(0, 600, 2)]
    store.put(table, [Put(row, "d", b"q", 7, row[::-1]) for row in present])
    asked = [b"row%04d" % i for i in range(600)] + [b"row0000", b"nope"]
    got = store.read_rows(table, asked, [("d", b"q")])
    assert got == {row: {("d", b"q"): [(7, row[::-1])]} for row in present}
    assert store.read_rows(table, []) == {}


def test_read_cells_reads_exactly_the_cells_named(store: Store, table: str) -> None:
    # Each row has both columns; only the named (row, column) pairs come back, each its
    # newest version below ``before``.
    store.put(
        table,
        [
            Put(row, family, q, v, b"%s/%s/%s/%d" % (row, family.encode(), q, v))
            for row in (b"r1", b"r2", b"r3")
            for family in ("d", "w")
            for q in (b"a", b"b")
            for v in (3, 5)
        ],
    )
    cells = [
        (b"r1", ("d", b"a")),
        (b"r2", ("w", b"b")),
        (b"r2", ("d", b"a")),
        (b"r1", ("d", b"a")),  # named twice: read once
        (b"nope", ("d", b"a")),  # absent: left out
        (b"r3", ("l", b"a")),  # absent family cell: left out
    ]
    assert store.read_cells(table, cells) == {
        b"r1": {("d", b"a"): [(5, b"r1/d/a/5")]},
        b"r2": {("w", b"b"): [(5, b"r2/w/b/5")], ("d", b"a"): [(5, b"r2/d/a/5")]},
    }
    assert store.read_cells(table, cells, before=5) == {
        b"r1": {("d", b"a"): [(3, b"r1/d/a/3")]},
        b"r2": {("w", b"b"): [(3, b"r2/w/b/3")], ("d", b"a"): [(3, b"r2/d/a/3")]},
    }
    assert store.read_cells(table, cells, before=3) == {}
    assert store.read_cells(table, []) == {}


def test_read_cells_many_rows_each_its_own_column(store: Store, table: str) -> None:
    # The shape a transaction writing one column in each of many rows reads: more cells
    # than fit one statement of the local stores, none named twice.
    store.put(table, [Put(b"row%03d" % i, "d", b"q%03d" % i, 1, b"v%d" % i) for i in range(300)])
    cells = [(b"row%03d" % i, ("d", b"q%03d" % i)) for i in range(0, 300, 2)]
    cells += [(b"row%03d" % i, ("d", b"q%03d" % (i + 1))) for i in range(0, 300, 2)]
    assert store.read_cells(table, cells) == {
        b"row%03d" % i: {("d", b"q%03d" % i): [(1, b"v%d" % i)]} for i in range(0, 300, 2)
    }


BAD_CELL_READS: list[object] = [
    "text",
    [b"r"],
    [(b"r", "d", b"q")],
    [(b"r", ("d",))],
    [("r", ("d", b"q"))],
    [(b"", ("d", b"q"))],
    [(b"r", ("nofamily", b"q"))],
    [(b"r", ("d", "q"))],
]


def test_read_cells_rejects_bad_cells_and_tables(store: Store, table: str) -> None:
    for cells in BAD_CELL_READS:
        must_reject(cells, store.read_cells, table, cells)
    must_reject("before", store.read_cells, table, [(b"r", ("d", b"q"))], before="soon")
    with pytest.raises(TableNotFoundError):
        store.read_cells("missing", [(b"r", ("d", b"q"))])


def test_put_is_idempotent_and_the_later_value_wins(store: Store, table: str) -> None:
    store.put(table, [Put(b"r", "d", b"q", 5, b"a")])
    store.put(table, [Put(b"r", "d", b"q", 5, b"a")])
    assert versions_of(store, table, b"r", "d", b"q") == [(5, b"a")]
    store.put(table, [Put(b"r", "d", b"q", 5, b"b")])
    assert versions_of(store, table, b"r", "d", b"q") == [(5, b"b")]


def test_several_clients_see_each_others_writes(
    backend: StoreNamespace, store: Store, table: str
) -> None:
    with backend.open() as other:
        other.put(table, [Put(b"r", "d", b"q", 1, b"from other")])
        assert store.read_row(table, b"r") == {("d", b"q"): [(1, b"from other")]}
        assert other.list_tables() == [table]


# --------------------------------------------------------------------------- deletes


def test_delete_removes_versions_at_or_below(store: Store, table: str) -> None:
    store.put(table, [Put(b"r", "d", b"q", v, b"v%d" % v) for v in range(1, 6)])
    store.put(table, [Put(b"r", "d", b"other", 1, b"x"), Put(b"r2", "d", b"q", 1, b"y")])
    store.delete_versions(table, [Delete(b"r", "d", b"q", 3)])
    assert versions_of(store, table, b"r", "d", b"q") == [(5, b"v5"), (4, b"v4")]
    assert versions_of(store, table, b"r", "d", b"other") == [(1, b"x")]
    assert versions_of(store, table, b"r2", "d", b"q") == [(1, b"y")]
    store.delete_versions(table, [Delete(b"r", "d", b"q", 5)])
    assert store.read_row(table, b"r", [("d", b"q")]) == {}


def test_one_delete_call_with_a_timestamp_per_cell(store: Store, table: str) -> None:
    # What garbage collection sends: each cell deleted below its own kept version (on HBase
    # one call per timestamp, sent in parallel).
    rows = [b"r%03d" % i for i in range(40)]
    store.put(table, [Put(row, "d", b"q", v, b"v%d" % v) for row in rows for v in range(1, 6)])
    store.delete_versions(table, [Delete(row, "d", b"q", 1 + i % 4) for i, row in enumerate(rows)])
    for i, row in enumerate(rows):
        kept = [(v, b"v%d" % v) for v in range(5, 1 + i % 4, -1)]
        assert versions_of(store, table, row, "d", b"q") == kept, row


def test_delete_masks_later_puts_at_or_below(store: Store, table: str) -> None:
    store.put(table, [Put(b"r", "d", b"q", 8, b"before delete")])
    store.delete_versions(table, [Delete(b"r", "d", b"q", 10)])
    store.put(table, [Put(b"r", "d", b"q", v, b"masked") for v in (1, 9, 10)])
    assert versions_of(store, table, b"r", "d", b"q") == []
    store.put(table, [Put(b"r", "d", b"q", 11, b"visible")])
    assert versions_of(store, table, b"r", "d", b"q") == [(11, b"visible")]
    # A lower delete later does not shrink the mask.
    store.delete_versions(table, [Delete(b"r", "d", b"q", 2)])
    store.put(table, [Put(b"r", "d", b"q", 7, b"still masked")])
    assert versions_of(store, table, b"r", "d", b"q") == [(11, b"visible")]
    # The mask is per cell.
    store.put(table, [Put(b"r", "d", b"q2", 5, b"other cell")])
    assert versions_of(store, table, b"r", "d", b"q2") == [(5, b"other cell")]


def test_compact_deletes_forgets_masks_except_on_hbase(store: Store, table: str) -> None:
    store.put(table, [Put(b"r", "d", b"q", 8, b"v8"), Put(b"r", "d", b"keep", 3, b"kept")])
    store.delete_versions(table, [Delete(b"r", "d", b"q", 10)])
    dropped = store.compact_deletes(table)
    store.put(table, [Put(b"r", "d", b"q", 9, b"late")])
    if store.url.startswith("hbase:"):
        # HBase drops its markers at its own major compactions, never on this call.
        assert dropped == 0
        assert versions_of(store, table, b"r", "d", b"q") == []
    else:
        assert dropped == 1
        assert versions_of(store, table, b"r", "d", b"q") == [(9, b"late")]
        assert store.compact_deletes(table) == 0
    # What was deleted stays deleted; other cells are untouched.
    assert versions_of(store, table, b"r", "d", b"keep") == [(3, b"kept")]
    with pytest.raises(TableNotFoundError):
        store.compact_deletes("nosuchtable")


def test_delete_mask_also_hides_a_compare_and_set(store: Store, table: str) -> None:
    # A compare-and-set is stamped with store time (ms), far below this delete: HBase
    # reports success, but the delete marker hides the written cell.  The protocol never
    # deletes in a family it compare-and-sets; this pins down why it must not.
    store.delete_versions(table, [Delete(b"r", "l", b"q", MAX_VERSION)])
    assert store.compare_and_set(table, b"r", "l", b"q", None, b"hidden")
    assert store.read_row(table, b"r") == {}


def test_delete_of_absent_cell_and_empty_batch(store: Store, table: str) -> None:
    store.delete_versions(table, [Delete(b"nothing", "d", b"q", 100)])
    store.delete_versions(table, [])
    store.put(table, [])
    assert store.read_row(table, b"nothing") == {}


# --------------------------------------------------------------------------- compare-and-set


def test_cas_absent_to_value(store: Store, table: str) -> None:
    start = now_ms()
    assert store.compare_and_set(table, b"r", "d", b"q", None, b"first")
    end = now_ms()
    [(version, value)] = versions_of(store, table, b"r", "d", b"q")
    assert value == b"first"
    # The store stamps the version with its clock in milliseconds.
    assert start - 5000 <= version <= end + 5000


def test_cas_with_wrong_expected_changes_nothing(store: Store, table: str) -> None:
    store.put(table, [Put(b"r", "d", b"q", 5, b"current")])
    assert not store.compare_and_set(table, b"r", "d", b"q", b"other", b"new")
    assert not store.compare_and_set(table, b"r", "d", b"q", None, b"new")
    assert not store.compare_and_set(table, b"r", "d", b"q", b"", b"new")
    assert versions_of(store, table, b"r", "d", b"q") == [(5, b"current")]
    # Expecting a value of an absent cell fails too, and creates nothing.
    assert not store.compare_and_set(table, b"absent", "d", b"q", b"current", b"new")
    assert store.read_row(table, b"absent") == {}


def test_cas_expected_none_matches_empty_value(store: Store, table: str) -> None:
    store.put(table, [Put(b"r", "d", b"q", 5, b"")])
    assert store.compare_and_set(table, b"r", "d", b"q", None, b"x")
    assert versions_of(store, table, b"r", "d", b"q")[0][1] == b"x"
    # ``b""`` expected behaves like None: it matches an absent or empty cell only.
    assert not store.compare_and_set(table, b"r", "d", b"q", b"", b"y")
    assert store.compare_and_set(table, b"absent", "d", b"q", b"", b"y")
    store.put(table, [Put(b"e", "d", b"q", 5, b"")])
    assert store.compare_and_set(table, b"e", "d", b"q", b"", b"z")
    assert versions_of(store, table, b"e", "d", b"q")[0][1] == b"z"


def test_cas_compares_exact_bytes_of_the_newest_version(store: Store, table: str) -> None:
    store.put(table, [Put(b"r", "d", b"q", 1, b"older"), Put(b"r", "d", b"q", 2, b"abc")])
    for wrong in (b"older", b"ab", b"abc\x00", b"ABC", b"\x00abc"):
        assert not store.compare_and_set(table, b"r", "d", b"q", wrong, b"new")
    assert store.compare_and_set(table, b"r", "d", b"q", b"abc", b"new")
    assert versions_of(store, table, b"r", "d", b"q")[0][1] == b"new"


def test_cas_result_is_the_newest_version(store: Store, table: str) -> None:
    store.put(table, [Put(b"r", "d", b"q", 5, b"0")])
    last_version = 5
    for i in range(1, 30):
        assert store.compare_and_set(table, b"r", "d", b"q", b"%d" % (i - 1), b"%d" % i)
        [(version, value)] = store.read_row(table, b"r", [("d", b"q")])[("d", b"q")]
        assert value == b"%d" % i
        assert version >= last_version
        last_version = version


def test_cas_stamps_never_go_backwards_across_cells(store: Store, table: str) -> None:
    stamps = []
    for i in range(20):
        row = b"cell%02d" % i
        assert store.compare_and_set(table, row, "l", b"q", None, b"v")
        stamps.append(store.read_row(table, row)[("l", b"q")][0][0])
    assert stamps == sorted(stamps)


def test_cas_above_the_clock_takes_the_compared_version(store: Store, table: str) -> None:
    # HBase 2 stamps a compare-and-set with max(server time, version of the compared cell),
    # so the written value is the newest even when the cell holds a version above the
    # clock; at an equal version it replaces the compared value.
    future = 1 << 60
    store.put(table, [Put(b"r", "d", b"q", 5, b"old"), Put(b"r", "d", b"q", future, b"future")])
    assert store.compare_and_set(table, b"r", "d", b"q", b"future", b"new")
    assert versions_of(store, table, b"r", "d", b"q") == [(future, b"new"), (5, b"old")]
    assert store.compare_and_set(table, b"r", "d", b"q", b"new", b"newer")
    assert versions_of(store, table, b"r", "d", b"q") == [(future, b"newer"), (5, b"old")]


def test_cas_many_decides_each_cell_on_its_own(store: Store, table: str) -> None:
    store.put(table, [Put(b"a", "l", b"q", 5, b"A"), Put(b"b", "l", b"q", 5, b"B")])
    items = [
        CompareAndSet(b"a", "l", b"q", b"A", b"A2"),  # matches
        CompareAndSet(b"b", "l", b"q", b"stale", b"B2"),  # does not
        CompareAndSet(b"c", "l", b"q", None, b"C"),  # absent: matches
        CompareAndSet(b"a", "d", b"other", b"x", b"y"),  # absent, expects a value
    ]
    assert store.compare_and_set_many(table, items) == [True, False, True, False]
    assert read_cell_of(store, table, b"a", "l", b"q") == b"A2"
    assert read_cell_of(store, table, b"b", "l", b"q") == b"B"
    assert read_cell_of(store, table, b"c", "l", b"q") == b"C"
    assert store.read_row(table, b"a", [("d", b"other")]) == {}
    assert store.compare_and_set_many(table, []) == []


def test_cas_many_refuses_two_items_on_one_cell(store: Store, table: str) -> None:
    # The items of a call run in no defined order (HBase sends them in parallel), so two
    # on one cell would race: refused before anything is written.
    items = [
        CompareAndSet(b"other", "l", b"q", None, b"0"),
        CompareAndSet(b"r", "l", b"q", None, b"1"),
        CompareAndSet(b"r", "l", b"q", b"1", b"2"),
    ]
    with pytest.raises(InvalidArgumentError, match="one cell"):
        store.compare_and_set_many(table, items)
    assert store.read_row(table, b"other") == {} and store.read_row(table, b"r") == {}
    # Other columns of one row are other cells.
    other_column = [
        CompareAndSet(b"r", "l", b"q", None, b"1"),
        CompareAndSet(b"r", "l", b"q2", None, b"2"),
    ]
    assert store.compare_and_set_many(table, other_column) == [True, True]


def test_cas_many_stamps_like_single_compare_and_sets(store: Store, table: str) -> None:
    start = now_ms()
    items = [CompareAndSet(b"cell%02d" % i, "l", b"q", None, b"v") for i in range(20)]
    assert store.compare_and_set_many(table, items) == [True] * 20
    end = now_ms()
    stamps = [store.read_row(table, b"cell%02d" % i)[("l", b"q")][0][0] for i in range(20)]
    assert all(start - 5000 <= stamp <= end + 5000 for stamp in stamps)
    assert store.compare_and_set(table, b"after", "l", b"q", None, b"v")
    assert store.read_row(table, b"after")[("l", b"q")][0][0] >= max(stamps)


def test_a_bad_item_fails_compare_and_set_many_before_writing(store: Store, table: str) -> None:
    for args in BAD_CAS:
        bad = CompareAndSet(*args)  # type: ignore[arg-type]
        batch = [CompareAndSet(b"good", "l", b"q", None, b"v"), bad]
        must_reject(args, store.compare_and_set_many, table, batch)
        assert store.read_row(table, b"good") == {}, f"after {args!r}"
    must_reject("not a sequence", store.compare_and_set_many, table, b"items")
    must_reject("not an item", store.compare_and_set_many, table, [(b"r", "l", b"q", None, b"v")])
    with pytest.raises(TableNotFoundError):
        store.compare_and_set_many("missing", [CompareAndSet(b"r", "l", b"q", None, b"v")])


def test_cas_many_carries_puts(store: Store, table: str) -> None:
    # Puts ride with the compare-and-sets, whatever each compare-and-set decides.
    store.put(table, [Put(b"a", "l", b"q", 5, b"A")])
    items = [
        CompareAndSet(b"a", "l", b"q", b"A", b"A2"),
        CompareAndSet(b"b", "l", b"q", b"stale", b"B"),
    ]
    puts = [
        Put(b"a", "d", b"q", 7, b"data a"),
        Put(b"b", "d", b"q", 7, b"data b"),
        Put(b"c", "w", b"q", 9, b"record c"),
    ]
    assert store.compare_and_set_many(table, items, puts) == [True, False]
    assert read_cell_of(store, table, b"a", "l", b"q") == b"A2"
    assert store.read_row(table, b"b", [("l", b"q")]) == {}
    assert versions_of(store, table, b"a", "d", b"q") == [(7, b"data a")]
    assert versions_of(store, table, b"b", "d", b"q") == [(7, b"data b")]
    assert versions_of(store, table, b"c", "w", b"q") == [(9, b"record c")]
    # Puts alone are a put.
    assert store.compare_and_set_many(table, [], [Put(b"d", "d", b"q", 3, b"d")]) == []
    assert versions_of(store, table, b"d", "d", b"q") == [(3, b"d")]


def test_then_put_lands_with_its_compare_and_set_only(store: Store, table: str) -> None:
    # Puts of the item's row that land only if the compare-and-set applies, atomically with
    # it; a store without conditional puts refuses them before writing anything.
    store.put(table, [Put(b"a", "l", b"q", 5, b"A")])
    record_a = Put(b"a", "w", b"q", 9, b"record a")
    record_b = Put(b"b", "w", b"q", 9, b"record b")
    items = [
        CompareAndSet(b"a", "l", b"q", b"A", b"A2", (record_a, Put(b"a", "d", b"x", 9, b"x"))),
        CompareAndSet(b"b", "l", b"q", b"stale", b"B", (record_b,)),
    ]
    if not store.conditional_puts:
        must_reject("then_put", store.compare_and_set_many, table, items)
        assert read_cell_of(store, table, b"a", "l", b"q") == b"A"
        assert store.read_row(table, b"a", families=["w", "d"]) == {}
        return
    assert store.compare_and_set_many(table, items) == [True, False]
    assert read_cell_of(store, table, b"a", "l", b"q") == b"A2"
    assert versions_of(store, table, b"a", "w", b"q") == [(9, b"record a")]
    assert versions_of(store, table, b"a", "d", b"x") == [(9, b"x")]
    assert store.read_row(table, b"b") == {}


def test_a_bad_then_put_fails_the_call_before_writing(store: Store, table: str) -> None:
    if not store.conditional_puts:
        return  # refused whatever it holds: the test above
    good = Put(b"good", "w", b"q", 1, b"v")
    bad_then_puts = [
        (Put(b"other", "w", b"q", 1, b"another row"),),
        (Put(b"good", "l", b"q", 1, b"its own cell"),),
        (Put(b"good", "nope", b"q", 1, b"unknown family"),),
        (Put(b"good", "w", b"q", -1, b"bad version"),),
        [good],  # not a tuple
        ("not a put",),
    ]
    for then_put in bad_then_puts:
        items = [
            CompareAndSet(b"first", "l", b"q", None, b"v", (Put(b"first", "w", b"q", 1, b"v"),)),
            CompareAndSet(b"good", "l", b"q", None, b"v", then_put),  # type: ignore[arg-type]
        ]
        must_reject(then_put, store.compare_and_set_many, table, items, [good])
        for row in (b"first", b"good"):
            assert store.read_row(table, row) == {}, f"after {then_put!r}"


def test_a_bad_put_fails_compare_and_set_many_before_writing(store: Store, table: str) -> None:
    item = CompareAndSet(b"good", "l", b"q", None, b"v")
    good = Put(b"good", "d", b"q", 1, b"v")
    for bad in BAD_PUTS:
        must_reject(bad, store.compare_and_set_many, table, [item], [good, bad])
        assert store.read_row(table, b"good") == {}, f"after {bad!r}"
    must_reject("not a sequence", store.compare_and_set_many, table, [item], b"puts")
    assert store.read_row(table, b"good") == {}


def test_cas_binary_values(store: Store, table: str) -> None:
    blob = bytes(range(256)) * 4
    assert store.compare_and_set(table, b"\x00\xff", "l", b"\x00", None, blob)
    assert store.compare_and_set(table, b"\x00\xff", "l", b"\x00", blob, blob + b"\x00")
    assert read_cell_of(store, table, b"\x00\xff", "l", b"\x00") == blob + b"\x00"


def read_cell_of(store: Store, table: str, row: bytes, family: str, qualifier: bytes) -> bytes:
    return store.read_row(table, row, [(family, qualifier)])[(family, qualifier)][0][1]


# --------------------------------------------------------------------------- binary keys, sizes


def test_binary_row_keys_sort_as_unsigned_bytes(store: Store, table: str) -> None:
    rows = [bytes([b]) for b in range(256)] + [b"\x00\x00", b"\x7f\x80", b"\xff\xff", b"\x80"]
    rows = list(dict.fromkeys(rows))
    store.put(table, [Put(row, "d", b"q", 1, row) for row in rows])
    scanned = [row for row, _ in store.scan(table, "d", ScanOptions(batch_size=37))]
    assert scanned == sorted(rows)
    assert scanned[:2] == [b"\x00", b"\x00\x00"]
    assert scanned[-2:] == [b"\xff", b"\xff\xff"]
    got = store.read_rows(table, rows, [("d", b"q")])
    assert {row: cells[("d", b"q")][0][1] for row, cells in got.items()} == {r: r for r in rows}


def test_binary_and_empty_qualifiers(store: Store, table: str) -> None:
    quals = [b"", b"\x00", b"\xff", b":", b"a:b", bytes(range(1, 40))]
    store.put(table, [Put(b"r", "d", q, 1, b"v" + q) for q in quals])
    assert store.read_row(table, b"r") == {("d", q): [(1, b"v" + q)] for q in quals}
    [(_, cells)] = list(store.scan(table, "d"))
    assert cells == {q: (1, b"v" + q) for q in quals}
    assert store.read_row(table, b"r", [("d", b"")]) == {("d", b""): [(1, b"v")]}


def test_large_values(store: Store, table: str) -> None:
    big = bytes(range(256)) * (5 * 1024 * 1024 // 256)  # 5 MB
    store.put(table, [Put(b"big", "d", b"q", 1, big), Put(b"big", "d", b"small", 1, b"s")])
    assert store.read_row(table, b"big", [("d", b"q")]) == {("d", b"q"): [(1, big)]}
    [(row, cells)] = list(store.scan(table, "d"))
    assert row == b"big" and cells[b"q"] == (1, big)


def test_empty_values_are_cells(store: Store, table: str) -> None:
    store.put(table, [Put(b"r", "d", b"q", 3, b"")])
    assert store.read_row(table, b"r") == {("d", b"q"): [(3, b"")]}
    assert list(store.scan(table, "d")) == [(b"r", {b"q": (3, b"")})]


def test_long_row_keys(store: Store, table: str) -> None:
    # HBase takes a little less than MAX_ROW_LENGTH: its client looks a row up in hbase:meta
    # under "<table>,<row>,<nines>", so the limit shrinks with the table name (see
    # HBaseStore.max_row_length).  Every backend takes rows of 30000 bytes.
    row = b"k" * 30000
    store.put(table, [Put(row, "d", b"q", 1, b"v")])
    assert store.read_row(table, row) == {("d", b"q"): [(1, b"v")]}
    assert [r for r, _ in store.scan(table, "d")] == [row]
    with pytest.raises(InvalidArgumentError):
        store.put(table, [Put(b"k" * (MAX_ROW_LENGTH + 1), "d", b"q", 1, b"v")])


# --------------------------------------------------------------------------- scans


def fill_rows(store: Store, table: str, count: int) -> list[bytes]:
    rows = [b"r%02d" % i for i in range(count)]
    store.put(table, [Put(row, "d", b"q", 1, row) for row in rows])
    return rows


def scan_rows(store: Store, table: str, family: str = "d", **options: object) -> list[bytes]:
    return [row for row, _ in store.scan(table, family, ScanOptions(**options))]  # type: ignore[arg-type]


def test_scan_row_range(store: Store, table: str) -> None:
    rows = fill_rows(store, table, 20)
    assert scan_rows(store, table) == rows
    assert scan_rows(store, table, start=b"r05", stop=b"r10") == rows[5:10]
    assert scan_rows(store, table, start=b"r05") == rows[5:]
    assert scan_rows(store, table, stop=b"r03") == rows[:3]
    assert scan_rows(store, table, start=b"r045", stop=b"r075") == rows[5:8]
    assert scan_rows(store, table, start=b"r10", stop=b"r10") == []
    assert scan_rows(store, table, start=b"r10", stop=b"r05") == []
    assert scan_rows(store, table, start=b"s") == []


def test_scan_batches_and_limit(store: Store, table: str) -> None:
    rows = fill_rows(store, table, 25)
    for batch_size in (1, 2, 7, 25, 1000):
        assert scan_rows(store, table, batch_size=batch_size) == rows
        assert scan_rows(store, table, batch_size=batch_size, limit=10) == rows[:10]
        assert scan_rows(store, table, batch_size=batch_size, limit=25) == rows
        assert scan_rows(store, table, batch_size=batch_size, limit=100) == rows
        assert scan_rows(store, table, batch_size=batch_size, limit=0) == []
        assert scan_rows(store, table, batch_size=batch_size, start=b"r20", limit=3) == rows[20:23]


def test_scan_counts_round_trips(store: Store, table: str) -> None:
    fill_rows(store, table, 25)
    before = sum(store.stats.calls.values())
    assert len(scan_rows(store, table, batch_size=7)) == 25
    assert sum(store.stats.calls.values()) - before >= 4  # at least one per batch of 7


def test_scan_qualifiers_and_values(store: Store, table: str) -> None:
    store.put(
        table,
        [
            Put(b"r1", "d", b"a", 1, b"1a"),
            Put(b"r1", "d", b"b", 1, b"1b"),
            Put(b"r1", "d", b"c", 2, b"1c"),
            Put(b"r2", "d", b"b", 1, b"2b"),
            Put(b"r3", "d", b"c", 1, b"3c"),
        ],
    )
    got = list(store.scan(table, "d", ScanOptions(qualifiers=[b"a", b"c"])))
    assert got == [(b"r1", {b"a": (1, b"1a"), b"c": (2, b"1c")}), (b"r3", {b"c": (1, b"3c")})]
    assert list(store.scan(table, "d", ScanOptions(qualifiers=[b"zzz"]))) == []


def test_scan_before_returns_newest_below(store: Store, table: str) -> None:
    store.put(
        table,
        [
            Put(b"r1", "d", b"q", 10, b"r1@10"),
            Put(b"r1", "d", b"q", 20, b"r1@20"),
            Put(b"r2", "d", b"q", 20, b"r2@20"),
            Put(b"r3", "d", b"q", 5, b"r3@5"),
        ],
    )
    assert list(store.scan(table, "d", ScanOptions(before=20))) == [
        (b"r1", {b"q": (10, b"r1@10")}),
        (b"r3", {b"q": (5, b"r3@5")}),
    ]
    assert list(store.scan(table, "d", ScanOptions(before=5))) == []
    assert list(store.scan(table, "d", ScanOptions(before=21, batch_size=1))) == [
        (b"r1", {b"q": (20, b"r1@20")}),
        (b"r2", {b"q": (20, b"r2@20")}),
        (b"r3", {b"q": (5, b"r3@5")}),
    ]


def test_scan_value_ranges_filter_values_in_the_store(store: Store, table: str) -> None:
    values = [b"05", b"10", b"1f", b"20", b"a'b", b"ab", b"\xff\x00"]
    store.put(table, [Put(b"r%d" % i, "d", b"q", 1, v) for i, v in enumerate(values)])

    def scanned(ranges: list[tuple[bytes, bytes | None]], **options: object) -> list[bytes]:
        found = store.scan(table, "d", ScanOptions(value_ranges=ranges, **options))  # type: ignore[arg-type]
        return [cells[b"q"][1] for _, cells in found]

    assert scanned([(b"10", b"20")]) == [b"10", b"1f"]
    assert scanned([(b"10", b"11"), (b"a", None)]) == [b"10", b"a'b", b"ab", b"\xff\x00"]
    assert scanned([(b"a'b", b"a'c")]) == [b"a'b"]  # a quote in a bound is escaped
    assert scanned([(b"", None)]) == values
    assert scanned([]) == []
    assert scanned([(b"0", b"2")], batch_size=1, limit=2) == [b"05", b"10"]
    assert scanned([(b"0", b"2")], start=b"r2") == [b"1f"]
    assert scanned([(b"0", b"2")], before=1) == []


def test_scan_value_ranges_apply_to_each_version(store: Store, table: str) -> None:
    store.put(table, [Put(b"r", "d", b"q", 1, b"keep"), Put(b"r", "d", b"q", 2, b"drop")])
    only_keep = ScanOptions(value_ranges=[(b"keep", b"keeq")])
    assert list(store.scan(table, "d", only_keep)) == [(b"r", {b"q": (1, b"keep")})]
    only_drop = ScanOptions(value_ranges=[(b"drop", b"droq")])
    assert list(store.scan(table, "d", only_drop)) == [(b"r", {b"q": (2, b"drop")})]


def test_scan_returns_only_the_scanned_family(store: Store, table: str) -> None:
    store.put(
        table,
        [
            Put(b"both", "d", b"q", 1, b"d"),
            Put(b"both", "w", b"q", 1, b"w"),
            Put(b"only-w", "w", b"q", 1, b"w"),
            Put(b"only-d", "d", b"x", 1, b"d"),
        ],
    )
    assert list(store.scan(table, "d")) == [
        (b"both", {b"q": (1, b"d")}),
        (b"only-d", {b"x": (1, b"d")}),
    ]
    assert list(store.scan(table, "w")) == [
        (b"both", {b"q": (1, b"w")}),
        (b"only-w", {b"q": (1, b"w")}),
    ]
    assert list(store.scan(table, "l")) == []


def test_scan_sees_deletes_and_allows_writes_between_batches(store: Store, table: str) -> None:
    rows = fill_rows(store, table, 6)
    store.delete_versions(table, [Delete(b"r02", "d", b"q", 1)])
    seen = []
    for row, _ in store.scan(table, "d", ScanOptions(batch_size=2)):
        seen.append(row)
        # Writing while a scan is open must neither block nor fail.
        store.put(table, [Put(row, "w", b"seen", 1, b"1")])
    assert seen == [r for r in rows if r != b"r02"]
    assert len(list(store.scan(table, "w"))) == 5


# --------------------------------------------------------------------------- invalid arguments


# Each bad argument is checked in a loop on one table: a table costs a second on HBase.


def must_reject(case: object, call: Callable[..., object], *args: Any, **kwargs: Any) -> None:
    """``call(*args, **kwargs)`` must raise InvalidArgumentError; fail naming ``case``."""
    try:
        call(*args, **kwargs)
    except InvalidArgumentError:
        return
    except Exception as exc:
        pytest.fail(f"{case!r} raised {type(exc).__name__}: {exc}, not InvalidArgumentError")
    pytest.fail(f"{case!r} was accepted; it must raise InvalidArgumentError")


GOOD = Put(b"good", "d", b"q", 1, b"v")

BAD_PUTS = [
    Put("text-row", "d", b"q", 1, b"v"),  # type: ignore[arg-type]
    Put(b"", "d", b"q", 1, b"v"),
    Put(b"r", "nofamily", b"q", 1, b"v"),
    Put(b"r", "d", "text-qualifier", 1, b"v"),  # type: ignore[arg-type]
    Put(b"r", "d", b"q", -1, b"v"),
    Put(b"r", "d", b"q", MAX_VERSION + 1, b"v"),
    Put(b"r", "d", b"q", 1.5, b"v"),  # type: ignore[arg-type]
    Put(b"r", "d", b"q", True, b"v"),  # a bool is an int, but not a version
    Put(b"r", "", b"q", 1, b"v"),
    Put(b"r", "d", b"q", 1, "text-value"),  # type: ignore[arg-type]
    Put(b"r", "d", b"q", 1, None),  # type: ignore[arg-type]
    "not a put",
]


def test_a_bad_put_fails_the_batch_before_writing(store: Store, table: str) -> None:
    for bad in BAD_PUTS:
        batch = [GOOD, bad, Put(b"good2", "d", b"q", 1, b"v")]
        must_reject(bad, store.put, table, batch)
        assert store.read_rows(table, [b"good", b"good2", b"r"]) == {}, f"after {bad!r}"


BAD_DELETES = [
    Delete(b"r", "nofamily", b"q", 1),
    Delete(b"r", "d", b"q", -1),
    Delete("r", "d", b"q", 1),  # type: ignore[arg-type]
    "not a delete",
]


def test_a_bad_delete_fails_the_batch_before_deleting(store: Store, table: str) -> None:
    store.put(table, [GOOD])
    for bad in BAD_DELETES:
        batch = [Delete(b"good", "d", b"q", 5), bad]
        must_reject(bad, store.delete_versions, table, batch)
        assert store.read_row(table, b"good") == {("d", b"q"): [(1, b"v")]}, f"after {bad!r}"


BAD_CAS: list[tuple[object, ...]] = [
    (b"r", "nofamily", b"q", None, b"v"),
    ("r", "l", b"q", None, b"v"),
    (b"", "l", b"q", None, b"v"),
    (b"r", "l", "q", None, b"v"),
    (b"r", "l", b"q", None, "v"),
    (b"r", "l", b"q", "v", b"v"),
    (b"r", "l", b"q", None, None),
]


def test_a_bad_compare_and_set_writes_nothing(store: Store, table: str) -> None:
    for args in BAD_CAS:
        must_reject(args, store.compare_and_set, table, *args)
    assert list(store.scan(table, "l")) == []


BAD_READS: list[dict[str, object]] = [
    {"rows": ["text"]},
    {"rows": [b""]},
    {"rows": [b"r"], "columns": [("nofamily", b"q")]},
    {"rows": [b"r"], "columns": [("d", "text")]},
    {"rows": [b"r"], "families": ["nofamily"]},
    {"rows": [b"r"], "columns": [("d", b"q")], "max_versions": 0},
    {"rows": [b"r"], "columns": [("d", b"q")], "min_version": -1},
    {"rows": [b"r"], "columns": [("d", b"q")], "before": "soon"},
    # More than one version needs explicit columns and no whole families.
    {"rows": [b"r"], "max_versions": 2},
    {"rows": [b"r"], "families": ["d"], "max_versions": 2},
    {"rows": [b"r"], "columns": [("d", b"q")], "families": ["d"], "max_versions": 2},
]


def test_bad_reads_raise(store: Store, table: str) -> None:
    for kwargs in BAD_READS:
        must_reject(kwargs, store.read_rows, table, **kwargs)


def scan_all(store: Store, table: str, family: str, options: ScanOptions) -> list[object]:
    return list(store.scan(table, family, options))


BAD_SCANS = [
    ("nofamily", ScanOptions()),
    ("d", ScanOptions(batch_size=0)),
    ("d", ScanOptions(limit=-1)),
    ("d", ScanOptions(start="text")),  # type: ignore[arg-type]
    ("d", ScanOptions(stop="text")),  # type: ignore[arg-type]
    ("d", ScanOptions(value_ranges=[(b"a",)])),  # type: ignore[list-item]
    ("d", ScanOptions(value_ranges=[("a", None)])),  # type: ignore[list-item]
    ("d", ScanOptions(value_ranges=[(b"a", "b")])),  # type: ignore[list-item]
]


def test_bad_scans_raise(store: Store, table: str) -> None:
    for family, options in BAD_SCANS:
        must_reject((family, options), scan_all, store, table, family, options)


# --------------------------------------------------------------------------- concurrency: threads


def run_threads(count: int, target: Callable[[int], None]) -> None:
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            target(index)
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads), "a thread hung"
    assert not errors, errors


def test_threads_racing_one_cell_have_one_winner_per_round(store: Store, table: str) -> None:
    threads, rounds = 6, 25
    barrier = threading.Barrier(threads, timeout=60)
    winners: list[list[int]] = [[] for _ in range(rounds)]
    lock = threading.Lock()

    def race(me: int) -> None:
        for r in range(rounds):
            barrier.wait()
            # Everyone reads before anyone writes, so all compare against the same value.
            current = read_cell(store, table, b"cell")
            barrier.wait()
            if store.compare_and_set(table, b"cell", "l", b"q", current, b"%d:%d" % (r, me)):
                with lock:
                    winners[r].append(me)

    run_threads(threads, race)
    assert all(len(w) == 1 for w in winners), winners
    assert read_cell(store, table, b"cell") == b"%d:%d" % (rounds - 1, winners[-1][0])


def test_threads_racing_a_chain_each_round_won_once(store: Store, table: str) -> None:
    threads, rounds = 6, 60
    won: list[list[int]] = [[] for _ in range(threads)]

    def climb(me: int) -> None:
        won[me] = cas_chain(store, table, b"chain", rounds, f"t{me}")

    run_threads(threads, climb)
    assert sorted(r for w in won for r in w) == list(range(1, rounds + 1))


def test_threads_cas_counter_loses_no_increment(
    backend: StoreNamespace, store: Store, table: str
) -> None:
    threads, per_thread = 4, 25
    # Half the threads share the test's client, half open their own.
    clients = [store if i % 2 == 0 else backend.open() for i in range(threads)]

    def increment(me: int) -> None:
        cas_counter(clients[me], table, b"counter", per_thread)

    try:
        run_threads(threads, increment)
    finally:
        for client in clients:
            if client is not store:
                client.close()
    assert read_cell(store, table, b"counter") == b"%d" % (threads * per_thread)


def test_row_puts_are_atomic_and_row_reads_are_snapshots(store: Store, table: str) -> None:
    writes = 300
    reading, done = threading.Event(), threading.Event()
    torn: list[RowCells] = []
    reads = 0

    def write(_: int) -> None:
        try:
            assert reading.wait(timeout=60)
            for i in range(1, writes + 1):
                value = b"%d" % i
                store.put(table, [Put(b"r", "d", b"a", i, value), Put(b"r", "d", b"b", i, value)])
        finally:
            done.set()

    def read(_: int) -> None:
        nonlocal reads
        while not done.is_set():
            # Whole families and explicit columns take different paths in some backends.
            if reads % 2:
                cells = store.read_row(table, b"r")
            else:
                cells = store.read_row(table, b"r", [("d", b"a"), ("d", b"b")])
            reads += 1
            reading.set()
            if cells.get(("d", b"a")) != cells.get(("d", b"b")):
                torn.append(cells)

    run_threads(2, lambda i: write(i) if i == 0 else read(i))
    assert not torn, torn[:3]
    assert store.read_row(table, b"r")[("d", b"a")] == [(writes, b"%d" % writes)]


# --------------------------------------------------------------------------- concurrency: processes


def run_workers(
    backend: StoreNamespace, table: str, argv_list: Sequence[Sequence[str]]
) -> list[dict[str, object]]:
    """Start one worker per argv, release them together, return their JSON results."""
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.store._store_worker",
                argv[0],
                backend.url,
                table,
                *argv[1:],
            ],
            cwd=REPO_ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for argv in argv_list
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready"
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        results = []
        for proc in procs:
            out, _ = proc.communicate(timeout=120)
            assert proc.returncode == 0, f"worker failed with exit code {proc.returncode}"
            results.append(json.loads(out.strip().splitlines()[-1]))
        return results
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_processes_racing_a_chain_each_round_won_once(shared_backend: StoreNamespace) -> None:
    with shared_backend.open() as store:
        store.create_table("t", FAMILIES)
        workers, rounds = 4, 40
        results = run_workers(
            shared_backend, "t", [["chain", "chain", str(rounds), f"p{i}"] for i in range(workers)]
        )
        won = sorted(r for result in results for r in result["won"])  # type: ignore[attr-defined]
        assert won == list(range(1, rounds + 1))
        final = read_cell(store, "t", b"chain")
        assert final is not None and final.startswith(b"%d:" % rounds)


def test_processes_cas_counter_ends_at_exact_total(shared_backend: StoreNamespace) -> None:
    with shared_backend.open() as store:
        store.create_table("t", FAMILIES)
        workers, per_worker = 4, 50
        results = run_workers(
            shared_backend, "t", [["counter", "counter", str(per_worker)]] * workers
        )
        assert read_cell(store, "t", b"counter") == b"%d" % (workers * per_worker)
        attempts = sum(int(result["attempts"]) for result in results)  # type: ignore[call-overload]
        assert attempts >= workers * per_worker

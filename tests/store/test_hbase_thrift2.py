"""The HBase store with a Thrift-2 gateway (``thrift2_port``): compare-and-sets that carry
puts of their row, and what happens when that gateway is wrong, missing or cut off.

The contract suite runs on the session's HBase with both gateways (conditional puts); this
module adds what it cannot see: the wire-level faults (through the TCP proxy of
test_hbase_specific), the errors of a wrong ``thrift2_port``, and a store on the same HBase
*without* the Thrift-2 gateway, which must still commit through Thrift-1 alone.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import percolator
from percolator.errors import (
    ConfigError,
    InvalidArgumentError,
    StoreUnavailableError,
    TableNotFoundError,
)
from percolator.store import base as store_base
from percolator.store.base import CompareAndSet, Delete, FamilySpec, Put, cross_product_parts
from percolator.store.hbase import HBaseStore
from percolator.store.url import open_store, parse_store_url
from percolator.testing import ManualOracle
from percolator.testing.localhbase.launcher import free_port
from tests.store.test_contract import run_threads
from tests.store.test_hbase_specific import FaultyProxy

FAMILIES = [FamilySpec("d"), FamilySpec("w"), FamilySpec("l", max_versions=1)]


def _ports(hbase_url: str) -> tuple[int, int]:
    parsed = parse_store_url(hbase_url)
    thrift2 = parsed.options.get("thrift2_port")
    assert thrift2, f"the test session's HBase has no Thrift-2 gateway: {hbase_url}"
    return parsed.port, int(thrift2)


@pytest.fixture
def prefix(hbase_url: str) -> Iterator[str]:
    name = f"t2_{uuid.uuid4().hex[:10]}_"
    yield name
    port, _ = _ports(hbase_url)
    with HBaseStore("127.0.0.1", port, prefix=name) as admin:
        for table in admin.list_tables():
            admin.drop_table(table)


@pytest.fixture
def exact_and_crossed(hbase_url: str, prefix: str) -> Iterator[tuple[HBaseStore, HBaseStore]]:
    """Two stores on one namespace with table "t": one reading through the Thrift-2
    gateway where it can (exact reads), one through Thrift-1 alone (cross products)."""
    port, thrift2 = _ports(hbase_url)
    with (
        HBaseStore("127.0.0.1", port, prefix=prefix, thrift2_port=thrift2) as exact,
        HBaseStore("127.0.0.1", port, prefix=prefix) as crossed,
    ):
        exact.create_table("t", FAMILIES)
        yield exact, crossed


@pytest.fixture
def proxy(hbase_url: str) -> Iterator[FaultyProxy]:
    """A TCP proxy in front of the session HBase's Thrift-2 gateway."""
    _, thrift2 = _ports(hbase_url)
    faulty = FaultyProxy(("127.0.0.1", thrift2))
    yield faulty
    faulty.close()


@pytest.fixture
def proxied_store(hbase_url: str, prefix: str, proxy: FaultyProxy) -> Iterator[HBaseStore]:
    """A store reaching the Thrift-2 gateway through :func:`proxy` (3 s timeout), with the
    table ``t``."""
    port, _ = _ports(hbase_url)
    with HBaseStore(
        "127.0.0.1", port, prefix=prefix, thrift2_port=proxy.port, timeout_ms=3_000
    ) as store:
        store.create_table("t", FAMILIES)
        yield store


def _rides(row: bytes) -> CompareAndSet:
    """A lock-like compare-and-set carrying a data version and a write record."""
    return CompareAndSet(
        row,
        "l",
        b"q",
        None,
        b"lock",
        (Put(row, "d", b"q", 5, b"data"), Put(row, "w", b"q", 9, b"record")),
    )


# --------------------------------------------------------------------------- URL and errors


def test_the_url_names_the_thrift2_port() -> None:
    parsed = parse_store_url("hbase://h:9090?thrift2_port=9095&prefix=p_")
    assert parsed.options["thrift2_port"] == "9095"
    for bad in ("0", "65536", "x", ""):
        with pytest.raises(ConfigError, match="thrift2_port must be a port number"):
            parse_store_url(f"hbase://h:9090?thrift2_port={bad}")


@pytest.mark.hbase
def test_the_thrift1_port_given_as_thrift2_port_is_one_clear_error(hbase_url: str) -> None:
    port, _ = _ports(hbase_url)
    with pytest.raises(StoreUnavailableError) as raised:
        open_store(f"hbase://127.0.0.1:{port}?thrift2_port={port}")
    assert str(raised.value) == (
        f"127.0.0.1:{port} (thrift2_port) is a Thrift-1 gateway, not a Thrift-2 one: start "
        "`hbase thrift2` there, or drop thrift2_port from the store URL"
    )


@pytest.mark.hbase
def test_a_closed_thrift2_port_fails_when_the_store_opens(hbase_url: str) -> None:
    port, _ = _ports(hbase_url)
    closed = free_port()  # free a moment ago: nothing listens there
    with pytest.raises(StoreUnavailableError) as raised:
        open_store(f"hbase://127.0.0.1:{port}?thrift2_port={closed}")
    assert str(raised.value) == (
        f"cannot reach HBase Thrift-2 gateway at 127.0.0.1:{closed}: connection refused"
    )


@pytest.mark.hbase
@pytest.mark.parametrize("call", ["compare_and_set", "put_of_versions", "delete_of_versions"])
def test_a_table_dropped_behind_the_cache_is_table_not_found(
    hbase_url: str, prefix: str, call: str
) -> None:
    # The Thrift-2 gateway names a missing table by its name alone (a compare-and-set) or
    # not at all ("Failed 1 action", a putMultiple); the store still says which table, as on
    # Thrift-1, and forgets what it had cached.  A deleteMultiple fails like a putMultiple.
    port, thrift2 = _ports(hbase_url)
    with (
        HBaseStore("127.0.0.1", port, prefix=prefix, thrift2_port=thrift2) as store,
        HBaseStore("127.0.0.1", port, prefix=prefix) as other,
    ):
        store.create_table("gone", FAMILIES)
        store.table_families("gone")  # cached
        other.drop_table("gone")
        with pytest.raises(TableNotFoundError, match="'gone'"):
            if call == "compare_and_set":
                store.compare_and_set_many("gone", [_rides(b"r")])
            elif call == "put_of_versions":
                store.put("gone", [Put(b"r", "d", b"q", 5, b"v"), Put(b"r", "w", b"q", 9, b"w")])
            else:
                store.delete_versions(
                    "gone", [Delete(b"r", "d", b"q", 5), Delete(b"s", "d", b"q", 9)]
                )


# --------------------------------------------------------------------------- on the wire


@pytest.mark.hbase
def test_riders_land_with_the_compare_and_set_stamped_by_the_server(
    hbase_url: str, prefix: str
) -> None:
    port, thrift2 = _ports(hbase_url)
    with HBaseStore("127.0.0.1", port, prefix=prefix, thrift2_port=thrift2) as store:
        assert store.conditional_puts
        store.create_table("t", FAMILIES)
        before_ms = time.time_ns() // 1_000_000
        assert store.compare_and_set_many("t", [_rides(b"r")]) == [True]
        row = store.read_row("t", b"r")
        [(stamp, lock)] = row[("l", b"q")]
        assert lock == b"lock" and abs(stamp - before_ms) < store.stamp_skew_ms
        assert row[("d", b"q")] == [(5, b"data")]
        assert row[("w", b"q")] == [(9, b"record")]
        # A failed check writes none of it.
        stale = CompareAndSet(b"r", "l", b"q", b"stale", b"x", (Put(b"r", "d", b"z", 1, b"no"),))
        assert store.compare_and_set_many("t", [stale]) == [False]
        assert store.read_row("t", b"r", [("d", b"z")]) == {}


@pytest.mark.hbase
@pytest.mark.parametrize("fault", ["drop_request", "drop_reply"])
def test_a_cut_connection_leaves_the_outcome_unknown_and_all_or_nothing(
    proxy: FaultyProxy, proxied_store: HBaseStore, fault: str
) -> None:
    proxy.fault = fault
    with pytest.raises(StoreUnavailableError, match="outcome unknown") as raised:
        proxied_store.compare_and_set_many("t", [_rides(b"r")])
    assert "do not re-send" in str(raised.value)
    row = proxied_store.read_row("t", b"r")
    if fault == "drop_request":
        assert row == {}  # never sent, never re-sent
    else:
        # Applied, all of it: the lock and both riders.
        assert set(row) == {("l", b"q"), ("d", b"q"), ("w", b"q")}


@pytest.mark.hbase
def test_many_compare_and_sets_on_both_gateways_are_answered_each_its_own(
    hbase_url: str, prefix: str, proxy: FaultyProxy
) -> None:
    # More items than one connection keeps in flight, some carrying puts (Thrift-2), some
    # not (Thrift-1), every third refused: each answer is its own item's, every applied
    # item landed whole and no refused one did.
    port, _ = _ports(hbase_url)
    with HBaseStore("127.0.0.1", port, prefix=prefix, thrift2_port=proxy.port) as store:
        store.create_table("t", FAMILIES)
        rows = [b"r%04d" % i for i in range(400)]
        taken = rows[::3]
        assert store.compare_and_set_many("t", [_rides(r) for r in taken]) == [True] * len(taken)
        items = [
            _rides(r) if i % 2 else CompareAndSet(r, "l", b"q", None, b"plain")
            for i, r in enumerate(rows)
        ]
        before = dict(store.stats.calls)
        accepted = proxy.accepted
        results = store.compare_and_set_many("t", items)
        assert results == [i % 3 != 0 for i in range(400)]
        assert store.stats.calls["compare_and_set"] - before["compare_and_set"] == 400
        # Pipelined: a few connections to the Thrift-2 gateway, not one per item.
        assert proxy.accepted - accepted <= store.pool_size
        found = store.read_rows("t", rows)
        for i, r in enumerate(rows):
            cells = found.get(r, {})
            if i % 3 == 0:  # the first call's lock, refused now
                assert cells[("l", b"q")][0][1] == b"lock"
            elif i % 2:
                assert set(cells) == {("l", b"q"), ("d", b"q"), ("w", b"q")}
                assert cells[("l", b"q")][0][1] == b"lock"
            else:
                assert set(cells) == {("l", b"q")}
                assert cells[("l", b"q")][0][1] == b"plain"


@pytest.mark.hbase
def test_a_connection_cut_in_a_pipelined_batch_leaves_each_item_whole_or_absent(
    proxy: FaultyProxy, proxied_store: HBaseStore
) -> None:
    # One of the connections carrying a batch is cut after its requests went out: the call
    # raises "outcome unknown" only after the other connections' answers were read; each
    # item landed whole or not at all; the store works on afterwards.
    rows = [b"c%04d" % i for i in range(100)]
    proxy.fault = "drop_reply"
    with pytest.raises(StoreUnavailableError, match="outcome unknown"):
        proxied_store.compare_and_set_many("t", [_rides(r) for r in rows])
    found = proxied_store.read_rows("t", rows)
    for r in rows:
        assert set(found.get(r, {})) in (set(), {("l", b"q"), ("d", b"q"), ("w", b"q")})
    assert len(found) >= 1  # the uncut connections' items were applied
    more = [_rides(b"after%d" % i) for i in range(10)]
    assert proxied_store.compare_and_set_many("t", more) == [True] * 10


@pytest.mark.hbase
@pytest.mark.timeout(300)
def test_calls_over_both_gateways_never_wait_for_each_other(hbase_url: str, prefix: str) -> None:
    # Each call wants every connection of both pools (pool_size 2, eight items per
    # gateway); half the calls list a Thrift-1 item first, half a Thrift-2 one.  A call
    # holding one gateway's connections while it waits for the other's, in the order its
    # items happen to come, would wait for a call doing the opposite until the pool's
    # timeout ("all 2 pooled connections stayed busy").
    port, thrift2 = _ports(hbase_url)
    with HBaseStore(
        "127.0.0.1", port, prefix=prefix, thrift2_port=thrift2, pool_size=2, timeout_ms=5_000
    ) as store:
        store.create_table("t", FAMILIES)

        def work(n: int) -> None:
            for k in range(15):
                rows = [b"m%d-%02d-%02d" % (n, k, i) for i in range(16)]
                items = [
                    _rides(r) if (i + n) % 2 else CompareAndSet(r, "l", b"q", None, b"p")
                    for i, r in enumerate(rows)
                ]
                assert store.compare_and_set_many("t", items) == [True] * 16

        run_threads(6, work)


@pytest.mark.hbase
def test_read_cells_of_many_rows_name_exactly_each_rows_cells_and_agree_with_thrift1(
    exact_and_crossed: tuple[HBaseStore, HBaseStore],
) -> None:
    # A read of one column in each of many rows, a different column each (a prewrite's
    # shape): through Thrift-2 one getMultiple asks each row for its own cells only;
    # Thrift-1 asks every row for every column and filters.  Both must give the same
    # answer: versions below ``before``, delete masks and an empty qualifier included.  A
    # small read, whose cross product is no bigger, stays on Thrift-1.
    exact, crossed = exact_and_crossed
    exact.put(
        "t",
        [
            Put(b"r%d" % i, family, qualifier, version, b"%d/%s/%d" % (i, qualifier, version))
            for i in range(40)
            for family in ("d", "w")
            for qualifier in (b"", b"q%d" % i, b"q%d" % (i + 1))
            for version in (3, 5)
        ],
    )
    exact.delete_versions("t", [Delete(b"r1", "d", b"q1", 5)])  # masks 3 and 5
    cells = [(b"r%d" % i, ("d", b"q%d" % i)) for i in range(40)]
    cells += [(b"r%d" % i, ("w", b"")) for i in range(0, 40, 3)]
    cells += [(b"gone", ("d", b"q0")), (b"r2", ("l", b"q2"))]
    sent: list[str] = []
    call = exact._call

    def recording(op: str, method: str, *args: object, **kwargs: Any) -> Any:
        sent.append(method)
        return call(op, method, *args, **kwargs)

    exact._call = recording  # type: ignore[method-assign]
    for before in (None, 5, 4, 3, 1):
        got = exact.read_cells("t", cells, before=before)
        assert got == crossed.read_cells("t", cells, before=before), before
    assert sent == ["getMultiple"] * 5
    assert exact.read_cells("t", cells, before=5)[b"r2"] == {("d", b"q2"): [(3, b"2/q2/3")]}
    assert b"r1" not in exact.read_cells("t", cells)  # masked, and w: not asked for r1
    assert exact.read_cells("t", cells)[b"r3"] == {
        ("d", b"q3"): [(5, b"3/q3/5")],
        ("w", b""): [(5, b"3//5")],
    }
    sent.clear()
    few = [(b"r3", ("d", b"q3")), (b"r3", ("w", b"")), (b"r4", ("d", b"q4"))]
    assert exact.read_cells("t", few) == crossed.read_cells("t", few)
    assert exact.read_cells("t", few)[b"r4"] == {("d", b"q4"): [(5, b"4/q4/5")]}
    assert sent == ["getRowsWithColumns"] * 2


def test_cross_product_parts_bound_each_part_and_keep_rows_whole() -> None:
    # A diagonal (each row its own column): a part of n rows asks n x n cells.
    diagonal = [(b"r%02d" % i, ("d", b"q%02d" % i)) for i in range(10)]
    parts = cross_product_parts(diagonal, 9)
    assert [rows for rows, _ in parts] == [
        [b"r00", b"r01", b"r02"],
        [b"r03", b"r04", b"r05"],
        [b"r06", b"r07", b"r08"],
        [b"r09"],
    ]
    assert all(len(rows) * len(columns) <= 9 for rows, columns in parts)
    # Rows sharing their columns pack up to the bound; a row wider than it goes alone; a
    # row named twice stays in one part.
    shared = [(b"s%d" % i, ("d", b"a")) for i in range(5)] + [
        (b"s%d" % i, ("w", b"a")) for i in range(5)
    ]
    wide = [(b"wide", ("d", b"c%d" % i)) for i in range(20)]
    parts = cross_product_parts(shared + wide + [(b"s0", ("l", b"a"))], 9)
    assert parts[0] == ([b"s0", b"s1", b"s2"], [("d", b"a"), ("w", b"a"), ("l", b"a")])
    assert parts[1] == ([b"s3", b"s4"], [("d", b"a"), ("w", b"a")])
    assert parts[2] == ([b"wide"], [("d", b"c%d" % i) for i in range(20)])
    assert cross_product_parts([], 9) == []


@pytest.mark.hbase
def test_a_wide_cross_product_on_thrift1_is_read_in_bounded_parts(
    exact_and_crossed: tuple[HBaseStore, HBaseStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without Thrift-2 a read of cells in many rows is a rows x columns product; above the
    # bound it goes in parts of whole rows, and answers as the exact read does.
    exact, crossed = exact_and_crossed
    # Every row has every column, so an unbounded product would answer 40 x 40 cells.
    exact.put(
        "t",
        [
            Put(b"r%02d" % i, "d", b"q%02d" % j, 3, b"%d/%d" % (i, j))
            for i in range(40)
            for j in range(40)
        ],
    )
    cells = [(b"r%02d" % i, ("d", b"q%02d" % i)) for i in range(40)]
    cells += [(b"r05", ("w", b"q05")), (b"gone", ("d", b"q00"))]
    sent: list[tuple[int, int]] = []
    read_rows = crossed.read_rows

    def recording(table: str, rows: Any, columns: Any = None, **kwargs: Any) -> Any:
        sent.append((len(rows), len(columns)))
        return read_rows(table, rows, columns, **kwargs)

    crossed.read_rows = recording  # type: ignore[method-assign]
    monkeypatch.setattr(store_base, "CROSS_PRODUCT_CELLS", 100)
    got = crossed.read_cells("t", cells, before=4)
    assert got == exact.read_cells("t", cells, before=4)
    assert got == {b"r%02d" % i: {("d", b"q%02d" % i): [(3, b"%d/%d" % (i, i))]} for i in range(40)}
    assert [rows for rows, _ in sent] == [9, 10, 10, 10, 2]  # r05 names two columns
    assert all(rows * columns <= 100 for rows, columns in sent), sent
    sent.clear()
    # A bad family or an over-long row in the last part is refused before the first part
    # is read: nothing is sent.
    too_long = b"x" * (crossed.max_row_length("t") + 1)  # passes the generic checks
    for bad in [(b"r39", ("nope", b"q")), (too_long, ("d", b"q00"))]:
        with pytest.raises(InvalidArgumentError):
            crossed.read_cells("t", [*cells, bad], before=4)
        assert sent == []
    monkeypatch.setattr(store_base, "CROSS_PRODUCT_CELLS", 30_000)
    assert crossed.read_cells("t", cells, before=4) == got
    assert sent == [(41, 41)]  # under the bound: one read


@pytest.mark.hbase
def test_a_put_of_several_versions_is_one_thrift2_call(hbase_url: str, prefix: str) -> None:
    # Thrift-1 takes one timestamp per mutateRowsTs; Thrift-2's putMultiple a timestamp
    # per cell: a put of three versions over two rows is one call, every version in place,
    # a cell given twice at one version keeping the last value.
    port, thrift2 = _ports(hbase_url)
    with HBaseStore("127.0.0.1", port, prefix=prefix, thrift2_port=thrift2) as store:
        store.create_table("t", FAMILIES)
        puts = [
            Put(b"a", "d", b"q", 5, b"first"),
            Put(b"a", "w", b"q", 9, b"record"),
            Put(b"b", "d", b"q", 5, b"b data"),
            Put(b"b", "l", b"q", 3, b"lock"),
            Put(b"a", "d", b"q", 5, b"data"),  # the same cell and version again: the last wins
        ]
        assert not store.put_call_per_version
        before = store.stats.calls.get("put", 0)
        store.put("t", puts)
        assert store.stats.calls.get("put", 0) - before == 1
        rows = store.read_rows("t", [b"a", b"b"])
        assert rows[b"a"] == {("d", b"q"): [(5, b"data")], ("w", b"q"): [(9, b"record")]}
        assert rows[b"b"] == {("d", b"q"): [(5, b"b data")], ("l", b"q"): [(3, b"lock")]}
        # One version: still one Thrift-1 mutateRowsTs, as without the gateway.
        store.put("t", [Put(b"c", "d", b"q", 7, b"c")])
        assert store.stats.calls.get("put", 0) - before == 2


@pytest.mark.hbase
@pytest.mark.parametrize("call", ["putMultiple", "deleteMultiple"])
@pytest.mark.parametrize("fault", ["drop_request", "drop_reply"])
def test_a_cut_thrift2_batch_is_sent_again_once(
    proxy: FaultyProxy, proxied_store: HBaseStore, call: str, fault: str
) -> None:
    # Puts and deletes are idempotent: a connection cut before or after the server applied
    # the batch is re-sent once on a fresh connection, and the call succeeds with every
    # version stored (or deleted: every other row loses its data version).
    rows = [b"p%03d" % i for i in range(50)]
    puts = [p for r in rows for p in (Put(r, "d", b"q", 5, r), Put(r, "w", b"q", 9, b"w"))]
    if call == "putMultiple":
        proxy.fault = fault
    proxied_store.put("t", puts)
    # Two timestamps (one Thrift-2 call): 9 removes the data version at 5, 4 removes nothing.
    deletes = [Delete(r, "d", b"q", 4 if i % 2 else 9) for i, r in enumerate(rows)]
    if call == "deleteMultiple":
        proxy.fault = fault
        proxied_store.delete_versions("t", deletes)
    assert proxy.fault is None, "the fault never fired"
    newest = proxied_store.read_rows("t", rows)  # every column of each row
    every = proxied_store.read_rows("t", rows, columns=[("d", b"q"), ("w", b"q")], max_versions=10)
    for i, r in enumerate(rows):
        expected = {("w", b"q"): [(9, b"w")]}
        if call == "putMultiple" or i % 2:
            expected[("d", b"q")] = [(5, r)]
        assert newest[r] == expected, r
        assert every[r] == expected, r


@pytest.mark.hbase
def test_a_delete_at_several_timestamps_is_one_thrift2_call(hbase_url: str, prefix: str) -> None:
    # Thrift-1 takes one timestamp per mutateRowsTs; Thrift-2's deleteMultiple a timestamp
    # per column.  Each cell loses exactly its versions at or below its own timestamp (a
    # cell named twice: the higher one), later puts at or below it stay masked, and an
    # empty qualifier is a cell of its own.  Checked against Thrift-1 doing the same.
    port, thrift2 = _ports(hbase_url)
    with (
        HBaseStore("127.0.0.1", port, prefix=prefix, thrift2_port=thrift2) as store,
        HBaseStore("127.0.0.1", port, prefix=prefix) as thrift1,
    ):
        store.create_table("t", FAMILIES)
        store.create_table("u", FAMILIES)
        rows = [b"a", b"b"]
        for table in ("t", "u"):
            store.put(
                table,
                [
                    Put(
                        row, family, q, version, b"%s/%s/%s/%d" % (row, family.encode(), q, version)
                    )
                    for row in rows
                    for family, q in (("d", b"q"), ("d", b""), ("w", b"q"))
                    for version in (3, 5, 7)
                ],
            )
        deletes = [
            Delete(b"a", "d", b"q", 5),
            Delete(b"a", "w", b"q", 3),
            Delete(b"b", "d", b"", 7),
            Delete(b"b", "d", b"q", 3),
            Delete(b"b", "d", b"q", 5),  # the same cell again, higher: both versions go
        ]
        before = store.stats.calls.get("delete_versions", 0)
        store.delete_versions("t", deletes)
        assert store.stats.calls.get("delete_versions", 0) - before == 1
        thrift1.delete_versions("u", deletes)
        assert thrift1.stats.calls.get("delete_versions", 0) == 3  # one per timestamp

        def versions(table: str) -> dict[bytes, dict[Any, list[int]]]:
            columns = [("d", b"q"), ("d", b""), ("w", b"q")]
            found = store.read_rows(table, rows, columns=columns, max_versions=10)
            return {
                r: {c: [v for v, _ in vs] for c, vs in cols.items()} for r, cols in found.items()
            }

        expected = {
            b"a": {("d", b"q"): [7], ("d", b""): [7, 5, 3], ("w", b"q"): [7, 5]},
            b"b": {("d", b"q"): [7], ("w", b"q"): [7, 5, 3]},
        }
        assert versions("t") == expected
        assert versions("u") == expected
        # The delete masks a later put at or below its timestamp, on both gateways' deletes.
        for table in ("t", "u"):
            store.put(table, [Put(b"a", "d", b"q", 4, b"late"), Put(b"a", "d", b"q", 6, b"kept")])
        assert versions("t")[b"a"][("d", b"q")] == [7, 6]
        assert versions("u")[b"a"][("d", b"q")] == [7, 6]


# --------------------------------------------------------------------------- Thrift-1 only


@pytest.mark.hbase
def test_without_thrift2_a_transaction_commits_through_thrift1_alone(
    hbase_url: str, prefix: str
) -> None:
    port, _ = _ports(hbase_url)
    store = HBaseStore("127.0.0.1", port, prefix=prefix)
    assert not store.conditional_puts and store.put_call_per_version
    client = percolator.connect(store, oracle=ManualOracle())
    try:
        client.create_table("t")
        txn = client.transaction()
        txn.set("t", b"r", "c", b"v")
        before = dict(store.stats.calls)
        txn.commit()
        calls = {op: n - before.get(op, 0) for op, n in store.stats.calls.items()}
        # The lock with the data put beside it, the commit point, then the commit-index
        # entry and the record in puts of their own.
        assert calls.get("compare_and_set", 0) == 2, calls
        assert calls.get("put", 0) >= 2, calls
        with client.snapshot() as snap:
            assert snap.get("t", b"r", "c") == b"v"
    finally:
        client.close()
        store.close()

"""Export: one snapshot, read in parallel ranges, equal to the engine's own snapshot read;
consistent while a bank workload moves money."""

from __future__ import annotations

import random
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest
from percolator.spark_jobs.export import (
    ExportOptions,
    MissingColumnsError,
    export_table,
    ranges_of,
    sample_split_keys,
    write_export,
)

import percolator
from percolator.errors import ConfigError, TableNotFoundError
from percolator.testing import ManualOracle
from percolator.transaction import Transaction
from tests.spark.helpers import connect

BANK = "bank"
ACCOUNTS = 20
TOTAL = ACCOUNTS * 100


def _transfer(client: percolator.Client, rng: random.Random) -> None:
    a, b = rng.sample(range(ACCOUNTS), 2)
    amount = rng.randint(1, 30)

    def move(txn: Transaction) -> None:
        src = int(txn.get(BANK, b"acct%03d" % a, "balance") or b"0")
        dst = int(txn.get(BANK, b"acct%03d" % b, "balance") or b"0")
        txn.set(BANK, b"acct%03d" % a, "balance", str(src - amount).encode())
        txn.set(BANK, b"acct%03d" % b, "balance", str(dst + amount).encode())

    client.run(move, max_attempts=50)


@pytest.mark.spark
def test_exports_during_a_bank_workload_always_sum_to_the_total(
    spark: Any, shared_store_url: str
) -> None:
    with connect(shared_store_url) as client:
        client.create_table(BANK)

        def open_accounts(txn: Transaction) -> None:
            for i in range(ACCOUNTS):
                txn.set(BANK, b"acct%03d" % i, "balance", b"100")

        client.run(open_accounts)
        stop = threading.Event()
        transfers = [0]
        errors: list[BaseException] = []

        def workload(seed: int) -> None:
            rng = random.Random(seed)
            try:
                while not stop.is_set():
                    _transfer(client, rng)
                    transfers[0] += 1
            except BaseException as exc:  # reported by the test below
                errors.append(exc)

        threads = [threading.Thread(target=workload, args=(s,), daemon=True) for s in (1, 2)]
        for t in threads:
            t.start()
        try:
            seen = []
            for _ in range(3):
                before = transfers[0]
                export = export_table(
                    spark, ExportOptions(shared_store_url, BANK, columns=("balance",), splits=3)
                )
                rows = export.df.collect()
                balances = {bytes(r["row"]): int(bytes(r["balance"])) for r in rows}
                assert len(balances) == ACCOUNTS
                assert sum(balances.values()) == TOTAL, balances
                # Exactly the engine's snapshot at the same read_ts, cell for cell.
                expected = {
                    row: int(cells["balance"])
                    for row, cells in client.snapshot(export.read_ts).scan(BANK)
                }
                assert balances == expected
                assert len(export.ranges) == 3
                seen.append((before, transfers[0], export.read_ts))
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=30)
        assert not errors, errors
        # Money moved while the exports ran (else the test proves nothing).
        assert all(after > before for before, after, _ in seen), seen
        assert len({ts for _, _, ts in seen}) == 3


@pytest.mark.spark
def test_layouts_old_snapshots_and_parquet(spark: Any, embedded_url: str, tmp_path: Path) -> None:
    with connect(embedded_url) as client:
        client.create_table("t")

        def fill(txn: Transaction) -> None:
            for i in range(50):
                txn.set("t", b"r%03d" % i, "a", b"a%d" % i)
                if i % 2:
                    txn.set("t", b"r%03d" % i, "b", b"b%d" % i)

        client.run(fill)
        old_ts = client.oracle.get_timestamp()

        def change(txn: Transaction) -> None:
            for i in range(0, 50, 5):
                txn.set("t", b"r%03d" % i, "a", b"new")
                txn.delete("t", b"r%03d" % (i + 1), "b")

        client.run(change)
        old = dict(client.snapshot(old_ts).scan("t"))
        now = dict(client.snapshot().scan("t"))

    wide = export_table(
        spark,
        ExportOptions(
            embedded_url, "t", columns=("a", "b"), read_ts=old_ts, split_keys=(b"r010", b"r033")
        ),
    )
    assert wide.ranges == [(b"", b"r010"), (b"r010", b"r033"), (b"r033", None)]
    got = {
        bytes(r["row"]): {c: bytes(r[c]) for c in ("a", "b") if r[c] is not None}
        for r in wide.df.collect()
    }
    assert got == old
    assert wide.df.columns == ["row", "a", "b"]

    cells = export_table(spark, ExportOptions(embedded_url, "t", strings=True))
    collected: dict[bytes, dict[str, bytes]] = {}
    for r in cells.df.collect():
        collected.setdefault(r["row"].encode(), {})[r["column"]] = r["value"].encode()
    assert collected == now

    out = tmp_path / "export.parquet"
    report = write_export(spark, ExportOptions(embedded_url, "t", columns=("b",)), str(out))
    back = {bytes(r["row"]): bytes(r["b"]) for r in spark.read.parquet(str(out)).collect()}
    assert back == {row: c["b"] for row, c in now.items() if "b" in c}
    assert report.rows == len(back)
    assert f"exported {len(back)} rows of t at read_ts {report.read_ts}" in report.summary()


@pytest.mark.spark
def test_bad_export_requests_fail_fast(spark: Any, embedded_url: str) -> None:
    with connect(embedded_url):
        pass
    with pytest.raises(TableNotFoundError, match="table 'nope' does not exist"):
        export_table(spark, ExportOptions(embedded_url, "nope"))
    with pytest.raises(ConfigError, match="a memory: store lives inside one process"):
        export_table(spark, ExportOptions("memory:", "t"))
    with pytest.raises(ConfigError, match="the wide layout needs the columns"):
        ExportOptions(embedded_url, "t", layout="wide")


@pytest.mark.spark
def test_a_requested_column_without_a_cell_fails_and_leaves_no_output(
    spark: Any, embedded_url: str, tmp_path: Path
) -> None:
    """The store is schemaless: a mistyped column (or one written only after read_ts)
    would export no rows, or a column of nulls, and succeed.  The export counts the cells
    it reads per requested column and fails, naming the column and the table and listing
    the table's columns, without leaving the output behind; a column that has one cell in
    forty rows exports normally."""
    with connect(embedded_url) as client:
        client.create_table("t")
        client.create_table("empty")

        def fill(txn: Transaction) -> None:
            for i in range(40):
                txn.set("t", b"r%03d" % i, "a", b"a%d" % i)
            txn.set("t", b"r017", "rare", b"x")

        client.run(fill)
        before_late = client.oracle.get_timestamp()
        client.run(lambda t: t.set("t", b"r005", "late", b"y"))

    out = tmp_path / "typo.parquet"
    options = ExportOptions(embedded_url, "t", columns=("a", "typo"), splits=3)
    with pytest.raises(MissingColumnsError) as failed:
        write_export(spark, options, str(out))
    assert failed.value.columns == ("typo",) and failed.value.table == "t"
    assert str(failed.value).startswith("export of 't': column 'typo' has no cell in the table")
    assert "its columns: 'a', 'late', 'rare'" in str(failed.value)
    assert not out.exists()

    # The cells layout too; a column that exists only after read_ts does not exist in it.
    options = ExportOptions(
        embedded_url, "t", columns=("late", "nope"), layout="cells", read_ts=before_late
    )
    with pytest.raises(MissingColumnsError, match="columns 'late', 'nope' have no cell"):
        write_export(spark, options, str(out))
    assert not out.exists()

    # An empty table exports no row whatever the columns are called: its content, no typo.
    empty = write_export(spark, ExportOptions(embedded_url, "empty", columns=("a",)), str(out))
    assert empty.rows == 0 and out.exists()
    shutil.rmtree(out)

    # Every requested column has a cell, however rare: exported, and counted.
    report = write_export(
        spark, ExportOptions(embedded_url, "t", columns=("a", "rare"), splits=3), str(out)
    )
    assert report.rows == 40
    rare = {bytes(r["row"]) for r in spark.read.parquet(str(out)).collect() if r["rare"]}
    assert rare == {b"r017"}
    export = export_table(spark, ExportOptions(embedded_url, "t", columns=("rare", "typo")))
    assert export.df.count() == 1
    assert export.cells_found() == {"rare": 1, "typo": 0}


def test_an_export_of_a_store_that_does_not_exist_creates_none(spark: Any, tmp_path: Path) -> None:
    """An export only reads: a mistyped store path is an error, not a new, empty store."""
    missing = tmp_path / "no-such-store"
    with pytest.raises(ConfigError, match="does not exist"):
        export_table(spark, ExportOptions(f"embedded:{missing}", "documents"))
    assert not missing.exists()


# --------------------------------------------------------------------------- no Spark


def test_ranges_cover_every_key() -> None:
    assert ranges_of([]) == [(b"", None)]
    assert ranges_of([b"m", b"c", b"m"]) == [(b"", b"c"), (b"c", b"m"), (b"m", None)]


def test_sampled_split_keys_balance_the_rows() -> None:
    with percolator.connect("memory:", oracle=ManualOracle()) as client:
        client.create_table("t")

        def fill(txn: Transaction) -> None:
            for i in range(1000):
                txn.set("t", b"k%05d" % i, "c", b"v")

        client.run(fill)
        keys = sample_split_keys(client, "t", 4)
        assert keys == sorted(keys) and len(keys) == 3
        rows = [b"k%05d" % i for i in range(1000)]
        sizes = [
            sum(1 for r in rows if start <= r and (stop is None or r < stop))
            for start, stop in ranges_of(keys)
        ]
        assert sum(sizes) == 1000 and min(sizes) >= 200, sizes
        assert sample_split_keys(client, "t", 1) == []


@pytest.mark.spark
def test_an_export_at_a_given_read_ts_keeps_gc_below_it(
    spark: Any, embedded_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """write_export at an explicit, older read_ts holds GC below that read_ts (not below a
    fresh timestamp of its own) while it runs: a GC pass with life time 0 meanwhile must
    not make it fail or read newer data."""
    from percolator.spark_jobs import export as export_module

    with connect(embedded_url) as client:
        client.create_table("t")
        client.run(lambda t: t.set("t", b"r1", "a", b"old"))
        read_ts = client.oracle.get_timestamp()
        client.run(lambda t: t.set("t", b"r1", "a", b"new"))
    real_export_table = export_module.export_table
    collected: list[int] = []

    def gc_first(*args: Any, **kwargs: Any) -> Any:
        with connect(embedded_url) as operator:
            collected.append(operator.gc(life_time_ms=0).bound)
        return real_export_table(*args, **kwargs)

    monkeypatch.setattr(export_module, "export_table", gc_first)
    out = tmp_path / "old.parquet"
    report = write_export(
        spark, ExportOptions(embedded_url, "t", columns=("a",), read_ts=read_ts), str(out)
    )
    assert collected and collected[0] <= read_ts
    assert report.read_ts == read_ts
    assert [(bytes(r["row"]), bytes(r["a"])) for r in spark.read.parquet(str(out)).collect()] == [
        (b"r1", b"old")
    ]

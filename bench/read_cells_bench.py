"""HBase ``read_cells`` through each gateway: Thrift-1's cross product against Thrift-2's
exact ``getMultiple``, by the shape of the read.

A transaction's prewrite reads the lock and write cells of every cell it writes.  Thrift-1
takes one column list for all rows, so a read of one column in each of ``rows`` rows, a
different column each, asks the server for ``rows x rows`` cells; Thrift-2's
``getMultiple`` names each row's cells.  The store picks the gateway by the ratio of that
cross product to the cells named (``percolator.store.hbase._EXACT_READ_FACTOR``); this
prints both paths' median latency for several shapes, so that choice can be checked::

    python bench/read_cells_bench.py --store 'hbase://127.0.0.1:9090?thrift2_port=9095'

Shapes: ``rows`` rows, each with ``per_row`` columns of its own (distinct across rows) in
the lock and write families; each row also holds a few other write-family cells, as a
token row of an index holds other postings.  The two paths run alternately, each read
``--repeats`` times; the answers must be equal.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make ``bench`` and ``percolator`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import print_table
from percolator.store import FamilySpec, Put, Store, open_store
from percolator.store.base import Column, RowCells
from percolator.store.hbase import _EXACT_READ_FACTOR, HBaseStore

SHAPES = ((1, 1), (1, 8), (4, 1), (8, 8), (16, 1), (32, 1), (64, 1), (128, 1), (512, 1))


def _median_ms(read: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        read()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def _measure_shape(
    store: HBaseStore, table: str, rows: int, per_row: int, repeats: int
) -> list[object]:
    """One line of the table: both paths' median latency for one shape of read."""
    keys = [b"shape%d-%d-row%05d" % (rows, per_row, i) for i in range(rows)]
    own = {key: [b"c%05d-%d" % (i, j) for j in range(per_row)] for i, key in enumerate(keys)}
    store.put(
        table,
        [
            Put(key, family, qualifier, 5, b"x")
            for key in keys
            for qualifier in [*own[key], b"other1", b"other2", b"other3"]
            for family in ("l", "w")
            if family == "w" or qualifier in own[key]
        ],
    )
    cells: list[tuple[bytes, Column]] = [
        (key, (family, qualifier))
        for key in keys
        for qualifier in own[key]
        for family in ("l", "w")
    ]
    columns = sorted({column for _, column in cells})
    ratio = rows * len(columns) / len(cells)

    def crossed() -> dict[bytes, RowCells]:
        return Store._read_cross_product(store, table, cells, keys, columns, 10)

    def exact() -> dict[bytes, RowCells]:
        return store._read_exact(table, cells, 10)

    assert crossed() == exact(), (rows, per_row)
    cross_ms: list[float] = []
    exact_ms: list[float] = []
    for _ in range(3):  # alternate, so drift hits both
        cross_ms.append(_median_ms(crossed, repeats))
        exact_ms.append(_median_ms(exact, repeats))
    cross, exact_ = statistics.median(cross_ms), statistics.median(exact_ms)
    return [
        f"{rows} x {per_row}",
        len(cells),
        f"{ratio:.0f}",
        f"{cross:.2f}",
        f"{exact_:.2f}",
        f"{cross / exact_:.2f}x",
        "Thrift-2" if ratio >= _EXACT_READ_FACTOR else "Thrift-1",
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", required=True, help="hbase://HOST:PORT?thrift2_port=PORT2")
    parser.add_argument("--repeats", type=int, default=31)
    args = parser.parse_args(argv)
    prefix = f"rcb_{uuid.uuid4().hex[:8]}_"
    store = open_store(args.store + ("&" if "?" in args.store else "?") + f"prefix={prefix}")
    if not isinstance(store, HBaseStore) or store.thrift2_port is None:
        parser.error("--store must be an HBase store URL with thrift2_port")
    table = "t"
    try:
        store.create_table(
            table, [FamilySpec("l", max_versions=1, in_memory=True), FamilySpec("w")]
        )
        load_start = os.getloadavg()[0]
        lines = [
            _measure_shape(store, table, rows, per_row, args.repeats) for rows, per_row in SHAPES
        ]
        print(
            f"HBase read_cells, medians of 3 x {args.repeats} reads; load "
            f"{load_start:.1f} -> {os.getloadavg()[0]:.1f}; the store takes Thrift-2 from a "
            f"cross product of {_EXACT_READ_FACTOR}x the cells"
        )
        print_table(
            [
                "rows x cols/row",
                "cells",
                "cross/cells",
                "Thrift-1 ms",
                "Thrift-2 ms",
                "T1/T2",
                "store uses",
            ],
            lines,
        )
    finally:
        for name in store.list_tables():
            store.drop_table(name)
        store.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

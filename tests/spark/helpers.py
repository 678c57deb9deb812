"""Checks the Spark tests make straight against the store, and a run-counting observer.

``write_records`` counts the commits of every cell from the write family (one write record
per committed transaction that wrote the cell), so "written once" is read from the store,
not from the job's own report.  :class:`RunCounter` logs each committed observer run in
``runs`` in the same transaction as its acknowledgement, so only committed runs count.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence

from percolator.observers.api import Observer

import percolator
from percolator.layout import WRITE
from percolator.transaction import Transaction

ITEMS = "items"
RUNS = "runs"


def connect(url: str) -> percolator.Client:
    """A driver-side client on a store shared with the executors (the store's oracle)."""
    return percolator.connect(url, oracle=None, lock_ttl_ms=1000, lock_wait_ms=10_000)


def write_records(
    client: percolator.Client, table: str, rows: Sequence[bytes], column: str
) -> dict[bytes, int]:
    """How many commits wrote ``(table, row, column)``, per row (absent rows: 0)."""
    found = client.store.read_rows(
        table, list(rows), columns=[(WRITE, column.encode())], max_versions=1000
    )
    return {row: len(found.get(row, {}).get((WRITE, column.encode()), [])) for row in rows}


def table_rows(client: percolator.Client, table: str) -> dict[bytes, dict[str, bytes]]:
    return dict(client.snapshot().scan(table))


def rows_after_failed_job(
    client: percolator.Client, table: str, *, quiet_s: float = 2.0, timeout_s: float = 60.0
) -> dict[bytes, dict[str, bytes]]:
    """The table's rows once a failed job has stopped writing.  Spark reports a job failed
    as soon as one task has used up its attempts, without waiting for its other running
    tasks: those are only asked to stop, and their Python workers may still commit the
    batch they are writing.  So: the rows once they stayed the same for ``quiet_s``."""
    deadline = time.monotonic() + timeout_s
    rows = table_rows(client, table)
    while True:
        time.sleep(quiet_s)
        again = table_rows(client, table)
        if again == rows:
            return rows
        if time.monotonic() > deadline:
            raise AssertionError(f"{table} still changing {timeout_s:g} s after the job failed")
        rows = again


class RunCounter(Observer):
    """Counts its committed runs on ``items/value`` in ``runs`` (row ``<row>|<start_ts>``)."""

    name = "spark-run-counter"
    table = ITEMS
    columns = ("value",)

    def setup(self, client: percolator.Client) -> None:
        client.create_table(ITEMS)
        client.create_table(RUNS)

    def process(self, txn: Transaction, row: bytes, column: str) -> None:
        txn.set(
            RUNS, row + b"|" + b"%020d" % txn.start_ts, "seen", txn.get(ITEMS, row, column) or b""
        )


def runs_per_row(client: percolator.Client) -> Counter[bytes]:
    return Counter(row.rsplit(b"|", 1)[0] for row, _ in client.snapshot().scan(RUNS))

"""A worker process for the store tests: races compare-and-set, or writes batches.

Run as ``python -m tests.store._store_worker MODE URL TABLE ARGS...``.  The worker opens
the store, prints ``ready``, waits for one line on stdin (so the test can start every
worker at the same moment), does its work, and prints one JSON line with its result.

Modes:

* ``chain ROW ROUNDS NAME``: climb a chain of compare-and-sets on one cell whose value is
  ``b"<round>:<winner>"``: read it, try to move it to the next round with this worker's
  name, until the chain reaches ROUNDS.  Prints the rounds this worker won.
* ``counter ROW COUNT``: increment a decimal counter in one cell COUNT times by
  compare-and-set (read, CAS from the value read, retry on failure).  Prints the number of
  attempts.
* ``batches ROWS CELLS MAX``: write batches (one ``put`` call each) of ROWS new rows with
  CELLS cells each, all holding the batch number, up to MAX batches (0: forever); after
  each returned ``put`` prints the batch number on its own line (flushed).

The functions are importable, so the thread tests race exactly the same code.
"""

from __future__ import annotations

import json
import sys

from percolator.store import Put, Store, open_store

FAMILY = "l"
QUALIFIER = b"q"


def read_cell(store: Store, table: str, row: bytes) -> bytes | None:
    cells = store.read_row(table, row, [(FAMILY, QUALIFIER)])
    versions = cells.get((FAMILY, QUALIFIER))
    return versions[0][1] if versions else None


def cas_chain(store: Store, table: str, row: bytes, rounds: int, name: str) -> list[int]:
    """Move the chain forward until it reaches ``rounds``; return the rounds won here."""
    won: list[int] = []
    while True:
        current = read_cell(store, table, row)
        reached = 0 if current is None else int(current.split(b":")[0])
        if reached >= rounds:
            return won
        new = b"%d:%s" % (reached + 1, name.encode())
        if store.compare_and_set(table, row, FAMILY, QUALIFIER, current, new):
            won.append(reached + 1)


def cas_counter(store: Store, table: str, row: bytes, count: int) -> int:
    """Add ``count`` to the counter, one compare-and-set per increment; return attempts."""
    attempts = 0
    done = 0
    while done < count:
        current = read_cell(store, table, row)
        value = 0 if current is None else int(current)
        attempts += 1
        if store.compare_and_set(table, row, FAMILY, QUALIFIER, current, b"%d" % (value + 1)):
            done += 1
    return attempts


def batch_rows(batch: int, rows: int) -> list[bytes]:
    return [b"b%06d-%04d" % (batch, i) for i in range(rows)]


def write_batches(store: Store, table: str, rows: int, cells: int, max_batches: int) -> None:
    batch = 0
    while max_batches == 0 or batch < max_batches:
        value = b"%d" % batch
        store.put(
            table,
            [
                Put(row, "d", b"c%03d" % c, 1, value)
                for row in batch_rows(batch, rows)
                for c in range(cells)
            ],
        )
        print(batch, flush=True)
        batch += 1


def main(argv: list[str]) -> int:
    mode, url, table, *args = argv
    store = open_store(url)
    print("ready", flush=True)
    sys.stdin.readline()
    result: dict[str, object]
    if mode == "chain":
        row, rounds, name = args
        result = {"won": cas_chain(store, table, row.encode(), int(rounds), name)}
    elif mode == "counter":
        row, count = args
        result = {"attempts": cas_counter(store, table, row.encode(), int(count))}
    elif mode == "batches":
        rows, cells, max_batches = (int(a) for a in args)
        write_batches(store, table, rows, cells, max_batches)
        result = {"done": True}
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    print(json.dumps(result), flush=True)
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

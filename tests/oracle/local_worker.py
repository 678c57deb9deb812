"""Run as a process: take timestamps from a LocalOracle on a shared store and print each
call as ``start_ns end_ns ts`` (CLOCK_MONOTONIC, system-wide), one per line.

Arguments: ``URL COUNT THREADS [BLOCK_MS]`` (BLOCK_MS: the oracle's leased-block length)."""

from __future__ import annotations

import sys
import threading
import time

from percolator.store import open_store
from percolator.timestamps import LocalOracle


def main() -> None:
    url, count, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    block_ms = int(sys.argv[4]) if len(sys.argv) > 4 else None
    store = open_store(url)
    oracle = LocalOracle(store) if block_ms is None else LocalOracle(store, block_ms=block_ms)
    lines: list[str] = []
    lock = threading.Lock()

    def work() -> None:
        mine = []
        for _ in range(count):
            start = time.monotonic_ns()
            ts = oracle.get_timestamp()
            mine.append(f"{start} {time.monotonic_ns()} {ts}")
        with lock:
            lines.extend(mine)

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    sys.stdout.write("\n".join(lines) + "\n")
    sys.stderr.write(f"fetches={oracle.stats.fetches}\n")
    store.close()


if __name__ == "__main__":
    main()

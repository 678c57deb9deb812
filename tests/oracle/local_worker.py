"""Run as a process: take timestamps from a LocalOracle on a shared store and print each
call as ``start_ns end_ns ts`` (CLOCK_MONOTONIC, system-wide), one per line.

Arguments: ``URL COUNT THREADS [BLOCK_MS [PACE_MS]]`` (BLOCK_MS: the oracle's leased-block
length; PACE_MS: a pause after each call, so a run lasts long enough to be paused from
outside).  Prints ``ready`` to stderr once it has served from the short lease, and its
counters at the end."""

from __future__ import annotations

import sys
import threading
import time

from percolator.store import open_store
from percolator.timestamps import LocalOracle


def main() -> None:
    url, count, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    block_ms = int(sys.argv[4]) if len(sys.argv) > 4 else None
    pace_s = int(sys.argv[5]) / 1000 if len(sys.argv) > 5 else 0.0
    store = open_store(url)
    oracle = LocalOracle(store) if block_ms is None else LocalOracle(store, block_ms=block_ms)
    lines: list[str] = []
    lock = threading.Lock()
    announced = threading.Event()

    def work() -> None:
        mine = []
        for _ in range(count):
            start = time.monotonic_ns()
            ts = oracle.get_timestamp()
            mine.append(f"{start} {time.monotonic_ns()} {ts}")
            # Served several batches under the lease: the lease is in use, not just taken.
            if oracle.leased_batches >= 5 and not announced.is_set():
                announced.set()
                sys.stderr.write("ready\n")
                sys.stderr.flush()
            if pace_s:
                time.sleep(pace_s)
        with lock:
            lines.extend(mine)

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    sys.stdout.write("\n".join(lines) + "\n")
    sys.stderr.write(
        f"fetches={oracle.stats.fetches} leased_batches={oracle.leased_batches} "
        f"lease_waits={oracle.lease_waits}\n"
    )
    store.close()


if __name__ == "__main__":
    main()

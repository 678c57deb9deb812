"""``percolator demo``: the engine at work on the embedded store, no setup needed.

Runs a bank: accounts with a fixed total, concurrent transfers from several threads on hot
accounts (so transactions really conflict and retry), and snapshot readers that check the
total in every snapshot while the transfers run.  Prints progress and a summary.
"""

from __future__ import annotations

import argparse
import functools
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from percolator.commands.common import add_oracle_option

if TYPE_CHECKING:
    from percolator.transaction import Transaction


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "demo",
        help="run the demo on the embedded store (no HBase, no Docker)",
        description="Concurrent bank transfers with snapshot-isolation transactions; every "
        "snapshot must see the same total.",
    )
    parser.add_argument(
        "--store",
        default=None,
        help="store URL (default: a fresh embedded store in a temporary directory)",
    )
    add_oracle_option(parser)
    parser.add_argument("--accounts", type=int, default=20)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.set_defaults(func=run)


def _transfer(
    txn: Transaction, *, src: bytes, dst: bytes, amount: int, attempts: list[int]
) -> None:
    """Move ``amount`` from ``src`` to ``dst`` if ``src`` can afford it."""
    attempts[0] += 1
    balance = int(txn.get("bank", src, "balance") or b"0")
    if balance < amount:
        return
    other = int(txn.get("bank", dst, "balance") or b"0")
    txn.set("bank", src, "balance", str(balance - amount).encode())
    txn.set("bank", dst, "balance", str(other + amount).encode())


def run(args: argparse.Namespace) -> int:
    import percolator
    from percolator.errors import ConfigError, PercolatorError

    if args.accounts < 2 or args.threads < 1 or args.seconds <= 0:
        raise ConfigError("--accounts must be >= 2, --threads >= 1 and --seconds > 0")
    workdir = None
    store_url = args.store
    if store_url is None:
        workdir = Path(tempfile.mkdtemp(prefix="percolator-demo-"))
        store_url = f"embedded:{workdir / 'store'}"
    print(f"demo: store {store_url}")
    client = percolator.connect(store_url, oracle=args.oracle)
    try:
        client.create_table("bank")
        per_account = 1000
        total = per_account * args.accounts
        accounts = [f"acct-{i:03d}".encode() for i in range(args.accounts)]

        def setup(txn: percolator.Transaction) -> None:
            for account in accounts:
                txn.set("bank", account, "balance", str(per_account).encode())

        client.run(setup)
        print(f"demo: {args.accounts} accounts holding {total} in total")

        stop = threading.Event()
        committed = [0] * args.threads
        conflicts = [0] * args.threads
        latencies: list[float] = []
        snapshots = [0]
        violations: list[str] = []
        lock = threading.Lock()

        def transfer_worker(index: int) -> None:
            rng = random.Random(index)
            while not stop.is_set():
                src, dst = rng.sample(accounts, 2)
                amount = rng.randint(1, 50)
                attempts = [0]
                job = functools.partial(
                    _transfer, src=src, dst=dst, amount=amount, attempts=attempts
                )
                started = time.perf_counter()
                try:
                    client.run(job, max_attempts=50, backoff_ms=2)
                except PercolatorError as exc:
                    print(f"demo: transfer gave up: {exc}", file=sys.stderr)
                    continue
                with lock:
                    latencies.append(time.perf_counter() - started)
                committed[index] += 1
                conflicts[index] += attempts[0] - 1

        def audit_worker() -> None:
            while not stop.is_set():
                snap = client.snapshot()
                seen = sum(int(cells["balance"]) for _, cells in snap.scan("bank"))
                snapshots[0] += 1
                if seen != total:
                    violations.append(f"snapshot at {snap.read_ts} saw {seen}")

        threads = [
            threading.Thread(target=transfer_worker, args=(i,), daemon=True)
            for i in range(args.threads)
        ]
        threads.append(threading.Thread(target=audit_worker, daemon=True))
        started = time.monotonic()
        for thread in threads:
            thread.start()
        while (remaining := args.seconds - (time.monotonic() - started)) > 0:
            time.sleep(min(1.0, remaining))
            elapsed = time.monotonic() - started
            done = sum(committed)
            print(
                f"demo: {elapsed:5.1f}s  {done} transfers committed "
                f"({done / max(elapsed, 1e-9):.0f}/s), {sum(conflicts)} conflicts retried, "
                f"{snapshots[0]} snapshots audited",
                flush=True,
            )
        stop.set()
        for thread in threads:
            thread.join()

        final = sum(int(c["balance"]) for _, c in client.snapshot().scan("bank"))
        ok = final == total and not violations
        print()
        print("summary")
        print(f"  transfers committed     {sum(committed)}")
        print(f"  conflicts retried       {sum(conflicts)}")
        if latencies:
            ordered = sorted(latencies)
            p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
            print(
                f"  latency p50 / p99       {statistics.median(ordered) * 1000:.1f} ms / "
                f"{p99 * 1000:.1f} ms"
            )
        print(f"  snapshots audited       {snapshots[0]} ({len(violations)} with a wrong total)")
        print(f"  final total             {final} (expected {total})")
        print(f"  result                  {'OK' if ok else 'FAILED'}")
        for violation in violations[:5]:
            print(f"  violation: {violation}")
        return 0 if ok else 1
    finally:
        client.close()
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)

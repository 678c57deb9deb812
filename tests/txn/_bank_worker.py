"""Worker process of the multi-process isolation tests, and the bank workload they share.

    python tests/txn/_bank_worker.py bank URL --table T --accounts K --total N --seed S
                                          [--transfers M] [--lock-ttl-ms MS] [--read-every R]
        Transfers random amounts between random accounts (``client.run``), M times or, with
        ``--transfers 0``, until killed; every R transfers it sums all balances in a
        snapshot.  Prints one JSON line per snapshot whose sum is not N (``{"bad_read": ...}``)
        at once, and a summary line at the end (``{"summary": ...}``).  Exit status 1 if any
        snapshot sum was wrong.

    python tests/txn/_bank_worker.py append URL --table T --keys k1,k2 --count M --seed S
                                            --index I --out FILE [--lock-ttl-ms MS]
        Runs the list-append workload of :mod:`percolator.testing.history` and writes every recorded
        attempt to FILE (JSON lines).  Transaction ids and elements start at (I+1) * 10**9,
        so histories of several workers can be checked together.

Timestamps come from the store's own oracle (``connect(oracle=None)``), which every process
on the same store shares.  Failpoints can be set through ``PERCOLATOR_FAILPOINTS``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
from collections import Counter
from collections.abc import Sequence

import percolator
from percolator import failpoints
from percolator.errors import PercolatorError
from percolator.testing import history
from percolator.transaction import Snapshot, Transaction

BALANCE = "balance"

# Failpoints whose action "raise" simulates a client failing between two protocol steps.
# "commit.primary_cas_applied" is left out: with "raise" there the engine rolls back the
# secondaries of a committed transaction (see test_history.py, the failing
# test_primary_cas_applied_raise_keeps_atomicity); "unavailable" there is the
# realistic failure and is used instead.
RAISE_POINTS = (
    "prewrite.before_primary",
    "prewrite.before_lock",
    "prewrite.after_primary",
    "prewrite.after_secondaries",
    "commit.before_notify",
    "commit.before_primary",
    "commit.primary_cas",
    "commit.after_primary",
    "commit.after_write_records",
    "commit.after_secondaries",
    "rollback.after_primary",
    "resolve.before_roll_forward",
    "resolve.before_roll_back",
)


class FailpointChaos:
    """While active, every ``interval_s`` turns on one random failpoint of ``points`` in this
    process with ``count:N:raise`` (N random in 1..4, so it fires once, on a later hit), and
    with ``lost_replies`` now and then ``commit.primary_cas_applied`` with
    ``count:1:unavailable`` (a commit whose reply was lost).  The choices are seeded; which
    transaction a failpoint hits depends on timing.  ``enabled`` counts the failpoints turned
    on.  Leaves every failpoint off on exit."""

    def __init__(
        self,
        seed: int,
        interval_s: float = 0.05,
        points: Sequence[str] = RAISE_POINTS,
        *,
        lost_replies: bool = True,
    ) -> None:
        self._rng = random.Random(seed)
        self._interval_s = interval_s
        self._points = list(points)
        self._lost_replies = lost_replies
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="failpoint-chaos", daemon=True)
        self.enabled = 0

    def _loop(self) -> None:
        while not self._stop.wait(self._interval_s):
            failpoints.enable(
                self._rng.choice(self._points), f"count:{self._rng.randint(1, 4)}:raise"
            )
            if self._lost_replies and self._rng.random() < 0.2:
                failpoints.enable("commit.primary_cas_applied", "count:1:unavailable")
            self.enabled += 1

    def __enter__(self) -> FailpointChaos:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        failpoints.disable()


def account_rows(accounts: int) -> list[str]:
    return [f"acct{i:03d}" for i in range(accounts)]


def create_accounts(client: percolator.Client, table: str, accounts: int, total: int) -> None:
    """Create ``table`` with ``accounts`` balances summing to ``total`` (one transaction)."""
    if total % accounts:
        raise ValueError(f"total {total} must be a multiple of the {accounts} accounts")
    client.create_table(table)

    def fill(txn: Transaction) -> None:
        for row in account_rows(accounts):
            txn.set(table, row, BALANCE, str(total // accounts).encode())

    client.run(fill)


def transfer(
    client: percolator.Client, table: str, accounts: int, rng: random.Random, max_attempts: int
) -> None:
    """Move a random amount (never below zero) between two random accounts; the read and
    both writes are one transaction, re-run as a whole on a retryable error."""
    source, target = rng.sample(account_rows(accounts), 2)
    amount = rng.randint(1, 10)

    def body(txn: Transaction) -> None:
        have = int(txn.get(table, source, BALANCE) or b"0")
        other = int(txn.get(table, target, BALANCE) or b"0")
        moved = min(amount, have)
        txn.set(table, source, BALANCE, str(have - moved).encode())
        txn.set(table, target, BALANCE, str(other + moved).encode())

    client.run(body, max_attempts=max_attempts)


def read_balances(snapshot: Snapshot, table: str, accounts: int, *, scan: bool) -> dict[str, int]:
    """Every balance at the snapshot, through point reads or through a scan."""
    if scan:
        return {
            row.decode(): int(cells[BALANCE])
            for row, cells in snapshot.scan(table, columns=[BALANCE])
        }
    return {row: int(snapshot.get(table, row, BALANCE) or b"0") for row in account_rows(accounts)}


def run_bank(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    client = percolator.connect(args.url, lock_ttl_ms=args.lock_ttl_ms, lock_wait_ms=30_000)
    outcomes: Counter[str] = Counter()
    reads = bad = 0
    done = 0
    while args.transfers == 0 or done < args.transfers:
        done += 1
        try:
            transfer(client, args.table, args.accounts, rng, max_attempts=50)
            outcomes["committed"] += 1
        except PercolatorError as exc:
            outcomes[type(exc).__name__] += 1
        if done % args.read_every == 0:
            snapshot = client.snapshot()
            balances = read_balances(snapshot, args.table, args.accounts, scan=rng.random() < 0.5)
            reads += 1
            if sum(balances.values()) != args.total or len(balances) != args.accounts:
                bad += 1
                print(json.dumps({"bad_read": balances, "read_ts": snapshot.read_ts}), flush=True)
    print(json.dumps({"summary": {"outcomes": outcomes, "reads": reads, "bad_reads": bad}}))
    client.close()
    return 1 if bad else 0


def run_append(args: argparse.Namespace) -> int:
    client = percolator.connect(args.url, lock_ttl_ms=args.lock_ttl_ms, lock_wait_ms=30_000)
    recorder = history.Recorder(base=(args.index + 1) * 10**9)
    errors = history.run_list_append(
        client,
        recorder,
        table=args.table,
        keys=args.keys.split(","),
        count=args.count,
        rng=random.Random(args.seed),
        process=f"p{args.index}",
    )
    history.dump_jsonl(recorder.txns(), args.out)
    print(json.dumps({"summary": {"errors": errors, "txns": len(recorder.txns())}}))
    client.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    bank = sub.add_parser("bank")
    bank.add_argument("url")
    bank.add_argument("--table", required=True)
    bank.add_argument("--accounts", type=int, required=True)
    bank.add_argument("--total", type=int, required=True)
    bank.add_argument("--seed", type=int, required=True)
    bank.add_argument("--transfers", type=int, default=0)
    bank.add_argument("--read-every", type=int, default=5)
    bank.add_argument("--lock-ttl-ms", type=int, default=500)
    bank.set_defaults(func=run_bank)
    append = sub.add_parser("append")
    append.add_argument("url")
    append.add_argument("--table", required=True)
    append.add_argument("--keys", required=True)
    append.add_argument("--count", type=int, required=True)
    append.add_argument("--seed", type=int, required=True)
    append.add_argument("--index", type=int, required=True)
    append.add_argument("--out", required=True)
    append.add_argument("--lock-ttl-ms", type=int, default=500)
    append.set_defaults(func=run_append)
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())

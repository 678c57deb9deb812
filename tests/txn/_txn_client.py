"""A transaction client run as a subprocess by the crash and fault tests, and the helpers
the tests use to drive it.

Run as ``python -m tests.txn._txn_client --store URL ...`` from the project root.  Failpoints
come from the environment variable ``PERCOLATOR_FAILPOINTS`` (see percolator/failpoints.py),
so a failpoint action ``crash`` kills this process with SIGKILL in the middle of a protocol
step, and ``pause`` stops it with SIGSTOP.

The workload is a bank: accounts ``acct-0 .. acct-K-1`` live alternately in tables
``bank_a`` and ``bank_b`` (column ``bal`` holds the balance, column ``hist`` the last
transfer).  Each transaction reads every balance, then moves a random amount from an account
of ``bank_a`` to one of ``bank_b`` and writes a journal row in table ``journal``: five cells,
three rows, three tables.  Every cell it writes carries the same unique marker value
(:func:`tests.txn.raw_inspect.encode_value`), so the raw store alone tells whether the
transaction committed on all of its cells or on none.

The client reports what it did on stdout, one JSON object per line, flushed at once (a
SIGKILL loses nothing already reported):

``{"ev": "start", "marker": M, "start_ts": T}``       a transaction attempt began
``{"ev": "commit", "marker": M, "start_ts": T}``      its commit is about to start
``{"ev": "result", "marker": M, "start_ts": T, "outcome": "committed", "commit_ts": C}``
``{"ev": "result", "marker": M, "outcome": "error", "error": NAME, "retryable": B, ...}``
``{"ev": "done", "committed": N}``                   every transfer ran

The tests judge outcomes from the stored data, never from these reports: the reports only
say which attempt was in flight when the process died, and what the client was told.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import percolator
from percolator.errors import PercolatorError, UndeterminedCommitError
from tests.txn.raw_inspect import (
    COMMITTED,
    ROLLED_BACK,
    RawHistory,
    TxnView,
    check_all_or_nothing,
    decode_value,
    encode_value,
    locked_cells,
    read_all,
    transactions,
)

BANK_TABLES = ("bank_a", "bank_b")
JOURNAL = "journal"
TABLES = (*BANK_TABLES, JOURNAL)
BALANCE = "bal"
HISTORY = "hist"
ENTRY = "entry"
CELLS_PER_TRANSFER = 5
INITIAL_BALANCE = 100

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def account(i: int) -> tuple[str, bytes]:
    """The (table, row) of account ``i``: even accounts in bank_a, odd ones in bank_b."""
    return BANK_TABLES[i % 2], f"acct-{i}".encode()


def balance_of(value: bytes | None) -> int:
    if value is None:
        raise AssertionError("an account has no balance")
    return int(decode_value(value).payload)


# --------------------------------------------------------------------------- the workload

Emit = Callable[[dict[str, Any]], None]


def _transfer(
    client: percolator.Client, marker: str, accounts: int, rng: random.Random, emit: Emit
) -> tuple[int, int]:
    """One transfer attempt; returns ``(start_ts, commit_ts)``.  Raises what commit raises."""
    txn = client.transaction()
    emit({"ev": "start", "marker": marker, "start_ts": txn.start_ts})
    try:
        balances = {i: balance_of(txn.get(*account(i), BALANCE)) for i in range(accounts)}
        src = rng.randrange(0, accounts, 2)  # bank_a
        dst = rng.randrange(1, accounts, 2)  # bank_b
        amount = rng.randint(1, 9)

        def value(payload: str) -> bytes:
            return encode_value(marker, CELLS_PER_TRANSFER, txn.start_ts, payload)

        for i, balance in ((src, balances[src] - amount), (dst, balances[dst] + amount)):
            table, row = account(i)
            txn.set(table, row, BALANCE, value(str(balance)))
            txn.set(table, row, HISTORY, value(f"{src}->{dst}"))
        txn.set(JOURNAL, marker.encode(), ENTRY, value(f"{src}->{dst}:{amount}"))
    except BaseException:
        txn.rollback()
        raise
    emit({"ev": "commit", "marker": marker, "start_ts": txn.start_ts})
    commit_ts = txn.commit()
    assert commit_ts is not None
    return txn.start_ts, commit_ts


def run_transfers(
    client: percolator.Client,
    *,
    name: str,
    txns: int,
    accounts: int,
    rng: random.Random,
    max_attempts: int,
    emit: Emit,
) -> bool:
    """Commit ``txns`` transfers, each retried (a new attempt with a new marker) after a
    retryable error, at most ``max_attempts`` times.  An undetermined commit is never
    retried: the outcome is unknown and a retry could apply the transfer twice.  Returns
    False if a non-retryable error stopped the run."""
    committed = 0
    for i in range(txns):
        for attempt in range(max_attempts):
            marker = f"{name}-{i}-{attempt}"
            try:
                start_ts, commit_ts = _transfer(client, marker, accounts, rng, emit)
            except PercolatorError as exc:
                emit(
                    {
                        "ev": "result",
                        "marker": marker,
                        "outcome": "error",
                        "error": type(exc).__name__,
                        "retryable": exc.retryable,
                        "message": str(exc),
                    }
                )
                if isinstance(exc, UndeterminedCommitError):
                    break
                if not exc.retryable:
                    return False
                time.sleep(rng.uniform(0.001, 0.02))
                continue
            committed += 1
            emit(
                {
                    "ev": "result",
                    "marker": marker,
                    "start_ts": start_ts,
                    "outcome": "committed",
                    "commit_ts": commit_ts,
                }
            )
            break
    emit({"ev": "done", "committed": committed})
    return True


def _emit_stdout(event: Mapping[str, Any]) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", required=True, help="store URL (embedded:PATH or hbase://...)")
    parser.add_argument("--name", required=True, help="unique client name (prefix of markers)")
    parser.add_argument("--txns", type=int, default=5, help="transfers to commit")
    parser.add_argument("--accounts", type=int, default=4, help="number of accounts (even)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lock-ttl-ms", type=int, default=300)
    parser.add_argument("--lock-wait-ms", type=int, default=10_000)
    parser.add_argument("--max-attempts", type=int, default=100)
    args = parser.parse_args(argv)

    client = percolator.connect(
        args.store, oracle=None, lock_ttl_ms=args.lock_ttl_ms, lock_wait_ms=args.lock_wait_ms
    )
    try:
        ok = run_transfers(
            client,
            name=args.name,
            txns=args.txns,
            accounts=args.accounts,
            rng=random.Random(args.seed),
            max_attempts=args.max_attempts,
            emit=_emit_stdout,
        )
    finally:
        client.close()
    return 0 if ok else 2


# --------------------------------------------------------------------------- driving clients


@dataclass
class Report:
    """What a finished client process printed, and how it ended."""

    returncode: int
    events: list[dict[str, Any]]
    stderr: str

    @property
    def killed(self) -> bool:
        return self.returncode == -signal.SIGKILL

    def results(self, outcome: str | None = None) -> list[dict[str, Any]]:
        return [
            e
            for e in self.events
            if e["ev"] == "result" and (outcome is None or e["outcome"] == outcome)
        ]

    def in_flight(self) -> dict[str, Any] | None:
        """The last attempt that started and reported no result (the one a crash hit)."""
        finished = {e["marker"] for e in self.results()}
        started = [e for e in self.events if e["ev"] == "start" and e["marker"] not in finished]
        return started[-1] if started else None

    def committing(self, marker: str) -> bool:
        """Did attempt ``marker`` reach its commit call?"""
        return any(e["ev"] == "commit" and e["marker"] == marker for e in self.events)

    def describe(self) -> str:
        tail = "\n".join(json.dumps(e) for e in self.events[-5:])
        return f"exit {self.returncode}; last events:\n{tail}\nstderr:\n{self.stderr[-3000:]}"


class ClientProcess:
    """A running ``_txn_client`` subprocess."""

    def __init__(
        self,
        store_url: str,
        name: str,
        *,
        failpoints: str = "",
        txns: int = 5,
        accounts: int = 4,
        seed: int = 0,
        lock_ttl_ms: int = 300,
        lock_wait_ms: int = 10_000,
        max_attempts: int = 100,
    ) -> None:
        env = dict(os.environ)
        env["PERCOLATOR_FAILPOINTS"] = failpoints
        env["PYTHONPATH"] = os.pathsep.join(
            [str(PROJECT_ROOT), *filter(None, [env.get("PYTHONPATH")])]
        )
        self.name = name
        self.popen = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.txn._txn_client",
                "--store",
                store_url,
                "--name",
                name,
                "--txns",
                str(txns),
                "--accounts",
                str(accounts),
                "--seed",
                str(seed),
                "--lock-ttl-ms",
                str(lock_ttl_ms),
                "--lock-wait-ms",
                str(lock_wait_ms),
                "--max-attempts",
                str(max_attempts),
            ],
            cwd=PROJECT_ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def wait(self, timeout: float = 60.0) -> Report:
        """Wait for the process to end (killing it if it overstays) and parse its report."""
        try:
            out, err = self.popen.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            out, err = self.popen.communicate()
            raise AssertionError(
                f"client {self.name} did not finish within {timeout} s; stderr:\n{err[-3000:]}"
            ) from None
        events = [json.loads(line) for line in out.splitlines() if line.strip()]
        return Report(self.popen.returncode, events, err)

    def wait_stopped(self, timeout: float = 30.0) -> None:
        """Wait until the process has stopped itself (SIGSTOP from a ``pause`` failpoint)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                report = self.wait()
                raise AssertionError(
                    f"client {self.name} ended instead of pausing: {report.describe()}"
                )
            if process_state(self.pid) == "T":
                return
            time.sleep(0.005)
        raise AssertionError(f"client {self.name} did not pause within {timeout} s")

    def signal(self, sig: int) -> None:
        os.kill(self.pid, sig)

    def kill(self) -> None:
        """SIGKILL (also works on a stopped process)."""
        if self.popen.poll() is None:
            self.popen.kill()


# --------------------------------------------------------------------------- set-up and judging


def setup_bank(client: percolator.Client, accounts: int) -> None:
    """Create the tables and give every account INITIAL_BALANCE (one transaction)."""
    if accounts < 2 or accounts % 2:
        raise ValueError(f"accounts must be even and >= 2, got {accounts}")
    for table in TABLES:
        client.create_table(table)
    with client.transaction() as txn:
        n_cells = 2 * accounts
        for i in range(accounts):
            table, row = account(i)
            txn.set(
                table,
                row,
                BALANCE,
                encode_value("init", n_cells, txn.start_ts, str(INITIAL_BALANCE)),
            )
            txn.set(table, row, HISTORY, encode_value("init", n_cells, txn.start_ts, "init"))


Address = tuple[str, bytes, str]


@dataclass
class Verdict:
    """The store after settling, judged from raw data."""

    views: dict[int, TxnView]
    histories: list[RawHistory]
    read_values: dict[Address, bytes | None]

    def by_marker(self, marker: str) -> TxnView | None:
        found = [v for v in self.views.values() if v.marker == marker]
        assert len(found) <= 1, f"marker {marker} used by several transactions"
        return found[0] if found else None

    def outcome_of(self, marker: str) -> str:
        """The raw outcome of attempt ``marker``; one that wrote nothing is rolled back."""
        view = self.by_marker(marker)
        return ROLLED_BACK if view is None else view.outcome

    def check_reports(self, events: Sequence[Mapping[str, Any]]) -> None:
        """What a client was told matches the store: a commit that returned is committed,
        a commit that raised anything but UndeterminedCommitError is rolled back (an
        undetermined one may be either; all-or-nothing is checked separately)."""
        for event in events:
            if event["ev"] != "result":
                continue
            outcome = self.outcome_of(event["marker"])
            if event["outcome"] == "committed":
                assert outcome == COMMITTED, f"reported committed, stored {outcome}: {event}"
            elif event["error"] != "UndeterminedCommitError":
                assert outcome == ROLLED_BACK, f"reported failed, stored {outcome}: {event}"


def read_every_cell(client: percolator.Client) -> dict[Address, bytes | None]:
    """Read every cell the raw store holds, through the engine (which resolves every lock
    it meets), one ``get_row`` per row at one fresh snapshot."""
    rows: dict[tuple[str, bytes], list[str]] = {}
    for h in read_all(client.store):
        rows.setdefault((h.table, h.row), []).append(h.column)
    snapshot = client.snapshot()
    values: dict[Address, bytes | None] = {}
    for (table, row), columns in rows.items():
        got = snapshot.get_row(table, row, columns)
        for column in columns:
            values[(table, row, column)] = got.get(column)
    return values


def settle_and_judge(client: percolator.Client, accounts: int) -> Verdict:
    """Read every cell through ``client`` (resolving what dead clients left), then check
    from a raw scan of the store:

    * no lock is left in any lock cell;
    * every transaction committed on all of its cells or on none (and at one commit_ts);
    * what the engine read is what the raw data says is visible;
    * the bank total is intact, and every balance equals the initial balance plus the
      transfers whose journal entry committed (no transfer lost or applied twice).

    Raises AssertionError naming what is wrong."""
    read_values = read_every_cell(client)
    histories = read_all(client.store)
    locks = locked_cells(histories)
    assert not locks, "locks left after every cell was read:\n" + "\n".join(
        f"{h.address}: {h.lock_cell.lock}" for h in locks
    )
    views = transactions(histories)
    broken = check_all_or_nothing(views)
    assert not broken, "transactions not all-or-nothing:\n" + "\n".join(broken)
    for h in histories:
        assert read_values.get(h.address) == h.visible_value(), (
            f"{h.address}: the engine read {read_values.get(h.address)!r}, the raw data "
            f"shows {h.visible_value()!r}"
        )

    expected = dict.fromkeys(range(accounts), INITIAL_BALANCE)
    for view in views.values():
        if view.outcome != COMMITTED or view.marker == "init":
            continue
        journal = [h for h in histories if h.table == JOURNAL and h.address in view.committed]
        assert len(journal) == 1, f"{view.describe()}: expected one journal cell"
        value = journal[0].data_at(view.start_ts)
        assert value is not None
        move, amount = decode_value(value).payload.split(":")
        src, dst = (int(x) for x in move.split("->"))
        expected[src] -= int(amount)
        expected[dst] += int(amount)
    by_address = {h.address: h for h in histories}
    balances = {
        i: balance_of(by_address[(*account(i), BALANCE)].visible_value()) for i in range(accounts)
    }
    assert sum(balances.values()) == INITIAL_BALANCE * accounts, f"total broken: {balances}"
    assert balances == expected, (
        f"balances {balances} differ from initial balances plus committed transfers {expected}"
    )
    return Verdict(views, histories, read_values)


def process_state(pid: int) -> str:
    """The one-letter state of a process from /proc (``T``: stopped, ``Z``: zombie...)."""
    with open(f"/proc/{pid}/stat") as f:
        # The command name is in parentheses and may contain spaces: split after it.
        return f.read().rsplit(")", 1)[1].split()[0]


if __name__ == "__main__":
    sys.exit(main())

"""The bank workload: money moves between a few hot accounts, the total never changes.

Transfers (read two balances, write both) run from several threads, and from several
processes sharing one store (``tests/txn/_bank_worker.py``, timestamps from the store's
own oracle).  Meanwhile snapshot readers sum every balance: under snapshot isolation each
sum is the constant total.  At the end the total is read twice more at one final
``read_ts``: through the engine's snapshot, and decoded by hand from a raw scan of the store
(lock cell, write records, data versions; no engine read code), and the lock family must be
empty of locks.

The crash variant SIGKILLs workers at random moments while they transfer (and restarts
them), and some workers kill themselves in the middle of a commit through a ``crash``
failpoint; after the lock TTL one read pass resolves what they left.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import percolator
from percolator.errors import PercolatorError
from percolator.layout import DATA, LOCK, WRITE
from percolator.records import Kind, LockCell, WriteRecord
from percolator.store import Store
from percolator.testing import ManualOracle
from tests.txn._bank_worker import (
    BALANCE,
    FailpointChaos,
    create_accounts,
    read_balances,
    transfer,
)

WORKER = Path(__file__).with_name("_bank_worker.py")
REPO = Path(__file__).resolve().parents[2]
TABLE = "bank"
ACCOUNTS = 5
TOTAL = 500
LOCK_TTL_MS = 300


# ------------------------------------------------------------------------------ fixtures


# ------------------------------------------------------------------------------ checks


@dataclass
class Readers:
    """Snapshot readers summing every balance until stopped (half by scan, half by gets)."""

    client: percolator.Client
    threads: int = 2
    sums: list[int] = field(default_factory=list)
    bad: list[tuple[int, dict[str, int]]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _workers: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _loop(self, seed: int) -> None:
        rng = random.Random(seed)
        while not self._stop.is_set():
            try:
                snapshot = self.client.snapshot()
                balances = read_balances(snapshot, TABLE, ACCOUNTS, scan=rng.random() < 0.5)
            except PercolatorError as exc:  # a failpoint in a resolution, a lock wait bound
                with self._lock:
                    self.errors.append(f"{type(exc).__name__}: {exc}")
                continue
            with self._lock:
                self.sums.append(sum(balances.values()))
                if sum(balances.values()) != TOTAL or len(balances) != ACCOUNTS:
                    self.bad.append((snapshot.read_ts, balances))

    def __enter__(self) -> Readers:
        for n in range(self.threads):
            thread = threading.Thread(target=self._loop, args=(n,), name=f"reader-{n}")
            thread.start()
            self._workers.append(thread)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._workers:
            thread.join()


def raw_balances(store: Store, read_ts: int) -> dict[bytes, int]:
    """Balances at ``read_ts`` decoded from a raw scan, without the engine's read path.

    Every cell ever written has a lock cell, so the lock family lists the accounts.  A
    cell's visible commit is the newer of the lock cell's latest commit and its newest write
    record, both at or below ``read_ts`` (the primary's commit point writes only the lock
    cell; its write record may come later); the value is the data version at that commit's
    ``start_ts``."""
    q = BALANCE.encode()
    out: dict[bytes, int] = {}
    for row, cells in store.scan(TABLE, LOCK):
        lock_cell = LockCell.decode(cells[q][1])
        candidates: list[tuple[int, int, Kind]] = []
        last = lock_cell.last_commit
        if last is not None and last.commit_ts <= read_ts:
            candidates.append((last.commit_ts, last.start_ts, last.kind))
        writes = store.read_row(TABLE, row, columns=[(WRITE, q)], before=read_ts + 1)
        for commit_ts, value in writes.get((WRITE, q), []):
            record = WriteRecord.decode(value)
            candidates.append((commit_ts, record.start_ts, record.kind))
        assert candidates, f"account {row!r} has no commit at or below {read_ts}"
        _, start_ts, kind = max(candidates)
        assert kind == Kind.PUT, f"account {row!r} was deleted"
        data = store.read_row(TABLE, row, columns=[(DATA, q)], before=start_ts + 1)
        versions = data.get((DATA, q), [])
        assert versions and versions[0][0] == start_ts, (
            f"account {row!r}: no data version at start_ts {start_ts} (found {versions[:1]})"
        )
        out[row] = int(versions[0][1])
    return out


def locks_left(store: Store) -> list[tuple[bytes, LockCell]]:
    """Lock cells of the bank table that still hold a lock (raw scan of family ``l``)."""
    left = []
    for row, cells in store.scan(TABLE, LOCK):
        for value in cells.values():
            cell = LockCell.decode(value[1])
            if cell.lock is not None:
                left.append((row, cell))
    return left


def check_final_state(client: percolator.Client) -> None:
    """One read pass (resolving every lock left), then the total through the engine and from
    the raw store at that read_ts, and no lock left."""
    snapshot = client.snapshot()
    balances = read_balances(snapshot, TABLE, ACCOUNTS, scan=False)
    assert sum(balances.values()) == TOTAL, f"final snapshot: {balances}"
    assert all(v >= 0 for v in balances.values()), f"negative balance: {balances}"
    raw = raw_balances(client.store, snapshot.read_ts)
    assert {k.decode(): v for k, v in raw.items()} == balances, (
        f"raw store disagrees with the engine at {snapshot.read_ts}: {raw} vs {balances}"
    )
    assert sum(raw.values()) == TOTAL
    assert locks_left(client.store) == []


# ------------------------------------------------------------------------------ threads


@pytest.mark.parametrize("faults", [False, True], ids=["clean", "failpoints"])
def test_bank_threads(store: Store, store_url: str, faults: bool) -> None:
    """Transfers from 4 threads, snapshot sums from 2 more, optionally with random
    failpoints raising between commit steps (lock TTL 300 ms: others resolve the locks)."""
    transfers = 8 if store_url.startswith("hbase") else 40
    client = percolator.connect(
        store, oracle=ManualOracle(), lock_ttl_ms=LOCK_TTL_MS, lock_wait_ms=10_000
    )
    create_accounts(client, TABLE, ACCOUNTS, TOTAL)
    failures: list[str] = []
    attempts: list[int] = []
    chaos = FailpointChaos(seed=11)
    deadline = time.monotonic() + 60

    def enough(done: int) -> bool:
        # With failpoints, run on (within a minute) until a failed transfer shows that
        # one fired: a fast store may finish the transfers before the first does.
        if done < transfers:
            return False
        return not faults or "FailpointError" in failures or time.monotonic() > deadline

    def transfer_loop(seed: int) -> None:
        rng = random.Random(seed)
        done = 0
        while not enough(done):
            try:
                transfer(client, TABLE, ACCOUNTS, rng, max_attempts=50)
            except PercolatorError as exc:  # a failpoint's error, or retries exhausted
                failures.append(type(exc).__name__)
            done += 1
            attempts.append(1)

    with Readers(client) as readers:
        with chaos if faults else contextlib.nullcontext():
            threads = [threading.Thread(target=transfer_loop, args=(n,)) for n in range(4)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        time.sleep(LOCK_TTL_MS / 1000)  # let the readers meet whatever the failpoints left
    assert readers.bad == [], f"snapshot sums other than {TOTAL}: {readers.bad[:3]}"
    assert len(readers.sums) >= 2, "the readers never completed a read"
    # A reader may only fail where a failpoint fired in the resolution it ran.
    assert all(e.startswith("FailpointError") for e in readers.errors), readers.errors[:3]
    assert len(failures) < len(attempts), "no transfer committed"
    if faults:
        assert "FailpointError" in failures, f"no failpoint fired in {len(attempts)} transfers"
    check_final_state(client)
    client.close()


# ------------------------------------------------------------------------------ processes


def spawn(
    url: str, out: Path, seed: int, transfers: int, failpoint: str = ""
) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env.pop("PERCOLATOR_FAILPOINTS", None)
    if failpoint:
        env["PERCOLATOR_FAILPOINTS"] = failpoint
    args = [
        sys.executable,
        str(WORKER),
        "bank",
        url,
        f"--table={TABLE}",
        f"--accounts={ACCOUNTS}",
        f"--total={TOTAL}",
        f"--seed={seed}",
        f"--transfers={transfers}",
        f"--lock-ttl-ms={LOCK_TTL_MS}",
    ]
    with open(out, "ab") as sink:
        return subprocess.Popen(args, stdout=sink, stderr=subprocess.STDOUT, env=env, cwd=REPO)


def worker_lines(out: Path) -> list[dict[str, object]]:
    lines = []
    for line in out.read_text().splitlines():
        if line.startswith("{"):
            lines.append(json.loads(line))
    return lines


def test_bank_processes(shared_store_url: str, tmp_path: Path) -> None:
    """Three worker processes transfer and sum snapshots on one store while this process
    sums snapshots too; every sum is the total, and so is the final raw state."""
    hbase = shared_store_url.startswith("hbase")
    transfers = 10 if hbase else 40
    client = percolator.connect(shared_store_url, lock_ttl_ms=LOCK_TTL_MS, lock_wait_ms=10_000)
    create_accounts(client, TABLE, ACCOUNTS, TOTAL)
    outs = [tmp_path / f"worker{n}.out" for n in range(3)]
    with Readers(client, threads=1) as readers:
        procs = [
            spawn(shared_store_url, out, seed=n, transfers=transfers) for n, out in enumerate(outs)
        ]
        codes = [p.wait(timeout=120) for p in procs]
    for out, code in zip(outs, codes, strict=True):
        assert code == 0, f"worker failed ({code}):\n{out.read_text()[-3000:]}"
        summary = worker_lines(out)[-1]["summary"]
        assert isinstance(summary, dict)
        assert summary["bad_reads"] == 0 and summary["reads"] > 0
        assert summary["outcomes"].get("committed", 0) > 0, summary
    assert readers.bad == [], f"snapshot sums other than {TOTAL}: {readers.bad[:3]}"
    assert readers.sums, "the reader never completed a read"
    assert readers.errors == []
    check_final_state(client)
    client.close()


def test_bank_crashes(shared_store_url: str, tmp_path: Path) -> None:
    crash_run(shared_store_url, tmp_path, 4.0 if shared_store_url.startswith("hbase") else 5.0)


@pytest.mark.slow
def test_bank_crashes_soak(shared_store_url: str, tmp_path: Path) -> None:
    crash_run(shared_store_url, tmp_path, 60.0)


def crash_run(url: str, tmp_path: Path, duration_s: float) -> None:
    """Three workers transfer until killed: the test SIGKILLs worker 1 or 2 every 0.2-0.6 s
    and restarts it; worker 0 kills itself inside a commit through a ``count:N:crash``
    failpoint (at a different step each time) and is restarted too.  Snapshot sums in this
    process run all along.  After the lock TTL one read pass resolves whatever the dead
    left: the total is intact (engine and raw) and no lock is left."""
    rng = random.Random(20240601)
    client = percolator.connect(url, lock_ttl_ms=LOCK_TTL_MS, lock_wait_ms=20_000)
    create_accounts(client, TABLE, ACCOUNTS, TOTAL)
    crash_points = [
        "commit.after_primary",
        "prewrite.after_secondaries",
        "commit.primary_cas_applied",
        "commit.after_write_records",
    ]
    procs: dict[int, subprocess.Popen[bytes]] = {}
    started = 0
    killed = 0
    self_crashed = 0

    def start(slot: int) -> None:
        nonlocal started
        failpoint = ""
        if slot == 0:  # this slot always dies inside a commit, at a different step each time
            failpoint = (
                f"{crash_points[started % len(crash_points)]}=count:{rng.randint(1, 3)}:crash"
            )
        procs[slot] = spawn(
            url, tmp_path / f"slot{slot}.out", seed=1000 + started, transfers=0, failpoint=failpoint
        )
        started += 1

    try:
        with Readers(client, threads=1) as readers:
            for slot in range(3):
                start(slot)
            deadline = time.monotonic() + duration_s
            while time.monotonic() < deadline:
                time.sleep(rng.uniform(0.2, 0.6))
                for slot, proc in procs.items():
                    if proc.poll() is not None:  # died by its own crash failpoint
                        assert proc.returncode == -signal.SIGKILL, (
                            f"worker {slot} exited with {proc.returncode}:\n"
                            + (tmp_path / f"slot{slot}.out").read_text()[-3000:]
                        )
                        self_crashed += 1
                        start(slot)
                victim = rng.randrange(1, 3)  # slot 0 is left to its crash failpoint
                procs[victim].send_signal(signal.SIGKILL)
                procs[victim].wait()
                killed += 1
                start(victim)
            if self_crashed == 0:  # a slow start (HBase): wait for worker 0's crash, under load
                assert procs[0].wait(timeout=120) == -signal.SIGKILL, (
                    tmp_path / "slot0.out"
                ).read_text()[-3000:]
                self_crashed += 1
    finally:
        # Workers run transfers until killed; also when an assertion above failed, or they
        # would outlive the test.  The readers have stopped: what these kills leave is for
        # the final read pass.
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
    # Two last workers die in the middle of their first commit, so the final pass surely has
    # locks to resolve: one after the commit point (roll forward), one before (roll back).
    for n, point in enumerate(["commit.after_primary", "prewrite.after_secondaries"]):
        last = spawn(
            url,
            tmp_path / "last.out",
            seed=9000 + n,
            transfers=0,
            failpoint=f"{point}=count:1:crash",
        )
        assert last.wait(timeout=120) == -signal.SIGKILL, (tmp_path / "last.out").read_text()
    left_before = len(locks_left(client.store))
    assert left_before >= 1, "the crashed commits left no lock"
    time.sleep(LOCK_TTL_MS / 1000 + 0.1)
    check_final_state(client)
    for name in ["slot0", "slot1", "slot2", "last"]:
        for line in worker_lines(tmp_path / f"{name}.out"):
            assert "bad_read" not in line, f"worker {name} read a wrong total: {line}"
    assert readers.bad == [], f"snapshot sums other than {TOTAL}: {readers.bad[:3]}"
    assert readers.sums, "the reader never completed a read"
    assert readers.errors == []
    assert killed >= 3
    assert self_crashed >= 1, "no worker died inside a commit"
    print(
        f"crash run: {started} workers started, {killed} killed by the test, {self_crashed} "
        f"crashed inside a commit, {left_before} locks left before the final read pass, "
        f"{len(readers.sums)} snapshot sums checked"
    )
    client.close()

"""Crash matrix (target R3): a client killed with SIGKILL at every step of the commit
protocol leaves every transaction all-or-nothing once locks are resolved, and no lock behind.

Each trial runs the bank workload of ``tests/txn/_txn_client.py`` in subprocesses sharing one
store and one oracle (the local oracle persisted in the store).  One client runs with a
failpoint set to ``count:N:crash``: it commits some transfers, then kills itself in the middle
of a protocol step.  Optionally other clients run the same workload at the same time and
trip over its locks.  Afterwards the test process reads every cell (resolving what the dead
client left; its locks have a short TTL) and judges the store **from a raw scan**
(``tests/txn/raw_inspect.py``): no lock left, every transaction committed on all of its
cells or on none, the engine's reads equal to what the raw data shows, and the bank total
and every balance intact.  The attempt the crash interrupted must be committed if the
crash came after the commit point and rolled back if it came before.

Resolution steps are crashed too: a first client dies leaving locks, a second one dies while
resolving them (``resolve.*``), and a failed commit is crashed half-way through its own
rollback (``rollback.after_primary``).

The default run does one trial per failpoint on the embedded store (with one concurrent
client); ``slow`` does many, alone and with one or two concurrent clients.  On HBase
(``hbase``) one trial per failpoint, four of them in the default run and the rest under
``slow``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import pytest

import percolator
from percolator import failpoints
from tests.txn._txn_client import (
    ClientProcess,
    Report,
    Verdict,
    settle_and_judge,
    setup_bank,
)
from tests.txn.raw_inspect import COMMITTED, ROLLED_BACK

LOCK_TTL_MS = 500
ACCOUNTS = 4

# The kinds of trial (see run_trial).
COMMIT_PATH = "commit path"  # the crashing client dies while committing its own transfer
ROLLBACK = "rollback"  # a failed commit dies half-way through rolling itself back
RESOLVE = "resolve"  # a second client dies while resolving locks a first one left


@dataclass(frozen=True)
class Case:
    """How to crash at one failpoint, and what the crash must leave."""

    failpoint: str
    kind: str
    # The raw outcome of the attempt in flight when the (first) client died.
    expected: str
    # RESOLVE only: the failpoint that kills the first client, leaving its locks.
    victim_failpoint: str = ""


CASES = [
    Case("prewrite.before_primary", COMMIT_PATH, ROLLED_BACK),
    Case("prewrite.before_lock", COMMIT_PATH, ROLLED_BACK),
    Case("prewrite.after_primary", COMMIT_PATH, ROLLED_BACK),
    Case("prewrite.after_secondaries", COMMIT_PATH, ROLLED_BACK),
    Case("commit.before_notify", COMMIT_PATH, ROLLED_BACK),
    Case("commit.before_primary", COMMIT_PATH, ROLLED_BACK),
    Case("commit.primary_cas", COMMIT_PATH, ROLLED_BACK),
    # From here on the primary's compare-and-set (the commit point) went through.
    Case("commit.primary_cas_applied", COMMIT_PATH, COMMITTED),
    Case("commit.after_primary", COMMIT_PATH, COMMITTED),
    Case("commit.after_write_records", COMMIT_PATH, COMMITTED),
    Case("commit.after_secondaries", COMMIT_PATH, COMMITTED),
    Case("rollback.after_primary", ROLLBACK, ROLLED_BACK),
    # The victim died after its commit point: the resolver rolls it forward.
    Case("resolve.before_roll_forward", RESOLVE, COMMITTED, "commit.after_primary"),
    # The victim died before its commit point: the resolver rolls it back once expired.
    Case("resolve.before_roll_back", RESOLVE, ROLLED_BACK, "commit.before_primary"),
]
CASE_IDS = [c.failpoint for c in CASES]
TXN_PREFIXES = ("prewrite.", "commit.", "rollback.", "resolve.")


def test_every_transaction_failpoint_is_in_the_matrix() -> None:
    """A failpoint added on the transaction path must get a crash case (and a renamed one
    must not silently drop out of the matrix)."""
    on_txn_path = {p for p in failpoints.POINTS if p.startswith(TXN_PREFIXES)}
    assert on_txn_path == set(CASE_IDS)


# --------------------------------------------------------------------------- one trial


@dataclass
class TrialResult:
    verdict: Verdict
    crashed: Report
    victim: Report | None
    workers: list[Report]


def run_trial(
    store_url: str, case: Case, *, seed: int, workers: int, lock_ttl_ms: int = LOCK_TTL_MS
) -> TrialResult:
    """One crash at ``case.failpoint``, then settle and judge the store.  Raises
    AssertionError for any violation, naming the trial."""
    rng = random.Random(seed)
    if case.kind == RESOLVE:
        # Others would resolve the victim's locks first and the resolver might find none.
        workers = 0
    client = percolator.connect(store_url, oracle=None, lock_ttl_ms=lock_ttl_ms)
    try:
        setup_bank(client, ACCOUNTS)
        # Crash on the n-th hit: after some transfers went through (n > 1), or at once.
        n = rng.randint(1, 4)
        tag = f"s{seed}"
        victim: Report | None = None
        if case.kind == RESOLVE:
            # First client: dies on its n-th commit, leaving locks behind.
            victim = ClientProcess(
                store_url,
                f"victim{tag}",
                failpoints=f"{case.victim_failpoint}=count:{n}:crash",
                txns=n + 5,
                seed=rng.randrange(2**32),
                lock_ttl_ms=lock_ttl_ms,
            ).wait()
            assert victim.killed, f"the victim did not crash: {victim.describe()}"
            spec = f"{case.failpoint}=crash"
        elif case.kind == ROLLBACK:
            # The n-th commit fails just before its commit point and rolls back; the
            # rollback is killed after the primary, with the secondaries still locked.
            spec = f"commit.before_primary=count:{n}:raise;{case.failpoint}=crash"
        else:
            spec = f"{case.failpoint}=count:{n}:crash"
        others = [
            ClientProcess(
                store_url,
                f"worker{i}{tag}",
                txns=rng.randint(3, 8),
                seed=rng.randrange(2**32),
                lock_ttl_ms=lock_ttl_ms,
            )
            for i in range(workers)
        ]
        crasher = ClientProcess(
            store_url,
            f"crasher{tag}",
            failpoints=spec,
            txns=n + 10,
            seed=rng.randrange(2**32),
            lock_ttl_ms=lock_ttl_ms,
        )
        crashed = crasher.wait()
        worker_reports = [w.wait() for w in others]
        assert crashed.killed, f"{spec}: the client did not crash: {crashed.describe()}"
        for report in worker_reports:
            assert report.returncode == 0, f"a concurrent client failed: {report.describe()}"

        verdict = settle_and_judge(client, ACCOUNTS)

        in_flight = (victim or crashed).in_flight()
        assert in_flight is not None, f"no attempt was in flight: {crashed.describe()}"
        outcome = verdict.outcome_of(in_flight["marker"])
        expected = {case.expected}
        if case.failpoint == "commit.primary_cas_applied" and workers:
            # This failpoint fires after the compare-and-set whatever its result; a
            # concurrent client may have rolled a stalled transaction back before it.
            expected.add(ROLLED_BACK)
        assert outcome in expected, (
            f"{spec}: the attempt in flight ({in_flight['marker']}) is {outcome}, "
            f"expected {case.expected}"
        )
        if case.kind == RESOLVE:
            # The resolver died in its reads, before committing anything of its own.
            resolver_attempt = crashed.in_flight()
            assert resolver_attempt is not None and not crashed.committing(
                resolver_attempt["marker"]
            )
            assert verdict.outcome_of(resolver_attempt["marker"]) == ROLLED_BACK
        # What every client was told about every finished attempt is what the store holds.
        for report in [crashed, *worker_reports, *([victim] if victim else [])]:
            verdict.check_reports(report.events)
        return TrialResult(verdict, crashed, victim, worker_reports)
    finally:
        client.close()


# --------------------------------------------------------------------------- stores


# --------------------------------------------------------------------------- the matrix


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_crash_leaves_all_or_nothing(embedded_url: str, case: Case) -> None:
    # One concurrent client: it meets the dead client's locks while they are fresh.
    run_trial(embedded_url, case, seed=1, workers=1)


# On HBase every trial creates and drops its tables (seconds each): the default run covers
# a step before, at and after the commit point and two resolutions, ``slow`` all of them.
HBASE_QUICK = {
    "commit.primary_cas",
    "commit.primary_cas_applied",
    "rollback.after_primary",
    "resolve.before_roll_back",
}


@pytest.mark.hbase
@pytest.mark.parametrize(
    "case",
    [
        pytest.param(
            c, id=c.failpoint, marks=[] if c.failpoint in HBASE_QUICK else pytest.mark.slow
        )
        for c in CASES
    ],
)
def test_crash_leaves_all_or_nothing_on_hbase(hbase_store_url: str, case: Case) -> None:
    run_trial(hbase_store_url, case, seed=2, workers=0 if case.failpoint in HBASE_QUICK else 1)


SLOW_TRIALS = 8


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_crash_matrix_many_trials(tmp_path: Path, case: Case) -> None:
    for trial in range(SLOW_TRIALS):
        url = f"embedded:{tmp_path / f'trial{trial}'}"
        workers = trial % 3  # alone, with one and with two concurrent clients
        try:
            run_trial(url, case, seed=1000 + trial, workers=workers)
        except AssertionError as exc:
            raise AssertionError(f"trial {trial} (seed {1000 + trial}): {exc}") from exc

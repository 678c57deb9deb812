"""A committer that stops (SIGSTOP) in the middle of its commit for longer than its lock TTL
is rolled back by the clients that meet its locks; when it wakes up (SIGCONT) its commit
must fail and leave nothing behind.

* Paused at ``commit.before_primary`` (every cell prewritten, commit point not reached):
  other clients read and write the cells meanwhile; the woken commit reports
  :class:`TransactionAbortedError`, and the raw store shows no lock of it, no write record
  pointing at its ``start_ts`` and none of its data visible.
* Paused at ``prewrite.after_primary`` (only the primary locked): the primary is rolled back;
  the woken client goes on to prewrite its secondaries, whose locks now point at a
  rolled-back primary.  They must never become visible and must be resolved, whether the
  client cleans up itself or is killed right after prewriting them.
* Paused at ``commit.after_primary`` (committed, secondaries still locked): readers roll it
  forward and others commit on top; the woken committer finishes its secondaries late
  without disturbing the newer commits, and reports success.

Checks come from a raw scan of the store (``tests/txn/raw_inspect.py``).

A protocol-level test covers the race behind all this: a resolver that found a lock
expired must not roll it back if the holder's heartbeat extended it in the meantime.
"""

from __future__ import annotations

import signal
import time
from dataclasses import replace

import pytest

import percolator
from percolator.layout import LOCK
from percolator.protocol.resolve import TxnState
from percolator.records import LockCell, LockInfo
from percolator.store.memory import MemoryStore
from percolator.testing import Call, FaultyStore, ProtocolHarness
from percolator.timestamps import now_ms, physical_ms
from tests.txn._txn_client import (
    CELLS_PER_TRANSFER,
    ClientProcess,
    read_every_cell,
    settle_and_judge,
    setup_bank,
)
from tests.txn.raw_inspect import COMMITTED, ROLLED_BACK, read_all, transactions

# The heartbeat runs every TTL/3; the pause comes a few milliseconds after the first lock,
# so the process stops between two heartbeats, never inside one (a process stopped inside
# an embedded-store write would hold its write lock).
LOCK_TTL_MS = 600
ACCOUNTS = 4


def wait_until_expired(lock: LockInfo) -> None:
    """Sleep until ``lock`` has outlived its TTL (by a margin for clock granularity)."""
    remaining_ms = physical_ms(lock.start_ts) + lock.ttl_ms + 20 - now_ms()
    if remaining_ms > 0:
        time.sleep(remaining_ms / 1000)


def run_paused_commit(
    store_url: str,
    *,
    pause_at: str,
    crash_after_resume_at: str = "",
    concurrent_writers: bool = False,
) -> None:
    committed = pause_at == "commit.after_primary"
    expected = COMMITTED if committed else ROLLED_BACK
    client = percolator.connect(store_url, oracle=None, lock_ttl_ms=LOCK_TTL_MS)
    try:
        setup_bank(client, ACCOUNTS)
        spec = f"{pause_at}=pause"
        if crash_after_resume_at:
            spec += f";{crash_after_resume_at}=crash"
        # One transfer, one attempt: a failed commit is reported, not retried.
        paused = ClientProcess(
            store_url, "paused", failpoints=spec, txns=1, max_attempts=1, lock_ttl_ms=LOCK_TTL_MS
        )
        try:
            paused.wait_stopped()
            locks = [h for h in read_all(client.store) if h.lock_cell.lock is not None]
            assert locks, "the paused client holds no lock"
            first = locks[0].lock_cell.lock
            assert first is not None
            start_ts = first.start_ts
            assert {h.lock_cell.lock.start_ts for h in locks if h.lock_cell.lock} == {start_ts}
            expected_locks = {"prewrite.after_primary": 1, "commit.after_primary": 4}.get(
                pause_at, CELLS_PER_TRANSFER
            )
            assert len(locks) == expected_locks, [h.address for h in locks]

            wait_until_expired(first)
            if concurrent_writers:
                # Another client transfers money over the same accounts: it meets the
                # locks, resolves them and commits on top.
                writer = ClientProcess(store_url, "writer", txns=3, lock_ttl_ms=LOCK_TTL_MS)
                report = writer.wait()
                assert report.returncode == 0, report.describe()
                assert len(report.results("committed")) == 3, report.describe()
            read_every_cell(client)
            # The paused transaction is decided now, by its primary.
            view = transactions(read_all(client.store))[start_ts]
            assert view.outcome == expected, view.describe()
        finally:
            if paused.popen.poll() is None:
                paused.signal(signal.SIGCONT)
        resumed = paused.wait()

        if crash_after_resume_at:
            assert resumed.killed, resumed.describe()
        elif committed:
            assert resumed.returncode == 0, resumed.describe()
            assert [r["outcome"] for r in resumed.results()] == ["committed"], resumed.describe()
        else:
            assert resumed.returncode == 0, resumed.describe()
            errors = [r["error"] for r in resumed.results()]
            assert errors == ["TransactionAbortedError"], resumed.describe()

        verdict = settle_and_judge(client, ACCOUNTS)
        verdict.check_reports(resumed.events)
        view = verdict.views[start_ts]
        assert view.outcome == expected, view.describe()
        if committed:
            return
        assert not view.committed and not view.locked, view.describe()
        if pause_at == "prewrite.after_primary":
            # The woken client did prewrite its secondaries after its primary was rolled
            # back: that is the case this test is about.
            assert len(view.written) == CELLS_PER_TRANSFER, view.describe()
        by_address = {h.address: h for h in verdict.histories}
        for address in view.written:
            own = by_address[address].data_at(start_ts)
            assert own is not None
            assert by_address[address].visible_value() != own, address
            assert verdict.read_values[address] != own, address
    finally:
        client.close()


def let_a_heartbeat_land_first(store: FaultyStore) -> None:
    """Let the lock holder's heartbeat (a compare-and-set extending the TTL by a minute) reach
    the lock cell just before the first compare-and-set that removes a lock: the race between
    a committer waking up and a resolver that found it expired."""

    def removes_a_lock(call: Call) -> bool:
        return bool(call["family"] == LOCK and LockCell.decode(call["new"]).lock is None)

    def heartbeat(call: Call) -> None:
        cell = LockCell.decode(call["expected"])
        assert cell.lock is not None
        extended = cell.with_lock(replace(cell.lock, ttl_ms=cell.lock.ttl_ms + 60_000))
        args = (call["table"], call["row"], call["family"], call["qualifier"])
        assert store.inner.compare_and_set(*args, call["expected"], extended.encode())

    store.before("compare_and_set", heartbeat, when=removes_a_lock, times=1)


def test_resolver_respects_a_heartbeat_that_lands_before_its_rollback() -> None:
    """A resolver finds a primary lock expired and tries to roll it back; the holder's
    heartbeat extends the lock first, so the rollback's compare-and-set fails.  The lock is
    alive again: the resolver must look again (percolator/protocol/resolve.py says so), not
    roll back a transaction that just showed it is alive."""
    store = FaultyStore(MemoryStore())
    h = ProtocolHarness(store)
    h.must_prewrite([(b"k", "c", b"v")], primary=(b"k", "c"), start_ts=h.ts(10), ttl_ms=100)
    h.clock_ms = h.base_ms + 10 + 101  # past the first TTL, well within the extended one
    let_a_heartbeat_land_first(store)
    status = h.status((b"k", "c"), h.ts(10))
    assert status.state is TxnState.ALIVE, f"{status}; lock cell now {h.lock_cell(b'k', 'c')}"
    h.must_locked(b"k", "c", h.ts(10))


def test_paused_before_commit_point_is_aborted(embedded_url: str) -> None:
    run_paused_commit(embedded_url, pause_at="commit.before_primary", concurrent_writers=True)


def test_paused_after_primary_prewrite_cleans_up(embedded_url: str) -> None:
    run_paused_commit(embedded_url, pause_at="prewrite.after_primary")


def test_paused_after_commit_point_finishes_late(embedded_url: str) -> None:
    run_paused_commit(embedded_url, pause_at="commit.after_primary", concurrent_writers=True)


def test_paused_after_primary_prewrite_then_killed(embedded_url: str) -> None:
    run_paused_commit(
        embedded_url,
        pause_at="prewrite.after_primary",
        crash_after_resume_at="prewrite.after_secondaries",
    )


@pytest.mark.hbase
@pytest.mark.parametrize(
    ("pause_at", "crash_at", "writers"),
    [
        ("commit.before_primary", "", True),
        ("prewrite.after_primary", "prewrite.after_secondaries", False),
    ],
    ids=["before-commit-point", "after-primary-then-killed"],
)
def test_paused_client_on_hbase(
    hbase_store_url: str, pause_at: str, crash_at: str, writers: bool
) -> None:
    run_paused_commit(
        hbase_store_url,
        pause_at=pause_at,
        crash_after_resume_at=crash_at,
        concurrent_writers=writers,
    )

"""Lock cleanup (target P9): a lock left by a killed client is resolved within its TTL + 1 s
of the next read, and that read succeeds.

A client subprocess is stopped (failpoint action ``pause``) in the middle of its commit,
holding locks on every cell it writes, then killed with SIGKILL by the test, which notes the
moment.  A reader then reads every cell at once.  The time from the kill to the reader's
return must stay within the lock's TTL + 1 s; when the lock has already expired before the
read, or the dead transaction had passed its commit point, the read must not wait for the
TTL at all (within 1 s).  Afterwards the raw store must hold no lock and the dead
transaction must be all-or-nothing.

The bound is generous on purpose (a liveness check, not a benchmark: figures come from
``bench/``), but a reader that waited for its whole ``lock_wait_ms`` or backed off without
bound would fail it.
"""

from __future__ import annotations

import time

import pytest

import percolator
from percolator.timestamps import now_ms, physical_ms
from tests.txn._txn_client import (
    CELLS_PER_TRANSFER,
    ClientProcess,
    read_every_cell,
    settle_and_judge,
    setup_bank,
)
from tests.txn.raw_inspect import COMMITTED, ROLLED_BACK, locked_cells, read_all

LOCK_TTL_MS = 500
ACCOUNTS = 4
SLACK_S = 1.0


def kill_holding_locks(
    store_url: str, pause_at: str, client: percolator.Client
) -> tuple[int, float]:
    """Run one transfer that stops at ``pause_at``, check it holds its locks, SIGKILL it.
    Returns its ``start_ts`` and the monotonic time of the kill."""
    holder = ClientProcess(
        store_url, "holder", failpoints=f"{pause_at}=pause", txns=1, lock_ttl_ms=LOCK_TTL_MS
    )
    try:
        holder.wait_stopped()
        locks = [h.lock_cell.lock for h in locked_cells(read_all(client.store))]
        assert locks and all(lock is not None for lock in locks)
        start_ts = {lock.start_ts for lock in locks if lock is not None}
        assert len(start_ts) == 1, start_ts
        holder.kill()
        killed_at = time.monotonic()
    finally:
        holder.kill()
    report = holder.wait()
    assert report.killed, report.describe()
    return start_ts.pop(), killed_at


def run_cleanup(store_url: str, *, pause_at: str, read_after_expiry: bool) -> float:
    """Kill a lock holder, read every cell; returns seconds from the kill to the read's end."""
    client = percolator.connect(
        store_url, oracle=None, lock_ttl_ms=LOCK_TTL_MS, lock_wait_ms=10_000
    )
    try:
        setup_bank(client, ACCOUNTS)
        start_ts, killed_at = kill_holding_locks(store_url, pause_at, client)
        locks = [h.lock_cell.lock for h in locked_cells(read_all(client.store))]
        expected_locks = CELLS_PER_TRANSFER - (pause_at == "commit.after_primary")
        assert len(locks) == expected_locks
        ttl_ms = max(lock.ttl_ms for lock in locks if lock is not None)
        read_from = killed_at
        if read_after_expiry:
            expires_ms = physical_ms(start_ts) + ttl_ms
            time.sleep(max(0, expires_ms + 10 - now_ms()) / 1000)
            read_from = time.monotonic()
        values = read_every_cell(client)  # must not raise
        done = time.monotonic()
        elapsed = done - killed_at

        assert not locked_cells(read_all(client.store)), "the read left locks behind"
        verdict = settle_and_judge(client, ACCOUNTS)
        committed = pause_at == "commit.after_primary"
        outcome = verdict.views[start_ts].outcome
        assert outcome == (COMMITTED if committed else ROLLED_BACK), outcome
        assert values == verdict.read_values

        if read_after_expiry or committed:
            since_read = done - read_from
            assert since_read <= SLACK_S, f"the read took {since_read:.3f} s; nothing to wait for"
        assert elapsed <= ttl_ms / 1000 + SLACK_S, (
            f"locks of a killed client (TTL {ttl_ms} ms) were resolved {elapsed:.3f} s "
            "after the kill"
        )
        return elapsed
    finally:
        client.close()


CASES = [
    # Killed before the commit point: the reader waits out the TTL, then rolls back.
    pytest.param("commit.before_primary", False, id="before-commit-point"),
    # Same, but the next read comes after the TTL: nothing to wait for.
    pytest.param("commit.before_primary", True, id="read-after-expiry"),
    # Killed after the commit point: the reader rolls forward at once.
    pytest.param("commit.after_primary", False, id="after-commit-point"),
]


@pytest.mark.parametrize(("pause_at", "read_after_expiry"), CASES)
def test_dead_client_lock_is_resolved_within_ttl(
    embedded_url: str, pause_at: str, read_after_expiry: bool
) -> None:
    run_cleanup(embedded_url, pause_at=pause_at, read_after_expiry=read_after_expiry)


@pytest.mark.hbase
@pytest.mark.parametrize(
    ("pause_at", "read_after_expiry"),
    # Creating and dropping HBase tables costs seconds per test: one case by default.
    [CASES[0], *(pytest.param(*c.values, id=c.id, marks=pytest.mark.slow) for c in CASES[1:])],
)
def test_dead_client_lock_is_resolved_within_ttl_on_hbase(
    hbase_store_url: str, pause_at: str, read_after_expiry: bool
) -> None:
    run_cleanup(hbase_store_url, pause_at=pause_at, read_after_expiry=read_after_expiry)

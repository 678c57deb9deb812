"""Scenario tests of the lock cell's transitions (percolator/protocol/lock.py) and of the
commit point built on them (percolator/protocol/commit.py), as protocol scripts on every
backend, plus a check that nothing else in the product compare-and-sets the lock family.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from percolator import failpoints
from percolator.errors import (
    StoreUnavailableError,
    TransactionAbortedError,
    UndeterminedCommitError,
)
from percolator.protocol.cells import fetch_cells
from percolator.protocol.commit import commit_primary
from percolator.protocol.lock import commit_lock, extend_lock, place_lock, roll_back_lock
from percolator.protocol.resolve import TxnState
from percolator.records import Kind, LockInfo
from percolator.store import Store
from percolator.store.memory import MemoryStore
from percolator.testing import ProtocolHarness
from percolator.timestamps import physical_ms

K = b"k"
C = "c"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def h(store: Store) -> ProtocolHarness:
    return ProtocolHarness(store)


@pytest.fixture
def no_failpoints() -> Iterator[None]:
    failpoints.disable()
    yield
    failpoints.disable()


def lock_bytes(h: ProtocolHarness, row: bytes = K, column: str = C) -> bytes:
    key = h.key(row, column)
    raw = fetch_cells(h.store, [key], before=None, with_data=False)[key]
    assert raw.lock_bytes is not None, f"{key} has no lock cell"
    return raw.lock_bytes


def lock_of(h: ProtocolHarness, start_ts: int, ttl_ms: int = 3000) -> LockInfo:
    return LockInfo(start_ts, ttl_ms, Kind.PUT, h.table, K, C)


# --------------------------------------------------------------------------- place


def test_place_lock_from_the_bytes_read(h: ProtocolHarness) -> None:
    key = h.key(K, C)
    raw = fetch_cells(h.store, [key], before=None, with_data=False)[key]
    new = place_lock(h.store, raw, lock_of(h, h.ts(10)))
    assert new is not None and new == lock_bytes(h)
    h.must_locked(K, C, h.ts(10))
    # The same read again is stale now: a second place from it does not apply.
    assert place_lock(h.store, raw, lock_of(h, h.ts(11))) is None
    h.must_locked(K, C, h.ts(10))


def test_place_lock_keeps_the_latest_commit(h: ProtocolHarness) -> None:
    h.must_prewrite([(K, C, b"a")], primary=(K, C), start_ts=h.ts(10))
    h.must_commit_primary((K, C), h.ts(10), h.ts(11))
    h.must_prewrite([(K, C, b"b")], primary=(K, C), start_ts=h.ts(20))
    cell = h.lock_cell(K, C)
    assert cell.last_commit is not None and cell.last_commit.commit_ts == h.ts(11)
    h.must_get(K, C, h.ts(15), b"a")


# --------------------------------------------------------------------------- extend


def test_extend_lock_moves_the_expiry_and_nothing_else(h: ProtocolHarness) -> None:
    h.must_prewrite([(K, C, b"a")], primary=(K, C), start_ts=h.ts(10), ttl_ms=100)
    before = h.must_locked(K, C, h.ts(10))
    new = extend_lock(h.store, h.key(K, C), lock_bytes(h), 60_000)
    assert new is not None and new == lock_bytes(h)
    after = h.must_locked(K, C, h.ts(10))
    assert after.ttl_ms == 60_000 and after.expires_at_ms > before.expires_at_ms
    assert (after.kind, after.primary_row, after.primary_column) == (
        before.kind,
        before.primary_row,
        before.primary_column,
    )
    # Past the first expiry, within the extended one: the transaction is alive.
    h.clock_ms = before.expires_at_ms + 1
    assert h.status((K, C), h.ts(10)).state is TxnState.ALIVE
    h.must_locked(K, C, h.ts(10))


def test_extend_lock_fails_once_rolled_back(h: ProtocolHarness) -> None:
    h.must_prewrite([(K, C, b"a")], primary=(K, C), start_ts=h.ts(10), ttl_ms=100)
    held = lock_bytes(h)
    h.clock_ms = h.base_ms + 500
    h.must_status((K, C), h.ts(10), TxnState.ROLLED_BACK)
    # The heartbeat of the paused holder wakes up: its compare-and-set must not revive it.
    assert extend_lock(h.store, h.key(K, C), held, 60_000) is None
    h.must_unlocked(K, C)


# --------------------------------------------------------------------------- commit


def test_commit_lock_needs_the_current_bytes(h: ProtocolHarness) -> None:
    h.must_prewrite([(K, C, b"a")], primary=(K, C), start_ts=h.ts(10))
    first = lock_bytes(h)
    extended = extend_lock(h.store, h.key(K, C), first, 10_000)
    assert extended is not None
    # Bytes from before the heartbeat are stale: the commit point must use the new ones.
    assert not commit_lock(h.store, h.key(K, C), first, h.ts(11))
    h.must_locked(K, C, h.ts(10))
    assert commit_lock(h.store, h.key(K, C), extended, h.ts(11))
    h.must_unlocked(K, C)
    h.must_status((K, C), h.ts(10), TxnState.COMMITTED, commit_ts=h.ts(11))
    h.must_get(K, C, h.ts(12), b"a")


def test_transitions_refuse_bytes_without_a_lock(h: ProtocolHarness) -> None:
    h.must_prewrite([(K, C, b"a")], primary=(K, C), start_ts=h.ts(10))
    h.must_commit_primary((K, C), h.ts(10), h.ts(11))
    committed = lock_bytes(h)
    key = h.key(K, C)
    with pytest.raises(ValueError, match="no lock"):
        commit_lock(h.store, key, committed, h.ts(12))
    with pytest.raises(ValueError, match="no lock"):
        roll_back_lock(h.store, key, committed)
    with pytest.raises(ValueError, match="no lock"):
        extend_lock(h.store, key, committed, 1000)
    assert lock_bytes(h) == committed


# --------------------------------------------------------------------------- roll back


def test_roll_back_lock_leaves_a_marker_so_a_delayed_prewrite_fails(h: ProtocolHarness) -> None:
    h.must_prewrite([(K, C, b"a")], primary=(K, C), start_ts=h.ts(10))
    h.must_commit_primary((K, C), h.ts(10), h.ts(11))
    key = h.key(K, C)
    read_before_lock = fetch_cells(h.store, [key], before=None, with_data=False)[key]
    assert place_lock(h.store, read_before_lock, lock_of(h, h.ts(20))) is not None
    assert roll_back_lock(h.store, key, lock_bytes(h))
    cell = h.lock_cell(K, C)
    assert cell.lock is None and cell.rolled_back == h.ts(20)
    assert cell.last_commit is not None and cell.last_commit.commit_ts == h.ts(11)
    # A delayed re-send of T20's prewrite expects the bytes it read before locking: they are
    # gone (no ABA), and the prewrite action sees its own rollback and aborts.
    assert place_lock(h.store, read_before_lock, lock_of(h, h.ts(20))) is None
    with pytest.raises(TransactionAbortedError):
        h.prewrite([(K, C, b"b")], primary=(K, C), start_ts=h.ts(20))
    h.must_get(K, C, h.ts(30), b"a")


def test_roll_back_lock_fails_after_a_heartbeat(h: ProtocolHarness) -> None:
    h.must_prewrite([(K, C, b"a")], primary=(K, C), start_ts=h.ts(10), ttl_ms=100)
    seen_by_resolver = lock_bytes(h)
    assert extend_lock(h.store, h.key(K, C), seen_by_resolver, 60_000) is not None
    assert not roll_back_lock(h.store, h.key(K, C), seen_by_resolver)
    h.must_locked(K, C, h.ts(10))


# --------------------------------------------------------------------------- commit point


def test_commit_primary_commits_and_says_so_at_once(h: ProtocolHarness) -> None:
    h.must_prewrite([(K, C, b"a")], primary=(K, C), start_ts=h.ts(10))
    calls: list[str] = []
    commit_primary(
        h.store,
        h.key(K, C),
        h.ts(10),
        h.ts(11),
        lock_bytes(h),
        on_committed=lambda: calls.append("committed"),
    )
    assert calls == ["committed"]
    h.must_status((K, C), h.ts(10), TxnState.COMMITTED, commit_ts=h.ts(11))


def test_commit_primary_after_a_rollback_aborts(h: ProtocolHarness) -> None:
    h.must_prewrite([(K, C, b"a")], primary=(K, C), start_ts=h.ts(10), ttl_ms=100)
    held = lock_bytes(h)
    h.clock_ms = h.base_ms + 500
    h.must_status((K, C), h.ts(10), TxnState.ROLLED_BACK)
    calls: list[str] = []
    with pytest.raises(TransactionAbortedError, match="rolled back by another client"):
        commit_primary(
            h.store, h.key(K, C), h.ts(10), h.ts(20), held, on_committed=lambda: calls.append("x")
        )
    assert calls == []
    h.must_get(K, C, h.ts(30), None)


@pytest.mark.parametrize(
    ("point", "applied"), [("commit.primary_cas", False), ("commit.primary_cas_applied", True)]
)
def test_commit_primary_with_an_unknown_outcome_is_undetermined(
    h: ProtocolHarness, no_failpoints: None, point: str, applied: bool
) -> None:
    h.must_prewrite([(K, C, b"a")], primary=(K, C), start_ts=h.ts(10))
    calls: list[str] = []
    failpoints.enable(point, "unavailable")
    with pytest.raises(UndeterminedCommitError, match="unknown outcome"):
        commit_primary(
            h.store,
            h.key(K, C),
            h.ts(10),
            h.ts(11),
            lock_bytes(h),
            on_committed=lambda: calls.append("committed"),
        )
    failpoints.disable()
    assert calls == (["committed"] if applied else [])
    if applied:
        h.must_get(K, C, h.ts(12), b"a")
    else:  # not sent: the lock is still there, for its holder or a resolver to settle
        h.must_locked(K, C, h.ts(10))


class _BrokenCas(MemoryStore):
    """Every compare-and-set fails with a broken connection after it was applied."""

    def compare_and_set(
        self,
        table: str,
        row: bytes,
        family: str,
        qualifier: bytes,
        expected: bytes | None,
        new: bytes,
    ) -> bool:
        super().compare_and_set(table, row, family, qualifier, expected, new)
        raise StoreUnavailableError("connection reset after the request was sent")


def test_commit_primary_broken_by_the_store_is_undetermined() -> None:
    store = _BrokenCas()
    h = ProtocolHarness(store)
    h.must_prewrite([(K, C, b"a")], primary=(K, C), start_ts=h.ts(10))
    with pytest.raises(UndeterminedCommitError):
        commit_primary(store, h.key(K, C), h.ts(10), h.ts(11), lock_bytes(h))
    h.must_get(K, C, h.ts(12), b"a")  # it was applied: the read shows the truth


# --------------------------------------------------------------------------- expiry


def test_lock_expiry_counts_from_start_ts() -> None:
    start_ts = ProtocolHarness(MemoryStore()).ts(0)
    start_ms = physical_ms(start_ts)
    lock = LockInfo(start_ts, 250, Kind.PUT, "t", K, C)
    assert lock.expires_at_ms == start_ms + 250
    # A commit 1 s after start_ts with a 3 s lifetime: the lock lives until 3 s from now.
    ttl = LockInfo.ttl_from(start_ts, start_ms + 1000, 3000)
    assert ttl == 4000
    assert LockInfo(start_ts, ttl, Kind.PUT, "t", K, C).expires_at_ms == start_ms + 4000
    # A local clock behind start_ts adds nothing (never a negative age).
    assert LockInfo.ttl_from(start_ts, start_ms - 500, 3000) == 3000


# --------------------------------------------------------------------------- ownership


def _lock_cas_calls(path: Path) -> list[int]:
    """Lines of ``path`` with a ``compare_and_set(...)`` call, or a ``CompareAndSet(...)``
    item of a batch, naming the LOCK family."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    lines = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and (
                (isinstance(node.func, ast.Attribute) and node.func.attr == "compare_and_set")
                or (isinstance(node.func, ast.Name) and node.func.id == "CompareAndSet")
            )
            and any(
                isinstance(arg, ast.Name) and arg.id == "LOCK"
                for arg in [*node.args, *(k.value for k in node.keywords)]
            )
        ):
            lines.append(node.lineno)
    return lines


def test_only_the_lock_module_compare_and_sets_the_lock_family() -> None:
    owner = ROOT / "percolator" / "protocol" / "lock.py"
    # _cas (one compare-and-set, or one carrying puts) and _cas_many.
    assert len(_lock_cas_calls(owner)) == 3, "the check no longer recognises lock.py's calls"
    offenders = {}
    for package in ("percolator", "observers", "oracle", "spark_jobs"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if path != owner and (found := _lock_cas_calls(path)):
                offenders[str(path.relative_to(ROOT))] = found
    assert offenders == {}, f"lock cells changed outside percolator/protocol/lock.py: {offenders}"

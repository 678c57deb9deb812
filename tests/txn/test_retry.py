"""The backoff helper and the one rule for re-running transactions (percolator/retry.py)."""

from __future__ import annotations

import random
import threading

import pytest

import percolator
from percolator import retry
from percolator.errors import (
    ConflictError,
    InvalidArgumentError,
    OracleUnavailableError,
    UndeterminedCommitError,
)
from percolator.retry import Backoff, jittered, retry_transaction
from percolator.testing import ManualOracle
from percolator.transaction import Transaction, TxnStatus


@pytest.fixture
def client() -> percolator.Client:
    c = percolator.connect("memory:", oracle=ManualOracle())
    c.create_table("t")
    return c


@pytest.fixture
def slept(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Sleeps of percolator.retry, recorded instead of slept."""
    calls: list[float] = []
    monkeypatch.setattr(retry.time, "sleep", calls.append)
    return calls


# --------------------------------------------------------------------------- Backoff


def test_backoff_grows_to_its_bound_and_resets() -> None:
    b = Backoff(0.01, 0.05, jitter=0)
    assert [b.next() for _ in range(5)] == pytest.approx([0.01, 0.02, 0.04, 0.05, 0.05])
    assert b.attempts == 5
    b.reset()
    assert b.next() == pytest.approx(0.01)
    assert Backoff(0.005, multiplier=4, jitter=0).delay(3) == pytest.approx(0.32)
    assert Backoff(1.0, 5.0, jitter=0).delay(10_000) == 5.0  # no overflow


def test_backoff_jitter_stays_within_its_band() -> None:
    rng = random.Random(7)
    b = Backoff(0.1, 0.1, rng=rng)
    delays = [b.next() for _ in range(200)]
    assert all(0.05 <= d < 0.15 for d in delays)
    assert len(set(delays)) > 100, "jitter must spread the delays"
    assert 0.5 <= jittered(1.0, rng=rng) < 1.5


def test_backoff_sleep_stops_at_the_deadline(slept: list[float]) -> None:
    b = Backoff(10.0, jitter=0)
    b.sleep(deadline=retry.time.monotonic() + 0.5)
    assert len(slept) == 1 and 0 <= slept[0] <= 0.5


def test_backoff_wait_returns_when_stopped() -> None:
    stop = threading.Event()
    stop.set()
    assert Backoff(60.0).wait(stop) is True


def test_backoff_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        Backoff(0.1, multiplier=0.5)
    with pytest.raises(ValueError):
        Backoff(0.1, jitter=2)


# --------------------------------------------------------------------------- retry_transaction


def test_a_conflict_reruns_the_whole_function_in_a_new_transaction(
    client: percolator.Client, slept: list[float]
) -> None:
    seen: list[int] = []

    def fn(txn: Transaction) -> str:
        seen.append(txn.start_ts)
        txn.set("t", b"k", "c", b"v")
        if len(seen) < 3:
            raise ConflictError("injected", table="t")
        return "done"

    result = retry_transaction(client.transaction, fn, attempts=5, backoff=Backoff(0.001))
    assert result == "done"
    assert len(seen) == 3 and len(set(seen)) == 3, "each attempt needs its own start_ts"
    assert len(slept) == 2
    assert client.snapshot().get("t", b"k", "c") == b"v"


def test_an_undetermined_commit_is_never_retried(
    client: percolator.Client, slept: list[float]
) -> None:
    calls = 0

    def fn(txn: Transaction) -> None:
        nonlocal calls
        calls += 1
        raise UndeterminedCommitError("the commit point's outcome is unknown")

    with pytest.raises(UndeterminedCommitError):
        retry_transaction(client.transaction, fn, attempts=5, backoff=Backoff(0.001))
    assert calls == 1 and slept == []


def test_the_last_retryable_error_propagates(client: percolator.Client) -> None:
    txns: list[Transaction] = []
    retried: list[int] = []

    def fn(txn: Transaction) -> None:
        txns.append(txn)
        txn.set("t", b"k", "c", b"v")
        raise ConflictError(f"attempt {len(txns)}")

    with pytest.raises(ConflictError, match="attempt 3"):
        retry_transaction(
            client.transaction,
            fn,
            attempts=3,
            backoff=Backoff(0.0001),
            on_retry=lambda n, exc: retried.append(n),
        )
    assert retried == [1, 2]
    assert all(t.status is TxnStatus.ROLLED_BACK for t in txns)
    assert client.snapshot().get("t", b"k", "c") is None


def test_other_errors_propagate_at_once(client: percolator.Client) -> None:
    txns: list[Transaction] = []

    def fn(txn: Transaction) -> None:
        txns.append(txn)
        raise KeyError("user bug")

    with pytest.raises(KeyError):
        retry_transaction(client.transaction, fn, attempts=3, backoff=Backoff(0.001))
    assert len(txns) == 1 and txns[0].status is TxnStatus.ROLLED_BACK


def test_a_transaction_that_cannot_begin_is_not_retried(slept: list[float]) -> None:
    calls = 0

    def begin() -> Transaction:
        nonlocal calls
        calls += 1
        raise OracleUnavailableError("no oracle")

    with pytest.raises(OracleUnavailableError):
        retry_transaction(begin, lambda txn: None, attempts=3, backoff=Backoff(0.001))
    assert calls == 1 and slept == []


def test_a_function_that_commits_itself_is_not_committed_twice(
    client: percolator.Client,
) -> None:
    def fn(txn: Transaction) -> int | None:
        txn.set("t", b"k", "c", b"v")
        return txn.commit()

    commit_ts = retry_transaction(client.transaction, fn, attempts=2, backoff=Backoff(0.001))
    assert commit_ts is not None
    assert client.snapshot().get_with_commit_ts("t", b"k", "c") == (b"v", commit_ts)


def test_attempts_must_be_positive(client: percolator.Client) -> None:
    with pytest.raises(ValueError):
        retry_transaction(client.transaction, lambda t: None, attempts=0, backoff=Backoff(0))
    with pytest.raises(InvalidArgumentError):
        client.run(lambda t: None, max_attempts=0)

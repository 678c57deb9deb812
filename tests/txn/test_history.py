"""Isolation evidence from list-append histories (percolator/testing/history.py).

1. The checker on hand-written histories: every anomaly kind is found, write skew is
   reported as allowed, clean histories pass.
2. Generated histories on the real engine: threads (memory, embedded, HBase) and processes
   sharing one store (embedded, HBase) run random read/append transactions on a few hot keys,
   with and without failpoints raising between commit steps and with short lock TTLs, so
   that other clients resolve the locks.  Zero anomalies, in the raw history (undetermined
   outcomes left to the checker) and after settling them from the store.
3. Planted bugs, each monkeypatched into the engine for one test: the checker must find
   each one (so it is not toothless), and the same scenario without the bug must pass.
4. Engine bugs the checker found, as tests that fail until they are fixed.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

import percolator
from percolator import failpoints
from percolator.committer import CommitResult, Committer
from percolator.errors import InvalidArgumentError, PercolatorError, UndeterminedCommitError
from percolator.protocol import prewrite as prewrite_module
from percolator.protocol import read as read_module
from percolator.protocol.cells import CellKey, RawCell, fetch_cells
from percolator.protocol.commit import commit_cell, write_record_puts
from percolator.protocol.resolve import LockResolver
from percolator.records import LockCell
from percolator.store import Store
from percolator.testing import ManualOracle, history
from percolator.testing.history import (
    ABORTED,
    COMMITTED,
    UNDETERMINED,
    Append,
    CheckResult,
    Read,
    Recorder,
    Txn,
    check,
    decode_list,
    encode_list,
)
from tests.txn._bank_worker import FailpointChaos

WORKER = Path(__file__).with_name("_bank_worker.py")
REPO = Path(__file__).resolve().parents[2]
TABLE = "hist"
COLUMN = "v"
KEYS = ["k1", "k2", "k3", "k4"]
LOCK_TTL_MS = 100


@pytest.fixture(autouse=True)
def no_failpoints() -> Iterator[None]:
    failpoints.disable()
    yield
    failpoints.disable()


# ============================================================================ 1. the checker


def r(key: str, *values: int) -> Read:
    return Read(key, values)


def a(key: str, element: int) -> Append:
    return Append(key, element)


def t(
    txn_id: int,
    *ops: Read | Append,
    outcome: str = COMMITTED,
    s: int | None = None,
    c: int | None = None,
) -> Txn:
    return Txn(txn_id, ops, outcome, s, c)


# (name, history, the anomaly kinds it must show: exactly these)
HAND_WRITTEN: list[tuple[str, list[Txn], set[str]]] = [
    (
        "aborted read (G1a)",
        [t(1, r("x"), a("x", 1), outcome=ABORTED), t(2, r("x", 1))],
        {history.ABORTED_READ},
    ),
    (
        "intermediate read (G1b)",
        [t(1, a("x", 1), a("x", 2)), t(2, r("x", 1))],
        {history.INTERMEDIATE_READ},
    ),
    (
        "circular information flow (G1c)",
        [t(1, a("x", 1), r("y", 2)), t(2, a("y", 2), r("x", 1)), t(3, r("x", 1), r("y", 2))],
        {history.G1C},
    ),
    (
        "write cycle (G0)",
        [t(1, a("x", 1), a("y", 4)), t(2, a("x", 2), a("y", 3)), t(3, r("x", 1, 2), r("y", 3, 4))],
        {history.G0},
    ),
    (
        # T2 sees T1's write of y but the state of x before T1's write of x.
        "fractured read",
        [
            t(0, a("x", 1), a("y", 2)),
            t(1, r("x", 1), a("x", 3), r("y", 2), a("y", 4)),
            t(2, r("x", 1), r("y", 2, 4)),
            t(3, r("x", 1, 3), r("y", 2, 4)),
        ],
        {history.FRACTURED_READ, history.G_SINGLE},
    ),
    (
        # Read skew through a third transaction: T2 misses T5's x, sees T6's y, and T6 saw T5.
        "read skew (G-single)",
        [
            t(0, a("x", 1), a("y", 2)),
            t(5, r("x", 1), a("x", 3)),
            t(6, r("x", 1, 3), r("y", 2), a("y", 4)),
            t(2, r("x", 1), r("y", 2, 4)),
        ],
        {history.G_SINGLE},
    ),
    (
        # Both wrote back a list that is not a prefix of the other: the order forks.
        "lost update (same read, both appended)",
        [t(1, r("x"), a("x", 1)), t(2, r("x"), a("x", 2)), t(3, r("x", 2))],
        {history.LOST_UPDATE, history.INCOMPATIBLE_ORDER},
    ),
    (
        "lost update (append missing, a later commit present)",
        [t(1, a("x", 1), s=10, c=11), t(2, a("x", 2), s=12, c=13), t(3, r("x", 2), s=20)],
        {history.LOST_UPDATE},
    ),
    (
        "concurrent writers both committed",
        [t(1, a("x", 1), s=10, c=12), t(2, a("x", 2), s=11, c=13), t(3, r("x", 1, 2), s=20)],
        {history.CONCURRENT_WRITE},
    ),
    (
        "long fork",
        [t(1, a("x", 1)), t(2, a("y", 2)), t(3, r("x", 1), r("y")), t(4, r("x"), r("y", 2))],
        {history.LONG_FORK},
    ),
    (
        "incompatible orders",
        [t(1, a("x", 1)), t(2, a("x", 2)), t(3, r("x", 1)), t(4, r("x", 2))],
        {history.INCOMPATIBLE_ORDER},
    ),
    (
        "duplicate element",
        [t(1, a("x", 1)), t(2, r("x", 1, 1))],
        {history.DUPLICATE_ELEMENT},
    ),
    ("garbage read", [t(1, r("x", 7))], {history.GARBAGE_READ}),
    (
        "internal: own append not seen",
        [t(1, a("x", 1), r("x"))],
        {history.INTERNAL},
    ),
    (
        "internal: non-repeatable read",
        [t(1, a("x", 1)), t(2, r("x"), r("x", 1))],
        {history.INTERNAL},
    ),
    (
        "stale read (missed a commit before the snapshot)",
        [t(1, r("x"), a("x", 1), s=10, c=11), t(2, r("x"), s=20)],
        {history.STALE_READ},
    ),
    (
        "future read (saw a commit after the snapshot)",
        [t(1, r("x"), a("x", 1), s=10, c=11), t(2, r("x", 1), s=5)],
        {history.FUTURE_READ},
    ),
    (
        "version order against commit timestamps",
        [t(1, a("x", 1), s=1, c=10), t(2, a("x", 2), s=11, c=12), t(3, r("x", 2, 1), s=20)],
        {history.COMMIT_ORDER},
    ),
]


@pytest.mark.parametrize(
    ("history_", "expected"),
    [pytest.param(h, e, id=name) for name, h, e in HAND_WRITTEN],
)
def test_checker_finds(history_: list[Txn], expected: set[str]) -> None:
    result = check(history_)
    assert set(result.counts) == expected, result.summary()
    assert not result.valid
    for kind in expected:
        assert result.of_kind(kind), f"{kind} counted but no example listed"


def test_clean_serial_history_passes() -> None:
    result = check(
        [
            t(1, r("x"), a("x", 1), s=10, c=11),
            t(2, r("x", 1), a("x", 2), r("y"), a("y", 3), s=12, c=13),
            t(3, r("x", 1, 2), r("y", 3), s=14),
            t(4, r("x", 1), r("y"), s=11),  # an older snapshot: a prefix of each key
            t(5, r("x"), a("x", 99), outcome=ABORTED, s=15),  # never seen: harmless
            t(6, r("x", 1, 2), r("y", 3), s=20),
        ]
    )
    assert result.valid, result.summary()
    assert result.allowed == []
    assert result.stats["committed"] == 5 and result.stats["aborted"] == 1


def test_write_skew_is_allowed_under_snapshot_isolation() -> None:
    # T1 and T2 both read x and y from one snapshot; T1 appends to x, T2 to y.
    result = check(
        [
            t(0, a("x", 1), a("y", 2), s=1, c=2),
            t(1, r("x", 1), r("y", 2), a("x", 3), s=3, c=5),
            t(2, r("x", 1), r("y", 2), a("y", 4), s=4, c=6),
            t(3, r("x", 1, 3), r("y", 2, 4), s=10),
        ]
    )
    assert result.valid, result.summary()
    assert result.allowed_counts == {history.G2: 1}
    (skew,) = result.allowed
    assert set(skew.txns) == {1, 2} and skew.detail.count("-rw(") == 2


def test_undetermined_transactions_are_inferred_from_what_was_read() -> None:
    result = check(
        [
            t(1, a("x", 1), outcome=UNDETERMINED),  # seen: it committed
            t(2, r("x", 1)),
            t(3, a("x", 9), outcome=UNDETERMINED),  # never seen: no verdict needed
        ]
    )
    assert result.valid, result.summary()
    assert result.stats["inferred_committed"] == 1
    # Seen partly, it is a fractured read like any committed transaction.
    partial = check([t(1, a("x", 1), a("y", 2), outcome=UNDETERMINED), t(2, r("x", 1), r("y"))])
    assert set(partial.counts) == {history.FRACTURED_READ}


def test_malformed_histories_are_rejected() -> None:
    with pytest.raises(InvalidArgumentError, match="appended to 'x' by transactions 1 and 2"):
        check([t(1, a("x", 5)), t(2, a("x", 5))])
    with pytest.raises(InvalidArgumentError, match="appears twice"):
        check([t(1, r("x")), t(1, r("y"))])
    with pytest.raises(InvalidArgumentError, match="outcome must be one of"):
        Txn(1, (), "maybe")


def test_jsonl_round_trip_and_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = [t(1, r("x"), a("x", 1), s=10, c=11), t(2, r("x", 1), s=12)]
    bad = [t(1, r("x"), a("x", 1)), t(2, r("x"), a("x", 2)), t(3, r("x", 2))]
    history.dump_jsonl(good, tmp_path / "good.jsonl")
    history.dump_jsonl(bad, tmp_path / "bad.jsonl")
    assert history.load_jsonl(tmp_path / "good.jsonl") == good
    assert history.main(["check", str(tmp_path / "good.jsonl")]) == 0
    assert "anomalies: none" in capsys.readouterr().out
    assert history.main(["check", str(tmp_path / "bad.jsonl")]) == 1
    assert "lost-update" in capsys.readouterr().out


def test_list_codec() -> None:
    assert decode_list(encode_list((3, 1, 2))) == (3, 1, 2)
    assert decode_list(None) == () and decode_list(b"") == ()
    with pytest.raises(InvalidArgumentError):
        decode_list(b"1,x")


# ============================================================================ 2. real engine


def run_threads(
    client: percolator.Client,
    recorder: Recorder,
    *,
    threads: int,
    count: int,
    seed: int,
    keys: list[str] = KEYS,
) -> dict[str, int]:
    """``threads`` threads each run ``count`` list-append transactions; returns the errors
    that ended transactions, by type."""
    errors: dict[str, int] = {}
    lock = threading.Lock()

    def work(n: int) -> None:
        found = history.run_list_append(
            client,
            recorder,
            table=TABLE,
            keys=keys,
            count=count,
            rng=random.Random(seed * 1000 + n),
            process=f"thread{n}",
        )
        with lock:
            for name, k in found.items():
                errors[name] = errors.get(name, 0) + k

    workers = [threading.Thread(target=work, args=(n,)) for n in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return errors


def finish(
    client: percolator.Client, recorder: Recorder, extra: Sequence[Txn] = ()
) -> tuple[CheckResult, CheckResult]:
    """Fix the final state with one read of every key (after the lock TTL, so that it
    resolves what failed transactions left), then check the raw history and the history
    with undetermined outcomes settled from the store."""
    time.sleep(LOCK_TTL_MS / 1000 * 1.5)
    history.read_all(client, recorder, table=TABLE, keys=KEYS, column=COLUMN)
    txns = [*recorder.txns(), *extra]
    raw = check(txns)
    settled = check(history.settle_undetermined(client, txns, table=TABLE, column=COLUMN))
    print(f"\nraw history: {raw.summary()}\nsettled: {settled.summary()}")
    return raw, settled


def engine_client(store: Store | str) -> percolator.Client:
    client = percolator.connect(
        store, oracle=ManualOracle(), lock_ttl_ms=LOCK_TTL_MS, lock_wait_ms=5000
    )
    client.create_table(TABLE)
    return client


@pytest.mark.parametrize("faults", [False, True], ids=["clean", "failpoints"])
def test_threads_history_has_no_anomalies(
    store: Store, store_url: str, faults: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """Threads of one client on 4 hot keys, lock TTL 100 ms; with ``failpoints``, a random
    commit-path failpoint raises every 50 ms or so (see FailpointChaos)."""
    hbase = store_url.startswith("hbase")
    threads, count = (3, 12) if hbase else (6, 50)
    client = engine_client(store)
    recorder = Recorder()

    def struck() -> int:
        # A failpoint after the commit point is logged, not raised (the transaction is
        # committed): both kinds count as faults that struck.
        logged = [r for r in caplog.records if "failpoint" in r.getMessage()]
        return errors.get("FailpointError", 0) + len(logged)

    with FailpointChaos(seed=5) if faults else contextlib.nullcontext():
        errors = run_threads(client, recorder, threads=threads, count=count, seed=1)
        # A fast store may finish a round before the chaos strikes: more rounds (for at most
        # a minute) until a failpoint has fired.
        deadline = time.monotonic() + 60
        round_no = 1
        while faults and not struck() and time.monotonic() < deadline:
            round_no += 1
            more = run_threads(client, recorder, threads=threads, count=count, seed=round_no)
            for name, k in more.items():
                errors[name] = errors.get(name, 0) + k
    raw, settled = finish(client, recorder)
    assert raw.valid, raw.summary()
    assert settled.valid, settled.summary()
    # The history must have given the checker something to check.
    assert settled.stats["committed"] >= threads * count * 0.4, settled.summary()
    assert settled.stats["ww"] > 0 and settled.stats["wr"] > 0 and settled.stats["rw"] > 0
    if faults:
        assert struck() > 0, f"no failpoint fired: {errors}"
    client.close()


# Failpoints for the worker processes (through PERCOLATOR_FAILPOINTS); each fires once.
WORKER_FAILPOINTS = [
    "",
    "commit.after_primary=count:3:raise;prewrite.after_secondaries=count:5:raise",
    "commit.primary_cas=count:2:unavailable;commit.primary_cas_applied=count:6:unavailable",
]


def test_processes_history_has_no_anomalies(shared_store_url: str, tmp_path: Path) -> None:
    """Three processes (two with failpoints) share one store and its oracle."""
    count = 10 if shared_store_url.startswith("hbase") else 40
    client = percolator.connect(shared_store_url, lock_ttl_ms=LOCK_TTL_MS, lock_wait_ms=5000)
    client.create_table(TABLE)
    procs = []
    for n, spec in enumerate(WORKER_FAILPOINTS):
        env = dict(os.environ)
        env.pop(failpoints.ENV_VAR, None)
        if spec:
            env[failpoints.ENV_VAR] = spec
        args = [
            sys.executable,
            str(WORKER),
            "append",
            shared_store_url,
            f"--table={TABLE}",
            f"--keys={','.join(KEYS)}",
            f"--count={count}",
            f"--seed={n}",
            f"--index={n}",
            f"--out={tmp_path / f'history{n}.jsonl'}",
            f"--lock-ttl-ms={LOCK_TTL_MS}",
        ]
        procs.append(subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.PIPE, text=True))
    summaries = []
    for proc in procs:
        out, _ = proc.communicate(timeout=180)
        assert proc.returncode == 0, f"worker failed ({proc.returncode}): {out[-3000:]}"
        summaries.append(json.loads(out.strip().splitlines()[-1])["summary"])
    histories = [history.load_jsonl(tmp_path / f"history{n}.jsonl") for n in range(len(procs))]
    raw, settled = finish(client, Recorder(), [txn for h in histories for txn in h])
    assert raw.valid, raw.summary()
    assert settled.valid, settled.summary()
    assert settled.stats["committed"] >= len(procs) * count * 0.5, settled.summary()
    assert settled.stats["rw"] > 0
    assert summaries[1]["errors"].get("FailpointError", 0) >= 1, summaries
    client.close()


@pytest.mark.slow
def test_threads_history_soak(tmp_path: Path) -> None:
    client = engine_client(f"embedded:{tmp_path / 'store'}")
    recorder = Recorder()
    with FailpointChaos(seed=9, interval_s=0.1):
        run_threads(client, recorder, threads=8, count=400, seed=2)
    raw, settled = finish(client, recorder)
    assert raw.valid, raw.summary()
    assert settled.valid, settled.summary()
    client.close()


# ============================================================================ 3. planted bugs


class Manual:
    """A transaction driven step by step by the test, recorded like the workload's."""

    def __init__(self, client: percolator.Client, recorder: Recorder) -> None:
        self.txn = client.transaction()
        self.recorder = recorder
        self.ops: list[Read | Append] = []

    def append(self, key: str) -> None:
        current = decode_list(self.txn.get(TABLE, key, COLUMN))
        element = self.recorder.new_id()
        self.ops += [Read(key, current), Append(key, element)]
        self.txn.set(TABLE, key, COLUMN, encode_list((*current, element)))

    def commit(self) -> str:
        """Commit and record the outcome the engine reported."""
        outcome = COMMITTED
        try:
            self.txn.commit()
        except PercolatorError as exc:
            outcome = ABORTED if exc.retryable else UNDETERMINED
        self.recorder.add(
            Txn(
                self.recorder.new_id(),
                tuple(self.ops),
                outcome,
                self.txn.start_ts,
                self.txn.commit_ts,
                "manual",
            )
        )
        return outcome


def seed_keys(client: percolator.Client, recorder: Recorder) -> None:
    first = Manual(client, recorder)
    for key in KEYS:
        first.append(key)
    assert first.commit() == COMMITTED


PLANTED = [pytest.param(False, id="control"), pytest.param(True, id="planted")]


# ---- bug 1: prewrite without the newer-write check ("latest commit >= start_ts").

_real_check = prewrite_module._check


def check_without_newer_write(
    raw: RawCell, start_ts: int, resolver: LockResolver
) -> prewrite_module._Verdict:
    """prewrite's _check with the write-write conflict on a newer commit removed."""
    cell = raw.lock_cell
    if cell.rolled_back == start_ts or cell.lock is not None:
        return _real_check(raw, start_ts, resolver)
    return prewrite_module._Verdict.LOCK


@pytest.mark.parametrize("planted", PLANTED)
def test_planted_missing_write_conflict_scenario(
    planted: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two transactions read k1 from one snapshot and both append; the second commit must
    conflict.  Without the check both commit: a lost update."""
    if planted:
        monkeypatch.setattr(prewrite_module, "_check", check_without_newer_write)
    client = engine_client("memory:")
    recorder = Recorder()
    seed_keys(client, recorder)
    first, second = Manual(client, recorder), Manual(client, recorder)
    first.append("k1")
    second.append("k1")
    assert first.commit() == COMMITTED
    assert second.commit() == (COMMITTED if planted else ABORTED)
    raw, settled = finish(client, recorder)
    if planted:
        assert history.LOST_UPDATE in raw.counts, raw.summary()
        assert history.CONCURRENT_WRITE in raw.counts, raw.summary()
    else:
        assert raw.valid and settled.valid, raw.summary()


@pytest.mark.parametrize("planted", PLANTED)
def test_planted_missing_write_conflict_random(
    planted: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if planted:
        monkeypatch.setattr(prewrite_module, "_check", check_without_newer_write)
    assert until_found(workload, {history.LOST_UPDATE}, planted) == planted


# ---- bug 2: the committer commits the secondaries before the primary.


def commit_secondaries_first(self: Committer) -> CommitResult:
    """Committer.commit with the order of phase 2 reversed: secondaries (write record and
    lock) first, then the primary's commit point."""
    ctx = self._ctx
    try:
        self.prewrite_all()
        commit_ts = ctx.oracle.get_timestamp()
        for m in self.secondaries:
            ctx.store.put(
                m.key.table, write_record_puts([(m.key, m.kind)], self.start_ts, commit_ts)
            )
            commit_cell(
                ctx.store,
                m.key,
                self.start_ts,
                commit_ts,
                self._locked.get(m.key),
                write_record_done=True,
            )
        failpoints.failpoint("commit.before_primary")
        self._commit_primary(commit_ts)
    except UndeterminedCommitError:
        self._stop_heartbeat()
        raise
    except BaseException:
        self._stop_heartbeat()
        self._rollback_locked()
        raise
    primary = self.primary
    ctx.store.put(
        primary.key.table,
        write_record_puts([(primary.key, primary.kind)], self.start_ts, commit_ts),
    )
    return CommitResult(commit_ts, True)


@pytest.mark.parametrize("planted", PLANTED)
def test_planted_secondaries_before_primary_scenario(
    planted: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A transaction appends to k1 (its primary) and k2, and fails just before the commit
    point.  With the bug k2 is already committed when the primary is rolled back."""
    if planted:
        monkeypatch.setattr(Committer, "commit", commit_secondaries_first)
    client = engine_client("memory:")
    recorder = Recorder()
    seed_keys(client, recorder)
    victim = Manual(client, recorder)
    victim.append("k1")
    victim.append("k2")
    failpoints.enable("commit.before_primary", "raise")
    assert victim.commit() == UNDETERMINED  # a FailpointError: the client cannot tell
    failpoints.disable()
    raw, settled = finish(client, recorder)
    if planted:
        assert history.FRACTURED_READ in raw.counts, raw.summary()
        assert history.FRACTURED_READ in settled.counts, settled.summary()
    else:
        assert raw.valid and settled.valid, raw.summary()


@pytest.mark.parametrize("planted", PLANTED)
def test_planted_secondaries_before_primary_random(
    planted: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Random histories while ``commit.before_primary`` raises in every fifth commit."""
    if planted:
        monkeypatch.setattr(Committer, "commit", commit_secondaries_first)

    def run(seed: int) -> tuple[percolator.Client, Recorder]:
        with firing_every("commit.before_primary", 5):
            return workload(seed)

    assert until_found(run, {history.FRACTURED_READ}, planted) == planted


# ---- bug 3: reads treat a lock with start_ts <= read_ts as absent.


def fetch_cells_hiding_locks(
    store: Store, keys: list[CellKey], *, before: int | None, with_data: bool = True
) -> dict[CellKey, RawCell]:
    """fetch_cells as the read path sees it with the bug: every lock is gone (the latest
    commit and the rollback marker stay)."""
    raws = fetch_cells(store, keys, before=before, with_data=with_data)
    return {
        key: RawCell(
            raw.key,
            raw.lock_bytes,
            LockCell(None, raw.lock_cell.last_commit, raw.lock_cell.rolled_back),
            raw.write,
            raw.data,
        )
        for key, raw in raws.items()
    }


@pytest.mark.parametrize("planted", PLANTED)
def test_planted_reads_ignore_locks_scenario(
    planted: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A transaction appends to k1 (primary) and k2 and fails right after its commit point,
    leaving k2 locked.  A later reader must resolve that lock (roll it forward); with the bug
    it sees k1's new state and k2's old one."""
    client = engine_client("memory:")
    recorder = Recorder()
    seed_keys(client, recorder)
    victim = Manual(client, recorder)
    victim.append("k1")
    victim.append("k2")
    failpoints.enable("commit.after_primary", "raise")
    # Past the commit point an error is logged, not raised: the transaction committed.
    assert victim.commit() == COMMITTED
    failpoints.disable()
    if planted:
        monkeypatch.setattr(read_module, "fetch_cells", fetch_cells_hiding_locks)
    history.read_all(client, recorder, table=TABLE, keys=KEYS, process="reader")
    monkeypatch.undo()  # the final read of finish() resolves the lock with the real code
    raw, settled = finish(client, recorder)
    if planted:
        assert {history.FRACTURED_READ, history.G_SINGLE} <= set(raw.counts), raw.summary()
        # Settled, the victim has its commit_ts: the reader started after it and missed it.
        assert history.STALE_READ in settled.counts, settled.summary()
    else:
        assert raw.valid and settled.valid, raw.summary()


@pytest.mark.parametrize("planted", PLANTED)
def test_planted_reads_ignore_locks_random(planted: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    def run(seed: int) -> tuple[percolator.Client, Recorder]:
        if planted:
            monkeypatch.setattr(read_module, "fetch_cells", fetch_cells_hiding_locks)
        # Committers that stop right after their commit point now and then leave committed
        # locks behind for readers to roll forward (without them the locks of a fast store
        # live too briefly for the bug to show in a few short runs).
        try:
            with firing_every("commit.after_primary", 5):
                return workload(seed)
        finally:
            monkeypatch.undo()  # the final read resolves the locks with the real code

    kinds = {history.STALE_READ, history.FRACTURED_READ, history.G_SINGLE}
    assert until_found(run, kinds, planted, attempts=8) == planted


# ---- helpers of the random variants


@contextlib.contextmanager
def firing_every(point: str, n: int) -> Iterator[None]:
    """``point`` raises on every ``n``-th hit while active.  Counted in hits, not timed: a
    fast or a slow machine sees the same number of faults in a workload (a timer fired too
    seldom on a busy one for a planted bug to show within a few runs)."""
    failpoints.enable(point, f"every:{n}:raise")
    try:
        yield
    finally:
        failpoints.disable(point)


def workload(seed: int) -> tuple[percolator.Client, Recorder]:
    """Six threads of 40 random list-append transactions each on 3 keys of a fresh memory
    store; returns the client and the recorded history (not finished yet)."""
    client = engine_client("memory:")
    recorder = Recorder()
    run_threads(client, recorder, threads=6, count=40, seed=seed, keys=KEYS[:3])
    return client, recorder


def until_found(
    run: Callable[[int], tuple[percolator.Client, Recorder]],
    kinds: set[str],
    planted: bool,
    *,
    attempts: int = 4,
) -> bool:
    """Run seeded random histories until the check of one shows any of ``kinds`` (at most
    ``attempts``).  The control runs all of them, and each must show no anomaly at all.
    Returns whether ``kinds`` were found."""
    for seed in range(1, attempts + 1):
        client, recorder = run(seed)
        raw, settled = finish(client, recorder)
        client.close()
        if not planted:
            assert raw.valid and settled.valid, raw.summary()
        elif kinds & (set(raw.counts) | set(settled.counts)):
            print(f"found {sorted(kinds & (set(raw.counts) | set(settled.counts)))} in run {seed}")
            return True
    return False


# ============================================================================ engine bugs


def test_primary_cas_applied_raise_keeps_atomicity() -> None:
    """An error raised after the primary's commit compare-and-set went through (here the
    ``raise`` action of ``commit.primary_cas_applied``) must not undo the transaction.

    Fails today: Committer.commit treats any exception other than StoreUnavailableError
    from _commit_primary as "before the commit point" and calls _rollback_locked, which
    ignores that rolling back the (committed) primary failed and then rolls back every
    secondary: k1 shows the transaction, k2 does not."""
    client = engine_client("memory:")
    recorder = Recorder()
    seed_keys(client, recorder)
    victim = Manual(client, recorder)
    victim.append("k1")
    victim.append("k2")
    failpoints.enable("commit.primary_cas_applied", "raise")
    victim.commit()
    failpoints.disable()
    raw, settled = finish(client, recorder)
    assert raw.valid, raw.summary()
    assert settled.valid, settled.summary()


# ============================================================================ 4. with GC

GC_LOOP = """
import os, sys, time, percolator
client = percolator.connect(sys.argv[1])
passes = removed = 0
while not os.path.exists(sys.argv[2]):
    removed += client.gc(life_time_ms=0).dead_cells_removed
    passes += 1
    time.sleep(0.02)
client.close()
print(passes, removed)
"""


def _beside_a_gc_loop(
    tmp_path: Path, read_delay_s: float
) -> tuple[percolator.Client, Path, subprocess.Popen[str]]:
    """A client on a fresh embedded store whose every read takes ``read_delay_s`` longer
    (transactions stay open while GC passes go by), and another process running GC with
    life time 0 in a loop until the returned path exists; it prints its passes and the dead
    cells it removed."""
    from percolator.store import open_store
    from percolator.testing import FaultyStore

    url = f"embedded:{tmp_path / 'store'}"
    store = FaultyStore(open_store(url))
    store.before("read_rows", lambda call: time.sleep(read_delay_s), times=None)
    client = percolator.connect(store, lock_ttl_ms=LOCK_TTL_MS, lock_wait_ms=5000)
    client.create_table(TABLE)
    stop = tmp_path / "stop"
    gc_proc = subprocess.Popen(
        [sys.executable, "-c", GC_LOOP, url, str(stop)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return client, stop, gc_proc


def test_history_has_no_anomalies_while_another_process_collects_garbage(
    tmp_path: Path,
) -> None:
    """Long transactions (every read waits a little) and snapshots on hot keys while another
    process runs GC with life time 0 in a loop: whatever GC removes, every transaction and
    snapshot read exactly its snapshot or was refused (SafePointError counts as an abort)."""
    from percolator.errors import SafePointError

    client, stop, gc_proc = _beside_a_gc_loop(tmp_path, read_delay_s=0.003)
    recorder = Recorder()
    refused = [0]
    done = threading.Event()

    def snapshots() -> None:
        while not done.is_set():
            try:
                history.read_all(client, recorder, table=TABLE, keys=KEYS, column=COLUMN)
            except SafePointError:
                refused[0] += 1

    reader = threading.Thread(target=snapshots)
    reader.start()
    try:
        errors = run_threads(client, recorder, threads=4, count=25, seed=7)
    finally:
        done.set()
        reader.join()
        stop.touch()
        out, err = gc_proc.communicate(timeout=120)
    assert gc_proc.returncode == 0, err[-3000:]
    passes = int(out.split()[0])
    raw, settled = finish(client, recorder)
    print(f"GC passes {passes}; errors {errors}; snapshots refused {refused[0]}")
    assert passes >= 3, f"GC ran only {passes} passes: the test checked too little"
    assert raw.valid, raw.summary()
    assert settled.valid, settled.summary()
    assert settled.stats["committed"] >= 4 * 25 * 0.3, settled.summary()
    client.close()


def test_cells_set_and_deleted_in_turn_stay_serial_while_gc_removes_dead_cells(
    tmp_path: Path,
) -> None:
    """Transactions toggle a few cells (read; absent -> set, present -> delete), so another
    process running GC with life time 0 in a loop keeps removing deleted cells entirely,
    lock cells included, while transactions keep re-creating them.  Every committed toggle
    must have read exactly what the previous committed toggle of its cell wrote (no lost
    update, no stale read), and the last one's value must be what a reader sees at the end.
    The checks come from commit timestamps and values read back, not from what GC reports."""
    from percolator.errors import ConflictError, SafePointError, TransactionAbortedError

    client, stop, gc_proc = _beside_a_gc_loop(tmp_path, read_delay_s=0.002)
    # Many cells, so that some stay deleted longer than GC's bound lags behind (up to the 2 s
    # between renewals of the writers' reader record) and are removed before being set again.
    keys = [f"t{i:03d}" for i in range(300)]
    committed: list[tuple[str, int, bytes | None, bytes | None]] = []
    aborted = [0]
    guard = threading.Lock()

    # Long enough for GC to pass the writers' published oldest reader (renewed every 2 s).
    deadline = time.monotonic() + 6.0

    def toggler(seed: int) -> None:
        rnd = random.Random(seed)
        n = 0
        while time.monotonic() < deadline:
            n += 1
            key = rnd.choice(keys)
            txn = client.transaction()
            try:
                before = txn.get(TABLE, key, COLUMN)
                after = None if before is not None else f"{seed}-{n}".encode()
                if after is None:
                    txn.delete(TABLE, key, COLUMN)
                else:
                    txn.set(TABLE, key, COLUMN, after)
                commit_ts = txn.commit()
            except (ConflictError, TransactionAbortedError, SafePointError):
                txn.close()
                with guard:
                    aborted[0] += 1
                continue
            assert commit_ts is not None
            with guard:
                committed.append((key, commit_ts, before, after))

    threads = [threading.Thread(target=toggler, args=(seed,)) for seed in range(4)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        stop.touch()
        out, err = gc_proc.communicate(timeout=120)
    assert gc_proc.returncode == 0, err[-3000:]
    passes, removed = (int(x) for x in out.split())
    print(
        f"GC passes {passes}, dead cells removed {removed}; {len(committed)} toggles, "
        f"{aborted[0]} aborted"
    )
    assert removed >= 3, f"GC removed only {removed} dead cells: the test checked too little"
    assert len(committed) >= 100
    for key in keys:
        chain = sorted((c for c in committed if c[0] == key), key=lambda c: c[1])
        previous: bytes | None = None
        for _, commit_ts, before, after in chain:
            assert before == previous, f"{key}: the toggle at {commit_ts} read {before!r}"
            previous = after
        assert client.snapshot().get(TABLE, key, COLUMN) == previous, key
    client.close()

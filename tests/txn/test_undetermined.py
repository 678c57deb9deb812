"""Undetermined commits (target R4): when the connection breaks during the primary's
compare-and-set (the commit point), the client cannot know whether it committed.  It must
raise :class:`UndeterminedCommitError` - never a conflict or "aborted", never a guess - and
must not retry by itself.  A later read shows the true outcome:

* request lost (not applied): the primary stays locked, and once its TTL has passed a
  reader rolls the whole transaction back;
* reply lost (applied): the transaction is committed, and a reader rolls its secondaries
  forward at once.

The break is made two ways: failpoints ``commit.primary_cas`` / ``commit.primary_cas_applied``
with action ``unavailable`` on every backend, and, against HBase, a real TCP proxy in front
of the Thrift gateway that cuts the connection carrying the primary's compare-and-set
(dropping the request, or forwarding it and dropping the server's reply).

The same holds at every other step of the commit: with the connection breaking anywhere
on the commit path, what the client is told must match the store (a retryable failure is
rolled back, a returned commit is committed), so a retry can never apply a transaction twice.

Outcomes are judged from a raw scan of the store (``tests/txn/raw_inspect.py``).
"""

from __future__ import annotations

import contextlib
import random
import socket
import struct
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest

import percolator
from percolator import failpoints
from percolator.errors import (
    ConflictError,
    PercolatorError,
    StoreUnavailableError,
    TransactionAbortedError,
    UndeterminedCommitError,
)
from percolator.records import LockCell
from percolator.store import Store
from percolator.store.backends import with_url_options, without_url_options
from percolator.store.memory import MemoryStore
from percolator.testing import FaultyStore, ManualOracle
from percolator.timestamps import TimestampOracle
from tests.txn._txn_client import (
    ClientProcess,
    run_transfers,
    settle_and_judge,
    setup_bank,
)
from tests.txn.raw_inspect import (
    COMMITTED,
    LOCKED,
    ROLLED_BACK,
    TxnView,
    decode_value,
    encode_value,
    locked_cells,
    read_all,
    transactions,
)

LOCK_TTL_MS = 300
TABLES = ("ua", "ub")
BANK_ACCOUNTS = 4


@pytest.fixture(autouse=True)
def no_failpoints() -> Iterator[None]:
    failpoints.disable()
    yield
    failpoints.disable()


def make_client(store: Store | str, oracle: TimestampOracle) -> percolator.Client:
    client = percolator.connect(store, oracle=oracle, lock_ttl_ms=LOCK_TTL_MS, lock_wait_ms=5000)
    for table in TABLES:
        client.create_table(table)
    return client


Cells = list[tuple[str, bytes, str]]


def fresh_cells() -> Cells:
    """Four cells in three rows of two tables, never written before.  The primary is the
    first in sort order: ``ua``, row ``a-...``, column ``x``."""
    tag = uuid.uuid4().hex[:8]
    a, b = f"a-{tag}".encode(), f"b-{tag}".encode()
    return [("ua", a, "x"), ("ua", a, "y"), ("ua", b, "x"), ("ub", b, "y")]


def start_commit(client: percolator.Client, cells: Cells) -> percolator.Transaction:
    txn = client.transaction()
    for table, row, column in cells:
        txn.set(table, row, column, encode_value(f"u{txn.start_ts}", len(cells), txn.start_ts))
    return txn


def raw_view(store: Store, start_ts: int) -> TxnView:
    return transactions(read_all(store, TABLES))[start_ts]


def read_truth(
    client: percolator.Client, cells: Cells
) -> dict[tuple[str, bytes, str], bytes | None]:
    snapshot = client.snapshot()
    return {cell: snapshot.get(*cell) for cell in cells}


def check_undetermined(exc: BaseException, txn: percolator.Transaction) -> None:
    assert isinstance(exc, UndeterminedCommitError)
    assert not isinstance(exc, ConflictError | TransactionAbortedError)
    assert not exc.retryable
    assert txn.status is percolator.TxnStatus.UNDETERMINED


def check_outcome(reader: percolator.Client, cells: Cells, start_ts: int, committed: bool) -> None:
    """The truth after the fact: a read resolves the locks; the raw store then shows the
    transaction committed (or rolled back) on every cell, and no lock."""
    values = read_truth(reader, cells)
    view = raw_view(reader.store, start_ts)
    assert not locked_cells(read_all(reader.store, TABLES))
    if committed:
        assert view.outcome == COMMITTED, view.describe()
        assert all(v is not None and decode_value(v).start_ts == start_ts for v in values.values())
    else:
        assert view.outcome == ROLLED_BACK, view.describe()
        assert set(values.values()) == {None}, values


# --------------------------------------------------------------------------- failpoints


@pytest.mark.parametrize(
    ("failpoint", "applied"),
    [("commit.primary_cas", False), ("commit.primary_cas_applied", True)],
    ids=["request-lost", "reply-lost"],
)
def test_broken_primary_commit_is_undetermined(store: Store, failpoint: str, applied: bool) -> None:
    oracle = ManualOracle()
    client = make_client(store, oracle)
    try:
        cells = fresh_cells()
        txn = start_commit(client, cells)
        failpoints.enable(failpoint, "unavailable")
        # Catch the common base: check_undetermined then names a wrong type if one comes.
        with pytest.raises(PercolatorError) as caught:
            txn.commit()
        failpoints.disable()
        check_undetermined(caught.value, txn)
        # Straight after the error the store shows the truth only in the primary: the
        # committer stopped at the commit point, every secondary is still locked.
        view = raw_view(store, txn.start_ts)
        assert view.outcome == LOCKED and len(view.locked) == len(cells) - int(applied)
        assert bool(view.committed) is applied, view.describe()
        # A different client (no shared cache) reads: it waits out the TTL if needed.
        reader = percolator.connect(store, oracle=oracle, lock_ttl_ms=LOCK_TTL_MS)
        try:
            check_outcome(reader, cells, txn.start_ts, committed=applied)
        finally:
            reader.close()
    finally:
        client.close()


def test_run_does_not_retry_an_undetermined_commit(store: Store) -> None:
    client = make_client(store, ManualOracle())
    try:
        cells = fresh_cells()
        calls: list[int] = []

        def transfer(txn: percolator.Transaction) -> None:
            calls.append(txn.start_ts)
            for table, row, column in cells:
                txn.set(
                    table, row, column, encode_value(f"r{txn.start_ts}", len(cells), txn.start_ts)
                )

        failpoints.enable("commit.primary_cas_applied", "unavailable")
        with pytest.raises(UndeterminedCommitError):
            client.run(transfer, max_attempts=5)
        failpoints.disable()
        assert len(calls) == 1, "an undetermined commit was retried"
        check_outcome(client, cells, calls[0], committed=True)
    finally:
        client.close()


# --------------------------------------------------------------------------- every step


# Where on the commit path a broken connection (failpoint action ``unavailable``) can hit:
# what the client must be told, and the truth the store must show.  Before the commit point
# the commit fails (retryable) and nothing is committed; at it, the outcome is unknown to the
# client; after it, the transaction is committed and the commit returns (failures there are
# left to roll-forward, percolator/committer.py).
RETRYABLE = "retryable error"
UNDETERMINED = "UndeterminedCommitError"
RETURNED = "committed"
BROKEN_AT = {
    "prewrite.before_primary": (RETRYABLE, ROLLED_BACK),
    "prewrite.before_lock": (RETRYABLE, ROLLED_BACK),
    "prewrite.after_primary": (RETRYABLE, ROLLED_BACK),
    "prewrite.after_secondaries": (RETRYABLE, ROLLED_BACK),
    "commit.before_notify": (RETRYABLE, ROLLED_BACK),
    "commit.before_primary": (RETRYABLE, ROLLED_BACK),
    "commit.primary_cas": (UNDETERMINED, ROLLED_BACK),
    "commit.primary_cas_applied": (UNDETERMINED, COMMITTED),
    "commit.after_primary": (RETURNED, COMMITTED),
    "commit.after_write_records": (RETURNED, COMMITTED),
    "commit.after_secondaries": (RETURNED, COMMITTED),
}


def test_every_commit_step_has_a_broken_connection_case() -> None:
    on_commit_path = {p for p in failpoints.POINTS if p.startswith(("prewrite.", "commit."))}
    assert on_commit_path == set(BROKEN_AT)


@pytest.mark.parametrize("failpoint", sorted(BROKEN_AT))
def test_broken_connection_is_reported_truthfully(failpoint: str) -> None:
    """Bank transfers; the connection breaks at ``failpoint`` in the first commit.  Every
    attempt's reported result must match the store: "committed" is committed, a retryable
    failure is rolled back (the retry re-runs the transfer: were the failed attempt
    committed, the transfer would apply twice), and only UndeterminedCommitError leaves
    the client unsure."""
    client = percolator.connect(
        f"memory:{uuid.uuid4().hex}", oracle=ManualOracle(), lock_ttl_ms=LOCK_TTL_MS
    )
    try:
        setup_bank(client, BANK_ACCOUNTS)
        events: list[dict[str, Any]] = []
        failpoints.enable(failpoint, "count:1:unavailable")
        finished = run_transfers(
            client,
            name="t",
            txns=3,
            accounts=BANK_ACCOUNTS,
            rng=random.Random(7),
            max_attempts=5,
            emit=events.append,
        )
        failpoints.disable()
        assert finished, events
        broken = next(e["marker"] for e in events if e["ev"] == "commit")
        result = next(e for e in events if e["ev"] == "result" and e["marker"] == broken)
        told, truth = BROKEN_AT[failpoint]
        if told == RETURNED:
            assert result["outcome"] == "committed", (
                f"{failpoint}: the commit point had passed, yet the client was told {result}"
            )
        else:
            assert result["outcome"] == "error", result
            if told == UNDETERMINED:
                assert result["error"] == UNDETERMINED, result
            else:
                assert result["retryable"] and result["error"] != UNDETERMINED, result

        verdict = settle_and_judge(client, BANK_ACCOUNTS)
        verdict.check_reports(events)
        outcome = verdict.outcome_of(broken)
        assert outcome == truth, f"{failpoint}: stored {outcome}, expected {truth}: {result}"
    finally:
        client.close()


@pytest.mark.slow
@pytest.mark.parametrize("failpoint", sorted(BROKEN_AT))
def test_broken_connection_among_concurrent_clients(tmp_path: Path, failpoint: str) -> None:
    """The same across processes: one client's connection breaks at ``failpoint`` (on its
    1st to 3rd hit) while two others transfer over the same accounts; every result any of
    them reports must match the store, trial after trial."""
    for trial in range(4):
        rng = random.Random(trial)
        url = f"embedded:{tmp_path / f'trial{trial}'}"
        client = percolator.connect(url, oracle=None, lock_ttl_ms=500)
        try:
            setup_bank(client, BANK_ACCOUNTS)
            spec = f"{failpoint}=count:{rng.randint(1, 3)}:unavailable"
            processes = [
                ClientProcess(url, "broken", failpoints=spec, txns=5, seed=rng.randrange(2**32))
            ]
            processes += [
                ClientProcess(url, f"w{i}", txns=4, seed=rng.randrange(2**32)) for i in range(2)
            ]
            reports = [p.wait() for p in processes]
            for report in reports:
                assert report.returncode == 0, report.describe()
            verdict = settle_and_judge(client, BANK_ACCOUNTS)
            for report in reports:
                verdict.check_reports(report.events)
        except AssertionError as exc:
            raise AssertionError(f"trial {trial} ({spec}): {exc}") from exc
        finally:
            client.close()


def test_run_does_not_reapply_a_transaction_committed_before_a_later_error() -> None:
    """``Client.run`` re-runs the function after a retryable error.  A connection that breaks
    after the commit point (here right after the primary's compare-and-set) must not make the
    committed transaction look like a retryable failure: the function runs once and its
    increment is applied once."""
    client = percolator.connect("memory:", oracle=ManualOracle(), lock_ttl_ms=LOCK_TTL_MS)
    try:
        client.create_table("ua")
        calls: list[int] = []

        def increment(txn: percolator.Transaction) -> None:
            calls.append(txn.start_ts)
            current = txn.get("ua", b"counter", "n")
            txn.set("ua", b"counter", "n", str(int(current or b"0") + 1).encode())
            txn.set("ua", b"audit", str(txn.start_ts), b"incremented")

        failpoints.enable("commit.after_primary", "count:1:unavailable")
        with contextlib.suppress(PercolatorError):
            client.run(increment, max_attempts=3)
        failpoints.disable()
        assert client.snapshot().get("ua", b"counter", "n") == b"1", (
            f"the increment was applied {len(calls)} times by {len(calls)} runs of the function"
        )
        assert len(calls) == 1
    finally:
        client.close()


def test_interrupt_after_commit_point_is_not_reported_as_rollback() -> None:
    """An exception that is not a store error (Ctrl-C, a bug) after the commit point must not
    make a committed transaction claim it was rolled back."""
    store = FaultyStore(MemoryStore())
    client = make_client(store, ManualOracle())
    try:
        cells = fresh_cells()
        txn = start_commit(client, cells)
        # Ctrl-C on the commit of the secondary in table ``ub`` (its write record riding on
        # it where puts are conditional): secondaries are committed only after the commit
        # point.
        store.fail(
            "compare_and_set",
            when=lambda call: call["table"] == "ub" and LockCell.decode(call["new"]).lock is None,
            error=KeyboardInterrupt,
        )
        with pytest.raises(KeyboardInterrupt):
            txn.commit()
        check_outcome(client, cells, txn.start_ts, committed=True)
        assert txn.status is not percolator.TxnStatus.ROLLED_BACK, (
            "a committed transaction reports ROLLED_BACK"
        )
    finally:
        client.close()


# --------------------------------------------------------------------------- a real cut


class CuttingProxy:
    """A TCP proxy 127.0.0.1:port -> target that cuts the first connection whose pending
    request matches the predicate given to :meth:`arm`.

    ``drop_reply=False``: the matching request is not forwarded (the server never sees it
    whole) and both sides are closed.  ``drop_reply=True``: the request is forwarded, the
    server's reply is swallowed and both sides are closed, so the server has done the work
    but the client never hears of it.  Thrift-1 calls on one connection strictly alternate
    request and reply, so the bytes since the last reply are the pending request.
    """

    def __init__(self, target: tuple[str, int], *, drop_reply: bool) -> None:
        self._target = target
        self._match: Callable[[bytes], bool] | None = None
        self._drop_reply = drop_reply
        self.cut = threading.Event()  # a matching request was intercepted
        self.reply_swallowed = threading.Event()  # drop_reply: the server answered it
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name="proxy-accept").start()

    def arm(self, match: Callable[[bytes], bool]) -> None:
        self._match = match

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # listener closed
            server = socket.create_connection(self._target)
            self._sockets += [client, server]
            state = _Pipe(client, server)
            threading.Thread(target=self._upstream, args=(state,), daemon=True).start()
            threading.Thread(target=self._downstream, args=(state,), daemon=True).start()

    def _upstream(self, pipe: _Pipe) -> None:
        while (data := _recv(pipe.client)) is not None:
            with pipe.lock:
                pipe.pending += data
                match = self._match
                hit = match is not None and not self.cut.is_set() and match(pipe.pending)
                if hit:
                    self.cut.set()
                    if not self._drop_reply:
                        pipe.close()
                        return
                    pipe.swallow_reply = True
            with contextlib.suppress(OSError):
                pipe.server.sendall(data)
        pipe.close()

    def _downstream(self, pipe: _Pipe) -> None:
        while (data := _recv(pipe.server)) is not None:
            with pipe.lock:
                if pipe.swallow_reply:
                    self.reply_swallowed.set()
                    pipe.close()
                    return
                pipe.pending = b""
            with contextlib.suppress(OSError):
                pipe.client.sendall(data)
        pipe.close()

    def close(self) -> None:
        self._listener.close()
        for s in self._sockets:
            with contextlib.suppress(OSError):
                s.close()


class _Pipe:
    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client = client
        self.server = server
        self.lock = threading.Lock()
        self.pending = b""
        self.swallow_reply = False

    def close(self) -> None:
        for s in (self.client, self.server):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()


def _recv(sock: socket.socket) -> bytes | None:
    try:
        data = sock.recv(65536)
    except OSError:
        return None
    return data or None


def primary_commit_request(primary_row: bytes, start_ts: int) -> Callable[[bytes], bool]:
    """Matches the Thrift ``checkAndPut`` that commits ``start_ts``'s primary: its new lock
    cell value is ``Committed{commit_ts, start_ts, PUT}`` with no lock and no rollback marker
    (format in percolator/records.py), so it holds the header ``01 02 00*8`` and
    ``start_ts`` followed by the kind byte 1.  Prewrite and heartbeat values carry a lock
    (flags 1), and a rollback of a fresh cell has flags 0."""
    header = b"\x01\x02" + b"\x00" * 8
    tail = struct.pack(">QB", start_ts, 1)

    def match(request: bytes) -> bool:
        return (
            b"checkAndPut" in request
            and primary_row in request
            and header in request
            and tail in request
        )

    return match


@pytest.mark.hbase
@pytest.mark.parametrize("applied", [False, True], ids=["request-lost", "reply-lost"])
@pytest.mark.parametrize("gateways", ["thrift1-only", "with-thrift2"])
def test_cut_connection_during_primary_commit(
    hbase_store_url: str, applied: bool, gateways: str
) -> None:
    direct_url = hbase_store_url
    if gateways == "thrift1-only":
        direct_url = without_url_options(direct_url, "thrift2_port")
    parts = urlsplit(direct_url)
    assert parts.hostname is not None and parts.port is not None
    oracle = ManualOracle()
    reader = make_client(direct_url, oracle)
    # The commit point goes to the Thrift-2 gateway where the URL names one (the primary's
    # record rides on it), else to the Thrift-1 gateway: the proxy sits in front of that one.
    # The transaction that gets cut runs on a client connected through the proxy.
    thrift2_port = dict(parse_qsl(parts.query)).get("thrift2_port")
    assert bool(thrift2_port) == (gateways == "with-thrift2"), direct_url
    if thrift2_port:
        proxy = CuttingProxy((parts.hostname, int(thrift2_port)), drop_reply=applied)
        proxied_url = with_url_options(direct_url, thrift2_port=str(proxy.port))
    else:
        proxy = CuttingProxy((parts.hostname, parts.port), drop_reply=applied)
        proxied_url = parts._replace(netloc=f"127.0.0.1:{proxy.port}").geturl()
    client: percolator.Client | None = None
    try:
        client = make_client(proxied_url, oracle)
        cells = fresh_cells()
        txn = start_commit(client, cells)
        proxy.arm(primary_commit_request(min(cells)[1], txn.start_ts))
        with pytest.raises(PercolatorError) as caught:
            txn.commit()
        assert proxy.cut.is_set(), "the proxy never saw the primary's commit"
        assert proxy.reply_swallowed.is_set() is applied
        assert isinstance(caught.value.__cause__, StoreUnavailableError)
        check_undetermined(caught.value, txn)
        check_outcome(reader, cells, txn.start_ts, committed=applied)
    finally:
        if client is not None:
            client.close()
        proxy.close()
        reader.close()

"""HBase-backend behaviour the shared contract suite cannot see.

Connection handling is tested through a small TCP proxy between the store and the real
Thrift gateway: the proxy can drop a connection while idle, swallow the next request, forward
a request but swallow its reply, or stall a reply, which is exactly what a gateway restart,
a network cut or an overloaded server does to a client.  The "wrong port" tests need no
HBase: they point the store at listeners that are not HBase.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import uuid
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import happybase
import pytest
import thriftpy2
from thriftpy2.rpc import make_server

from percolator.errors import InvalidArgumentError, StoreUnavailableError
from percolator.store import hbase as hbase_module
from percolator.store.base import Delete, FamilySpec, Put, ScanOptions, Store
from percolator.store.hbase import HBaseStore
from percolator.store.url import parse_store_url

# --------------------------------------------------------------------------- helpers


class FaultyProxy:
    """A TCP proxy to ``upstream`` that injects one fault on demand.

    ``fault`` is read when the next chunk passes: ``"drop_request"`` closes the client's
    connection instead of forwarding the request, ``"drop_reply"`` forwards the request but
    closes the connection instead of forwarding the reply, ``"stall_reply"`` holds the reply
    back (never sends it).  Each fault fires once.
    """

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.fault: str | None = None
        self.accepted = 0
        self.requests = 0
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.port = self._listener.getsockname()[1]
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._accept_loop, daemon=True)
        self._thread.start()

    def _take_fault(self, kind: str) -> bool:
        with self._lock:
            if self.fault == kind:
                self.fault = None
                return True
            return False

    def _accept_loop(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            server = socket.create_connection(self.upstream, timeout=10)
            server.settimeout(None)
            client.settimeout(None)
            with self._lock:
                self.accepted += 1
                self._pairs.append((client, server))
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, to_server: bool) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if to_server:
                    with self._lock:
                        self.requests += 1
                    if self._take_fault("drop_request"):
                        break
                else:
                    if self._take_fault("drop_reply"):
                        break
                    if self._take_fault("stall_reply"):
                        continue  # swallow this reply; the connection stays open
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()

    def drop_all(self) -> None:
        """Close every proxied connection, as a restarting gateway would."""
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            for sock in pair:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._stopped.set()
        self._listener.close()
        self.drop_all()
        self._thread.join(timeout=5)


def _address(url: str) -> tuple[str, int]:
    parsed = parse_store_url(url)
    return parsed.host, parsed.port


FAMILIES = [FamilySpec("d"), FamilySpec("l", max_versions=1, in_memory=True)]


@pytest.fixture(scope="module")
def prefix() -> str:
    return f"hbspec_{uuid.uuid4().hex[:10]}_"


@pytest.fixture(scope="module")
def table(hbase_url: str, prefix: str) -> Iterator[str]:
    """One table ``t`` shared by the module's tests (creating a table costs about a
    second); each test writes under its own row-key prefix (the ``k`` fixture)."""
    host, port = _address(hbase_url)
    with HBaseStore(host, port, prefix=prefix) as admin:
        admin.create_table("t", FAMILIES)
        yield "t"
        _drop_all(admin)


@pytest.fixture
def k() -> Callable[[bytes], bytes]:
    """Row keys private to one test."""
    token = uuid.uuid4().hex[:8].encode()
    return lambda name: token + b"/" + name


@pytest.fixture
def store(hbase_url: str, prefix: str, table: str) -> Iterator[HBaseStore]:
    host, port = _address(hbase_url)
    s = HBaseStore(host, port, prefix=prefix, pool_size=4, timeout_ms=10_000)
    yield s
    s.close()


@pytest.fixture
def proxy(hbase_url: str) -> Iterator[FaultyProxy]:
    p = FaultyProxy(_address(hbase_url))
    yield p
    p.close()


@pytest.fixture
def proxied(proxy: FaultyProxy, prefix: str, table: str) -> Iterator[HBaseStore]:
    """A store whose only connection goes through the proxy; families already cached, so
    each store call below is exactly one RPC."""
    s = HBaseStore("127.0.0.1", proxy.port, prefix=prefix, pool_size=1, timeout_ms=1_500)
    s.table_families(table)
    yield s
    s.close()


def _drop_all(store: Store) -> None:
    for name in store.list_tables():
        store.drop_table(name)


# --------------------------------------------------------------------------- wrong address


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_connection_refused_is_one_clear_line() -> None:
    port = _free_port()
    with pytest.raises(StoreUnavailableError) as info:
        HBaseStore("127.0.0.1", port, timeout_ms=2_000)
    assert str(info.value) == (
        f"cannot reach HBase Thrift gateway at 127.0.0.1:{port}: connection refused"
    )


def test_a_host_that_is_not_ascii_or_idna_is_refused_before_connecting() -> None:
    # A command-line byte that is not UTF-8 arrives as a lone surrogate; sockets would raise
    # a bare TypeError for it at the first connection.
    with pytest.raises(InvalidArgumentError, match=r"host '\\udcff' is not a host name"):
        HBaseStore("\udcff", 9090)


def test_silent_port_fails_within_the_timeout() -> None:
    # A listener that accepts (the kernel does, from the backlog) but never answers.
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        started = time.monotonic()
        with pytest.raises(StoreUnavailableError) as info:
            HBaseStore("127.0.0.1", port, timeout_ms=400)
        elapsed = time.monotonic() - started
    assert elapsed < 3.0
    message = str(info.value)
    assert f"127.0.0.1:{port}" in message
    assert "no answer within 400 ms" in message
    assert "HBase Thrift-1 gateway" in message


def test_port_answering_garbage_is_reported_as_not_hbase() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]

        def answer_like_http() -> None:
            conn, _ = listener.accept()
            with conn:
                conn.recv(4096)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

        thread = threading.Thread(target=answer_like_http, daemon=True)
        thread.start()
        with pytest.raises(StoreUnavailableError) as info:
            HBaseStore("127.0.0.1", port, timeout_ms=2_000)
        thread.join(timeout=5)
    message = str(info.value)
    assert f"127.0.0.1:{port} did not answer like an HBase Thrift gateway" in message
    assert "HBase Thrift-1 gateway" in message


def test_other_thrift_service_is_reported_as_not_hbase(tmp_path: Path) -> None:
    idl = tmp_path / "other.thrift"
    idl.write_text("service Other { string ping() }\n")
    other = thriftpy2.load(str(idl), module_name="other_thrift")

    class Handler:
        def ping(self) -> str:
            return "pong"

    port = _free_port()
    server = make_server(other.Other, Handler(), "127.0.0.1", port, client_timeout=5_000)
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # wait until it listens
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port)):
                break
            time.sleep(0.02)
        with pytest.raises(StoreUnavailableError) as info:
            HBaseStore("127.0.0.1", port, timeout_ms=2_000)
    finally:
        server.close()
    assert str(info.value).startswith(
        f"127.0.0.1:{port} speaks Thrift but rejected getTableNames (Unknown method)"
    )


# --------------------------------------------------------------------------- reconnects


@pytest.mark.hbase
def test_idle_connection_dropped_by_server_is_replaced(
    proxied: HBaseStore, proxy: FaultyProxy, table: str, k: Callable[[bytes], bytes]
) -> None:
    proxied.put(table, [Put(k(b"r"), "d", b"q", 5, b"v")])
    assert proxy.accepted == 1
    proxy.drop_all()
    time.sleep(0.1)  # let the FIN reach the client's socket
    calls_before = proxied.stats.calls.get("read_rows", 0)
    assert proxied.read_row(table, k(b"r")) == {("d", b"q"): [(5, b"v")]}
    # The dead idle connection was noticed before use: one fresh connection, one RPC.
    assert proxy.accepted == 2
    assert proxied.stats.calls["read_rows"] == calls_before + 1


@pytest.mark.hbase
def test_connection_closed_under_the_pool_is_replaced(
    proxied: HBaseStore, table: str, k: Callable[[bytes], bytes]
) -> None:
    (idle,) = proxied._pool._idle
    idle._transport.close()  # the socket is gone, the pool still holds the connection
    proxied.put(table, [Put(k(b"r"), "d", b"q", 5, b"v")])
    assert proxied.read_row(table, k(b"r")) == {("d", b"q"): [(5, b"v")]}
    assert proxied._pool._idle and proxied._pool._idle[0] is not idle


@pytest.mark.hbase
def test_read_is_retried_once_after_the_connection_breaks_mid_call(
    proxied: HBaseStore, proxy: FaultyProxy, table: str, k: Callable[[bytes], bytes]
) -> None:
    proxied.put(table, [Put(k(b"r"), "d", b"q", 5, b"v")])
    proxy.fault = "drop_reply"
    assert proxied.read_row(table, k(b"r")) == {("d", b"q"): [(5, b"v")]}
    assert proxy.fault is None  # the fault fired
    assert proxy.accepted == 2


@pytest.mark.hbase
def test_put_is_retried_once_after_the_connection_breaks_mid_call(
    proxied: HBaseStore, proxy: FaultyProxy, table: str, k: Callable[[bytes], bytes]
) -> None:
    proxy.fault = "drop_request"
    proxied.put(table, [Put(k(b"r"), "d", b"q", 5, b"v")])
    assert proxy.fault is None
    assert proxied.read_row(table, k(b"r")) == {("d", b"q"): [(5, b"v")]}


@pytest.mark.hbase
def test_stalled_reply_times_out_and_is_never_read_by_a_later_call(
    proxied: HBaseStore, proxy: FaultyProxy, table: str, k: Callable[[bytes], bytes]
) -> None:
    proxied.put(table, [Put(k(b"a"), "d", b"q", 5, b"A"), Put(k(b"b"), "d", b"q", 5, b"B")])
    proxy.fault = "stall_reply"
    started = time.monotonic()
    # The first attempt times out (1.5 s); the retry runs on a fresh connection.
    assert proxied.read_row(table, k(b"a")) == {("d", b"q"): [(5, b"A")]}
    assert 1.2 < time.monotonic() - started < 6
    # Had the timed-out connection been reused, this read could get the stale reply for "a".
    assert proxied.read_row(table, k(b"b")) == {("d", b"q"): [(5, b"B")]}


@pytest.mark.hbase
def test_a_gateway_that_stays_down_gives_store_unavailable(hbase_url: str, prefix: str) -> None:
    proxy = FaultyProxy(_address(hbase_url))
    s = HBaseStore("127.0.0.1", proxy.port, prefix=prefix, pool_size=2, timeout_ms=2_000)
    proxy.close()  # listener gone: reconnects are refused
    with pytest.raises(StoreUnavailableError) as info:
        s.list_tables()
    assert str(info.value) == (
        f"cannot reach HBase Thrift gateway at 127.0.0.1:{proxy.port}: connection refused"
    )
    s.close()


# --------------------------------------------------------------------------- compare-and-set


@pytest.mark.hbase
def test_cas_is_not_retried_when_the_request_is_lost(
    proxied: HBaseStore, proxy: FaultyProxy, table: str, k: Callable[[bytes], bytes]
) -> None:
    proxy.fault = "drop_request"
    with pytest.raises(StoreUnavailableError, match="outcome unknown"):
        proxied.compare_and_set(table, k(b"r"), "l", b"lock", None, b"mine")
    # Never re-sent: the request was dropped, so nothing was written.
    assert proxied.read_row(table, k(b"r")) == {}
    assert proxied.compare_and_set(table, k(b"r"), "l", b"lock", None, b"mine")


@pytest.mark.hbase
def test_cas_whose_reply_is_lost_reports_unknown_though_it_was_applied(
    proxied: HBaseStore, proxy: FaultyProxy, table: str, k: Callable[[bytes], bytes]
) -> None:
    proxy.fault = "drop_reply"
    with pytest.raises(StoreUnavailableError, match="outcome unknown") as info:
        proxied.compare_and_set(table, k(b"r"), "l", b"lock", None, b"mine")
    assert f"127.0.0.1:{proxy.port}" in str(info.value)
    # It was applied: this is why the store must never re-send it (the re-sent CAS would
    # fail and the caller would wrongly conclude it lost).
    cells = proxied.read_row(table, k(b"r"), families=["l"])
    assert [value for _, value in cells[("l", b"lock")]] == [b"mine"]
    assert not proxied.compare_and_set(table, k(b"r"), "l", b"lock", None, b"mine")


@pytest.mark.hbase
def test_cas_stamps_server_time(store: HBaseStore, table: str, k: Callable[[bytes], bytes]) -> None:
    now_ms = time.time_ns() // 1_000_000
    assert store.compare_and_set(table, k(b"r"), "l", b"x", None, b"v")
    ((version, value),) = store.read_row(table, k(b"r"))[("l", b"x")]
    assert value == b"v"
    assert abs(version - now_ms) < 60_000


# --------------------------------------------------------------------------- scans


@pytest.mark.hbase
def test_scan_reopens_after_its_connection_breaks(
    proxied: HBaseStore, proxy: FaultyProxy, table: str, k: Callable[[bytes], bytes]
) -> None:
    rows = [k(b"r%03d" % i) for i in range(25)]
    proxied.put(table, [Put(r, "d", b"q", 7, r) for r in rows])
    scan = proxied.scan(table, "d", ScanOptions(start=k(b""), stop=k(b"\xff"), batch_size=10))
    first = [next(scan) for _ in range(10)]
    proxy.fault = "drop_reply"  # the next scannerGetList reply is lost
    rest = list(scan)
    assert proxy.fault is None
    assert [r for r, _ in first + rest] == rows
    assert all(cells == {b"q": (7, r)} for r, cells in first + rest)


@pytest.mark.hbase
def test_a_scan_reopened_just_before_its_stop_reads_nothing_past_it(
    proxied: HBaseStore, proxy: FaultyProxy, table: str, k: Callable[[bytes], bytes]
) -> None:
    """Re-opened after the row just before ``stop``, the scan would start at ``stop``
    itself, which the Thrift-1 gateway reads as a get of that row."""
    proxied.put(table, [Put(k(b"a"), "d", b"q", 1, b"in"), Put(k(b"a\x00"), "d", b"q", 1, b"out")])
    scan = proxied.scan(table, "d", ScanOptions(start=k(b"a"), stop=k(b"a\x00"), batch_size=1))
    first = next(scan)
    proxy.fault = "drop_reply"  # the next scannerGetList reply is lost
    rest = list(scan)
    assert proxy.fault is None
    assert [row for row, _ in [first, *rest]] == [k(b"a")]


@pytest.fixture
def small_scan_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    """Scans ask for at most 12 cells per scannerGetList: with batches of 3 rows, 4 cells
    per result, so a row of 10 cells comes in 3 results."""
    monkeypatch.setattr(hbase_module, "_SCAN_CELLS_PER_CALL", 12)


#: cells per row of _wide_rows, in row order
WIDTHS = (1, 10, 3, 25, 4, 1, 9)


def _wide_rows(store: HBaseStore, table: str, k: Callable[[bytes], bytes]) -> list[bytes]:
    rows = [k(b"r%02d" % i) for i in range(len(WIDTHS))]
    store.put(
        table,
        [
            Put(r, "d", q, v, x)
            for r, n in zip(rows, WIDTHS, strict=True)
            for q, (v, x) in _row(r, n).items()
        ],
    )
    return rows


def _row(row: bytes, width: int) -> dict[bytes, tuple[int, bytes]]:
    """The cells of a whole row of ``_wide_rows``."""
    return {b"c%02d" % c: (5, b"%s/%d" % (row, c)) for c in range(width)}


@pytest.mark.hbase
@pytest.mark.usefixtures("small_scan_calls")
def test_a_scan_yields_wide_rows_whole_in_bounded_batches(
    store: HBaseStore, table: str, k: Callable[[bytes], bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row wider than a result's cells (TScan.batchSize) comes in several results; the
    scan yields it once, whole, and its limit counts rows."""
    rows = _wide_rows(store, table, k)
    whole = [(r, _row(r, n)) for r, n in zip(rows, WIDTHS, strict=True)]
    cells_per_call: list[int] = []
    real_call = store._call

    def counting_call(op: str, method: str, *args: Any, **kwargs: Any) -> Any:
        answer = real_call(op, method, *args, **kwargs)
        if method == "scannerGetList":
            cells_per_call.append(sum(len(result.columns or {}) for result in answer))
        return answer

    monkeypatch.setattr(store, "_call", counting_call)
    everything = ScanOptions(start=k(b""), stop=k(b"\xff"), batch_size=3)
    assert list(store.scan(table, "d", everything)) == whole
    assert max(cells_per_call) <= 12 and sum(cells_per_call) == sum(WIDTHS), cells_per_call
    limited = ScanOptions(start=k(b""), stop=k(b"\xff"), batch_size=3, limit=4)
    assert list(store.scan(table, "d", limited)) == whole[:4]


@pytest.mark.hbase
@pytest.mark.usefixtures("small_scan_calls")
def test_a_scan_reopened_inside_a_wide_row_reads_it_again_whole(
    proxied: HBaseStore, proxy: FaultyProxy, table: str, k: Callable[[bytes], bytes]
) -> None:
    rows = _wide_rows(proxied, table, k)
    scan = proxied.scan(table, "d", ScanOptions(start=k(b""), stop=k(b"\xff"), batch_size=3))
    first = [next(scan) for _ in range(3)]  # the third, r02, needed r03's first result
    proxy.fault = "drop_reply"  # lost while r03 (25 cells) is part read
    rest = list(scan)
    assert proxy.fault is None
    assert first + rest == [(r, _row(r, n)) for r, n in zip(rows, WIDTHS, strict=True)]


@pytest.mark.hbase
@pytest.mark.usefixtures("small_scan_calls")
def test_a_scan_failing_again_and_again_inside_a_wide_row_gives_up(
    store: HBaseStore, table: str, k: Callable[[bytes], bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second scannerGetList of every scanner fails.  The first call yields r00 and
    reads 8 of r01's 10 cells; after the re-open, one call reads r01 whole but cannot yet
    know it is (that takes r02's first result), and the next call fails again.  No row was
    yielded between the two failures, so the scan raises instead of re-opening for ever."""
    rows = _wide_rows(store, table, k)
    calls_since_open = 0
    reopens = 0
    real_call = store._call

    def failing_call(op: str, method: str, *args: Any, **kwargs: Any) -> Any:
        nonlocal calls_since_open, reopens
        if method == "scannerOpenWithScan":
            calls_since_open = 0
            reopens += 1
        elif method == "scannerGetList":
            calls_since_open += 1
            if calls_since_open == 2:
                raise StoreUnavailableError("injected: the gateway did not answer")
        return real_call(op, method, *args, **kwargs)

    monkeypatch.setattr(store, "_call", failing_call)
    scan = store.scan(table, "d", ScanOptions(start=k(b""), stop=k(b"\xff"), batch_size=3))
    yielded = []
    with pytest.raises(StoreUnavailableError):
        for row, cells in scan:
            yielded.append(row)
            assert cells == _row(row, WIDTHS[rows.index(row)])  # whole, never part of it
    assert (yielded, reopens) == (rows[:1], 2)


@pytest.mark.hbase
@pytest.mark.usefixtures("small_scan_calls")
def test_a_limited_scan_keeps_its_cells_per_call_near_the_limit(
    store: HBaseStore, table: str, k: Callable[[bytes], bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With one row left before the limit, the scan still asks for the results it opened
    with, so a wide last row takes a few calls, not one per result."""
    rows = _wide_rows(store, table, k)
    get_lists = 0
    real_call = store._call

    def counting_call(op: str, method: str, *args: Any, **kwargs: Any) -> Any:
        nonlocal get_lists
        get_lists += method == "scannerGetList"
        return real_call(op, method, *args, **kwargs)

    monkeypatch.setattr(store, "_call", counting_call)
    limited = ScanOptions(start=k(b""), stop=k(b"\xff"), batch_size=3, limit=4)
    found = list(store.scan(table, "d", limited))
    assert [r for r, _ in found] == rows[:4]
    # 1 + 10 + 3 + 25 cells in results of at most 4 cells, 3 results per call:
    # 13 results with the next row's first, 5 calls; one result per call near the limit took 9.
    assert get_lists <= 6, get_lists


@pytest.mark.hbase
def test_scan_closes_its_scanner_when_abandoned(
    store: HBaseStore, table: str, k: Callable[[bytes], bytes]
) -> None:
    store.put(table, [Put(k(b"r%02d" % i), "d", b"q", 1, b"v") for i in range(30)])
    scan = store.scan(table, "d", ScanOptions(start=k(b""), stop=k(b"\xff"), batch_size=5))
    assert isinstance(scan, Generator)
    next(scan)
    calls = store.stats.calls["scan"]
    scan.close()
    assert store.stats.calls["scan"] == calls + 1  # one scannerClose


# --------------------------------------------------------------------------- writes


@pytest.mark.hbase
def test_put_groups_by_version_in_one_call(
    store: HBaseStore, table: str, k: Callable[[bytes], bytes]
) -> None:
    r1, r2 = k(b"r1"), k(b"r2")
    store.table_families(table)  # cache the families: count only the puts below
    before = store.stats.calls.get("put", 0)
    store.put(
        table,
        [
            Put(r1, "d", b"a", 10, b"r1a@10"),
            Put(r1, "d", b"a", 20, b"r1a@20"),
            Put(r2, "d", b"a", 10, b"r2a@10"),
            Put(r1, "d", b"b", 30, b""),
            Put(r2, "d", b"b", 20, b"first"),
            Put(r2, "d", b"b", 20, b"r2b@20"),  # same cell and version: the last one wins
            Put(r1, "l", b"x", 10, b"lock@10"),
        ],
    )
    assert store.stats.calls["put"] - before == 3  # versions 10, 20, 30
    got = store.read_rows(table, [r1, r2], [("d", b"a"), ("d", b"b"), ("l", b"x")], max_versions=9)
    assert got == {
        r1: {
            ("d", b"a"): [(20, b"r1a@20"), (10, b"r1a@10")],
            ("d", b"b"): [(30, b"")],
            ("l", b"x"): [(10, b"lock@10")],
        },
        r2: {
            ("d", b"a"): [(10, b"r2a@10")],
            ("d", b"b"): [(20, b"r2b@20")],
        },
    }


@pytest.mark.hbase
def test_batched_delete_removes_versions_at_or_below_and_masks_later_puts(
    store: HBaseStore, table: str, k: Callable[[bytes], bytes]
) -> None:
    r1, r2 = k(b"r1"), k(b"r2")
    store.put(
        table,
        [
            Put(r, "d", q, v, b"%d" % v)
            for r in (r1, r2)
            for q in (b"a", b"b")
            for v in (10, 20, 30)
        ],
    )
    before = store.stats.calls.get("delete_versions", 0)
    store.delete_versions(
        table, [Delete(r1, "d", b"a", 20), Delete(r2, "d", b"b", 20), Delete(r1, "d", b"b", 10)]
    )
    assert store.stats.calls["delete_versions"] - before == 2  # timestamps 20 and 10
    got = store.read_rows(table, [r1, r2], [("d", b"a"), ("d", b"b")], max_versions=10)
    assert got[r1][("d", b"a")] == [(30, b"30")]
    assert got[r1][("d", b"b")] == [(30, b"30"), (20, b"20")]
    assert got[r2][("d", b"a")] == [(30, b"30"), (20, b"20"), (10, b"10")]
    assert got[r2][("d", b"b")] == [(30, b"30")]
    # The delete marker also hides a put at or below its timestamp written afterwards.
    store.put(table, [Put(r1, "d", b"a", 15, b"late"), Put(r1, "d", b"a", 25, b"25")])
    got = store.read_rows(table, [r1], [("d", b"a")], max_versions=10)
    assert got[r1][("d", b"a")] == [(30, b"30"), (25, b"25")]


@pytest.mark.hbase
def test_large_and_empty_values(store: HBaseStore, table: str, k: Callable[[bytes], bytes]) -> None:
    big = bytes(range(256)) * (5 * 1024 * 1024 // 256)
    store.put(table, [Put(k(b"big"), "d", b"q", 1, big), Put(k(b"empty"), "d", b"q", 1, b"")])
    assert store.read_row(table, k(b"big")) == {("d", b"q"): [(1, big)]}
    assert store.read_row(table, k(b"empty")) == {("d", b"q"): [(1, b"")]}


@pytest.mark.hbase
def test_unknown_family_is_rejected_before_anything_is_written(
    store: HBaseStore, table: str, k: Callable[[bytes], bytes]
) -> None:
    with pytest.raises(InvalidArgumentError, match="unknown family 'zz'"):
        store.put(table, [Put(k(b"r1"), "d", b"q", 1, b"v"), Put(k(b"r2"), "zz", b"q", 1, b"v")])
    assert store.read_rows(table, [k(b"r1"), k(b"r2")]) == {}


@pytest.mark.hbase
def test_concurrent_use_never_exceeds_the_pool(
    proxy: FaultyProxy, prefix: str, table: str, k: Callable[[bytes], bytes]
) -> None:
    s = HBaseStore("127.0.0.1", proxy.port, prefix=prefix, pool_size=2, timeout_ms=10_000)
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            for i in range(15):
                row = k(b"w%d-%d" % (n, i))
                s.put(table, [Put(row, "d", b"q", 1, row)])
                assert s.read_row(table, row, families=["d"]) == {("d", b"q"): [(1, row)]}
                assert s.compare_and_set(table, row, "l", b"x", None, row)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    try:
        threads = [threading.Thread(target=work, args=(n,)) for n in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert errors == []
        assert proxy.accepted <= 2
    finally:
        s.close()


# --------------------------------------------------------------------------- admin


@pytest.mark.hbase
def test_create_table_applies_family_options(hbase_url: str) -> None:
    host, port = _address(hbase_url)
    prefix = f"hbspec_{uuid.uuid4().hex[:10]}_"
    families = [
        FamilySpec("d"),
        FamilySpec("l", max_versions=1, in_memory=True),
        FamilySpec("x", max_versions=5, block_cache=False),
    ]
    with HBaseStore(host, port, prefix=prefix) as store:
        store.create_table("opts", families)
        try:
            # Read the descriptors over a raw connection, independent of the store's parsing.
            raw = happybase.Connection(host, port, timeout=10_000)
            try:
                descriptors = raw.client.getColumnDescriptors((prefix + "opts").encode())
            finally:
                raw.close()
            options = {
                name: (d.maxVersions, d.inMemory, d.blockCacheEnabled, d.bloomFilterType)
                for name, d in descriptors.items()
            }
            assert options == {
                b"d:": (2**31 - 1, False, True, b"ROW"),
                b"l:": (1, True, True, b"ROW"),
                b"x:": (5, False, False, b"ROW"),
            }
            assert store.table_families("opts") == families
            # max_versions is enforced by the server (Thrift-1's default would be 3).
            store.put("opts", [Put(b"r", f, b"q", v, b"%d" % v) for f in "dx" for v in range(1, 8)])
            got = store.read_rows("opts", [b"r"], [("x", b"q"), ("d", b"q")], max_versions=100)
            assert [v for v, _ in got[b"r"][("x", b"q")]] == [7, 6, 5, 4, 3]
            assert [v for v, _ in got[b"r"][("d", b"q")]] == [7, 6, 5, 4, 3, 2, 1]
        finally:
            _drop_all(store)


@pytest.mark.hbase
def test_table_prefix_isolates_stores(hbase_url: str) -> None:
    host, port = _address(hbase_url)
    run = uuid.uuid4().hex[:8]
    a = HBaseStore(host, port, prefix=f"hbspec_{run}_a_")
    b = HBaseStore(host, port, prefix=f"hbspec_{run}_b_")
    bare = HBaseStore(host, port)
    try:
        a.create_table("t", FAMILIES)
        b.create_table("t", FAMILIES)
        a.create_table("only_a", [FamilySpec("d")])
        assert a.list_tables() == ["only_a", "t"]
        assert b.list_tables() == ["t"]
        assert not b.table_exists("only_a")
        # The HBase table name is the prefix followed by the name.
        assert {f"hbspec_{run}_a_t", f"hbspec_{run}_b_t"} <= set(bare.list_tables())
        a.put("t", [Put(b"r", "d", b"q", 1, b"from a")])
        assert b.read_row("t", b"r") == {}
        assert a.read_row("t", b"r") == {("d", b"q"): [(1, b"from a")]}
        # The family cache of ``a`` follows a table that ``b``'s twin re-created.
        with HBaseStore(host, port, prefix=f"hbspec_{run}_a_") as twin:
            twin.drop_table("t")
            twin.create_table("t", [FamilySpec("e")])
        a.put("t", [Put(b"r", "e", b"q", 1, b"v")])
        assert a.read_row("t", b"r") == {("e", b"q"): [(1, b"v")]}
    finally:
        for s in (a, b):
            _drop_all(s)
            s.close()
        bare.close()

"""The Thrift transport and protocol of an HBase store URL (``?transport=framed&protocol=compact``).

The shared test HBase runs its Thrift gateway with the defaults (buffered transport, binary
protocol), so framed/compact is checked against a small Thrift-1 server speaking HBase's
interface with those settings (thriftpy2, the same library happybase uses), and the real
HBase checks that the default and the explicit default still work and that a mismatch is
one clear error.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from happybase.connection import Hbase
from Hbase_thrift import ColumnDescriptor
from thriftpy2.protocol import TBinaryProtocolFactory, TCompactProtocolFactory
from thriftpy2.rpc import make_server
from thriftpy2.thrift import TClient
from thriftpy2.transport import TBufferedTransportFactory, TFramedTransportFactory

from percolator.errors import ConfigError, InvalidArgumentError, StoreUnavailableError
from percolator.store import hbase as hbase_module
from percolator.store import url as url_module
from percolator.store.backends import with_url_options
from percolator.store.base import CompareAndSet
from percolator.store.hbase import HBaseStore
from percolator.store.url import open_store, parse_store_url


def test_options_are_parsed_and_validated() -> None:
    parsed = parse_store_url("hbase://h:9090?transport=framed&protocol=compact&prefix=p_")
    assert parsed.options == {"transport": "framed", "protocol": "compact", "prefix": "p_"}
    assert str(parsed) == "hbase://h:9090?prefix=p_&protocol=compact&transport=framed"
    assert parse_store_url("hbase://h:9090").options == {}
    with pytest.raises(ConfigError, match=r"transport must be one of buffered, framed \(got 'ht"):
        parse_store_url("hbase://h:9090?transport=http")
    with pytest.raises(ConfigError, match=r"protocol must be one of binary, compact \(got 'js"):
        parse_store_url("hbase://h:9090?protocol=json")
    with pytest.raises(InvalidArgumentError, match="transport must be one of"):
        HBaseStore("h", 9090, transport="Framed")
    # The URL parser and the store agree on the values (the store is importable alone).
    assert url_module.HBASE_TRANSPORTS == hbase_module.TRANSPORTS
    assert url_module.HBASE_PROTOCOLS == hbase_module.PROTOCOLS


class _Tables:
    """Enough of HBase's Thrift-1 interface for opening a store, listing tables and
    compare-and-sets on table ``t`` (family ``l``), kept in memory."""

    def __init__(self) -> None:
        self.cells: dict[tuple[bytes, bytes], bytes] = {}
        self.calls = 0

    def getTableNames(self) -> list[bytes]:
        return [b"p_t", b"other"]

    def getColumnDescriptors(self, tableName: bytes) -> dict[bytes, Any]:
        return {b"l:": ColumnDescriptor(name=b"l:", maxVersions=1)}

    def checkAndPut(
        self,
        tableName: bytes,
        row: bytes,
        column: bytes,
        value: bytes | None,
        mput: Any,
        attributes: Any,
    ) -> bool:
        self.calls += 1
        if self.cells.get((row, column)) != value:
            return False
        self.cells[(row, column)] = mput.value
        return True


@pytest.fixture
def tables() -> _Tables:
    return _Tables()


@pytest.fixture(params=[("framed", "compact"), ("framed", "binary"), ("buffered", "compact")])
def gateway(request: pytest.FixtureRequest, tables: _Tables) -> Iterator[tuple[int, str, str]]:
    transport, protocol = request.param
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = make_server(
        Hbase,
        tables,
        "127.0.0.1",
        port,
        proto_factory=(
            TCompactProtocolFactory if protocol == "compact" else TBinaryProtocolFactory
        )(),
        trans_factory=(
            TFramedTransportFactory if transport == "framed" else TBufferedTransportFactory
        )(),
    )
    server.daemon = True
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while True:  # serve() binds in its thread: wait until it listens
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)
    try:
        yield port, transport, protocol
    finally:
        server.close()


def test_a_gateway_with_other_settings_is_reached_with_the_url_options(
    gateway: tuple[int, str, str],
) -> None:
    port, transport, protocol = gateway
    url = f"hbase://127.0.0.1:{port}?prefix=p_&transport={transport}&protocol={protocol}"
    store = open_store(url)
    try:
        assert store.list_tables() == ["t"]
        options = ["prefix=p_"]
        options += [f"transport={transport}"] if transport != "buffered" else []
        options += [f"protocol={protocol}"] if protocol != "binary" else []
        assert store.url == f"hbase://127.0.0.1:{port}?" + "&".join(options)
        # The pooled connection's socket is found through this transport too, so the pool's
        # liveness check keeps reusing it instead of reconnecting every time.
        conn = store._pool.acquire()  # type: ignore[attr-defined]
        try:
            assert conn.looks_alive()
        finally:
            store._pool.release(conn)  # type: ignore[attr-defined]
    finally:
        store.close()


def test_compare_and_sets_sent_back_to_back_are_answered_in_order(
    gateway: tuple[int, str, str], tables: _Tables
) -> None:
    # compare_and_set_many sends a connection's requests before reading any answer, one
    # flush per request: a framed transport must still see one request per frame, and each
    # answer must reach its own request, whatever the transport and protocol.
    port, transport, protocol = gateway
    for i in range(0, 300, 3):
        tables.cells[(b"r%03d" % i, b"l:q")] = b"taken"
    url = f"hbase://127.0.0.1:{port}?prefix=p_&transport={transport}&protocol={protocol}"
    store = open_store(url)
    try:
        items = [CompareAndSet(b"r%03d" % i, "l", b"q", None, b"v%d" % i) for i in range(300)]
        assert store.compare_and_set_many("t", items) == [i % 3 != 0 for i in range(300)]
    finally:
        store.close()
    assert tables.calls == 300
    assert all(
        tables.cells[(b"r%03d" % i, b"l:q")] == (b"taken" if i % 3 == 0 else b"v%d" % i)
        for i in range(300)
    )


def test_the_defaults_against_a_framed_compact_gateway_fail_with_a_hint(
    gateway: tuple[int, str, str],
) -> None:
    port, _, _ = gateway  # every gateway here differs from the defaults in some way
    with pytest.raises(StoreUnavailableError) as raised:
        open_store(f"hbase://127.0.0.1:{port}?timeout_ms=2000")
    message = str(raised.value)
    assert "buffered transport and the binary protocol" in message
    assert "transport= and protocol=" in message


@pytest.mark.hbase
def test_the_shared_hbase_with_the_default_and_the_explicit_default(hbase_url: str) -> None:
    for url in (hbase_url, with_url_options(hbase_url, transport="buffered", protocol="binary")):
        store = open_store(url)
        try:
            store.list_tables()
            assert "transport" not in store.url and "protocol" not in store.url
        finally:
            store.close()


@pytest.mark.hbase
def test_framed_compact_against_the_buffered_binary_hbase_is_one_clear_error(
    hbase_url: str,
) -> None:
    with pytest.raises(StoreUnavailableError) as raised:
        framed = with_url_options(hbase_url, transport="framed", protocol="compact")
        open_store(with_url_options(framed, timeout_ms="3000"))
    assert "framed transport and the compact protocol" in str(raised.value)


class _Interrupt(BaseException):
    """Stands for KeyboardInterrupt or SystemExit arriving mid-call."""


@pytest.mark.timeout(60)
def test_an_interrupt_while_sending_leaves_no_connection_behind(
    gateway: tuple[int, str, str], tables: _Tables, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An interrupt while a pipelined call writes its requests: the call raises it at once,
    # and the connections it held are dropped, so a pool of two still serves the next call.
    port, transport, protocol = gateway
    url = (
        f"hbase://127.0.0.1:{port}?prefix=p_&transport={transport}&protocol={protocol}"
        "&pool_size=2&timeout_ms=2000"
    )
    store = open_store(url)
    try:
        sends = iter(range(10**6))
        real_send = TClient._send

        def send(self: Any, api: str, **kwargs: Any) -> None:
            if api == "checkAndPut" and next(sends) == 3:
                raise _Interrupt
            real_send(self, api, **kwargs)

        monkeypatch.setattr(TClient, "_send", send)
        items = [CompareAndSet(b"i%02d" % i, "l", b"q", None, b"v") for i in range(8)]
        with pytest.raises(_Interrupt):
            store.compare_and_set_many("t", items)
        monkeypatch.undo()
        more = [CompareAndSet(b"j%02d" % i, "l", b"q", None, b"v") for i in range(8)]
        assert store.compare_and_set_many("t", more) == [True] * 8
    finally:
        store.close()


@pytest.mark.timeout(60)
def test_an_interrupt_while_opening_an_extra_connection_leaves_none_behind(
    gateway: tuple[int, str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    port, transport, protocol = gateway
    url = (
        f"hbase://127.0.0.1:{port}?prefix=p_&transport={transport}&protocol={protocol}"
        "&pool_size=2&timeout_ms=2000"
    )
    store = open_store(url)  # opens (and keeps idle) one connection
    try:
        real_open = hbase_module._thrift1_connection

        def open_connection(*args: Any) -> Any:
            raise _Interrupt

        monkeypatch.setattr(hbase_module, "_thrift1_connection", open_connection)
        items = [CompareAndSet(b"k%02d" % i, "l", b"q", None, b"v") for i in range(8)]
        with pytest.raises(_Interrupt):
            store.compare_and_set_many("t", items)  # a second connection fails to open
        # No call is running, so no connection may be lent out: each one the pool counts
        # as open is idle (a lost one would stay counted, shrinking the pool for good).
        pool = store._pool  # type: ignore[attr-defined]
        assert pool._open == len(pool._idle) == 1
        monkeypatch.setattr(hbase_module, "_thrift1_connection", real_open)
        assert store.compare_and_set_many("t", items) == [True] * 8
    finally:
        store.close()

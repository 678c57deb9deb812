"""The HBase backend: HBase through its Thrift-1 gateway (the protocol happybase speaks),
and its Thrift-2 gateway, where one is given, for compare-and-sets that carry puts and for
reads of exactly the cells named (``read_cells``).

``HBaseStore(host, port, prefix=..., pool_size=..., timeout_ms=..., thrift2_port=...)`` is
what ``open_store("hbase://HOST:PORT?prefix=P&pool_size=N&timeout_ms=T&thrift2_port=Q")``
builds.  With ``thrift2_port`` the store has :attr:`~Store.conditional_puts`: a
compare-and-set with ``then_put`` is one Thrift-2 ``checkAndPut`` whose ``TPut`` holds the
new cell (stamped by the server) and the riding cells at their own versions, one atomic row
operation (:mod:`percolator.store.thrift2`).  Without it such a compare-and-set is refused,
and ``read_cells`` reads the cross product of its rows and columns through Thrift-1.

How each :class:`~percolator.store.base.Store` operation maps to Thrift-1
------------------------------------------------------------------------
=====================  ==========================================================  ===========
operation              Thrift-1 calls                                              round trips
=====================  ==========================================================  ===========
``read_rows``, 1 ver.  ``getRows[WithColumns][Ts]`` for all rows at once           1
``read_rows``, n ver.  ``getVerTs`` per (row, explicit column)                     rows*columns
``read_cells``         ``getRowsWithColumnsTs`` (rows x columns); when that is 8x   1
                       the cells or more, Thrift-2 ``getMultiple`` (exactly the
                       cells; ``thrift2_port`` only)
``put``                ``mutateRowsTs`` per distinct version (Thrift-1 mutations   versions
                       carry no timestamp of their own); several versions with     (1 with
                       ``thrift2_port``: one Thrift-2 ``putMultiple``              Thrift-2)
``delete_versions``    ``mutateRowsTs`` with delete mutations, per distinct ts;    timestamps
                       several timestamps with ``thrift2_port``: one Thrift-2      (1 with
                       ``deleteMultiple``                                          Thrift-2)
``compare_and_set``    ``checkAndPut``                                             1
... with ``then_put``  Thrift-2 ``checkAndPut`` (``thrift2_port`` only)            1
``scan``               ``scannerOpenWithScan``, ``scannerGetList`` per batch,      2 + batches
                       ``scannerClose``
=====================  ==========================================================  ===========

Facts this module relies on (checked against HBase 2.6 by ``tests/store``):

* Timestamped reads (``get*Ts``, ``TScan.timestamp``) return versions **strictly below**
  the timestamp, which is exactly the store's exclusive ``before``.
* A delete mutation with a column, sent through ``mutateRowsTs(..., ts)``, removes every
  version of that cell **at or below** ``ts`` and masks puts at or below ``ts`` written later.
* ``checkAndPut`` with ``expected=None`` matches an absent or empty cell, and stamps the
  written cell with the server's clock in milliseconds.
* Column names go on the wire as ``b"family:qualifier"`` (an empty qualifier is
  ``b"family:"``, a cell of its own) and a whole family as ``b"family"``.

Atomicity on this backend
-------------------------
* ``put`` is atomic per **(row, version)**: all cells of one row that share a version go in
  one HBase ``Put``.  Cells of one row at *different* versions travel in different RPCs and
  may land separately.  Groups are sent in the order their versions first appear in the
  call, so a caller can order them.
* ``read_rows`` with ``max_versions=1`` reads each row as one HBase ``Get``: a consistent
  snapshot of the row.  With ``max_versions > 1`` each (row, column) is its own ``Get``
  (Thrift-1 cannot return several versions of several columns in one call): each cell is a
  snapshot of itself, the columns of one row together are not.
* ``compare_and_set`` is one ``checkAndPut`` (a single-row atomic operation in HBase);
  ``compare_and_set_many`` is one per item, pipelined (:class:`_Pipeline`).

Connections, retries and errors
-------------------------------
The store keeps a pool of at most ``pool_size`` Thrift connections, opened lazily.  A
connection that saw any transport or protocol error is closed and dropped, never reused
(its byte stream may hold half a reply).  An idle connection is checked before each use: if
its socket is readable (the gateway closed it, or sent bytes nobody asked for) it is
replaced first, so a dead idle connection never eats a request.

Idempotent operations (reads, puts, deletes, scanner opens, admin reads) are retried
**once** on a fresh connection after a transport error.  ``compare_and_set`` is never
retried: after a transport error, or a server error that does not prove the write was
refused, it raises :class:`~percolator.errors.StoreUnavailableError` saying the outcome is
unknown.  ``create_table`` and ``drop_table`` are not retried either (a second attempt
could report a misleading "exists" / "does not exist").

After ``os.fork`` the child opens connections of its own: the parent's share their
sockets with it, and two processes talking over one Thrift stream read each other's replies
(a silent wrong read).  The child's copy of each parent socket is closed without a
``shutdown``, which would end the parent's connection too (:meth:`_Connection.forget`), and
its pools, call threads and locks start empty.

Errors: transport failures, timeouts and HBase's own "cannot reach the region server"
errors become :class:`~percolator.errors.StoreUnavailableError` naming ``host:port``; an
unknown table becomes :class:`~percolator.errors.TableNotFoundError`; other server errors
become :class:`~percolator.errors.StoreError` with the first line of the server's message.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, NoReturn

import happybase

# ``Hbase_thrift`` is HBase's Thrift-1 IDL, which importing happybase loads as a module.
from Hbase_thrift import (
    AlreadyExists,
    BatchMutation,
    ColumnDescriptor,
    IllegalArgument,
    Mutation,
    TScan,
)
from Hbase_thrift import IOError as HBaseIOError
from thriftpy2.protocol.exc import TProtocolException
from thriftpy2.thrift import TApplicationException, TDecodeException, args_to_kwargs
from thriftpy2.transport import TTransportException

from percolator.concurrency import renew_after_fork, run_all
from percolator.errors import (
    InvalidArgumentError,
    StoreError,
    StoreUnavailableError,
    TableExistsError,
    TableNotFoundError,
)
from percolator.hostnames import encodable_host
from percolator.store import thrift2
from percolator.store.base import (
    MAX_ROW_LENGTH,
    Column,
    CompareAndSet,
    Delete,
    FamilySpec,
    Put,
    RowCells,
    ScanOptions,
    Store,
    Version,
    split_cells,
)

# The argument checks shared by every backend, so invalid calls fail identically everywhere.
from percolator.store.checks import (
    MAX_BEFORE,
    check_compare_and_set,
    check_compare_and_sets,
    check_delete,
    check_family_name,
    check_family_specs,
    check_put,
    check_read_args,
    check_scan_options,
    check_sequence,
    check_table_name,
)


def _cython_protocol_error() -> type[Exception]:
    """The compiled binary protocol raises its own error type for garbled input."""
    try:
        from thriftpy2.protocol import cybin
    except ImportError:  # pure-Python thriftpy2 build
        return TProtocolException
    found = getattr(cybin, "ProtocolError", None)
    return found if isinstance(found, type) and issubclass(found, Exception) else TProtocolException


_CyProtocolError = _cython_protocol_error()

# Errors that mean "the connection (or the bytes on it) cannot be trusted any more".
_TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (
    TTransportException,
    TProtocolException,
    TDecodeException,
    _CyProtocolError,
    OSError,  # includes socket.timeout / TimeoutError, ConnectionResetError, BrokenPipeError
    EOFError,
)
# Exceptions the gateway declares in its IDL: a complete reply, the connection stays usable.
_SERVER_ERRORS: tuple[type[BaseException], ...] = (HBaseIOError, IllegalArgument, AlreadyExists)
# The same for the Thrift-2 gateway's calls.
_SERVER_ERRORS_2: tuple[type[BaseException], ...] = (thrift2.TIOError, thrift2.TIllegalArgument)

# A table prefix must keep prefixed names valid HBase table names (no namespace: the prefix
# plays that role).
_PREFIX = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")

# Keep one mutateRowsTs request well below the gateway's maximum Thrift message size
# (libthrift's default is 100 MB); a single row is never split, so one huge row may exceed it.
_MAX_BATCH_BYTES = 32 * 1024 * 1024
_MAX_BATCH_MUTATIONS = 20_000

# read_cells goes through Thrift-2's getMultiple (exactly the cells) rather than Thrift-1's
# cross product of rows and columns once that product is this many times the cells named.
# Measured (bench/read_cells_bench.py): below it the two cost the same within noise, above
# it the cross product grows with rows x columns (20x slower at 512 rows of one column).
_EXACT_READ_FACTOR = 8
# The most cells one scannerGetList asks the Thrift gateway for (TScan.batchSize x caching):
# about 10 MB of small cells, whatever the width of the rows scanned.
_SCAN_CELLS_PER_CALL = 100_000

# HBase's region lookup key is ``<table>,<row>,99999999999999``: the row plus the table name
# plus 16 bytes must fit in 32767 (see HBaseStore.max_row_length).
_META_KEY_OVERHEAD = 16

# Server-side messages that mean "HBase behind the gateway is unreachable or overloaded":
# the request may be re-run later, so they map to StoreUnavailableError, not StoreError.
_UNAVAILABLE_MARKERS = (
    "RetriesExhaustedException",
    "SocketTimeoutException",
    "CallTimeoutException",
    "ConnectException",
    "NotServingRegionException",
    "RegionOfflineException",
    "ServerNotRunningYetException",
    "PleaseHoldException",
    "RegionTooBusyException",
    "CallQueueTooBigException",
    "TimeoutIOException",
    "MasterNotRunningException",
)


def _text(raw: object) -> str:
    if isinstance(raw, bytes):
        return raw.decode("utf-8", "replace")
    return "" if raw is None else str(raw)


def _short(message: str, limit: int = 240) -> str:
    """First line of a (Java) server message, cut to ``limit`` characters."""
    first = message.strip().splitlines()[0] if message.strip() else "(no message)"
    return first if len(first) <= limit else first[: limit - 3] + "..."


def _server_message(exc: BaseException) -> str:
    return _text(getattr(exc, "message", None)) or str(exc) or type(exc).__name__


def _transport_reason(exc: BaseException, timeout_ms: int) -> str:
    """A short human reason for a transport-level failure."""
    cause: BaseException | None = exc
    # TSocket.open() raises TTransportException("Could not connect") from the OSError.
    if isinstance(exc, TTransportException) and isinstance(exc.__context__, OSError):
        cause = exc.__context__
    if isinstance(cause, ConnectionRefusedError):
        return "connection refused"
    if isinstance(cause, socket.timeout | TimeoutError):
        return f"no answer within {timeout_ms} ms"
    if isinstance(cause, socket.gaierror):
        return f"cannot resolve host name ({cause.strerror})"
    if isinstance(cause, ConnectionResetError | BrokenPipeError):
        return "connection reset by the gateway"
    if isinstance(cause, TTransportException) and cause.type == TTransportException.END_OF_FILE:
        return "connection closed by the gateway"
    if isinstance(cause, _CyProtocolError | TProtocolException | TDecodeException):
        return f"garbled reply ({cause})"
    if isinstance(cause, OSError):
        return cause.strerror or str(cause) or type(cause).__name__
    return str(cause) or type(exc).__name__


def _chunks(batches: list[Any]) -> Iterator[list[Any]]:
    """Split Thrift-1 row batches into requests of bounded size, never splitting a row."""
    return _bounded(
        batches,
        lambda b: (
            len(b.row) + sum(len(m.column) + len(m.value or b"") + 16 for m in b.mutations),
            len(b.mutations),
        ),
    )


def _tput_chunks(tputs: list[Any]) -> Iterator[list[Any]]:
    """Split Thrift-2 ``TPut`` s into requests of bounded size, never splitting a row."""
    return _bounded(
        tputs,
        lambda t: (
            len(t.row)
            + sum(len(c.family) + len(c.qualifier) + len(c.value) + 24 for c in t.columnValues),
            len(t.columnValues),
        ),
    )


def _tdelete_chunks(tdeletes: list[Any]) -> Iterator[list[Any]]:
    """Split Thrift-2 ``TDelete`` s into requests of bounded size, never splitting a row."""
    return _bounded(
        tdeletes,
        lambda t: (
            len(t.row) + sum(len(c.family) + len(c.qualifier) + 24 for c in t.columns),
            len(t.columns),
        ),
    )


def _bounded(rows: list[Any], measure: Callable[[Any], tuple[int, int]]) -> Iterator[list[Any]]:
    """``rows`` in requests of at most :data:`_MAX_BATCH_BYTES` and
    :data:`_MAX_BATCH_MUTATIONS` (``measure``: a row's bytes and cells); a row bigger than
    that goes alone."""
    chunk: list[Any] = []
    size = 0
    mutations = 0
    for row in rows:
        row_size, row_mutations = measure(row)
        if chunk and (
            size + row_size > _MAX_BATCH_BYTES or mutations + row_mutations > _MAX_BATCH_MUTATIONS
        ):
            yield chunk
            chunk, size, mutations = [], 0, 0
        chunk.append(row)
        size += row_size
        mutations += row_mutations
    if chunk:
        yield chunk


#: happybase's Thrift transports and protocols, the default first (HBase's own defaults)
TRANSPORTS = ("buffered", "framed")
PROTOCOLS = ("binary", "compact")


class _Connection:
    """One Thrift connection: a client and the transport it talks through (Thrift-1 from
    :func:`_thrift1_connection`, Thrift-2 from :func:`_thrift2_connection`).  Not
    thread-safe: the pool lends it to one thread at a time."""

    def __init__(self, client: Any, transport: Any, owner: object = None) -> None:
        self.client: Any = client
        self._transport: Any = transport
        # What opened them, if it must live as long (happybase closes the transport when
        # its Connection is garbage-collected).
        self._owner = owner
        #: the process that opened it: only that one may use it (module docstring)
        self.pid = os.getpid()
        _live_connections.add(self)

    def _socket(self) -> socket.socket | None:
        # The compiled buffered transport exposes the raw socket as ``.sock``; the pure-Python
        # one wraps a TSocket (``._trans``) whose ``.sock`` is the raw socket.
        transport = self._transport
        sock = getattr(transport, "sock", None)
        if sock is None:
            sock = getattr(getattr(transport, "_trans", None), "sock", None)
        return sock if isinstance(sock, socket.socket) else None

    def looks_alive(self) -> bool:
        """False if the idle socket is closed or readable.

        Between requests a healthy Thrift connection has nothing to read; a readable
        socket means the gateway closed it (EOF) or sent something unexpected.  Either way
        the next request on it would fail or read a stale reply.
        """
        sock = self._socket()
        if sock is None:
            return False
        try:
            if hasattr(select, "poll"):
                poller = select.poll()
                poller.register(sock, select.POLLIN | select.POLLERR | select.POLLHUP)
                return not poller.poll(0)
            readable, _, errored = select.select([sock], [], [sock], 0)
            return not readable and not errored
        except (OSError, ValueError):
            return False

    def close(self) -> None:
        # Closing a broken socket may fail; it is gone either way.
        with contextlib.suppress(Exception):
            self._transport.close()

    def forget(self) -> None:
        """In a forked child, let go of a connection the parent opened without disturbing
        the parent's use of it: the child's copy of the socket is closed here, never shut
        down (a Thrift transport's ``close`` shuts the socket down, which would end the
        connection for the parent as well), so a later close or garbage collection in the
        child reaches nothing."""
        sock = self._socket()
        if sock is not None:
            with contextlib.suppress(OSError):
                os.close(sock.detach())


#: every open connection of this process and, in a forked child, of its parent
_live_connections: weakref.WeakSet[_Connection] = weakref.WeakSet()


def _forget_parent_connections() -> None:
    """In a forked child (each pool calls this first): let go of every connection the
    parent opened, idle or lent out to one of its threads."""
    pid = os.getpid()
    for conn in list(_live_connections):
        if conn.pid != pid:
            conn.forget()
            _live_connections.discard(conn)


def _thrift1_connection(
    host: str, port: int, timeout_ms: int, transport: str, protocol: str
) -> _Connection:
    # autoconnect=False and no table_prefix: the store applies its own prefix and uses the
    # raw Thrift client, so happybase only sets up socket + protocol.
    hb = happybase.Connection(
        host, port, timeout=timeout_ms, autoconnect=False, transport=transport, protocol=protocol
    )
    hb.open()
    return _Connection(hb.client, hb.transport, owner=hb)


def _thrift2_connection(
    host: str, port: int, timeout_ms: int, transport: str, protocol: str
) -> _Connection:
    """The Thrift-2 gateway's client (:mod:`percolator.store.thrift2`), with the same
    transport and protocol classes as happybase uses for Thrift-1."""
    return _Connection(*thrift2.connect(host, port, timeout_ms, transport, protocol))


class _ConnectionPool:
    """At most ``size`` connections, created lazily, reused last-in-first-out.

    happybase's own ``ConnectionPool`` is not used because it cannot be closed, and because
    it re-opens a connection after *any* Thrift exception (including "table not found"),
    inside its error handler, where a failing re-open would hide the original error.
    """

    def __init__(self, factory: Callable[[], _Connection], size: int, wait_s: float) -> None:
        self._factory = factory
        self._size = size
        self._wait_s = wait_s
        self._idle: list[_Connection] = []
        self._open = 0  # connections created and not yet discarded (idle + lent out)
        self._closed = False
        self._cond = threading.Condition()
        renew_after_fork(self)

    def _after_fork_in_child(self) -> None:
        """The child's pool starts empty: every connection so far is the parent's.  They
        are let go of first, so that dropping them here cannot shut a socket down."""
        _forget_parent_connections()
        self._idle = []
        self._open = 0
        self._cond = threading.Condition()

    def acquire(self) -> _Connection:
        """A live connection.  Raises TimeoutError if none frees up in time, RuntimeError if
        the pool is closed, or whatever opening a new connection raises."""
        deadline = time.monotonic() + self._wait_s
        with self._cond:
            while True:
                if self._closed:
                    raise RuntimeError("closed")
                claimed, conn = self._claim()
                if claimed:
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"all {self._size} connections stayed busy")
                self._cond.wait(remaining)
        return self._live(conn)

    def try_acquire(self) -> _Connection | None:
        """A live connection if one is idle or may be opened now, else None: never waits
        for another thread to release one.  None too if the pool is closed or opening a
        connection fails (the caller holds one already, which will report the trouble)."""
        with self._cond:
            if self._closed:
                return None
            claimed, conn = self._claim()
            if not claimed:
                return None
        try:
            return self._live(conn)
        except Exception:
            return None

    def _claim(self) -> tuple[bool, _Connection | None]:
        """Under ``_cond``: an idle connection, or a slot for a new one (counted in
        ``_open``; the connection None), as ``(True, conn)``; ``(False, None)`` if every
        connection is lent out."""
        if self._idle:
            return True, self._idle.pop()
        if self._open < self._size:
            self._open += 1
            return True, None
        return False, None

    def _live(self, conn: _Connection | None) -> _Connection:
        """``conn`` (taken from the idle list) if it looks alive, else a new connection in
        its slot; a new one too if ``conn`` is None (a slot just counted in ``_open``).
        If opening fails the slot is given back and the error raised."""
        if conn is not None:
            if conn.looks_alive():
                return conn
            conn.close()  # replaced below; the slot stays counted in self._open
        try:
            return self._factory()
        except BaseException:
            with self._cond:
                self._open -= 1
                self._cond.notify()
            raise

    def release(self, conn: _Connection) -> None:
        if conn.pid != os.getpid():
            return  # the parent's, lent out across a fork: not counted here
        with self._cond:
            if not self._closed:
                self._idle.append(conn)
                self._cond.notify()
                return
            self._open -= 1
        conn.close()

    def discard(self, conn: _Connection) -> None:
        """Drop a connection whose stream can no longer be trusted."""
        if conn.pid != os.getpid():
            return  # the parent's, lent out across a fork: forgotten, not counted here
        conn.close()
        with self._cond:
            self._open -= 1
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._open -= len(idle)
            self._cond.notify_all()
        for conn in idle:
            conn.close()


# compare_and_set_many sends one connection this many requests before it takes another from
# the pool for the same call (if one is free): enough that the client's cost per request is
# a write and a read on a socket, not a thread hand-off; few enough that one call's requests
# are worked on by several gateway threads at once.
_PIPELINED_PER_CONNECTION = 4
# At most this many requests of one connection in flight (see _Pipeline).
_PIPELINE_DEPTH = 64


@dataclass(frozen=True)
class _CasRequest:
    """A checked compare-and-set ready to send: its gateway's pool, the exceptions that
    gateway declares (complete replies), the gateway's address (for errors) and the
    arguments of its ``checkAndPut``."""

    pool: _ConnectionPool
    server_errors: tuple[type[BaseException], ...]
    address: str
    args: tuple[Any, ...]

    @property
    def replies(self) -> tuple[type[BaseException], ...]:
        """Exceptions that are complete replies (the connection's stream stays in sync)."""
        return (*self.server_errors, TApplicationException)


class _Pipeline:
    """``checkAndPut`` requests sent back to back on one connection, answers read after.

    A Thrift gateway reads a connection's requests in order and answers each before it
    reads the next, so the answers come back in the order the requests were sent, and the
    client does not wait for an answer before it sends the next request.  Each request is
    flushed on its own (a framed transport makes one frame per flush; the non-blocking
    servers take one request per frame).  At most :data:`_PIPELINE_DEPTH` requests are in
    flight (a round): the answers waiting unread must stay far below what the socket buffers
    hold, or the gateway would stop reading and the client's sends wait for it, each side
    for the other.

    After a transport error the connection is discarded, and every request of it not
    answered yet gets that error as its outcome (whether it was sent or not: the caller
    reports the whole call's outcome as unknown).  Not thread-safe.
    """

    def __init__(self, pool: _ConnectionPool, conn: _Connection, indexes: list[int]) -> None:
        self._pool = pool
        self._conn: _Connection | None = conn
        self._unsent = list(indexes)  # indexes into the call's requests
        self._in_flight: list[int] = []

    @property
    def unread(self) -> bool:
        """Requests were sent whose answers have not been read."""
        return bool(self._in_flight)

    @property
    def done(self) -> bool:
        return not self._unsent and not self._in_flight

    def send_round(self, requests: Sequence[_CasRequest], outcomes: dict[int, Any]) -> None:
        """Send up to :data:`_PIPELINE_DEPTH` requests not sent yet."""
        if self._conn is None:
            return
        client = self._conn.client
        spec = client._service.checkAndPut_args.thrift_spec
        batch, self._unsent = self._unsent[:_PIPELINE_DEPTH], self._unsent[_PIPELINE_DEPTH:]
        # In flight from before its first byte is written: a failure mid-request leaves the
        # request's outcome unknown.
        self._in_flight.extend(batch)
        for i in batch:
            try:
                client._send("checkAndPut", **args_to_kwargs(spec, *requests[i].args))
            except _TRANSPORT_ERRORS as exc:
                self._break(exc, outcomes)
                return
            except BaseException:
                self.discard()
                raise

    def receive_round(self, requests: Sequence[_CasRequest], outcomes: dict[int, Any]) -> None:
        """Read the answer of every request in flight into ``outcomes`` (True or False, or
        the exception: one the gateway answered, or the transport error)."""
        while self._in_flight and self._conn is not None:
            i = self._in_flight[0]
            try:
                outcomes[i] = bool(self._conn.client._recv("checkAndPut"))
            except requests[i].replies as exc:
                outcomes[i] = exc  # a complete reply: the stream stays in sync
            except _TRANSPORT_ERRORS as exc:
                self._break(exc, outcomes)
                return
            except BaseException:
                self.discard()
                raise
            self._in_flight.pop(0)

    def _break(self, exc: BaseException, outcomes: dict[int, Any]) -> None:
        for i in (*self._in_flight, *self._unsent):
            outcomes[i] = exc
        self._in_flight, self._unsent = [], []
        self.discard()

    def discard(self) -> None:
        """Drop the connection (its stream cannot be trusted) and whatever was left to send
        or read on it (the caller is raising)."""
        self._in_flight, self._unsent = [], []
        if self._conn is not None:
            self._pool.discard(self._conn)
            self._conn = None

    def release(self) -> None:
        """Give the connection back (every request sent has been answered)."""
        if self._conn is not None:
            self._pool.release(self._conn)
            self._conn = None


def _finish(
    pipelines: Sequence[_Pipeline],
    requests: Sequence[_CasRequest],
    outcomes: dict[int, Any],
    *,
    send_rest: bool,
) -> None:
    """Read every answer of ``pipelines`` (sending their later rounds too if
    ``send_rest``), then give their connections back."""
    try:
        while True:
            active = [p for p in pipelines if p.unread or (send_rest and not p.done)]
            if not active:
                break
            for pipeline in active:
                pipeline.receive_round(requests, outcomes)
            if send_rest:
                for pipeline in active:
                    pipeline.send_round(requests, outcomes)
    except BaseException:
        for pipeline in pipelines:
            pipeline.discard()
        raise
    for pipeline in pipelines:
        pipeline.release()


class HBaseStore(Store):
    """A :class:`~percolator.store.base.Store` on HBase's Thrift-1 gateway.

    ``prefix`` is prepended to every HBase table name (``list_tables`` shows only tables
    under it, without it), so several users or test runs can share one HBase.
    ``timeout_ms`` bounds every socket operation and the wait for a free pooled
    connection.  ``transport`` (``buffered`` or ``framed``) and ``protocol`` (``binary`` or
    ``compact``) must match the gateway's settings (``hbase thrift start`` defaults to
    buffered/binary; ``-f``/``-c``, or ``hbase.regionserver.thrift.framed``/``.compact``,
    select framed/compact, the usual production choice with the non-blocking servers); a
    mismatch fails when the store is opened, with the hint to check them.  Opening the
    store makes one cheap call (``getTableNames``) so that a wrong address fails here
    with a clear :class:`StoreUnavailableError`.  Thread-safe.
    """

    #: Each region server stamps compare-and-sets with its own clock.  HBase's master
    #: refuses a region server whose clock is more than ``hbase.master.maxclockskew``
    #: (30 s by default) off its own; twice that leaves room for drift after registration.
    stamp_skew_ms = 60_000

    def __init__(
        self,
        host: str,
        port: int,
        *,
        prefix: str = "",
        pool_size: int = 8,
        timeout_ms: int = 30_000,
        transport: str = "buffered",
        protocol: str = "binary",
        thrift2_port: int | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(host, str) or not host:
            raise InvalidArgumentError(f"host must be a non-empty str, got {host!r}")
        if not encodable_host(host):
            raise InvalidArgumentError(
                f"host {host!r} is not a host name or address (not ASCII or IDNA)"
            )
        if not isinstance(port, int) or not 0 < port < 65536:
            raise InvalidArgumentError(f"port must be 1..65535, got {port!r}")
        if prefix and not _PREFIX.match(prefix):
            raise InvalidArgumentError(
                f"table prefix {prefix!r} may hold only letters, digits, '_', '-', '.'"
            )
        if transport not in TRANSPORTS:
            raise InvalidArgumentError(
                f"transport must be one of {', '.join(TRANSPORTS)}, got {transport!r}"
            )
        if protocol not in PROTOCOLS:
            raise InvalidArgumentError(
                f"protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}"
            )
        for key, value in (("pool_size", pool_size), ("timeout_ms", timeout_ms)):
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise InvalidArgumentError(f"{key} must be a positive int, got {value!r}")
        if thrift2_port is not None and (
            not isinstance(thrift2_port, int)
            or isinstance(thrift2_port, bool)
            or not 0 < thrift2_port < 65536
        ):
            raise InvalidArgumentError(f"thrift2_port must be 1..65535, got {thrift2_port!r}")
        self.host = host
        self.port = port
        self.prefix = prefix
        self.pool_size = pool_size
        self.timeout_ms = timeout_ms
        self.transport = transport
        self.protocol = protocol
        self.address = f"{host}:{port}"
        self.thrift2_port = thrift2_port
        self.thrift2_address = f"{host}:{thrift2_port}" if thrift2_port is not None else None
        # With the Thrift-2 gateway, a compare-and-set can carry puts of its row.
        self.conditional_puts = thrift2_port is not None
        self.put_call_per_version = thrift2_port is None  # else one putMultiple
        options = [f"prefix={prefix}"] if prefix else []
        if pool_size != 8:
            options.append(f"pool_size={pool_size}")
        if timeout_ms != 30_000:
            options.append(f"timeout_ms={timeout_ms}")
        if transport != TRANSPORTS[0]:
            options.append(f"transport={transport}")
        if protocol != PROTOCOLS[0]:
            options.append(f"protocol={protocol}")
        if thrift2_port is not None:
            options.append(f"thrift2_port={thrift2_port}")
        self.url = f"hbase://{self.address}" + ("?" + "&".join(options) if options else "")
        self._stats_lock = threading.Lock()
        self._families_lock = threading.Lock()
        # table -> its families, read once per table and refreshed when a name is missing.
        self._family_cache: dict[str, dict[str, FamilySpec]] = {}
        # Threads for calls a single operation sends in parallel (created on first use).
        self._calls: ThreadPoolExecutor | None = None
        self._calls_lock = threading.Lock()
        renew_after_fork(self)
        self._pool = _ConnectionPool(
            lambda: _thrift1_connection(host, port, timeout_ms, transport, protocol),
            pool_size,
            timeout_ms / 1000,
        )
        self._pool2: _ConnectionPool | None = None
        if thrift2_port is not None:
            self._pool2 = _ConnectionPool(
                lambda: _thrift2_connection(host, thrift2_port, timeout_ms, transport, protocol),
                pool_size,
                timeout_ms / 1000,
            )
        try:
            self._probe()
            self._probe_thrift2()
        except BaseException:
            self.close()
            raise

    def _after_fork_in_child(self) -> None:
        """Fresh locks and no call threads (the parent's do not exist here); the pools
        renew themselves (module docstring)."""
        self._stats_lock = threading.Lock()
        self._families_lock = threading.Lock()
        self._calls = None
        self._calls_lock = threading.Lock()

    # ------------------------------------------------------------------ plumbing

    def _count(self, op: str, n: int = 1) -> None:
        with self._stats_lock:
            self.stats.count(op, n)

    def _hname(self, table: str) -> bytes:
        return (self.prefix + table).encode("ascii")

    def _acquire(self, pool: _ConnectionPool | None = None) -> _Connection:
        """A connection from ``pool`` (default: the Thrift-1 gateway's)."""
        pool = pool or self._pool
        try:
            return pool.acquire()
        except RuntimeError:
            raise StoreError(f"the HBase store {self.url} is closed") from None
        except TimeoutError:
            raise StoreUnavailableError(
                f"HBase {self._gateway(pool)}: all {self.pool_size} pooled "
                f"connections stayed busy for {self.timeout_ms} ms (raise pool_size?)"
            ) from None
        except _TRANSPORT_ERRORS as exc:
            raise StoreUnavailableError(
                f"cannot reach HBase {self._gateway(pool)}: "
                f"{_transport_reason(exc, self.timeout_ms)}"
            ) from exc

    def _gateway(self, pool: _ConnectionPool) -> str:
        """The gateway ``pool`` connects to, for error messages: ``Thrift gateway at
        host:port`` or ``Thrift-2 gateway at host:port``."""
        if pool is self._pool:
            return f"Thrift gateway at {self.address}"
        return f"Thrift-2 gateway at {self.thrift2_address}"

    def _probe(self) -> None:
        """Check that host:port is an HBase Thrift-1 gateway (one getTableNames call)."""
        conn = self._acquire()
        hint = (
            f"is it an HBase Thrift-1 gateway with the {self.transport} transport and the "
            f"{self.protocol} protocol (store URL options transport= and protocol=)?"
        )
        try:
            self._count("list_tables")
            conn.client.getTableNames()
        except _SERVER_ERRORS as exc:
            self._pool.release(conn)
            raise StoreUnavailableError(
                f"HBase Thrift gateway at {self.address} cannot list tables: "
                f"{_short(_server_message(exc))}"
            ) from exc
        except TApplicationException as exc:
            self._pool.release(conn)
            raise StoreUnavailableError(
                f"{self.address} speaks Thrift but rejected getTableNames "
                f"({_short(_server_message(exc))}): {hint} (a Thrift-2 gateway will not do)"
            ) from exc
        except _TRANSPORT_ERRORS as exc:
            self._pool.discard(conn)
            raise StoreUnavailableError(
                f"{self.address} did not answer like an HBase Thrift gateway "
                f"({_transport_reason(exc, self.timeout_ms)}): {hint}"
            ) from exc
        except BaseException:
            self._pool.discard(conn)
            raise
        self._pool.release(conn)

    def _probe_thrift2(self) -> None:
        """Check that the ``thrift2_port`` (if any) is an HBase Thrift-2 gateway (one
        ``getThriftServerType`` call)."""
        if self._pool2 is None:
            return
        conn = self._acquire(self._pool2)
        hint = (
            f"is it an HBase Thrift-2 gateway (hbase thrift2) with the {self.transport} "
            f"transport and the {self.protocol} protocol?"
        )
        try:
            kind = conn.client.getThriftServerType()
        except TApplicationException as exc:
            self._pool2.release(conn)
            raise StoreUnavailableError(
                f"{self.thrift2_address} (thrift2_port) speaks Thrift but rejected "
                f"getThriftServerType ({_short(_server_message(exc))}): {hint}"
            ) from exc
        except _TRANSPORT_ERRORS as exc:
            self._pool2.discard(conn)
            raise StoreUnavailableError(
                f"{self.thrift2_address} (thrift2_port) did not answer like an HBase Thrift "
                f"gateway ({_transport_reason(exc, self.timeout_ms)}): {hint}"
            ) from exc
        except BaseException:
            self._pool2.discard(conn)
            raise
        self._pool2.release(conn)
        if kind != thrift2.SERVER_TYPE_TWO:
            raise StoreUnavailableError(
                f"{self.thrift2_address} (thrift2_port) is a Thrift-1 gateway, not a Thrift-2 "
                "one: start `hbase thrift2` there, or drop thrift2_port from the store URL"
            )

    def _call(
        self,
        op: str,
        method: str,
        *args: Any,
        table: str | None,
        idempotent: bool,
        thrift2_gateway: bool = False,
    ) -> Any:
        """Run one RPC (``client.<method>(*args)``) on a pooled connection of the Thrift-1
        gateway (or of the Thrift-2 one: ``thrift2_gateway``, which the caller checked is
        configured), counted under ``op`` in :attr:`stats`, translating errors.

        Idempotent calls are re-sent once on a fresh connection after a transport error.
        Callers with special needs (compare-and-set) handle errors themselves.
        """
        if thrift2_gateway:
            assert self._pool2 is not None
            pool, server_errors = self._pool2, _SERVER_ERRORS_2
        else:
            pool, server_errors = self._pool, _SERVER_ERRORS
        attempts = 2 if idempotent else 1
        for attempt in range(1, attempts + 1):
            conn = self._acquire(pool)
            try:
                self._count(op)
                result = getattr(conn.client, method)(*args)
            except server_errors as exc:
                pool.release(conn)
                self._raise_server_error(op, table, exc)
            except TApplicationException as exc:
                # A complete reply (the server failed internally): the stream is in sync.
                pool.release(conn)
                raise StoreError(
                    f"HBase {self._gateway(pool)} failed {op}{self._on(table)}: "
                    f"{_short(_server_message(exc))}"
                ) from exc
            except _TRANSPORT_ERRORS as exc:
                pool.discard(conn)
                if attempt < attempts:
                    continue  # idempotent: safe to send again on a fresh connection
                raise StoreUnavailableError(
                    f"HBase {self._gateway(pool)} failed {op}{self._on(table)}: "
                    f"{_transport_reason(exc, self.timeout_ms)}"
                    + ("" if idempotent else "; the operation may or may not have been applied")
                ) from exc
            except BaseException:
                # Anything else (even KeyboardInterrupt) mid-call leaves the stream unknown.
                pool.discard(conn)
                raise
            pool.release(conn)
            return result
        raise AssertionError("unreachable")  # pragma: no cover

    @staticmethod
    def _on(table: str | None) -> str:
        return f" on table {table!r}" if table is not None else ""

    def _table_missing(self, table: str, message: str) -> bool:
        """Whether a server error's ``message`` says ``table`` does not exist: Thrift-1
        names the exception, the Thrift-2 gateway gives the table's HBase name alone."""
        return "TableNotFoundException" in message or message == self._hname(table).decode()

    def _raise_server_error(self, op: str, table: str | None, exc: BaseException) -> NoReturn:
        raise self._server_error(op, table, exc) from exc

    def _server_error(self, op: str, table: str | None, exc: BaseException) -> Exception:
        """The error a server-side failure ``exc`` of ``op`` on ``table`` raises (and the
        cached families of a table it shows gone, forgotten)."""
        message = _server_message(exc)
        if table is not None and self._table_missing(table, message):
            self._forget_families(table)
            return TableNotFoundError(table)
        if table is not None and (
            isinstance(exc, AlreadyExists) or "TableExistsException" in message
        ):
            return TableExistsError(table)
        if "NoSuchColumnFamilyException" in message:
            if table is not None:
                self._forget_families(table)
            return InvalidArgumentError(
                f"{op}{self._on(table)}: unknown column family: {_short(message)}"
            )
        if any(marker in message for marker in _UNAVAILABLE_MARKERS):
            return StoreUnavailableError(
                f"HBase behind the Thrift gateway at {self.address} is unavailable "
                f"({op}{self._on(table)}): {_short(message)}"
            )
        return StoreError(
            f"HBase at {self.address} failed {op}{self._on(table)}: {_short(message)}"
        )

    # ------------------------------------------------------------------ validation

    def _forget_families(self, table: str) -> None:
        with self._families_lock:
            self._family_cache.pop(table, None)

    def _families(self, table: str, *, refresh: bool = False) -> dict[str, FamilySpec]:
        """The table's families (cached).  Raises TableNotFoundError for an unknown table."""
        if not refresh:
            with self._families_lock:
                cached = self._family_cache.get(table)
            if cached is not None:
                return cached
        specs = {spec.name: spec for spec in self._read_families(table)}
        with self._families_lock:
            self._family_cache[table] = specs
        return specs

    def _validate(self, table: str, check: Callable[[Mapping[str, object]], None]) -> None:
        """Run the shared argument checks against the table's families, before anything is
        sent, so a bad batch writes nothing (the same checks as the local backends).

        The families come from a per-store cache.  If the check fails, the families are
        read again once, in case another client dropped and re-created the table with
        other families since they were cached.
        """
        known = self._families(table)
        try:
            check(known)
        except InvalidArgumentError:
            fresh = self._families(table, refresh=True)
            if fresh == known:
                raise
            check(fresh)

    def max_row_length(self, table: str) -> int:
        """The longest row key HBase reliably accepts in ``table``.

        Less than :data:`~percolator.store.base.MAX_ROW_LENGTH`: to find the region of a row,
        HBase's client scans ``hbase:meta`` from the key ``<table>,<row>,99999999999999``,
        and a scan's start key may not exceed 32767 bytes either.  Longer rows work only
        while the gateway happens to have the region's location cached, so they are
        refused up front.
        """
        return MAX_ROW_LENGTH - _META_KEY_OVERHEAD - len(self._hname(table))

    def _check_row_lengths(self, table: str, rows: Iterable[bytes]) -> None:
        limit = self.max_row_length(table)
        for row in rows:
            if len(row) > limit:
                raise InvalidArgumentError(
                    f"row key of {len(row)} bytes is too long for HBase table "
                    f"{self.prefix + table!r}: at most {limit} bytes (32767 minus the table "
                    f"name and {_META_KEY_OVERHEAD} bytes of HBase's region lookup key)"
                )

    @staticmethod
    def _column_spec(family: str, qualifier: bytes) -> bytes:
        return family.encode("utf-8") + b":" + qualifier

    # ------------------------------------------------------------------ admin

    def create_table(self, name: str, families: Sequence[FamilySpec]) -> None:
        """Create the HBase table ``prefix + name``, every family option set explicitly.

        Thrift-1 defaults would give 3 versions and no block cache, so ``max_versions``,
        ``in_memory`` and ``block_cache`` always come from the :class:`FamilySpec`; every
        family also gets a ROW bloom filter (HBase's default for tables created from Java,
        which Thrift-1 would leave off) and no TTL.  Not retried: after a transport error
        the table may or may not exist.
        """
        check_table_name(name)
        check_family_specs(families)
        descriptors = [
            ColumnDescriptor(
                name=spec.name.encode("utf-8") + b":",
                maxVersions=spec.max_versions,
                inMemory=spec.in_memory,
                blockCacheEnabled=spec.block_cache,
                bloomFilterType=b"ROW",
                timeToLive=-1,
            )
            for spec in families
        ]
        self._forget_families(name)
        self._call(
            "create_table",
            "createTable",
            self._hname(name),
            descriptors,
            table=name,
            idempotent=False,
        )
        with self._families_lock:
            self._family_cache[name] = {spec.name: spec for spec in families}

    def drop_table(self, name: str) -> None:
        """Disable and delete ``prefix + name`` (two RPCs).  A table left disabled by an
        interrupted drop is deleted too.  Not retried after a transport error."""
        check_table_name(name)
        hname = self._hname(name)
        self._forget_families(name)
        try:
            self._call("drop_table", "disableTable", hname, table=name, idempotent=False)
        except StoreError as exc:
            if "TableNotEnabledException" not in str(exc):
                raise
        self._call("drop_table", "deleteTable", hname, table=name, idempotent=False)
        self._forget_families(name)

    def list_tables(self) -> list[str]:
        """Tables under this store's prefix, without the prefix, sorted."""
        names = self._call("list_tables", "getTableNames", table=None, idempotent=True)
        result = []
        for raw in names:
            name = _text(raw)
            # getTableNames lists every namespace; this store's tables are in the default.
            if name.startswith(self.prefix) and ":" not in name:
                result.append(name[len(self.prefix) :])
        return sorted(result)

    def table_exists(self, name: str) -> bool:
        check_table_name(name)
        return name in self.list_tables()

    def _read_families(self, table: str) -> list[FamilySpec]:
        descriptors = self._call(
            "table_families",
            "getColumnDescriptors",
            self._hname(table),
            table=table,
            idempotent=True,
        )
        specs = [
            FamilySpec(
                name=_text(d.name).rstrip(":"),
                max_versions=int(d.maxVersions),
                in_memory=bool(d.inMemory),
                block_cache=bool(d.blockCacheEnabled),
            )
            for d in descriptors.values()
        ]
        return sorted(specs, key=lambda spec: spec.name)

    def table_families(self, name: str) -> list[FamilySpec]:
        """The families as HBase reports them (``getColumnDescriptors``), sorted by name:
        HBase keeps families sorted and does not store their creation order."""
        check_table_name(name)
        specs = self._read_families(name)
        with self._families_lock:
            self._family_cache[name] = {spec.name: spec for spec in specs}
        return specs

    # ------------------------------------------------------------------ reads

    def read_rows(
        self,
        table: str,
        rows: Sequence[bytes],
        columns: Sequence[Column] | None = None,
        families: Sequence[str] | None = None,
        *,
        before: int | None = None,
        min_version: int = 0,
        max_versions: int = 1,
    ) -> dict[bytes, RowCells]:
        """Read rows; see :class:`Store`.

        ``max_versions=1``: one ``getRows[WithColumns][Ts]`` RPC for all rows, each row one
        HBase ``Get`` (a snapshot of that row).  ``max_versions>1``: one ``getVerTs`` RPC
        per (row, column), so it costs ``len(rows) * len(columns)`` round trips and each
        cell is a snapshot of itself only; ``columns`` is required, ``families`` must be
        ``None``.

        ``min_version`` is applied here, after the server returned the newest versions
        below ``before``, because Thrift-1 reads have no lower bound.  That is exact: the
        versions in ``[min_version, before)`` are always the newest ones below ``before``,
        so if the n newest below ``before`` include k older than ``min_version``, the range
        holds exactly the other n - k.
        """
        check_table_name(table)
        self._validate(
            table,
            lambda known: check_read_args(
                rows, columns, families, before, min_version, max_versions, known
            ),
        )
        self._check_row_lengths(table, rows)
        row_list = list(dict.fromkeys(rows))
        upper = MAX_BEFORE if before is None else before
        if not row_list or upper <= min_version:
            return {}  # no rows, or the version range [min_version, before) is empty
        if max_versions > 1:
            assert columns is not None  # checked by check_read_args
            return self._read_versions(
                table, row_list, list(dict.fromkeys(columns)), upper, min_version, max_versions
            )

        specs: list[bytes] | None = None
        if columns is not None or families is not None:
            whole = list(dict.fromkeys(families or ()))
            # A whole family already returns its columns; naming them too is redundant.
            specs = [f.encode("utf-8") for f in whole] + [
                self._column_spec(f, q) for f, q in dict.fromkeys(columns or ()) if f not in whole
            ]
            if not specs:
                return {}  # an explicit empty selection selects nothing
        hname = self._hname(table)
        # The Ts variants take the exclusive upper bound; without one, the plain calls.
        args: tuple[Any, ...]
        if specs is None and before is None:
            method, args = "getRows", (hname, row_list, {})
        elif specs is None:
            method, args = "getRowsTs", (hname, row_list, upper, {})
        elif before is None:
            method, args = "getRowsWithColumns", (hname, row_list, specs, {})
        else:
            method, args = "getRowsWithColumnsTs", (hname, row_list, specs, upper, {})
        results = self._call("read_rows", method, *args, table=table, idempotent=True)
        out: dict[bytes, RowCells] = {}
        for result in results:
            cells: RowCells = {}
            for name, cell in (result.columns or {}).items():
                if cell.timestamp < min_version:
                    continue
                fam, _, qualifier = bytes(name).partition(b":")
                cells[(fam.decode("utf-8"), qualifier)] = [(int(cell.timestamp), bytes(cell.value))]
            if cells:
                out[bytes(result.row)] = cells
        return out

    def read_cells(
        self,
        table: str,
        cells: Sequence[tuple[bytes, Column]],
        *,
        before: int | None = None,
    ) -> dict[bytes, RowCells]:
        """Exactly the cells named; see :class:`Store`.

        Thrift-1 takes one column list for all rows, so it reads the cross product of the
        rows and columns named (:meth:`Store.read_cells`: in parts of consecutive rows once
        it exceeds :data:`~percolator.store.base.CROSS_PRODUCT_CELLS`) and keeps the cells
        asked for.
        Where that asks for at least :data:`_EXACT_READ_FACTOR` times more cells than named
        and a Thrift-2 gateway is given (``thrift2_port``), the read is one ``getMultiple``
        instead: a ``TGet`` per row naming that row's cells, with the time range
        ``[0, before)``.  (Below that the two cost the same: bench/read_cells_bench.py.)
        Either way one round trip (per part), each row one HBase ``Get``
        (a snapshot of the row), counted as ``read_rows``."""
        check_table_name(table)
        rows, columns = split_cells(cells)
        if not rows:
            return {}
        named = len(set(cells))
        if self._pool2 is None or len(rows) * len(columns) < _EXACT_READ_FACTOR * named:
            return self._read_cross_product(table, cells, rows, columns, before)
        self._check_cells(table, rows, columns, before)
        upper = MAX_BEFORE if before is None else before
        if upper <= 0:
            return {}
        return self._read_exact(table, cells, upper)

    def _check_cells(
        self, table: str, rows: list[bytes], columns: list[Column], before: int | None
    ) -> None:
        """See :meth:`Store._check_cells`: the table's families (cached) and row lengths."""
        self._validate(
            table, lambda known: check_read_args(rows, columns, None, before, 0, 1, known)
        )
        self._check_row_lengths(table, rows)

    def _read_exact(
        self, table: str, cells: Sequence[tuple[bytes, Column]], upper: int
    ) -> dict[bytes, RowCells]:
        """:meth:`read_cells` of checked ``cells`` as one Thrift-2 ``getMultiple``: a
        ``TGet`` per row naming that row's cells, in the time range ``[0, upper)``."""
        by_row: dict[bytes, dict[Column, None]] = {}
        for row, column in cells:
            by_row.setdefault(row, {})[column] = None
        time_range = thrift2.TTimeRange(minStamp=0, maxStamp=upper)
        tgets = [
            thrift2.TGet(
                row=row,
                columns=[
                    thrift2.TColumn(family.encode(), qualifier) for family, qualifier in row_columns
                ],
                timeRange=time_range,
                maxVersions=1,
            )
            for row, row_columns in by_row.items()
        ]
        results = self._call(
            "read_rows",
            "getMultiple",
            self._hname(table),
            tgets,
            table=table,
            idempotent=True,
            thrift2_gateway=True,
        )
        out: dict[bytes, RowCells] = {}
        for result in results:
            # A row with no cells comes back without a row key (or, per the interface's
            # documentation, as null).
            if result is None or not result.columnValues:
                continue
            out[bytes(result.row)] = {
                (bytes(cell.family).decode("utf-8"), bytes(cell.qualifier)): [
                    (int(cell.timestamp), bytes(cell.value))
                ]
                for cell in result.columnValues
            }
        return out

    def _read_versions(
        self,
        table: str,
        rows: list[bytes],
        columns: list[Column],
        upper: int,
        min_version: int,
        max_versions: int,
    ) -> dict[bytes, RowCells]:
        hname = self._hname(table)
        out: dict[bytes, RowCells] = {}
        for row in rows:
            cells: RowCells = {}
            for family, qualifier in columns:
                found = self._call(
                    "read_rows",
                    "getVerTs",
                    hname,
                    row,
                    self._column_spec(family, qualifier),
                    upper,
                    max_versions,
                    {},
                    table=table,
                    idempotent=True,
                )
                versions: list[Version] = [
                    (int(cell.timestamp), bytes(cell.value))
                    for cell in found
                    if cell.timestamp >= min_version
                ]
                if versions:
                    versions.sort(key=lambda v: v[0], reverse=True)
                    cells[(family, qualifier)] = versions
            if cells:
                out[row] = cells
        return out

    def scan(
        self, table: str, family: str, options: ScanOptions | None = None
    ) -> Iterator[tuple[bytes, dict[bytes, Version]]]:
        """Scan one family; see :class:`Store`.  Arguments are checked at call time.

        One ``scannerOpenWithScan`` (``TScan`` with ``caching=batch_size`` and
        ``timestamp=before``), then ``scannerGetList(batch_size)`` per batch, all counted
        as ``scan`` in :attr:`stats`.  A batch holds at most ``_SCAN_CELLS_PER_CALL``
        cells: a wide row comes in several results (``TScan.batchSize``), and is yielded
        whole.  The scanner is always closed, also when the caller stops iterating early.
        If a batch fails with a transport error, the scan re-opens once just after the last
        row it yielded (the old scanner's position on the server is unknown, so the same
        request cannot simply be sent again).
        """
        check_table_name(table)
        opts = options if options is not None else ScanOptions()
        check_scan_options(opts)
        self._validate(table, lambda known: check_family_name(family, known))
        self._check_row_lengths(table, [opts.start])
        specs = [family.encode("utf-8")]
        if opts.qualifiers is not None:
            specs = [self._column_spec(family, q) for q in dict.fromkeys(opts.qualifiers)]
        empty = (
            (opts.stop is not None and opts.stop <= opts.start)
            or (opts.value_ranges is not None and not opts.value_ranges)
            or opts.limit == 0
            or not specs
            or opts.before == 0
        )
        if empty:
            return iter(())
        return self._scan_rows(table, family, specs, opts)

    def _scan_rows(
        self, table: str, family: str, specs: list[bytes], opts: ScanOptions
    ) -> Iterator[tuple[bytes, dict[bytes, Version]]]:
        hname = self._hname(table)
        prefix = family.encode("utf-8") + b":"
        remaining = opts.limit
        next_start = opts.start  # just after the last row yielded
        # One re-open per failure without progress: reset only when a row is yielded, since
        # a good batch inside a wide row gains nothing that a re-open keeps.
        reopened = False
        # A row may come in several results (TScan.batchSize, below); it is yielded whole,
        # once the next row's first result (or the end) shows it complete.
        row: bytes | None = None
        cells: dict[bytes, Version] = {}
        while True:
            count = opts.batch_size if remaining is None else min(opts.batch_size, remaining)
            tscan = TScan(
                startRow=next_start,
                stopRow=opts.stop,
                timestamp=opts.before,
                columns=specs,
                caching=count,
                # At most this many cells per result, so one scannerGetList of ``count``
                # results holds at most _SCAN_CELLS_PER_CALL cells however wide the rows
                # are (an index row with a column per document would otherwise fill the
                # gateway's heap).
                batchSize=max(1, _SCAN_CELLS_PER_CALL // count),
                filterString=(
                    None if opts.value_ranges is None else value_filter(opts.value_ranges)
                ),
            )
            scanner_id = self._call(
                "scan", "scannerOpenWithScan", hname, tscan, {}, table=table, idempotent=True
            )
            try:
                while True:
                    # Always the count the scanner was opened with: its results' cells
                    # (batchSize) were sized for it, and a smaller count near the limit
                    # would take a call per few cells of a wide row.  Rows past the limit
                    # that this fetches are not yielded.
                    try:
                        # Not idempotent (it advances the scanner), so never re-sent as is.
                        batch = self._call(
                            "scan",
                            "scannerGetList",
                            scanner_id,
                            count,
                            table=table,
                            idempotent=False,
                        )
                    except StoreUnavailableError:
                        if reopened:
                            raise
                        if opts.stop is not None and next_start >= opts.stop:
                            # Nothing is left before ``stop``; and opened with start ==
                            # stop, the gateway would read the row ``stop`` itself (it
                            # makes such a scan a get).
                            return
                        reopened = True
                        row, cells = None, {}  # a row not yielded yet is read again whole
                        break  # re-open after the last row yielded
                    for result in batch:
                        result_row = bytes(result.row)
                        if result_row != row:
                            if row is not None and cells:
                                yield row, cells
                                next_start = row + b"\x00"  # the smallest row key after it
                                reopened = False
                                if remaining is not None:
                                    remaining -= 1
                                    if remaining == 0:
                                        return
                            row, cells = result_row, {}
                        for name, cell in (result.columns or {}).items():
                            if bytes(name).startswith(prefix):
                                cells[bytes(name)[len(prefix) :]] = (
                                    int(cell.timestamp),
                                    bytes(cell.value),
                                )
                    # scannerGetList returns fewer results than asked only at the end.
                    if len(batch) < count:
                        if row is not None and cells:
                            yield row, cells
                        return
            finally:
                self._close_scanner(table, scanner_id)

    def _close_scanner(self, table: str, scanner_id: int) -> None:
        """Best effort: a scanner that cannot be closed (connection lost, already gone) is
        reclaimed by the gateway when it expires."""
        with contextlib.suppress(StoreError, InvalidArgumentError):
            self._call("scan", "scannerClose", scanner_id, table=table, idempotent=True)

    # ------------------------------------------------------------------ writes

    def put(self, table: str, puts: Sequence[Put]) -> None:
        """Blind-write versions: one ``mutateRowsTs`` per distinct version, or, with a
        Thrift-2 gateway and more than one version, one ``putMultiple``.

        Thrift-1's ``Mutation`` has no timestamp of its own; the timestamp is an argument of
        ``mutateRowsTs`` and applies to every cell in it.  So a call with k distinct
        versions costs k round trips there, and is atomic per (row, version) only (see the
        module docstring).  Thrift-2's ``putMultiple`` carries a timestamp per cell: one
        round trip (per bounded chunk of rows), each row's cells one atomic HBase ``Put``;
        the contract promised stays per (row, version).  Within one call, a cell given
        twice at the same version keeps the last value.  Idempotent, so re-sent once after
        a transport error.
        """
        check_table_name(table)

        def check(known: Mapping[str, object]) -> None:
            for p in check_sequence(puts, "puts"):
                check_put(p, known)

        self._validate(table, check)
        self._check_row_lengths(table, (p.row for p in puts))
        self._send_puts(table, puts)

    def _send_puts(self, table: str, puts: Sequence[Put]) -> None:
        """The ``mutateRowsTs`` (or ``putMultiple``) calls of checked puts (see :meth:`put`)."""
        if self._pool2 is not None and any(p.version != puts[0].version for p in puts):
            self._send_puts_thrift2(table, puts)
            return
        # version -> row -> column spec -> value, each in first-appearance order
        groups: dict[int, dict[bytes, dict[bytes, bytes]]] = {}
        for p in puts:
            by_row = groups.setdefault(p.version, {})
            by_row.setdefault(p.row, {})[self._column_spec(p.family, p.qualifier)] = p.value
        hname = self._hname(table)
        for version, by_row in groups.items():
            batches = [
                BatchMutation(
                    row=row,
                    mutations=[
                        Mutation(column=spec, value=value, isDelete=False)
                        for spec, value in cols.items()
                    ],
                )
                for row, cols in by_row.items()
            ]
            for chunk in _chunks(batches):
                self._call(
                    "put", "mutateRowsTs", hname, chunk, version, {}, table=table, idempotent=True
                )

    def _send_puts_thrift2(self, table: str, puts: Sequence[Put]) -> None:
        """Checked puts of several versions as Thrift-2 ``putMultiple`` calls: a ``TPut``
        per row, each cell at its own version (see :meth:`put`)."""
        # row -> (family, qualifier, version) -> value, each in first-appearance order
        by_row: dict[bytes, dict[tuple[str, bytes, int], bytes]] = {}
        for p in puts:
            by_row.setdefault(p.row, {})[(p.family, p.qualifier, p.version)] = p.value
        tputs = [
            thrift2.TPut(
                row=row,
                columnValues=[
                    thrift2.TColumnValue(family.encode(), qualifier, value, version)
                    for (family, qualifier, version), value in cells.items()
                ],
            )
            for row, cells in by_row.items()
        ]
        for chunk in _tput_chunks(tputs):
            self._thrift2_batch("put", "putMultiple", table, chunk)

    def _thrift2_batch(self, op: str, method: str, table: str, chunk: list[Any]) -> None:
        """One idempotent Thrift-2 batch call (``putMultiple``, ``deleteMultiple``) of
        ``chunk`` on ``table``, counted under ``op``; re-sent once after a transport error."""
        try:
            self._call(
                op,
                method,
                self._hname(table),
                chunk,
                table=table,
                idempotent=True,
                thrift2_gateway=True,
            )
        except StoreError as exc:
            # The gateway reports a batch into a missing table as "Failed 1 action:
            # <table>: 1 time, servers with issues: null", naming no cause: ask.
            if isinstance(exc, (TableNotFoundError, StoreUnavailableError)):
                raise
            if not self.table_exists(table):
                self._forget_families(table)
                raise TableNotFoundError(table) from exc
            raise

    def compare_and_set(
        self,
        table: str,
        row: bytes,
        family: str,
        qualifier: bytes,
        expected: bytes | None,
        new: bytes,
    ) -> bool:
        """One ``checkAndPut``; see :class:`Store`.  Never retried.

        A transport error, or a server error that does not prove the write was refused
        (anything but "table not found" / "unknown family"), raises
        :class:`StoreUnavailableError` saying the outcome is unknown: the connection may
        have broken after the server applied it, and the gateway is itself an HBase client
        that can time out after the region server applied it.
        """
        check_table_name(table)
        item = CompareAndSet(row, family, qualifier, expected, new)
        self._validate(table, lambda known: check_compare_and_set(item, known))
        self._check_row_lengths(table, [row])
        return self._check_and_put(table, item)

    def _check_and_put(self, table: str, item: CompareAndSet) -> bool:
        """The ``checkAndPut`` of one checked item (see :meth:`compare_and_set` and
        :meth:`_cas_request`)."""
        request = self._cas_request(self._hname(table), item)
        pool = request.pool
        # Failing to get a connection means nothing was sent: that error is definite.
        conn = self._acquire(pool)
        try:
            self._count("compare_and_set")
            applied = conn.client.checkAndPut(*request.args)
        except request.replies as exc:
            pool.release(conn)  # a complete reply: the stream is in sync
            raise self._cas_failure(table, item, request, exc) from exc
        except _TRANSPORT_ERRORS as exc:
            pool.discard(conn)
            raise self._cas_failure(table, item, request, exc) from exc
        except BaseException:
            pool.discard(conn)
            raise
        pool.release(conn)
        return bool(applied)

    def _cas_request(self, hname: bytes, item: CompareAndSet) -> _CasRequest:
        """Where and how ``item`` is sent: a ``checkAndPut`` on the Thrift-1 gateway, or on
        the Thrift-2 gateway if the item carries ``then_put`` (one ``TPut`` of the new cell,
        stamped by the server as Thrift-1 does, and the riding cells at their own versions:
        one atomic row operation)."""
        row, family, qualifier = item.row, item.family, item.qualifier
        if item.then_put:
            assert self._pool2 is not None  # checked: conditional_puts
            family_bytes = family.encode()
            cells = [thrift2.TColumnValue(family_bytes, qualifier, item.new)]
            cells.extend(
                thrift2.TColumnValue(p.family.encode(), p.qualifier, p.value, p.version)
                for p in item.then_put
            )
            tput = thrift2.TPut(row=row, columnValues=cells)
            return _CasRequest(
                self._pool2,
                _SERVER_ERRORS_2,
                self.thrift2_address or "",
                (hname, row, family_bytes, qualifier, item.expected, tput),
            )
        spec = self._column_spec(family, qualifier)
        mutation = Mutation(column=spec, value=item.new, isDelete=False)
        return _CasRequest(
            self._pool,
            _SERVER_ERRORS,
            self.address,
            (hname, row, spec, item.expected, mutation, {}),
        )

    def _cas_failure(
        self, table: str, item: CompareAndSet, request: _CasRequest, exc: BaseException
    ) -> Exception:
        """The error a failed ``checkAndPut`` of ``item`` raises: definite only if the server
        says the table or family does not exist, else "outcome unknown"."""
        where = f"table {table!r}, row {item.row!r}, column {item.family}:{item.qualifier!r}"
        address = request.address
        if isinstance(exc, request.server_errors):
            message = _server_message(exc)
            if self._table_missing(table, message) or "NoSuchColumnFamilyException" in message:
                return self._server_error("compare_and_set", table, exc)
            return StoreUnavailableError(
                f"compare-and-set on {where} at {address}: outcome unknown, the server "
                f"reported {_short(message)}; re-read the cell, do not re-send"
            )
        if isinstance(exc, TApplicationException):
            return StoreUnavailableError(
                f"compare-and-set on {where} at {address}: outcome unknown, the gateway "
                f"failed internally ({_short(_server_message(exc))}); re-read the cell, "
                "do not re-send"
            )
        return StoreUnavailableError(
            f"compare-and-set on {where} at {address}: outcome unknown "
            f"({_transport_reason(exc, self.timeout_ms)}); re-read the cell, do not re-send"
        )

    def compare_and_set_many(
        self, table: str, items: Sequence[CompareAndSet], puts: Sequence[Put] = ()
    ) -> list[bool]:
        """One ``checkAndPut`` per item (neither gateway has a batched conditional mutation;
        an item with ``then_put`` goes to the Thrift-2 gateway), pipelined: see
        :class:`_Pipeline`.  The puts are sent first (as :meth:`put`; if they fail, no
        compare-and-set is sent).  Every item and put is checked before anything is sent;
        if a compare-and-set fails, the others still finish before the first error is
        raised (see :meth:`compare_and_set` for what each error means)."""
        check_table_name(table)

        def check(known: Mapping[str, object]) -> None:
            check_compare_and_sets(items, known, conditional_puts=self.conditional_puts)
            for p in check_sequence(puts, "puts"):
                check_put(p, known)

        self._validate(table, check)
        self._check_row_lengths(table, [*(item.row for item in items), *(p.row for p in puts)])
        self._count("compare_and_set_many")
        if puts:
            # Sent before this call holds any connection (see below).
            self._send_puts(table, puts)
        if not items:
            return []
        if len(items) == 1:
            return [self._check_and_put(table, items[0])]
        self._count("compare_and_set", len(items))
        hname = self._hname(table)
        requests = [self._cas_request(hname, item) for item in items]
        pipelines: list[_Pipeline] = []
        outcomes: dict[int, bool | BaseException] = {}
        failed = True
        try:
            # A call waits for a connection only for the first one of each gateway, and
            # takes the gateways in this one order; once it holds a gateway's connections
            # it never waits for the other's.  So a call that holds connections waits only
            # for calls that wait for nothing (puts were sent first), never in a cycle.
            for pool in (self._pool, self._pool2):
                indexes = [i for i, r in enumerate(requests) if r.pool is pool]
                if indexes and pool is not None:
                    pipelines.extend(self._pipelines(pool, indexes))
            for pipeline in pipelines:
                pipeline.send_round(requests, outcomes)
            failed = False
        finally:
            # Nothing of this call may still be in flight when it returns or raises; after
            # a failure here, what was not sent yet is not sent.
            _finish(pipelines, requests, outcomes, send_rest=not failed)
        results: list[bool] = []
        for i, item in enumerate(items):
            outcome = outcomes[i]
            if isinstance(outcome, BaseException):
                raise self._cas_failure(table, item, requests[i], outcome) from outcome
            results.append(outcome)
        return results

    def _pipelines(self, pool: _ConnectionPool, indexes: list[int]) -> list[_Pipeline]:
        """Connections of ``pool`` for the requests at ``indexes``: one taken as any call
        takes it (waiting for a free one), and one more per
        :data:`_PIPELINED_PER_CONNECTION` requests if the pool has them free right now,
        never more than ``pool_size``.  The requests are dealt out among them."""
        wanted = min(self.pool_size, -(-len(indexes) // _PIPELINED_PER_CONNECTION))
        conns = [self._acquire(pool)]
        try:
            while len(conns) < wanted:
                extra = pool.try_acquire()
                if extra is None:
                    break
                conns.append(extra)
        except BaseException:
            for conn in conns:
                pool.release(conn)  # nothing was sent on them
            raise
        return [_Pipeline(pool, conn, indexes[n :: len(conns)]) for n, conn in enumerate(conns)]

    def delete_versions(self, table: str, deletes: Sequence[Delete]) -> None:
        """Delete versions at or below each timestamp: one ``mutateRowsTs`` of delete
        mutations per distinct timestamp (Thrift-1 takes the timestamp per call), those calls
        run ``pool_size`` at a time; with a Thrift-2 gateway and more than one timestamp,
        one ``deleteMultiple`` (a timestamp per column) instead.  Either delete of a column
        with a timestamp removes every version ``<= ts`` of that cell (HBase
        ``Delete.addColumns``) and masks puts at or below ``ts`` written later;
        ``tests/store`` checks both on the real server.  Atomic per row with Thrift-2, per
        (row, timestamp) with Thrift-1.  Idempotent: re-sent once after a transport error.
        If a call fails, the others still finish before the error is raised."""
        check_table_name(table)

        def check(known: Mapping[str, object]) -> None:
            for d in check_sequence(deletes, "deletes"):
                check_delete(d, known)

        self._validate(table, check)
        self._check_row_lengths(table, (d.row for d in deletes))
        if self._pool2 is not None and any(
            d.at_or_below != deletes[0].at_or_below for d in deletes
        ):
            self._send_deletes_thrift2(table, deletes)
            return
        groups: dict[int, dict[bytes, dict[bytes, None]]] = {}
        for d in deletes:
            by_row = groups.setdefault(d.at_or_below, {})
            by_row.setdefault(d.row, {})[self._column_spec(d.family, d.qualifier)] = None
        hname = self._hname(table)
        calls = [
            (ts, chunk)
            for ts, by_row in groups.items()
            for chunk in _chunks(
                [
                    BatchMutation(
                        row=row, mutations=[Mutation(column=spec, isDelete=True) for spec in cols]
                    )
                    for row, cols in by_row.items()
                ]
            )
        ]

        def send(call: tuple[int, list[BatchMutation]]) -> None:
            ts, chunk = call
            args: tuple[object, ...] = (hname, chunk, ts, {})
            self._call("delete_versions", "mutateRowsTs", *args, table=table, idempotent=True)

        # Garbage collection deletes each cell below its own kept version: as many calls as
        # cells, which only parallel calls keep from costing a round trip each in sequence.
        run_all(self._executor() if len(calls) > 1 else None, send, calls)

    def _send_deletes_thrift2(self, table: str, deletes: Sequence[Delete]) -> None:
        """Checked deletes at several timestamps as Thrift-2 ``deleteMultiple`` calls: a
        ``TDelete`` per row, each column at its own timestamp (see :meth:`delete_versions`).
        A cell named twice keeps its highest timestamp, which covers the lower one."""
        # row -> (family, qualifier) -> highest timestamp, each in first-appearance order
        by_row: dict[bytes, dict[tuple[str, bytes], int]] = {}
        for d in deletes:
            cells = by_row.setdefault(d.row, {})
            cell = (d.family, d.qualifier)
            cells[cell] = max(d.at_or_below, cells.get(cell, d.at_or_below))
        tdeletes = [
            thrift2.TDelete(
                row=row,
                columns=[
                    thrift2.TColumn(family.encode(), qualifier, ts)
                    for (family, qualifier), ts in cells.items()
                ],
                deleteType=thrift2.DELETE_COLUMNS,
            )
            for row, cells in by_row.items()
        ]
        for chunk in _tdelete_chunks(tdeletes):
            self._thrift2_batch("delete_versions", "deleteMultiple", table, chunk)

    def _executor(self) -> ThreadPoolExecutor:
        with self._calls_lock:
            if self._calls is None:
                self._calls = ThreadPoolExecutor(self.pool_size, thread_name_prefix="hbase-store")
            return self._calls

    def compact_deletes(self, table: str) -> int:
        """Nothing to do here: HBase drops delete markers at its own major compactions (see
        :meth:`Store.compact_deletes`).  Checks that the table exists (from the families
        cache: no round trip once the table is known)."""
        check_table_name(table)
        self._families(table)
        return 0

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Close every pooled connection; later calls raise StoreError.  Idempotent.
        Connections lent out at this moment are closed when they come back."""
        self._pool.close()
        if self._pool2 is not None:
            self._pool2.close()
        with self._calls_lock:
            calls, self._calls = self._calls, None
        if calls is not None:
            calls.shutdown(wait=False)

    def __repr__(self) -> str:
        return f"HBaseStore({self.url!r})"


def value_filter(ranges: Sequence[tuple[bytes, bytes | None]]) -> bytes:
    """:attr:`ScanOptions.value_ranges` in HBase's filter language: an OR of
    ``ValueFilter`` range pairs with binary comparators, evaluated on the region server.
    ``ranges`` must not be empty."""

    def quoted(value: bytes) -> bytes:
        # The filter language quotes with ' and escapes a quote by doubling it.
        return b"'binary:" + value.replace(b"'", b"''") + b"'"

    terms = []
    for low, high in ranges:
        term = b"ValueFilter(>=, " + quoted(low) + b")"
        if high is not None:
            term = b"(" + term + b" AND ValueFilter(<, " + quoted(high) + b"))"
        terms.append(term)
    return b" OR ".join(terms)

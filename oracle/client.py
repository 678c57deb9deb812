"""The client of the gRPC timestamp oracle (``percolator.connect(oracle="grpc://...")``).

The engine finds it by URL scheme: :func:`open_grpc_oracle` is declared in the entry-point
group ``percolator.oracles`` as ``grpc`` and ``grpcs`` (see
:mod:`percolator.timestamps.factory`).

* **Coalescing**: concurrent requests from any number of threads share one Allocate RPC in
  flight (:mod:`percolator.timestamps.coalesce`); each response serves the whole batch.
* **One stream per address**: the requests go over one long-lived AllocateStream call,
  which costs the server a little over half the CPU of a new Allocate call and answers in
  about three quarters of the time (docs/oracle.md has the figures); a server that has no
  stream free (or predates the stream) gets Allocate calls instead.
* **Fail-over**: the client knows a list of oracle addresses and sends to the one that
  answered last; an address that is down, a standby, or fenced answers UNAVAILABLE (or does
  not answer within ``rpc_timeout_s``, or cancels the call while shutting down) and the
  client moves on to the next, backing off between rounds, until ``timeout_s`` has passed.
  Allocate is safe to retry: a lost range is only a gap.
* **Fencing, client side**: a response from an epoch lower than one already seen, or that
  arrives after the wall-clock ``valid_until_ms`` of the lease it was issued under (it left
  a paused process late), is discarded; a range that does not start above every timestamp
  this client handed out raises :class:`~percolator.errors.TimestampRegressionError`.
* **Fork**: a forked child opens channels and streams of its own on first use (gRPC's
  channels and the stream threads do not survive a fork: the child would wait out its
  timeout and report no oracle).  The parent's are kept in the child, never closed, so the
  parent's connections are not disturbed.
* **Errors**: a wrong or missing token and other configuration mistakes raise
  :class:`~percolator.errors.OracleError` at once (never retried); no usable oracle within
  ``timeout_s`` raises :class:`~percolator.errors.OracleUnavailableError` naming each
  address and its last error.
"""

from __future__ import annotations

import logging
import queue
import ssl
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import grpc
from percolator.oracle.addressing import (
    TOKEN_METADATA_KEY,
    TOKEN_PREFIX,
    check_listen_address,
    parse_oracle_url,
)
from percolator.oracle.proto_gen import oracle_pb2, oracle_pb2_grpc

from percolator.concurrency import renew_after_fork
from percolator.errors import (
    ConfigError,
    InvalidArgumentError,
    OracleError,
    OracleUnavailableError,
)
from percolator.layout import same_deployment
from percolator.retry import Backoff
from percolator.store.base import Store
from percolator.timestamps import TimestampOracle, now_ms
from percolator.timestamps.coalesce import Coalescer, CoalescerStats
from percolator.timestamps.domain import (
    bind_timestamp_domain,
    check_timestamp_domain,
    read_binding,
)

log = logging.getLogger(__name__)

DEFAULT_MAX_BATCH = 1 << 16

# Worth another address: down, standby, fenced, hung, or shutting down (a stopping server
# cancels the calls it no longer serves).  This client never cancels its own calls.
_RETRY_CODES = (
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.CANCELLED,
)

# Reconnect quickly to a restarted oracle: gRPC's default backoff grows to two minutes.
_CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.enable_retries", 0),  # retries are ours, across addresses
]

# A stream is opened with this deadline, so the server's slot of a client that went away
# without closing (a paused process) comes free; the client renews its stream earlier.
_STREAM_DEADLINE_S = 60.0
_STREAM_RENEW_S = 45.0
# After a server refused a stream (no slot free, or it has no AllocateStream), the client
# sends Allocate calls to that address for this long before it tries a stream again.
_UNARY_FOR_S = 30.0

# A forked child's copies of its parent's channels and streams: kept alive and never
# closed (closing them could end the parent's connections).
_inherited: list[object] = []

_HINT = (
    "check that an oracle is running there (percolator oracle serve), that the address is "
    "right, and that TLS (grpcs://) and the token match the server's settings"
)


def open_grpc_oracle(spec: str, store: Store) -> GrpcOracleClient:
    """The client for a ``grpc[s]://`` spec (see :mod:`percolator.oracle.addressing`); the
    engine's :func:`~percolator.timestamps.factory.open_oracle` calls it by scheme.  The
    servers keep the oracle's state; ``store`` is checked to take its timestamps from this
    oracle service (percolator/timestamps/domain.py)."""
    addresses, tls, token, (timeout_s, rpc_timeout_s) = parse_oracle_url(spec)
    client = GrpcOracleClient(
        addresses,
        token=token,
        tls=tls,
        timeout_s=timeout_s,
        rpc_timeout_s=rpc_timeout_s,
        store=store,
    )
    try:
        client.check_store()
    except BaseException:
        client.close()
        raise
    return client


class GrpcOracleClient(TimestampOracle):
    """A :class:`TimestampOracle` backed by one or more oracle servers.  Thread-safe.

    ``tls``: False for plaintext, True for TLS with the system's root certificates, or the
    path of a PEM file of root certificates (for a self-signed server certificate).
    ``token``: the shared secret the servers expect, sent as ``authorization: Bearer``.
    ``store``: the store the timestamps are for.  Every range received names the domain it
    was issued in (the deployment id of the oracle's store); the first binds ``store`` to
    it, and a range of another domain than ``store`` is bound to raises
    :class:`~percolator.errors.OracleError` before it is used
    (percolator/timestamps/domain.py).  None: not checked.
    """

    def __init__(
        self,
        addresses: Sequence[str],
        token: str | None = None,
        tls: bool | str = False,
        *,
        timeout_s: float = 10.0,
        rpc_timeout_s: float = 2.0,
        max_batch: int = DEFAULT_MAX_BATCH,
        store: Store | None = None,
    ) -> None:
        if isinstance(addresses, str) or not addresses:
            raise ConfigError(
                f"oracle addresses must be a non-empty list of HOST:PORT, got {addresses!r}"
            )
        for address in addresses:
            if check_listen_address(address)[1] == 0:
                raise ConfigError(f"oracle address {address!r} needs a port other than 0")
        if timeout_s <= 0 or rpc_timeout_s <= 0:
            raise ConfigError("oracle client timeouts must be positive")
        self.addresses = list(addresses)
        self._timeout_s = timeout_s
        self._rpc_timeout_s = rpc_timeout_s
        self._credentials = _channel_credentials(tls)
        self._metadata = ((TOKEN_METADATA_KEY, TOKEN_PREFIX + token),) if token else None
        self._lock = threading.Lock()
        self._channels: dict[str, grpc.Channel] = {}
        self._stubs: dict[str, oracle_pb2_grpc.TimestampOracleStub] = {}
        self._streams: dict[str, _AllocateStream] = {}
        self._unary_until: dict[str, float] = {}  # address -> monotonic time
        self._store = store
        # The timestamp domain the store is known to be bound to (None: not yet checked).
        self._domain: str | None = None
        self._warned_no_domain = False
        self._current = 0
        self._max_epoch = 0
        self._closed = False
        self.rpcs = 0  # Allocate attempts sent (including failed ones)
        self.failovers = 0
        self._coalescer = Coalescer(self._fetch, max_batch)
        renew_after_fork(self)

    def _after_fork_in_child(self) -> None:
        """The child's copy starts without channels or streams, and with a fresh lock (a
        parent thread may have held it at the fork); see the module docstring.  The
        coalescer renews itself."""
        _inherited.append((self._channels, self._streams))
        self._lock = threading.Lock()
        self._channels = {}
        self._stubs = {}
        self._streams = {}

    # ------------------------------------------------------------------ TimestampOracle

    @property
    def stats(self) -> CoalescerStats:
        """``fetches`` is the number of successful Allocate RPCs."""
        return self._coalescer.stats

    @property
    def epoch(self) -> int:
        """The highest oracle epoch this client has accepted a response from."""
        return self._max_epoch

    def get_timestamp(self) -> int:
        return self._coalescer.take(1)[0]

    def get_timestamps(self, count: int) -> list[int]:
        return self._coalescer.take(count)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            channels = list(self._channels.values())
            streams = list(self._streams.values())
            self._channels.clear()
            self._stubs.clear()
            self._streams.clear()
        for stream in streams:
            stream.close()
        for channel in channels:
            channel.close()

    # ------------------------------------------------------------------ RPCs

    def stub(self, address: str) -> oracle_pb2_grpc.TimestampOracleStub:
        """The (cached) stub of one address."""
        with self._lock:
            if self._closed:
                raise OracleError("the oracle client is closed")
            stub = self._stubs.get(address)
            if stub is None:
                if self._credentials is None:
                    channel = grpc.insecure_channel(address, options=_CHANNEL_OPTIONS)
                else:
                    channel = grpc.secure_channel(
                        address, self._credentials, options=_CHANNEL_OPTIONS
                    )
                self._channels[address] = channel
                stub = self._stubs[address] = oracle_pb2_grpc.TimestampOracleStub(channel)
            return stub

    def info(self, address: str) -> oracle_pb2.InfoResponse:
        """One Info call (no retries); errors translated like Allocate's."""
        try:
            return self.stub(address).Info(
                oracle_pb2.InfoRequest(), timeout=self._rpc_timeout_s, metadata=self._metadata
            )
        except grpc.RpcError as exc:
            code, details = _code_details(exc)
            if code in _RETRY_CODES:
                raise OracleUnavailableError(
                    f"oracle {address} is unavailable ({code.name}: {details}); {_HINT}"
                ) from None
            raise _translate(address, code, details) from None

    def check_store(self) -> None:
        """Refuse now (OracleError) if the store is bound to another timestamp domain than
        the one the first answering address serves (one Info call; nothing if the store is
        unbound, or if no address answers: every range is checked on arrival anyway).  So
        a client given the wrong oracle writes nothing (percolator/timestamps/domain.py)."""
        store = self._store
        if store is None or read_binding(store) is None:
            return
        for address in self.addresses:
            try:
                info = self.info(address)
            except OracleUnavailableError:
                continue
            if info.deployment_id:
                check_timestamp_domain(store, info.deployment_id, _source(address, info.store_url))
            return

    def attach_store(self, store: Store) -> None:
        """Check ``store`` against the service now (:meth:`check_store`), and check and bind
        it with every range received from now on.  A client made without a store adopts
        ``store``; one made for another deployment is refused (ConfigError): it binds and
        checks only the store it was made for, so the other would stay unbound.  To serve
        several deployments from one service, open one client for each."""
        with self._lock:
            current = self._store
            if current is None:
                self._store = store
            elif not same_deployment(current, store):
                raise ConfigError(
                    f"this oracle client checks the timestamps it receives for store "
                    f"{current.url!r} and cannot serve store {store.url!r}: open one client "
                    "per store (GrpcOracleClient(..., store=STORE))"
                )
        self.check_store()

    def _fetch(self, total: int) -> int:
        """One coalesced batch: Allocate ``total`` from the active oracle, failing over.

        Called by one thread at a time (the coalescer's leader)."""
        deadline = time.monotonic() + self._timeout_s
        errors: dict[str, str] = {}
        backoff = Backoff(0.02, 0.5, jitter=0)
        while True:
            for offset in range(len(self.addresses)):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                index = (self._current + offset) % len(self.addresses)
                address = self.addresses[index]
                self.rpcs += 1
                try:
                    response = self._allocate(address, total, min(self._rpc_timeout_s, remaining))
                except grpc.RpcError as exc:
                    code, details = _code_details(exc)
                    if code not in _RETRY_CODES:
                        raise _translate(address, code, details) from None
                    errors[address] = f"{code.name}: {details}"
                    continue
                except _NoAnswer as exc:
                    errors[address] = f"DEADLINE_EXCEEDED: {exc}"
                    continue
                problem = self._check(response, total)
                if problem is None:
                    self._check_domain(address, response)
                    # Only now: epochs order the records of one domain's oracle, and a
                    # range refused as another domain's must not fence this one's.
                    self._max_epoch = response.epoch
                if problem is not None:
                    errors[address] = problem
                    continue
                if index != self._current:
                    self.failovers += 1
                    self._current = index
                return response.first
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                detail = "; ".join(f"{addr}: {err}" for addr, err in errors.items())
                raise OracleUnavailableError(
                    f"no timestamp oracle among {self.addresses} answered within "
                    f"{self._timeout_s:g} s ({detail}); {_HINT}"
                )
            backoff.sleep(deadline)

    def _allocate(self, address: str, total: int, timeout_s: float) -> oracle_pb2.AllocateResponse:
        """One Allocate of ``total`` at ``address``: over its stream when it has one.

        Raises ``grpc.RpcError`` as an Allocate call would, or :class:`_NoAnswer`.  A stream
        that failed is dropped (the next request opens a new one); a stream the server
        refused (no slot free, or no such method) is replaced by an Allocate call at once.
        """
        request = oracle_pb2.AllocateRequest(count=total)
        stream = self._stream(address)
        if stream is not None:
            started = time.monotonic()
            try:
                return stream.allocate(request, timeout_s)
            except grpc.RpcError as exc:
                self._drop_stream(address, stream)
                if _code_details(exc)[0] not in _STREAM_REFUSED:
                    raise
                self._unary_until[address] = time.monotonic() + _UNARY_FOR_S
                timeout_s = max(0.001, timeout_s - (time.monotonic() - started))
            except _NoAnswer:
                self._drop_stream(address, stream)
                raise
        return self.stub(address).Allocate(request, timeout=timeout_s, metadata=self._metadata)

    def _stream(self, address: str) -> _AllocateStream | None:
        """The open stream to ``address`` (opened if needed), or None while that address
        gets Allocate calls instead."""
        if time.monotonic() < self._unary_until.get(address, 0.0):
            return None
        stub = self.stub(address)
        with self._lock:
            stream = self._streams.get(address)
            if stream is not None and not stream.usable():
                stream.close()
                stream = None
            if stream is None:
                stream = self._streams[address] = _AllocateStream(stub, self._metadata)
            return stream

    def _drop_stream(self, address: str, stream: _AllocateStream) -> None:
        with self._lock:
            if self._streams.get(address) is stream:
                del self._streams[address]
        stream.close()

    def _check_domain(self, address: str, response: oracle_pb2.AllocateResponse) -> None:
        """Bind the store to the range's timestamp domain, or refuse a range of another
        domain (OracleError: a configuration error, not failed over); before the range is
        used.  Called by the coalescer's leader only."""
        store = self._store
        if store is None or response.deployment_id == self._domain:
            return
        if not response.deployment_id:
            if not self._warned_no_domain:
                self._warned_no_domain = True
                log.warning(
                    "oracle %s does not say which store's timestamps it issues (an older "
                    "server): not checked that the store %s takes its timestamps from it",
                    address,
                    store.url,
                )
            return
        source = _source(address, None)
        if self._domain is not None:
            raise OracleError(
                f"oracle {address} answered with timestamps of another domain "
                f"({response.deployment_id}) than the store {store.url!r} is bound to "
                f"({self._domain}): another oracle now serves at that address; discarded"
            )
        bind_timestamp_domain(store, response.deployment_id, source, first_ts=response.first)
        self._domain = response.deployment_id

    def _check(self, response: oracle_pb2.AllocateResponse, total: int) -> str | None:
        """Why a response must be discarded (None: accept it)."""
        if response.count != total:
            raise OracleError(
                f"oracle answered {response.count} timestamps to a request for {total}"
            )
        if response.epoch < self._max_epoch:
            return (
                f"answered from epoch {response.epoch}, below epoch {self._max_epoch} "
                "already seen (a deposed oracle)"
            )
        received = now_ms()
        if received > response.valid_until_ms:
            return (
                f"response arrived {received - response.valid_until_ms} ms after its lease "
                "lapsed (the oracle was paused or slow); discarded"
            )
        return None


# A server that refuses a stream this way still answers Allocate calls.
_STREAM_REFUSED = (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNIMPLEMENTED)


class _NoAnswer(Exception):
    """A stream did not answer a request in time, or ended without answering."""


class _AllocateStream:
    """One AllocateStream call, used by one thread at a time (the coalescer's leader).

    The server answers the requests in order, one response each.  A reader thread moves the
    responses (and the error or end that closes the call) into a queue, so that the sender
    can wait for its answer with a timeout; a stream that missed one is dropped, never
    reused, so a late answer can never be taken for the answer to a later request.
    """

    def __init__(
        self,
        stub: oracle_pb2_grpc.TimestampOracleStub,
        metadata: tuple[tuple[str, str], ...] | None,
    ) -> None:
        self.opened = time.monotonic()
        self._requests: queue.SimpleQueue[oracle_pb2.AllocateRequest | None] = queue.SimpleQueue()
        self._answers: queue.SimpleQueue[oracle_pb2.AllocateResponse | grpc.RpcError | None] = (
            queue.SimpleQueue()
        )
        self._call = stub.AllocateStream(
            iter(self._requests.get, None), timeout=_STREAM_DEADLINE_S, metadata=metadata
        )
        threading.Thread(target=self._read, name="oracle-stream", daemon=True).start()

    def _read(self) -> None:
        try:
            for response in self._call:
                self._answers.put(response)
            self._answers.put(None)
        except grpc.RpcError as exc:
            self._answers.put(exc)

    def usable(self) -> bool:
        """Young enough, and nothing came unasked: only an error or an end can."""
        return self._answers.empty() and time.monotonic() - self.opened < _STREAM_RENEW_S

    def allocate(
        self, request: oracle_pb2.AllocateRequest, timeout_s: float
    ) -> oracle_pb2.AllocateResponse:
        """Send ``request``; return its answer or raise the error that ended the call."""
        self._requests.put(request)
        try:
            answer = self._answers.get(timeout=timeout_s)
        except queue.Empty:
            raise _NoAnswer(f"no answer on the stream within {timeout_s:g} s") from None
        if answer is None:
            raise _NoAnswer("the server ended the stream")
        if isinstance(answer, grpc.RpcError):
            raise answer
        return answer

    def close(self) -> None:
        """End the call (idempotent); anything still on its way is discarded."""
        self._requests.put(None)
        self._call.cancel()


def _source(address: str, store_url: str | None) -> str:
    """How an oracle service is named in a binding and its errors."""
    where = f" (its store {store_url})" if store_url else ""
    return f"the oracle service at {address}{where}"


def _channel_credentials(tls: bool | str) -> grpc.ChannelCredentials | None:
    if tls is False:
        return None
    if tls is True:
        return grpc.ssl_channel_credentials()
    try:
        roots = Path(tls).read_bytes()
    except OSError as exc:
        raise ConfigError(
            f"cannot read the oracle's root certificates {tls!r}: {exc.strerror}"
        ) from None
    # gRPC would take anything here and report every later call as "unavailable", naming
    # neither the file nor the cause: load the certificates once with ssl first.
    try:
        if b"-----BEGIN CERTIFICATE-----" not in roots:
            raise ssl.SSLError("no '-----BEGIN CERTIFICATE-----' line")
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(
            cadata=roots.decode("ascii", errors="ignore")
        )
    except ssl.SSLError as exc:
        raise ConfigError(
            f"the oracle's root certificates {tls!r} are not PEM certificates ({exc})"
        ) from None
    return grpc.ssl_channel_credentials(root_certificates=roots)


def _code_details(exc: grpc.RpcError) -> tuple[grpc.StatusCode, str]:
    # The exceptions gRPC raises from calls are also grpc.Call objects.
    if isinstance(exc, grpc.Call):
        return exc.code(), str(exc.details())
    return grpc.StatusCode.UNKNOWN, str(exc)


def _translate(address: str, code: grpc.StatusCode, details: str) -> Exception:
    """A non-retryable gRPC error as the project's error type."""
    if code is grpc.StatusCode.UNAUTHENTICATED:
        return OracleError(
            f"oracle {address} refused this client's credentials ({details}); "
            "pass the server's token (token_file= in the oracle URL or "
            "PERCOLATOR_ORACLE_TOKEN)"
        )
    if code is grpc.StatusCode.INVALID_ARGUMENT:
        return InvalidArgumentError(f"oracle {address} rejected the request: {details}")
    if code is grpc.StatusCode.UNIMPLEMENTED:
        return OracleError(
            f"{address} does not serve the timestamp oracle API ({details}); is it an oracle?"
        )
    return OracleError(f"oracle {address} failed: {code.name}: {details}")

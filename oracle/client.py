"""The client of the gRPC timestamp oracle (``percolator.connect(oracle="grpc://...")``).

The engine finds it by URL scheme: :func:`open_grpc_oracle` is declared in the entry-point
group ``percolator.oracles`` as ``grpc`` and ``grpcs`` (see
:mod:`percolator.timestamps.factory`).

* **Coalescing**: concurrent requests from any number of threads share one Allocate RPC in
  flight (:mod:`percolator.timestamps.coalesce`); each response serves the whole batch.
* **Fail-over**: the client knows a list of oracle addresses and sends to the one that
  answered last; an address that is down, a standby, or fenced answers UNAVAILABLE (or does
  not answer within ``rpc_timeout_s``, or cancels the call while shutting down) and the
  client moves on to the next, backing off between rounds, until ``timeout_s`` has passed.
  Allocate is safe to retry: a lost range is only a gap.
* **Fencing, client side**: a response from an epoch lower than one already seen, or that
  arrives after the wall-clock ``valid_until_ms`` of the lease it was issued under (it left
  a paused process late), is discarded; a range that does not start above every timestamp
  this client handed out raises :class:`~percolator.errors.TimestampRegressionError`.
* **Errors**: a wrong or missing token and other configuration mistakes raise
  :class:`~percolator.errors.OracleError` at once (never retried); no usable oracle within
  ``timeout_s`` raises :class:`~percolator.errors.OracleUnavailableError` naming each
  address and its last error.
"""

from __future__ import annotations

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

from percolator.errors import (
    ConfigError,
    InvalidArgumentError,
    OracleError,
    OracleUnavailableError,
)
from percolator.retry import Backoff
from percolator.store.base import Store
from percolator.timestamps import TimestampOracle, now_ms
from percolator.timestamps.coalesce import Coalescer, CoalescerStats

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

_HINT = (
    "check that an oracle is running there (percolator oracle serve), that the address is "
    "right, and that TLS (grpcs://) and the token match the server's settings"
)


def open_grpc_oracle(spec: str, store: Store) -> GrpcOracleClient:
    """The client for a ``grpc[s]://`` spec (see :mod:`percolator.oracle.addressing`); the
    engine's :func:`~percolator.timestamps.factory.open_oracle` calls it by scheme.  The
    store is not used: the servers keep the oracle's state."""
    addresses, tls, token, (timeout_s, rpc_timeout_s) = parse_oracle_url(spec)
    return GrpcOracleClient(
        addresses, token=token, tls=tls, timeout_s=timeout_s, rpc_timeout_s=rpc_timeout_s
    )


class GrpcOracleClient(TimestampOracle):
    """A :class:`TimestampOracle` backed by one or more oracle servers.  Thread-safe.

    ``tls``: False for plaintext, True for TLS with the system's root certificates, or the
    path of a PEM file of root certificates (for a self-signed server certificate).
    ``token``: the shared secret the servers expect, sent as ``authorization: Bearer``.
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
        self._current = 0
        self._max_epoch = 0
        self._closed = False
        self.rpcs = 0  # Allocate attempts sent (including failed ones)
        self.failovers = 0
        self._coalescer = Coalescer(self._fetch, max_batch)

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
            self._channels.clear()
            self._stubs.clear()
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
                    response = self.stub(address).Allocate(
                        oracle_pb2.AllocateRequest(count=total),
                        timeout=min(self._rpc_timeout_s, remaining),
                        metadata=self._metadata,
                    )
                except grpc.RpcError as exc:
                    code, details = _code_details(exc)
                    if code not in _RETRY_CODES:
                        raise _translate(address, code, details) from None
                    errors[address] = f"{code.name}: {details}"
                    continue
                problem = self._check(response, total)
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
        self._max_epoch = response.epoch
        return None


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

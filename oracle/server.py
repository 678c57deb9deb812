"""The gRPC timestamp oracle server (``percolator oracle serve``).

One process per address.  Several processes on one store form an active/standby group:
the lease logic lives in :mod:`percolator.oracle.lease`; this module binds it to gRPC, checks the
shared token, serves TLS, and exports metrics.

Every Allocate response is checked against the lease twice: when its range is taken and
again right before it is returned (:meth:`~percolator.oracle.lease.OracleNode.confirm`), and it
carries
``valid_until_ms`` so a client can discard a response that left a paused process late.
"""

from __future__ import annotations

import hmac
import logging
import os
import re
import secrets
import signal
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import NoReturn

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from percolator.oracle.addressing import TOKEN_METADATA_KEY, TOKEN_PREFIX, check_listen_address
from percolator.oracle.lease import LeaseConfig, OracleNode, Role
from percolator.oracle.metrics import OracleMetrics
from percolator.oracle.proto_gen import oracle_pb2, oracle_pb2_grpc

from percolator.command_options import open_existing_store
from percolator.errors import (
    ConfigError,
    FencedError,
    InvalidArgumentError,
    OracleUnavailableError,
    StoreNotFoundError,
)
from percolator.failpoints import failpoint
from percolator.hostnames import encodable_host
from percolator.layout import deployment_id
from percolator.metrics import MetricsServer
from percolator.store.base import Store
from percolator.store.url import open_store
from percolator.timestamps.clock import SYSTEM_CLOCK, Clock
from percolator.timestamps.domain import read_binding
from percolator.timestamps.record import OracleRecordRegister

log = logging.getLogger("oracle")

#: the oracle's service name in the gRPC health checking protocol (proto/oracle.proto)
ORACLE_SERVICE = "percolator.oracle.v1.TimestampOracle"
#: how often the health service follows the role
HEALTH_UPDATE_S = 0.25

_ROLE_TO_PROTO = {
    Role.ACTIVE: oracle_pb2.ROLE_ACTIVE,
    Role.STANDBY: oracle_pb2.ROLE_STANDBY,
    Role.STOPPING: oracle_pb2.ROLE_STOPPING,
}


@dataclass(frozen=True)
class ServerOptions:
    """Everything ``percolator oracle serve`` takes.  TLS and the token are off unless set."""

    store_url: str
    listen: str = "127.0.0.1:7070"
    tls_cert: str | None = None
    tls_key: str | None = None
    token: str | None = None
    lease: LeaseConfig = field(default_factory=LeaseConfig)
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    workers: int = 8  # threads for unary calls (Allocate, Health, Info)
    stream_slots: int = 64  # AllocateStream calls served at once, each on a thread of its own
    #: create the store if it does not exist; False (``oracle serve`` without ``--create``):
    #: a store that holds no deployment is an error naming the URL, never a new one
    create: bool = True

    def __post_init__(self) -> None:
        check_listen_address(self.listen)
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError("TLS needs both --tls-cert and --tls-key (got only one)")
        if self.token is not None and not self.token.strip():
            raise ConfigError("the oracle token must not be empty")
        if self.workers < 1 or self.stream_slots < 0:
            raise ConfigError(
                f"the oracle needs workers >= 1 and stream_slots >= 0 "
                f"(got {self.workers} and {self.stream_slots})"
            )
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ConfigError(f"metrics port {self.metrics_port} outside [0, 65535]")
        if not encodable_host(self.metrics_host):  # here: before the store is opened
            raise ConfigError(
                f"--metrics-host {self.metrics_host!r} is not a host name or address "
                "(not ASCII or IDNA)"
            )


def _existing(options: ServerOptions) -> Store:
    """The store of ``options`` if it already holds a deployment (see
    :func:`~percolator.command_options.open_existing_store`); the error says how to create
    one on purpose."""
    try:
        return open_existing_store(options.store_url)
    except StoreNotFoundError as exc:
        raise StoreNotFoundError(f"{exc} (pass --create to make a new store)") from None


def _read_file(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read the {what} {path!r}: {exc.strerror}") from None


class _EncryptedKey(Exception):
    """Raised by the password callback of :func:`tls_credentials`: the key needs one."""


def _no_password() -> bytes:
    # Without a callback OpenSSL would prompt on the terminal for the passphrase.
    raise _EncryptedKey


def _ssl_reason(exc: ssl.SSLError) -> str:
    """OpenSSL's words for ``exc``, without Python's source location ``(_ssl.c:NNNN)``."""
    return re.sub(r"\s*\(_ssl\.c:\d+\)$", "", str(exc))


def tls_credentials(cert_path: str, key_path: str) -> grpc.ServerCredentials:
    """gRPC server credentials of a PEM certificate chain and its PEM private key, checked
    first: ConfigError naming the file and what is wrong with it (unreadable, not PEM, an
    encrypted key, a key that does not belong to the certificate).

    gRPC only checks the pair when the port is added, and then reports a bind failure
    that names neither file nor cause, so the pair is loaded once with :mod:`ssl` first,
    before the store is opened or the port bound."""
    key = _read_file(key_path, "TLS key")
    cert = _read_file(cert_path, "TLS certificate")
    if b"-----BEGIN CERTIFICATE-----" not in cert:
        raise ConfigError(
            f"the TLS certificate {cert_path!r} holds no PEM certificate (no "
            "'-----BEGIN CERTIFICATE-----' line; a DER file converts with "
            "'openssl x509 -inform der')"
        )
    if b"PRIVATE KEY-----" not in key:
        raise ConfigError(
            f"the TLS key {key_path!r} holds no PEM private key (no "
            "'-----BEGIN ... PRIVATE KEY-----' line)"
        )
    try:
        # The certificate on its own first, so that a failure of the pair below is the
        # key's.  Text outside the PEM blocks (comments) may be anything: dropped.
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(
            cadata=cert.decode("ascii", errors="ignore")
        )
    except ssl.SSLError as exc:
        raise ConfigError(
            f"the TLS certificate {cert_path!r} is not a valid PEM certificate (damaged or "
            f"truncated? {_ssl_reason(exc)})"
        ) from None
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(
            cert_path, key_path, password=_no_password
        )
    except _EncryptedKey:
        raise ConfigError(
            f"the TLS key {key_path!r} is encrypted (needs a passphrase); the oracle "
            "needs an unencrypted key (decrypt it with 'openssl pkey')"
        ) from None
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            raise ConfigError(
                f"the TLS key {key_path!r} does not match the certificate {cert_path!r} "
                "(one of the two belongs to another pair)"
            ) from None
        raise ConfigError(
            f"the TLS key {key_path!r} is not a valid PEM private key for {cert_path!r} "
            f"(damaged or truncated? {_ssl_reason(exc)})"
        ) from None
    return grpc.ssl_server_credentials([(key, cert)])


class OracleServicer(oracle_pb2_grpc.TimestampOracleServicer):
    """The RPC handlers.  Each checks the token first when one is configured."""

    def __init__(
        self,
        node: OracleNode,
        metrics: OracleMetrics,
        token: str | None,
        store_url: str,
        stream_slots: int,
        deployment_id: str = "",
    ) -> None:
        self.node = node
        self.metrics = metrics
        self._stream_slots = stream_slots
        self._streams_lock = threading.Lock()
        self._open_streams: set[grpc.ServicerContext] = set()
        self._streams_ended = False
        self._token = token
        self._store_url = store_url
        self._deployment_id = deployment_id

    def _abort(
        self, context: grpc.ServicerContext, method: str, code: grpc.StatusCode, message: str
    ) -> NoReturn:
        """Count and end the call with an error status (``context.abort`` raises)."""
        self.metrics.requests.inc(method=method, code=code.name)
        context.abort(code, message)

    def _authorize(self, context: grpc.ServicerContext, method: str) -> None:
        if self._token is None:
            return
        presented = dict(context.invocation_metadata()).get(TOKEN_METADATA_KEY, "")
        if not isinstance(presented, str) or not presented.startswith(TOKEN_PREFIX):
            self._abort(
                context,
                method,
                grpc.StatusCode.UNAUTHENTICATED,
                "this oracle requires a token (metadata 'authorization: Bearer TOKEN')",
            )
        # Constant-time comparison: the token is a shared secret.
        if not hmac.compare_digest(presented[len(TOKEN_PREFIX) :].encode(), self._token.encode()):
            self._abort(context, method, grpc.StatusCode.UNAUTHENTICATED, "wrong oracle token")

    def Allocate(
        self, request: oracle_pb2.AllocateRequest, context: grpc.ServicerContext
    ) -> oracle_pb2.AllocateResponse:
        self._authorize(context, "Allocate")
        return self._allocate(request, context)

    def AllocateStream(
        self, request_iterator: Iterator[oracle_pb2.AllocateRequest], context: grpc.ServicerContext
    ) -> Iterator[oracle_pb2.AllocateResponse]:
        """Allocate for each request of the stream, in order; the first error ends it.

        A stream holds one of the server's threads for as long as it is open, so only
        ``stream_slots`` streams are served at once: one more is refused at once with
        RESOURCE_EXHAUSTED (its client then uses Allocate), never queued behind the others.
        """
        self._authorize(context, "AllocateStream")
        with self._streams_lock:
            full = len(self._open_streams) >= self._stream_slots
            ended = self._streams_ended
            if not (full or ended):
                self._open_streams.add(context)
        if full:
            self._abort(
                context,
                "AllocateStream",
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "every stream this oracle serves is taken; use Allocate",
            )
        if ended:
            self._abort(context, "AllocateStream", grpc.StatusCode.UNAVAILABLE, "oracle stopping")
        try:
            for request in request_iterator:
                yield self._allocate(request, context)
        finally:
            with self._streams_lock:
                self._open_streams.discard(context)

    def end_streams(self) -> None:
        """Cancel every open stream and refuse new ones: the server is stopping, and an idle
        stream would otherwise hold the shutdown (and the lease's release) for its whole
        grace period.  Their clients see CANCELLED and move on to another address."""
        with self._streams_lock:
            self._streams_ended = True
            contexts = list(self._open_streams)
        for context in contexts:
            context.cancel()

    def _allocate(
        self, request: oracle_pb2.AllocateRequest, context: grpc.ServicerContext
    ) -> oracle_pb2.AllocateResponse:
        """One allocation, for Allocate and for each request of AllocateStream (counted as
        Allocate requests in the metrics either way)."""
        started = time.perf_counter()
        try:
            allocation = self.node.allocate(request.count)
            response = oracle_pb2.AllocateResponse(
                first=allocation.first,
                count=allocation.count,
                epoch=allocation.epoch,
                valid_until_ms=allocation.valid_until_ms,
                deployment_id=self._deployment_id,
            )
            # Tests pause the process here, with a range prepared, through this failpoint.
            failpoint("oracle.before_confirm")
            # Last check before the range leaves: a process paused since allocate() must
            # not hand out a range prepared under a lease that has lapsed meanwhile.
            self.node.confirm(allocation)
        except InvalidArgumentError as exc:
            self._abort(context, "Allocate", grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except (FencedError, OracleUnavailableError) as exc:
            self._abort(context, "Allocate", grpc.StatusCode.UNAVAILABLE, str(exc))
        self.metrics.requests.inc(method="Allocate", code="OK")
        self.metrics.issued.inc(allocation.count)
        self.metrics.batch_size.observe(allocation.count)
        self.metrics.latency.observe(time.perf_counter() - started)
        return response

    def Health(
        self, request: oracle_pb2.HealthRequest, context: grpc.ServicerContext
    ) -> oracle_pb2.HealthResponse:
        self._authorize(context, "Health")
        info = self.node.info()
        self.metrics.requests.inc(method="Health", code="OK")
        return oracle_pb2.HealthResponse(
            role=_ROLE_TO_PROTO[info.role], epoch=info.epoch, holder_id=info.holder_id
        )

    def Info(
        self, request: oracle_pb2.InfoRequest, context: grpc.ServicerContext
    ) -> oracle_pb2.InfoResponse:
        self._authorize(context, "Info")
        info = self.node.info()
        config = self.node.config
        self.metrics.requests.inc(method="Info", code="OK")
        return oracle_pb2.InfoResponse(
            role=_ROLE_TO_PROTO[info.role],
            holder_id=info.holder_id,
            lease_holder_id=info.lease_holder_id,
            epoch=info.epoch,
            persisted_high_water=info.high_water,
            last_issued=info.last_issued,
            lease_expiry_ms=info.lease_expiry_ms,
            max_count=config.max_count,
            lease_ms=config.lease_ms,
            window_ms=config.window_ms,
            timestamps_issued=info.timestamps_issued,
            allocate_calls=info.allocate_calls,
            store_url=self._store_url,
            deployment_id=self._deployment_id,
        )


class OracleServer:
    """One oracle process: gRPC server, lease driver thread, optional metrics endpoint.

    ``start()`` binds and starts serving (as a standby until the lease is won); ``stop()``
    stops issuing at once, lets in-flight calls finish, then releases the lease so a
    standby can take over after only the clock margin.
    """

    def __init__(
        self, options: ServerOptions, store: Store | None = None, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        self.options = options
        self._store = store
        self._owns_store = store is None
        self._clock = clock
        self._grpc: grpc.Server | None = None
        self._servicer: OracleServicer | None = None
        self._driver: threading.Thread | None = None
        self._driver_stop = threading.Event()
        self._metrics_server: MetricsServer | None = None
        self._grpc_health: health.HealthServicer | None = None
        self.node: OracleNode | None = None
        self.metrics: OracleMetrics | None = None
        self.port = 0
        self.metrics_port: int | None = None

    @property
    def address(self) -> str:
        host, _ = check_listen_address(self.options.listen)
        return f"{host}:{self.port}"

    def start(self) -> None:
        options = self.options
        credentials = None
        if options.tls_cert is not None and options.tls_key is not None:
            # Before the store is opened (or created) and the port bound.
            credentials = tls_credentials(options.tls_cert, options.tls_key)
        if self._store is None:
            self._store = open_store(options.store_url) if options.create else _existing(options)
        server = grpc.server(
            # Streams hold a thread each while open; the unary calls keep threads of their
            # own, so a server whose stream slots are all taken still answers them.
            ThreadPoolExecutor(
                max_workers=options.workers + options.stream_slots, thread_name_prefix="oracle-rpc"
            ),
            # Never share a port with another process: a second oracle on the same address
            # must fail to start, not silently receive half of the calls.
            options=[("grpc.so_reuseport", 0)],
        )
        try:
            if credentials is None:
                self.port = server.add_insecure_port(options.listen)
            else:
                self.port = server.add_secure_port(options.listen, credentials)
        except RuntimeError as exc:
            raise ConfigError(f"cannot listen on {options.listen}: {exc}") from None
        if not self.port:
            raise ConfigError(f"cannot listen on {options.listen} (address in use?)")
        host, _ = check_listen_address(options.listen)
        # Unique per process start: a restarted oracle never mistakes its old lease for its own.
        # "oracle:" first: never mistaken for a local oracle ("local:...", see the record).
        holder_id = (
            f"oracle:{socket.gethostname()}:{os.getpid()}@{host}:{self.port}/{secrets.token_hex(3)}"
        )
        self.node = OracleNode(
            OracleRecordRegister(self._store), holder_id, options.lease, self._clock
        )
        self.metrics = OracleMetrics(self.node)
        own_domain = deployment_id(self._store)
        bound = read_binding(self._store)
        if bound is not None and bound.domain != own_domain:
            log.warning(
                "store %s takes its timestamps from %s: its clients will refuse this "
                "server's (it serves stores that share it as their oracle service)",
                self._store.url,
                bound.source,
            )
        servicer = self._servicer = OracleServicer(
            self.node,
            self.metrics,
            options.token,
            self._store.url,
            options.stream_slots,
            own_domain,
        )
        oracle_pb2_grpc.add_TimestampOracleServicer_to_server(servicer, server)
        # The standard gRPC health checking service: "" is SERVING while the process is
        # healthy (serving or standing by); the oracle's own service only while it is the
        # active oracle, so a load balancer or probe can find the one that issues timestamps.
        self._grpc_health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._grpc_health, server)
        if options.metrics_port is not None:
            self._metrics_server = MetricsServer(
                self.metrics.registry,
                options.metrics_host,
                options.metrics_port,
                health=self._health,
            )
            self.metrics_port = self._metrics_server.port
        server.start()
        self._grpc = server
        self._driver = threading.Thread(
            target=self.node.run, args=(self._driver_stop,), name="oracle-lease", daemon=True
        )
        self._driver.start()
        self._health_updater = threading.Thread(
            target=self._update_grpc_health, name="oracle-health", daemon=True
        )
        self._health_updater.start()

    def _update_grpc_health(self) -> None:
        """Mirror the role into the gRPC health service, a few times a second."""
        service = self._grpc_health
        assert service is not None
        while True:
            healthy = self._health() is None
            active = healthy and self.node is not None and self.node.role is Role.ACTIVE
            serving = health_pb2.HealthCheckResponse.SERVING
            not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
            service.set("", serving if healthy else not_serving)
            service.set(ORACLE_SERVICE, serving if active else not_serving)
            if self._driver_stop.wait(HEALTH_UPDATE_S):
                service.enter_graceful_shutdown()
                return

    def _health(self) -> str | None:
        """Healthy while it serves or stands by: not stopping, and its lease driver (which
        renews the lease and takes it over) still runs."""
        if self.node is None or self.node.role is Role.STOPPING:
            return "stopping"
        if self._driver is None or not self._driver.is_alive():
            return "the lease driver thread is not running"
        return None

    def stop(self, grace_s: float = 1.0) -> None:
        """Idempotent.  Order matters: issue nothing more, drain, then release."""
        if self.node is not None:
            self.node.stop()
        if self._grpc_health is not None:
            self._grpc_health.enter_graceful_shutdown()
        if self._servicer is not None:
            self._servicer.end_streams()
        if self._grpc is not None:
            self._grpc.stop(grace_s).wait()
            self._grpc = None
        self._driver_stop.set()
        if self._driver is not None:
            self._driver.join()
            self._driver = None
        if self.node is not None:
            self.node.release()
        if self._metrics_server is not None:
            self._metrics_server.close()
            self._metrics_server = None
        if self._owns_store and self._store is not None:
            self._store.close()
            self._store = None


def serve(options: ServerOptions) -> int:
    """Run an oracle until SIGTERM or SIGINT; returns the exit code."""
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    server = OracleServer(options)
    try:
        server.start()
        assert server.node is not None
        tls = "TLS" if options.tls_cert else "plaintext"
        auth = "token required" if options.token else "no token"
        metrics = (
            f", metrics on http://{options.metrics_host}:{server.metrics_port}/metrics"
            if server.metrics_port is not None
            else ""
        )
        # Tests and scripts wait for this line.
        print(
            f"oracle: listening on {server.address} ({tls}, {auth}) as {server.node.holder_id}"
            f", store {options.store_url}{metrics}",
            flush=True,
        )
        while not stop.wait(0.5):
            pass
        log.warning("oracle %s: stopping", server.node.holder_id)
    finally:
        server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0

"""The server process as a client meets it: bad requests, tokens, TLS, metrics, coalescing,
and the command line's errors."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from percolator.oracle.client import GrpcOracleClient
from percolator.oracle.lease import LeaseConfig
from percolator.oracle.proto_gen import oracle_pb2, oracle_pb2_grpc
from percolator.oracle.server import OracleServer, ServerOptions

from percolator.errors import (
    ConfigError,
    InvalidArgumentError,
    OracleError,
    OracleUnavailableError,
)
from percolator.metrics import parse_text
from percolator.store import open_store
from percolator.store.memory import MemoryStore
from percolator.timestamps import LocalOracle
from tests.oracle.procs import REPO, OracleProcess

TOKEN = "correct horse battery staple"
BEARER = (("authorization", f"Bearer {TOKEN}"),)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return self_signed(tmp_path_factory.mktemp("tls"))


def self_signed(d: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key (openssl CLI) in ``d``."""
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=IP:127.0.0.1,DNS:localhost",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OracleProcess]:
    """A plaintext oracle that requires a token and allows at most 1000 per call."""
    d = tmp_path_factory.mktemp("plain")
    token_file = d / "token"
    token_file.write_text(TOKEN + "\n")
    oracle = OracleProcess(
        f"embedded:{d / 'store'}",
        d / "oracle.log",
        args=["--token-file", str(token_file), "--max-count", "1000"],
        token=TOKEN,
    )
    try:
        oracle.start().wait_role("ROLE_ACTIVE")
        yield oracle
    finally:
        assert oracle.stop() == 0


@pytest.fixture(scope="module")
def tls(
    tmp_path_factory: pytest.TempPathFactory, certs: tuple[Path, Path]
) -> Iterator[OracleProcess]:
    """A TLS oracle (token from the environment)."""
    d = tmp_path_factory.mktemp("tls_oracle")
    cert, key = certs
    oracle = OracleProcess(
        f"embedded:{d / 'store'}",
        d / "oracle.log",
        args=["--tls-cert", str(cert), "--tls-key", str(key)],
        env={"PERCOLATOR_ORACLE_TOKEN": TOKEN},
    )
    try:
        yield oracle.start()
    finally:
        assert oracle.stop() == 0


def raw_allocate(
    oracle: OracleProcess, count: int, metadata: tuple[tuple[str, str], ...] | None = BEARER
) -> grpc.RpcError:
    channel, stub = oracle.stub()
    try:
        with pytest.raises(grpc.RpcError) as info:
            stub.Allocate(oracle_pb2.AllocateRequest(count=count), timeout=5, metadata=metadata)
        return info.value
    finally:
        channel.close()


@pytest.mark.parametrize(
    ("count", "expected"),
    [(0, "got 0"), (1001, "got 1001"), ((1 << 32) - 1, "got 4294967295")],
)
def test_bad_counts_get_invalid_argument(plain: OracleProcess, count: int, expected: str) -> None:
    error = raw_allocate(plain, count)
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert f"count must be in [1, 1000], {expected}" in str(error.details())


def test_a_stream_answers_in_order_and_an_error_ends_it(plain: OracleProcess) -> None:
    channel, stub = plain.stub()
    try:
        counts = [3, 1, 0, 5]  # the third is invalid: it ends the stream
        answers = stub.AllocateStream(
            iter([oracle_pb2.AllocateRequest(count=c) for c in counts]), timeout=5, metadata=BEARER
        )
        first = next(answers)
        second = next(answers)
        assert (first.count, second.count) == (3, 1)
        assert second.first >= first.first + 3 and second.epoch == first.epoch
        with pytest.raises(grpc.RpcError) as info:
            next(answers)
        assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "got 0" in str(info.value.details())

        refused = stub.AllocateStream(
            iter([oracle_pb2.AllocateRequest(count=1)]), timeout=5, metadata=None
        )
        with pytest.raises(grpc.RpcError) as info:
            next(refused)
        assert info.value.code() is grpc.StatusCode.UNAUTHENTICATED
    finally:
        channel.close()


def test_a_missing_or_wrong_token_is_refused(plain: OracleProcess) -> None:
    missing = raw_allocate(plain, 1, metadata=None)
    assert missing.code() is grpc.StatusCode.UNAUTHENTICATED
    assert "requires a token" in str(missing.details())
    wrong = raw_allocate(plain, 1, metadata=(("authorization", "Bearer nope"),))
    assert wrong.code() is grpc.StatusCode.UNAUTHENTICATED
    assert str(wrong.details()) == "wrong oracle token"
    # Health and Info are protected too.
    channel, stub = plain.stub()
    with pytest.raises(grpc.RpcError) as info:
        stub.Info(oracle_pb2.InfoRequest(), timeout=5)
    channel.close()
    assert info.value.code() is grpc.StatusCode.UNAUTHENTICATED

    client = GrpcOracleClient([plain.address], token="nope", timeout_s=5)
    try:
        with pytest.raises(OracleError, match="refused this client's credentials"):
            client.get_timestamp()
        assert client.rpcs == 1, "credentials errors are not retried"
    finally:
        client.close()


def test_the_client_with_the_token_works_and_checks_counts_itself(plain: OracleProcess) -> None:
    client = GrpcOracleClient([plain.address], token=TOKEN, max_batch=1000)
    try:
        values = client.get_timestamps(2500)  # above max_batch: split by the client
        assert values == sorted(set(values)) and len(values) == 2500
        with pytest.raises(InvalidArgumentError, match="must be >= 1"):
            client.get_timestamps(0)
    finally:
        client.close()


def test_tls_with_the_right_roots_and_token_works(
    tls: OracleProcess, certs: tuple[Path, Path]
) -> None:
    client = GrpcOracleClient([tls.address], token=TOKEN, tls=str(certs[0]))
    try:
        first, second = client.get_timestamp(), client.get_timestamp()
        assert second > first
    finally:
        client.close()


@pytest.mark.parametrize(
    "content", [b"\x00\xffgarbage", b"-----BEGIN CERTIFICATE-----\nnot base64\n"]
)
def test_root_certificates_that_are_not_pem_are_named(
    tmp_path: Path, content: bytes, certs: tuple[Path, Path]
) -> None:
    """gRPC would take them and report every call as 'unavailable'."""
    roots = tmp_path / "roots.pem"
    roots.write_bytes(content)
    with pytest.raises(ConfigError, match=r"root certificates .*roots.pem' are not PEM"):
        GrpcOracleClient(["127.0.0.1:1"], token=TOKEN, tls=str(roots)).get_timestamp()
    GrpcOracleClient(["127.0.0.1:1"], token=TOKEN, tls=str(certs[0])).close()  # a good one


def test_plaintext_client_against_tls_server_is_a_clear_error(tls: OracleProcess) -> None:
    client = GrpcOracleClient([tls.address], token=TOKEN, timeout_s=1)
    try:
        with pytest.raises(OracleUnavailableError, match=r"TLS \(grpcs://\) and the token"):
            client.get_timestamp()
    finally:
        client.close()


def test_tls_client_against_plaintext_server_is_a_clear_error(
    plain: OracleProcess, certs: tuple[Path, Path]
) -> None:
    client = GrpcOracleClient([plain.address], token=TOKEN, tls=str(certs[0]), timeout_s=1)
    try:
        with pytest.raises(OracleUnavailableError, match=plain.address):
            client.get_timestamp()
    finally:
        client.close()


def test_an_untrusted_server_certificate_is_refused(tls: OracleProcess) -> None:
    client = GrpcOracleClient([tls.address], token=TOKEN, tls=True, timeout_s=1)
    try:
        with pytest.raises(OracleUnavailableError):
            client.get_timestamp()
    finally:
        client.close()


def test_100_threads_are_coalesced_into_far_fewer_rpcs(plain: OracleProcess) -> None:
    before = plain.metrics()
    client = GrpcOracleClient([plain.address], token=TOKEN)
    barrier = threading.Barrier(100)
    seen: list[list[int]] = []

    def work() -> None:
        barrier.wait()
        seen.append([client.get_timestamp() for _ in range(20)])

    threads = [threading.Thread(target=work) for _ in range(100)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    client.close()
    after = plain.metrics()
    ok = 'percolator_oracle_requests_total{code="OK",method="Allocate"}'
    rpcs = after[ok] - before.get(ok, 0)
    issued = (
        after["percolator_oracle_timestamps_issued_total"]
        - before["percolator_oracle_timestamps_issued_total"]
    )
    assert issued == 2000 == sum(len(s) for s in seen)
    assert rpcs == client.stats.fetches
    print(f"2000 timestamps for 100 threads in {rpcs:.0f} RPCs")
    assert rpcs <= issued / 10, f"{rpcs} RPCs for {issued} timestamps: not coalesced"
    for s in seen:
        assert s == sorted(s)
    batches = "percolator_oracle_batch_size_count"
    assert after[batches] - before[batches] == rpcs
    assert after["percolator_oracle_active"] == 1 and after["percolator_oracle_epoch"] >= 1


def test_the_local_oracle_refuses_while_a_server_holds_the_lease_and_then_continues(
    tmp_path: Path, spawn: Callable[..., OracleProcess]
) -> None:
    url = f"embedded:{tmp_path / 'store'}"
    server = spawn(url, "oracle")
    server.wait_role("ROLE_ACTIVE")
    client = GrpcOracleClient([server.address])
    store = open_store(url)
    try:
        served = client.get_timestamps(10)
        with pytest.raises(OracleError, match="served by the oracle server"):
            LocalOracle(store).get_timestamp()
        assert server.stop() == 0  # SIGTERM: releases its lease, so after the margin...
        time.sleep(0.6)  # ... (the local oracle's margin_ms is 500) the record is free.
        assert LocalOracle(store).get_timestamp() > served[-1]
    finally:
        client.close()
        store.close()


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "percolator", "oracle", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--listen", "nowhere"], "must look like HOST:PORT"),
        (["--listen", "127.0.0.1:²"], "must look like HOST:PORT"),
        # the byte 0xff, not UTF-8, reaches the command as a lone surrogate
        (["--listen", "\udcff:0"], "host '\\udcff' is not a host name or address"),
        (
            ["--metrics-host", "\udcff", "--metrics-port", "0"],
            "--metrics-host '\\udcff' is not a host name or address",
        ),
        (["--token-file", "{garbage}"], "--token-file '{garbage}' is not UTF-8 text"),
        (["--tls-cert", "/x.pem"], "TLS needs both --tls-cert and --tls-key"),
        (
            ["--tls-cert", "/nonexistent/c.pem", "--tls-key", "/nonexistent/k.pem"],
            "cannot read the TLS key '/nonexistent/k.pem'",
        ),
        (["--token-file", "/nonexistent/t"], "cannot read --token-file"),
        (["--token", "a", "--token-file", "/x"], "not both"),
        (["--lease-ms", "100"], "must be at least 3x the clock margin"),
    ],
)
def test_serve_rejects_bad_options_with_one_clear_line(
    tmp_path: Path, args: list[str], message: str
) -> None:
    garbage = tmp_path / "garbage.bin"
    garbage.write_bytes(b"\xff\xfe\x00garbage")
    args = [arg.format(garbage=garbage) for arg in args]
    result = run_cli("serve", "--store", f"embedded:{tmp_path / 's'}", *args)
    assert result.returncode == 2
    assert result.stderr.startswith("percolator: error: "), result.stderr
    assert message.format(garbage=garbage) in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("cert not PEM", "the TLS certificate '{cert}' holds no PEM certificate"),
        ("cert truncated", "the TLS certificate '{cert}' is not a valid PEM certificate"),
        ("cert and key swapped", "the TLS certificate '{cert}' holds no PEM certificate"),
        ("key not PEM", "the TLS key '{key}' holds no PEM private key"),
        ("key damaged", "the TLS key '{key}' is not a valid PEM private key for '{cert}'"),
        ("key of another certificate", "the TLS key '{key}' does not match the certificate"),
        ("key encrypted", "the TLS key '{key}' is encrypted (needs a passphrase)"),
    ],
)
def test_serve_names_a_bad_tls_file_and_what_is_wrong(
    tmp_path: Path, certs: tuple[Path, Path], case: str, message: str
) -> None:
    """A bad certificate or key fails before anything starts, naming the file and the
    problem, not as a failure to bind the address; even with --create no store is made."""
    good_cert, good_key = certs
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.write_bytes(good_cert.read_bytes())
    key.write_bytes(good_key.read_bytes())
    if case == "cert not PEM":
        cert.write_bytes(b"\x30\x82\x01\x0a not a certificate")
    elif case == "cert truncated":
        cert.write_bytes(good_cert.read_bytes()[:120] + b"\n-----END CERTIFICATE-----\n")
    elif case == "cert and key swapped":
        cert, key = key, cert
    elif case == "key not PEM":
        key.write_text("hello\n")
    elif case == "key damaged":
        key.write_text("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
    elif case == "key of another certificate":
        other = tmp_path / "other"
        other.mkdir()
        key = self_signed(other)[1]
    elif case == "key encrypted":
        subprocess.run(
            [
                "openssl",
                "pkey",
                "-in",
                str(good_key),
                "-out",
                str(key),
                "-aes256",
                "-passout",
                "pass:x",
            ],
            check=True,
            capture_output=True,
        )
    store = tmp_path / "store"
    tls_args = ["--listen", "127.0.0.1:0", "--tls-cert", str(cert), "--tls-key", str(key)]
    result = run_cli("serve", "--create", "--store", f"embedded:{store}", *tls_args)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("percolator: error: "), result.stderr
    assert message.format(cert=cert, key=key) in result.stderr
    assert "cannot listen" not in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not store.exists()


def test_serve_refuses_an_address_in_use(plain: OracleProcess, tmp_path: Path) -> None:
    store = f"embedded:{tmp_path / 's'}"
    result = run_cli("serve", "--create", "--store", store, "--listen", plain.address)
    assert result.returncode == 2
    assert f"cannot listen on {plain.address}" in result.stderr


def test_info_on_a_dead_address_exits_1_with_a_reason(tmp_path: Path) -> None:
    from tests.oracle.procs import free_port

    address = f"127.0.0.1:{free_port()}"
    result = run_cli("info", "--oracle", f"grpc://{address}")
    assert result.returncode == 1
    assert f"{address}: oracle {address} is unavailable" in result.stdout


def test_the_generated_stub_is_the_api_the_server_serves(plain: OracleProcess) -> None:
    channel = grpc.insecure_channel(plain.address)
    health = oracle_pb2_grpc.TimestampOracleStub(channel).Health(
        oracle_pb2.HealthRequest(), timeout=5, metadata=BEARER
    )
    channel.close()
    assert health.role == oracle_pb2.ROLE_ACTIVE and health.epoch >= 1


def test_transactions_take_their_timestamps_from_the_oracle_service(
    tmp_path: Path, spawn: Callable[..., OracleProcess]
) -> None:
    import percolator

    url = f"embedded:{tmp_path / 'store'}"
    server = spawn(url, "oracle")
    server.wait_role("ROLE_ACTIVE")
    with percolator.connect(url, oracle=f"grpc://{server.address}") as client:
        client.create_table("t")
        with client.transaction() as txn:
            txn.set("t", b"row", "col", b"value")
        assert client.snapshot().get("t", b"row", "col") == b"value"
    assert server.info().timestamps_issued >= 3  # start, commit, snapshot


@contextlib.contextmanager
def in_process_oracle(lease: LeaseConfig, **options: Any) -> Iterator[OracleServer]:
    """An oracle server in this process, on a memory store; stopped on leaving."""
    server = OracleServer(
        ServerOptions(store_url="memory:", listen="127.0.0.1:0", lease=lease, **options),
        store=MemoryStore(),
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


def scrape(server: OracleServer) -> dict[str, float]:
    """The server's metrics endpoint, parsed."""
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        return parse_text(response.read().decode())


def test_the_metrics_endpoint_starts_at_zero_and_serves_health() -> None:
    lease = LeaseConfig(lease_ms=600, window_ms=600, margin_ms=100)
    with in_process_oracle(lease, metrics_port=0) as server:
        metrics = scrape(server)
        # Before any request: every counter and declared series is there, at zero.
        requests = "percolator_oracle_requests_total"
        assert metrics[f'{requests}{{code="OK",method="Allocate"}}'] == 0
        assert metrics[f'{requests}{{code="UNAVAILABLE",method="Allocate"}}'] == 0
        assert metrics[f'{requests}{{code="OK",method="Info"}}'] == 0
        assert metrics["percolator_oracle_timestamps_issued_total"] == 0
        assert metrics["percolator_oracle_batch_size_count"] == 0
        assert metrics["process_cpu_seconds_total"] >= 0
        base = f"http://127.0.0.1:{server.metrics_port}"
        with urllib.request.urlopen(f"{base}/healthz", timeout=5) as response:
            assert (response.status, response.read()) == (200, b"ok\n")
        assert server.node is not None
        server.node.stop()  # stopping: no longer healthy
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(f"{base}/healthz", timeout=5)
        assert caught.value.code == 503 and b"stopping" in caught.value.read()


def test_a_server_with_no_stream_free_answers_allocate_calls() -> None:
    """A stream holds a server thread while open, so their number is bounded; one more is
    refused at once, and its client takes its timestamps with Allocate calls instead."""
    lease = LeaseConfig(lease_ms=2000, window_ms=2000, margin_ms=300)
    with in_process_oracle(lease, metrics_port=0, stream_slots=1) as server:
        address = f"127.0.0.1:{server.port}"
        first = GrpcOracleClient([address], timeout_s=10)
        second = GrpcOracleClient([address], timeout_s=10)
        try:
            taken = [first.get_timestamp() for _ in range(3)]  # holds the one stream
            taken += [second.get_timestamp() for _ in range(3)]  # refused a stream
            taken += [first.get_timestamp()]
            assert taken == sorted(set(taken))
            metrics = scrape(server)
            requests = "percolator_oracle_requests_total"
            refused = f'{requests}{{code="RESOURCE_EXHAUSTED",method="AllocateStream"}}'
            assert metrics[refused] == 1
            assert metrics[f'{requests}{{code="OK",method="Allocate"}}'] == 7
            assert (first.rpcs, second.rpcs) == (4, 3)
        finally:
            first.close()
            second.close()


def test_stopping_ends_the_open_streams_at_once() -> None:
    """Clients keep a stream open between requests; a stop that waited for them would hold
    the lease (and delay the standby's take-over) for its whole grace period."""
    lease = LeaseConfig(lease_ms=2000, window_ms=2000, margin_ms=300)
    with in_process_oracle(lease) as server:
        client = GrpcOracleClient([f"127.0.0.1:{server.port}"], timeout_s=0.5)
        try:
            client.get_timestamp()  # its stream stays open, idle
            started = time.monotonic()
            server.stop(grace_s=5.0)
            assert time.monotonic() - started < 2.0
            with pytest.raises(OracleUnavailableError):
                client.get_timestamp()
        finally:
            client.close()


def test_grpc_health_checking_names_the_active_oracle(
    tmp_path: Path, spawn: Callable[..., OracleProcess]
) -> None:
    """The standard gRPC health service: every running oracle is SERVING for "", only the
    active one for its own service, so probes and load balancers find the one that issues."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from percolator.oracle.server import ORACLE_SERVICE

    url = f"embedded:{tmp_path / 'store'}"
    active = spawn(url, "active")
    standby = spawn(url, "standby")

    def status(oracle: OracleProcess, service: str) -> int:
        with grpc.insecure_channel(oracle.address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            request = health_pb2.HealthCheckRequest(service=service)
            response = stub.Check(request, timeout=10)
            return int(response.status)

    serving = health_pb2.HealthCheckResponse.SERVING
    not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
    deadline = time.monotonic() + 30
    while status(active, ORACLE_SERVICE) != serving:  # the first one takes the lease
        assert time.monotonic() < deadline, "the first oracle never became active"
        time.sleep(0.2)
    assert status(active, "") == serving
    assert status(standby, "") == serving
    assert status(standby, ORACLE_SERVICE) == not_serving


def test_a_store_takes_its_timestamps_from_one_oracle_only(
    tmp_path: Path, spawn: Callable[..., OracleProcess]
) -> None:
    """A store is bound to the oracle of its first timestamp (percolator/timestamps/
    domain.py); a client given another oracle - another store's service, or the local
    oracle of a store bound to a service - is refused when it connects, naming both, before
    it writes anything.  Several stores may share one oracle service, and `status` reports
    on a store through the store's own service."""
    import percolator
    from percolator.cli import main
    from percolator.layout import deployment_id

    ours, theirs = f"embedded:{tmp_path / 'ours'}", f"embedded:{tmp_path / 'theirs'}"
    shared = f"embedded:{tmp_path / 'shared'}"
    with percolator.connect(ours) as client:  # its own (local) oracle
        client.create_table("t")
        client.run(lambda txn: txn.set("t", b"r", "c", b"v"))
    server = spawn(theirs, "oracle")
    server.wait_role("ROLE_ACTIVE")
    service = f"grpc://{server.address}"
    with pytest.raises(OracleError, match="takes its timestamps from the store's own") as no:
        percolator.connect(ours, oracle=service)
    assert server.address in str(no.value) and theirs in str(no.value)
    # A store whose first timestamp came from the service takes its timestamps from it...
    with percolator.connect(shared, oracle=service) as client:
        client.create_table("t")
        client.run(lambda txn: txn.set("t", b"r", "c", b"v"))
        assert client.snapshot().get("t", b"r", "c") == b"v"
    # ...refuses the local oracle when it connects...
    with pytest.raises(OracleError, match="from the oracle service at"):
        percolator.connect(shared)
    # ...and its status is read through the service.
    assert main(["status", "--store", shared, "--oracle", service]) == 0
    assert main(["status", "--store", shared]) == 2
    with open_store(ours) as store, open_store(theirs) as other:
        assert deployment_id(store) != deployment_id(other)
        assert deployment_id(store) == deployment_id(store)  # stable


def test_commands_that_draw_no_timestamp_bind_nothing(tmp_path: Path) -> None:
    import percolator
    from percolator.cli import main
    from percolator.timestamps.domain import read_binding

    url = f"embedded:{tmp_path / 'store'}"
    with percolator.connect(url) as client:
        client.create_table("t")
    for argv in (["observers", "list"], ["notifications", "list"]):
        main([*argv, "--store", url])
    with open_store(url) as store:
        assert read_binding(store) is None


def test_concurrent_first_reads_of_the_deployment_id_agree() -> None:
    from percolator.layout import deployment_id

    store = MemoryStore()
    ids: list[str] = []
    threads = [threading.Thread(target=lambda: ids.append(deployment_id(store))) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(ids) == 8 and len(set(ids)) == 1


def test_a_server_on_a_store_bound_to_another_oracle_warns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from percolator.timestamps.domain import bind_timestamp_domain

    store = MemoryStore()
    bind_timestamp_domain(store, "svc", "the oracle service at a:1 (its store x)")
    lease = LeaseConfig(lease_ms=600, window_ms=600, margin_ms=100)
    server = OracleServer(
        ServerOptions(store_url="memory:", listen="127.0.0.1:0", lease=lease), store=store
    )
    with caplog.at_level("WARNING"):
        server.start()
    try:
        assert "its clients will refuse this server's" in caplog.text
        assert "the oracle service at a:1" in caplog.text
    finally:
        server.stop()


def test_an_oracle_object_given_to_connect_is_checked_against_the_store(
    tmp_path: Path, spawn: Callable[..., OracleProcess]
) -> None:
    """An oracle object made elsewhere is held to the store as a URL's oracle is
    (``TimestampOracle.attach_store``): refused when it connects if the store takes its
    timestamps from another oracle, and an unbound store is bound by its first timestamp."""
    import percolator
    from percolator.errors import ConfigError
    from percolator.timestamps.domain import read_binding

    ours, theirs = f"embedded:{tmp_path / 'ours'}", f"embedded:{tmp_path / 'theirs'}"
    fresh = f"embedded:{tmp_path / 'fresh'}"
    with percolator.connect(ours) as client:  # bound to its own (local) oracle
        client.create_table("t")
        client.run(lambda txn: txn.set("t", b"r", "c", b"v"))
    server = spawn(theirs, "oracle")
    server.wait_role("ROLE_ACTIVE")
    with open_store(ours) as store, open_store(theirs) as other, open_store(fresh) as new:
        # A local oracle of another store: refused, though the store is bound to its own.
        with pytest.raises(ConfigError, match="cannot serve store"):
            percolator.connect(store, oracle=LocalOracle(other))
        # A local oracle of the same deployment through another Store object: accepted.
        with open_store(ours) as again, percolator.connect(store, oracle=LocalOracle(again)) as c:
            assert c.snapshot().get("t", b"r", "c") == b"v"
        # A client of the service, made without a store: refused for a store bound to the
        # local oracle before it writes anything...
        service = GrpcOracleClient([server.address])
        try:
            with pytest.raises(OracleError, match="takes its timestamps from the store's own"):
                percolator.connect(store, oracle=service)
        finally:
            service.close()
        # ...and it binds a fresh store with its first timestamp, as grpc:// would.
        service = GrpcOracleClient([server.address])
        try:
            with percolator.connect(new, oracle=service) as client:
                client.create_table("t")
                client.run(lambda txn: txn.set("t", b"r", "c", b"v"))
            binding = read_binding(new)
            assert binding is not None and server.address in binding.source
            # One client checks one store: another deployment is refused.
            with pytest.raises(ConfigError, match="one client per store"):
                percolator.connect(other, oracle=service)
        finally:
            service.close()
        # Without the check, the local oracle of a bound store would be refused only at its
        # first timestamp; now connect() refuses it.
        with pytest.raises(OracleError, match="from the oracle service at"):
            percolator.connect(new, oracle=LocalOracle(new))


def test_a_range_refused_as_another_domains_does_not_fence_the_right_oracle() -> None:
    """A server restarted by mistake on another deployment's store (whose oracle record is
    at a higher epoch) answers at the client's address: its range is refused, and once the
    right server is back the client takes timestamps from it again. Epochs order one
    domain's oracle records, not two domains'."""
    from percolator.timestamps.record import OracleRecord, OracleRecordRegister

    lease = LeaseConfig(lease_ms=300, window_ms=300, margin_ms=100)
    ours, theirs = MemoryStore("memory:ours"), MemoryStore("memory:theirs")
    # The other deployment's oracle has been through fail-overs: epoch 9.
    OracleRecordRegister(theirs).compare_and_set(
        None, OracleRecord(epoch=9, high_water=0, holder="oracle:old")
    )
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{probe.getsockname()[1]}"

    def serve(store: MemoryStore) -> OracleServer:
        options = ServerOptions(store_url=store.url, listen=address, lease=lease)
        server = OracleServer(options, store=store)
        server.start()
        deadline = time.monotonic() + 10
        while server.node.role.value != "active" and time.monotonic() < deadline:
            time.sleep(0.02)
        return server

    client = GrpcOracleClient([address], store=ours, timeout_s=2.0)
    try:
        server = serve(ours)
        first = client.get_timestamp()
        server.stop(0)
        server = serve(theirs)  # the operator's mistake
        with pytest.raises(OracleError, match="another domain"):
            client.get_timestamp()
        server.stop(0)
        server = serve(ours)  # put right
        assert client.get_timestamp() > first
        server.stop(0)
    finally:
        client.close()

"""The gRPC client against scripted servers (real gRPC, scripted answers): fail-over,
client-side fencing, and error translation."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import pytest
from percolator.oracle.client import GrpcOracleClient
from percolator.oracle.proto_gen import oracle_pb2, oracle_pb2_grpc

from percolator.errors import (
    ConfigError,
    InvalidArgumentError,
    OracleError,
    OracleUnavailableError,
    TimestampRegressionError,
)
from percolator.timestamps import compose, now_ms
from tests.oracle.procs import free_port

Answer = Callable[[oracle_pb2.AllocateRequest, Any], oracle_pb2.AllocateResponse]


class Scripted(oracle_pb2_grpc.TimestampOracleServicer):
    """Answers each allocation, whether an Allocate call or a request on an AllocateStream,
    with the next scripted answer (the last one repeats).  ``streams=False``: a server
    without AllocateStream (UNIMPLEMENTED, as a server before it answers)."""

    def __init__(self, answers: list[Answer], streams: bool = True) -> None:
        self.answers = answers
        self.streams = streams
        self.calls = 0
        self.unary_calls = 0
        self.streams_opened = 0
        self.lock = threading.Lock()

    def _answer(self, request: Any, context: Any) -> Any:
        with self.lock:
            answer = self.answers[min(self.calls, len(self.answers) - 1)]
            self.calls += 1
        return answer(request, context)

    def Allocate(self, request: Any, context: Any) -> Any:
        with self.lock:
            self.unary_calls += 1
        return self._answer(request, context)

    def AllocateStream(self, request_iterator: Any, context: Any) -> Any:
        if not self.streams:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
        with self.lock:
            self.streams_opened += 1
        for request in request_iterator:
            yield self._answer(request, context)

    def Health(self, request: Any, context: Any) -> Any:
        return oracle_pb2.HealthResponse()

    def Info(self, request: Any, context: Any) -> Any:
        return oracle_pb2.InfoResponse()


def ok(first: int, epoch: int = 1, valid_for_ms: int = 10_000) -> Answer:
    def answer(request: Any, context: Any) -> oracle_pb2.AllocateResponse:
        return oracle_pb2.AllocateResponse(
            first=first, count=request.count, epoch=epoch, valid_until_ms=now_ms() + valid_for_ms
        )

    return answer


def fail(code: grpc.StatusCode, message: str) -> Answer:
    def answer(request: Any, context: Any) -> oracle_pb2.AllocateResponse:
        context.abort(code, message)
        raise AssertionError("abort raises")

    return answer


@pytest.fixture
def serve() -> Iterator[Callable[[Scripted | None], str]]:
    servers: list[grpc.Server] = []

    def start(servicer: Scripted | None) -> str:
        server = grpc.server(ThreadPoolExecutor(4))
        if servicer is not None:
            oracle_pb2_grpc.add_TimestampOracleServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        servers.append(server)
        return f"127.0.0.1:{port}"

    yield start
    for server in servers:
        server.stop(0)


T0 = compose(1_800_000_000_000)


def test_a_dead_first_address_fails_over_and_sticks_to_the_live_one(serve: Any) -> None:
    live = Scripted([ok(T0), ok(T0 + 10)])
    client = GrpcOracleClient([f"127.0.0.1:{free_port()}", serve(live)], timeout_s=5)
    try:
        assert client.get_timestamps(3) == [T0, T0 + 1, T0 + 2]
        assert client.failovers == 1
        rpcs = client.rpcs
        assert client.get_timestamp() == T0 + 10
        assert client.rpcs == rpcs + 1, "the next call goes straight to the live address"
    finally:
        client.close()


def test_a_standby_answer_moves_to_the_next_address(serve: Any) -> None:
    standby = Scripted([fail(grpc.StatusCode.UNAVAILABLE, "oracle b is a standby")])
    active = Scripted([ok(T0, epoch=2)])
    client = GrpcOracleClient([serve(standby), serve(active)], timeout_s=5)
    try:
        assert client.get_timestamp() == T0
        assert client.epoch == 2 and standby.calls == 1
    finally:
        client.close()


def test_a_response_from_a_lower_epoch_is_discarded(serve: Any) -> None:
    # The client saw epoch 5; a deposed oracle of epoch 4 answers later.
    a = Scripted([ok(T0, epoch=5), ok(T0 + 100, epoch=4)])
    b = Scripted([ok(T0 + 200, epoch=6)])
    client = GrpcOracleClient([serve(a), serve(b)], timeout_s=5)
    try:
        assert client.get_timestamp() == T0
        assert client.get_timestamp() == T0 + 200
        assert client.epoch == 6
    finally:
        client.close()


def test_a_response_that_arrives_after_its_lease_lapsed_is_discarded(serve: Any) -> None:
    late = Scripted([ok(T0, valid_for_ms=-1)])
    client = GrpcOracleClient([serve(late)], timeout_s=0.5)
    try:
        with pytest.raises(OracleUnavailableError, match="after its lease lapsed"):
            client.get_timestamp()
    finally:
        client.close()


def test_a_lower_timestamp_in_the_same_epoch_is_a_regression(serve: Any) -> None:
    server = Scripted([ok(T0 + 10), ok(T0 + 5)])
    client = GrpcOracleClient([serve(server)], timeout_s=2)
    try:
        client.get_timestamp()
        with pytest.raises(TimestampRegressionError):
            client.get_timestamp()
    finally:
        client.close()


def test_a_wrong_count_is_a_protocol_error(serve: Any) -> None:
    def short(request: Any, context: Any) -> oracle_pb2.AllocateResponse:
        return oracle_pb2.AllocateResponse(
            first=T0, count=request.count - 1, epoch=1, valid_until_ms=now_ms() + 10_000
        )

    client = GrpcOracleClient([serve(Scripted([short]))], timeout_s=2)
    try:
        with pytest.raises(OracleError, match="answered 1 timestamps to a request for 2"):
            client.get_timestamps(2)
    finally:
        client.close()


def test_credentials_errors_are_not_retried(serve: Any) -> None:
    server = Scripted([fail(grpc.StatusCode.UNAUTHENTICATED, "wrong oracle token")])
    client = GrpcOracleClient([serve(server)], timeout_s=5)
    try:
        with pytest.raises(OracleError, match=r"refused this client's credentials.*wrong"):
            client.get_timestamp()
        assert server.calls == 1
    finally:
        client.close()


def test_invalid_argument_is_an_invalid_argument_error(serve: Any) -> None:
    server = Scripted([fail(grpc.StatusCode.INVALID_ARGUMENT, "count must be in [1, 10]")])
    client = GrpcOracleClient([serve(server)], timeout_s=5)
    try:
        with pytest.raises(InvalidArgumentError, match=r"rejected the request: count must be"):
            client.get_timestamp()
    finally:
        client.close()


def test_a_server_without_the_service_is_named(serve: Any) -> None:
    client = GrpcOracleClient([serve(None)], timeout_s=5)
    try:
        with pytest.raises(OracleError, match="does not serve the timestamp oracle API"):
            client.get_timestamp()
    finally:
        client.close()


def test_a_hung_oracle_hits_the_rpc_deadline_and_the_next_address_answers(serve: Any) -> None:
    release = threading.Event()

    def hang(request: Any, context: Any) -> oracle_pb2.AllocateResponse:
        release.wait(10)
        return ok(T0)(request, context)

    hung, live = Scripted([hang]), Scripted([ok(T0 + 1)])
    client = GrpcOracleClient([serve(hung), serve(live)], timeout_s=5, rpc_timeout_s=0.2)
    try:
        started = time.monotonic()
        assert client.get_timestamp() == T0 + 1
        assert time.monotonic() - started < 2
    finally:
        release.set()
        client.close()


def test_nothing_listening_gives_a_clear_error_within_the_timeout() -> None:
    addresses = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    client = GrpcOracleClient(addresses, timeout_s=0.5)
    started = time.monotonic()
    try:
        with pytest.raises(OracleUnavailableError) as info:
            client.get_timestamp()
    finally:
        client.close()
    assert time.monotonic() - started < 3
    message = str(info.value)
    assert all(a in message for a in addresses)
    assert "answered within 0.5 s" in message and "percolator oracle serve" in message


@pytest.mark.parametrize("addresses", [[], "127.0.0.1:1", ["nohost"], ["h:0"]])
def test_bad_address_lists_are_config_errors(addresses: Any) -> None:
    with pytest.raises(ConfigError):
        GrpcOracleClient(addresses)


def test_a_closed_client_refuses_politely() -> None:
    client = GrpcOracleClient([f"127.0.0.1:{free_port()}"])
    client.close()
    with pytest.raises(OracleError, match="closed"):
        client.get_timestamp()


def test_allocations_share_one_stream(serve: Any) -> None:
    live = Scripted([ok(T0 + 100 * i) for i in range(20)])
    client = GrpcOracleClient([serve(live)], timeout_s=5)
    try:
        taken = [client.get_timestamp() for _ in range(20)]
        assert taken == [T0 + 100 * i for i in range(20)]
        assert (live.calls, live.unary_calls, live.streams_opened) == (20, 0, 1)
        assert client.rpcs == 20
    finally:
        client.close()


def test_a_server_without_streams_gets_allocate_calls(serve: Any) -> None:
    old = Scripted([ok(T0 + 100 * i) for i in range(3)], streams=False)
    client = GrpcOracleClient([serve(old)], timeout_s=5)
    try:
        assert [client.get_timestamp() for _ in range(3)] == [T0, T0 + 100, T0 + 200]
        # Refused once, then Allocate calls only: no stream is tried for every request.
        assert (old.calls, old.unary_calls, old.streams_opened) == (3, 3, 0)
        assert client.rpcs == 3 and client.failovers == 0
    finally:
        client.close()


def test_a_stream_ended_by_an_error_is_replaced_by_a_new_one(serve: Any) -> None:
    flaky = Scripted([fail(grpc.StatusCode.UNAVAILABLE, "standby"), ok(T0), ok(T0 + 10)])
    client = GrpcOracleClient([serve(flaky)], timeout_s=5)
    try:
        assert client.get_timestamp() == T0
        assert client.get_timestamp() == T0 + 10
        assert (flaky.calls, flaky.unary_calls, flaky.streams_opened) == (3, 0, 2)
        assert client.rpcs == 3
    finally:
        client.close()


def test_an_old_stream_is_renewed_before_its_deadline(
    serve: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import percolator.oracle.client as client_module

    monkeypatch.setattr(client_module, "_STREAM_RENEW_S", 0.0)
    live = Scripted([ok(T0 + 100 * i) for i in range(3)])
    client = GrpcOracleClient([serve(live)], timeout_s=5)
    try:
        assert [client.get_timestamp() for _ in range(3)] == [T0, T0 + 100, T0 + 200]
        assert (live.calls, live.unary_calls, live.streams_opened) == (3, 0, 3)
    finally:
        client.close()


def in_domain(first: int, domain: str) -> Answer:
    """An answer that names the timestamp domain it was issued in."""

    def answer(request: Any, context: Any) -> oracle_pb2.AllocateResponse:
        response = ok(first)(request, context)
        response.deployment_id = domain
        return response

    return answer


def test_every_range_is_checked_against_the_store_binding(
    serve: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The first range binds an unbound store to its domain; a range of another domain is
    refused before it is used - also from an address that served the right domain before
    (another server now answers there) - and not failed over; a server that names no
    domain (older) is used with a warning."""
    from percolator.store.memory import MemoryStore
    from percolator.timestamps.domain import read_binding

    store = MemoryStore()
    replaced = Scripted([in_domain(T0, "ours"), in_domain(T0 + 10, "theirs")])
    client = GrpcOracleClient([serve(replaced)], timeout_s=5, store=store)
    try:
        assert client.get_timestamp() == T0
        binding = read_binding(store)
        assert binding is not None and binding.domain == "ours"
        with pytest.raises(OracleError, match=r"another domain \(theirs\).*bound to \(ours\)"):
            client.get_timestamp()
    finally:
        client.close()
    wrong = Scripted([in_domain(T0, "theirs")])
    client = GrpcOracleClient([serve(wrong)], timeout_s=5, store=store)
    try:
        with pytest.raises(OracleError, match="takes its timestamps from the oracle service"):
            client.get_timestamp()
    finally:
        client.close()
    older = Scripted([ok(T0)])
    client = GrpcOracleClient([serve(older)], timeout_s=5, store=store)
    try:
        with caplog.at_level("WARNING"):
            assert client.get_timestamp() == T0
        assert "does not say which store's timestamps it issues" in caplog.text
    finally:
        client.close()


@pytest.mark.parametrize(("above", "bound_to"), [(True, "svc"), (False, "own")])
def test_a_store_whose_own_oracle_issued_moves_to_a_service_only_above_its_high_water(
    serve: Any, above: bool, bound_to: str
) -> None:
    """An unbound store with an oracle record of its own (used before the binding existed,
    or one local timestamp drawn by mistake) is bound to the service of its first range
    only if that range starts above everything its own oracle can have issued."""
    from percolator.layout import deployment_id
    from percolator.store.memory import MemoryStore
    from percolator.timestamps.domain import read_binding
    from percolator.timestamps.record import OracleRecord, OracleRecordRegister

    store = MemoryStore()
    high_water = T0 + 1000
    assert OracleRecordRegister(store).compare_and_set(None, OracleRecord(1, high_water, "local"))
    first = high_water + 1 if above else high_water
    client = GrpcOracleClient(
        [serve(Scripted([in_domain(first, "svc")]))], timeout_s=5, store=store
    )
    try:
        if above:
            assert client.get_timestamp() == first
        else:
            with pytest.raises(OracleError, match=r"this store\), which has issued its timestamps"):
                client.get_timestamp()
    finally:
        client.close()
    binding = read_binding(store)
    assert binding is not None
    assert binding.domain == ("svc" if bound_to == "svc" else deployment_id(store))

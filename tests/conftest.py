"""The fixtures every test directory shares: one list of backends, one way to get a store
namespace, a store and a client on each, and the session's HBase.

Backends come from :data:`percolator.store.BACKENDS`; the HBase one is marked ``hbase``.

* ``backend`` / ``shared_backend`` / ``local_backend``: a fresh namespace
  (:class:`StoreNamespace`: backend name and URL), parametrized over every backend, over
  those several processes can share (embedded, HBase), and over those needing no server
  (memory, embedded).  ``store_url`` / ``shared_store_url`` / ``local_store_url`` are their
  URLs; ``memory_url``, ``embedded_url`` and ``hbase_store_url`` give one backend's.  A
  namespace is a unique ``memory:NAME``, a fresh directory, or a unique table prefix on the
  shared HBase whose tables are dropped after the test (in the background; the session waits
  for every drop at its end).
* ``store``: a store opened on ``backend``, closed at teardown.
* ``client``: a client on a fresh namespace of every backend, with the tables of
  ``client_settings`` created.  Test modules marked ``every_oracle`` also run it with the
  oracle persisted in the store (memory, embedded) and with the gRPC oracle service
  (memory).  ``client_settings`` (lock TTL and wait, oracle, tables) is the one fixture a
  directory or module overrides to change them; :func:`connect_client` builds such a client
  on any URL.
* ``fast_observed_refresh``: a 200 ms observed-set refresh instead of 2 s (inherited by
  subprocesses), for directories that register observers.

``hbase_url`` (session scope, created only when a test asks for it) gives
``hbase://HOST:PORT?thrift2_port=PORT2`` of an HBase that answers through its Thrift-1 and
Thrift-2 gateways (tests/store/test_hbase_thrift2.py fails if the URL names no Thrift-2
gateway; the rest work with either):

* ``PERCOLATOR_TEST_HBASE_URL`` set: that server, after checking that it answers (it is
  shared, so tests must use unique table names or a ``?prefix=`` of their own: the
  namespace fixtures above do);
* otherwise a :class:`~percolator.testing.localhbase.LocalHBase` started in a temporary
  directory for this session and stopped at its end (about 20-30 s to start on two cores;
  its logs stay under pytest's temporary directory);
* optionally, ``PERCOLATOR_TEST_HBASE=docker`` with ``PERCOLATOR_TEST_HBASE_IMAGE`` naming an
  image that serves Thrift-1 on port 9090 and Thrift-2 on 9095 (docker/hbase/Dockerfile
  does): a container through testcontainers, when Docker
  is reachable (else the local launcher, with a notice).  Never required.

A missing ``java`` or ``mvn`` fails the tests that need HBase with the launcher's message:
the suite never skips them.
"""

from __future__ import annotations

import contextlib
import os
import sys
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import percolator
from percolator.client import OBSERVED_REFRESH_ENV
from percolator.errors import ConfigError
from percolator.store import BACKENDS, Backend, Store, open_store
from percolator.store.url import parse_store_url
from percolator.testing import ManualOracle
from percolator.testing.localhbase import (
    HBaseLauncherError,
    LocalHBase,
    probe_thrift2,
    wait_until_serving,
)

# The session's HBase holds nothing worth keeping: do not wait out HBase's ~20 s standalone
# shutdown (regions are flushed and closed within a second or two of SIGTERM).
_SESSION_STOP_GRACE_S = 10.0
_EXTERNAL_READY_TIMEOUT_S = 30.0


def terminal_progress(config: pytest.Config) -> Callable[[str], None]:
    """A progress reporter that reaches the terminal even while pytest captures output
    (starting HBase takes long enough that a silent wait looks like a hang)."""
    capture = config.pluginmanager.getplugin("capturemanager")
    reporter = config.pluginmanager.getplugin("terminalreporter")

    def report(message: str) -> None:
        line = f"[hbase] {message}"
        if reporter is None:  # e.g. a pytest-xdist worker
            print(line, file=sys.stderr, flush=True)
        elif capture is not None:
            with capture.global_and_fixture_disabled():
                reporter.write_line(line)
        else:
            reporter.write_line(line)

    return report


@pytest.fixture(scope="session")
def hbase_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    progress = terminal_progress(request.config)
    external = os.environ.get("PERCOLATOR_TEST_HBASE_URL", "").strip()
    if external:
        yield _check_external(external, progress)
        return
    if os.environ.get("PERCOLATOR_TEST_HBASE", "").strip().lower() == "docker":
        container = _start_container(progress)
        if container is not None:
            url, stop = container
            try:
                yield url
            finally:
                stop()
            return
    hbase = LocalHBase(tmp_path_factory.mktemp("hbase"), progress=progress)
    try:
        url = hbase.start()
    except HBaseLauncherError as exc:
        pytest.fail(f"cannot start the test session's HBase: {exc}", pytrace=False)
    try:
        yield url
    finally:
        hbase.stop(grace_s=_SESSION_STOP_GRACE_S)


def _check_external(url: str, progress: Callable[[str], None]) -> str:
    try:
        parsed = parse_store_url(url)
    except ConfigError as exc:
        pytest.fail(f"PERCOLATOR_TEST_HBASE_URL is not a store URL: {exc}", pytrace=False)
    if parsed.scheme != "hbase":
        pytest.fail(
            f"PERCOLATOR_TEST_HBASE_URL={url!r} must be an hbase://HOST:PORT URL", pytrace=False
        )
    try:
        wait_until_serving(parsed.host, parsed.port, _EXTERNAL_READY_TIMEOUT_S, progress)
    except HBaseLauncherError as exc:
        pytest.fail(
            f"PERCOLATOR_TEST_HBASE_URL={url!r} does not answer: {exc}. Start one with "
            "`percolator hbase start`, or unset the variable to let the tests start their own.",
            pytrace=False,
        )
    return url


def _start_container(
    progress: Callable[[str], None],
) -> tuple[str, Callable[[], None]] | None:
    """Optional: HBase in Docker through testcontainers.  None when Docker is unreachable."""
    image = os.environ.get("PERCOLATOR_TEST_HBASE_IMAGE", "").strip()
    if not image:
        pytest.fail(
            "PERCOLATOR_TEST_HBASE=docker needs PERCOLATOR_TEST_HBASE_IMAGE: an image that "
            "serves HBase's Thrift-1 gateway on port 9090 and its Thrift-2 gateway on 9095",
            pytrace=False,
        )
    try:
        from testcontainers.core.container import DockerContainer

        import docker  # type: ignore[import-untyped]  # comes with testcontainers

        docker.from_env().ping()
    except Exception as exc:  # no package, no daemon, no permission: all mean "no Docker"
        progress(
            f"PERCOLATOR_TEST_HBASE=docker but Docker is not reachable ({exc}); "
            "starting a local HBase instead"
        )
        return None
    container = DockerContainer(image).with_exposed_ports(9090, 9095)
    container.start()
    try:
        try:
            host = container.get_container_host_ip()
            port = int(container.get_exposed_port(9090))
            thrift2_port = int(container.get_exposed_port(9095))
        except Exception as exc:
            # Seen with podman's Docker API from inside a sandbox that has /.dockerenv:
            # testcontainers then looks for a gateway in fields podman does not return.
            container.stop()
            pytest.fail(
                f"cannot find the published port of HBase's container ({type(exc).__name__}: "
                f"{exc}); when the container engine runs on this machine, set "
                "TESTCONTAINERS_CONNECTION_MODE=docker_host",
                pytrace=False,
            )
        wait_until_serving(host, port, 300.0, progress)
        wait_until_serving(host, thrift2_port, 60.0, progress, check=probe_thrift2)
    except HBaseLauncherError as exc:
        container.stop()
        pytest.fail(f"HBase in the container of {image!r} does not answer: {exc}", pytrace=False)
    except BaseException:
        container.stop()
        raise
    url = f"hbase://{host}:{port}?thrift2_port={thrift2_port}"
    progress(f"HBase in a container of {image}: {url}")
    return url, container.stop


# ------------------------------------------------------------------------------ namespaces


@dataclass(frozen=True)
class StoreNamespace:
    """A fresh namespace on one backend: ``open_store(url)`` gives a client of it."""

    backend: Backend
    url: str

    @property
    def name(self) -> str:
        return self.backend.name

    def open(self) -> Store:
        return open_store(self.url)


def backend_params(*, shared: bool | None = None, needs_server: bool | None = None) -> list[Any]:
    """``pytest.param`` for each backend of :data:`BACKENDS` with these properties (``None``:
    either), named after it; a backend needing a server is marked ``hbase`` (the only server
    the test session provides)."""
    return [
        pytest.param(b, id=b.name, marks=[pytest.mark.hbase] if b.needs_server else [])
        for b in BACKENDS
        if (shared is None or b.shared == shared)
        and (needs_server is None or b.needs_server == needs_server)
    ]


def _backend(name: str) -> Backend:
    (found,) = (b for b in BACKENDS if b.name == name)
    return found


def _drop_everything(url: str) -> None:
    with open_store(url) as store:
        for table in store.list_tables():
            store.drop_table(table)


class _BackgroundDropper:
    """Drops the tables of finished tests' HBase namespaces in a background thread (a drop
    takes most of a second, and the next test need not wait for it)."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hbase-cleanup")
        self._futures: list[Future[None]] = []

    def drop_everything(self, url: str) -> None:
        self._futures.append(self._pool.submit(_drop_everything, url))

    def finish(self) -> None:
        """Wait for every drop; re-raise the first that failed."""
        self._pool.shutdown(wait=True)
        for future in self._futures:
            future.result()


@pytest.fixture(scope="session")
def hbase_cleanup() -> Iterator[_BackgroundDropper]:
    dropper = _BackgroundDropper()
    try:
        yield dropper
    finally:
        dropper.finish()


@contextlib.contextmanager
def fresh_namespace(
    request: pytest.FixtureRequest, backend: Backend, tmp_path: Path
) -> Iterator[StoreNamespace]:
    """A namespace of ``backend`` that no other test uses (see the module docstring)."""
    token = f"pt{uuid.uuid4().hex[:10]}"
    if not backend.needs_server:
        directory = tmp_path / "store"
        if directory.exists():  # a second namespace in one test
            directory = tmp_path / f"store-{token}"
        directory.mkdir()  # claimed now: a namespace asked for next gets another one
        yield StoreNamespace(backend, backend.namespace_url(token, directory=directory))
        return
    url = backend.namespace_url(token, server_url=request.getfixturevalue("hbase_url"))
    cleanup: _BackgroundDropper = request.getfixturevalue("hbase_cleanup")
    try:
        yield StoreNamespace(backend, url)
    finally:
        cleanup.drop_everything(url)


@pytest.fixture(params=backend_params())
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreNamespace]:
    with fresh_namespace(request, request.param, tmp_path) as namespace:
        yield namespace


@pytest.fixture(params=backend_params(shared=True))
def shared_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreNamespace]:
    with fresh_namespace(request, request.param, tmp_path) as namespace:
        yield namespace


@pytest.fixture(params=backend_params(needs_server=False))
def local_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreNamespace]:
    with fresh_namespace(request, request.param, tmp_path) as namespace:
        yield namespace


@pytest.fixture
def store_url(backend: StoreNamespace) -> str:
    return backend.url


@pytest.fixture
def shared_store_url(shared_backend: StoreNamespace) -> str:
    return shared_backend.url


@pytest.fixture
def local_store_url(local_backend: StoreNamespace) -> str:
    return local_backend.url


@pytest.fixture
def memory_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with fresh_namespace(request, _backend("memory"), tmp_path) as namespace:
        yield namespace.url


@pytest.fixture
def embedded_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with fresh_namespace(request, _backend("embedded"), tmp_path) as namespace:
        yield namespace.url


@pytest.fixture
def hbase_store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh table prefix on the test HBase (mark the test ``hbase``)."""
    with fresh_namespace(request, _backend("hbase"), tmp_path) as namespace:
        yield namespace.url


@pytest.fixture
def store(backend: StoreNamespace) -> Iterator[Store]:
    opened = backend.open()
    try:
        yield opened
    finally:
        opened.close()


# ------------------------------------------------------------------------------ clients


def _create_table_t(client: percolator.Client) -> None:
    client.create_table("t")


@dataclass(frozen=True)
class ClientSettings:
    """How the ``client`` fixture and :func:`connect_client` make a client."""

    lock_ttl_ms: int = 500
    lock_wait_ms: int = 3000
    #: the oracle, unless the test's parameters name one: ``manual`` (:class:`ManualOracle`,
    #: one process), ``store`` (persisted in the store, shared by processes), or ``shared``
    #: (manual in memory, in the store elsewhere, so worker subprocesses can share it)
    oracle: str = "manual"
    #: run on every new client (creates the tables the tests use)
    setup: Callable[[percolator.Client], None] = field(default=_create_table_t)


@pytest.fixture
def client_settings() -> ClientSettings:
    return ClientSettings()


def connect_client(
    store: str | Store,
    settings: ClientSettings,
    oracle: str | None = None,
    request: pytest.FixtureRequest | None = None,
    *,
    setup: bool = True,
) -> percolator.Client:
    """A client on ``store`` as ``settings`` say, with their setup run unless ``setup`` is
    false; ``oracle`` (``manual``, ``store``, ``shared`` or ``grpc``, the last needing
    ``request``) overrides theirs."""
    kind = oracle or settings.oracle
    url = store if isinstance(store, str) else store.url
    chosen: str | ManualOracle | None
    if kind == "shared":
        kind = "manual" if url.startswith("memory:") else "store"
    if kind == "manual":
        chosen = ManualOracle()
    elif kind == "store":
        chosen = None
    elif kind == "grpc":
        assert request is not None, "the gRPC oracle is stopped by the test's finalizer"
        assert not isinstance(store, str), "the gRPC oracle serves the test's store object"
        chosen = _grpc_oracle_on(store, request)
    else:
        raise ValueError(f"unknown oracle kind {kind!r}")
    client = percolator.connect(
        store, oracle=chosen, lock_ttl_ms=settings.lock_ttl_ms, lock_wait_ms=settings.lock_wait_ms
    )
    if setup:
        settings.setup(client)
    return client


# (backend, oracle): every backend with the directory's oracle (``client_settings``); modules
# marked ``every_oracle`` add the two real oracles on the quick backends, so the API and GC
# suites also run against the persisted in-process oracle and the gRPC oracle service.
CLIENT_PARAMS = [
    pytest.param((p.values[0].name, None), id=p.id, marks=p.marks) for p in backend_params()
]
ORACLE_VARIANTS = [
    pytest.param(("memory", "store"), id="memory-local-oracle"),
    pytest.param(("embedded", "store"), id="embedded-local-oracle"),
    pytest.param(("memory", "grpc"), id="memory-grpc-oracle"),
]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "every_oracle: the client fixture also runs with the persisted and the gRPC oracle",
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "client" in metafunc.fixturenames:
        every_oracle = metafunc.definition.get_closest_marker("every_oracle") is not None
        params = CLIENT_PARAMS + (ORACLE_VARIANTS if every_oracle else [])
        metafunc.parametrize("client", params, indirect=True)


@pytest.fixture
def client(
    request: pytest.FixtureRequest, tmp_path: Path, client_settings: ClientSettings
) -> Iterator[percolator.Client]:
    backend_name, oracle = request.param
    with fresh_namespace(request, _backend(backend_name), tmp_path) as namespace:
        store = namespace.open()
        try:
            c = connect_client(store, client_settings, oracle, request)
            try:
                yield c
            finally:
                c.close()
        finally:
            store.close()


def _grpc_oracle_on(store: Store, request: pytest.FixtureRequest) -> str:
    """A real oracle server (gRPC, in this process) on the test's own ``store`` - a client
    refuses an oracle of another deployment - stopped when the test ends."""
    from percolator.oracle.lease import LeaseConfig
    from percolator.oracle.server import OracleServer, ServerOptions

    lease = LeaseConfig(lease_ms=600, window_ms=600, margin_ms=100)
    options = ServerOptions(store_url=store.url, listen="127.0.0.1:0", lease=lease)
    server = OracleServer(options, store=store)
    server.start()
    request.addfinalizer(server.stop)
    return f"grpc://{server.address}"


@pytest.fixture
def fast_observed_refresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 200 ms observed-set refresh interval (inherited by worker subprocesses), so that
    registering an observer waits 0.2 s instead of 2 s."""
    monkeypatch.setenv(OBSERVED_REFRESH_ENV, str(FAST_OBSERVED_REFRESH_MS))


FAST_OBSERVED_REFRESH_MS = 200


@pytest.fixture
def steady_table_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Round trips counted per transaction or per run leave out the periodic re-check of a
    table's bulk-load state (percolator/bulkload.py, "Clients re-check": one read per table
    in use per TABLE_STATE_REFRESH_MS, whatever the traffic), which a slow machine would
    otherwise count in whichever run crosses the interval."""
    import percolator.client as client_module

    monkeypatch.setattr(client_module, "TABLE_STATE_REFRESH_MS", 3_600_000)

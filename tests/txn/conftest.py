"""Fixtures for the transaction tests: the same tests on memory, embedded and HBase."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import percolator
from percolator.store import Store, open_store
from percolator.testing import ManualOracle

BACKENDS = [
    pytest.param("memory", id="memory"),
    pytest.param("embedded", id="embedded"),
    pytest.param("hbase", id="hbase", marks=pytest.mark.hbase),
]


def backend_url(request: pytest.FixtureRequest, backend: str, tmp_path: Path) -> str:
    """A store URL for ``backend`` that no other test shares."""
    if backend == "memory":
        return f"memory:{uuid.uuid4().hex}"
    if backend == "embedded":
        return f"embedded:{tmp_path / 'store'}"
    hbase_url: str = request.getfixturevalue("hbase_url")
    return f"{hbase_url}?prefix=t{uuid.uuid4().hex[:10]}_"


# (backend, oracle): every backend with the in-memory test oracle, plus the two real
# oracles on the quick backends, so the API and GC suites also run against the persisted
# in-process oracle and the gRPC oracle service.
COMBOS = [
    *[pytest.param((b.values[0], "manual"), id=b.id, marks=b.marks) for b in BACKENDS],
    pytest.param(("memory", "local"), id="memory-local-oracle"),
    pytest.param(("embedded", "local"), id="embedded-local-oracle"),
    pytest.param(("memory", "grpc"), id="memory-grpc-oracle"),
]


@pytest.fixture(scope="session")
def grpc_oracle(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real oracle server (subprocess) on its own embedded store, for the session."""
    from tests.oracle.procs import OracleProcess

    workdir = tmp_path_factory.mktemp("grpc-oracle")
    server = OracleProcess(f"embedded:{workdir / 'store'}", workdir / "oracle.log").start()
    yield f"grpc://{server.address}"
    server.stop()


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return backend_url(request, request.param, tmp_path)


def _open(url: str) -> Iterator[Store]:
    s = open_store(url)
    yield s
    if url.startswith("hbase"):
        for table in s.list_tables():
            s.drop_table(table)
    s.close()


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    yield from _open(store_url)


@pytest.fixture(params=COMBOS)
def client(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[percolator.Client]:
    combo: tuple[str, str] = request.param
    stores = _open(backend_url(request, combo[0], tmp_path))
    store = next(stores)
    oracle: str | ManualOracle | None
    if combo[1] == "manual":
        oracle = ManualOracle()
    elif combo[1] == "local":
        oracle = None
    else:
        oracle = request.getfixturevalue("grpc_oracle")
    c = percolator.connect(store, oracle=oracle, lock_ttl_ms=500, lock_wait_ms=3000)
    c.create_table("t")
    yield c
    c.close()
    for _ in stores:  # drop HBase tables and close the store
        pass

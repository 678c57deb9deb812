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


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return backend_url(request, request.param, tmp_path)


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    s = open_store(store_url)
    yield s
    if store_url.startswith("hbase"):
        for table in s.list_tables():
            s.drop_table(table)
    s.close()


@pytest.fixture
def client(store: Store) -> Iterator[percolator.Client]:
    c = percolator.connect(store, oracle=ManualOracle(), lock_ttl_ms=500, lock_wait_ms=3000)
    c.create_table("t")
    yield c
    c.close()

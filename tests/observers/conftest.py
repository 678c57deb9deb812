"""Fixtures of the observer tests.

* every test runs with a 200 ms observed-set refresh interval (``PERCOLATOR_OBSERVED_REFRESH_MS``,
  inherited by worker subprocesses), so registration waits 0.2 s instead of 2 s;
* ``store_url``: a fresh namespace on memory, embedded and HBase (marked ``hbase``);
  ``local_url``: memory and embedded only (the HBase variants keep to the main properties);
  ``shared_url``: the backends several processes can share (embedded, HBase);
* ``client`` / ``local_client`` / ``memory_client``: a client with the test tables created;
* ``plugin_dir``: a directory that, on ``PYTHONPATH``, declares the test observers of
  tests/observers/helpers.py (and a few broken ones) in the ``percolator.observers``
  entry-point group - real entry-point discovery for worker subprocesses.

HBase comes from the session fixture ``hbase_url`` (tests/conftest.py), with a table prefix
unique to each test; its tables are dropped at teardown.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import pytest

import percolator
from percolator.client import OBSERVED_REFRESH_ENV
from percolator.store import open_store
from percolator.testing import ManualOracle
from tests.observers import helpers

REFRESH_MS = 200

ALL_BACKENDS = [
    pytest.param("memory", id="memory"),
    pytest.param("embedded", id="embedded"),
    pytest.param("hbase", id="hbase", marks=pytest.mark.hbase),
]
SHARED_BACKENDS = ALL_BACKENDS[1:]
LOCAL_BACKENDS = ALL_BACKENDS[:2]


@pytest.fixture(autouse=True)
def fast_refresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(OBSERVED_REFRESH_ENV, str(REFRESH_MS))


def _with_prefix(base_url: str, prefix: str) -> str:
    parts = urlsplit(base_url)
    options = dict(parse_qsl(parts.query, keep_blank_values=True))
    options["prefix"] = options.get("prefix", "") + prefix
    return urlunsplit(parts._replace(query=urlencode(options)))


def _namespace(request: pytest.FixtureRequest, backend: str, tmp_path: Path) -> Iterator[str]:
    if backend == "memory":
        yield f"memory:obs-{uuid.uuid4().hex}"
    elif backend == "embedded":
        yield f"embedded:{tmp_path / 'store'}"
    else:
        url = _with_prefix(request.getfixturevalue("hbase_url"), f"ob{uuid.uuid4().hex[:10]}_")
        try:
            yield url
        finally:
            with open_store(url) as store:
                for table in store.list_tables():
                    store.drop_table(table)


@pytest.fixture(params=ALL_BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from _namespace(request, request.param, tmp_path)


@pytest.fixture(params=LOCAL_BACKENDS)
def local_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from _namespace(request, request.param, tmp_path)


@pytest.fixture(params=SHARED_BACKENDS)
def shared_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from _namespace(request, request.param, tmp_path)


@pytest.fixture
def memory_url() -> str:
    return f"memory:obs-{uuid.uuid4().hex}"


def connect(url: str) -> percolator.Client:
    """A client on ``url``: the manual oracle in memory (one process), else the oracle
    persisted in the store (shared with worker subprocesses)."""
    oracle = ManualOracle() if url.startswith("memory:") else None
    return percolator.connect(url, oracle=oracle, lock_ttl_ms=1000, lock_wait_ms=5000)


@pytest.fixture
def client(store_url: str) -> Iterator[percolator.Client]:
    c = connect(store_url)
    helpers.create_tables(c)
    yield c
    c.close()


@pytest.fixture
def local_client(local_url: str) -> Iterator[percolator.Client]:
    c = connect(local_url)
    helpers.create_tables(c)
    yield c
    c.close()


@pytest.fixture
def memory_client(memory_url: str) -> Iterator[percolator.Client]:
    c = connect(memory_url)
    helpers.create_tables(c)
    yield c
    c.close()


@pytest.fixture(scope="session")
def plugin_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("plugins")
    info = root / "obs_test_plugins-0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: obs-test-plugins\nVersion: 0.0\n")
    lines = ["[percolator.observers]"] + [f"{k} = {v}" for k, v in helpers.PLUGINS.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    return root

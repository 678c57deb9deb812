"""Fixtures of the observer tests; backends, namespaces and clients come from tests/conftest.py.

* every test runs with a 200 ms observed-set refresh interval (``fast_observed_refresh``,
  inherited by worker subprocesses), so registration waits 0.2 s instead of 2 s;
* observer clients (``client``, :func:`connect`): lock TTL 1 s and lock wait 5 s; the manual
  oracle in memory (one process), else the oracle persisted in the store (shared with worker
  subprocesses); the ``client`` fixtures create the test tables of tests/observers/helpers.py;
* ``local_client`` / ``memory_client``: that client on memory and embedded only (the HBase
  variants keep to the main properties) / on memory only;
* ``plugin_dir``: a directory that, on ``PYTHONPATH``, declares the test observers of
  tests/observers/helpers.py (and a few broken ones) in the ``percolator.observers``
  entry-point group - real entry-point discovery for worker subprocesses.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from percolator.observers.api import Observer
from percolator.observers.options import WorkerOptions
from percolator.observers.worker import Worker

import percolator
from tests.conftest import FAST_OBSERVED_REFRESH_MS, ClientSettings, connect_client
from tests.observers import helpers

REFRESH_MS = FAST_OBSERVED_REFRESH_MS

OBSERVER_CLIENT = ClientSettings(
    lock_ttl_ms=1000, lock_wait_ms=5000, oracle="shared", setup=helpers.create_tables
)


@pytest.fixture(autouse=True)
def fast_refresh(fast_observed_refresh: None) -> None:
    """Every observer test registers observers: do not wait 2 s for each."""


@pytest.fixture
def client_settings() -> ClientSettings:
    return OBSERVER_CLIENT


def connect(url: str) -> percolator.Client:
    """An observer client on ``url`` (its tables not created)."""
    return connect_client(url, OBSERVER_CLIENT, setup=False)


@pytest.fixture
def local_client(local_store_url: str) -> Iterator[percolator.Client]:
    c = connect_client(local_store_url, OBSERVER_CLIENT)
    yield c
    c.close()


@pytest.fixture
def start_worker(local_client: percolator.Client) -> Iterator[Callable[..., Worker]]:
    """``start_worker(observers, options)``: a started Worker on ``local_client``, stopped
    (draining up to 5 s) when the test ends."""
    started: list[Worker] = []

    def start(observers: list[Observer], options: WorkerOptions) -> Worker:
        worker = Worker(local_client, observers, options)
        worker.start()
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop(drain_timeout_s=5)


@pytest.fixture
def memory_client(memory_url: str) -> Iterator[percolator.Client]:
    c = connect_client(memory_url, OBSERVER_CLIENT)
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

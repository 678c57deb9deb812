"""Fixtures of the oracle tests; backends and namespaces (``shared_store_url``,
``embedded_url``) come from tests/conftest.py.

* ``clock`` / :class:`FakeClock`: deterministic wall and monotonic clocks (no sleeps).
* ``store``: the real memory store inside a :class:`~percolator.testing.FaultyStore`, so tests
  can script store failures (compare-and-sets lost or applied without a reply, failing
  reads, another writer landing first) to drive the unknown-outcome paths.
* ``spawn``: starts oracle server processes and stops them all at teardown.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from percolator.store.memory import MemoryStore
from percolator.testing import FaultyStore
from tests.oracle.procs import OracleProcess


class FakeClock:
    """Wall and monotonic time that move only when told to."""

    def __init__(self, wall_ms: int = 1_700_000_000_000) -> None:
        self.wall = wall_ms
        self.mono = 1_000_000.0

    def wall_ms(self) -> int:
        return self.wall

    def monotonic_ms(self) -> float:
        return self.mono

    def advance(self, ms: float) -> None:
        self.wall += int(ms)
        self.mono += ms

    def sleep_ms(self, ms: float) -> None:
        self.advance(ms)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store() -> FaultyStore:
    """The oracle's unit tests run on one memory store with scripted faults: this overrides
    the shared per-backend ``store`` of tests/conftest.py for this directory (the oracle on
    every backend is covered by ``shared_store_url`` and the client suites)."""
    return FaultyStore(MemoryStore())


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., OracleProcess]]:
    """Start oracle server processes that are always stopped at teardown, even when a
    test fails half-way.  ``spawn(store_url, "name", port=..., args=[...], env={...})``."""
    started: list[OracleProcess] = []

    def start(store_url: str, name: str, **kwargs: Any) -> OracleProcess:
        oracle = OracleProcess(store_url, tmp_path / f"{name}.log", **kwargs)
        started.append(oracle)
        return oracle.start()

    yield start
    for oracle in started:
        oracle.stop()

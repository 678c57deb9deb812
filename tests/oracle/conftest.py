"""Fixtures of the oracle tests.

* ``clock`` / :class:`FakeClock`: deterministic wall and monotonic clocks (no sleeps).
* ``store``: the real memory store inside a :class:`~percolator.testing.FaultyStore`, so tests
  can script store failures (compare-and-sets lost or applied without a reply, failing
  reads, another writer landing first) to drive the unknown-outcome paths.
* ``shared_store_url``: a fresh store namespace that several processes can share, on the
  embedded store and (marked ``hbase``) on HBase; HBase tables are dropped afterwards.
* ``spawn``: starts oracle server processes and stops them all at teardown.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import pytest

from percolator.store import open_store
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


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store() -> FaultyStore:
    """The memory store, with scripted faults."""
    return FaultyStore(MemoryStore())


def _with_prefix(base_url: str, prefix: str) -> str:
    parts = urlsplit(base_url)
    options = dict(parse_qsl(parts.query, keep_blank_values=True))
    options["prefix"] = options.get("prefix", "") + prefix
    return urlunsplit(parts._replace(query=urlencode(options)))


SHARED_BACKENDS = [
    pytest.param("embedded", id="embedded"),
    pytest.param("hbase", id="hbase", marks=pytest.mark.hbase),
]


@pytest.fixture(params=SHARED_BACKENDS)
def shared_store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "embedded":
        yield f"embedded:{tmp_path / 'store'}"
        return
    url = _with_prefix(request.getfixturevalue("hbase_url"), f"or{uuid.uuid4().hex[:10]}_")
    try:
        yield url
    finally:
        with open_store(url) as s:
            for table in s.list_tables():
                s.drop_table(table)


@pytest.fixture
def embedded_url(tmp_path: Path) -> str:
    return f"embedded:{tmp_path / 'store'}"


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

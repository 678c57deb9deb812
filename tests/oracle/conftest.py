"""Fixtures of the oracle tests.

* ``clock`` / :class:`FakeClock`: deterministic wall and monotonic clocks (no sleeps).
* ``store`` / :class:`FaultyStore`: the real memory store, with scripted store failures on
  compare-and-set and reads, to drive the unknown-outcome paths.
* ``shared_store_url``: a fresh store namespace that several processes can share, on the
  embedded store and (marked ``hbase``) on HBase; HBase tables are dropped afterwards.
* ``spawn``: starts oracle server processes and stops them all at teardown.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import pytest

from percolator.errors import StoreUnavailableError
from percolator.store import open_store
from percolator.store.base import Column, RowCells
from percolator.store.memory import MemoryStore
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


class FaultyStore(MemoryStore):
    """A memory store whose next compare-and-sets or reads fail as scripted.

    ``cas_faults`` entries, consumed one per compare-and-set:
    ``"applied"`` applies the write and then raises StoreUnavailableError (the reply was
    lost); ``"lost"`` raises without applying; ``"ok"`` behaves normally.
    ``failing_reads`` makes that many next reads raise StoreUnavailableError.
    ``before_cas`` (if set) runs before each compare-and-set: a hook to let "another
    process" write in between.
    """

    def __init__(self) -> None:
        super().__init__("memory:faulty")
        self.cas_faults: list[str] = []
        self.failing_reads = 0
        self.before_cas: list[object] = []

    def compare_and_set(
        self,
        table: str,
        row: bytes,
        family: str,
        qualifier: bytes,
        expected: bytes | None,
        new: bytes,
    ) -> bool:
        fault = self.cas_faults.pop(0) if self.cas_faults else "ok"
        if self.before_cas:
            hook = self.before_cas.pop(0)
            assert callable(hook)
            hook()  # its own compare-and-sets run without faults: ours was taken above
        if fault == "lost":
            raise StoreUnavailableError("scripted: connection lost before the write")
        applied = super().compare_and_set(table, row, family, qualifier, expected, new)
        if fault == "applied":
            raise StoreUnavailableError("scripted: connection lost after the write")
        assert fault == "ok", fault
        return applied

    def read_rows(
        self,
        table: str,
        rows: Sequence[bytes],
        columns: Sequence[Column] | None = None,
        families: Sequence[str] | None = None,
        *,
        before: int | None = None,
        min_version: int = 0,
        max_versions: int = 1,
    ) -> dict[bytes, RowCells]:
        if self.failing_reads:
            self.failing_reads -= 1
            raise StoreUnavailableError("scripted: read failed")
        return super().read_rows(
            table,
            rows,
            columns,
            families,
            before=before,
            min_version=min_version,
            max_versions=max_versions,
        )


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store() -> FaultyStore:
    return FaultyStore()


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

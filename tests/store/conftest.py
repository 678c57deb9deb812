"""Fixtures of the store contract suite: one fresh, empty store namespace per test, on every
backend.

* ``backend``: parametrized over ``memory``, ``embedded`` and ``hbase`` (the last marked
  ``hbase``; it takes its server from the session fixture ``hbase_url``).  It gives the URL
  of a namespace no other test uses: a unique ``memory:NAME``, a fresh directory, or a
  unique HBase table prefix whose tables are dropped after the test (in the background;
  the session waits for every drop at its end).
* ``shared_backend``: the same for the backends that several processes can share
  (``embedded`` and ``hbase``).
* ``store``: a client opened on ``backend.url``, closed at teardown.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import pytest

from percolator.store import Store, open_store


@dataclass(frozen=True)
class Backend:
    """A fresh namespace on one backend: ``open_store(url)`` gives a client of it."""

    name: str
    url: str

    def open(self) -> Store:
        return open_store(self.url)


def _hbase_url_with_prefix(base_url: str, prefix: str) -> str:
    """``base_url`` with ``prefix`` appended to any table prefix it already has."""
    parts = urlsplit(base_url)
    options = dict(parse_qsl(parts.query, keep_blank_values=True))
    options["prefix"] = options.get("prefix", "") + prefix
    return urlunsplit(parts._replace(query=urlencode(options)))


def _drop_everything(url: str) -> None:
    with open_store(url) as store:
        for table in store.list_tables():
            store.drop_table(table)


class _BackgroundDropper:
    """Drops the tables of finished HBase tests in a background thread (a drop takes most
    of a second, and the next test need not wait for it)."""

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
def hbase_dropper() -> Iterator[_BackgroundDropper]:
    dropper = _BackgroundDropper()
    try:
        yield dropper
    finally:
        dropper.finish()


def _make_backend(name: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    unique = uuid.uuid4().hex[:12]
    if name == "memory":
        yield Backend("memory", f"memory:contract-{unique}")
    elif name == "embedded":
        yield Backend("embedded", f"embedded:{tmp_path / 'store'}")
    else:
        base_url = request.getfixturevalue("hbase_url")
        dropper: _BackgroundDropper = request.getfixturevalue("hbase_dropper")
        url = _hbase_url_with_prefix(base_url, f"ct{unique}_")
        try:
            yield Backend("hbase", url)
        finally:
            dropper.drop_everything(url)


ALL_BACKENDS = [
    pytest.param("memory", id="memory"),
    pytest.param("embedded", id="embedded"),
    pytest.param("hbase", id="hbase", marks=pytest.mark.hbase),
]
SHARED_BACKENDS = ALL_BACKENDS[1:]


@pytest.fixture(params=ALL_BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    yield from _make_backend(request.param, request, tmp_path)


@pytest.fixture(params=SHARED_BACKENDS)
def shared_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    yield from _make_backend(request.param, request, tmp_path)


@pytest.fixture
def store(backend: Backend) -> Iterator[Store]:
    opened = backend.open()
    try:
        yield opened
    finally:
        opened.close()

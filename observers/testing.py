"""A test bench for observer authors: their observers on a real embedded store, in one process.

::

    from percolator.observers.testing import ObserverBench

    def test_counts_words(tmp_path):
        with ObserverBench([word_count], tmp_path) as bench:
            bench.set("documents", "d1", "body", b"a b c")
            bench.run()                      # every notification, until none is left
            assert bench.get("counts", "d1", "words") == b"3"

The bench opens an embedded store (in ``directory``, or in a temporary directory removed on
exit), calls each observer's ``setup``, registers its columns and makes its own client see
the registration at once (no refresh interval to wait: the bench's client is the only
writer).  :meth:`ObserverBench.run` processes notifications in the calling thread, the
way a worker would run them (same ack, same at-most-once rule for strong observers), and
fails with :class:`~percolator.errors.PercolatorError` naming the first failed run and its
exception, so a test shows the observer's error instead of a missing value.  Nothing is
parked, nothing runs in the background: a test is deterministic.

In a pytest ``conftest.py``, wrap it in a fixture::

    @pytest.fixture
    def bench(tmp_path):
        with ObserverBench([word_count], tmp_path) as bench:
            yield bench
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType

from percolator.observers.api import Observer, check_observer, register_observers
from percolator.observers.drain import DrainReport, run_until_quiet

from percolator.client import Client, connect

__all__ = ["ObserverBench"]


class ObserverBench:
    """Observers on an embedded store; see the module docstring.  A context manager: the
    client is closed (and a temporary store removed) on exit."""

    def __init__(self, observers: Iterable[Observer], directory: str | Path | None = None) -> None:
        self.observers = [check_observer(o) for o in observers]
        self._stack = contextlib.ExitStack()
        if directory is None:
            directory = self._stack.enter_context(
                tempfile.TemporaryDirectory(prefix="observer-bench-")
            )
        self.url = f"embedded:{Path(directory) / 'store'}"
        self.client: Client = self._stack.enter_context(connect(self.url))
        try:
            for observer in self.observers:
                observer.setup(self.client)
            register_observers(self.client, self.observers, wait=False)
            # The bench's own client is the only writer: loading the observed set now
            # is all the waiting a registration needs here.
            self.client.refresh_observed()
        except BaseException:
            self._stack.close()
            raise

    def set(self, table: str, row: bytes | str, column: str, value: bytes) -> None:
        """Write one cell in its own transaction (it notifies the observer watching it)."""
        with self.client.transaction() as txn:
            txn.set(table, row, column, value)

    def delete(self, table: str, row: bytes | str, column: str) -> None:
        """Delete one cell in its own transaction."""
        with self.client.transaction() as txn:
            txn.delete(table, row, column)

    def get(self, table: str, row: bytes | str, column: str) -> bytes | None:
        """The cell's committed value now (``None`` if absent)."""
        with self.client.snapshot() as snapshot:
            return snapshot.get(table, row, column)

    def run(self, *, max_rounds: int = 100) -> DrainReport:
        """Run the observers until no notification is left; returns what ran.  Raises
        :class:`~percolator.errors.PercolatorError` naming the first failed run (the other
        notifications of that round ran) or when notifications remain after
        ``max_rounds`` rounds."""
        return run_until_quiet(self.client, self.observers, max_rounds=max_rounds)

    def close(self) -> None:
        self._stack.close()

    def __enter__(self) -> ObserverBench:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

"""Spark for the demo: a session whose JVM writes to a log file, and the backfill's progress.

The JVM that PySpark starts inherits the standard output and error of this process and
prints its start-up banner and warnings there.  :func:`start_spark` points both at a log
file while the JVM starts, so the JVM (and the Python workers it starts later) keep writing
there; this process gets its own terminal back before it prints anything else.

The JVM stops by itself when this process exits (it watches its standard input), but only
once it is up: an interrupt while PySpark waits for it to start would leave it running for
good.  So Ctrl-C and SIGTERM are held back until the session exists, then acted on.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, TextIO

from percolator.errors import PercolatorError
from percolator.progress import Progress
from spark_jobs.session import build_session, is_local_master

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# The lines spark_jobs.backfill reports while it writes: "writing N rows into ..." once, then
# "DONE/TOTAL rows done (...)" every progress interval.
_WRITING = re.compile(r"^writing (\d+) rows\b")
_DONE = re.compile(r"^(\d+)/(\d+) rows done\b")


class SparkStartError(PercolatorError):
    """The Spark session could not be created (no Java, say); the message names the log."""


@contextmanager
def _output_to(path: Path) -> Iterator[None]:
    """Send this process's file descriptors 1 and 2 to ``path`` for the duration (children
    started meanwhile keep them)."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    try:
        with path.open("ab") as log:
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)


@contextmanager
def _interrupts_held() -> Iterator[Callable[[], bool]]:
    """Record SIGINT and SIGTERM instead of acting on them; yields "was one received?".

    On exit a handler is put back only if it is still the recording one: PySpark installs
    its own SIGINT handler (which cancels running jobs) while it creates the context."""
    if threading.current_thread() is not threading.main_thread():
        yield lambda: False
        return
    received: list[int] = []

    def record(signum: int, frame: FrameType | None) -> None:
        received.append(signum)

    previous = {sig: signal.signal(sig, record) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield lambda: bool(received)
    finally:
        for sig, handler in previous.items():
            if signal.getsignal(sig) is record:
                signal.signal(sig, handler)


def start_spark(master: str, app_name: str, log_path: Path) -> SparkSession:
    """A SparkSession on ``master`` whose JVM logs to ``log_path``.

    Raises :class:`SparkStartError` (one line, naming the log) if it does not start, and
    KeyboardInterrupt (after stopping the new session) if interrupted while it started."""
    if is_local_master(master):
        # Executors and the driver talk over loopback; this also silences Spark's warning
        # about a host name that resolves to a loopback address.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    with _interrupts_held() as interrupted:
        session = _build(master, app_name, log_path)
    if interrupted():
        with suppress(Exception):
            session.stop()
        raise KeyboardInterrupt
    return session


def _build(master: str, app_name: str, log_path: Path) -> SparkSession:
    try:
        with _output_to(log_path):
            return build_session(master, app_name=app_name, log_level="ERROR")
    except PercolatorError:
        raise
    except Exception as exc:
        last = _last_line(log_path)
        hint = f" (log: {last})" if last else ""
        raise SparkStartError(
            f"Spark did not start on {master}: {type(exc).__name__}: "
            f"{str(exc).strip().splitlines()[0] if str(exc).strip() else 'no detail'}{hint}; "
            f"Spark needs Java 17+ (java on PATH or JAVA_HOME); full log: {log_path}"
        ) from None


def _last_line(path: Path) -> str:
    try:
        lines = path.read_text("utf-8", "replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1].strip()[:300] if lines else ""


class BackfillMonitor:
    """The ``progress`` callback of :func:`spark_jobs.backfill.run_backfill`, drawn as a
    progress bar (rows written, rate, time left), with the samples kept for the chart.

    Thread-safe: the backfill reports from a thread of its own."""

    def __init__(self, out: TextIO, label: str = "  backfill") -> None:
        self._out = out
        self._label = label
        self._lock = threading.Lock()
        self._bar: Progress | None = None
        self._started = time.monotonic()
        #: (seconds since the write phase began, rows written by then)
        self.samples: list[tuple[float, int]] = []

    def __call__(self, message: str) -> None:
        with self._lock:
            writing = _WRITING.match(message)
            done = _DONE.match(message)
            if writing:
                total = int(writing.group(1))
                self._bar = Progress(self._label, total, unit="rows", stream=self._out)
                self._started = time.monotonic()
                self.samples = [(0.0, 0)]
                self._bar.update(0)
            elif done and self._bar is not None:
                rows = int(done.group(1))
                self.samples.append((time.monotonic() - self._started, rows))
                self._bar.update(rows, total=int(done.group(2)))
            # Other messages (the input check, the final summary) are shown by the caller.

    def close(self, rows: int) -> float:
        """Record the final count and print the bar's last line; the write phase's seconds."""
        with self._lock:
            elapsed = time.monotonic() - self._started
            if self._bar is None:
                return elapsed
            self.samples.append((elapsed, rows))
            self._bar.update(rows)
            return self._bar.close()

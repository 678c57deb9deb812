"""The timestamp oracle service (``percolator oracle serve``) as a child process.

It listens on a free loopback port (``--listen 127.0.0.1:0``) and announces its address on
the first line of its standard output; everything else it says goes to a log file.

No orphan is left behind:

* it runs in its own session, so a Ctrl-C at the terminal reaches the demo only, and the
  demo stops it last, after the work that needs timestamps (:meth:`OracleProcess.stop`:
  SIGTERM, which makes it release its lease, then SIGKILL if it does not exit);
* on Linux the kernel sends it SIGTERM if the demo dies without cleaning up (``kill -9``):
  ``prctl(PR_SET_PDEATHSIG)``, set in the child before it runs the oracle.
"""

from __future__ import annotations

import ctypes
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO

from percolator.errors import OracleError

_READY_PREFIX = "oracle: listening on "
_PR_SET_PDEATHSIG = 1


def _exit_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` asking Linux to SIGTERM the child when this process dies (None
    elsewhere).  libc is looked up here, in the parent: the function runs between fork and
    exec, where loading a library could deadlock on a lock another thread held at fork."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))
        if os.getppid() != parent:  # the parent died before the request took effect
            os._exit(1)

    return preexec


class OracleProcess:
    """``percolator oracle serve --store STORE`` on a free loopback port.

    The constructor returns once the process announced its address (:attr:`url`), or raises
    :class:`~percolator.errors.OracleError` with the reason (the last line of its log).  It
    may still be a standby for a moment: clients retry until it serves."""

    def __init__(self, store_url: str, log_path: Path, *, start_timeout_s: float = 60.0) -> None:
        self.log_path = log_path
        self._log: IO[bytes] = log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "percolator.cli", "oracle", "serve",
             "--store", store_url, "--listen", "127.0.0.1:0"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._log,
            start_new_session=True,
            preexec_fn=_exit_with_parent(),
        )
        self.pid = self.proc.pid
        lines: queue.Queue[str] = queue.Queue()
        # The first line is the address; the rest of stdout (nothing, normally) goes to the
        # log, so the pipe never fills up and blocks the oracle.
        self._pump_thread = threading.Thread(
            target=self._pump, args=(lines,), name="oracle-stdout", daemon=True
        )
        self._pump_thread.start()
        try:
            first = lines.get(timeout=start_timeout_s)
        except queue.Empty:
            first = ""
        if not first.startswith(_READY_PREFIX):
            self.stop()
            raise OracleError(
                f"the oracle service did not start ({self._reason(first)}); "
                f"its log: {log_path}"
            )
        self.address = first[len(_READY_PREFIX):].split()[0]
        self.url = f"grpc://{self.address}"

    def _pump(self, lines: queue.Queue[str]) -> None:
        stdout = self.proc.stdout
        assert stdout is not None
        first = True
        for raw in stdout:
            if first:
                lines.put(raw.decode("utf-8", "replace").strip())
                first = False
            else:
                self._log.write(raw)
                self._log.flush()
        if first:
            lines.put("")  # exited without a word

    def _reason(self, first: str) -> str:
        if first:
            return f"it said {first!r}"
        if self.proc.poll() is not None:
            try:
                tail = self.log_path.read_text("utf-8", "replace").strip().splitlines()
            except OSError:
                tail = []
            last = tail[-1] if tail else "no output"
            return f"it exited with code {self.proc.returncode}: {last}"
        return "it did not announce an address in time"

    def stop(self, timeout_s: float = 15.0) -> None:
        """Stop the process (SIGTERM, then SIGKILL after ``timeout_s``).  Idempotent."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        # The pump sees the end of the pipe once the process is gone; the log stays open
        # until it has written its last line.
        self._pump_thread.join(timeout=5)
        if not self._pump_thread.is_alive():
            self._log.close()

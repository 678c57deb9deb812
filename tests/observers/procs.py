"""Worker subprocesses for the observer tests: the real CLI
(``python -m percolator worker``)
with the test plugins on ``PYTHONPATH``.

Output goes to a file (not a pipe: a killed or chatty worker can never block on it); the
helpers read it to wait for the ready line and to show it when a test fails.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterable, Sequence
from pathlib import Path

from percolator.observers.metrics import parse_text
from percolator.observers.parking import pending

import percolator

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def cli_env(plugin_dir: Path | None, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(PROJECT_ROOT)]
    if plugin_dir is not None:
        paths.insert(0, str(plugin_dir))
    env["PYTHONPATH"] = os.pathsep.join([*paths, *filter(None, [env.get("PYTHONPATH")])])
    env.update(extra or {})
    return env


def run_cli(
    args: Sequence[str], plugin_dir: Path | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m percolator ARGS`` to completion."""
    return subprocess.run(
        [sys.executable, "-m", "percolator", *args],
        cwd=PROJECT_ROOT,
        env=cli_env(plugin_dir),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


class WorkerProcess:
    """One ``percolator worker`` subprocess."""

    def __init__(
        self,
        store_url: str,
        observers: Iterable[str],
        log_path: Path,
        *,
        plugin_dir: Path | None,
        threads: int = 4,
        extra_args: Sequence[str] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.log_path = log_path
        args = [sys.executable, "-m", "percolator", "worker", "--store", store_url]
        for name in observers:
            args += ["--observer", name]
        args += ["--threads", str(threads), "--metrics-port", "0", "--log-level", "WARNING"]
        args += list(extra_args)
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in wait()/kill()
        self.proc = subprocess.Popen(
            args,
            cwd=PROJECT_ROOT,
            env=cli_env(plugin_dir, env),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.metrics_url: str | None = None

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 60) -> WorkerProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.output()
            match = re.search(r"worker ready .*?(?:metrics=(\S+))?$", text, re.MULTILINE)
            if match:
                self.metrics_url = match.group(1)
                return self
            if self.proc.poll() is not None:
                raise AssertionError(f"worker exited with {self.proc.returncode}:\n{text}")
            time.sleep(0.05)
        raise AssertionError(f"worker not ready after {timeout} s:\n{self.output()}")

    def metrics(self) -> dict[str, float]:
        assert self.metrics_url, "worker has no metrics endpoint"
        with urllib.request.urlopen(self.metrics_url, timeout=10) as response:
            return parse_text(response.read().decode())

    def terminate(self, timeout: float = 60) -> int:
        """SIGTERM and wait; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            self._log.close()

    def kill(self) -> None:
        """SIGKILL (no cleanup at all) and reap."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        self._log.close()

    def alive(self) -> bool:
        return self.proc.poll() is None


def wait_quiet(
    client: percolator.Client,
    tables: Iterable[str],
    *,
    timeout: float = 120,
    settle: float = 0.5,
    workers: Sequence[WorkerProcess] = (),
) -> None:
    """Wait until no notification is left in ``tables``, twice in a row ``settle`` seconds
    apart (a run in flight between two tables' scans could otherwise hide one)."""
    names = list(tables)
    deadline = time.monotonic() + timeout
    quiet_checks = 0
    left: list[tuple[str, bytes, str, int]] = []
    while time.monotonic() < deadline:
        left = [(t, r, c, v) for t in names for (r, c, v) in pending(client, t)]
        quiet_checks = quiet_checks + 1 if not left else 0
        if quiet_checks >= 2:
            return
        for worker in workers:
            if not worker.alive():
                raise AssertionError(f"worker died:\n{worker.output()}")
        time.sleep(settle)
    logs = "\n".join(w.output()[-3000:] for w in workers)
    raise AssertionError(f"still {len(left)} notification(s) after {timeout} s: {left[:5]}\n{logs}")

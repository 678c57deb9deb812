"""Real oracle server processes for the tests, and the checks their evidence needs."""

from __future__ import annotations

import bisect
import os
import re
import select
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
from percolator.oracle.proto_gen import oracle_pb2, oracle_pb2_grpc

from percolator.metrics import parse_text

REPO = Path(__file__).resolve().parents[2]

# Short leases keep fail-over tests fast (a dead oracle is replaced within ~1.2 s) while
# leaving renewals (every ~280 ms) room on a loaded machine.
FAST_LEASE = ["--lease-ms", "1000", "--margin-ms", "150", "--window-ms", "1000"]

_READY = re.compile(
    r"oracle: listening on (\S+):(\d+) .*?(?:metrics on http://\S+:(\d+)/metrics)?$"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class OracleProcess:
    """``python -m percolator oracle serve`` in a subprocess; stderr goes to ``log_path``."""

    def __init__(
        self,
        store_url: str,
        log_path: Path,
        *,
        port: int = 0,
        args: list[str] | None = None,
        env: dict[str, str] | None = None,
        token: str | None = None,
    ) -> None:
        self.store_url = store_url
        self.log_path = log_path
        self.port = port
        self.args = FAST_LEASE + ["--metrics-port", "0"] + (args or [])
        self.env = env
        # Sent by the probes below when the server requires a token.
        self.metadata = (("authorization", f"Bearer {token}"),) if token else None
        self.proc: subprocess.Popen[bytes] | None = None
        self.metrics_port = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 30.0) -> OracleProcess:
        cmd = [
            sys.executable,
            "-m",
            "percolator",
            "oracle",
            "serve",
            "--create",
            "--store",
            self.store_url,
            "--listen",
            f"127.0.0.1:{self.port}",
            *self.args,
        ]
        env = dict(os.environ)
        env.update(self.env or {})
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=log, env=env)
        log.close()
        try:
            line = self._read_line(timeout_s)
            match = _READY.search(line)
            assert match, f"unexpected first line {line!r}; log:\n{self.log()}"
        except BaseException:
            self.kill()
            raise
        self.port = int(match.group(2))
        self.metrics_port = int(match.group(3) or 0)
        return self

    def _read_line(self, timeout_s: float) -> str:
        assert self.proc is not None and self.proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        buf = b""
        fd = self.proc.stdout.fileno()
        while not buf.endswith(b"\n"):
            remaining = deadline - time.monotonic()
            exited = self.proc.poll() is not None and not select.select([fd], [], [], 0)[0]
            if remaining <= 0 or exited:
                raise AssertionError(
                    f"oracle did not start (exit {self.proc.poll()}); log:\n{self.log()}"
                )
            ready, _, _ = select.select([fd], [], [], min(remaining, 0.2))
            if ready:
                chunk = os.read(fd, 4096)
                if not chunk:
                    continue
                buf += chunk
        return buf.decode().strip()

    def log(self) -> str:
        try:
            return self.log_path.read_text()[-4000:]
        except OSError:
            return "(no log)"

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def kill(self) -> None:
        """kill -9, and reap."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> int:
        """SIGTERM (resuming it first if paused) and wait; returns the exit code."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()
        return int(self.proc.returncode)

    # ------------------------------------------------------------------ probes

    def stub(self) -> tuple[grpc.Channel, oracle_pb2_grpc.TimestampOracleStub]:
        channel = grpc.insecure_channel(self.address)
        return channel, oracle_pb2_grpc.TimestampOracleStub(channel)

    def role(self, timeout_s: float = 2.0) -> str:
        channel, stub = self.stub()
        try:
            health = stub.Health(
                oracle_pb2.HealthRequest(), timeout=timeout_s, metadata=self.metadata
            )
            return oracle_pb2.Role.Name(health.role)
        except grpc.RpcError as exc:
            return f"error:{exc.code().name}"
        finally:
            channel.close()

    def wait_role(self, role: str, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        seen = ""
        while time.monotonic() < deadline:
            seen = self.role()
            if seen == role:
                return
            time.sleep(0.05)
        raise AssertionError(f"{self.address} is {seen}, not {role}; log:\n{self.log()}")

    def info(self) -> oracle_pb2.InfoResponse:
        channel, stub = self.stub()
        try:
            return stub.Info(oracle_pb2.InfoRequest(), timeout=5, metadata=self.metadata)
        finally:
            channel.close()

    def metrics(self) -> dict[str, float]:
        import urllib.request

        with urllib.request.urlopen(
            f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5
        ) as response:
            return parse_text(response.read().decode())


def pause_outside_store_write(oracle: OracleProcess, store_url: str) -> None:
    """SIGSTOP ``oracle``, making sure it is not holding the embedded store's write lock.

    A process stopped inside an SQLite write transaction blocks every writer of that
    directory until it resumes (a property of the embedded store, documented there), which
    would stop the standby from taking over for reasons that have nothing to do with the
    oracle.  HBase has no such lock: there it is a plain SIGSTOP.
    """
    for _ in range(50):
        oracle.signal(signal.SIGSTOP)
        if not store_url.startswith("embedded:"):
            return
        db = Path(store_url.removeprefix("embedded:")) / "percolator-store.sqlite3"
        conn = sqlite3.connect(db, timeout=0.05)
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("ROLLBACK")
            return
        except sqlite3.OperationalError:
            oracle.signal(signal.SIGCONT)
            time.sleep(0.02)
        finally:
            conn.close()
    raise AssertionError("could not pause the oracle outside a store write")


@dataclass(frozen=True)
class Call:
    """One timestamp as a caller saw it: CLOCK_MONOTONIC (system-wide on Linux) before
    the request and after the answer, and the timestamp."""

    start_ns: int
    end_ns: int
    ts: int


def check_real_time_order(calls: list[Call]) -> None:
    """Linearisability of a timestamp service: all timestamps distinct, and whenever a call
    ended before another one started, the later call's timestamp is larger."""
    values = [c.ts for c in calls]
    assert len(set(values)) == len(values), "a timestamp was handed out twice"
    by_end = sorted(calls, key=lambda c: c.end_ns)
    ends = [c.end_ns for c in by_end]
    prefix_max: list[tuple[int, Call]] = []
    best: tuple[int, Call] | None = None
    for c in by_end:
        if best is None or c.ts > best[0]:
            best = (c.ts, c)
        prefix_max.append(best)
    for c in calls:
        k = bisect.bisect_left(ends, c.start_ns)  # calls that ended strictly before c began
        if k:
            top, witness = prefix_max[k - 1]
            assert top < c.ts, (
                f"real-time order broken: {witness} ended before {c} started, "
                "but got a larger timestamp"
            )

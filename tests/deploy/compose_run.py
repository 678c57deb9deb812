"""Run docker-compose.yml for real with podman and podman-compose, and check what it does.

    python tests/deploy/compose_run.py [--keep] [--no-backfill] [--base-image IMAGE]

(`make compose-check`.)  On a machine like the CI sandbox (Debian 12, no Docker daemon, cgroup v1
hybrid, no reachable public registry): installs podman, runc, podman-compose and debootstrap
from Debian's packages when they are missing, uses docker/local/containers.conf (runc,
cgroupfs, the host's ulimits) through CONTAINERS_CONF, makes the local base image once
(docker/local/make-base-image.sh; cached as a podman image), then:

 1. builds every image of the compose file with podman-compose (`podman build --network host`);
 2. brings the stack up service by service - hbase, oracle, oracle-standby, worker,
    note-words - waiting for each one's own health check (podman-compose 1.0.x ignores
    `depends_on` conditions, and podman runs no health-check timers without systemd, so
    this script runs `podman healthcheck run` itself);
 3. runs the backfill job (Spark image) on docker/backfill/documents.jsonl;
 4. writes documents and notes through the engine (tests/deploy/stack_check.py inside a
    worker container), waits until no notification is pending, and checks the derived
    tables against the reference and every note's word count (the custom-observer image);
 5. kills the active oracle container (SIGKILL: its lease is not released), waits until the
    standby reports itself active, writes and checks again, starts the killed one again
    (it rejoins as standby); then crashes the new active oracle's process inside its
    container: the restart policy brings it back, and whichever oracle takes the expired
    lease first (at a higher epoch) is the active one;
 6. scales the workers to 3 (deploy.replicas through WORKER_REPLICAS: podman-compose 1.0.x
    ignores --scale), writes and checks again, and checks that ``percolator status`` lists
    the four running workers (three workers and note-words) with their threads;
 7. starts the `monitoring` profile's Prometheus (an image from Debian's package,
    docker/local/prometheus.Dockerfile; Grafana has no Debian package and its image cannot
    be pulled here) and waits until it scrapes both oracles and all four workers; then
    runs the gc job;
 8. tears everything down (containers, network, volumes) - also on failure, unless --keep.

Prints each step's duration and what it checked; exits 0 only if every check passed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROJECT = "pcheck"
LOCAL_BASE = "localhost/bookworm-min:latest"
PROMETHEUS_IMAGE = "localhost/prometheus-debian:latest"
CHECK_SCRIPT = ROOT / "tests/deploy/stack_check.py"
PACKAGES = {
    "podman": "podman",
    "runc": "runc",
    "podman-compose": "podman-compose",
    "debootstrap": "debootstrap",
}

timings: list[tuple[str, float]] = []
checks: list[str] = []


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


@contextmanager
def step(name: str) -> Iterator[None]:
    log(f"== {name}")
    started = time.monotonic()
    yield
    elapsed = time.monotonic() - started
    timings.append((name, elapsed))
    log(f"   {name}: {elapsed:.1f} s")


def passed(what: str) -> None:
    checks.append(what)
    log(f"   ok: {what}")


def run(
    argv: Sequence[str],
    *,
    env: dict[str, str] | None = None,
    check: bool = True,
    capture: bool = False,
    stdin: str | None = None,
    timeout: float | None = None,
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        list(argv),
        cwd=ROOT,
        env=env,
        text=True,
        input=stdin,
        timeout=timeout,
        stdout=subprocess.PIPE if capture else subprocess.DEVNULL,
        stderr=subprocess.PIPE if capture else subprocess.DEVNULL,
    )
    if check and result.returncode != 0:
        raise RuntimeError(
            f"{' '.join(argv)} exited {result.returncode}:\n"
            f"{(result.stdout or '')[-2000:]}{(result.stderr or '')[-2000:]}"
        )
    return result


class Stack:
    def __init__(self, base_image: str) -> None:
        self.env = dict(os.environ)
        self.env["CONTAINERS_CONF"] = str(ROOT / "docker/local/containers.conf")
        self.env["BASE_IMAGE"] = base_image
        # The public prom/prometheus image cannot be pulled here; Debian's package can.
        self.env["PROMETHEUS_IMAGE"] = PROMETHEUS_IMAGE
        self.env.pop("PERCOLATOR_STORE", None)  # the compose file's default store
        self.env.pop("PERCOLATOR_ORACLE", None)

    def podman(
        self,
        *args: str,
        check: bool = True,
        capture: bool = True,
        stdin: str | None = None,
        timeout: float | None = None,
    ) -> subprocess.CompletedProcess[str]:
        return run(
            ["podman", *args],
            env=self.env,
            check=check,
            capture=capture,
            stdin=stdin,
            timeout=timeout,
        )

    def compose(
        self, *args: str, replicas: int = 1, check: bool = True, timeout: float | None = None
    ) -> subprocess.CompletedProcess[str]:
        env = dict(self.env, WORKER_REPLICAS=str(replicas))
        return run(
            ["podman-compose", "-p", PROJECT, *args],
            env=env,
            check=check,
            capture=True,
            timeout=timeout,
        )

    @staticmethod
    def container(service: str, number: int = 1) -> str:
        return f"{PROJECT}_{service}_{number}"

    def up(self, *services: str, replicas: int = 1) -> None:
        self.compose("up", "-d", "--no-build", "--no-deps", *services, replicas=replicas)

    def state(self, name: str) -> str:
        result = self.podman("inspect", "--format", "{{.State.Status}}", name, check=False)
        return result.stdout.strip() if result.returncode == 0 else "missing"

    def logs(self, name: str, lines: int = 40) -> str:
        result = self.podman("logs", "--tail", str(lines), name, check=False)
        return result.stdout + result.stderr

    def wait_healthy(self, name: str, timeout_s: float) -> float:
        """Runs the container's own health check until it passes; seconds waited."""
        started = time.monotonic()
        while True:
            if self.podman("healthcheck", "run", name, check=False, timeout=120).returncode == 0:
                return time.monotonic() - started
            state = self.state(name)
            if state not in ("running", "created", "configured"):
                raise RuntimeError(f"{name} is {state}:\n{self.logs(name)}")
            if time.monotonic() - started > timeout_s:
                raise RuntimeError(
                    f"{name} not healthy after {timeout_s:.0f} s:\n{self.logs(name)}"
                )
            time.sleep(2)

    def stack_check(self, *args: str, timeout_s: float = 600) -> dict[str, object]:
        """tests/deploy/stack_check.py ACTION inside the first worker container."""
        result = self.podman(
            "exec",
            "-i",
            self.container("worker"),
            "python",
            "-",
            *args,
            check=False,
            stdin=CHECK_SCRIPT.read_text(),
            timeout=timeout_s,
        )
        if result.returncode != 0:
            raise RuntimeError(f"stack_check {' '.join(args)} failed:\n{result.stderr[-3000:]}")
        found: dict[str, object] = json.loads(result.stdout.strip().splitlines()[-1])
        return found

    def roles(self) -> dict[str, str]:
        found = self.stack_check("roles", timeout_s=60)
        return {
            address: str(info.get("role")) if isinstance(info, dict) else "?"
            for address, info in found.items()
        }

    def kill_container(self, name: str) -> None:
        self.podman("kill", "--signal", "KILL", name)

    def crash_process(self, name: str) -> None:
        # Inside the container every process but the init (PID 1) dies at once; the init
        # then exits with the oracle's status, as after an OOM kill.
        self.podman("exec", name, "sh", "-c", "kill -KILL -1", check=False)

    def wait_restarted(self, name: str, timeout_s: float) -> int:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = self.podman(
                "inspect", "--format", "{{.RestartCount}} {{.State.Status}}", name, check=False
            ).stdout.split()
            if len(found) == 2 and int(found[0]) > 0 and found[1] == "running":
                return int(found[0])
            time.sleep(1)
        raise RuntimeError(f"{name} was not restarted by its restart policy:\n{self.logs(name)}")

    def active_oracle(self) -> tuple[str, int] | None:
        """The single active oracle's address and lease epoch, or None."""
        roles = self.stack_check("roles", timeout_s=60)
        active = [
            (address, int(info.get("epoch", 0)))
            for address, info in roles.items()
            if isinstance(info, dict) and info.get("role") == "active"
        ]
        return active[0] if len(active) == 1 else None

    def diagnose(self) -> None:
        """Every container of the project: its state and the end of its log."""
        names = self.podman(
            "ps",
            "-a",
            "--format",
            "{{.Names}}",
            "--filter",
            f"label=io.podman.compose.project={PROJECT}",
            check=False,
        )
        for name in names.stdout.split():
            print(f"--- {name}: {self.state(name)}\n{self.logs(name, 25)}", file=sys.stderr)

    def down(self) -> None:
        # WORKER_REPLICAS=3: down also knows the scaled workers.
        self.compose("down", "-v", "-t", "45", replicas=3, check=False, timeout=600)
        # podman-compose 1.0.x ignores profiles: also remove what it may have left.
        label = f"label=io.podman.compose.project={PROJECT}"
        leftovers = self.podman("ps", "-aq", "--filter", label, check=False).stdout.split()
        if leftovers:
            self.podman("rm", "-f", "-t", "10", *leftovers, check=False)
        volumes = self.podman("volume", "ls", "-q", "--filter", label, check=False).stdout.split()
        if volumes:
            self.podman("volume", "rm", "-f", *volumes, check=False)
        self.podman("network", "rm", "-f", f"{PROJECT}_default", check=False)


def ensure_packages() -> None:
    missing = [package for command, package in PACKAGES.items() if shutil.which(command) is None]
    if not missing:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise SystemExit(f"missing: {', '.join(missing)} (install them from your distribution)")
    log(f"installing {' '.join(missing)} from Debian's packages")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    run(["apt-get", "update", "-q"], env=env, capture=True)
    run(["apt-get", "install", "-y", "-q", *missing], env=env, capture=True)


def fail_over(stack: Stack, kill: Callable[[str], None]) -> tuple[str, float, str]:
    """Kills the active oracle's container with ``kill``; waits until an oracle holds the
    lease at a higher epoch.  Returns (the killed container, seconds until takeover, the new
    active with its epoch).

    Either instance may win: after a killed container the standby is the only candidate, but
    after a crashed process the restart policy may bring the victim back before the standby
    sees the lease expire, and then the restarted process takes it, which is just as correct
    (the epoch fences the dead one)."""
    before = stack.active_oracle()
    if before is None:
        raise RuntimeError(f"no single active oracle before the kill: {stack.roles()}")
    address, epoch = before
    victim = stack.container(address.split(":")[0])
    killed_at = time.monotonic()
    kill(victim)
    after = None
    while time.monotonic() - killed_at < 120:
        after = stack.active_oracle()
        if after is not None and after[1] > epoch:
            return victim, time.monotonic() - killed_at, f"{after[0]} (epoch {epoch} -> {after[1]})"
        time.sleep(0.5)
    raise RuntimeError(f"no takeover within 120 s (before: {before}, now: {after})")


def write_and_check(stack: Stack, round_: int) -> tuple[dict[str, object], dict[str, object]]:
    written = stack.stack_check("write", str(round_))
    checked = stack.stack_check("check", "600")
    if checked.get("notes_counted") != 20 or checked.get("derived_equal_reference") is not True:
        raise RuntimeError(f"round {round_}: expected 20 counted notes: {checked}")
    return written, checked


def scenario(stack: Stack, backfill: bool, monitoring: bool) -> None:
    with step("build images (podman-compose build)"):
        stack.compose("--podman-build-args", "--network host", "build", timeout=3600)
        images = stack.podman("images", "--format", "{{.Repository}}:{{.Tag}} {{.Size}}").stdout
        wanted = [
            "percolator-hbase",
            "percolator:",
            "percolator-example",
            "percolator-spark",
            "percolator-note-words",
        ]
        for name in wanted:
            if name not in images:
                raise RuntimeError(f"image {name} was not built:\n{images}")
        sizes = {
            line.split()[0].removeprefix("localhost/"): " ".join(line.split()[1:])
            for line in images.splitlines()
            if "percolator" in line
        }
        passed(f"5 images built: {sizes}")
        for image in (
            "percolator:latest",
            "percolator-example:latest",
            "percolator-note-words:latest",
        ):
            probe = stack.podman(
                "run",
                "--rm",
                "--entrypoint",
                "sh",
                image,
                "-c",
                "id -un; command -v java || echo no-java; "
                "python -c 'import pyspark' 2>/dev/null && echo pyspark "
                "|| echo no-pyspark",
            ).stdout.split()
            if probe != ["percolator", "no-java", "no-pyspark"]:
                raise RuntimeError(
                    f"{image}: expected a non-root user without Java and PySpark, found {probe}"
                )
        passed("engine, example and note-words images: user percolator, no Java, no PySpark")
        spark = stack.podman(
            "run",
            "--rm",
            "--entrypoint",
            "sh",
            "percolator-spark:latest",
            "-c",
            "id -un; java -version 2>&1 | head -1; "
            "python -c 'import pyspark; print(pyspark.__version__)'",
        ).stdout
        lines = spark.strip().splitlines()
        if len(lines) != 3 or lines[0] != "percolator" or "openjdk" not in lines[1]:
            raise RuntimeError(f"spark image: expected user percolator, Java and PySpark: {lines}")
        passed(f"spark image: {' / '.join(lines)}")

    with step("hbase up and healthy (development-only service)"):
        stack.up("hbase")
        waited = stack.wait_healthy(stack.container("hbase"), timeout_s=600)
        passed(f"hbase answered through Thrift after {waited:.0f} s")

    with step("oracle and standby up and healthy"):
        stack.up("oracle")
        stack.wait_healthy(stack.container("oracle"), timeout_s=180)
        stack.up("oracle-standby")
        stack.wait_healthy(stack.container("oracle-standby"), timeout_s=180)
        passed("both oracles' /healthz answer 200")

    with step("workers up and healthy (worker, note-words)"):
        stack.up("worker", "note-words")
        stack.wait_healthy(stack.container("worker"), timeout_s=300)
        stack.wait_healthy(stack.container("note-words"), timeout_s=300)
        deadline = time.monotonic() + 60
        while sorted((roles := stack.roles()).values()) != ["active", "standby"]:
            if time.monotonic() > deadline:
                raise RuntimeError(f"expected one active oracle and one standby: {roles}")
            time.sleep(1)
        passed(f"workers healthy; oracle roles {roles}")

    if backfill:
        with step("backfill job (Spark, docker/backfill/documents.jsonl)"):
            result = stack.compose(
                "run", "-T", "--rm", "--no-deps", "backfill", check=False, timeout=1200
            )
            if result.returncode != 0:
                raise RuntimeError(
                    f"backfill failed:\n{result.stdout[-3000:]}{result.stderr[-3000:]}"
                )
            checked = stack.stack_check("check", "600")
            if checked.get("documents") != 60:
                raise RuntimeError(f"expected the 60 backfilled documents: {checked}")
            passed(f"backfill exited 0; after quiescence {checked}")

    with step("write through the engine, wait for the workers, check derived data"):
        written, checked = write_and_check(stack, 1)
        passed(f"round 1: wrote {written}; after quiescence {checked}")

    with step("kill the active oracle container, standby takes over"):
        victim, takeover_s, after = fail_over(stack, stack.kill_container)
        passed(
            f"podman kill -s KILL {victim} (the active oracle); {after} active after "
            f"{takeover_s:.1f} s"
        )
        written, checked = write_and_check(stack, 2)
        passed(f"round 2 after fail-over: wrote {written}; after quiescence {checked}")
        # A killed container stays down (podman kill is an operator's stop): start it again.
        stack.podman("start", victim)
        stack.wait_healthy(victim, timeout_s=180)
        passed(f"{victim} started again, rejoined: {stack.roles()}")

    with step("crash the active oracle's process: restart policy, a new epoch"):
        victim, takeover_s, after = fail_over(stack, stack.crash_process)
        passed(
            f"every process of {victim} killed (exit 137); {after} active after {takeover_s:.1f} s"
        )
        restarted = stack.wait_restarted(victim, timeout_s=120)
        stack.wait_healthy(victim, timeout_s=180)
        passed(f"restart policy restarted {victim} ({restarted} restart); roles {stack.roles()}")

    with step("scale workers to 3, write and check again"):
        stack.up("worker", replicas=3)
        for number in (2, 3):
            stack.wait_healthy(stack.container("worker", number), timeout_s=300)
        running = stack.podman(
            "ps",
            "--filter",
            "label=com.docker.compose.service=worker",
            "--filter",
            f"label=io.podman.compose.project={PROJECT}",
            "--format",
            "{{.Names}}",
        ).stdout.split()
        if len(running) != 3:
            raise RuntimeError(f"expected 3 worker containers, found {running}")
        written, checked = write_and_check(stack, 3)
        passed(
            f"3 workers ({', '.join(sorted(running))}); round 3: wrote {written}; "
            f"after quiescence {checked}"
        )

    with step("percolator status lists the running workers"):
        # Exit code 1 only means the report lists problems; the roster is what is checked.
        result = stack.podman(
            "exec", stack.container("worker"), "percolator", "status", "--json", check=False
        )
        workers = json.loads(result.stdout)["workers"]
        live = [w for w in workers if w["live"]]
        threads = sorted(w["threads"] for w in live)
        if len(live) != 4 or threads != [2, 4, 4, 4]:
            raise RuntimeError(
                f"expected 3 workers of 4 threads and note-words of 2 live in the roster: {workers}"
            )
        passed(
            f"{len(live)} live workers in the roster: "
            + "; ".join(
                f"{w['worker_id']} threads {w['threads']} batch {w['batch_size']}" for w in live
            )
        )

    if monitoring:
        with step("monitoring: Prometheus scrapes every oracle and worker"):
            stack.podman(
                "build",
                "--network",
                "host",
                "--build-arg",
                f"BASE_IMAGE={stack.env['BASE_IMAGE']}",
                "-f",
                "docker/local/prometheus.Dockerfile",
                "-t",
                PROMETHEUS_IMAGE,
                "docker/local",
                timeout=1200,
            )
            stack.up("prometheus")
            stack.wait_healthy(stack.container("prometheus"), timeout_s=120)
            expected = {"percolator-oracle": 2, "percolator-worker": 4}  # 3 workers + note-words
            deadline = time.monotonic() + 120
            while True:
                reply = stack.podman(
                    "exec",
                    stack.container("prometheus"),
                    "wget",
                    "-q",
                    "-O",
                    "-",
                    "http://127.0.0.1:9090/api/v1/targets",
                    check=False,
                )
                targets = json.loads(reply.stdout or "{}").get("data", {}).get("activeTargets", [])
                up: dict[str, int] = {}
                for target in targets:
                    if target.get("health") == "up":
                        job = target["labels"]["job"]
                        up[job] = up.get(job, 0) + 1
                if up == expected:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"targets up {up}, expected {expected}: {targets}")
                time.sleep(3)
            passed(f"Prometheus ({PROMETHEUS_IMAGE}) scrapes /metrics, targets up: {up}")

    with step("gc job"):
        result = stack.compose("run", "-T", "--rm", "--no-deps", "gc", check=False, timeout=600)
        if result.returncode != 0:
            raise RuntimeError(f"gc failed:\n{result.stdout[-2000:]}{result.stderr[-2000:]}")
        passed("gc pass exited 0")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", action="store_true", help="leave the stack running")
    parser.add_argument(
        "--no-backfill", dest="backfill", action="store_false", help="skip the Spark backfill job"
    )
    parser.add_argument(
        "--no-monitoring",
        dest="monitoring",
        action="store_false",
        help="skip Prometheus (built from Debian's package: docker/local/prometheus.Dockerfile)",
    )
    parser.add_argument(
        "--base-image",
        default=LOCAL_BASE,
        help="BASE_IMAGE of the builds (default: the local debootstrap image "
        f"{LOCAL_BASE}, made when missing; python:3.11-slim-bookworm where a "
        "registry can be reached)",
    )
    args = parser.parse_args(argv)
    total_started = time.monotonic()
    ensure_packages()
    stack = Stack(args.base_image)
    if args.base_image == LOCAL_BASE:
        with step("local base image (debootstrap, cached)"):
            result = run(
                ["sh", str(ROOT / "docker/local/make-base-image.sh"), LOCAL_BASE],
                env=stack.env,
                capture=True,
                timeout=1800,
            )
            passed(result.stdout.strip().splitlines()[-1])
    stack.down()  # what an interrupted earlier run left
    failed: BaseException | None = None
    try:
        scenario(stack, args.backfill, args.monitoring)
    except BaseException as exc:  # reported below, after the teardown
        failed = exc
        stack.diagnose()
    finally:
        if not args.keep:
            with step("tear down (containers, network, volumes)"):
                stack.down()
                left = stack.podman(
                    "ps", "-aq", "--filter", f"label=io.podman.compose.project={PROJECT}"
                ).stdout.split()
                if left:
                    raise RuntimeError(f"containers left after teardown: {left}")
                passed("no container, volume or network of the project left")
    total = time.monotonic() - total_started
    print("\nTimings:")
    for name, seconds in timings:
        print(f"  {seconds:7.1f} s  {name}")
    print(f"  {total:7.1f} s  total")
    print("\nChecked:")
    for what in checks:
        print(f"  - {what}")
    if failed is not None:
        print(f"\nFAILED: {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

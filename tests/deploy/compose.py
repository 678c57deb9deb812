"""Reading and checking docker-compose.yml without Docker.

:func:`check_compose` returns the problems of a parsed compose document: every service's
command must be a valid ``percolator`` invocation (parsed by the real CLI parser with the
service's environment applied, as in the container), every URL in the environment must
point at a service that listens on that port, the worker must be scalable, jobs must sit
under profiles, long-running services need health checks, and what the file builds must
exist.  The smoke test uses :func:`service_command` and :func:`service_env` to run the same
commands as local processes.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import yaml

from percolator import config
from percolator.cli import build_parser
from percolator.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"


_VARIABLE = re.compile(r"\$(?:\$|\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::?-(?P<default>[^}]*))?\})")


def interpolate(value: Any, environ: Mapping[str, str]) -> Any:
    """``${VAR}``, ``${VAR:-default}``, ``${VAR-default}`` and ``$$`` in every string of a
    parsed compose document, as compose does (``:-`` also replaces an empty value)."""
    if isinstance(value, dict):
        return {k: interpolate(v, environ) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, environ) for v in value]
    if not isinstance(value, str):
        return value

    def substitute(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name, default = match.group("name"), match.group("default")
        found = environ.get(name)
        if found is None or (found == "" and ":-" in match.group(0)):
            return default or ""
        return found

    return _VARIABLE.sub(substitute, value)


def load_compose(
    path: Path = COMPOSE_FILE, environ: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The compose file as compose reads it, variables replaced from ``environ`` (default:
    none set, so every ``${VAR:-default}`` takes its default)."""
    with path.open(encoding="utf-8") as handle:
        document = yaml.safe_load(handle)
    assert isinstance(document, dict)
    interpolated: dict[str, Any] = interpolate(document, environ or {})
    return interpolated


def percolator_services(document: Mapping[str, Any]) -> set[str]:
    """Services running one of the project's images (their command is a ``percolator``
    invocation): those built here, and those using an image built here."""
    services: dict[str, Any] = document.get("services") or {}
    built = {s.get("image") for s in services.values() if s.get("build")}
    return {name for name, s in services.items() if s.get("build") or s.get("image") in built}


def health_command(service: Mapping[str, Any]) -> list[str] | None:
    """The health check's argv (CMD list, or CMD-SHELL string split like a shell)."""
    test = (service.get("healthcheck") or {}).get("test")
    if isinstance(test, str):
        return shlex.split(test)
    if isinstance(test, list) and test and test[0] == "CMD":
        return [str(t) for t in test[1:]]
    if isinstance(test, list) and len(test) == 2 and test[0] == "CMD-SHELL":
        return shlex.split(str(test[1]))
    return None


def service_env(service: Mapping[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):  # the "KEY=VALUE" list form
        env = dict(item.split("=", 1) for item in env)
    return {str(k): str(v) for k, v in env.items()}


def service_command(service: Mapping[str, Any]) -> list[str]:
    command = service.get("command")
    if not isinstance(command, list) or not all(isinstance(t, str) for t in command):
        raise ValueError("command must be a list of strings (exec form)")
    return list(command)


def parse_command(argv: list[str], env: Mapping[str, str]) -> argparse.Namespace:
    """What ``percolator ARGV`` would run with ``env``; raises ValueError if it does not
    parse (argparse's message included)."""
    parser = build_parser()
    command = config.command_path(parser, argv)
    if not command:
        raise ValueError(f"{argv[:1]} is not a percolator command")
    try:
        settings = config.resolve(parser, command, config_path=None, environ=env)
    except ConfigError as exc:  # a variable set to nothing, or to a malformed value
        raise ValueError(str(exc)) from None
    fill = config.apply(parser, command, settings)
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            args = parser.parse_args(argv)
    except SystemExit:
        raise ValueError(stderr.getvalue().strip().splitlines()[-1]) from None
    fill(args)
    return args


def _listen_port(args: argparse.Namespace) -> tuple[str, int] | None:
    listen = getattr(args, "listen", None)
    if not listen:
        return None
    host, _, port = str(listen).rpartition(":")
    return host, int(port)


def check_compose(document: Mapping[str, Any], root: Path = ROOT) -> list[str]:
    problems: list[str] = []
    services: dict[str, Any] = document.get("services") or {}
    ours = percolator_services(document)
    parsed: dict[str, argparse.Namespace] = {}
    for name, service in services.items():
        if name not in ours:
            continue
        try:
            argv = service_command(service)
            parsed[name] = parse_command(argv, service_env(service))
        except ValueError as exc:
            problems.append(f"{name}: command is not a valid percolator invocation: {exc}")
    # What each service listens on, as the other containers reach it.
    listening: dict[str, set[int]] = {}
    for name, args in parsed.items():
        ports: set[int] = set()
        if getattr(args, "command", None) == "hbase" and getattr(args, "port", None):
            if getattr(args, "bind", "127.0.0.1") != "0.0.0.0":
                problems.append(
                    f"{name}: HBase's Thrift gateway must bind 0.0.0.0 to be "
                    "reachable from other containers"
                )
            ports.add(int(args.port))
            if getattr(args, "thrift2_port", None):
                ports.add(int(args.thrift2_port))
        found = _listen_port(args)
        if found is not None:
            if found[0] != "0.0.0.0":
                problems.append(f"{name}: listens on {found[0]}, unreachable from other containers")
            ports.add(found[1])
        if getattr(args, "metrics_port", None):
            ports.add(int(args.metrics_port))
            if getattr(args, "metrics_host", "127.0.0.1") != "0.0.0.0":
                problems.append(f"{name}: metrics served on loopback only")
        listening[name] = ports
        exposed = {int(str(p).split("/")[0]) for p in services[name].get("expose", [])}
        if ports - exposed:
            problems.append(f"{name}: listens on {sorted(ports)} but exposes {sorted(exposed)}")
    for name, args in parsed.items():
        for option in ("store", "oracle"):
            url = getattr(args, option, None)
            if not url:
                continue
            for host, port in _endpoints(str(url)):
                if host not in services:
                    problems.append(f"{name}: --{option} {url} names {host!r}, not a service")
                elif port not in listening.get(host, set()):
                    problems.append(
                        f"{name}: --{option} {url} expects {host}:{port}, but {host} listens "
                        f"on {sorted(listening.get(host, set()))}"
                    )
        needs_oracle = getattr(args, "command", None) in ("worker", "backfill", "gc", "export")
        if needs_oracle and not getattr(args, "oracle", None):
            problems.append(
                f"{name}: no oracle configured (would use the in-process "
                "oracle, refused while the oracle service holds its lease)"
            )
    for name, service in services.items():
        # One-off jobs run and exit; everything else (optional profiles too) keeps running.
        job = name in parsed and parsed[name].command in ("backfill", "gc", "export")
        is_worker = name == "worker" or (name in parsed and parsed[name].command == "worker")
        if is_worker and ("container_name" in service or service.get("ports")):
            problems.append(f"{name}: a container name or host port prevents --scale")
        if job and not service.get("profiles"):
            problems.append(f"{name}: a one-off job must sit under a profile")
        if not job and "healthcheck" not in service:
            problems.append(f"{name}: a long-running service needs a healthcheck")
        health = health_command(service)
        if health and health[0] == "percolator":
            try:
                parse_command(health[1:], service_env(service))
            except ValueError as exc:
                problems.append(f"{name}: healthcheck is not a valid invocation: {exc}")
        test = (service.get("healthcheck") or {}).get("test")
        if isinstance(test, list) and test and test[0] == "CMD" and len(test) > 2:
            # podman-compose 1.0.x quotes the list form wrongly; CMD-SHELL works everywhere.
            problems.append(f"{name}: healthcheck as a CMD list; use a CMD-SHELL string")
        if service.get("init") is not True:
            problems.append(f"{name}: needs `init: true` (signals and zombies of PID 1)")
        restart = service.get("restart")
        if job and restart not in (None, "no"):
            problems.append(f"{name}: a one-off job must not restart ({restart!r})")
        if not job and restart not in ("always", "unless-stopped", "on-failure"):
            problems.append(f"{name}: a long-running service needs a restart policy")
        for volume in service.get("volumes") or []:
            source = str(volume).split(":", 1)[0]
            if source.startswith((".", "/")) and not (root / source).exists():
                problems.append(f"{name}: mounts {source}, which does not exist")
        depends = service.get("depends_on") or {}
        for target in depends:
            if target not in services:
                problems.append(f"{name}: depends on unknown service {target!r}")
            elif (
                isinstance(depends, dict)
                and depends[target].get("condition") == ("service_healthy")
                and "healthcheck" not in services[target]
            ):
                problems.append(
                    f"{name}: waits for {target} to be healthy, which has no healthcheck"
                )
        build = service.get("build")
        if build and name in ours:
            context = root / build.get("context", ".")
            dockerfile = context / build.get("dockerfile", "Dockerfile")
            if not dockerfile.is_file():
                problems.append(f"{name}: {dockerfile.relative_to(root)} does not exist")
            elif 'ENTRYPOINT ["percolator"]' not in dockerfile.read_text():
                problems.append(f"{name}: {dockerfile.name} does not run percolator")
    # Slim images per role: Java and PySpark only where Spark runs.
    targets = {
        s.get("image"): (s.get("build") or {}).get("target")
        for s in services.values()
        if s.get("build")
    }
    for name, args in parsed.items():
        target = targets.get(services[name].get("image"))
        spark_job = getattr(args, "command", None) in ("backfill", "export")
        if spark_job and target != "spark":
            problems.append(f"{name}: runs Spark but its image is not the spark target")
        if not spark_job and target == "spark":
            problems.append(f"{name}: does not run Spark but uses the spark image")
    return problems


def _endpoints(url: str) -> list[tuple[str, int]]:
    """``(host, port)`` of every address in a store or oracle URL."""
    parts = urlsplit(url)
    if parts.scheme not in ("hbase", "grpc", "grpcs"):
        return []
    found = []
    for address in parts.netloc.split(","):
        host, _, port = address.rpartition(":")
        found.append((host, int(port)))
    thrift2_port = dict(parse_qsl(parts.query)).get("thrift2_port")
    if parts.scheme == "hbase" and thrift2_port:
        found.append((found[0][0], int(thrift2_port)))  # the Thrift-2 gateway's, same host
    return found

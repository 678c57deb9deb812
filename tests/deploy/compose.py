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
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from percolator import config
from percolator.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"


def load_compose(path: Path = COMPOSE_FILE) -> dict[str, Any]:
    with path.open(encoding="utf-8") as handle:
        document = yaml.safe_load(handle)
    assert isinstance(document, dict)
    return document


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
    settings = config.resolve(parser, command, config_path=None, environ=env)
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
    parsed: dict[str, argparse.Namespace] = {}
    for name, service in services.items():
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
                problems.append(f"{name}: HBase's Thrift gateway must bind 0.0.0.0 to be "
                                "reachable from other containers")
            ports.add(int(args.port))
        found = _listen_port(args)
        if found is not None:
            if found[0] != "0.0.0.0":
                problems.append(f"{name}: listens on {found[0]}, unreachable from other "
                                "containers")
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
            problems.append(f"{name}: no oracle configured (would use the in-process "
                            "oracle, refused while the oracle service holds its lease)")
    for name, service in services.items():
        job = bool(service.get("profiles"))
        is_worker = name == "worker" or (name in parsed and parsed[name].command == "worker")
        if is_worker and ("container_name" in service or service.get("ports")):
            problems.append(f"{name}: a container name or host port prevents --scale")
        if name in parsed and parsed[name].command in ("backfill", "gc", "export") and not job:
            problems.append(f"{name}: a one-off job must sit under a profile")
        if not job and "healthcheck" not in service:
            problems.append(f"{name}: a long-running service needs a healthcheck")
        health = service.get("healthcheck", {}).get("test")
        if isinstance(health, list) and health[:2] == ["CMD", "percolator"]:
            try:
                parse_command(health[2:], service_env(service))
            except ValueError as exc:
                problems.append(f"{name}: healthcheck is not a valid invocation: {exc}")
        depends = service.get("depends_on") or {}
        for target in depends:
            if target not in services:
                problems.append(f"{name}: depends on unknown service {target!r}")
            elif isinstance(depends, dict) and depends[target].get("condition") == (
                "service_healthy"
            ) and "healthcheck" not in services[target]:
                problems.append(f"{name}: waits for {target} to be healthy, which has no "
                                "healthcheck")
        build = service.get("build")
        if build:
            context = root / build.get("context", ".")
            dockerfile = context / build.get("dockerfile", "Dockerfile")
            if not dockerfile.is_file():
                problems.append(f"{name}: {dockerfile.relative_to(root)} does not exist")
            elif "ENTRYPOINT [\"percolator\"]" not in dockerfile.read_text():
                problems.append(f"{name}: {dockerfile.name} does not run percolator")
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
    return found

"""docker-compose.yml is checked without Docker: every command through the real CLI parser,
ports and URLs against each other, scaling, profiles, health checks, images."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from tests.deploy.compose import (
    ROOT,
    check_compose,
    interpolate,
    load_compose,
    percolator_services,
    service_command,
)


def test_the_compose_file_passes_every_check() -> None:
    assert check_compose(load_compose()) == []


def test_the_compose_file_has_the_expected_services() -> None:
    services = load_compose()["services"]
    assert {"hbase", "oracle", "oracle-standby", "worker", "backfill"} <= set(services)
    assert service_command(services["oracle"])[:2] == ["oracle", "serve"]
    assert service_command(services["oracle-standby"])[:2] == ["oracle", "serve"]
    assert service_command(services["worker"])[0] == "worker"
    assert services["backfill"]["profiles"] == ["backfill"]
    # One's own observers in an image of their own; monitoring is optional.
    assert services["note-words"]["build"]["context"] == "docker/custom-observer"
    assert services["prometheus"]["profiles"] == services["grafana"]["profiles"] == ["monitoring"]
    assert percolator_services(load_compose()) == {
        "hbase",
        "oracle",
        "oracle-standby",
        "worker",
        "note-words",
        "backfill",
        "gc",
    }


def test_the_store_and_oracle_come_from_the_environment() -> None:
    default = load_compose()["services"]["worker"]["environment"]
    assert default["PERCOLATOR_STORE"] == "hbase://hbase:9090?thrift2_port=9095"
    cluster = load_compose(environ={"PERCOLATOR_STORE": "hbase://thrift.example:9090"})
    assert cluster["services"]["oracle"]["environment"]["PERCOLATOR_STORE"] == (
        "hbase://thrift.example:9090"
    )
    # An empty value takes the default too (":-"), as compose does; "$$" is a dollar.
    assert interpolate("${X:-a}|${X-b}|$${X}", {"X": ""}) == "a||${X}"


def test_the_backfill_input_exists_and_parses() -> None:
    lines = (ROOT / "docker/backfill/documents.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(lines) == 60
    for line in lines:
        assert {"url", "body", "links"} <= set(json.loads(line))


def test_the_hbase_service_says_it_is_for_development_only() -> None:
    text = (ROOT / "docker-compose.yml").read_text()
    assert "DEVELOPMENT ONLY" in text and "PERCOLATOR_STORE=hbase://" in text
    assert "DEVELOPMENT ONLY" in (ROOT / "docker/hbase/Dockerfile").read_text()


def _set(path: list[Any], value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(document: dict[str, Any]) -> None:
        target = document
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return mutate


def _delete(path: list[Any]) -> Callable[[dict[str, Any]], None]:
    def mutate(document: dict[str, Any]) -> None:
        target = document
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]

    return mutate


def _env(service: str, key: str, value: str) -> Callable[[dict[str, Any]], None]:
    def mutate(document: dict[str, Any]) -> None:
        env = dict(document["services"][service]["environment"])
        env[key] = value
        document["services"][service]["environment"] = env

    return mutate


def _unset_env(service: str, key: str) -> Callable[[dict[str, Any]], None]:
    def mutate(document: dict[str, Any]) -> None:
        env = dict(document["services"][service]["environment"])
        del env[key]
        document["services"][service]["environment"] = env

    return mutate


MUTATIONS = {
    "unknown flag": (
        _set(["services", "worker", "command"], ["worker", "--bogus", "4"]),
        "worker: command is not a valid percolator invocation",
    ),
    "unknown command": (
        _set(["services", "gc", "command"], ["collect"]),
        "gc: command is not a valid percolator invocation",
    ),
    "bad value": (
        _set(["services", "worker", "command"], ["worker", "--threads", "many"]),
        "argument --threads: 'many' is not a number",
    ),
    "wrong store port": (
        _env("worker", "PERCOLATOR_STORE", "hbase://hbase:9091"),
        "expects hbase:9091, but hbase listens on [9090, 9095]",
    ),
    "wrong Thrift-2 port": (
        _env("worker", "PERCOLATOR_STORE", "hbase://hbase:9090?thrift2_port=9096"),
        "expects hbase:9096, but hbase listens on [9090, 9095]",
    ),
    "unknown host": (
        _env("worker", "PERCOLATOR_ORACLE", "grpc://oracle:7070,tso:7070"),
        "names 'tso', not a service",
    ),
    "oracle on loopback": (
        _set(["services", "oracle", "command"], ["oracle", "serve", "--listen", "127.0.0.1:7070"]),
        "oracle: listens on 127.0.0.1",
    ),
    "hbase on loopback": (
        _set(
            ["services", "hbase", "command"], ["hbase", "start", "--foreground", "--port", "9090"]
        ),
        "must bind 0.0.0.0",
    ),
    "port not exposed": (
        _set(["services", "oracle", "expose"], ["9464"]),
        "oracle: listens on [7070, 9464] but exposes [9464]",
    ),
    "worker pinned": (
        _set(["services", "worker", "container_name"], "worker-1"),
        "prevents --scale",
    ),
    "job without profile": (
        _delete(["services", "backfill", "profiles"]),
        "backfill: a one-off job must sit under a profile",
    ),
    "no healthcheck": (
        _delete(["services", "worker", "healthcheck"]),
        "worker: a long-running service needs a healthcheck",
    ),
    "missing dependency": (
        _set(["services", "worker", "depends_on"], {"tso": {"condition": "service_healthy"}}),
        "depends on unknown service 'tso'",
    ),
    "no oracle": (_unset_env("worker", "PERCOLATOR_ORACLE"), "worker: no oracle configured"),
    "empty oracle": (
        _env("worker", "PERCOLATOR_ORACLE", ""),
        "worker: command is not a valid percolator invocation: PERCOLATOR_ORACLE: bad value ''",
    ),
    "missing dockerfile": (
        _set(
            ["services", "hbase", "build"], {"context": ".", "dockerfile": "docker/nope/Dockerfile"}
        ),
        "docker/nope/Dockerfile does not exist",
    ),
    "no init": (_delete(["services", "oracle", "init"]), "oracle: needs `init: true`"),
    "no restart policy": (
        _delete(["services", "worker", "restart"]),
        "worker: a long-running service needs a restart policy",
    ),
    "job restarts": (
        _set(["services", "gc", "restart"], "always"),
        "gc: a one-off job must not restart",
    ),
    "missing backfill input": (
        _set(["services", "backfill", "volumes"], ["./docker/nope:/input:ro"]),
        "backfill: mounts ./docker/nope, which does not exist",
    ),
    "spark image for gc": (
        _set(["services", "gc", "image"], "percolator-spark:latest"),
        "gc: does not run Spark but uses the spark image",
    ),
    "backfill without spark": (
        _set(["services", "backfill", "build", "target"], "engine"),
        "backfill: runs Spark but its image is not the spark target",
    ),
    "healthcheck as CMD list": (
        _set(
            ["services", "worker", "healthcheck", "test"],
            ["CMD", "percolator-healthz", "http://127.0.0.1:9108"],
        ),
        "worker: healthcheck as a CMD list",
    ),
    "bad percolator healthcheck": (
        _set(["services", "hbase", "healthcheck", "test"], ["CMD-SHELL", "percolator hbase state"]),
        "hbase: healthcheck is not a valid invocation",
    ),
}


@pytest.mark.parametrize("case", sorted(MUTATIONS))
def test_the_checker_catches(case: str) -> None:
    mutate, message = MUTATIONS[case]
    document = copy.deepcopy(load_compose())
    mutate(document)
    problems = check_compose(document)
    assert any(message in p for p in problems), problems


def _stages(dockerfile: str) -> dict[str, str]:
    """Each build stage's text, by stage name."""
    parts = re.split(r"^FROM ", dockerfile, flags=re.M)[1:]
    return {part.split("\n", 1)[0].split(" AS ")[-1].strip(): part for part in parts}


def test_the_images_are_slim_per_role_and_cache_dependencies() -> None:
    project = (ROOT / "Dockerfile").read_text()
    assert project.index("ARG BASE_IMAGE=python:3.11-slim-bookworm") < project.index("FROM ")
    stages = _stages(project)
    assert {"engine", "example", "spark"} <= set(stages)
    # Java and PySpark only in the spark image; the example package only in the example one.
    for name, text in stages.items():
        assert ("openjdk" in text) == (name == "spark"), name
        assert ("optional-dependencies']['spark']" in text) == (name == "spark"), name
        assert ("docpipeline" in text) == (name in ("wheels", "example")), name
    # Dependencies from pyproject.toml alone; the source only reaches the wheels stage.
    for name in ("engine-deps", "spark"):
        assert "COPY pyproject.toml ./" in stages[name]
        assert "COPY percolator" not in stages[name] and "pip install -r" in stages[name]
    assert "COPY percolator ./percolator" in stages["wheels"]
    # Every image that runs ends as the unprivileged user.
    for name in ("engine", "example", "spark"):
        users = re.findall(r"^USER (\S+)", stages[name], flags=re.M)
        assert users and users[-1] == "percolator", name
    observer = (ROOT / "docker/custom-observer/Dockerfile").read_text()
    assert "ARG ENGINE_IMAGE" in observer and re.findall(r"^USER (\S+)", observer, re.M)[-1] == (
        "percolator"
    )
    hbase = (ROOT / "docker/hbase/Dockerfile").read_text()
    assert "ARG BASE_IMAGE" in hbase and re.findall(r"^USER (\S+)", hbase, re.M)[-1] == (
        "percolator"
    )
    # The jars are resolved from the pom before any source is copied.
    assert hbase.index("dependency:build-classpath") < hbase.index("COPY percolator ")
    # The HBase image resolves the same pom the tests use.
    assert "percolator hbase classpath" in hbase
    assert (ROOT / "percolator/testing/localhbase/pom.xml").is_file()


def test_prometheus_scrapes_every_metrics_endpoint_of_the_deployment() -> None:
    services = load_compose()["services"]
    config = yaml.safe_load((ROOT / "docker/prometheus/prometheus.yml").read_text())
    scraped: set[tuple[str, int]] = set()
    for job in config["scrape_configs"]:
        for static in job.get("static_configs", []):
            for target in static["targets"]:
                host, _, port = target.rpartition(":")
                scraped.add((host, int(port)))
        for dns in job.get("dns_sd_configs", []):
            scraped |= {(name, int(dns["port"])) for name in dns["names"]}
    serving: set[tuple[str, int]] = set()
    for name, service in services.items():
        command = service.get("command") or []
        if name in percolator_services(load_compose()) and "--metrics-port" in command:
            serving.add((name, int(command[command.index("--metrics-port") + 1])))
    assert serving == scraped
    assert {"oracle", "oracle-standby", "worker", "note-words"} == {h for h, _ in serving}
    assert config["rule_files"] == ["/etc/prometheus/alerts.yml"]
    # The monitoring services mount what they read.
    mounts = [v.split(":")[0] for v in services["prometheus"]["volumes"]]
    assert "./docker/prometheus" in mounts
    grafana = [v.split(":")[0] for v in services["grafana"]["volumes"]]
    assert {"./docker/grafana", "./docker/grafana/provisioning"} <= set(grafana)

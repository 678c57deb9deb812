"""docker-compose.yml is checked without Docker: every command through the real CLI parser,
ports and URLs against each other, scaling, profiles, health checks, images."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from tests.deploy.compose import ROOT, check_compose, load_compose, service_command


def test_the_compose_file_passes_every_check() -> None:
    assert check_compose(load_compose()) == []


def test_the_compose_file_has_the_expected_services() -> None:
    services = load_compose()["services"]
    assert {"hbase", "oracle", "oracle-standby", "worker", "backfill"} <= set(services)
    assert service_command(services["oracle"])[:2] == ["oracle", "serve"]
    assert service_command(services["oracle-standby"])[:2] == ["oracle", "serve"]
    assert service_command(services["worker"])[0] == "worker"
    assert services["backfill"]["profiles"] == ["backfill"]


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


MUTATIONS = {
    "unknown flag": (_set(["services", "worker", "command"], ["worker", "--bogus", "4"]),
                     "worker: command is not a valid percolator invocation"),
    "unknown command": (_set(["services", "gc", "command"], ["collect"]),
                        "gc: command is not a valid percolator invocation"),
    "bad value": (_set(["services", "worker", "command"], ["worker", "--threads", "many"]),
                  "invalid int value"),
    "wrong store port": (_env("worker", "PERCOLATOR_STORE", "hbase://hbase:9091"),
                         "expects hbase:9091, but hbase listens on [9090]"),
    "unknown host": (_env("worker", "PERCOLATOR_ORACLE", "grpc://oracle:7070,tso:7070"),
                     "names 'tso', not a service"),
    "oracle on loopback": (
        _set(["services", "oracle", "command"], ["oracle", "serve", "--listen",
                                                 "127.0.0.1:7070"]),
        "oracle: listens on 127.0.0.1"),
    "hbase on loopback": (
        _set(["services", "hbase", "command"], ["hbase", "start", "--foreground", "--port",
                                                "9090"]),
        "must bind 0.0.0.0"),
    "port not exposed": (_set(["services", "oracle", "expose"], ["9464"]),
                         "oracle: listens on [7070, 9464] but exposes [9464]"),
    "worker pinned": (_set(["services", "worker", "container_name"], "worker-1"),
                      "prevents --scale"),
    "job without profile": (_delete(["services", "backfill", "profiles"]),
                            "backfill: a one-off job must sit under a profile"),
    "no healthcheck": (_delete(["services", "worker", "healthcheck"]),
                       "worker: a long-running service needs a healthcheck"),
    "missing dependency": (_set(["services", "worker", "depends_on"],
                                {"tso": {"condition": "service_healthy"}}),
                           "depends on unknown service 'tso'"),
    "no oracle": (_env("worker", "PERCOLATOR_ORACLE", ""), "worker: no oracle configured"),
    "missing dockerfile": (_set(["services", "hbase", "build"],
                                {"context": ".", "dockerfile": "docker/nope/Dockerfile"}),
                           "docker/nope/Dockerfile does not exist"),
}


@pytest.mark.parametrize("case", sorted(MUTATIONS))
def test_the_checker_catches(case: str) -> None:
    mutate, message = MUTATIONS[case]
    document = copy.deepcopy(load_compose())
    mutate(document)
    problems = check_compose(document)
    assert any(message in p for p in problems), problems


def test_the_images_install_the_project() -> None:
    project = (ROOT / "Dockerfile").read_text()
    assert "pip install" in project and "'.[spark]'" in project
    hbase = (ROOT / "docker/hbase/Dockerfile").read_text()
    # The HBase image resolves the same pom the tests use.
    assert "percolator hbase classpath" in hbase
    assert (ROOT / "percolator/testing/localhbase/pom.xml").is_file()

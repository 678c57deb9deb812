"""The compose deployment, run without Docker: the services' own commands, read from
docker-compose.yml, as local processes against the local HBase.

Mapping from containers to processes: service addresses become loopback addresses with free
ports (``0.0.0.0:7070`` -> ``127.0.0.1:P``; every ``--metrics-port`` a free port); the shared
environment's ``PERCOLATOR_STORE`` becomes the test session's HBase (with a table prefix of
its own) and ``PERCOLATOR_ORACLE`` the two local oracle addresses; the backfill's ``/input``
volume becomes a temporary directory.  The ``hbase`` service's command is the launcher the
test session already used to start HBase (its parse is checked in test_compose.py), so it is
not started twice.  Then: both oracles, two workers (the scaled service), the backfill job
on a generated corpus, quiescence, derived tables equal to the reference; the active oracle
killed with SIGKILL, the standby taking over with timestamps that keep increasing while the
workers process new changes; finally SIGTERM and clean exits.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from docpipeline import corpus, reference
from percolator.observers.parking import pending

import percolator
from percolator.store import open_store
from percolator.store.backends import with_table_prefix
from tests.deploy.compose import ROOT, load_compose, service_command, service_env

OBSERVED = [("documents", "body"), ("documents", "links"), ("doc_clusters", "canonical")]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def localize(command: list[str], replacements: Mapping[str, str]) -> list[str]:
    """The command with container addresses and paths replaced by local ones; every
    ``--metrics-port`` gets a free port and metrics stay on loopback."""
    out: list[str] = []
    for index, token in enumerate(command):
        previous = command[index - 1] if index else ""
        if previous == "--metrics-port":
            token = str(free_port())
        elif previous == "--metrics-host":
            token = "127.0.0.1"
        for old, new in replacements.items():
            token = token.replace(old, new)
        out.append(token)
    return out


class Service:
    """One service's command as a local process, its output in a log file."""

    def __init__(self, name: str, argv: list[str], env: Mapping[str, str], log: Path) -> None:
        self.name = name
        self.argv = argv
        self.log_path = log
        self._log = log.open("w")
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("PERCOLATOR_")}
        full_env.update(env)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "percolator", *argv],
            cwd=ROOT,
            env=full_env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def wait_for(self, text: str, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if text in self.log_path.read_text():
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        raise AssertionError(
            f"{self.name} ({' '.join(self.argv)}) did not print {text!r}:\n"
            + self.log_path.read_text()[-3000:]
        )

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self._log.close()
        return code


def wait_quiet(client: percolator.Client, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while any(pending(client, table, [column], limit=1) for table, column in OBSERVED):
        if time.monotonic() > deadline:
            raise AssertionError("the workers did not reach quiescence")
        time.sleep(0.2)


def check_derived(client: percolator.Client) -> int:
    with client.snapshot() as snap:
        documents = reference.read_documents(snap)
        derived = reference.read_derived(snap)
    assert reference.diff(reference.compute(documents), derived) == []
    return len(documents)


@pytest.fixture
def prefix_store(hbase_url: str) -> Iterator[str]:
    url = with_table_prefix(hbase_url, f"smoke{uuid.uuid4().hex[:8]}_")
    yield url
    store = open_store(url)
    for table in store.list_tables():
        store.drop_table(table)
    store.close()


@pytest.mark.hbase
@pytest.mark.spark
def test_compose_services_run_as_local_processes(prefix_store: str, tmp_path: Path) -> None:
    services: dict[str, Any] = load_compose()["services"]
    ports = {"oracle": free_port(), "oracle-standby": free_port()}
    env = service_env(services["worker"])
    assert env["PERCOLATOR_STORE"] == "hbase://hbase:9090?thrift2_port=9095"
    local_env = {
        **env,
        "PERCOLATOR_STORE": prefix_store,
        "PERCOLATOR_ORACLE": f"grpc://127.0.0.1:{ports['oracle']},127.0.0.1:{ports['oracle-standby']}",
    }
    input_dir = tmp_path / "input"
    input_dir.mkdir()
    running: list[Service] = []

    def start(name: str, replacements: Mapping[str, str], log_name: str) -> Service:
        argv = localize(service_command(services[name]), replacements)
        service = Service(
            log_name,
            argv,
            {**service_env(services[name]), **local_env},
            tmp_path / f"{log_name}.log",
        )
        running.append(service)
        return service

    try:
        oracle = start("oracle", {"0.0.0.0:7070": f"127.0.0.1:{ports['oracle']}"}, "oracle")
        oracle.wait_for("oracle: listening on")
        standby = start(
            "oracle-standby", {"0.0.0.0:7070": f"127.0.0.1:{ports['oracle-standby']}"}, "standby"
        )
        standby.wait_for("oracle: listening on")
        workers = [start("worker", {}, f"worker-{i}") for i in range(2)]  # --scale worker=2
        for worker in workers:
            worker.wait_for("worker ready", timeout_s=180)

        documents = corpus.generate(300, seed=11)
        with (input_dir / "documents.jsonl").open("w", encoding="utf-8") as out:
            for doc in documents:
                links = doc.links_value()
                out.write(
                    json.dumps(
                        {
                            "url": doc.url,
                            "body": doc.body,
                            "links": links.decode() if links else None,
                        }
                    )
                    + "\n"
                )
        backfill = start("backfill", {"/input": str(input_dir)}, "backfill")
        assert backfill.proc.wait(600) == 0, backfill.log_path.read_text()[-3000:]

        client = percolator.connect(prefix_store, oracle=local_env["PERCOLATOR_ORACLE"])
        try:
            wait_quiet(client)
            assert check_derived(client) == 300
            before = client.snapshot().read_ts

            # Fail-over: the active oracle dies without releasing its lease.
            assert oracle.stop(signal.SIGKILL) == -signal.SIGKILL
            changes = corpus.mutate(documents, fraction=0.05, seed=12)
            corpus.write_documents(client, changes)  # needs timestamps from the standby
            after = client.snapshot().read_ts
            assert after > before
            wait_quiet(client)
            assert check_derived(client) == len(corpus.apply_changes(documents, changes))
            # The standby is the one serving now.
            from percolator.oracle.client import GrpcOracleClient
            from percolator.oracle.proto_gen import oracle_pb2

            address = f"127.0.0.1:{ports['oracle-standby']}"
            info_client = GrpcOracleClient([address])
            try:
                assert info_client.info(address).role == oracle_pb2.ROLE_ACTIVE
            finally:
                info_client.close()
        finally:
            client.close()

        for worker in workers:
            assert worker.stop() == 0, worker.log_path.read_text()[-2000:]
            assert "worker stopped" in worker.log_path.read_text()
        assert standby.stop() == 0, standby.log_path.read_text()[-2000:]
    finally:
        for service in running:
            service.stop(signal.SIGKILL, timeout_s=10)

"""The command line: ``percolator worker`` and ``percolator notifications list|retry``, run as
real processes
(``python -m percolator``, as users run ``percolator``)."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from percolator.observers import plugins
from percolator.observers.options import DEFAULT_BATCH_SIZE
from percolator.observers.parking import ParkingLot, pending
from percolator.observers.runner import Notification

import percolator
from percolator import cli
from tests.observers import helpers
from tests.observers.conftest import connect
from tests.observers.helpers import EVENTS, runs
from tests.observers.procs import PROJECT_ROOT, WorkerProcess, cli_env, run_cli, wait_quiet


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"embedded:{tmp_path / 'store'}"


def test_worker_reports_broken_plugins_runs_the_others_and_stops_on_sigterm(
    url: str, plugin_dir: Path, tmp_path: Path
) -> None:
    client = connect(url)
    worker = WorkerProcess(
        url,
        ["broken-import", "run-logger", "not-an-observer"],
        tmp_path / "worker.log",
        plugin_dir=plugin_dir,
    ).wait_ready()
    output = worker.output()
    assert "observer plugin 'broken-import': cannot load" in output
    assert "observer plugin 'not-an-observer'" in output
    assert "observers=run-logger" in output
    with client.transaction() as txn:
        txn.set(EVENTS, b"r", "value", b"x")
    wait_quiet(client, [EVENTS], workers=[worker])
    assert set(runs(client.snapshot())) == {b"r"}
    metrics = worker.metrics()
    assert metrics['percolator_observer_runs_total{observer="run-logger"}'] == 1
    assert worker.terminate() == 0
    assert "worker stopped" in worker.output()
    client.close()


def test_sigterm_with_runs_in_flight_loses_and_duplicates_nothing(
    url: str, plugin_dir: Path, tmp_path: Path
) -> None:
    client = connect(url)
    helpers.create_tables(client)
    slow = {helpers.SLEEP_ENV: "400"}
    first = WorkerProcess(
        url, ["run-logger"], tmp_path / "w1.log", plugin_dir=plugin_dir, threads=4, env=slow
    ).wait_ready()
    rows = [b"r%02d" % i for i in range(20)]
    with client.transaction() as txn:
        for row in rows:
            txn.set(EVENTS, row, "value", b"x")
    time.sleep(0.5)  # some runs are sleeping inside process() now
    assert first.terminate(timeout=60) == 0, first.output()
    second = WorkerProcess(
        url, ["run-logger"], tmp_path / "w2.log", plugin_dir=plugin_dir, threads=4
    ).wait_ready()
    wait_quiet(client, [EVENTS], workers=[second])
    assert second.terminate() == 0
    covered = runs(client.snapshot())
    assert set(covered) == set(rows)
    assert helpers.duplicate_runs(covered) == []
    assert helpers.uncovered(client, "run-logger", EVENTS, "value", rows) == []
    client.close()


def test_a_worker_with_no_loadable_observer_exits_with_a_clear_error(
    url: str, plugin_dir: Path
) -> None:
    result = run_cli(["worker", "--store", url, "--observer", "broken-import"], plugin_dir)
    assert result.returncode == 2
    assert "observer plugin 'broken-import': cannot load" in result.stderr
    assert "no observer plugin could be loaded" in result.stderr


def test_a_worker_given_an_observer_name_nobody_installed_registers_nothing(
    url: str, plugin_dir: Path
) -> None:
    """A name no package declares is a typo to fix, not an observer to leave out."""
    connect(url).close()
    args = ["worker", "--store", url, "--observer", "run-logger", "--observer", "run-loger"]
    result = run_cli(args, plugin_dir)
    assert result.returncode == 2
    assert "observer plugin 'run-loger': no such plugin" in result.stderr
    listed = run_cli(["observers", "list", "--store", url], plugin_dir)
    assert listed.returncode == 0 and listed.stdout == "", listed.stderr


def test_a_worker_whose_metrics_address_cannot_be_served_registers_nothing(
    url: str, plugin_dir: Path
) -> None:
    """The metrics endpoint is bound before any observer is registered: a registration
    nobody runs would leave every writer notifying for nothing."""
    connect(url).close()
    args = ["worker", "--store", url, "--observer", "run-logger"]
    result = run_cli([*args, "--metrics-host", "999.1.1.1", "--metrics-port", "0"], plugin_dir)
    assert result.returncode == 2
    assert "cannot serve metrics on 999.1.1.1:0" in result.stderr
    listed = run_cli(["observers", "list", "--store", url], plugin_dir)
    assert listed.returncode == 0 and listed.stdout == "", listed.stderr


def test_bad_worker_options_are_reported(url: str) -> None:
    result = run_cli(["worker", "--store", url, "--observer", "doc-index", "--threads", "0"])
    assert result.returncode == 2
    assert "argument --threads: '0' is out of range: expected an integer in [1, 256]" in (
        result.stderr
    )


def test_a_worker_with_an_unreachable_oracle_or_store_fails_at_start(url: str) -> None:
    connect(url).close()  # the store exists: what fails is the oracle
    result = run_cli(
        ["worker", "--store", url, "--observer", "doc-index", "--oracle", "grpc://127.0.0.1:1"]
    )
    assert result.returncode == 2, result.stderr
    assert "worker ready" not in result.stdout
    assert "no timestamp oracle among ['127.0.0.1:1'] answered" in result.stderr
    result = run_cli(["worker", "--store", "hbase://127.0.0.1:1", "--observer", "doc-index"])
    assert result.returncode == 2, result.stderr
    assert "cannot reach HBase Thrift gateway at 127.0.0.1:1" in result.stderr


def test_notifications_list_and_retry(url: str) -> None:
    client = connect(url)
    helpers.create_tables(client)
    lot = ParkingLot(client)
    lot.park("flaky", Notification(EVENTS, b"row-1", "flaky", 123), 5, "RuntimeError: nope")
    lot.park("always-fails", Notification(EVENTS, b"\xff\x00", "poison", 124), 5, "boom")

    listed = run_cli(["notifications", "list", "--store", url, "--json"])
    assert listed.returncode == 0, listed.stderr
    records = [json.loads(line) for line in listed.stdout.splitlines()]
    assert {(r["observer"], r["row_hex"]) for r in records} == {
        ("flaky", b"row-1".hex()),
        ("always-fails", "ff00"),
    }
    text = run_cli(["notifications", "list", "--store", url, "--observer", "flaky"])
    assert "flaky\tobs_events\trow-1\tflaky\tfailures=5\tRuntimeError: nope" in text.stdout
    # A filter naming nothing at all says so (a typo would look like "nothing parked").
    typo = run_cli(["notifications", "list", "--store", url, "--observer", "flakey"])
    assert typo.returncode == 0 and "note: no observer 'flakey' is registered" in typo.stderr
    assert "note:" not in text.stderr

    nothing = run_cli(["notifications", "retry", "--store", url])
    assert nothing.returncode == 2
    assert "--all" in nothing.stderr
    unmatched = run_cli(["notifications", "retry", "--store", url, "--row", "zzz"])
    assert unmatched.returncode == 1

    retried = run_cli(["notifications", "retry", "--store", url, "--row-hex", "ff00"])
    assert retried.returncode == 0, retried.stderr
    assert "retried always-fails" in retried.stdout
    # Nothing registers "always-fails" here: the notification waits for it, and that is said.
    assert (
        "note: observer 'always-fails' is not registered: its retried notifications run only "
        "once it is registered again" in retried.stderr
    )
    assert [r.observer for r in lot.records()] == ["flaky"]
    # A retried notification is back in the notify family, at a fresh timestamp.
    [(row, column, notify_ts)] = pending(client, EVENTS)
    assert (row, column) == (b"\xff\x00", "poison") and notify_ts > 124
    queued = run_cli(["notifications", "list", "--store", url, "--pending", "--table", EVENTS])
    assert "poison" in queued.stdout

    everything = run_cli(["notifications", "retry", "--store", url, "--all"])
    assert everything.returncode == 0
    assert lot.records() == []
    client.close()


def test_observers_register_list_and_unregister(url: str) -> None:
    # register sets up a deployment, so it may create the store, but only when asked to.
    args = ["observers", "register", "--store", url, "--observer", "doc-clusters"]
    refused = run_cli(args)
    assert refused.returncode == 2 and "does not exist" in refused.stderr
    registered = run_cli([*args, "--create"])
    assert registered.returncode == 0, registered.stderr
    assert "registered doc-clusters: documents body" in registered.stdout
    listed = run_cli(["observers", "list", "--store", url, "--json"])
    assert [json.loads(line) for line in listed.stdout.splitlines()] == [
        {"table": "documents", "column": "body", "observer": "doc-clusters", "weak": False}
    ]
    # Writes from now on notify: the registration returned after the refresh interval.
    client = connect(url)
    with client.transaction() as txn:
        txn.set("documents", b"http://x/", "body", b"hello")
    assert [r for r, _, _ in pending(client, "documents")] == [b"http://x/"]
    client.close()
    broken = run_cli(["observers", "register", "--store", url, "--observer", "nope"])
    assert broken.returncode == 2 and "observer plugin 'nope'" in broken.stderr
    removed = run_cli(["observers", "unregister", "--store", url, "doc-clusters"])
    assert removed.stdout.strip() == "unregistered doc-clusters: documents body"
    assert run_cli(["observers", "list", "--store", url]).stdout == ""
    assert run_cli(["observers", "unregister", "--store", url, "doc-clusters"]).returncode == 1
    forgot = run_cli(["observers", "forget", "--store", url, "doc-clusters"])
    assert forgot.returncode == 0, forgot.stderr
    assert forgot.stdout.strip() == "forgot observer doc-clusters: 0 ack(s) deleted"
    assert "documents: 0 ack(s) deleted" in forgot.stderr.splitlines()  # progress per table
    assert "no ack of observer 'doc-clusters' was found in any table" in forgot.stderr
    assert run_cli(["observers", "forget", "--store", url, "no/such"]).returncode == 2


NO_OBSERVERS_INSTALLED = (
    "no observer plugin is installed (entry-point group 'percolator.observers')"
)


def test_the_engine_registers_no_observer() -> None:
    engine = importlib.metadata.distribution(percolator.DISTRIBUTION)
    assert [ep for ep in engine.entry_points if ep.group == plugins.GROUP] == []


def _without_observer_plugins(
    original: Callable[..., Any],
) -> Callable[..., Any]:
    def entry_points(**params: Any) -> Any:
        if params.get("group") == plugins.GROUP:
            return []
        return original(**params)

    return entry_points


def test_a_worker_with_no_observer_installed_says_so_and_exits(
    url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(
        importlib.metadata,
        "entry_points",
        _without_observer_plugins(importlib.metadata.entry_points),
    )
    assert cli.main(["worker", "--store", url]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"percolator: error: {NO_OBSERVERS_INSTALLED}; install a package")
    assert len(err.splitlines()) == 1


def test_a_worker_process_with_no_observer_installed_exits(url: str) -> None:
    # The whole command in a fresh interpreter whose plugin discovery finds no observer.
    code = (
        "import importlib.metadata as m, sys\n"
        "original = m.entry_points\n"
        "m.entry_points = lambda **p: [] if p.get('group') == 'percolator.observers' "
        "else original(**p)\n"
        "from percolator.cli import main\n"
        f"sys.exit(main(['worker', '--store', {url!r}]))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=PROJECT_ROOT,
        env=cli_env(None),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert NO_OBSERVERS_INSTALLED in result.stderr
    assert "worker ready" not in result.stdout


def test_worker_partitioned_flags(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    parser = cli.load_commands().parser
    args = parser.parse_args(["worker", "--partitioned", "--key-groups", "8", "--lease-ms", "500"])
    assert (args.partitioned, args.key_groups, args.lease_ms) == (True, 8, 500)
    assert parser.parse_args(["worker"]).partitioned is False
    with pytest.raises(SystemExit) as exit_info:  # a usage error, from the option's type
        cli.main(
            [
                "worker",
                "--store",
                f"embedded:{tmp_path / 's'}",
                "--create",
                "--partitioned",
                "--lease-ms",
                "10",
            ]
        )
    assert exit_info.value.code == 2
    assert "argument --lease-ms: '10' is out of range: expected an integer >= 100" in (
        capsys.readouterr().err
    )
    # Without --partitioned they would be ignored: refused, before anything is opened.
    store = tmp_path / "never"
    assert cli.main(["worker", "--store", f"embedded:{store}", "--key-groups", "8"]) == 2
    assert "--key-groups apply to --partitioned workers only" in capsys.readouterr().err
    assert not store.exists()


def test_worker_batch_flag_defaults_to_the_workers_batch_size(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """``--batch`` left out means the worker's default, which its help names; ``--batch 0``
    is refused by the option's type."""
    parser = cli.load_commands().parser
    assert parser.parse_args(["worker"]).batch is None
    assert parser.parse_args(["worker", "--batch", "1"]).batch == 1
    with pytest.raises(SystemExit):
        parser.parse_args(["worker", "--help"])
    assert f"(default {DEFAULT_BATCH_SIZE};" in " ".join(capsys.readouterr().out.split())
    store = f"embedded:{tmp_path / 's'}"
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["worker", "--store", store, "--create", "--batch", "0"])
    assert exit_info.value.code == 2
    assert "argument --batch: '0' is out of range: expected an integer >= 1" in (
        capsys.readouterr().err
    )

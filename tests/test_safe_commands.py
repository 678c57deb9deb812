"""Commands that read a deployment (or clean up in it) never create one: a missing store,
``memory:`` in a fresh process, an empty store or a wrong HBase prefix is one clear error
line and exit code 2, and afterwards nothing exists that did not exist before.  The worker
and ``observers register`` create a store only with ``--create``; ``gc``, ``export`` and
``backfill --forget`` never."""

from __future__ import annotations

import json
import os
import sqlite3
import uuid
from pathlib import Path

import pytest
from percolator.observers.api import Observer, register_observers
from percolator.observers.parking import ParkingLot

import percolator
from percolator.cli import main
from percolator.layout import META_TABLE
from percolator.notifications import Notification
from percolator.store import open_store
from percolator.store.backends import with_table_prefix
from percolator.store.embedded import DB_FILE
from percolator.transaction import Transaction
from tests.observers.procs import WorkerProcess

#: every command that only reads, or changes only what already exists: (command, options)
SAFE_COMMANDS = {
    "status": (["status"], []),
    "status --json": (["status"], ["--json"]),
    "inspect": (["inspect"], ["t"]),
    "observers list": (["observers", "list"], []),
    "observers unregister": (["observers", "unregister"], ["someone"]),
    "notifications list": (["notifications", "list"], []),
    "notifications list --pending": (["notifications", "list"], ["--pending", "--table", "t"]),
    "notifications retry": (["notifications", "retry"], ["--all"]),
    "worker": (["worker"], ["--observer", "doc-index"]),
    "observers register": (["observers", "register"], ["--observer", "doc-index"]),
    "gc": (["gc"], ["--life-time", "0"]),
    "watermarks": (["watermarks"], []),
    "wait": (["wait"], ["--timeout", "1"]),
    "catch-up": (["catch-up"], ["doc-index"]),
    "export": (["export"], ["--table", "t", "--output", "never-written.parquet"]),
    "backfill --forget": (
        ["backfill"],
        ["in.json", "--table", "t", "--key", "k", "--forget", "--job-id", "j"],
    ),
}


def command_line(command: str, store_url: str) -> list[str]:
    words, options = SAFE_COMMANDS[command]
    return [*words, "--store", store_url, *options]


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("percolator: error: "), err
    return lines[0]


@pytest.mark.parametrize("command", sorted(SAFE_COMMANDS))
def test_a_missing_store_is_an_error_and_stays_missing(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nowhere"
    argv = command_line(command, f"embedded:{missing}")
    code, out, err = run(argv, capsys)
    assert code == 2
    assert "does not exist" in one_error_line(err)
    assert out == ""
    assert not missing.exists()


@pytest.mark.parametrize("command", sorted(SAFE_COMMANDS))
def test_memory_is_refused_in_a_fresh_process(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = command_line(command, f"memory:never-made-{uuid.uuid4().hex}")
    code, _, err = run(argv, capsys)
    assert code == 2
    assert "memory: store lives inside one process" in one_error_line(err)


@pytest.mark.parametrize("command", sorted(SAFE_COMMANDS))
def test_an_empty_store_is_an_error_and_stays_empty(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"embedded:{tmp_path / 'empty'}"
    open_store(url).close()  # a store file with no table in it
    argv = command_line(command, url)
    code, _, err = run(argv, capsys)
    assert code == 2
    assert f"is empty (no table {META_TABLE!r})" in one_error_line(err)
    store = open_store(url, create=False)
    try:
        assert store.list_tables() == []
    finally:
        store.close()


def _empty_file(path: Path) -> None:
    path.write_bytes(b"")


def _another_sqlite_database(path: Path) -> None:
    # The default journal mode: opening it as a store would switch it to WAL, which
    # rewrites its header.
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE theirs (x)")
    db.execute("INSERT INTO theirs VALUES (1)")
    db.commit()
    db.close()


def _not_sqlite(path: Path) -> None:
    path.write_bytes(b"not a database at all\n" * 100)


#: files a store URL may point at that hold no store: (where, how to make the file); where
#: "url" is the file the URL names itself, "db" the store's database file in its directory
NOT_A_STORE = {
    "a 0-byte file named by the URL": ("url", _empty_file),
    "a 0-byte database file": ("db", _empty_file),
    "another SQLite database": ("db", _another_sqlite_database),
    "a file that is not SQLite": ("db", _not_sqlite),
}


@pytest.mark.parametrize("kind", sorted(NOT_A_STORE))
@pytest.mark.parametrize("command", sorted(SAFE_COMMANDS))
def test_a_file_that_is_not_a_store_is_refused_and_left_as_it_was(
    command: str, kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    where, make = NOT_A_STORE[kind]
    directory = tmp_path / "store"
    directory.mkdir()
    path = directory / ("x.db" if where == "url" else DB_FILE)
    make(path)
    before = path.read_bytes()
    url = f"embedded:{path if where == 'url' else directory}"
    code, out, err = run(command_line(command, url), capsys)
    assert code == 2
    assert str(directory) in one_error_line(err)  # it names the path
    assert out == ""
    assert path.read_bytes() == before
    assert os.listdir(directory) == [path.name]  # no -wal, -shm or -journal left either


def test_the_worker_never_creates_the_default_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    for name in ("PERCOLATOR_STORE", "PERCOLATOR_CONFIG", "PERCOLATOR_WORKER_CREATE"):
        monkeypatch.delenv(name, raising=False)
    code, _, err = run(["worker", "--observer", "doc-index"], capsys)
    assert code == 2
    assert "does not exist" in one_error_line(err) and "pass --create" in err
    assert not (tmp_path / "percolator-data").exists()


def test_the_worker_creates_a_store_when_asked(tmp_path: Path) -> None:
    url = f"embedded:{tmp_path / 'new'}"
    worker = WorkerProcess(
        url, ["doc-index"], tmp_path / "worker.log", plugin_dir=None, extra_args=["--create"]
    ).wait_ready()
    assert worker.terminate() == 0, worker.output()
    store = open_store(url, create=False)
    try:
        assert store.table_exists(META_TABLE)
    finally:
        store.close()


@pytest.mark.hbase
@pytest.mark.parametrize(
    "command",
    ["status", "observers list", "notifications list", "worker", "observers register", "gc"],
)
def test_a_wrong_hbase_prefix_is_reported_and_nothing_is_created(
    command: str, hbase_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    prefix = f"nope{uuid.uuid4().hex[:8]}_"
    url = with_table_prefix(hbase_url, prefix)
    argv = command_line(command, url)
    code, _, err = run(argv, capsys)
    assert code == 2
    line = one_error_line(err)
    assert f"no table {META_TABLE!r} under the table prefix {prefix!r}" in line
    assert "?prefix=" in line
    store = open_store(url, create=False)
    try:
        assert store.list_tables() == []
    finally:
        store.close()


# ------------------------------------------------------------------ bad input and --json


class Watcher(Observer):
    name = "safe-watcher"
    table = "t"
    columns = ("c",)

    def process(self, txn: Transaction, row: bytes, column: str) -> None:
        raise AssertionError("not run in this test")


@pytest.fixture
def deployment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """An embedded store with one observed column, a pending and a parked notification."""
    monkeypatch.setenv("PERCOLATOR_OBSERVED_REFRESH_MS", "50")
    url = f"embedded:{tmp_path / 'store'}"
    with percolator.connect(url) as client:
        client.create_table("t")
        register_observers(client, [Watcher()])
        with client.transaction() as txn:
            txn.set("t", b"r1", "c", b"x")
            txn.set("t", b"r2", "c", b"y")
        # r2's own notification is parked (one of an older change would leave it pending).
        assert txn.commit_ts is not None
        ParkingLot(client).park(
            "safe-watcher", Notification("t", b"r2", "c", txn.commit_ts), 5, "b"
        )
    return url


def test_json_output_of_the_listings(deployment: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["observers", "list", "--store", deployment, "--json"], capsys)
    assert code == 0
    assert [json.loads(line) for line in out.splitlines()] == [
        {"table": "t", "column": "c", "observer": "safe-watcher", "weak": False}
    ]
    code, out, _ = run(["notifications", "list", "--store", deployment, "--json"], capsys)
    assert code == 0
    (parked,) = [json.loads(line) for line in out.splitlines()]
    assert (parked["observer"], parked["table"], parked["column"]) == ("safe-watcher", "t", "c")
    assert parked["failures"] == 5
    code, out, _ = run(
        ["notifications", "list", "--store", deployment, "--pending", "--table", "t", "--json"],
        capsys,
    )
    assert code == 0
    assert sorted(json.loads(line)["row"] for line in out.splitlines()) == ["r1", "r2"]
    code, out, _ = run(["status", "--store", deployment, "--json"], capsys)
    assert code == 1  # the parked notification is a problem
    report = json.loads(out)
    assert report["notifications"]["observers"] == [
        {
            "observer": "safe-watcher",
            "table": "t",
            "column": "c",
            "pending": 1,
            "parked": 1,
            "live_workers": 0,
        }
    ]
    assert report["problems"] == ["1 parked notification(s) of observer 'safe-watcher'"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["status", "--table", "nope"], "no such percolator table 'nope'"),
        (["notifications", "list", "--pending"], "--pending needs --table"),
        (["notifications", "retry", "--row", "a", "--row-hex", "61"], "not both"),
        (["notifications", "retry", "--row-hex", "zz"], "is not hexadecimal"),
        (["notifications", "retry"], "or pass --all"),
    ],
)
def test_bad_input_is_one_line(
    argv: list[str], message: str, deployment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    position = 2 if argv[0] == "notifications" else 1
    full = [*argv[:position], "--store", deployment, *argv[position:]]
    code, out, err = run(full, capsys)
    assert code == 2
    assert message in one_error_line(err)
    assert out == ""


def test_an_out_of_range_number_is_a_usage_error(
    deployment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["status", "--store", deployment, "--scan-limit", "0"])
    assert exit_info.value.code == 2
    assert "argument --scan-limit: '0' is out of range: expected an integer >= 1" in (
        capsys.readouterr().err
    )


def test_an_unknown_flag_is_a_usage_error(
    deployment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["observers", "list", "--store", deployment, "--bogus"])
    assert exit_info.value.code == 2
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err


def test_create_comes_from_the_environment_and_the_config_file(tmp_path: Path) -> None:
    from tests.test_config import parse

    assert parse(["worker"]).create is False
    assert parse(["worker"], environ={"PERCOLATOR_WORKER_CREATE": "1"}).create is True
    text = "[worker]\ncreate = true\n"
    assert parse(["worker"], file_text=text, tmp_path=tmp_path).create is True
    assert parse(["observers", "register", "--observer", "x", "--create"]).create is True

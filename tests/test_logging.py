"""Logging options of the command line: validated levels, text or JSON lines, with the
fields log calls pass through ``extra=``; global options before or after the command."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import percolator
from percolator import cli, failpoints
from percolator.cli import JsonFormatter, TextFormatter, main
from tests.observers.procs import WorkerProcess
from tests.test_config import parse


@pytest.fixture(autouse=True)
def restore_root_logger() -> Iterator[None]:
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield
    root.setLevel(level)
    root.handlers[:] = handlers


def record(message: str = "hello %s", *args: object, **extra: object) -> logging.LogRecord:
    made = logging.LogRecord(
        "percolator.committer", logging.WARNING, __file__, 1, message, args or ("world",), None
    )
    for key, value in extra.items():
        setattr(made, key, value)
    return made


def test_json_lines_carry_the_extra_fields() -> None:
    line = JsonFormatter().format(record(start_ts=12, commit_ts=34, observer="doc-index"))
    assert "\n" not in line
    doc = json.loads(line)
    assert doc["message"] == "hello world"
    assert (doc["level"], doc["logger"]) == ("WARNING", "percolator.committer")
    assert (doc["start_ts"], doc["commit_ts"], doc["observer"]) == (12, 34, "doc-index")
    assert doc["time"].endswith("Z") and "thread" in doc
    assert "args" not in doc and "msg" not in doc  # the record's own attributes stay out


def test_json_lines_hold_the_traceback_and_odd_values() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        made = record(row=b"\xff", exc_info=sys.exc_info())
    doc = json.loads(JsonFormatter().format(made))
    assert "ValueError: boom" in doc["exception"]
    assert doc["row"] == str(b"\xff")


def test_text_lines_show_the_extra_fields() -> None:
    text = TextFormatter().format(record(start_ts=12))
    assert text.endswith("WARNING percolator.committer: hello world [start_ts=12]")


@pytest.mark.parametrize(
    "argv",
    [
        ["--log-level", "LOUD", "status"],
        ["status", "--log-level", "LOUD"],
        ["status", "--log-format", "xml"],
    ],
)
def test_bad_logging_options_are_usage_errors(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice" in err and ("'LOUD'" in err or "'xml'" in err)


def test_a_bad_level_in_the_environment_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PERCOLATOR_LOG_LEVEL", "chatty")
    assert main(["status", "--store", "memory:"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "percolator: error: PERCOLATOR_LOG_LEVEL: bad value 'chatty' for --log-level: "
        "choose from DEBUG, INFO, WARNING, ERROR, CRITICAL"
    )


def test_levels_and_formats_from_flags_environment_and_file(tmp_path: Path) -> None:
    assert parse(["worker", "--log-level", "debug"]).log_level == "DEBUG"
    assert parse(["--log-level", "error", "gc"]).log_level == "ERROR"
    assert not hasattr(parse(["gc"]), "log_format") or parse(["gc"]).log_format is None
    environ = {"PERCOLATOR_LOG_FORMAT": "json", "PERCOLATOR_LOG_LEVEL": "info"}
    args = parse(["status"], environ=environ)
    assert (args.log_format, args.log_level) == ("json", "INFO")
    text = '[defaults]\nlog-format = "json"\n[worker]\nlog-level = "warning"\n'
    args = parse(["worker"], file_text=text, tmp_path=tmp_path)
    assert (args.log_format, args.log_level) == ("json", "WARNING")
    # The per-command environment variable beats the shared one.
    environ = {"PERCOLATOR_LOG_LEVEL": "info", "PERCOLATOR_WORKER_LOG_LEVEL": "error"}
    assert parse(["worker"], environ=environ).log_level == "ERROR"


def test_a_flag_before_the_command_beats_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PERCOLATOR_LOG_LEVEL", "critical")
    url = f"embedded:{tmp_path / 'store'}"
    percolator.connect(url).close()
    chosen: list[tuple[str, str]] = []
    real = cli.configure_logging

    def record(level: str, log_format: str = "text") -> None:
        chosen.append((level, log_format))
        real(level, log_format)

    monkeypatch.setattr(cli, "configure_logging", record)
    root = logging.getLogger()
    before = (root.level, list(root.handlers))
    assert main(["--log-level", "debug", "observers", "list", "--store", url]) == 0
    assert main(["observers", "list", "--store", url, "--log-format", "json"]) == 0
    assert chosen == [("DEBUG", "text"), ("CRITICAL", "json")]
    # In-process runs leave the logging configuration as they found it.
    assert (root.level, list(root.handlers)) == before


def test_long_running_commands_default_to_info(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("PERCOLATOR_LOG_LEVEL", "PERCOLATOR_WORKER_LOG_LEVEL"):
        monkeypatch.delenv(name, raising=False)
    worker = parse(["worker"])
    assert getattr(worker, "log_level", None) is None and worker.default_log_level == "INFO"
    serve = parse(["oracle", "serve", "--store", "memory:"])
    assert serve.default_log_level == "INFO"
    assert not hasattr(parse(["status"]), "default_log_level")  # WARNING


def test_engine_warnings_in_json_name_their_transaction(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cli.configure_logging("WARNING", "json")
    with percolator.connect(f"embedded:{tmp_path / 'store'}") as client:
        client.create_table("t")
        txn = client.transaction()
        txn.set("t", b"a", "c", b"1")
        txn.set("t", b"b", "c", b"2")
        failpoints.enable("commit.after_secondaries", "raise")
        try:
            txn.commit()
        finally:
            failpoints.disable()
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    (warning,) = [line for line in lines if line["logger"] == "percolator.committer"]
    assert warning["start_ts"] == txn.start_ts
    assert warning["commit_ts"] > txn.start_ts
    assert "finishing its secondaries failed" in warning["message"]


def test_a_worker_logs_json_lines(tmp_path: Path) -> None:
    worker = WorkerProcess(
        f"embedded:{tmp_path / 'store'}",
        ["doc-index"],
        tmp_path / "worker.log",
        plugin_dir=None,
        extra_args=["--create", "--log-format", "json", "--log-level", "info"],
    ).wait_ready()
    assert worker.terminate() == 0
    logged = [line for line in worker.output().splitlines() if line.startswith("{")]
    assert logged, worker.output()
    docs = [json.loads(line) for line in logged]
    assert all(doc["level"] in ("INFO", "WARNING") for doc in docs)
    assert any(doc["logger"].startswith("percolator.observers") for doc in docs)

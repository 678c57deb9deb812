"""Flags, environment and config file: precedence, validation and one-line errors."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
from collections.abc import Mapping
from pathlib import Path

import pytest

import percolator
from percolator import config
from percolator.cli import build_parser
from percolator.errors import ConfigError
from tests.cli_process import run_percolator


def parse(
    argv: list[str],
    *,
    environ: Mapping[str, str] | None = None,
    file_text: str | None = None,
    tmp_path: Path | None = None,
) -> argparse.Namespace:
    """What ``percolator ARGV`` would hand to its command, without running it."""
    parser = build_parser()
    path = None
    if file_text is not None:
        assert tmp_path is not None
        path = tmp_path / "percolator.toml"
        path.write_text(file_text)
    command = config.command_path(parser, argv)
    settings = config.resolve(parser, command, config_path=path, environ=environ or {})
    config.warn_unknown_environment(parser, environ or {})
    fill = config.apply(parser, command, settings)
    args = parser.parse_args(argv)
    fill(args)
    return args


def test_defaults_without_settings() -> None:
    args = parse(["worker"])
    assert args.threads is None  # by the store: WorkerOptions.for_store
    assert args.store == "embedded:./percolator-data"
    assert args.oracle is None


def test_file_sets_shared_and_command_options(tmp_path: Path) -> None:
    text = (
        '[defaults]\nstore = "hbase://db:9090"\noracle = "grpc://o:7070"\n'
        '[worker]\nthreads = 8\nobserver = ["doc-index"]\n'
    )
    args = parse(["worker"], file_text=text, tmp_path=tmp_path)
    assert (args.store, args.oracle, args.threads, args.observer) == (
        "hbase://db:9090",
        "grpc://o:7070",
        8,
        ["doc-index"],
    )
    # The shared store applies to other commands too; the worker table does not.
    gc = parse(["gc"], file_text=text, tmp_path=tmp_path)
    assert gc.store == "hbase://db:9090"
    assert gc.life_time == 600.0


def test_environment_beats_file_and_flag_beats_environment(tmp_path: Path) -> None:
    text = '[defaults]\nstore = "hbase://file:1"\n[worker]\nthreads = 8\n'
    env = {"PERCOLATOR_STORE": "hbase://env:2", "PERCOLATOR_WORKER_THREADS": "6"}
    args = parse(["worker"], environ=env, file_text=text, tmp_path=tmp_path)
    assert (args.store, args.threads) == ("hbase://env:2", 6)
    args = parse(
        ["worker", "--threads", "2", "--store", "memory:"],
        environ=env,
        file_text=text,
        tmp_path=tmp_path,
    )
    assert (args.store, args.threads) == ("memory:", 2)


def test_repeatable_flag_replaces_the_file_list(tmp_path: Path) -> None:
    text = '[worker]\nobserver = ["doc-index", "doc-clusters"]\n'
    args = parse(["worker", "--observer", "doc-inlinks"], file_text=text, tmp_path=tmp_path)
    assert args.observer == ["doc-inlinks"]


def test_shared_defaults_and_the_oracle_command_tables_coexist(tmp_path: Path) -> None:
    text = (
        '[defaults]\nstore = "memory:"\noracle = "grpc://o:7070"\n'
        '[oracle.serve]\nlisten = "0.0.0.0:7070"\n[worker]\nthreads = 3\n'
    )
    serve = parse(["oracle", "serve"], file_text=text, tmp_path=tmp_path)
    assert (serve.store, serve.listen) == ("memory:", "0.0.0.0:7070")
    worker = parse(["worker"], file_text=text, tmp_path=tmp_path)
    assert (worker.oracle, worker.threads) == ("grpc://o:7070", 3)


def test_nested_command_table_and_required_option(tmp_path: Path) -> None:
    text = '[oracle.serve]\nstore = "memory:"\nlisten = "0.0.0.0:7171"\n'
    args = parse(["oracle", "serve"], file_text=text, tmp_path=tmp_path)
    assert (args.store, args.listen) == ("memory:", "0.0.0.0:7171")
    env = {"PERCOLATOR_ORACLE_SERVE_LISTEN": "127.0.0.1:7272", "PERCOLATOR_STORE": "memory:"}
    args = parse(["oracle", "serve"], environ=env)
    assert (args.store, args.listen) == ("memory:", "127.0.0.1:7272")


def test_boolean_from_environment() -> None:
    assert parse(["gc"], environ={"PERCOLATOR_GC_JSON": "yes"}).json is True
    assert parse(["gc"], environ={"PERCOLATOR_GC_JSON": "0"}).json is False
    with pytest.raises(ConfigError, match="PERCOLATOR_GC_JSON: bad value 'maybe' for --json"):
        parse(["gc"], environ={"PERCOLATOR_GC_JSON": "maybe"})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[wroker]\nthreads = 2\n", r"unknown command table \[wroker\]"),
        ("[worker]\nthread = 2\n", r"\[worker\] has no option 'thread'"),
        ("threads = 2\n", "'threads' outside a table; shared settings go in"),
        ("[defaults]\nthreads = 2\n", r"\[defaults\] has no option 'threads'"),
        ('[worker]\nthreads = "many"\n', r"\[worker\]: bad value 'many' for --threads"),
        ("[worker]\nthreads = [1, 2]\n", "expected a single value"),
        ('[oracle]\nlisten = "x"\n', r"\[oracle\] is a group of commands"),
        ("store = \n", "not valid TOML"),
    ],
)
def test_bad_file_is_one_clear_error(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse(["gc"], file_text=text, tmp_path=tmp_path)


def test_bad_environment_value_names_the_variable() -> None:
    with pytest.raises(ConfigError, match="PERCOLATOR_WORKER_THREADS: bad value 'x'"):
        parse(["worker"], environ={"PERCOLATOR_WORKER_THREADS": "x"})


def test_command_path_skips_option_values() -> None:
    parser = build_parser()
    assert config.command_path(parser, ["--config", "x.toml", "oracle", "serve"]) == (
        "oracle",
        "serve",
    )
    assert config.command_path(parser, ["worker", "--threads", "3"]) == ("worker",)
    assert config.command_path(parser, ["nonsense"]) == ()
    # abbreviated global options and their values, before and between the commands
    assert config.command_path(parser, ["--log-l", "debug", "oracle", "serve"]) == (
        "oracle",
        "serve",
    )
    assert config.command_path(parser, ["oracle", "--conf=x.toml", "serve"]) == (
        "oracle",
        "serve",
    )


def run_cli(args: list[str], cwd: Path, env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    return run_percolator(args, env, cwd=cwd)


def test_cli_reads_percolator_toml_from_the_working_directory(tmp_path: Path) -> None:
    store = tmp_path / "data"
    (tmp_path / "percolator.toml").write_text(
        f'[defaults]\nstore = "embedded:{store}"\n[gc]\njson = true\n'
    )
    percolator.connect(f"embedded:{store}").close()  # gc never creates a store
    result = run_cli(["gc"], tmp_path, {})
    # The store came from the file: gc refuses a store that does not exist (./percolator-data).
    assert result.returncode == 0, result.stderr
    assert result.stdout.lstrip().startswith("{")  # --json came from the file


def test_cli_bad_config_is_one_line_exit_2(tmp_path: Path) -> None:
    (tmp_path / "bad.toml").write_text("[worker]\nthread = 2\n")
    result = run_cli(["--config", "bad.toml", "gc"], tmp_path, {})
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "has no option 'thread'" in lines[0], result.stderr
    result = run_cli(["gc"], tmp_path, {"PERCOLATOR_CONFIG": str(tmp_path / "missing.toml")})
    assert result.returncode == 2
    assert "missing.toml" in result.stderr and "does not exist" in result.stderr
    result = run_cli(["--config", str(tmp_path), "gc"], tmp_path, {})
    assert result.returncode == 2
    assert f"config file '{tmp_path}' (from --config) is a directory" in result.stderr
    result = run_cli(["--config", "/dev/null", "gc"], tmp_path, {})
    assert result.returncode == 2
    assert "config file '/dev/null' (from --config) is not a regular file" in result.stderr


def test_the_example_in_the_operations_guide_is_valid(tmp_path: Path) -> None:
    import re

    guide = (Path(__file__).resolve().parent.parent / "docs" / "operations.md").read_text()
    match = re.search(r"```toml\n(.*?)```", guide, re.S)
    assert match is not None
    worker = parse(["worker"], file_text=match.group(1), tmp_path=tmp_path)
    assert worker.threads == 8 and worker.oracle.startswith("grpc://")
    serve = parse(["oracle", "serve"], file_text=match.group(1), tmp_path=tmp_path)
    assert serve.listen == "0.0.0.0:7070"


def test_config_after_the_command(tmp_path: Path) -> None:
    """``--config`` is accepted after the command too (and the last one given wins)."""
    store = tmp_path / "data"
    (tmp_path / "after.toml").write_text(
        f'[defaults]\nstore = "embedded:{store}"\n[gc]\njson = true\n'
    )
    (tmp_path / "bad.toml").write_text("[worker]\nthread = 2\n")
    percolator.connect(f"embedded:{store}").close()  # gc never creates a store
    result = run_cli(["gc", "--config", "after.toml"], tmp_path, {})
    assert result.returncode == 0, result.stderr
    assert result.stdout.lstrip().startswith("{")  # --json came from the file
    result = run_cli(["--config", "bad.toml", "gc", "--config=after.toml"], tmp_path, {})
    assert result.returncode == 0, result.stderr
    result = run_cli(
        ["oracle", "--config", "bad.toml", "info", "--oracle", "grpc://h:1"], tmp_path, {}
    )
    assert result.returncode == 2 and "has no option 'thread'" in result.stderr


def test_config_is_an_option_of_the_command_line_not_of_the_file(tmp_path: Path) -> None:
    args = parse(["worker", "--config", "x.toml"])
    assert args.config == "x.toml"
    # The command's own --config has no default that would hide one given before it.
    assert parse(["--config", "y.toml", "worker"]).config == "y.toml"
    with pytest.raises(ConfigError, match=r"\[gc\] has no option 'config'"):
        parse(["gc"], file_text='[gc]\nconfig = "other.toml"\n', tmp_path=tmp_path)


# ------------------------------------------------------------ empty and unknown variables


@pytest.mark.parametrize(
    ("name", "value", "flag"),
    [
        ("PERCOLATOR_STORE", "", "--store"),
        ("PERCOLATOR_STORE", "  ", "--store"),
        ("PERCOLATOR_ORACLE", "", "--oracle"),
        ("PERCOLATOR_LOG_LEVEL", " ", "--log-level"),
        ("PERCOLATOR_LOG_FORMAT", "", "--log-format"),
        ("PERCOLATOR_GC_STORE", "", "--store"),
        ("PERCOLATOR_GC_TABLE", "", "--table"),
        ("PERCOLATOR_GC_LIFE_TIME", "\t", "--life-time"),
    ],
)
def test_a_variable_set_to_nothing_is_an_error_naming_it(name: str, value: str, flag: str) -> None:
    """Set but empty is a mistake (``$STORE`` expanded unset), never "use the default"."""
    message = f"{name}: bad value {value!r} for {flag}: empty; unset {name} to use the default"
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        parse(["gc"], environ={name: value})


def test_an_empty_config_file_name_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A ./percolator.toml is there: an empty name must not fall back to it silently.
    monkeypatch.chdir(tmp_path)
    (tmp_path / config.DEFAULT_CONFIG_FILE).write_text("[gc]\njson = true\n")
    assert config.find_config_file(None, {}) == Path(config.DEFAULT_CONFIG_FILE)
    for value in ("", " "):
        with pytest.raises(ConfigError, match=r"^PERCOLATOR_CONFIG: empty config file name"):
            config.find_config_file(None, {"PERCOLATOR_CONFIG": value})
        with pytest.raises(ConfigError, match=r"^--config: empty config file name"):
            config.find_config_file(value, {})


def test_cli_empty_store_variable_is_one_line_exit_2(tmp_path: Path) -> None:
    result = run_cli(["gc"], tmp_path, {"PERCOLATOR_STORE": ""})
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "percolator: error: PERCOLATOR_STORE: bad value '' for --store: empty; "
        "unset PERCOLATOR_STORE to use the default"
    ]


def test_a_misspelt_variable_is_a_warning_naming_the_closest_name(
    caplog: pytest.LogCaptureFixture,
) -> None:
    env = {"PERCOLATOR_STOER": "hbase://db:9090", "PERCOLATOR_GC_LIFETIME": "60"}
    with caplog.at_level("WARNING", logger="percolator.config"):
        args = parse(["gc"], environ=env)
    assert args.store == "embedded:./percolator-data" and args.life_time == 600.0  # ignored
    assert [r.getMessage() for r in caplog.records if r.name == "percolator.config"] == [
        "unknown environment variable PERCOLATOR_GC_LIFETIME "
        "(did you mean PERCOLATOR_GC_LIFE_TIME?): ignored",
        "unknown environment variable PERCOLATOR_STOER (did you mean PERCOLATOR_STORE?): ignored",
    ]
    assert all(r.levelname == "WARNING" for r in caplog.records)


def test_known_variables_draw_no_warning_and_a_far_name_no_hint(
    caplog: pytest.LogCaptureFixture,
) -> None:
    env = {
        # another command's option, a variable read outside the command line, the test
        # suite's, and a variable of another program
        "PERCOLATOR_WORKER_THREADS": "4",
        "PERCOLATOR_ORACLE_TOKEN": "secret",
        "PERCOLATOR_FAILPOINTS": "",
        "PERCOLATOR_TEST_HBASE_URL": "hbase://h:1",
        "PATH": "/bin",
        "PERCOLATOR_ZZZZZZZZZZZZZZZZZZZZ": "1",
    }
    with caplog.at_level("WARNING", logger="percolator.config"):
        parse(["gc"], environ=env)
    assert [r.getMessage() for r in caplog.records] == [
        "unknown environment variable PERCOLATOR_ZZZZZZZZZZZZZZZZZZZZ: ignored"
    ]


def test_cli_warns_of_a_misspelt_variable_and_runs(tmp_path: Path) -> None:
    store = tmp_path / "data"
    percolator.connect(f"embedded:{store}").close()
    env = {"PERCOLATOR_GC_STORE": f"embedded:{store}", "PERCOLATOR_STOER": "memory:"}
    result = run_cli(["gc", "--json"], tmp_path, env)
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if "PERCOLATOR_STOER" in line]
    assert len(lines) == 1 and "did you mean PERCOLATOR_STORE?" in lines[0], result.stderr


def test_the_warning_takes_the_chosen_log_format(tmp_path: Path) -> None:
    store = tmp_path / "data"
    percolator.connect(f"embedded:{store}").close()
    env = {"PERCOLATOR_GC_STORE": f"embedded:{store}", "PERCOLATOR_STOER": "memory:"}
    result = run_cli(["--log-format", "json", "gc", "--json"], tmp_path, env)
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if "PERCOLATOR_STOER" in line]
    assert len(lines) == 1, result.stderr
    record = json.loads(lines[0])
    assert record["level"] == "WARNING" and "did you mean PERCOLATOR_STORE?" in record["message"]


# Where the tool's code lives (pyproject's package-dir) and the scripts that run it.
SOURCE_DIRS = ("percolator", "oracle", "observers", "spark_jobs", "bench", "examples", "tools")


def test_every_variable_the_sources_name_is_known() -> None:
    """The known names have one home (config.OTHER_ENVIRONMENT and the options): a variable
    read anywhere else and not added there would draw the warning on every run."""
    root = Path(__file__).resolve().parent.parent
    known = config.known_environment(build_parser())
    missing: dict[str, str] = {}
    for folder in SOURCE_DIRS:
        for path in sorted((root / folder).rglob("*.py")):
            if path == root / "percolator" / "config.py":  # the list itself, and its examples
                continue
            for name in re.findall(r"PERCOLATOR_[A-Z0-9_]*[A-Z0-9]", path.read_text()):
                if name not in known and not name.startswith(config.TEST_ENV_PREFIX):
                    missing.setdefault(name, str(path.relative_to(root)))
    assert missing == {}, "add these to percolator.config.OTHER_ENVIRONMENT"


def test_the_operations_guide_lists_every_variable_read_outside_the_options() -> None:
    guide = (Path(__file__).resolve().parent.parent / "docs" / "operations.md").read_text()
    assert [name for name in config.OTHER_ENVIRONMENT if f"`{name}`" not in guide] == []
    assert "did you mean PERCOLATOR_STORE?" in guide


def _plugin_shaped_parser() -> argparse.ArgumentParser:
    """A command line with the argument shapes a command plugin may use."""
    parser = argparse.ArgumentParser(prog="percolator")
    parser.add_argument("--config")
    parser.add_argument("--log-level")
    commands = parser.add_subparsers(dest="command", required=True)
    group = commands.add_parser("grp")
    group.add_argument("--tags", nargs="*")
    group.add_argument("--pair", nargs=2)
    group.add_argument("--opt", nargs="?", const="C")
    group_commands = group.add_subparsers(dest="grp_command", required=True)
    subparsers = [group, group_commands.add_parser("run"), group_commands.add_parser("stop")]
    named = commands.add_parser("gpos")
    named.add_argument("name")
    subparsers += [named, named.add_subparsers(dest="gpos_command").add_parser("run")]
    wrapper = commands.add_parser("rem")
    wrapper.add_argument("prog")
    wrapper.add_argument("rest", nargs=argparse.REMAINDER)
    subparsers.append(wrapper)
    short = commands.add_parser("shortc")  # a command with a -c/--config of its own
    short.add_argument("-c", "--config", default=argparse.SUPPRESS)
    short.add_argument("-v", action="store_true")
    # As the command line does: the global options on every parser below the top.
    for subparser in subparsers:
        subparser.add_argument("--config", default=argparse.SUPPRESS)
        subparser.add_argument("--log-level", default=argparse.SUPPRESS)
    return parser


@pytest.mark.parametrize(
    "argv",
    [
        ["grp", "--tags", "a", "b", "--config", "x.toml", "run"],
        ["grp", "--tags", "a", "b", "--log-level", "debug", "run"],
        ["grp", "--pair", "a", "stop", "run"],
        ["grp", "--opt", "--conf=y.toml", "stop"],
        ["gpos", "N", "run", "--config", "x.toml"],
        ["rem", "prog", "--config", "x.toml"],
        ["--config", "a.toml", "rem", "prog", "--log-level", "debug"],
        ["shortc", "-cx.toml"],
        ["shortc", "-vc", "x.toml"],
        ["grp", "--config", "-1", "run"],  # a negative number is a value
    ],
)
def test_the_command_line_is_read_as_argparse_parses_it(argv: list[str]) -> None:
    # Options with several values, a group's positional, a REMAINDER argument and short
    # option clusters: the path and the settings found agree with argparse's own parse.
    parser = _plugin_shaped_parser()
    args = parser.parse_args(argv)
    line = config.read_command_line(parser, argv)
    expected_path = tuple(
        value
        for dest in ("command", "grp_command", "gpos_command")
        if (value := getattr(args, dest, None)) is not None
    )
    assert line.path == expected_path
    assert line.given.get("config") == args.config
    assert line.given.get("log_level") == args.log_level

"""The command line itself: one entry (``percolator`` and ``python -m percolator``), commands
found through the ``percolator.commands`` entry points, ``--version``."""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import percolator
from percolator import cli, config
from percolator.errors import ConfigError
from tests.cli_process import run_percolator

# The engine's own commands and those of the packages installed with it.
ENGINE_COMMANDS = [
    "backfill",
    "catch-up",
    "export",
    "gc",
    "hbase",
    "inspect",
    "notifications",
    "observers",
    "oracle",
    "status",
    "wait",
    "watermarks",
    "worker",
]


def entry_point(name: str, value: str) -> importlib.metadata.EntryPoint:
    return importlib.metadata.EntryPoint(name, value, cli.GROUP)


def run(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_percolator(args, env)


def test_the_engine_declares_its_commands_as_entry_points() -> None:
    engine = importlib.metadata.distribution(percolator.DISTRIBUTION)
    names = sorted(ep.name for ep in engine.entry_points if ep.group == cli.GROUP)
    assert names == ENGINE_COMMANDS
    commands = cli.load_commands()
    assert commands.errors == []
    listed = list(cli.config.command_parsers(commands.parser))
    assert {path[0] for path in listed} >= set(ENGINE_COMMANDS)


def test_commands_are_listed_alphabetically_whatever_the_order_found() -> None:
    points = [
        entry_point("status", "percolator.commands.status:register"),
        entry_point("gc", "percolator.commands.gc:register"),
        entry_point("gc", "no_such_module:register"),  # a second "gc": the first found wins
    ]
    commands = cli.load_commands(points)
    assert commands.errors == []
    help_text = commands.parser.format_help()
    assert help_text.index("    gc ") < help_text.index("    status ")


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        (
            "broken",
            "no_such_module_xyz:register",
            "command plugin 'broken' (no_such_module_xyz:register): cannot load: "
            "ModuleNotFoundError: No module named 'no_such_module_xyz'",
        ),
        (
            "liar",
            "percolator.commands.status:register",
            "command plugin 'liar' (percolator.commands.status:register): added no command "
            "named 'liar'",
        ),
        (
            "raises",
            "json:loads",
            "command plugin 'raises' (json:loads): failed to add its command: TypeError",
        ),
        (
            "value",
            "percolator:DISTRIBUTION",
            "command plugin 'value' (percolator:DISTRIBUTION): 'percolator-engine' is not a "
            "register(subparsers)",
        ),
    ],
)
def test_a_broken_command_plugin_is_an_error_naming_it(name: str, value: str, message: str) -> None:
    commands = cli.load_commands(
        [entry_point("gc", "percolator.commands.gc:register"), entry_point(name, value)]
    )
    assert [error.plugin for error in commands.errors] == [name]
    assert str(commands.errors[0]).startswith(message)
    # The others still load, and a failed plugin leaves no command behind.
    assert list(cli.config.command_parsers(commands.parser)) == [("gc",)]


def test_main_reports_a_broken_plugin_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    points = [
        entry_point("gc", "percolator.commands.gc:register"),
        entry_point("broken", "no_such_module_xyz:register"),
    ]
    monkeypatch.setattr(cli, "find_commands", lambda entry_points=None: points)
    assert cli.main(["broken", "--anything"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "percolator: error: command plugin 'broken' (no_such_module_xyz:register): "
        "cannot load: ModuleNotFoundError: No module named 'no_such_module_xyz'\n"
    )
    # Other commands still run; the broken one is named in one warning line.
    percolator.connect(f"embedded:{tmp_path / 's'}").close()
    assert cli.main(["gc", "--store", f"embedded:{tmp_path / 's'}", "--json"]) == 0
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "percolator: warning: command plugin 'broken' (no_such_module_xyz:register): cannot "
        "load: ModuleNotFoundError: No module named 'no_such_module_xyz'; left out"
    ]


def register_failing(subparsers: Any) -> None:
    """A third-party command plugin whose commands fail when run."""
    boom = subparsers.add_parser("boom")
    boom.add_argument("--engine-error", action="store_true")
    boom.add_argument("--closed-pipe", action="store_true")
    boom.set_defaults(func=_run_boom)


def _run_boom(args: argparse.Namespace) -> int:
    if args.engine_error:
        raise ConfigError("a setting of the plugin is wrong")
    if args.closed_pipe:
        raise BrokenPipeError(32, "Broken pipe")
    raise ValueError("the plugin's own bug")


def test_a_failing_command_of_another_package_is_one_line_naming_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    points = [entry_point("boom", "tests.test_cli:register_failing")]
    monkeypatch.setattr(cli, "find_commands", lambda entry_points=None: points)
    assert cli.main(["boom"]) == 1
    assert capsys.readouterr().err == (
        "percolator: error: command 'boom' of plugin tests.test_cli:register_failing failed: "
        "ValueError: the plugin's own bug (--log-level debug shows the traceback)\n"
    )
    assert cli.main(["--log-level", "debug", "boom"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):")
    assert "in _run_boom" in err
    assert err.endswith("failed: ValueError: the plugin's own bug\n")
    # The engine's errors raised by plugin code are reported as ever.
    assert cli.main(["boom", "--engine-error"]) == 2
    assert capsys.readouterr().err == "percolator: error: a setting of the plugin is wrong\n"
    # A reader that went away ends any command quietly.
    assert cli.main(["boom", "--closed-pipe"]) == cli.BROKEN_PIPE_EXIT
    assert capsys.readouterr().err == ""


def test_an_engine_command_that_fails_unexpectedly_shows_its_traceback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The same failure in one of the engine's own commands is a bug of the engine.
    points = [entry_point("boom", "percolator.commands.gc:register")]
    assert cli.is_engine_command(points[0])
    assert not cli.is_engine_command(entry_point("boom", "percolator_extra.cli:register"))
    monkeypatch.setattr(cli, "find_commands", lambda entry_points=None: points)
    monkeypatch.setattr(
        cli, "_register", lambda entry_point, subparsers: register_failing(subparsers)
    )
    with pytest.raises(ValueError, match="the plugin's own bug"):
        cli.main(["boom"])


def test_a_broken_plugin_of_another_distribution(tmp_path: Path) -> None:
    """Real discovery through package metadata (a dist-info directory on the path)."""
    info = tmp_path / "broken_commands-0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-commands\nVersion: 0.0\n")
    (info / "entry_points.txt").write_text(
        "[percolator.commands]\nbroken = no_such_module_xyz:register\n"
    )
    env = {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    }
    result = run(["broken"], env)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "percolator: error: command plugin 'broken' (no_such_module_xyz:register): cannot "
        "load: ModuleNotFoundError: No module named 'no_such_module_xyz'"
    ]
    percolator.connect(f"embedded:{tmp_path / 's'}").close()
    result = run(["gc", "--store", f"embedded:{tmp_path / 's'}"], env)
    assert result.returncode == 0, result.stderr
    assert "command plugin 'broken'" in result.stderr


def test_python_dash_m_percolator_is_the_percolator_command() -> None:
    scripts = importlib.metadata.entry_points(group="console_scripts", name="percolator")
    assert [ep.value for ep in scripts] == ["percolator.cli:main"]
    from percolator import __main__

    assert __main__.main is cli.main
    result = run(["--help"])
    assert result.returncode == 0, result.stderr
    for name in ENGINE_COMMANDS:
        assert f"    {name}" in result.stdout


def test_version_comes_from_the_package_metadata() -> None:
    expected = importlib.metadata.version(percolator.DISTRIBUTION)
    assert percolator.__version__ == expected
    result = run(["--version"])
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"percolator {expected}\n"


def test_config_option_is_found_before_and_after_the_command() -> None:
    parser = cli.build_parser()

    def given_config(argv: list[str]) -> str | None:
        return config.read_command_line(parser, argv).given.get("config")

    assert given_config(["--config", "a.toml", "gc"]) == "a.toml"
    assert given_config(["gc", "--config", "b.toml"]) == "b.toml"
    assert given_config(["--config=a.toml", "gc", "--config=b.toml"]) == "b.toml"
    assert given_config(["gc", "--", "--config", "c.toml"]) is None
    # argparse's abbreviations, in the parser the token belongs to
    assert given_config(["--conf", "a.toml", "gc"]) == "a.toml"
    assert given_config(["gc", "--con=b.toml"]) == "b.toml"
    assert given_config(["oracle", "serve", "--conf", "c.toml"]) == "c.toml"
    # a value is not an option: the value of --store here is "--config"-free
    assert given_config(["gc", "--store", "embedded:x", "--table", "t"]) is None


def test_command_name_skips_global_options_and_their_values() -> None:
    parser = cli.build_parser()

    def name(argv: list[str]) -> str | None:
        return config.read_command_line(parser, argv).command_name

    assert name(["--config", "a.toml", "worker", "--threads", "2"]) == "worker"
    assert name(["--log-level", "debug", "--log-format", "json", "gc"]) == "gc"
    # argparse's abbreviations; an ambiguous one argparse refuses
    assert name(["--log-f", "json", "--conf", "a.toml", "gc"]) == "gc"
    assert name(["--log-l=debug", "gc"]) == "gc"
    assert name(["--log", "gc"]) == "gc"
    # a command nobody provides (a typo, a plugin that failed to load) is still named
    assert name(["--log-level", "debug", "no-such-command", "x"]) == "no-such-command"
    assert name(["--log-level", "debug"]) is None


def test_an_abbreviated_config_option_loads_that_file(tmp_path: Path) -> None:
    """``--conf`` is ``--config`` to argparse, so it must be to the config lookup as well:
    the file's store is the one the command uses, not the default one."""
    named = tmp_path / "named-store"
    (tmp_path / "x.toml").write_text(f'[defaults]\nstore = "embedded:{named}"\n')
    for argv in (
        ["--conf", "x.toml", "status"],
        ["status", "--conf", "x.toml"],
        ["--log-l", "error", "status", "--con=x.toml"],
    ):
        result = run_percolator(argv, cwd=tmp_path)
        assert result.returncode != 0, argv
        assert str(named) in result.stderr, (argv, result.stderr)
        assert "percolator-data" not in result.stderr, (argv, result.stderr)


def test_shell_completion_through_argcomplete(tmp_path: Path) -> None:
    import argcomplete  # noqa: F401 - the dev extra installs it

    out = tmp_path / "completions"

    def complete(line: str) -> list[str]:
        env = dict(
            os.environ,
            _ARGCOMPLETE="1",
            COMP_LINE=line,
            COMP_POINT=str(len(line)),
            _ARGCOMPLETE_STDOUT_FILENAME=str(out),
            _ARGCOMPLETE_IFS="\n",
        )
        result = subprocess.run(
            [sys.executable, "-m", "percolator"],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, result.stderr
        return [word.strip() for word in out.read_text().split("\n")]

    assert {"worker", "status"} <= set(complete("percolator "))
    assert "--log-format" in complete("percolator worker --log-f")
    assert set(complete("percolator status --log-level ")) >= {"DEBUG", "INFO"}

"""The ``percolator`` command line (also ``python -m percolator``: the same :func:`main`).

The commands are plugins of the entry-point group ``percolator.commands``; this module names
none of them.  Each entry point is named like the command it adds and points to a function
``register(subparsers)`` that adds that command's parser, whose ``func`` default takes the
parsed arguments and returns an exit code.  Every package lists its own commands in its
``pyproject.toml`` (the engine ``gc``, ``hbase`` and ``status``; the oracle ``oracle``; the
observers ``worker``, ``notifications`` and ``observers``; the Spark jobs ``backfill`` and
``export``), and an installed example or third-party package can add more.

Commands are listed in ``--help`` in alphabetical order of their names, whatever order the
distributions were installed in.  When two distributions declare one name, the first found
wins, as :mod:`importlib.metadata` orders them (the same rule as observer plugins).

Loading follows find, load, validate: a command plugin that cannot be imported, whose
function raises, or that adds no command of its name is left out with one line naming it
(``percolator: warning: command plugin 'x' (module:func): ...``) and the other commands keep
working; running the broken command itself is an error with that line and exit code 2.

Errors of the project's own tree are printed as one clear line (``percolator: error: ...``)
with exit code 2; anything else raised by one of the engine's commands is a bug and shows
its traceback.  A command of another package that fails with an exception that is not the
engine's is reported in one line naming its plugin, with exit code 1 (its traceback at
``--log-level debug``): the failure is that package's, not the engine's.

Options come from flags, the environment and a config file, in that order of precedence
(see :mod:`percolator.config`).  ``--config PATH`` is accepted before the command and after
it (``percolator worker --config prod.toml``); given twice, the last one wins.

Logging is set up here, once, for every command: ``--log-level`` (DEBUG, INFO, WARNING,
ERROR or CRITICAL, any case; another value is a usage error) and ``--log-format text|json``,
before or after the command, or from ``PERCOLATOR_LOG_LEVEL`` / ``PERCOLATOR_LOG_FORMAT``
or ``[defaults]`` in the config file.  Long-running commands (the worker, the oracle
server) log at INFO by default, the others at WARNING.  ``json`` writes one JSON object per
line on stderr: ``time`` (UTC, ISO 8601), ``level``, ``logger``, ``message``, ``thread``, every
field a log call passes with ``extra=`` (e.g. ``start_ts``, ``commit_ts``, ``observer``)
and ``exception`` (the formatted traceback) when there is one.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import logging
import os
import sys
import traceback
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import percolator
from percolator import config
from percolator.errors import ConfigError, PercolatorError, describe_plugin_error

GROUP = "percolator.commands"

EPILOG = """\
commands are plugins of the entry-point group "percolator.commands", listed alphabetically;
installed packages can add their own (e.g. the example pipeline adds demo and recompute).

configuration, highest precedence first:
  1. flags on the command line
  2. environment: PERCOLATOR_STORE, PERCOLATOR_ORACLE, PERCOLATOR_LOG_LEVEL and
     PERCOLATOR_LOG_FORMAT for every command that has the option;
     PERCOLATOR_<COMMAND>_<OPTION> for one command's option,
     e.g. PERCOLATOR_WORKER_THREADS=8 or PERCOLATOR_ORACLE_SERVE_LISTEN=0.0.0.0:7070
  3. the config file (TOML): --config PATH (before or after the command), else
     $PERCOLATOR_CONFIG, else ./percolator.toml if present; [defaults] store, oracle,
     log-level, log-format for every command, one table per command: [worker] threads = 8,
     [oracle.serve] listen = "0.0.0.0:7070"
  4. built-in defaults (see each command's --help)
"""

CONFIG_HELP = "config file (TOML); default $PERCOLATOR_CONFIG, else ./percolator.toml if present"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LOG_FORMATS = ("text", "json")
LOG_LEVEL_HELP = (
    "logging level: " + ", ".join(LOG_LEVELS) + " (env PERCOLATOR_LOG_LEVEL; default INFO for "
    "the worker and the oracle server, WARNING otherwise)"
)
LOG_FORMAT_HELP = "log lines as text or as one JSON object per line (env PERCOLATOR_LOG_FORMAT)"
#: the default level of commands that do not set ``default_log_level`` with set_defaults
DEFAULT_LOG_LEVEL = "WARNING"


def _log_level(text: str) -> str:
    """``--log-level``'s type: any case is accepted, the choices are checked upper-case."""
    return text.strip().upper()


class CommandPluginError(ConfigError):
    """A command plugin could not be loaded or did not add its command."""

    def __init__(self, name: str, value: str, message: str) -> None:
        super().__init__(f"command plugin {name!r} ({value}): {message}")
        self.plugin = name


@dataclass
class Commands:
    """The parser of every command that loaded, and the plugins that did not."""

    parser: argparse.ArgumentParser
    errors: list[CommandPluginError] = field(default_factory=list)
    #: the entry point of each command that loaded, by command name
    sources: dict[str, importlib.metadata.EntryPoint] = field(default_factory=dict)


def find_commands(
    entry_points: Iterable[importlib.metadata.EntryPoint] | None = None,
) -> list[importlib.metadata.EntryPoint]:
    """The command plugins, one per name (the first found wins), sorted by name.
    ``entry_points``: use these instead of the installed ones (tests, embedding)."""
    if entry_points is None:
        entry_points = importlib.metadata.entry_points(group=GROUP)
    found: dict[str, importlib.metadata.EntryPoint] = {}
    for entry_point in entry_points:
        found.setdefault(entry_point.name, entry_point)
    return [found[name] for name in sorted(found)]


def _register(entry_point: importlib.metadata.EntryPoint, subparsers: Any) -> None:
    """Load one plugin and let it add its command; raises :class:`CommandPluginError`."""
    name, value = entry_point.name, entry_point.value
    try:
        register = entry_point.load()
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # any import-time failure of a plugin's code, sys.exit too
        raise CommandPluginError(name, value, f"cannot load: {describe_plugin_error(exc)}") from exc
    if not callable(register):
        raise CommandPluginError(name, value, f"{register!r} is not a register(subparsers)")
    try:
        register(subparsers)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # SystemExit included: a plugin never ends the program
        raise CommandPluginError(
            name, value, f"failed to add its command: {describe_plugin_error(exc)}"
        ) from exc
    if name not in subparsers.choices:
        added = ", ".join(sorted(subparsers.choices)) or "nothing"
        raise CommandPluginError(
            name, value, f"added no command named {name!r} (commands so far: {added})"
        )


def load_commands(
    entry_points: Iterable[importlib.metadata.EntryPoint] | None = None,
) -> Commands:
    """The ``percolator`` parser with every command plugin that loads; never raises for one
    plugin (failures are collected in :attr:`Commands.errors`)."""
    parser = argparse.ArgumentParser(
        prog="percolator",
        description="Incremental processing with snapshot-isolation transactions on HBase.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--version", action="version", version=f"percolator {percolator.__version__}"
    )
    parser.add_argument("--config", metavar="PATH", help=CONFIG_HELP)
    _add_logging_options(parser, default=None)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    commands = Commands(parser)
    for entry_point in find_commands(entry_points):
        before = set(subparsers.choices)
        try:
            _register(entry_point, subparsers)
        except CommandPluginError as exc:
            commands.errors.append(exc)
            _forget_new_commands(subparsers, before)
        else:
            commands.sources[entry_point.name] = entry_point
    for path, child in _all_parsers(parser):
        if path and "--config" not in child._option_string_actions:
            # SUPPRESS: a command's parser must not overwrite a --config given before the
            # command with its own default of None.
            child.add_argument(
                "--config", metavar="PATH", default=argparse.SUPPRESS, help=CONFIG_HELP
            )
        if path and "--log-level" not in child._option_string_actions:
            _add_logging_options(child, default=argparse.SUPPRESS)
    return commands


def _add_logging_options(parser: argparse.ArgumentParser, *, default: Any) -> None:
    """The global logging options; ``default=SUPPRESS`` on the commands' parsers, so that
    an option given before the command is not overwritten by the command's default."""
    parser.add_argument(
        "--log-level",
        type=_log_level,
        choices=LOG_LEVELS,
        default=default,
        metavar="LEVEL",
        help=LOG_LEVEL_HELP,
    )
    parser.add_argument("--log-format", choices=LOG_FORMATS, default=default, help=LOG_FORMAT_HELP)


def _forget_new_commands(subparsers: Any, before: set[str]) -> None:
    """Remove what a failed plugin added, so that a broken command is never half there."""
    for name in set(subparsers.choices) - before:
        del subparsers.choices[name]
    subparsers._choices_actions[:] = [
        action for action in subparsers._choices_actions if action.dest in before
    ]


def _all_parsers(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """``parser`` and every parser below it (command groups and commands), by path."""
    found = [(path, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                found += _all_parsers(child, (*path, name))
    return found


def build_parser() -> argparse.ArgumentParser:
    """The ``percolator`` parser with every installed command that loads."""
    return load_commands().parser


# ---------------------------------------------------------------------------- logging

#: attributes every LogRecord has; anything else on a record came from ``extra=``
_RECORD_FIELDS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
}


def _extra_fields(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _RECORD_FIELDS}


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (see the module docstring for the keys).
    Values that JSON cannot hold are written as their ``str``."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "thread": record.threadName,
        }
        for key, value in _extra_fields(record).items():
            doc.setdefault(key, value)
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            doc["exception"] = record.exc_text
        if record.stack_info:
            doc["stack"] = self.formatStack(record.stack_info)
        return json.dumps(doc, default=str)


class TextFormatter(logging.Formatter):
    """``time LEVEL logger: message`` and the ``extra=`` fields as ``key=value``."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        extra = _extra_fields(record)
        if not extra:
            return text
        fields = " ".join(f"{key}={value}" for key, value in extra.items())
        head, sep, tail = text.partition("\n")  # keep a traceback below the fields
        return f"{head} [{fields}]{sep}{tail}"


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is at the time of the record (tests swap it)."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


_handler: _StderrHandler | None = None


def configure_logging(level: str, log_format: str = "text") -> None:
    """Send the root logger's records at ``level`` and above to stderr in ``log_format``.

    Idempotent: called again (in one process), it replaces its own handler's settings and
    leaves other handlers (an embedding application's, pytest's) alone."""
    global _handler
    if level not in LOG_LEVELS:
        raise ConfigError(f"log level {level!r} is not one of {', '.join(LOG_LEVELS)}")
    if log_format not in LOG_FORMATS:
        raise ConfigError(f"log format {log_format!r} is not one of {', '.join(LOG_FORMATS)}")
    root = logging.getLogger()
    if _handler is None or _handler not in root.handlers:
        _handler = _StderrHandler()
        root.addHandler(_handler)
    _handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root.setLevel(level)


def _setup_logging(args: argparse.Namespace, line: config.CommandLine) -> None:
    # A flag anywhere on the line wins over the environment and the file, even when given
    # before the command (whose parser then holds the setting from the file or environment).
    flag_level = line.given.get("log_level")
    level = str(
        _log_level(flag_level)
        if flag_level
        else getattr(args, "log_level", None)
        or getattr(args, "default_log_level", DEFAULT_LOG_LEVEL)
    )
    log_format = str(line.given.get("log_format") or getattr(args, "log_format", None) or "text")
    configure_logging(level, log_format)


def _error(exc: PercolatorError) -> int:
    print(f"percolator: error: {exc}", file=sys.stderr)
    return 2


def _run_command(args: argparse.Namespace, source: importlib.metadata.EntryPoint | None) -> Any:
    """Run the parsed command (its ``func``); what a command of another package raises that
    the engine does not report itself is reported here, naming the plugin."""
    try:
        return args.func(args)
    except (PercolatorError, BrokenPipeError):  # reported by the callers, as for any command
        raise
    except Exception as exc:
        if source is None or is_engine_command(source):
            raise  # a bug of the engine: its traceback is what a report needs
        return _plugin_failed(source, exc)


def is_engine_command(entry_point: importlib.metadata.EntryPoint) -> bool:
    """Whether a command plugin is one of the engine's own (its code is in ``percolator``)."""
    return entry_point.value.partition(":")[0].partition(".")[0] == "percolator"


def _plugin_failed(entry_point: importlib.metadata.EntryPoint, exc: Exception) -> int:
    """Report a command of another package that raised: one line naming the plugin (and
    its traceback when debug logging is on); exit code 1."""
    if logging.getLogger().isEnabledFor(logging.DEBUG):
        traceback.print_exception(exc, file=sys.stderr)
        hint = ""
    else:
        hint = " (--log-level debug shows the traceback)"
    print(
        f"percolator: error: command {entry_point.name!r} of plugin {entry_point.value} "
        f"failed: {describe_plugin_error(exc)}{hint}",
        file=sys.stderr,
    )
    return 1


def _complete(parser: argparse.ArgumentParser) -> None:
    """Shell completion through argcomplete (the optional extra ``completion``), asked for
    by the shell hook ``eval "$(register-python-argcomplete percolator)"``: it answers and
    exits the process.  Without the hook's environment, or without argcomplete, nothing."""
    if "_ARGCOMPLETE" not in os.environ:
        return
    try:
        import argcomplete
    except ImportError:
        return
    argcomplete.autocomplete(parser)


#: the exit code of a command whose output pipe was closed early (``... | head``): what a
#: shell reports for a program ended by SIGPIPE (128 + 13)
BROKEN_PIPE_EXIT = 141


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns its exit code.  A reader that closes stdout early
    (``percolator observers list | head -1``) ends the command quietly, without a
    traceback, with :data:`BROKEN_PIPE_EXIT` (Python's documented recipe for SIGPIPE)."""
    try:
        try:
            code = _main(argv)
        finally:
            # A broken pipe shows here when the output fit in the buffer (also after
            # --help, whose SystemExit it then replaces).
            sys.stdout.flush()
    except KeyboardInterrupt:  # e.g. while the command plugins load
        print("percolator: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # Point stdout at /dev/null so the interpreter's flush at exit does not fail again.
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError, AttributeError):  # no real stdout (embedded, tests)
            pass
        return BROKEN_PIPE_EXIT
    return code


def _main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = load_commands()
    parser = commands.parser
    _complete(parser)
    line = config.read_command_line(parser, argv)
    chosen = line.command_name
    for plugin_error in commands.errors:
        if plugin_error.plugin == chosen:
            return _error(plugin_error)
        print(f"percolator: warning: {plugin_error}; left out", file=sys.stderr)
    try:
        # Settings from the environment and the config file become the chosen command's
        # defaults before parsing, so flags still win and errors name their source.
        config_path = config.find_config_file(line.given.get("config"), os.environ)
        settings = config.resolve(parser, line.path, config_path=config_path, environ=os.environ)
        fill = config.apply(parser, line.path, settings)
    except PercolatorError as exc:
        return _error(exc)
    args = parser.parse_args(argv)
    fill(args)
    # The file the settings came from, for commands that read more of it (the worker's
    # [worker.observers.NAME] tables).
    args.config_path = config_path
    root = logging.getLogger()
    level_before = root.level
    try:
        _setup_logging(args, line)
        config.warn_unknown_environment(parser, os.environ)
        code = _run_command(args, commands.sources.get(chosen or ""))
    except PercolatorError as exc:
        return _error(exc)
    except KeyboardInterrupt:
        print("percolator: interrupted", file=sys.stderr)
        return 130
    finally:
        # A command run in-process (tests, an embedding program) leaves logging as it was.
        if _handler is not None:
            root.removeHandler(_handler)
        root.setLevel(level_before)
    return int(code or 0)

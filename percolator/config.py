"""Configuration of the ``percolator`` command line: flags, environment and a config file.

Every option of every sub-command can be set three ways.  Precedence, highest first:

1. the command-line flag (``percolator worker --threads 8``);
2. an environment variable:

   - ``PERCOLATOR_STORE`` and ``PERCOLATOR_ORACLE`` set ``--store`` / ``--oracle`` of every
     command that has them (the usual wiring of a deployment); ``PERCOLATOR_LOG_LEVEL``
     and ``PERCOLATOR_LOG_FORMAT`` set ``--log-level`` / ``--log-format`` of every command;
   - ``PERCOLATOR_<COMMAND>_<OPTION>`` sets one command's option, with the command path and
     the option name upper-cased and ``-`` written ``_``: ``PERCOLATOR_WORKER_THREADS=8``,
     ``PERCOLATOR_ORACLE_SERVE_LISTEN=0.0.0.0:7070``;

3. the config file, TOML: ``store``, ``oracle``, ``log-level`` and ``log-format`` in the
   ``[defaults]`` table apply to every command that has them, and a table per command holds
   that command's options under their flag names::

       [defaults]
       store = "hbase://hbase:9090"
       oracle = "grpc://oracle:7070,oracle-standby:7070"

       [worker]
       threads = 8
       observer = ["doc-index", "doc-clusters"]   # repeatable options take a list

       [worker.observers.word-count]               # handed to that observer's factory
       min_length = 3

       [oracle.serve]
       listen = "0.0.0.0:7070"

   The file is ``--config PATH`` (before or after the command), else ``$PERCOLATOR_CONFIG``, else
   ``./percolator.toml`` when it exists;

4. the option's built-in default, shown by ``--help``.

The whole file is checked whichever command runs, so a misspelt table or option fails at
once with one line naming the file, the table and the option; a value that does not parse
or is out of range names its source (file table or environment variable) the same way.
Range checks belong to the options' types (:mod:`percolator.command_options`), so a
``[worker] threads = -3`` fails ``percolator status`` too, not first at a deployment's
worker start; only checks that relate several options (a lease at least three margins
long) wait for the command that uses them.  Settings reach argparse
as defaults, so a flag given on the command line always wins and a required option supplied
by the file or the environment is no longer required.

A variable set to nothing (``PERCOLATOR_STORE=`` or blanks, typically ``$STORE`` expanded
unset) is an error naming it, like a malformed value: it never means "use the default" (unset
the variable for that).  A ``PERCOLATOR_*`` variable that nothing reads (a misspelt
``PERCOLATOR_STOER``) is a one-line warning naming the closest known name, not an error: a
variable meant for another version or another program must not stop the tool.  The known
names are the options' variables of every installed command (:func:`known_environment`) and
:data:`OTHER_ENVIRONMENT`, the one list of the variables read elsewhere.
"""

from __future__ import annotations

import argparse
import difflib
import logging
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 reads TOML with the tomli backport
    import tomli as tomllib

from percolator.errors import ConfigError

CONFIG_ENV = "PERCOLATOR_CONFIG"
DEFAULT_CONFIG_FILE = "percolator.toml"
ENV_PREFIX = "PERCOLATOR_"
# The file's table of settings shared by every command that has the option.
DEFAULTS_TABLE = "defaults"
# Options that the [defaults] table of the file, or an environment variable without a command
# part, sets for every command that has them.
SHARED_OPTIONS = ("store", "oracle", "log-level", "log-format")
# Tables inside a command's table that are not options: [worker.observers.NAME] holds the
# configuration handed to observer NAME's factory (see observer_tables).
NESTED_TABLES: dict[tuple[str, ...], str] = {("worker",): "observers"}
# Options of the command line itself, accepted on every command's parser (``--config``
# after the command) but never set from the file or the environment.
GLOBAL_OPTIONS = ("config",)
#: Every ``PERCOLATOR_*`` variable that is not an option's, with what it sets and who reads
#: it: the one list of them (the options' variables follow from the parsers, see
#: :func:`known_environment`).  A variable missing here draws the "unknown variable"
#: warning on every run; tests/test_config.py checks the sources for names missing here,
#: and docs/operations.md lists them.
OTHER_ENVIRONMENT: dict[str, str] = {
    CONFIG_ENV: "the config file (this module)",
    "PERCOLATOR_ORACLE_TOKEN": "the oracle's shared token (percolator.oracle.addressing)",
    "PERCOLATOR_OBSERVED_REFRESH_MS": "how often observed-column sets are re-read, in ms "
    "(percolator.notifications)",
    "PERCOLATOR_FAILPOINTS": "failpoints to enable, for fault-injection tests "
    "(percolator.failpoints)",
    "PERCOLATOR_CACHE_DIR": "where `percolator hbase` caches its jars "
    "(percolator.testing.localhbase)",
}
# Variables of the test suite (tests/conftest.py: PERCOLATOR_TEST_HBASE_URL, ...): the tool
# never reads them, so they are not checked.
TEST_ENV_PREFIX = "PERCOLATOR_TEST_"

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Setting:
    """One value for one option and where it came from (for messages and ``--help``)."""

    dest: str
    value: Any
    source: str


def find_config_file(explicit: str | None, environ: Mapping[str, str]) -> Path | None:
    """The config file to read: ``explicit``, else ``$PERCOLATOR_CONFIG``, else
    ``./percolator.toml`` if it exists, else None.  A named file that does not exist, and an
    empty name (``--config ''``, ``PERCOLATOR_CONFIG=``), are errors: a typo or a variable
    expanded unset must not silently fall back to ./percolator.toml or the defaults."""
    named = explicit if explicit is not None else environ.get(CONFIG_ENV)
    if named is not None:
        if not named.strip():
            origin, instead = (
                ("--config", "leave --config out")
                if explicit is not None
                else (CONFIG_ENV, f"unset {CONFIG_ENV}")
            )
            raise ConfigError(
                f"{origin}: empty config file name {named!r}; name a file, or {instead} "
                f"to read ./{DEFAULT_CONFIG_FILE} when present"
            )
        path = Path(named)
        if not path.is_file():
            origin = "--config" if explicit else CONFIG_ENV
            what = (
                "is a directory"
                if path.is_dir()
                else "is not a regular file"
                if path.exists()
                else "does not exist"
            )
            raise ConfigError(f"config file {named!r} (from {origin}) {what}")
        return path
    default = Path(DEFAULT_CONFIG_FILE)
    return default if default.is_file() else None


def load_config_file(path: Path) -> dict[str, Any]:
    """Parse ``path`` as TOML; syntax errors become one :class:`ConfigError` line."""
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path}: not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"config file {path}: not UTF-8 text (TOML must be UTF-8): byte "
            f"{exc.object[exc.start]:#04x} at offset {exc.start}"
        ) from None
    except OSError as exc:
        raise ConfigError(f"config file {path}: cannot be read: {exc.strerror}") from None


def command_parsers(
    parser: argparse.ArgumentParser,
) -> dict[tuple[str, ...], argparse.ArgumentParser]:
    """Every leaf command of ``parser`` by its path, e.g. ``("oracle", "serve")``."""
    found: dict[tuple[str, ...], argparse.ArgumentParser] = {}

    def walk(current: argparse.ArgumentParser, path: tuple[str, ...]) -> None:
        subparsers = _subparsers_action(current)
        if subparsers is None:
            if path:
                found[path] = current
            return
        for name, child in subparsers.choices.items():
            walk(child, (*path, name))

    walk(parser, ())
    return found


def _subparsers_action(parser: argparse.ArgumentParser) -> argparse._SubParsersAction[Any] | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    return None


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """The settable options of one command by flag name (``life-time``), without --help."""
    options: dict[str, argparse.Action] = {}
    for action in parser._actions:
        if not action.option_strings or isinstance(action, argparse._HelpAction):
            continue
        if action.dest == argparse.SUPPRESS or action.dest in GLOBAL_OPTIONS:
            continue
        options[action.dest.replace("_", "-")] = action
    return options


def _convert(action: argparse.Action, raw: Any, source: str) -> Any:
    """Turn a value from the file (typed) or the environment (a string) into what the flag
    would have produced; errors name ``source``."""
    flag = action.option_strings[-1]

    def fail(why: str) -> ConfigError:
        return ConfigError(f"{source}: bad value {raw!r} for {flag}: {why}")

    if action.nargs == 0:  # store_true / store_false
        if isinstance(raw, bool):
            return raw if action.const is True else not raw
        text = str(raw).strip().lower()
        if text in ("1", "true", "yes", "on"):
            return action.const
        if text in ("0", "false", "no", "off"):
            return action.default
        raise fail("expected true or false")
    if isinstance(action, argparse._AppendAction):
        items = raw if isinstance(raw, list) else [raw]
        return [_convert_one(action, item, fail) for item in items]
    if isinstance(raw, list):
        raise fail("expected a single value, not a list")
    return _convert_one(action, raw, fail)


def _convert_one(action: argparse.Action, raw: Any, fail: Any) -> Any:
    if isinstance(raw, (dict, list)):
        raise fail("expected a single value")
    text = raw if isinstance(raw, str) else str(raw)
    value: Any = text
    if action.type is not None and callable(action.type):
        try:
            value = action.type(text)
        except (argparse.ArgumentTypeError, TypeError, ValueError) as exc:
            raise fail(str(exc) or "does not parse") from None
    if action.choices is not None and value not in action.choices:
        raise fail(f"choose from {', '.join(map(str, action.choices))}")
    return value


def env_name(path: Sequence[str], option: str) -> str:
    """The environment variable of one command's option, e.g. PERCOLATOR_WORKER_THREADS."""
    parts = [*path, option]
    return ENV_PREFIX + "_".join(part.upper().replace("-", "_") for part in parts)


def _from_environment(action: argparse.Action, name: str, raw: str) -> Any:
    """The value of variable ``name`` for ``action``.  Set but empty (or blanks) is an
    error, not "unset": ``PERCOLATOR_STORE=$STORE`` with ``$STORE`` forgotten must not
    quietly fall back to the built-in default."""
    if not raw.strip():
        raise ConfigError(
            f"{name}: bad value {raw!r} for {action.option_strings[-1]}: empty; "
            f"unset {name} to use the default"
        )
    return _convert(action, raw, name)


def known_environment(parser: argparse.ArgumentParser) -> set[str]:
    """Every ``PERCOLATOR_*`` variable the tool reads: the shared options' and every
    command's options' (of the commands ``parser`` has), and :data:`OTHER_ENVIRONMENT`."""
    known = set(OTHER_ENVIRONMENT)
    known.update(env_name((), key) for key in SHARED_OPTIONS)
    for path, command in command_parsers(parser).items():
        known.update(env_name(path, key) for key in _options(command))
    return known


def unknown_environment(parser: argparse.ArgumentParser, environ: Mapping[str, str]) -> list[str]:
    """One warning line for each ``PERCOLATOR_*`` variable of ``environ`` that nothing reads
    (see :func:`known_environment`; ``PERCOLATOR_TEST_*`` are the test suite's), naming the
    closest known name when one is close; sorted by name."""
    known = known_environment(parser)
    candidates = sorted(known)  # sorted: the same hint on every run when two are as close
    warnings: list[str] = []
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIX) or name.startswith(TEST_ENV_PREFIX):
            continue
        if name in known:
            continue
        close = difflib.get_close_matches(name, candidates, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        warnings.append(f"unknown environment variable {name}{hint}: ignored")
    return warnings


def warn_unknown_environment(parser: argparse.ArgumentParser, environ: Mapping[str, str]) -> None:
    """Log :func:`unknown_environment`'s lines as warnings.  Not errors: the environment is
    shared with other programs and versions, and the names of other commands' options are
    valid there.  Called once logging is set up, so the lines take the chosen log format."""
    for warning in unknown_environment(parser, environ):
        _log.warning(warning)


def _file_sections(
    config: Mapping[str, Any],
    parsers: Mapping[tuple[str, ...], argparse.ArgumentParser],
    path: Path,
) -> dict[tuple[str, ...], dict[str, Any]]:
    """Split the file into shared keys and per-command tables, rejecting unknown names."""
    sections: dict[tuple[str, ...], dict[str, Any]] = {(): {}}
    groups = {p[:i] for p in parsers for i in range(1, len(p))}

    def visit(table: Mapping[str, Any], prefix: tuple[str, ...]) -> None:
        for key, value in table.items():
            here = (*prefix, key)
            if here == (DEFAULTS_TABLE,):
                if not isinstance(value, dict):
                    raise ConfigError(f"config file {path}: [{DEFAULTS_TABLE}] must be a table")
                for option, setting in value.items():
                    if option.replace("_", "-") not in SHARED_OPTIONS:
                        raise ConfigError(
                            f"config file {path}: [{DEFAULTS_TABLE}] has no option {option!r} "
                            f"(only {', '.join(SHARED_OPTIONS)}; put others in the command's "
                            "table, e.g. [worker])"
                        )
                    sections[()][option.replace("_", "-")] = setting
            elif isinstance(value, dict):
                if here in parsers:
                    sections[here] = dict(value)
                elif here in groups:
                    visit(value, here)
                else:
                    known = sorted(".".join(p) for p in parsers)
                    raise ConfigError(
                        f"config file {path}: unknown command table [{'.'.join(here)}] "
                        f"(commands: {', '.join(known)}, and [{DEFAULTS_TABLE}])"
                    )
            elif prefix == ():
                raise ConfigError(
                    f"config file {path}: {key!r} outside a table; shared settings go in "
                    f"[{DEFAULTS_TABLE}] ({', '.join(SHARED_OPTIONS)}), others in the "
                    "command's table, e.g. [worker]"
                )
            else:
                raise ConfigError(
                    f"config file {path}: [{'.'.join(prefix)}] is a group of commands; "
                    f"put {key!r} in one of its commands' tables"
                )

    visit(config, ())
    for command, values in sections.items():
        if command == ():
            continue
        options = _options(parsers[command])
        nested = NESTED_TABLES.get(command)
        if nested is not None and nested in values:
            _check_nested(values[nested], f"config file {path} [{'.'.join(command)}.{nested}]")
        for key, value in values.items():
            if key == nested:
                continue
            if key.replace("_", "-") not in options:
                raise ConfigError(
                    f"config file {path}: [{'.'.join(command)}] has no option {key!r} "
                    f"(options: {', '.join(sorted(options))})"
                )
            # Check the value now, whichever command runs, so a bad [worker] entry is
            # caught by `percolator gc` too and not first at a deployment's worker start.
            _convert(
                options[key.replace("_", "-")], value, f"config file {path} [{'.'.join(command)}]"
            )
    return sections


def _check_nested(value: Any, where: str) -> None:
    if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
        raise ConfigError(
            f"{where} must hold one table per observer, e.g. [worker.observers.word-count]"
        )


def observer_tables(config_path: Path | None) -> dict[str, dict[str, Any]]:
    """The ``[worker.observers.NAME]`` tables of the config file, by observer name: each is
    handed to that observer's factory by ``percolator worker``.  Empty without a file."""
    if config_path is None:
        return {}
    table = load_config_file(config_path).get("worker", {}).get("observers", {})
    _check_nested(table, f"config file {config_path} [worker.observers]")
    return {name: dict(values) for name, values in table.items()}


def resolve(
    parser: argparse.ArgumentParser,
    command: tuple[str, ...],
    *,
    config_path: Path | None,
    environ: Mapping[str, str],
) -> list[Setting]:
    """The file and environment settings for ``command``, environment over file.

    The whole file is validated, not just ``command``'s table.  A variable of ``command``
    set to nothing is an error (:func:`_from_environment`).  Unknown ``PERCOLATOR_*``
    variables are not errors (see :func:`warn_unknown_environment`).
    """
    parsers = command_parsers(parser)
    sections: dict[tuple[str, ...], dict[str, Any]] = {(): {}}
    if config_path is not None:
        sections = _file_sections(load_config_file(config_path), parsers, config_path)
    if command not in parsers:
        return []
    options = _options(parsers[command])
    settings: dict[str, Setting] = {}
    for key, value in sections.get((), {}).items():
        if key in options:
            source = f"config file {config_path} [{DEFAULTS_TABLE}]"
            value = _convert(options[key], value, source)
            settings[key] = Setting(options[key].dest, value, source)
    for key, value in sections.get(command, {}).items():
        if key == NESTED_TABLES.get(command):
            continue
        key = key.replace("_", "-")
        source = f"config file {config_path} [{'.'.join(command)}]"
        value = _convert(options[key], value, source)
        settings[key] = Setting(options[key].dest, value, source)
    for key in SHARED_OPTIONS:
        name = env_name((), key)  # PERCOLATOR_STORE, PERCOLATOR_LOG_LEVEL, ...
        if key in options and name in environ:
            value = _from_environment(options[key], name, environ[name])
            settings[key] = Setting(options[key].dest, value, name)
    for key, action in options.items():
        name = env_name(command, key)
        if name in environ and not (key in SHARED_OPTIONS and name == env_name((), key)):
            value = _from_environment(action, name, environ[name])
            settings[key] = Setting(action.dest, value, name)
    return list(settings.values())


@dataclass(frozen=True)
class CommandLine:
    """What a command line names before argparse parses it: the sub-command path and the
    values of the options given on it, by destination (``config``, ``log_level``)."""

    #: e.g. ``("oracle", "serve")``; empty when no command is named
    path: tuple[str, ...]
    #: the last value given for each option that takes one, by its ``dest``
    given: Mapping[str, str]
    #: the token where a command was expected but none has that name (a typo, or the
    #: command of a plugin that failed to load)
    unknown_command: str | None = None

    @property
    def command_name(self) -> str | None:
        """The top-level command named, known or not."""
        return self.path[0] if self.path else self.unknown_command


def read_command_line(parser: argparse.ArgumentParser, argv: Sequence[str]) -> CommandLine:
    """Walk ``argv`` the way argparse will: each token belongs to the parser of the command
    reached so far (the top-level parser, a command group, then the command), so an option
    is looked up, and abbreviated (``--conf`` for ``--config``, ``--log-l=debug``), in the
    same parser that will parse it.  An option takes its values as argparse gives them
    (one, ``nargs`` of them, or every token up to the next option), a group's positional
    arguments take theirs before its command, so a value is never taken for a command
    name, and a ``nargs=REMAINDER`` argument takes the rest of the line.  Nothing after
    ``--`` is an option.

    Only the first value of an option is recorded; a token that is no option of its parser
    (argparse will refuse it) or an ambiguous abbreviation is passed over.  Prefix
    characters other than ``-`` are not followed."""
    path: list[str] = []
    given: dict[str, str] = {}
    unknown = None
    current = parser
    positionals = _positionals(current)
    tokens = list(argv)
    index = 0
    while index < len(tokens):
        token = tokens[index]
        index += 1
        if token == "--":
            break
        if _is_option(current, token):
            found = _option_with_value(current, token)
            if found is None:
                continue
            action, value = found
            if value is None:
                taken = _values_taken(current, action, tokens, index)
                if taken:
                    value = tokens[index]
                index += taken
            if value is not None:
                given[action.dest] = value
            continue
        if positionals:
            if positionals[0].nargs == argparse.REMAINDER:
                break  # the rest of the line is that argument's, options included
            index += _values_taken(current, positionals.pop(0), tokens, index - 1) - 1
            if positionals and positionals[0].nargs == argparse.REMAINDER:
                break  # taken together with the arguments before it (argparse's match)
            continue
        subparsers = _subparsers_action(current)
        if subparsers is None:
            continue  # more positional arguments than the command takes: argparse's error
        if token not in subparsers.choices:
            unknown = token  # argparse will refuse it
            break
        path.append(token)
        current = subparsers.choices[token]
        positionals = _positionals(current)
    return CommandLine(tuple(path), given, unknown)


#: what argparse reads as a negative number, a value rather than an option
_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")


def _is_option(parser: argparse.ArgumentParser, token: str) -> bool:
    """Whether argparse reads ``token`` as an option (of ``parser``, or an unknown one)
    rather than as a value: its rules for ``-1``, ``-`` and tokens with a space."""
    if not token.startswith("-") or len(token) < 2:
        return False
    if _option_action(parser, token.partition("=")[0]) is not None:
        return True
    if _NEGATIVE_NUMBER.match(token) and not parser._has_negative_number_optionals:
        return False
    return " " not in token


def _positionals(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The positional arguments ``parser`` fills in order (a group's: before its command)."""
    subparsers = _subparsers_action(parser)
    actions = parser._actions
    if subparsers is not None:
        actions = actions[: actions.index(subparsers)]
    return [action for action in actions if not action.option_strings]


def _values_taken(
    parser: argparse.ArgumentParser, action: argparse.Action, tokens: Sequence[str], index: int
) -> int:
    """How many of ``tokens[index:]`` argparse gives ``action`` (of ``parser``) as values."""
    following = 0
    while index + following < len(tokens) and not _is_option(parser, tokens[index + following]):
        if tokens[index + following] == "--":
            break
        following += 1
    nargs = action.nargs
    if nargs == argparse.REMAINDER:
        return len(tokens) - index
    if nargs in ("*", "+"):
        return following
    if isinstance(nargs, int):
        return min(nargs, following)
    return min(1, following)  # None or "?"


def _option_with_value(
    parser: argparse.ArgumentParser, token: str
) -> tuple[argparse.Action, str | None] | None:
    """The action of the option ``token`` that takes a value, and the value attached to the
    token (``--config=x``, ``-cx``, ``-vcx``) or None; None for an option that takes no
    value, or that ``parser`` does not know."""
    name, has_value, attached = token.partition("=")
    action = _option_action(parser, name)
    if action is not None:
        if action.nargs == 0:
            return None
        return action, attached if has_value else None
    if token.startswith("--"):
        return None
    # A cluster of short options: flags, then perhaps one that takes the rest as its value.
    for position in range(1, len(token)):
        action = parser._option_string_actions.get("-" + token[position])
        if action is None:
            return None
        if action.nargs != 0:
            rest = token[position + 1 :]
            return action, (rest[1:] if rest.startswith("=") else rest) or None
    return None


def _option_action(parser: argparse.ArgumentParser, name: str) -> argparse.Action | None:
    """The action ``parser`` runs for the option token ``name``: exact, or the one long
    option it abbreviates as argparse allows; None when it names none or several."""
    options = parser._option_string_actions
    if name in options:
        return options[name]
    if not name.startswith("--") or not parser.allow_abbrev:
        return None
    matches = {action for flag, action in options.items() if flag.startswith(name)}
    return matches.pop() if len(matches) == 1 else None


def command_path(parser: argparse.ArgumentParser, argv: Sequence[str]) -> tuple[str, ...]:
    """The sub-command path ``argv`` selects, e.g. ``("oracle", "serve")`` (see
    :func:`read_command_line`)."""
    return read_command_line(parser, argv).path


class _Unset:
    """Default of an option the file or environment sets: tells "flag not given" apart."""

    def __repr__(self) -> str:
        return "<from config>"


def apply(
    parser: argparse.ArgumentParser, command: tuple[str, ...], settings: Sequence[Setting]
) -> Callable[[argparse.Namespace], None]:
    """Prepare ``command``'s parser for ``settings``; returns the step that fills them into
    the parsed namespace wherever the flag was not given (flags win).

    A required option supplied by a setting stops being required.  Defaults are replaced by
    a marker rather than by the setting itself because argparse's repeatable options append
    to their default: a flag must replace the file's list, not extend it.
    """
    leaf = command_parsers(parser).get(command)
    by_dest = {setting.dest: setting for setting in settings}
    marks: dict[str, Any] = {}
    if leaf is not None:
        for action in leaf._actions:
            if action.dest in by_dest and action.option_strings:
                action.required = False
                mark: Any = None if isinstance(action, argparse._AppendAction) else _Unset()
                action.default = mark
                marks[action.dest] = mark

    def fill(namespace: argparse.Namespace) -> None:
        for dest, mark in marks.items():
            if getattr(namespace, dest, mark) is mark:
                setattr(namespace, dest, by_dest[dest].value)

    return fill

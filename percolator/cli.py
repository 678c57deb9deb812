"""The ``percolator`` command line.

Each sub-command lives in its own module exposing ``register(subparsers)``, which adds a
parser whose ``func`` default takes the parsed arguments and returns an exit code.  Errors of
the project's own tree are printed as one clear line (``percolator: error: ...``) with exit
code 2; anything else is a bug and shows its traceback.

Options come from flags, the environment and a config file, in that order of precedence
(see :mod:`percolator.config`).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from percolator import config
from percolator.errors import PercolatorError

# Modules that register sub-commands, in --help order.
COMMAND_MODULES = [
    "percolator.testing.localhbase.cli",
    "percolator.oracle.cli",
    "percolator.observers.cli",
    "percolator.spark_jobs.cli",
    "percolator.commands.gc",
    "percolator.commands.status",
    "percolator.commands.demo",
]

EPILOG = """\
configuration, highest precedence first:
  1. flags on the command line
  2. environment: PERCOLATOR_STORE and PERCOLATOR_ORACLE for every command that has
     --store/--oracle; PERCOLATOR_<COMMAND>_<OPTION> for one command's option,
     e.g. PERCOLATOR_WORKER_THREADS=8 or PERCOLATOR_ORACLE_SERVE_LISTEN=0.0.0.0:7070
  3. the config file (TOML): --config PATH, else $PERCOLATOR_CONFIG, else
     ./percolator.toml if present; [defaults] store/oracle for every command, one
     table per command: [worker] threads = 8, [oracle.serve] listen = "0.0.0.0:7070"
  4. built-in defaults (see each command's --help)
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="percolator",
        description="Incremental processing with snapshot-isolation transactions on HBase.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--config",
        metavar="PATH",
        help="config file (TOML); default $PERCOLATOR_CONFIG, else ./percolator.toml if present",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for name in COMMAND_MODULES:
        module = importlib.import_module(name)
        module.register(subparsers)
    return parser


def _explicit_config(argv: Sequence[str]) -> str | None:
    """The value of a ``--config`` given before the command, if any."""
    for index, token in enumerate(argv):
        if token == "--config" and index + 1 < len(argv):
            return argv[index + 1]
        if token.startswith("--config="):
            return token.split("=", 1)[1]
        if not token.startswith("-"):
            return None
    return None


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        # Settings from the environment and the config file become the chosen command's
        # defaults before parsing, so flags still win and errors name their source.
        config_path = config.find_config_file(_explicit_config(argv), os.environ)
        command = config.command_path(parser, argv)
        settings = config.resolve(parser, command, config_path=config_path, environ=os.environ)
        fill = config.apply(parser, command, settings)
    except PercolatorError as exc:
        print(f"percolator: error: {exc}", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    fill(args)
    try:
        code = args.func(args)
    except PercolatorError as exc:
        print(f"percolator: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("percolator: interrupted", file=sys.stderr)
        return 130
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())

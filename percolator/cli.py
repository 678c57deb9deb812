"""The ``percolator`` command line.

Each sub-command lives in its own module exposing ``register(subparsers)``, which adds a
parser whose ``func`` default takes the parsed arguments and returns an exit code.  Errors of
the project's own tree are printed as one clear line (``percolator: error: ...``) with exit
code 2; anything else is a bug and shows its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from percolator.errors import PercolatorError

# Modules that register sub-commands, in --help order.
COMMAND_MODULES = [
    "percolator.localhbase.cli",
    "oracle.cli",
    "observers.cli",
    "spark_jobs.cli",
    "percolator.commands.gc",
    "percolator.commands.demo",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="percolator",
        description="Incremental processing with snapshot-isolation transactions on HBase.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for name in COMMAND_MODULES:
        module = importlib.import_module(name)
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
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

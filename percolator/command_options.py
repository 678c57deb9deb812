"""Options shared by the sub-commands of every package: where the store and the oracle are.

In the engine so that each package's commands (observers, Spark jobs, the oracle, operator
commands) declare ``--store`` and ``--oracle`` the same way without importing the command line.

The environment (``PERCOLATOR_STORE``, ``PERCOLATOR_ORACLE``) and the config file are
applied by :mod:`percolator.config` for every command, so these helpers declare only the
flags and their built-in defaults.
"""

from __future__ import annotations

import argparse

from percolator.store.url import DEFAULT_STORE_URL


def add_store_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--store",
        default=DEFAULT_STORE_URL,
        help="store URL: embedded:PATH, hbase://HOST:PORT[?prefix=P] or memory: "
        "(env PERCOLATOR_STORE; default %(default)s)",
    )


def add_oracle_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--oracle",
        default=None,
        help="timestamp oracle: grpc://HOST:PORT[,HOST:PORT...]; default: the in-process "
        "oracle persisted in the store (env PERCOLATOR_ORACLE)",
    )

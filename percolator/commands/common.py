"""Options shared by sub-commands: where the store and the oracle are.

Precedence (highest first): command-line flag, environment variable
(``PERCOLATOR_STORE``, ``PERCOLATOR_ORACLE``), default (``embedded:./percolator-data`` and
the in-process oracle).
"""

from __future__ import annotations

import argparse
import os

from percolator.store.url import DEFAULT_STORE_URL


def add_store_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--store",
        default=os.environ.get("PERCOLATOR_STORE", DEFAULT_STORE_URL),
        help="store URL: embedded:PATH, hbase://HOST:PORT[?prefix=P] or memory: "
        "(env PERCOLATOR_STORE; default %(default)s)",
    )


def add_oracle_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--oracle",
        default=os.environ.get("PERCOLATOR_ORACLE") or None,
        help="timestamp oracle: grpc://HOST:PORT[,HOST:PORT...]; default: the in-process "
        "oracle persisted in the store (env PERCOLATOR_ORACLE)",
    )

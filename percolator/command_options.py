"""Options shared by the sub-commands of every package: where the store and the oracle are,
and how a command that must not create a store opens one.

In the engine so that each package's commands (observers, Spark jobs, the oracle, operator
commands) declare ``--store`` and ``--oracle`` the same way without importing the command line.

The environment (``PERCOLATOR_STORE``, ``PERCOLATOR_ORACLE``) and the config file are
applied by :mod:`percolator.config` for every command, so these helpers declare only the
flags and their built-in defaults.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator

from percolator.client import Client, connect
from percolator.errors import StoreNotFoundError
from percolator.layout import META_TABLE
from percolator.store.base import Store
from percolator.store.url import DEFAULT_STORE_URL, open_store, parse_store_url


def add_store_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--store",
        default=DEFAULT_STORE_URL,
        help="store URL: embedded:PATH, hbase://HOST:PORT[?prefix=P&transport=T&protocol=P] "
        "or memory: (env PERCOLATOR_STORE; default %(default)s)",
    )


def add_oracle_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--oracle",
        default=None,
        help="timestamp oracle: grpc://HOST:PORT[,HOST:PORT...]; default: the in-process "
        "oracle persisted in the store (env PERCOLATOR_ORACLE)",
    )


def open_existing_store(url: str | None) -> Store:
    """Open the store ``url`` names only if it already holds an engine deployment.

    For commands that must never create anything (status, listings, retries, a worker
    without ``--create``): an embedded path with no store, a ``memory:`` store this process
    has not made, and a store without the engine's system table (an empty store, or an
    HBase URL whose ``prefix`` names no deployment) all raise
    :class:`~percolator.errors.StoreNotFoundError` with one line naming the URL.  Creates
    nothing, not even a table; the caller closes the store.
    """
    store = open_store(url, create=False)
    try:
        if not store.table_exists(META_TABLE):
            raise StoreNotFoundError(_no_deployment(url if url is not None else DEFAULT_STORE_URL))
    except BaseException:
        store.close()
        raise
    return store


def _no_deployment(url: str) -> str:
    parsed = parse_store_url(url)
    if parsed.scheme == "hbase":
        prefix = parsed.options.get("prefix", "")
        where = f"under the table prefix {prefix!r}" if prefix else "without a table prefix"
        return (
            f"store {url!r} holds no percolator deployment: no table {META_TABLE!r} {where}; "
            "check the host, port and ?prefix="
        )
    return (
        f"store {url!r} is empty (no table {META_TABLE!r}): nothing was ever written "
        "through the engine there"
    )


@contextlib.contextmanager
def connect_existing(url: str | None, oracle: str | None = None) -> Iterator[Client]:
    """A client on a store that already exists (see :func:`open_existing_store`); the store
    and the client are closed on exit."""
    store = open_existing_store(url)
    try:
        with connect(store, oracle=oracle) as client:
            yield client
    finally:
        store.close()

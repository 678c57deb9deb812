"""Options shared by the sub-commands of every package: where the store and the oracle are,
and how a command that must not create a store opens one.

In the engine so that each package's commands (observers, Spark jobs, the oracle, operator
commands) declare ``--store`` and ``--oracle`` the same way without importing the command line.

The checked option types live here too (:func:`int_option`, :func:`float_option`,
:data:`SECONDS`, :data:`POSITIVE_INT`, :data:`PORT`, ...): every numeric option of every
command uses one, so a value out of range, ``nan``, ``inf`` or an overflowing ``1e400`` is
a one-line usage error naming the option, whether it came from a flag, the environment or
the config file (:mod:`percolator.config` converts file and environment values with the
option's type, for every table of the file, whichever command runs).

The environment (``PERCOLATOR_STORE``, ``PERCOLATOR_ORACLE``) and the config file are
applied by :mod:`percolator.config` for every command, so these helpers declare only the
flags and their built-in defaults.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
from collections.abc import Callable, Iterator

from percolator.client import Client, connect
from percolator.errors import StoreNotFoundError
from percolator.layout import META_TABLE
from percolator.store.base import Store
from percolator.store.url import DEFAULT_STORE_URL, open_store, parse_store_url


class _Checked:
    """An argparse ``type`` that parses a number and checks its range.  Raises
    :class:`argparse.ArgumentTypeError` with a message saying what is accepted (argparse
    prints it after the option's name; :mod:`percolator.config` after the value's source)."""

    def __init__(
        self,
        parse: Callable[[str], float],
        kind: str,
        minimum: float | None,
        maximum: float | None,
        *,
        above: bool = False,
    ) -> None:
        self._parse = parse
        self._minimum = minimum
        self._maximum = maximum
        self._above = above
        if minimum is not None and maximum is not None:
            opening = "(" if above else "["
            self.expected = f"{kind} in {opening}{minimum}, {maximum}]"
        elif minimum is not None:
            self.expected = f"{kind} {'>' if above else '>='} {minimum}"
        elif maximum is not None:
            self.expected = f"{kind} <= {maximum}"
        else:
            self.expected = kind
        # argparse names a type by __name__ in its own messages
        self.__name__ = kind

    def __call__(self, text: str) -> float:
        try:
            value = self._parse(text.strip())
        except (TypeError, ValueError, OverflowError):
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a number: expected {self.expected}"
            ) from None
        if isinstance(value, float) and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not finite: expected {self.expected}")
        low, high = self._minimum, self._maximum
        too_low = low is not None and (value <= low if self._above else value < low)
        if too_low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{text!r} is out of range: expected {self.expected}")
        return value

    def __repr__(self) -> str:
        return f"<option type: {self.expected}>"


def int_option(minimum: int | None = None, maximum: int | None = None) -> Callable[[str], int]:
    """An argparse ``type``: a decimal integer in ``[minimum, maximum]``."""
    return _Checked(int, "an integer", minimum, maximum)  # type: ignore[return-value]


def float_option(
    minimum: float | None = None, maximum: float | None = None, *, above: bool = False
) -> Callable[[str], float]:
    """An argparse ``type``: a finite number in ``[minimum, maximum]`` (``above``: greater
    than ``minimum``); ``nan``, ``inf`` and values that overflow (``1e400``) are refused."""
    return _Checked(float, "a finite number", minimum, maximum, above=above)


#: a duration in seconds: finite and >= 0
SECONDS = float_option(0)
#: a count that must be at least one (threads, batch sizes, limits)
POSITIVE_INT = int_option(1)
#: a count or timestamp that may be zero
NON_NEGATIVE_INT = int_option(0)
#: a TCP port to listen on (0: any free port)
PORT = int_option(0, 65535)
#: a timestamp of the oracle's (a positive 64-bit integer)
TIMESTAMP = int_option(1, (1 << 63) - 1)


def row_key(text: str) -> bytes:
    """An argparse ``type`` for a row key: the argument's bytes as the shell passed them
    (``os.fsencode``), so text is its UTF-8 and ``$'\\xff'`` is the byte 0xff."""
    return os.fsencode(text)


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
def connect_existing(
    url: str | None, oracle: str | None = None, **options: int
) -> Iterator[Client]:
    """A client on a store that already exists (see :func:`open_existing_store`); the store
    and the client are closed on exit.  ``options``: as :func:`percolator.connect`'s."""
    store = open_existing_store(url)
    try:
        with connect(store, oracle=oracle, **options) as client:
            yield client
    finally:
        store.close()

"""Parse store URLs and open the matching backend.

A malformed URL raises :class:`~percolator.errors.ConfigError` with one line that names the
URL and what is wrong with it, before any connection is attempted.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, urlsplit

from percolator.errors import ConfigError, StoreNotFoundError
from percolator.hostnames import encodable_host
from percolator.numerals import ascii_digits
from percolator.store.base import Store

DEFAULT_STORE_URL = "embedded:./percolator-data"

_HBASE_OPTIONS = {"prefix", "pool_size", "timeout_ms", "transport", "protocol", "thrift2_port"}
#: the values of ``transport`` and ``protocol`` (happybase's; the first is the default)
HBASE_TRANSPORTS = ("buffered", "framed")
HBASE_PROTOCOLS = ("binary", "compact")


@dataclass(frozen=True)
class StoreURL:
    """A parsed store URL."""

    scheme: str  # "memory", "embedded" or "hbase"
    path: str = ""  # embedded: directory; memory: optional shared name
    host: str = ""
    port: int = 0
    options: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        if self.scheme == "hbase":
            query = "&".join(f"{k}={v}" for k, v in sorted(self.options.items()))
            return f"hbase://{self.host}:{self.port}" + (f"?{query}" if query else "")
        return f"{self.scheme}:{self.path}"


def parse_store_url(url: str) -> StoreURL:
    """Parse ``memory:[NAME]``, ``embedded:PATH`` or ``hbase://HOST:PORT[?options]``.

    HBase options: ``prefix`` (table-name prefix), ``pool_size`` and ``timeout_ms``
    (positive integers), ``transport`` (``buffered``, the default, or ``framed``) and
    ``protocol`` (``binary``, the default, or ``compact``), which must match the Thrift
    gateway's settings (e.g. ``hbase://h:9090?transport=framed&protocol=compact``), and
    ``thrift2_port``: the port of a Thrift-2 gateway on the same host, for compare-and-sets
    that carry puts of their row (fewer round trips per transaction; see
    :mod:`percolator.store.hbase`)."""
    if not isinstance(url, str) or not url.strip():
        raise ConfigError(f"store URL must be a non-empty string, got {url!r}")
    url = url.strip()
    scheme, sep, rest = url.partition(":")
    if not sep:
        raise ConfigError(
            f"store URL {url!r} has no scheme; use memory:, embedded:PATH or hbase://HOST:PORT"
        )
    scheme = scheme.lower()
    if scheme == "memory":
        return StoreURL("memory", path=rest)
    if scheme == "embedded":
        if not rest:
            raise ConfigError(f"store URL {url!r} needs a directory: embedded:PATH")
        return StoreURL("embedded", path=os.path.abspath(os.path.expanduser(rest)))
    if scheme == "hbase":
        return _parse_hbase(url)
    raise ConfigError(
        f"store URL {url!r} has unknown scheme {scheme!r}; "
        "use memory:, embedded:PATH or hbase://HOST:PORT"
    )


def _parse_hbase(url: str) -> StoreURL:
    if not url.lower().startswith("hbase://"):
        raise ConfigError(f"store URL {url!r} must look like hbase://HOST:PORT")
    try:
        parts = urlsplit(url)
        hostname = parts.hostname
    except ValueError as exc:  # e.g. "Invalid IPv6 URL" for hbase://[::1
        raise ConfigError(f"store URL {url!r} is malformed: {exc}") from None
    if parts.path not in ("", "/"):
        raise ConfigError(f"store URL {url!r} must not have a path (got {parts.path!r})")
    try:
        port = parts.port
    except ValueError as exc:
        raise ConfigError(f"store URL {url!r} has a bad port: {exc}") from None
    host = hostname or ""
    if not host:
        raise ConfigError(f"store URL {url!r} has no host; use hbase://HOST:PORT")
    if not encodable_host(host):
        raise ConfigError(
            f"store URL {url!r}: host {host!r} is not a host name or address (not ASCII or IDNA)"
        )
    if port is None:
        port = 9090
    options = dict(parse_qsl(parts.query, keep_blank_values=True, strict_parsing=False))
    unknown = set(options) - _HBASE_OPTIONS
    if unknown:
        raise ConfigError(
            f"store URL {url!r} has unknown option(s) {sorted(unknown)}; "
            f"known: {sorted(_HBASE_OPTIONS)}"
        )
    for key in ("pool_size", "timeout_ms"):
        if key in options and not (ascii_digits(options[key]) and int(options[key]) > 0):
            raise ConfigError(f"store URL {url!r}: {key} must be a positive integer")
    if "thrift2_port" in options and not (
        ascii_digits(options["thrift2_port"]) and 0 < int(options["thrift2_port"]) < 65536
    ):
        raise ConfigError(f"store URL {url!r}: thrift2_port must be a port number, 1..65535")
    for key, allowed in (("transport", HBASE_TRANSPORTS), ("protocol", HBASE_PROTOCOLS)):
        if key in options and options[key] not in allowed:
            raise ConfigError(
                f"store URL {url!r}: {key} must be one of {', '.join(allowed)} "
                f"(got {options[key]!r})"
            )
    prefix = options.get("prefix", "")
    if prefix and not all(c.isalnum() or c in "_-." for c in prefix):
        raise ConfigError(f"store URL {url!r}: prefix may hold only letters, digits, _ - .")
    return StoreURL("hbase", host=host, port=port, options=options)


def open_store(url: str | None = None, *, create: bool = True) -> Store:
    """Open the store a URL names (``None``: the embedded default ``./percolator-data``).

    ``create=False`` is for read-only commands (status, inspect, listings, wait): they must
    never create a store, so an embedded directory without a store in it, or a ``memory:``
    store that does not already exist in this process, raises
    :class:`~percolator.errors.StoreNotFoundError` naming it.  So does an embedded database
    file with nothing in it (an empty file); one that is not a store (another SQLite
    database, not SQLite at all) raises :class:`~percolator.errors.StoreError`.  Either
    way the file is left as it was (``EmbeddedStore(create=False)``).

    Raises :class:`ConfigError` for a malformed URL and
    :class:`~percolator.errors.StoreUnavailableError` for an unreachable store.
    """
    text = url if url is not None else DEFAULT_STORE_URL
    parsed = parse_store_url(text)
    if parsed.scheme == "memory":
        from percolator.store.memory import MemoryStore

        if not create and not MemoryStore.exists(parsed.path):
            raise StoreNotFoundError(
                f"store {text!r} does not exist: a memory: store lives inside one process, "
                "so a command started on its own has nothing to read there"
            )
        return MemoryStore.named(parsed.path) if parsed.path else MemoryStore()
    if parsed.scheme == "embedded":
        from percolator.store.embedded import DB_FILE, EmbeddedStore

        if not create and not os.path.isfile(os.path.join(parsed.path, DB_FILE)):
            raise StoreNotFoundError(
                f"store {text!r} does not exist (no embedded store in "
                f"{os.path.abspath(parsed.path)!r}); check the path"
            )
        return EmbeddedStore(parsed.path, create=create)
    from percolator.store.hbase import HBaseStore

    return HBaseStore(
        parsed.host,
        parsed.port,
        prefix=parsed.options.get("prefix", ""),
        pool_size=int(parsed.options.get("pool_size", "8")),
        timeout_ms=int(parsed.options.get("timeout_ms", "30000")),
        transport=parsed.options.get("transport", HBASE_TRANSPORTS[0]),
        protocol=parsed.options.get("protocol", HBASE_PROTOCOLS[0]),
        thrift2_port=int(thrift2) if (thrift2 := parsed.options.get("thrift2_port")) else None,
    )

"""The store backends, as one list: what each can do and how to name a fresh namespace on it.

Tests parametrize over :data:`BACKENDS` (every backend passes the same contract suite), and
tools that must try "each backend" (benchmarks, smoke tests) read it instead of keeping their
own list.  A *namespace* is what one store URL addresses: a named in-process store, a
directory, or a table prefix on an HBase cluster.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit


@dataclass(frozen=True)
class Backend:
    """One store backend (its URL scheme is its name)."""

    name: str
    #: several processes can open one namespace at once (the embedded store through file
    #: locks, HBase through its server); the memory store lives in one process
    shared: bool
    #: the namespace lives on a server whose address must come from elsewhere
    needs_server: bool

    def namespace_url(
        self, token: str, *, directory: str | os.PathLike[str] = "", server_url: str = ""
    ) -> str:
        """The URL of a namespace nobody else uses, named after ``token`` (letters, digits and
        ``_``): ``memory:TOKEN``, ``embedded:DIRECTORY`` (the caller gives a fresh directory),
        or ``server_url`` with the table prefix ``TOKEN_`` added to any it already has."""
        if self.name == "memory":
            return f"memory:{token}"
        if self.name == "embedded":
            if not directory:
                raise ValueError("an embedded namespace needs a fresh directory")
            return f"embedded:{os.fspath(directory)}"
        if not server_url:
            raise ValueError(f"a {self.name} namespace needs the URL of a server")
        return with_table_prefix(server_url, f"{token}_")


BACKENDS: tuple[Backend, ...] = (
    Backend("memory", shared=False, needs_server=False),
    Backend("embedded", shared=True, needs_server=False),
    Backend("hbase", shared=True, needs_server=True),
)


def with_table_prefix(url: str, prefix: str) -> str:
    """An ``hbase://`` URL with ``prefix`` appended to its table prefix (if it has one), so a
    namespace can be carved out of a namespace."""
    prefix = dict(parse_qsl(urlsplit(url).query)).get("prefix", "") + prefix
    return with_url_options(url, prefix=prefix)


def with_url_options(url: str, **options: str) -> str:
    """An ``hbase://`` URL with ``options`` set (replacing any of the same name), keeping
    the others (``thrift2_port``, ``transport``, ...)."""
    parts = urlsplit(url)
    merged = dict(parse_qsl(parts.query, keep_blank_values=True))
    merged.update(options)
    return urlunsplit(parts._replace(query=urlencode(merged)))


def without_url_options(url: str, *names: str) -> str:
    """An ``hbase://`` URL with the options ``names`` left out, keeping the others (e.g.
    the same HBase through its Thrift-1 gateway alone: ``without_url_options(url,
    "thrift2_port")``)."""
    parts = urlsplit(url)
    kept = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k not in names]
    return urlunsplit(parts._replace(query=urlencode(kept)))

"""How clients find and authenticate to oracle servers, shared by the server, its client
and the command line: the ``grpc://`` URL, ``HOST:PORT`` addresses, and the token.

URLs
----
* ``grpc://HOST:PORT[,HOST:PORT...][?options]``: plaintext; ``grpcs://...`` over TLS.

Options (query string):

* ``ca=PATH`` (grpcs only): PEM root certificates to trust (default: the system's).
* ``token_file=PATH``: a file holding the shared token.  Without it the token is taken from
  the environment variable ``PERCOLATOR_ORACLE_TOKEN`` if set.  Tokens are never put in URLs
  (URLs end up in logs).
* ``timeout_ms=N``: how long one request keeps trying across addresses (default 10000).
* ``rpc_timeout_ms=N``: the deadline of one RPC (default 2000).

Anything else raises :class:`~percolator.errors.ConfigError` naming the spec and the problem.

The token
---------
Sent by clients as the gRPC metadata ``authorization: Bearer TOKEN``
(:data:`TOKEN_METADATA_KEY`, :data:`TOKEN_PREFIX`); checked by the server in constant time.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import parse_qsl

from percolator.errors import ConfigError
from percolator.hostnames import encodable_host
from percolator.numerals import ascii_digits

TOKEN_ENV = "PERCOLATOR_ORACLE_TOKEN"
TOKEN_METADATA_KEY = "authorization"
TOKEN_PREFIX = "Bearer "
_OPTIONS = {"ca", "token_file", "timeout_ms", "rpc_timeout_ms"}


def parse_oracle_url(
    spec: str,
) -> tuple[list[str], bool | str, str | None, tuple[float, float]]:
    """``(addresses, tls, token, (timeout_s, rpc_timeout_s))`` of a ``grpc[s]://`` spec."""
    if not isinstance(spec, str):
        raise ConfigError(f"oracle must be None or a grpc:// URL string, got {spec!r}")
    scheme, sep, rest = spec.strip().partition("://")
    if not sep or scheme.lower() not in ("grpc", "grpcs"):
        raise ConfigError(
            f"oracle {spec!r} is not understood: use grpc://HOST:PORT[,HOST:PORT...] "
            "(grpcs:// for TLS), or no oracle for the local one"
        )
    tls_wanted = scheme.lower() == "grpcs"
    hosts, _, query = rest.partition("?")
    addresses = [part.strip() for part in hosts.split(",")]
    for address in addresses:
        host, colon, port = address.rpartition(":")
        if not colon or not host or not ascii_digits(port) or not 0 < int(port) <= 65535:
            raise ConfigError(
                f"oracle {spec!r}: address {address!r} must look like HOST:PORT, PORT in 1..65535"
            )
        if not encodable_host(host):
            raise ConfigError(
                f"oracle {spec!r}: host {host!r} is not a host name or address (not ASCII or IDNA)"
            )
    options = dict(parse_qsl(query, keep_blank_values=True))
    unknown = set(options) - _OPTIONS
    if unknown:
        raise ConfigError(
            f"oracle {spec!r} has unknown option(s) {sorted(unknown)}; known: {sorted(_OPTIONS)}"
        )
    tls: bool | str = tls_wanted
    if "ca" in options:
        if not tls_wanted:
            raise ConfigError(f"oracle {spec!r}: ca= needs grpcs:// (TLS)")
        tls = options["ca"]
    token = os.environ.get(TOKEN_ENV) or None
    if "token_file" in options:
        try:
            token = Path(options["token_file"]).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ConfigError(
                f"oracle {spec!r}: cannot read token_file {options['token_file']!r}: {exc.strerror}"
            ) from None
        except UnicodeDecodeError:
            raise ConfigError(
                f"oracle {spec!r}: token_file {options['token_file']!r} is not UTF-8 text"
            ) from None
        if not token:
            raise ConfigError(f"oracle {spec!r}: token_file {options['token_file']!r} is empty")
    timeouts = []
    for key, default in (("timeout_ms", 10_000), ("rpc_timeout_ms", 2_000)):
        raw = options.get(key, str(default))
        if not ascii_digits(raw) or int(raw) <= 0:
            raise ConfigError(f"oracle {spec!r}: {key} must be a positive integer, got {raw!r}")
        timeouts.append(int(raw) / 1000)
    return addresses, tls, token, (timeouts[0], timeouts[1])


def check_listen_address(address: str) -> tuple[str, int]:
    """Split ``HOST:PORT`` (``[V6]:PORT`` for IPv6); ConfigError naming what is wrong."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not ascii_digits(port) or not 0 <= int(port) <= 65535:
        raise ConfigError(
            f"address {address!r} must look like HOST:PORT, PORT in 0..65535 (for example "
            "127.0.0.1:7070)"
        )
    if not encodable_host(host):
        raise ConfigError(
            f"address {address!r}: host {host!r} is not a host name or address (not ASCII or IDNA)"
        )
    return host.strip("[]"), int(port)

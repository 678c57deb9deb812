"""Whether a host name can reach the socket layer: the one check of every host the engine
takes (store URLs, oracle addresses, listen and metrics addresses)."""

from __future__ import annotations


def encodable_host(host: str) -> bool:
    """Whether sockets and gRPC can take ``host``: ASCII, or a Unicode name IDNA encodes
    (as :mod:`socket` does).  Bytes of the command line that are not UTF-8 (``$'\\xff'``)
    arrive as lone surrogates, which fail here rather than as a TypeError of the socket
    layer or a UnicodeEncodeError of gRPC's."""
    if host.isascii():
        return True  # sockets pass ASCII on as is; so must we (no IDNA label checks)
    try:
        host.encode("idna")
    except UnicodeError:
        return False
    return True

"""Whole numbers as the engine's text inputs spell them (ports, counts, milliseconds in URLs,
addresses and environment variables): the one check before ``int()``."""

from __future__ import annotations


def ascii_digits(text: str) -> bool:
    """Whether ``text`` is a non-empty run of the ASCII digits 0-9.

    ``str.isdigit()`` alone also takes digits ``int()`` refuses ("²") and other scripts'
    ("٣"), which ``int()`` reads but the socket layer, gRPC and HBase do not; ``int()``
    alone takes signs, spaces and underscores."""
    return text.isascii() and text.isdigit()

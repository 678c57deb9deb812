"""How the operator commands print stored bytes."""

from __future__ import annotations


def show_bytes(raw: bytes) -> str:
    """Bytes as text where they are printable UTF-8, else ``0x`` + hex."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return "0x" + raw.hex()
    return text if text.isprintable() else "0x" + raw.hex()

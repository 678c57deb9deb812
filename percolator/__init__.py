"""Percolator-style incremental processing: snapshot-isolation transactions across rows and
observers that run when a column changes, on HBase or an embedded store.

    import percolator
    client = percolator.connect("embedded:./data")
    client.create_table("accounts")
    with client.transaction() as txn:
        txn.set("accounts", b"alice", "balance", b"10")
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from percolator import errors

if TYPE_CHECKING:
    from percolator.client import Client, connect
    from percolator.context import ClientOptions
    from percolator.transaction import Snapshot, Transaction, TxnStatus

__all__ = [
    "Client",
    "ClientOptions",
    "Snapshot",
    "Transaction",
    "TxnStatus",
    "connect",
    "errors",
]
# The distribution's version is the only one: pyproject.toml's, read from the package metadata.
DISTRIBUTION = "percolator-engine"
try:
    __version__ = version(DISTRIBUTION)
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"

# The client is loaded on first use, not by ``import percolator.X``: the packages built on
# the engine (percolator.oracle, ...) share this namespace, and importing one of them must
# not load the whole client.
_LAZY = {
    "Client": "percolator.client",
    "connect": "percolator.client",
    "ClientOptions": "percolator.context",
    "Snapshot": "percolator.transaction",
    "Transaction": "percolator.transaction",
    "TxnStatus": "percolator.transaction",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'percolator' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))

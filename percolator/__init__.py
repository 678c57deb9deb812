"""Percolator-style incremental processing: snapshot-isolation transactions across rows and
observers that run when a column changes, on HBase or an embedded store.

    import percolator
    client = percolator.connect("embedded:./data")
    client.create_table("accounts")
    with client.transaction() as txn:
        txn.set("accounts", b"alice", "balance", b"10")
"""

from importlib.metadata import PackageNotFoundError, version

from percolator import errors
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

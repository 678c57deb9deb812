"""Store backends behind one interface; :func:`open_store` picks one from a URL.

URLs:

* ``memory:`` (optionally ``memory:NAME`` to share one in-process store between clients)
* ``embedded:PATH``: a durable store in a local directory, shared by processes on one machine
* ``hbase://HOST:PORT[?prefix=P&pool_size=N&timeout_ms=T]``: HBase through its Thrift-1 gateway

:data:`BACKENDS` lists them, with what each can do and how to name a fresh namespace on it.
"""

from __future__ import annotations

from percolator.store.backends import BACKENDS, Backend, with_table_prefix
from percolator.store.base import (
    MAX_VERSION,
    Column,
    CompareAndSet,
    Delete,
    FamilySpec,
    Put,
    RowCells,
    ScanOptions,
    Store,
    Version,
)
from percolator.store.url import StoreURL, open_store, parse_store_url

__all__ = [
    "BACKENDS",
    "MAX_VERSION",
    "Backend",
    "Column",
    "CompareAndSet",
    "Delete",
    "FamilySpec",
    "Put",
    "RowCells",
    "ScanOptions",
    "Store",
    "StoreURL",
    "Version",
    "open_store",
    "parse_store_url",
    "with_table_prefix",
]

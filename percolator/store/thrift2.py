"""The part of HBase's Thrift-2 gateway (``hbase thrift2``) the HBase store calls.

The Thrift-1 gateway, which happybase speaks and the store uses for everything else, has
no conditional write of several cells: its ``checkAndPut`` carries one mutation.  The
Thrift-2 gateway's ``checkAndPut`` carries a whole ``TPut``: any cells of the checked row,
each with its own timestamp, applied in one atomic row operation if the check holds.  That
is what :attr:`~percolator.store.base.Store.conditional_puts` needs.

Nor can Thrift-1 name different columns for different rows in one read: its
``getRowsWithColumns`` takes one column list for all rows.  Thrift-2's ``getMultiple``
takes one ``TGet`` per row, each with its own columns and time range, which is what
:meth:`~percolator.store.base.Store.read_cells` needs.

Thrift-1's ``mutateRowsTs`` takes one timestamp for the whole call; Thrift-2's
``putMultiple`` takes a ``TPut`` per row with a timestamp per cell, so a put of several
versions is one call there (:meth:`~percolator.store.hbase.HBaseStore.put`), and so is a
delete of cells at several timestamps: ``deleteMultiple`` takes a ``TDelete`` per row with a
timestamp per column (:meth:`~percolator.store.hbase.HBaseStore.delete_versions`).

Only the calls used are declared here.  Field ids and types are those of the gateway's
published interface (``hbase-thrift``, ``thrift2/hbase.thrift``); Thrift skips fields a side
does not declare, so this subset is wire-compatible with the whole.
"""

from __future__ import annotations

import io
from typing import Any

from thriftpy2.parser import load_fp
from thriftpy2.protocol import TBinaryProtocol, TCompactProtocol
from thriftpy2.thrift import TClient
from thriftpy2.transport import TBufferedTransport, TFramedTransport, TSocket

THRIFT2_IDL = """
struct TColumnValue {
  1: required binary family,
  2: required binary qualifier,
  3: required binary value,
  4: optional i64 timestamp,
}

struct TTimeRange {
  1: required i64 minStamp,
  2: required i64 maxStamp,
}

struct TColumn {
  1: required binary family,
  2: optional binary qualifier,
  3: optional i64 timestamp,
}

struct TGet {
  1: required binary row,
  2: optional list<TColumn> columns,
  3: optional i64 timestamp,
  4: optional TTimeRange timeRange,
  5: optional i32 maxVersions,
}

struct TResult {
  1: optional binary row,
  2: required list<TColumnValue> columnValues,
}

struct TPut {
  1: required binary row,
  2: required list<TColumnValue> columnValues,
  3: optional i64 timestamp,
}

enum TDeleteType {
  DELETE_COLUMN = 0,
  DELETE_COLUMNS = 1,
}

struct TDelete {
  1: required binary row,
  2: optional list<TColumn> columns,
  3: optional i64 timestamp,
  4: optional TDeleteType deleteType = 1,
}

exception TIOError {
  1: optional string message,
  2: optional bool canRetry,
}

exception TIllegalArgument {
  1: optional string message,
}

enum TThriftServerType {
  ONE = 1,
  TWO = 2,
}

service THBaseService {
  bool checkAndPut(
    1: required binary table,
    2: required binary row,
    3: required binary family,
    4: required binary qualifier,
    5: binary value,
    6: required TPut tput,
  ) throws (1: TIOError io),

  void putMultiple(
    1: required binary table,
    2: required list<TPut> tputs,
  ) throws (1: TIOError io),

  list<TDelete> deleteMultiple(
    1: required binary table,
    2: required list<TDelete> tdeletes,
  ) throws (1: TIOError io),

  list<TResult> getMultiple(
    1: required binary table,
    2: required list<TGet> tgets,
  ) throws (1: TIOError io),

  TThriftServerType getThriftServerType(),
}
"""

# thriftpy2 requires a module name ending in "_thrift"; it registers the module under it.
thrift2: Any = load_fp(io.StringIO(THRIFT2_IDL), module_name="percolator_hbase_thrift2_thrift")

THBaseService: Any = thrift2.THBaseService
TColumnValue: Any = thrift2.TColumnValue
TPut: Any = thrift2.TPut
TColumn: Any = thrift2.TColumn
TGet: Any = thrift2.TGet
TDelete: Any = thrift2.TDelete
#: a ``TDelete`` column with a timestamp removes every version at or below it (HBase
#: ``Delete.addColumns``), like a Thrift-1 delete mutation sent with ``mutateRowsTs``
DELETE_COLUMNS: int = thrift2.TDeleteType.DELETE_COLUMNS
TTimeRange: Any = thrift2.TTimeRange
TIOError: type[Exception] = thrift2.TIOError
TIllegalArgument: type[Exception] = thrift2.TIllegalArgument
#: ``getThriftServerType()``'s answer from a Thrift-2 gateway
SERVER_TYPE_TWO: int = thrift2.TThriftServerType.TWO


def connect(
    host: str, port: int, timeout_ms: int, transport: str = "buffered", protocol: str = "binary"
) -> tuple[Any, Any]:
    """Open a connection to the Thrift-2 gateway at ``host:port``: ``(client, transport)``,
    with the same transport and protocol classes happybase uses for Thrift-1.  Raises what
    opening the socket raises (thriftpy2's ``TTransportException``, ``OSError``)."""
    # thriftpy2 has no type hints: its classes are called through Any.
    socket_class: Any = TSocket
    transport_class: Any = TFramedTransport if transport == "framed" else TBufferedTransport
    protocol_class: Any = TCompactProtocol if protocol == "compact" else TBinaryProtocol
    opened = transport_class(socket_class(host=host, port=port, socket_timeout=timeout_ms))
    opened.open()
    client_class: Any = TClient
    return client_class(THBaseService, protocol_class(opened, decode_response=False)), opened

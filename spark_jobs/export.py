"""Export: read a table at one snapshot timestamp, in parallel row ranges, into a DataFrame
or Parquet.

    from percolator.spark_jobs.export import ExportOptions, export_table, write_export
    export = export_table(spark, ExportOptions(store="hbase://zk:9090", table="accounts",
                                               columns=("balance",)))
    export.df.agg(...)                 # read lazily, always at export.read_ts
    write_export(spark, options, "out/accounts.parquet")

Consistency
-----------
The driver takes **one** ``read_ts`` from the oracle (or uses the one given); every executor
reads its ranges through :meth:`percolator.Snapshot.scan` at that timestamp.  A snapshot read
at ``read_ts`` sees exactly the transactions whose commit timestamp is ``<= read_ts``: locks
of transactions that might commit below it are resolved (waited for, rolled forward or
back) before reading.  Since ``read_ts`` was handed out after every transaction that had
committed when the export began, the export reflects exactly the transactions committed
before it began (and none that commit while it runs), whatever the writers do meanwhile.

Layouts
-------
``wide`` (when ``columns`` are named): one row per table row, ``row`` then one column per
named column (null where absent); rows with none of them are left out.
``cells``: one row per cell: ``row``, ``column``, ``value``.
Rows and values are ``binary``; with ``strings=True`` they are decoded as UTF-8 (a value that
is not UTF-8 fails the export with an error naming the cell).

Requested columns
-----------------
The store is schemaless: a column exists at ``read_ts`` if at least one of its cells is
visible there.  The executors count the cells they read per requested column (Spark
accumulators, no extra reads).  :func:`write_export` fails with
:class:`MissingColumnsError` when a requested column had no cell at all (a typo would
otherwise export nothing, or a column of nulls, and succeed): the message names the
columns and the table, lists the columns its first rows do have, and the output just
written is removed.  An empty table (no cell visible at ``read_ts``) exports no row with a
warning, whatever columns were requested: that is its content, not a typo.  A lazy
:func:`export_table` cannot check before its DataFrame is read: see
:meth:`Export.cells_found`.

Splitting
---------
The row space is cut into ``splits`` ranges (default: four per core) at row keys sampled
from the lock family on the driver (one scan of the lock family - one small cell per cell,
kept in memory by HBase; no data is read), or at the ``split_keys`` given.  The ranges
cover every key, so the sampling only balances the work; it does not affect the result.

Garbage collection
------------------
Reads below the GC safe point fail (:class:`~percolator.errors.SafePointError`).
:func:`write_export` holds an open transaction at ``read_ts`` for its whole run, which keeps
the safe point below it.  A DataFrame returned by :func:`export_table` is lazy: it reads when
an action runs, at the same ``read_ts`` every time, so evaluate it within the GC life time
(default 10 minutes) or use :func:`write_export`.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from percolator.spark_jobs.session import (
    SparkJobError,
    check_store_for_spark,
    import_pyspark,
    session_master,
    spark_failure_reason,
)

import percolator
from percolator.command_options import connect_existing
from percolator.errors import ConfigError, InvalidArgumentError, TableNotFoundError
from percolator.layout import LOCK, check_table_name, encode_column
from percolator.store.base import ScanOptions
from percolator.store.url import DEFAULT_STORE_URL, parse_store_url

if TYPE_CHECKING:
    from pyspark import Accumulator
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

LAYOUTS = ("wide", "cells")
#: at most this many sampled keys are kept on the driver while splitting
_MAX_SAMPLES = 4096
_SCAN_BATCH = 500
#: rows whose columns a failed export lists (see :func:`_columns_seen`)
_PEEK_ROWS = 1000


class MissingColumnsError(ConfigError):
    """Requested columns with no cell visible at the export's ``read_ts`` (``columns``,
    in the order requested) in ``table``."""

    def __init__(self, message: str, table: str, columns: Sequence[str]) -> None:
        super().__init__(message)
        self.table = table
        self.columns = tuple(columns)


@dataclass(frozen=True)
class ExportOptions:
    """What to export.  ``read_ts``: None for a fresh timestamp from the oracle.
    ``layout``: ``wide`` (needs ``columns``) or ``cells``; default wide if columns are
    named, else cells.  ``splits``: number of row ranges (default four per core).
    ``split_keys``: explicit range boundaries instead of sampling."""

    store: str
    table: str
    columns: tuple[str, ...] | None = None
    layout: str | None = None
    read_ts: int | None = None
    oracle: str | None = None
    splits: int | None = None
    split_keys: tuple[bytes, ...] | None = None
    strings: bool = False
    client_options: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_table_name(self.table)
        if isinstance(self.columns, str):
            raise InvalidArgumentError("columns must be a sequence of column names")
        for column in self.columns or ():
            try:
                encode_column(column, allow_reserved=True)
            except InvalidArgumentError as exc:
                raise ConfigError(f"export column: {exc}") from None
        if self.columns is not None and len(set(self.columns)) != len(self.columns):
            raise ConfigError(f"export columns repeat a name: {list(self.columns)}")
        if self.layout is not None and self.layout not in LAYOUTS:
            raise ConfigError(f"export layout {self.layout!r} is not one of {list(LAYOUTS)}")
        if self.layout == "wide" and not self.columns:
            raise ConfigError("the wide layout needs the columns to export (--column)")
        if self.splits is not None and (not isinstance(self.splits, int) or self.splits < 1):
            raise ConfigError(f"splits must be a positive integer, got {self.splits!r}")
        if self.read_ts is not None and (not isinstance(self.read_ts, int) or self.read_ts <= 0):
            raise ConfigError(f"read_ts must be a positive integer, got {self.read_ts!r}")
        percolator.ClientOptions(**self.client_options)

    @property
    def effective_layout(self) -> str:
        return self.layout or ("wide" if self.columns else "cells")


@dataclass
class Export:
    """A lazily-read export: ``df`` reads ``table`` at ``read_ts`` over ``ranges``.
    ``columns``: the requested columns (empty: every cell), counted by ``counters``."""

    df: DataFrame
    table: str
    read_ts: int
    ranges: list[tuple[bytes, bytes | None]]
    columns: tuple[str, ...] = ()
    counters: tuple[Accumulator[int], ...] = ()

    def cells_found(self) -> dict[str, int]:
        """Cells read so far of each requested column, by the actions run on ``df`` ({}
        when no columns were requested).  Spark counts each successful task once per
        action, so after one action that read all of ``df`` (a write, a count) the counts
        are that snapshot's; every further action adds its reads again."""
        return {column: c.value for column, c in zip(self.columns, self.counters, strict=True)}


# --------------------------------------------------------------------------- splitting


def sample_split_keys(
    client: percolator.Client,
    table: str,
    splits: int,
    columns: Sequence[str] | None = None,
) -> list[bytes]:
    """About ``splits - 1`` row keys that cut the table into ranges of similar row counts.

    One scan of the lock family keeps every ``stride``-th row key, doubling the stride when
    the sample grows past its bound, so memory stays bounded on any table size."""
    if splits <= 1:
        return []
    qualifiers = [c.encode("utf-8") for c in columns] if columns else None
    options = ScanOptions(qualifiers=qualifiers, batch_size=_SCAN_BATCH)
    samples: list[bytes] = []
    stride = 1
    for seen, (row, _) in enumerate(client.store.scan(table, LOCK, options)):
        if seen % stride == 0:
            samples.append(row)
            if len(samples) >= _MAX_SAMPLES:
                samples = samples[::2]
                stride *= 2
    if len(samples) < 2:
        return []
    step = len(samples) / splits
    keys = sorted({samples[int(i * step)] for i in range(1, splits) if int(i * step) > 0})
    return keys


def ranges_of(keys: Sequence[bytes]) -> list[tuple[bytes, bytes | None]]:
    """``[start, stop)`` ranges covering every row key, cut at ``keys``."""
    bounds = sorted(set(k for k in keys if k))
    starts: list[bytes] = [b"", *bounds]
    stops: list[bytes | None] = [*bounds, None]
    return list(zip(starts, stops, strict=True))


# --------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class _ReadPlan:
    store: str
    oracle: str | None
    client_options: Mapping[str, int]
    table: str
    read_ts: int
    columns: tuple[str, ...] | None
    layout: str
    strings: bool


def _decode(value: bytes, strings: bool, where: str) -> bytes | str:
    if not strings:
        return value
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(
            f"{where} is not UTF-8 ({value[:40]!r}...); export without strings"
        ) from None


def _read_range(
    plan: _ReadPlan,
    bounds: tuple[bytes, bytes | None],
    counters: Sequence[Accumulator[int]],
) -> Iterator[tuple[Any, ...]]:
    """The output rows of one range; adds the cells found of each of ``plan.columns`` to
    its counter once the range is read (one accumulator update per task, not per cell)."""
    start, stop = bounds
    found = dict.fromkeys(plan.columns or (), 0)
    with percolator.connect(plan.store, oracle=plan.oracle, **plan.client_options) as client:
        snapshot = client.snapshot(plan.read_ts)
        columns = list(plan.columns) if plan.columns is not None else None
        for row, cells in snapshot.scan(plan.table, start, stop, columns):
            for column in found:
                if column in cells:
                    found[column] += 1
            key = _decode(row, plan.strings, f"row key {row[:40]!r}")
            if plan.layout == "wide":
                assert plan.columns is not None
                yield (
                    key,
                    *(
                        _decode(cells[c], plan.strings, f"{plan.table}/{row!r}/{c}")
                        if c in cells
                        else None
                        for c in plan.columns
                    ),
                )
            else:
                for column in sorted(cells):
                    value = _decode(cells[column], plan.strings, f"{plan.table}/{row!r}/{column}")
                    yield key, column, value
    for counter, count in zip(counters, found.values(), strict=True):
        counter.add(count)


def _schema(plan: _ReadPlan) -> Any:
    from pyspark.sql.types import BinaryType, StringType, StructField, StructType

    data = StringType() if plan.strings else BinaryType()
    fields = [StructField("row", data, nullable=False)]
    if plan.layout == "wide":
        assert plan.columns is not None
        fields += [StructField(c, data, nullable=True) for c in plan.columns]
    else:
        fields += [
            StructField("column", StringType(), nullable=False),
            StructField("value", data, nullable=False),
        ]
    return StructType(fields)


def export_table(
    spark: SparkSession, options: ExportOptions, *, read_ts: int | None = None
) -> Export:
    """A DataFrame of ``options.table`` at one snapshot (see the module docstring).

    Raises ConfigError (unknown table, unusable store URL) before any Spark job runs."""
    import_pyspark()
    store = check_store_for_spark(options.store, session_master(spark))
    layout = options.effective_layout
    # An export only reads: a store that does not exist is an error, never created here.
    with connect_existing(options.store, options.oracle, **options.client_options) as c:
        if not c.store.table_exists(options.table):
            raise TableNotFoundError(options.table)
        ts = read_ts or options.read_ts or c.oracle.get_timestamp()
        c.snapshot(ts)  # fails now, with a clear error, if ts is below the GC safe point
        if options.split_keys is not None:
            keys = list(options.split_keys)
        else:
            splits = options.splits or 4 * spark.sparkContext.defaultParallelism
            keys = sample_split_keys(c, options.table, splits, options.columns)
    ranges = ranges_of(keys)
    plan = _ReadPlan(
        store=store,
        oracle=options.oracle,
        client_options=dict(options.client_options),
        table=options.table,
        read_ts=ts,
        columns=options.columns,
        layout=layout,
        strings=options.strings,
    )
    columns = options.columns or ()
    counters = tuple(spark.sparkContext.accumulator(0) for _ in columns)
    rdd = spark.sparkContext.parallelize(ranges, len(ranges)).flatMap(
        lambda bounds: _read_range(plan, bounds, counters)
    )
    df = spark.createDataFrame(rdd, _schema(plan))
    return Export(df, options.table, ts, ranges, columns, counters)


def _columns_seen(client: percolator.Client, table: str, read_ts: int) -> tuple[list[str], bool]:
    """The columns with a cell visible at ``read_ts`` in the first ``_PEEK_ROWS`` rows of
    ``table`` that ever held a cell, and whether those were all of its rows.  Bounded
    whatever the table's size: one limited scan of the lock family (every cell ever
    written has a lock cell) finds where those rows end; only they are read."""
    options = ScanOptions(limit=_PEEK_ROWS + 1, batch_size=_PEEK_ROWS + 1)
    rows = [row for row, _ in client.store.scan(table, LOCK, options)]
    stop = rows[_PEEK_ROWS] if len(rows) > _PEEK_ROWS else None
    seen: set[str] = set()
    with client.snapshot(read_ts) as snapshot:
        for _, cells in snapshot.scan(table, b"", stop):
            seen.update(cells)
    return sorted(seen), stop is None


def _missing_columns_message(
    table: str, read_ts: int, missing: Sequence[str], seen: Sequence[str], whole: bool
) -> str:
    """Why the export of ``table`` fails: its ``missing`` columns, and what it does hold
    (``seen``, of all its rows if ``whole``: :func:`_columns_seen`)."""
    names = ", ".join(repr(c) for c in missing)
    what = f"column {names} has" if len(missing) == 1 else f"columns {names} have"
    where = "its columns" if whole else f"the columns of its first {_PEEK_ROWS} rows"
    found = ", ".join(repr(c) for c in seen) if seen else "none"
    return (
        f"export of {table!r}: {what} no cell in the table at read_ts {read_ts} (a typo?); "
        f"{where}: {found}"
    )


def _remove_output(spark: SparkSession, output: str) -> str | None:
    """Delete ``output`` (written by Spark) on whichever file system holds it; None when
    done, else why not."""
    try:
        context = spark.sparkContext
        jvm = context._jvm
        assert jvm is not None  # set while the context runs: it has just written output
        path = jvm.org.apache.hadoop.fs.Path(output)
        path.getFileSystem(context._jsc.hadoopConfiguration()).delete(path, True)
    except Exception as exc:  # Py4J errors from the JVM's file system
        return spark_failure_reason(exc)
    return None


def check_output(output: str, mode: str, store: str | None = None) -> None:
    """ConfigError, before anything is written, if a local ``output`` may not be written:

    * it exists and ``mode`` does not allow replacing it;
    * ``mode`` replaces it, and it is not an earlier export (a directory of Spark's
      ``part-*`` files, ``_SUCCESS`` and checksums, or empty): Spark deletes the whole path
      first, so a typo would delete whatever was there;
    * it is, holds or lies inside the embedded store ``store`` (a store URL; None: the
      default store), which the write would overwrite or mix its files into.

    Outputs on other file systems (``hdfs://``, ``s3a://``) are left to Spark."""
    local = _local(output)
    if local is None:
        return
    target = os.path.realpath(local)
    parsed = parse_store_url(store if store is not None else DEFAULT_STORE_URL)
    if parsed.scheme == "embedded":
        store_dir = os.path.realpath(parsed.path)
        if os.path.commonpath([target, store_dir]) in (target, store_dir):
            raise ConfigError(
                f"export output {output} is, holds or lies inside the store's directory "
                f"{parsed.path}: choose a path outside it"
            )
    if not os.path.lexists(local):
        return
    if mode in ("error", "errorifexists"):
        raise ConfigError(f"export output {output} already exists; remove it or overwrite it")
    if not _is_export(local):
        raise ConfigError(
            f"export output {output} exists and is not an earlier export (Parquet part files "
            "and _SUCCESS): refusing to overwrite it, which would delete it; remove it "
            "yourself or choose another path"
        )


def _is_export(path: str) -> bool:
    """Whether the local ``path`` looks like Spark's output: a directory holding only its
    ``part-*`` files, ``_*`` markers, ``.``-checksums and ``key=value`` partitions."""
    if not os.path.isdir(path) or os.path.islink(path):
        return False
    for entry in os.scandir(path):
        name = entry.name
        if entry.is_dir(follow_symlinks=False):
            if "=" not in name or not _is_export(entry.path):
                return False
        elif not name.startswith(("part-", "_", ".")):
            return False
    return True


def _local(path: str) -> str | None:
    """The local path of ``path``; None on another file system (Spark checks those)."""
    parts = urlsplit(path)
    if parts.scheme == "file":
        return parts.path
    if parts.scheme and len(parts.scheme) > 1:
        return None
    return path


@dataclass
class ExportReport:
    table: str
    read_ts: int
    rows: int
    ranges: int
    output: str
    seconds: float

    def summary(self) -> str:
        return (
            f"exported {self.rows} rows of {self.table} at read_ts {self.read_ts} "
            f"({self.ranges} ranges) to {self.output} in {self.seconds:.1f} s"
        )


def write_export(
    spark: SparkSession,
    options: ExportOptions,
    output: str,
    *,
    mode: str = "errorifexists",
) -> ExportReport:
    """Export to Parquet at ``output``.  While it runs, a reader open on the driver at
    ``read_ts`` keeps the GC safe point at or below it: a snapshot at ``options.read_ts``
    (which fails at once with SafePointError if GC passed it already), or, when that is
    None, a read-only transaction whose ``start_ts`` is the read timestamp.  ``mode`` is
    Spark's save mode.

    MissingColumnsError when one of ``options.columns`` has no cell at ``read_ts`` (see
    the module docstring); the output just written is removed first, so no wrong export
    is left behind (with ``mode="overwrite"`` the previous output is gone as well, as on
    any failure of the write)."""
    started = time.monotonic()
    check_output(output, mode, options.store)
    with connect_existing(options.store, options.oracle, **options.client_options) as c:
        # A guard at a fresh timestamp would not protect an older options.read_ts.
        guard = c.transaction() if options.read_ts is None else c.snapshot(options.read_ts)
        try:
            # Published now (not only by the client's periodic publisher): GC sees it at once.
            c.publish_min_start_ts()
            read_ts = guard.read_ts
            export = export_table(spark, options, read_ts=read_ts)
            from pyspark.errors import PySparkException

            try:
                export.df.write.mode(mode).parquet(output)
                rows = spark.read.parquet(output).count()
            except PySparkException as exc:
                raise SparkJobError(
                    f"export of {options.table} to {output} failed: {spark_failure_reason(exc)}"
                ) from None
            except Exception as exc:  # Py4J errors from the JVM side of the write
                raise SparkJobError(
                    f"export of {options.table} to {output} failed: {spark_failure_reason(exc)}"
                ) from None
            missing = [column for column, n in export.cells_found().items() if n == 0]
            # Read while the guard still holds read_ts above the GC safe point.
            seen, whole = _columns_seen(c, options.table, read_ts) if missing else ([], True)
            if missing and whole and not seen:
                # An empty table exports no row whatever its columns are called: that is
                # its content, not a typo.
                log.warning(
                    "export of %r: the table is empty at read_ts %d", options.table, read_ts
                )
            elif missing:
                message = _missing_columns_message(options.table, read_ts, missing, seen, whole)
                not_removed = _remove_output(spark, output)
                if not_removed is None:
                    message += f"; nothing was exported ({output} removed)"
                else:
                    message += f"; {output} is left behind (cannot remove it: {not_removed})"
                raise MissingColumnsError(message, options.table, missing)
        finally:
            guard.close()
    return ExportReport(
        options.table, read_ts, rows, len(export.ranges), output, time.monotonic() - started
    )

"""The input of a backfill, in both modes: options, reading, mapping, the check pass, and
the bucketing that both write by.

The transactional mode (:mod:`percolator.spark_jobs.backfill`) and the bulk mode
(:mod:`percolator.spark_jobs.bulk`) differ only in how they write.  Everything before the
write is here, once: :func:`prepare_input` reads the input (or takes a DataFrame), maps
every row to cells ("Mapping" below), counts and samples the bad rows, digests the good
ones, and keeps the mapped rows persisted, so the write pass writes exactly what was
checked; :func:`bucketed` then puts the rows of one key in one bucket, in the same order on
every run and retry (module :mod:`~percolator.spark_jobs.backfill`, "Exactly once").

Mapping
-------
One input row becomes one table row: the ``key`` column gives the row key and each mapped
value column one cell (column name = the mapping's target).  String and binary values are
stored as they are (strings as UTF-8); other scalar types as Spark's ``CAST(x AS STRING)``
(so ``1.5``, ``true``, ``2024-01-31``; timestamps in the session time zone).  A null value
writes no cell.  Keys may be string, binary, integer, decimal or date (the last three as
their decimal/ISO text, which sorts as text).  Nested types (arrays, maps, structs) are
refused before anything is read: convert them first.

A row that cannot be mapped is a *bad row*, with one of the reasons ``missing-key`` (null
or empty key), ``key-too-long``, ``value-too-large`` (over ``max_value_bytes``),
``malformed-record`` (a CSV/JSON record that does not parse under the schema) or
``no-values`` (every value null).  Bad rows are counted, reported with examples, and never
written; the whole input is checked **before anything is written**, and the job fails if
they exceed the threshold (default: any bad row fails the job).
"""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import math
import os
import signal
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
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
from percolator.errors import (
    ConfigError,
    InvalidArgumentError,
)
from percolator.layout import MAX_VALUE_BYTES, check_table_name, encode_column
from percolator.store.base import MAX_ROW_LENGTH

if TYPE_CHECKING:
    from pyspark.rdd import RDD
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)


DEFAULT_PROGRESS_TABLE = "backfill_progress"
DEFAULT_BATCH_SIZE = 200
FORMATS = ("parquet", "csv", "json")
BAD_REASONS = ("missing-key", "key-too-long", "value-too-large", "malformed-record", "no-values")
CORRUPT_COLUMN = "_corrupt_record"
MAX_BUCKETS = 4096
_JOB_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")
_EXTENSIONS = {
    ".parquet": "parquet",
    ".csv": "csv",
    ".json": "json",
    ".jsonl": "json",
    ".ndjson": "json",
}
_EXAMPLE_CHARS = 200


# --------------------------------------------------------------------------- options


@dataclass(frozen=True)
class ColumnMapping:
    """Input column ``source`` becomes table column ``target`` (default: the same name)."""

    source: str
    target: str = ""

    @property
    def column(self) -> str:
        return self.target or self.source

    @staticmethod
    def parse(spec: str) -> ColumnMapping:
        """``SOURCE`` or ``SOURCE=TARGET``."""
        source, renamed, target = spec.partition("=")
        if not source.strip() or (renamed and not target.strip()):
            # "v=" (a rename whose target was lost, e.g. to an unset shell variable) must
            # not quietly store the column under its own name.
            raise ConfigError(f"column mapping {spec!r} must look like SOURCE or SOURCE=TARGET")
        return ColumnMapping(source.strip(), target.strip())


@dataclass(frozen=True)
class InjectedFailure:
    """A testing aid: make write tasks fail on purpose, to exercise recovery.

    In the attempts numbered ``0 .. attempts-1`` of a write task (of the tasks of
    ``partitions``, default all), right after the attempt handled (committed or skipped)
    ``after_batches`` batches, ``raise`` a RuntimeError or ``kill`` the executor's Python
    worker with SIGKILL.  Spark then retries the task (up to ``spark.task.maxFailures``);
    with ``attempts`` at least that limit the job fails."""

    after_batches: int
    action: str = "raise"
    attempts: int = 1
    partitions: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.action not in ("raise", "kill"):
            raise InvalidArgumentError(
                f"injected failure action must be raise or kill, got {self.action!r}"
            )
        if self.after_batches < 0 or self.attempts < 0:
            raise InvalidArgumentError("injected failure counts must be >= 0")


@dataclass(frozen=True)
class BackfillOptions:
    """What to load where.  See the module docstring for the semantics.

    ``inputs``: paths or URLs Spark can read (local paths are checked up front).
    ``format``: ``parquet``, ``csv`` or ``json``; default from the file extension.
    ``reader_options``: passed to Spark's reader (CSV defaults: ``header=true``, every column
    a string; ``enforceSchema=false`` so a header that disagrees with ``schema`` fails).
    ``schema``: a DDL string (``"url STRING, body STRING, rank INT"``); CSV/JSON records that
    do not parse under it are bad rows (``malformed-record``); a Parquet input whose schema
    differs from it fails the job up front.
    ``columns``: value columns (default: every input column but the key).
    ``job_id``: names the job's progress (default: derived, see :func:`default_job_id`).
    ``batch_size`` / ``buckets``: rows per transaction / number of buckets (write tasks);
    pinned by the job record on the first run (None: the recorded value, else a default).
    ``max_bad_rows`` / ``max_bad_fraction``: the job fails when the bad rows exceed either
    limit given; with neither given, any bad row fails it.
    ``client_options``: :class:`percolator.ClientOptions` fields for the executors' clients.
    """

    store: str
    table: str
    inputs: tuple[str, ...]
    key: str
    columns: tuple[ColumnMapping, ...] = ()
    format: str | None = None
    reader_options: Mapping[str, str] = field(default_factory=dict)
    schema: str | None = None
    oracle: str | None = None
    job_id: str | None = None
    progress_table: str = DEFAULT_PROGRESS_TABLE
    batch_size: int | None = None
    buckets: int | None = None
    max_bad_rows: int | None = None
    max_bad_fraction: float | None = None
    max_value_bytes: int = MAX_VALUE_BYTES
    examples: int = 5
    client_options: Mapping[str, int] = field(default_factory=dict)
    progress_interval_s: float = 5.0
    inject_failure: InjectedFailure | None = None

    def __post_init__(self) -> None:
        if isinstance(self.inputs, str):
            raise InvalidArgumentError("inputs must be a sequence of paths, not one string")
        check_table_name(self.table)
        check_table_name(self.progress_table)
        if self.progress_table == self.table:
            raise ConfigError(
                f"the progress table must differ from the target table {self.table!r}"
            )
        if not isinstance(self.key, str) or not self.key:
            raise ConfigError("backfill needs the name of the key column")
        if self.format is not None and self.format not in FORMATS:
            raise ConfigError(f"input format {self.format!r} is not one of {list(FORMATS)}")
        if self.job_id is not None:
            check_job_id(self.job_id)
        for name in ("batch_size", "buckets"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if self.buckets is not None and self.buckets > MAX_BUCKETS:
            raise ConfigError(f"buckets must be at most {MAX_BUCKETS}, got {self.buckets}")
        if self.max_bad_rows is not None and self.max_bad_rows < 0:
            raise ConfigError(f"max_bad_rows must be >= 0, got {self.max_bad_rows}")
        if self.max_bad_fraction is not None and not 0 <= self.max_bad_fraction <= 1:
            raise ConfigError(f"max_bad_fraction must be in [0, 1], got {self.max_bad_fraction}")
        if not 0 < self.max_value_bytes <= MAX_VALUE_BYTES:
            raise ConfigError(f"max_value_bytes must be in 1..{MAX_VALUE_BYTES}")
        if self.progress_interval_s <= 0:
            raise ConfigError("progress_interval_s must be > 0")
        percolator.ClientOptions(**self.client_options)  # validates names and values
        # A tuple, so that checking it here cannot use up an iterator the job reads later.
        object.__setattr__(self, "columns", tuple(self.columns))
        check_targets(self.columns)  # the rest of the mapping needs the input's schema


def check_job_id(job_id: str) -> str:
    if (
        not isinstance(job_id, str)
        or not 0 < len(job_id) <= 100
        or not set(job_id) <= _JOB_ID_CHARS
    ):
        raise ConfigError(
            f"job id {job_id!r} is invalid: use 1..100 letters, digits, '_', '.', '-'"
        )
    return job_id


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class BadRow:
    """An input row that could not be mapped."""

    reason: str
    detail: str
    record: str

    def __str__(self) -> str:
        return f"{self.reason}: {self.detail}: {self.record}"


@dataclass
class BackfillReport:
    """What a run did.  ``rows_written`` were committed by this run; ``rows_skipped`` had
    been committed before (earlier attempt or run) and were left alone."""

    job_id: str
    table: str
    rows_read: int = 0
    rows_good: int = 0
    rows_written: int = 0
    rows_skipped: int = 0
    batches_written: int = 0
    batches_skipped: int = 0
    duplicate_keys: int = 0
    conflicts: int = 0
    bad_rows: int = 0
    bad_by_reason: dict[str, int] = field(default_factory=dict)
    examples: list[BadRow] = field(default_factory=list)
    buckets: int = 0
    batch_size: int = 0
    #: the whole run, and the part spent checking the input before writing
    seconds: float = 0.0
    check_seconds: float = 0.0
    #: ``transactional`` or ``bulk`` (percolator/spark_jobs/bulk.py); a bulk load's
    #: timestamps, and its observed columns that did / did not get notifications
    mode: str = "transactional"
    load_start_ts: int = 0
    load_commit_ts: int = 0
    notified_columns: list[str] = field(default_factory=list)
    unnotified_columns: list[str] = field(default_factory=list)
    #: whether the job is done (every batch committed), and the batch markers this run
    #: removed once it was (one small row per batch)
    done: bool = False
    markers_removed: int = 0

    @property
    def rate(self) -> float:
        """Rows handled (written or skipped) per second of the run."""
        done = self.rows_written + self.rows_skipped
        return done / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> str:
        if self.mode == "bulk":
            return self._bulk_summary()
        lines = [
            f"backfill {self.job_id} into {self.table}: {self.rows_read} rows read, "
            f"{self.rows_written} written, {self.rows_skipped} already committed before, "
            f"{self.bad_rows} bad; {self.batches_written} batches committed, "
            f"{self.batches_skipped} skipped; {self.seconds:.1f} s ({self.rate:.0f} rows/s)"
        ]
        if self.done:
            lines.append(f"  job done; {self.markers_removed} batch markers removed")
        if self.duplicate_keys:
            lines.append(
                f"  {self.duplicate_keys} rows repeated an earlier key (merged into one row; "
                "later columns win in (key, row digest) order)"
            )
        lines.extend(_bad_row_lines(self.bad_by_reason, self.examples))
        return "\n".join(lines)

    def _bulk_summary(self) -> str:
        done = (
            f"{self.rows_written} written and published"
            if self.rows_written or not self.rows_skipped
            else f"nothing written: the load was published before ({self.rows_skipped} rows)"
        )
        lines = [
            f"bulk load {self.job_id} into {self.table}: {self.rows_read} rows read, {done}, "
            f"{self.bad_rows} bad; start_ts {self.load_start_ts}, commit_ts "
            f"{self.load_commit_ts}; {self.seconds:.1f} s ({self.rate:.0f} rows/s)"
        ]
        if self.notified_columns:
            lines.append(f"  observers will process columns {self.notified_columns}")
        if self.unnotified_columns:
            lines.append(
                f"  NOT notified (by choice): observed columns "
                f"{self.unnotified_columns}; observers will not see the loaded rows"
            )
        if self.duplicate_keys:
            lines.append(
                f"  {self.duplicate_keys} rows repeated an earlier key (merged into one row; "
                "later columns win in (key, row digest) order)"
            )
        lines.extend(_bad_row_lines(self.bad_by_reason, self.examples))
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "table": self.table,
            "rows_read": self.rows_read,
            "rows_good": self.rows_good,
            "rows_written": self.rows_written,
            "rows_skipped": self.rows_skipped,
            "batches_written": self.batches_written,
            "batches_skipped": self.batches_skipped,
            "duplicate_keys": self.duplicate_keys,
            "conflicts": self.conflicts,
            "bad_rows": self.bad_rows,
            "bad_by_reason": dict(self.bad_by_reason),
            "examples": [str(e) for e in self.examples],
            "buckets": self.buckets,
            "batch_size": self.batch_size,
            "seconds": self.seconds,
            "check_seconds": self.check_seconds,
            "mode": self.mode,
            "load_start_ts": self.load_start_ts,
            "load_commit_ts": self.load_commit_ts,
            "notified_columns": list(self.notified_columns),
            "unnotified_columns": list(self.unnotified_columns),
            "done": self.done,
            "markers_removed": self.markers_removed,
        }


def _bad_row_lines(by_reason: Mapping[str, int], examples: Sequence[BadRow]) -> list[str]:
    lines = []
    if by_reason:
        counts = ", ".join(f"{n} {reason}" for reason, n in sorted(by_reason.items()))
        lines.append(f"  bad rows: {counts}")
        lines.extend(f"    e.g. {example}" for example in examples)
    return lines


class BadRowsError(SparkJobError, ConfigError):
    """More rows than allowed could not be mapped; nothing was written."""

    def __init__(self, message: str, report: BackfillReport) -> None:
        super().__init__(message)
        self.report = report


# --------------------------------------------------------------------------- input


def detect_format(inputs: Sequence[str]) -> str:
    """The format named by the inputs' extension (looking inside local directories)."""
    found: set[str] = set()
    for path in inputs:
        names = [path]
        local = _local_path(path)
        if local is not None and os.path.isdir(local):
            names = [n for n in os.listdir(local) if not n.startswith(("_", "."))]
        for name in names:
            stem = name[:-3] if name.endswith(".gz") else name
            for ext, fmt in _EXTENSIONS.items():
                if stem.endswith(ext) or f"{ext}." in os.path.basename(stem):
                    found.add(fmt)
    if len(found) != 1:
        what = f"several formats {sorted(found)}" if found else "no known extension"
        raise ConfigError(
            f"cannot tell the input format of {list(inputs)} ({what}); pass format "
            f"(--format) as one of {list(FORMATS)}"
        )
    return found.pop()


def _local_path(path: str) -> str | None:
    """The local file-system path of ``path``, or None for a URL of another file system."""
    parts = urlsplit(path)
    if parts.scheme == "file":
        return parts.path
    if parts.scheme and len(parts.scheme) > 1:  # hdfs://, s3a://, ... (not C:\ on Windows)
        return None
    return path


def check_inputs_exist(inputs: Sequence[str]) -> None:
    """ConfigError naming each local input path that matches nothing."""
    missing = []
    for path in inputs:
        local = _local_path(path)
        if local is None:
            continue
        if glob.has_magic(local):
            if not glob.glob(local):
                missing.append(path)
        elif not os.path.exists(local):
            missing.append(path)
    if missing:
        raise ConfigError(f"input path(s) not found: {', '.join(missing)}")


def load_input(
    spark: SparkSession,
    inputs: Sequence[str],
    fmt: str | None = None,
    reader_options: Mapping[str, str] | None = None,
    schema: str | None = None,
) -> DataFrame:
    """The input as a DataFrame, failing fast with ConfigError on a missing path, an
    unreadable input or a Parquet schema that differs from ``schema``."""
    check_inputs_exist(inputs)
    fmt = fmt or detect_format(inputs)
    options = dict(reader_options or {})
    if fmt == "csv":
        options.setdefault("header", "true")
        # Every column a string unless the user asks otherwise: inferring would turn
        # "007" into 7 and store "7".
        options.setdefault("inferSchema", "false")
        options.setdefault("enforceSchema", "false")
    from pyspark.errors import PySparkException

    if fmt in ("csv", "json"):
        # The job finds malformed rows by its own corrupt-record column and counts them as
        # bad; another name would hide them from it, and DROPMALFORMED would drop them
        # without a count.  (FAILFAST stops the check pass, before anything is written.)
        if "columnNameOfCorruptRecord" in options:
            raise ConfigError(
                "reader option columnNameOfCorruptRecord is set by the job (malformed rows "
                f"are counted as bad rows in {CORRUPT_COLUMN!r}); remove it"
            )
        if options.get("mode", "PERMISSIVE").upper() not in ("PERMISSIVE", "FAILFAST"):
            raise ConfigError(
                f"reader option mode={options['mode']} would drop malformed rows without "
                "counting them; use PERMISSIVE (the default: they are reported as bad rows) "
                "or FAILFAST"
            )
    try:
        if schema is None and fmt == "csv":
            # Without a schema Spark fits every row to the first one silently (its header,
            # or its field count without a header): a row with more fields drops the extra
            # ones, one with fewer gets nulls, so a row that does not fit would be written
            # half.  Every column of the first row as a string is the schema the input had
            # anyway, and with it such rows are reported as bad.
            columns = spark.read.format(fmt).options(**options).load(list(inputs)).columns
            schema = ", ".join(f"`{name.replace('`', '``')}` STRING" for name in columns)
        reader = spark.read.format(fmt).options(**options)
        if schema is not None and fmt in ("csv", "json"):
            reader = reader.option("columnNameOfCorruptRecord", CORRUPT_COLUMN).option(
                "mode", options.get("mode", "PERMISSIVE")
            )
            reader = reader.schema(f"{schema}, `{CORRUPT_COLUMN}` STRING")
        df = reader.load(list(inputs))
        if schema is not None and fmt == "parquet":
            _check_parquet_schema(spark, df, schema)
    except PySparkException as exc:
        raise ConfigError(
            f"cannot read input {list(inputs)} as {fmt}: {spark_failure_reason(exc)}"
        ) from None
    return df


def _check_parquet_schema(spark: SparkSession, df: DataFrame, schema: str) -> None:
    wanted = spark.createDataFrame([], schema).schema  # parses the DDL; runs no job
    have = {f.name: f.dataType for f in df.schema.fields}
    problems = []
    for f in wanted.fields:
        if f.name not in have:
            problems.append(f"column {f.name!r} is missing")
        elif have[f.name] != f.dataType:
            problems.append(
                f"column {f.name!r} is {have[f.name].simpleString()}, "
                f"expected {f.dataType.simpleString()}"
            )
    if problems:
        raise ConfigError(
            "the Parquet input does not match the schema: "
            + "; ".join(problems)
            + f" (input schema: {df.schema.simpleString()})"
        )


# --------------------------------------------------------------------------- mapping


@dataclass(frozen=True)
class MappingPlan:
    """The columns selected from the input, in order: key, values, corrupt record."""

    key: str
    targets: tuple[str, ...]
    has_corrupt: bool
    max_value_bytes: int

    def fingerprint(self) -> list[Any]:
        return [self.key, list(self.targets)]


_RAW_TYPES = ("string", "binary")
_CAST_TYPES = (
    "boolean",
    "tinyint",
    "smallint",
    "int",
    "bigint",
    "float",
    "double",
    "date",
    "timestamp",
    "timestamp_ntz",
)
_KEY_CAST_TYPES = ("tinyint", "smallint", "int", "bigint", "date")


def _type_name(data_type: Any) -> str:
    return str(data_type.simpleString())


def plan_mapping(
    df: DataFrame,
    key: str,
    columns: Sequence[ColumnMapping],
    *,
    max_value_bytes: int = MAX_VALUE_BYTES,
) -> tuple[MappingPlan, DataFrame]:
    """Check the mapping against the input's schema (ConfigError naming the column and the
    problem) and return the plan with the projected DataFrame ``(k, v0, v1, ..., [bad])``."""
    from pyspark.sql import functions as F

    types = {f.name: f.dataType for f in df.schema.fields}
    names = [f.name for f in df.schema.fields]
    if key not in types:
        raise ConfigError(f"key column {key!r} is not in the input; input columns: {names}")
    key_type = _type_name(types[key])
    if key_type in _RAW_TYPES:
        key_expr = F.col(f"`{key}`")
    elif key_type in _KEY_CAST_TYPES or key_type.startswith("decimal"):
        key_expr = F.col(f"`{key}`").cast("string")
    else:
        raise ConfigError(
            f"key column {key!r} has type {key_type}; a row key must be string, binary, "
            "integer, decimal or date"
        )
    mappings = list(columns) or [ColumnMapping(n) for n in names if n not in (key, CORRUPT_COLUMN)]
    if not mappings:
        raise ConfigError(f"the input has no column to store besides the key {key!r}")
    targets = check_targets(mappings)
    exprs = [key_expr.alias("k")]
    for i, mapping in enumerate(mappings):
        if mapping.source not in types:
            raise ConfigError(
                f"value column {mapping.source!r} is not in the input; input columns: {names}"
            )
        type_name = _type_name(types[mapping.source])
        column = F.col(f"`{mapping.source}`")
        if type_name in _RAW_TYPES:
            expr = column
        elif type_name in _CAST_TYPES or type_name.startswith("decimal"):
            expr = column.cast("string")
        else:
            raise ConfigError(
                f"value column {mapping.source!r} has type {type_name}, which has no byte "
                "encoding here; select scalar columns or convert it first "
                "(e.g. to_json(...))"
            )
        exprs.append(expr.alias(f"v{i}"))
    has_corrupt = CORRUPT_COLUMN in types
    if has_corrupt:
        exprs.append(F.col(CORRUPT_COLUMN).alias("bad"))
    plan = MappingPlan(key, tuple(targets), has_corrupt, max_value_bytes)
    return plan, df.select(*exprs)


def check_targets(mappings: Sequence[ColumnMapping]) -> list[str]:
    """The table columns ``mappings`` write, in order; ConfigError for one that is not a
    valid column name (reserved, empty, too long) or that two mappings share.  Needs no
    input: the job checks the mappings it is given before Spark starts."""
    targets: list[str] = []
    for mapping in mappings:
        try:
            encode_column(mapping.column)
        except InvalidArgumentError as exc:
            raise ConfigError(f"value column {mapping.source!r}: {exc}") from None
        if mapping.column in targets:
            raise ConfigError(f"two input columns map to table column {mapping.column!r}")
        targets.append(mapping.column)
    return targets


Cells = tuple[tuple[str, bytes], ...]


def _as_bytes(value: object) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    return str(value).encode("utf-8")


def _example(values: Sequence[object], plan: MappingPlan) -> str:
    names = ("key", *plan.targets, CORRUPT_COLUMN)
    parts = []
    for name, value in zip(names, values, strict=False):
        text = repr(value)
        if len(text) > 60:
            text = text[:57] + "..."
        parts.append(f"{name}={text}")
    record = "{" + ", ".join(parts) + "}"
    return record if len(record) <= _EXAMPLE_CHARS else record[: _EXAMPLE_CHARS - 3] + "..."


def map_row(values: Sequence[object], plan: MappingPlan) -> tuple[bytes, Cells] | BadRow:
    """One projected input row as ``(row key, cells)``, or the reason it cannot be mapped."""
    if plan.has_corrupt and values[-1] is not None:
        return BadRow("malformed-record", "does not parse under the schema", _example(values, plan))
    raw_key = values[0]
    if raw_key is None or raw_key in ("", b"", bytearray()):
        return BadRow(
            "missing-key", f"key column {plan.key!r} is null or empty", _example(values, plan)
        )
    key = _as_bytes(raw_key)
    if len(key) > MAX_ROW_LENGTH:
        return BadRow(
            "key-too-long",
            f"key is {len(key)} bytes, the limit is {MAX_ROW_LENGTH}",
            _example(values, plan),
        )
    cells = []
    for target, value in zip(plan.targets, values[1 : 1 + len(plan.targets)], strict=True):
        if value is None:
            continue
        data = _as_bytes(value)
        if len(data) > plan.max_value_bytes:
            return BadRow(
                "value-too-large",
                f"column {target!r} is {len(data)} bytes, the limit is {plan.max_value_bytes}",
                _example(values, plan),
            )
        cells.append((target, data))
    if not cells:
        return BadRow("no-values", "every value column is null", _example(values, plan))
    return key, tuple(cells)


def row_digest(key: bytes, cells: Cells) -> bytes:
    """SHA-256 of a mapped row (length-prefixed, so no two rows share an encoding)."""
    h = hashlib.sha256()
    h.update(len(key).to_bytes(4, "big") + key)
    for column, value in cells:
        name = column.encode("utf-8")
        h.update(len(name).to_bytes(4, "big") + name + len(value).to_bytes(8, "big") + value)
    return h.digest()


def bucket_of(key: bytes, buckets: int) -> int:
    """The bucket of a row key: stable across processes, machines and Python versions."""
    return zlib.crc32(key) % buckets


# --------------------------------------------------------------------------- check pass


@dataclass
class _CheckStats:
    rows: int = 0
    good: int = 0
    by_reason: dict[str, int] = field(default_factory=dict)
    examples: list[BadRow] = field(default_factory=list)
    digest_sum: int = 0

    def merge(self, other: _CheckStats, max_examples: int) -> None:
        self.rows += other.rows
        self.good += other.good
        for reason, n in other.by_reason.items():
            self.by_reason[reason] = self.by_reason.get(reason, 0) + n
        room = max_examples - len(self.examples)
        self.examples.extend(other.examples[: max(0, room)])
        self.digest_sum = (self.digest_sum + other.digest_sum) % (1 << 256)

    @property
    def digest(self) -> str:
        """The input's digest as recorded (hex; the job record's ``digest``, the bulk
        load's fingerprint)."""
        return f"{self.digest_sum:064x}"

    def fingerprint(self) -> str:
        """What a run over this input writes, as a bulk load records it: the good rows'
        count and digest, the two values the job record compares."""
        return f"{self.good} rows, digest {self.digest}"


def _mapped_with_digest(
    values: Sequence[object], plan: MappingPlan
) -> tuple[bytes, Cells, bytes] | BadRow:
    mapped = map_row(values, plan)
    if isinstance(mapped, BadRow):
        return mapped
    return mapped[0], mapped[1], row_digest(*mapped)


def _check_mapped(
    max_examples: int, items: Iterable[tuple[bytes, Cells, bytes] | BadRow]
) -> Iterator[_CheckStats]:
    """Count the rows of one partition mapped by :func:`_mapped_with_digest`, sample the bad
    ones, and sum the good ones' digests (an order-independent digest of the input)."""
    stats = _CheckStats()
    for item in items:
        stats.rows += 1
        if isinstance(item, BadRow):
            stats.by_reason[item.reason] = stats.by_reason.get(item.reason, 0) + 1
            if len(stats.examples) < max_examples:
                stats.examples.append(item)
            continue
        stats.good += 1
        stats.digest_sum = (stats.digest_sum + int.from_bytes(item[2], "big")) % (1 << 256)
    yield stats


def _too_many_bad(options: BackfillOptions, bad: int, rows: int) -> str | None:
    """Why the bad rows fail the job, or None if they are within the limits."""
    if options.max_bad_rows is None and options.max_bad_fraction is None:
        return f"{bad} of {rows} rows cannot be mapped" if bad else None
    if options.max_bad_rows is not None and bad > options.max_bad_rows:
        return (
            f"{bad} of {rows} rows cannot be mapped, more than the allowed {options.max_bad_rows}"
        )
    if options.max_bad_fraction is not None and bad > options.max_bad_fraction * rows:
        return (
            f"{bad} of {rows} rows cannot be mapped, more than the allowed fraction "
            f"{options.max_bad_fraction}"
        )
    return None


def inject_failure(inject: InjectedFailure | None, partition: int, handled: int) -> None:
    """Fail the running task as ``inject`` asks (testing aid, see InjectedFailure)."""
    if inject is None or handled != inject.after_batches:
        return
    from pyspark import TaskContext

    context = TaskContext.get()
    attempt = context.attemptNumber() if context is not None else 0
    if attempt >= inject.attempts:
        return
    if inject.partitions is not None and partition not in inject.partitions:
        return
    if inject.action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise RuntimeError(
        f"injected failure in partition {partition}, attempt {attempt}, after {handled} batches"
    )


def default_job_id(options: BackfillOptions, fmt: str, plan: MappingPlan) -> str:
    """A stable id for "this input into this table with this mapping"."""
    inputs = []
    for path in options.inputs:
        local = _local_path(path)
        inputs.append(os.path.abspath(local) if local is not None else path)
    doc = {
        "inputs": inputs,
        "format": fmt,
        "table": options.table,
        "mapping": plan.fingerprint(),
        "schema": options.schema,
    }
    digest = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()
    return f"{options.table}-{digest[:16]}"


def default_buckets(good_rows: int, batch_size: int, parallelism: int) -> int:
    """Enough buckets (write tasks) to keep every core busy and make progress visible:
    about 20 batches per bucket, at least two per core."""
    wanted = math.ceil(good_rows / (batch_size * 20)) if good_rows else 1
    return max(1, min(MAX_BUCKETS, max(2 * parallelism, wanted)))


# --------------------------------------------------------------------------- progress


class ProgressReporter:
    """Prints progress from an accumulator (updated as write tasks finish) on the driver."""

    def __init__(
        self, accumulator: Any, total: int, interval_s: float, emit: Callable[[str], None]
    ) -> None:
        self._accumulator = accumulator
        self._total = total
        self._interval = interval_s
        self._emit = emit
        self._started = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="backfill-progress")

    def __enter__(self) -> ProgressReporter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def line(self) -> str:
        done = int(self._accumulator.value)
        elapsed = time.monotonic() - self._started
        rate = done / elapsed if elapsed > 0 else 0.0
        remaining = max(0, self._total - done)
        eta = f", about {remaining / rate:.0f} s left" if rate > 0 and remaining else ""
        return f"{done}/{self._total} rows done ({rate:.0f} rows/s), {remaining} remaining{eta}"

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            self._emit(self.line())


# --------------------------------------------------------------------------- the prepared input


@dataclass
class PreparedInput:
    """The input after the check pass (shared by the transactional and the bulk mode)."""

    store: str
    plan: MappingPlan
    rows: Any  # RDD of projected tuples
    checked: _CheckStats
    job_id: str
    report: BackfillReport
    started: float


def prepare_input(
    spark: SparkSession,
    options: BackfillOptions,
    emit: Callable[[str], None],
    df: DataFrame | None = None,
) -> PreparedInput:
    """Read (or take ``df``), map and check the whole input; BadRowsError or ConfigError
    before anything is written.

    Each row is mapped once and the result kept (memory, else disk) as ``rows`` - items
    ``(key, cells, row digest)`` or :class:`BadRow` - so the write pass writes exactly what
    was checked: it neither reads the input again (a file replaced meanwhile would be
    written unchecked) nor maps it twice.  The caller unpersists ``rows``.  (Spark reads a
    persisted partition again only if an executor holding it is lost.)"""
    import_pyspark()
    started = time.monotonic()
    master = session_master(spark)
    store = check_store_for_spark(options.store, master)
    if df is None:
        if not options.inputs:
            raise ConfigError("backfill needs at least one input path (or a DataFrame)")
        fmt = options.format or detect_format(options.inputs)
        df = load_input(spark, options.inputs, fmt, options.reader_options, options.schema)
        what, read_as = f"{list(options.inputs)} ({fmt})", f"{list(options.inputs)} as {fmt}"
    else:
        fmt = "dataframe"
        what = read_as = "a DataFrame"
    plan, projected = plan_mapping(
        df, options.key, options.columns, max_value_bytes=options.max_value_bytes
    )
    examples = options.examples
    from pyspark import StorageLevel

    rows: RDD[Any] = (
        projected.rdd.map(tuple)
        .map(lambda values: _mapped_with_digest(values, plan))
        .persist(StorageLevel.MEMORY_AND_DISK)
    )

    def check(it: Iterable[Any]) -> Iterator[_CheckStats]:
        return _check_mapped(examples, it)

    # Pass 1: map every row, count and sample the bad ones, digest the good ones.
    emit(f"checking input {what}")
    try:
        parts = rows.mapPartitions(check).collect()
    except Exception as exc:
        rows.unpersist()
        raise ConfigError(f"cannot read input {read_as}: {spark_failure_reason(exc)}") from None
    checked = _CheckStats()
    for part in parts:
        checked.merge(part, options.examples)
    if options.job_id:
        job_id = options.job_id
    elif options.inputs and fmt != "dataframe":
        job_id = default_job_id(options, fmt, plan)
    else:
        # A DataFrame has no paths to name it: its content does (same rows, same id).
        doc = json.dumps([plan.fingerprint(), options.table, checked.digest])
        job_id = f"{options.table}-{hashlib.sha256(doc.encode()).hexdigest()[:16]}"
    report = BackfillReport(job_id=job_id, table=options.table)
    report.check_seconds = time.monotonic() - started
    report.rows_read, report.rows_good = checked.rows, checked.good
    report.bad_rows = checked.rows - checked.good
    report.bad_by_reason, report.examples = checked.by_reason, checked.examples
    why = _too_many_bad(options, report.bad_rows, report.rows_read)
    if why:
        rows.unpersist()
        details = "\n".join(_bad_row_lines(report.bad_by_reason, report.examples))
        raise BadRowsError(f"backfill {job_id}: {why}; nothing was written\n{details}", report)
    if report.bad_rows:
        emit(f"{report.bad_rows} bad rows will be skipped (within the allowed limit)")
    return PreparedInput(store, plan, rows, checked, job_id, report, started)


def bucketed(rows: RDD[Any], buckets: int) -> RDD[Any]:
    """The good rows of :func:`prepare_input`'s ``rows`` as ``((bucket, key, row digest),
    cells)``, one bucket per partition, sorted by that key within it: the rows of one key
    meet in one task, in the same order on every run and retry (module docstring, "Exactly
    once").  Both modes write from this."""

    def keyed(
        item: tuple[bytes, Cells, bytes] | BadRow,
    ) -> Iterator[tuple[tuple[int, bytes, bytes], Cells]]:
        if not isinstance(item, BadRow):
            key, cells, digest = item
            yield (bucket_of(key, buckets), key, digest), cells

    return rows.flatMap(keyed).repartitionAndSortWithinPartitions(
        numPartitions=buckets, partitionFunc=_bucket_key, keyfunc=lambda k: k
    )


def _bucket_key(key: tuple[int, bytes, bytes]) -> int:
    return key[0]

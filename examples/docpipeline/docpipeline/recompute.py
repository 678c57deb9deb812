"""The example pipeline's derived tables, recomputed from scratch with Spark.

This is the batch alternative to the incremental observers (pipeline.py), and the
reference they must equal: for the same documents, :func:`recompute` yields exactly the
cells of :func:`docpipeline.reference.compute`, byte for byte (the specification lives in
reference.py).  The per-document functions (tokens, fingerprint, terms, link
normalization) are the reference's own; what Spark does here is the global part - grouping
documents into duplicate clusters, building the inverted index of canonical documents, and
collecting inbound links per target.

Input: a DataFrame with a ``row`` column (the URL) and ``body`` / ``links`` columns, binary or
string, as produced by ``percolator.spark_jobs.export`` in the wide layout (``columns=("body",
"links")``) or read back from its Parquet.  Output: a DataFrame of cells
``(table string, row binary, column string, value binary)``; :func:`collect_tables` turns it
into the nested dict shape of ``docpipeline.reference`` for comparisons.

    percolator recompute --store embedded:./data --output derived.parquet
    percolator recompute --input documents.parquet --output derived.parquet
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from percolator.spark_jobs.session import SparkJobError, import_pyspark, spark_failure_reason

from docpipeline.reference import (
    CLUSTERS,
    DERIVED_TABLES,
    DOCUMENTS,
    FROM_PREFIX,
    INDEX,
    INLINKS,
    Tables,
    anchors_by_target,
    check_url,
    encode_members,
    fingerprint,
    links,
    parse_terms,
    terms,
)
from percolator.command_options import TIMESTAMP, add_oracle_option, add_store_option
from percolator.errors import ConfigError, PercolatorError

if TYPE_CHECKING:
    from pyspark.rdd import RDD
    from pyspark.sql import DataFrame, SparkSession

#: one derived cell: (table, row, column, value)
Cell = tuple[str, bytes, str, bytes]
Document = tuple[bytes, bytes | None, bytes | None]


def _as_bytes(value: object) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise ConfigError(f"document columns must be binary or string, got {type(value).__name__}")


def documents_rdd(documents: DataFrame) -> RDD[Document]:
    """``(url, body, links)`` tuples of a documents DataFrame (missing columns are null)."""
    from pyspark.sql import functions as F

    names = set(documents.columns)
    if "row" not in names:
        raise ConfigError(
            f"the documents DataFrame needs a 'row' column (the URL); it has {sorted(names)}"
        )
    selected = [F.col("row")] + [
        F.col(c) if c in names else F.lit(None).cast("binary").alias(c) for c in ("body", "links")
    ]

    def convert(row: Sequence[object]) -> Document:
        url = _as_bytes(row[0])
        assert url is not None
        return url, _as_bytes(row[1]), _as_bytes(row[2])

    return documents.select(*selected).rdd.map(convert)


# Keys of the one shuffle: what a per-document output contributes to.
_DOC, _CLUSTER, _INLINK = 0, 1, 2


def _document_outputs(doc: Document) -> Iterator[tuple[tuple[int, bytes], Any]]:
    """Per-document outputs keyed for the shuffle: ``(_DOC, url) -> (column, value)`` for
    the document's own derived cells, ``(_CLUSTER, fp) -> (url, body)`` and
    ``(_INLINK, target) -> (column, anchors)``."""
    url, body, links_value = doc
    source = check_url(url)  # the reference refuses invalid URLs; so does the recompute
    if body is not None:
        fp = fingerprint(body)
        yield (_DOC, url), ("fingerprint", fp)
        yield (_CLUSTER, fp), (url, body)
    normalized = links(links_value)
    if normalized:
        yield (_DOC, url), ("links_applied", normalized)
        for target, anchors in anchors_by_target(normalized).items():
            yield (_INLINK, target), (FROM_PREFIX + source, anchors)


def _cluster_cells(fp: bytes, members: Iterable[tuple[bytes, bytes]]) -> Iterator[Cell]:
    urls = []
    body = b""
    for url, member_body in members:
        urls.append(url)
        body = member_body  # every member has the same tokens, hence the same terms
    canonical = min(urls)
    cluster_terms = terms(body)
    yield CLUSTERS, fp, "members", encode_members(urls)
    yield CLUSTERS, fp, "canonical", canonical
    yield CLUSTERS, fp, "terms", cluster_terms
    yield CLUSTERS, fp, "indexed", canonical + b"\n" + cluster_terms
    posting_column = fp.decode("ascii")
    for token, count in parse_terms(cluster_terms):
        yield INDEX, token, posting_column, canonical + b"\t" + count


def _inlink_cells(target: bytes, sources: Iterable[tuple[str, bytes]]) -> Iterator[Cell]:
    count = 0
    for column, anchors in sources:
        count += 1  # one entry per linking document: documents are distinct rows
        yield INLINKS, target, column, anchors
    yield INLINKS, target, "count", str(count).encode()


def _group_cells(item: tuple[tuple[int, bytes], Iterable[Any]]) -> Iterator[Cell]:
    (kind, key), values = item
    if kind == _DOC:
        for column, value in values:
            yield DOCUMENTS, key, column, value
    elif kind == _CLUSTER:
        yield from _cluster_cells(key, values)
    else:
        yield from _inlink_cells(key, values)


def recompute_cells(documents: RDD[Document], partitions: int | None = None) -> RDD[Cell]:
    """Every derived cell of ``documents`` (see reference.py): one pass over the
    documents and one shuffle, grouping by document, cluster and link target."""
    result: RDD[Cell] = (
        documents.flatMap(_document_outputs).groupByKey(partitions).flatMap(_group_cells)
    )
    return result


def _cells_schema() -> Any:
    from pyspark.sql.types import BinaryType, StringType, StructField, StructType

    return StructType(
        [
            StructField("table", StringType(), nullable=False),
            StructField("row", BinaryType(), nullable=False),
            StructField("column", StringType(), nullable=False),
            StructField("value", BinaryType(), nullable=False),
        ]
    )


def recompute(spark: SparkSession, documents: DataFrame) -> DataFrame:
    """The derived tables of ``documents`` as a DataFrame of cells (lazy)."""
    import_pyspark()
    cells = recompute_cells(documents_rdd(documents))
    return spark.createDataFrame(cells, _cells_schema())


def collect_tables(cells: DataFrame | Iterable[Any]) -> Tables:
    """A cells DataFrame (or its collected rows) in the nested shape of
    ``docpipeline.reference.compute`` (every table present, possibly empty)."""
    rows = cells.collect() if hasattr(cells, "collect") else cells
    out: Tables = {DOCUMENTS: {}, **{t: {} for t in DERIVED_TABLES}}
    for table, row, column, value in rows:
        out[table].setdefault(bytes(row), {})[column] = bytes(value)
    return out


# --------------------------------------------------------------------------- command line


def register(subparsers: Any) -> None:
    """``percolator recompute`` (entry-point group ``percolator.commands``)."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "recompute",
        help="recompute the example pipeline's derived tables from scratch with Spark",
        description="Recompute the example pipeline's derived tables from scratch with Spark: "
        "from the documents table of --store (exported at one snapshot), or from --input.",
    )
    add_store_option(parser)
    add_oracle_option(parser)
    parser.add_argument(
        "--input",
        help="Parquet of documents (row, body, links) instead of exporting them from --store",
    )
    parser.add_argument("--read-ts", type=TIMESTAMP, default=None, help="snapshot to read")
    parser.add_argument("--output", required=True, help="Parquet output of the derived cells")
    parser.add_argument("--master", default=None, help="Spark master (default local[*])")
    parser.add_argument("--conf", action="append", metavar="KEY=VALUE", help="Spark setting")
    parser.set_defaults(func=run_recompute)


def run_recompute(args: argparse.Namespace) -> int:
    from percolator.spark_jobs.export import ExportOptions, export_table
    from percolator.spark_jobs.session import build_session, parse_conf

    spark = build_session(args.master, parse_conf(args.conf), app_name="percolator-recompute")
    started = time.monotonic()
    if args.input:
        documents = spark.read.parquet(args.input)
    else:
        options = ExportOptions(
            args.store,
            DOCUMENTS,
            columns=("body", "links"),
            oracle=args.oracle,
            read_ts=args.read_ts,
        )
        documents = export_table(spark, options).df
    try:
        recompute(spark, documents).write.parquet(args.output)
    except PercolatorError:
        raise
    except Exception as exc:
        raise SparkJobError(f"recompute failed: {spark_failure_reason(exc)}") from None
    print(f"recomputed the derived tables into {args.output} in {time.monotonic() - started:.1f} s")
    return 0

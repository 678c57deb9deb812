"""After a backfill and quiescent observers, the incremental derived tables equal the Spark
recompute exactly - and both equal the pure-Python reference."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from docpipeline import corpus, pipeline, reference
from docpipeline.recompute import collect_tables, recompute
from percolator.observers.api import register_observers
from percolator.observers.worker import run_until_quiet
from percolator.spark_jobs.backfill import run_backfill
from percolator.spark_jobs.export import ExportOptions, export_table
from percolator.spark_jobs.prepare import BackfillOptions

from tests.spark.helpers import connect

pytestmark = pytest.mark.spark


def write_corpus_json(path: Path, docs: list[corpus.Document]) -> None:
    lines = []
    for doc in docs:
        links = doc.links_value()
        lines.append(
            json.dumps(
                {
                    "url": doc.url,
                    "body": doc.body,
                    "links": links.decode() if links is not None else None,
                }
            )
        )
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_incremental_tables_equal_the_spark_recompute(
    spark: Any, shared_store_url: str, tmp_path: Path
) -> None:
    docs = corpus.generate(80, seed=7)
    source = tmp_path / "docs.jsonl"
    write_corpus_json(source, docs)
    observers = pipeline.observers()
    with connect(shared_store_url) as client:
        pipeline.create_tables(client)
        register_observers(client, observers)
        run_backfill(
            spark,
            BackfillOptions(
                store=shared_store_url,
                table=reference.DOCUMENTS,
                inputs=(str(source),),
                key="url",
                batch_size=10,
            ),
        )
        run_until_quiet(client, observers)
        expected = reference.compute(corpus.as_input(docs))

        def spark_tables() -> reference.Tables:
            export = export_table(
                spark,
                ExportOptions(
                    shared_store_url, reference.DOCUMENTS, columns=("body", "links"), splits=3
                ),
            )
            return collect_tables(recompute(spark, export.df))

        incremental = reference.read_derived(client.snapshot())
        recomputed = spark_tables()
        assert reference.diff(expected, recomputed) == []
        assert reference.diff(recomputed, incremental) == []
        assert recomputed == incremental
        assert len(recomputed[reference.CLUSTERS]) > 5  # the corpus does exercise clusters
        assert recomputed[reference.INLINKS]

        # Change 10% of the corpus; the observers catch up; still equal.
        changes = corpus.mutate(docs, fraction=0.1, seed=3)
        corpus.write_documents(client, changes)
        run_until_quiet(client, observers)
        after = reference.compute(corpus.as_input(corpus.apply_changes(docs, changes)))
        incremental = reference.read_derived(client.snapshot())
        recomputed = spark_tables()
        assert recomputed != expected
        assert reference.diff(after, recomputed) == []
        assert recomputed == incremental

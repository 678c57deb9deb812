"""Bulk jobs on Spark: backfill (load history through transactions, exactly once), export (a
consistent snapshot of a table, read in parallel) and recompute (the example pipeline's
derived tables from scratch).

Each job is a function taking a :class:`pyspark.sql.SparkSession` (see
:mod:`percolator.spark_jobs.session`) and a frozen options dataclass, so the same code runs in local
mode (the default) and on a cluster; ``percolator backfill`` and ``percolator export`` are
thin command-line wrappers (:mod:`percolator.spark_jobs.cli`).
"""

from percolator.spark_jobs.session import build_session

__all__ = ["build_session"]

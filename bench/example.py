"""The example document pipeline the benchmarks run (P7, and the incremental profile).

The one place ``bench/`` imports the example pipeline from: the corpus generator, the
observers, the pure-Python reference and the Spark recompute.  Everything else in
``bench/`` imports these names from here.
"""

from __future__ import annotations

from docpipeline import corpus, pipeline, reference
from docpipeline.recompute import collect_tables, recompute

__all__ = ["collect_tables", "corpus", "pipeline", "recompute", "reference"]

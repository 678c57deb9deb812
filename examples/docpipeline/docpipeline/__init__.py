"""An example built on percolator: a document pipeline in the spirit of Percolator's own
indexing system, installed on purpose (``pip install -e examples/docpipeline``).

* :mod:`docpipeline.pipeline` - three observers (duplicate clusters, inverted index, inbound
  links), registered as ``percolator.observers`` entry points (``doc-clusters``,
  ``doc-index``, ``doc-inlinks``);
* :mod:`docpipeline.reference` - the specification of the derived tables, recomputed from
  scratch in pure Python;
* :mod:`docpipeline.corpus` - a seeded generator of test documents and changes;
* :mod:`docpipeline.recompute` - the same derived tables recomputed with Spark
  (``percolator recompute``);
* :mod:`docpipeline.demo` - ``percolator demo``: everything above on a generated corpus.
"""

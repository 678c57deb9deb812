"""The parts of ``percolator demo`` (percolator/commands/demo.py holds only its options).
Importing this package itself is cheap: the command line reads the defaults below.

* :mod:`percolator.demo.steps` - the seven steps, in order, and :func:`run_demo`;
* :mod:`percolator.demo.tracking` - following each live change through the example
  pipeline, and quiescence;
* :mod:`percolator.demo.oracle_process` - the oracle service as a child process;
* :mod:`percolator.demo.spark` - the Spark session (its JVM chatter goes to a log file) and
  the backfill's progress bar;
* :mod:`percolator.demo.report` - the summary table and its JSON form;
* :mod:`percolator.demo.chart` - the PNG chart.

The progress bar itself is :mod:`percolator.progress`.  This package builds on ``observers``
and ``spark_jobs``; nothing in the engine imports it.
"""

DEFAULT_DOCUMENTS = 1000
DEFAULT_MASTER = "local[2]"
DEFAULT_WORK_DIR = "demo-out"

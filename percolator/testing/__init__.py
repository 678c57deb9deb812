"""Test and development tools, shipped with the engine so that observer authors and operators
can use them too.  The engine never imports this package.

* :mod:`percolator.testing.protocol`: :class:`ManualOracle` (an in-memory timestamp oracle) and
  :class:`ProtocolHarness`, whose ``must_*`` steps make a test read like a protocol script;
  both are re-exported here.
* :mod:`percolator.testing.faults`: :class:`FaultyStore`, a store wrapper that fails, hangs or
  loses the reply of chosen calls, with hooks before and after them.
* :mod:`percolator.testing.history`: records list-append histories and checks them for
  isolation anomalies (``python -m percolator.testing.history check FILE.jsonl``).
* :mod:`percolator.testing.localhbase`: a real local HBase for development and the test suite
  (``percolator hbase start``).

Only the light, dependency-free helpers are imported eagerly; import the others by their
module.
"""

from percolator.testing.faults import Call, FaultyStore
from percolator.testing.protocol import ManualOracle, ProtocolHarness

__all__ = ["Call", "FaultyStore", "ManualOracle", "ProtocolHarness"]

"""The timestamp oracle: strictly increasing hybrid timestamps for transactions.

* :class:`~percolator.oracle.local.LocalOracle`: in-process, persisted in the store by
  compare-and-set;
  the default of ``percolator.connect(oracle=None)``.
* ``percolator oracle serve``: the gRPC server (:mod:`percolator.oracle.server`), one active
  process per
  store with standbys fenced by an epoch and a lease (:mod:`percolator.oracle.lease`).
* :class:`~percolator.oracle.client.GrpcOracleClient`: its client, coalescing concurrent requests.
* :func:`~percolator.oracle.factory.open_oracle`: picks one from an ``oracle=`` spec.

See docs/oracle.md.
"""

from __future__ import annotations

from percolator.oracle.factory import open_oracle
from percolator.oracle.local import LocalOracle

__all__ = ["LocalOracle", "open_oracle"]

"""The transaction protocol, one module per action (design notes §3; docs/protocol.md).

* :mod:`~percolator.protocol.cells` - addresses and the raw state of user cells; the one
  place that turns cells into store reads;
* :mod:`~percolator.protocol.lock` - every transition of the lock cell (the only cell ever
  compare-and-set): place, extend, commit, roll back;
* :mod:`~percolator.protocol.prewrite` - conflict checks, data and history puts, locks;
* :mod:`~percolator.protocol.commit` - the commit point (the primary's compare-and-set), the
  commit index, and rolling secondaries forward;
* :mod:`~percolator.protocol.rollback` - undoing a lock;
* :mod:`~percolator.protocol.resolve` - another transaction's outcome from its primary, and
  the lock resolver with its outcome cache;
* :mod:`~percolator.protocol.read` - snapshot reads at ``read_ts``;
* :mod:`~percolator.protocol.gc` - garbage collection below the safe point.

Each action reads through :func:`~percolator.protocol.cells.fetch_cells` and writes through
the store it is given; the committer (percolator/committer.py) orders the actions of one
transaction.
"""

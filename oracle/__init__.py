"""The gRPC timestamp oracle service, built on the engine's timestamps.

* ``percolator oracle serve``: the server (:mod:`percolator.oracle.server`), one active
  process per store with standbys fenced by an epoch and a lease
  (:mod:`percolator.oracle.lease`).
* :class:`~percolator.oracle.client.GrpcOracleClient`: its client, coalescing concurrent
  requests; ``percolator.connect(oracle="grpc://...")`` finds it by URL scheme through the
  entry-point group ``percolator.oracles`` (:func:`~percolator.oracle.client.open_grpc_oracle`).
* :mod:`percolator.oracle.addressing`: the ``grpc://`` URL, addresses and the token, shared by
  both sides.

The in-process oracle (``LocalOracle``), the persisted oracle record and the interface every
oracle implements live in the engine, :mod:`percolator.timestamps`.  This package imports
nothing when imported: each module loads only what it uses.  See docs/oracle.md.
"""

"""Observers: code that runs when an observed column changes, at most once per change.

* :mod:`observers.api` - the :class:`~observers.api.Observer` base class and registration
  of observed columns;
* :mod:`observers.plugins` - discovery through the ``percolator.observers`` entry points;
* :mod:`observers.runner` - one run: ack check, user code, ack, cleanup;
* :mod:`observers.worker` - scanners, run pool, back-off, parking, metrics, shutdown;
* :mod:`observers.parking` - parked notifications (list, retry);
* :mod:`observers.pipeline` - the example document pipeline (clusters, index, links),
  with :mod:`observers.corpus` (test corpus) and :mod:`observers.reference` (from-scratch
  recomputation).

See docs/observers.md.
"""

from observers.api import Observer, register_observers, trigger, unregister_observer

__all__ = ["Observer", "register_observers", "trigger", "unregister_observer"]

"""Observers: code that runs when an observed column changes, at most once per change.

* :mod:`percolator.observers.api` - the :class:`~percolator.observers.api.Observer` base class
  and registration
  of observed columns;
* :mod:`percolator.observers.plugins` - discovery through the ``percolator.observers`` entry points;
* :mod:`percolator.observers.runner` - one run: ack check, user code, ack, cleanup;
* :mod:`percolator.observers.worker` - the worker: threads, lifecycle, graceful shutdown, built
  from :mod:`~percolator.observers.finder` (scanners), :mod:`~percolator.observers.processor`
  (queue, back-off, failure counting, parking), :mod:`~percolator.observers.worker_metrics`
  and :mod:`~percolator.observers.options`; :mod:`~percolator.observers.drain` runs every
  notification synchronously (``run_until_quiet``);
* :mod:`percolator.observers.parking` - parked notifications (list, retry);

The notify family, the observed-column registry and the acks belong to the engine
(:mod:`percolator.notifications`); this package builds on it.  An example of observers
(the document pipeline) is the separate package ``examples/docpipeline``, installed on
purpose.  See docs/observers.md.
"""

from percolator.observers.api import Observer, register_observers, trigger, unregister_observer

__all__ = ["Observer", "register_observers", "trigger", "unregister_observer"]

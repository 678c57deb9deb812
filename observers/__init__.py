"""Observers: code that runs when an observed column changes, at most once per change.

* :mod:`percolator.observers.api` - the :class:`~percolator.observers.api.Observer` base class
  and registration
  of observed columns;
* :mod:`percolator.observers.plugins` - discovery through the ``percolator.observers`` entry points;
* :mod:`percolator.observers.runner` - one run: ack check, user code, ack, cleanup;
* :mod:`percolator.observers.worker` - scanners, run pool, back-off, parking, metrics, shutdown;
* :mod:`percolator.observers.parking` - parked notifications (list, retry);

An example of observers (the document pipeline) is the separate package
``examples/docpipeline``, installed on purpose.  See docs/observers.md.
"""

from percolator.observers.api import Observer, register_observers, trigger, unregister_observer

__all__ = ["Observer", "register_observers", "trigger", "unregister_observer"]

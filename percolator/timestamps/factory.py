"""Pick the timestamp oracle an ``oracle=`` spec names (``percolator.connect(oracle=...)``).

* ``None``: :class:`~percolator.timestamps.local.LocalOracle` on the store (the default).
* a :class:`~percolator.timestamps.source.TimestampOracle`: that object, as it is.
* ``SCHEME://...``: the oracle the entry point named ``SCHEME`` in the group
  ``percolator.oracles`` opens.  The gRPC oracle of this distribution declares ``grpc`` and
  ``grpcs`` (see docs/oracle.md for their options)::

      [project.entry-points."percolator.oracles"]
      grpc = "percolator.oracle.client:open_grpc_oracle"

  The entry point's object is an :data:`OracleOpener`.

The engine names no oracle implementation: it finds them by scheme, so the gRPC oracle
(a layer above) can build on the engine without the engine importing it.  Like the observer
plugins, an opener is found, then loaded, then validated; each failure is a
:class:`~percolator.errors.ConfigError` naming the spec and the plugin.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable, Iterable

from percolator.errors import ConfigError, PercolatorError
from percolator.store.base import Store
from percolator.timestamps.domain import check_timestamp_domain
from percolator.timestamps.local import LocalOracle
from percolator.timestamps.source import TimestampOracle

GROUP = "percolator.oracles"

#: Opens the oracle a ``SCHEME://...`` spec names; ``store`` is the client's store (an
#: oracle may keep state there or ignore it).  Raises ConfigError for a malformed spec.
OracleOpener = Callable[[str, Store], TimestampOracle]


def open_oracle(
    spec: str | TimestampOracle | None,
    store: Store,
    entry_points: Iterable[importlib.metadata.EntryPoint] | None = None,
) -> TimestampOracle:
    """The oracle for ``spec`` (see the module docstring); ``store`` serves the local one.

    ``entry_points``: use these instead of the installed ones (for tests and embedding)."""
    if spec is None:
        # The store's own oracle: refused now if the store is bound to another; it binds
        # an unbound store with its first timestamp (domain.py).
        check_timestamp_domain(store, None)
        return LocalOracle(store)
    if isinstance(spec, TimestampOracle):
        return spec
    if not isinstance(spec, str):
        raise ConfigError(
            "oracle must be None, a TimestampOracle, or a grpc:// URL string (or any "
            f"SCHEME:// an installed oracle provides), got {spec!r}"
        )
    scheme, sep, _ = spec.strip().partition("://")
    scheme = scheme.lower()
    if entry_points is None:
        entry_points = importlib.metadata.entry_points(group=GROUP)
    openers: dict[str, importlib.metadata.EntryPoint] = {}
    for entry_point in entry_points:
        # Two distributions declaring one scheme: the first wins, as importlib does.
        openers.setdefault(entry_point.name.lower(), entry_point)
    known = ", ".join(f"{name}://" for name in sorted(openers)) or "none installed"
    if not sep or not scheme:
        raise ConfigError(
            f"oracle {spec!r} is not understood: use None for the local oracle or a URL "
            f"SCHEME://... (installed schemes: {known})"
        )
    found = openers.get(scheme)
    if found is None:
        raise ConfigError(
            f"oracle {spec!r} is not understood: no timestamp oracle is installed for the "
            f"scheme {scheme!r} (entry-point group {GROUP!r}; installed schemes: {known})"
        )
    entry_point = found
    try:
        opener = entry_point.load()
    except Exception as exc:  # any import-time failure of the plugin's code
        raise ConfigError(
            f"oracle {spec!r}: cannot load the {scheme!r} oracle {entry_point.value!r}: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    if not callable(opener):
        raise ConfigError(
            f"oracle {spec!r}: the {scheme!r} oracle {entry_point.value!r} is {opener!r}, "
            "not a callable (spec, store) -> TimestampOracle"
        )
    try:
        oracle = opener(spec, store)
    except PercolatorError:
        raise
    except Exception as exc:
        raise ConfigError(
            f"oracle {spec!r}: the {scheme!r} oracle {entry_point.value!r} failed: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(oracle, TimestampOracle):
        raise ConfigError(
            f"oracle {spec!r}: the {scheme!r} oracle {entry_point.value!r} gave {oracle!r}, "
            "not a TimestampOracle"
        )
    return oracle

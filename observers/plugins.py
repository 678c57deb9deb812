"""Observer plugins: found through the ``percolator.observers`` entry-point group.

A package makes observers available to every worker by declaring them in its
``pyproject.toml``::

    [project.entry-points."percolator.observers"]
    word-count = "mypackage.observers:WordCount"

The entry point's name is the observer's name.  Its object is an :class:`Observer` subclass
(instantiated without arguments), an observer instance, or a callable returning one.

Configuration: the worker's config file may hold one table per observer,
``[worker.observers.NAME]``; the class or factory of observer ``NAME`` is then called with
that table as its one argument (a dict), e.g. ``WordCount({"min_length": 3})``.  An
observer given a table that it cannot take (an instance, or a factory without a parameter)
is a :class:`PluginError` naming the table.

To try observers without packaging them, ``percolator worker --observers-from MODULE:ATTR``
imports them from a module path (:func:`load_from_path`): ``ATTR`` is an observer (class,
instance, ``@observer`` function or factory) or a list or tuple of them; the current
directory is searched first, as ``python -m`` does.

Loading happens in three steps, each of which can fail for one plugin without affecting the
others (flake8's finder does the same): **find** the entry points, **load** each one (import
the module, get the object), **validate** it (an observer, well declared, named like its
entry point).  A plugin that fails any step becomes a :class:`PluginError` naming it and
saying what went wrong; the worker reports it and runs the others.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from percolator.observers.api import Observer, check_observer

from percolator.errors import ConfigError, InvalidArgumentError, describe_plugin_error

GROUP = "percolator.observers"


class PluginError(ConfigError):
    """An observer plugin could not be found, imported or validated."""

    def __init__(self, plugin: str, message: str, *, installed: bool = True) -> None:
        super().__init__(f"observer plugin {plugin!r}: {message}")
        self.plugin = plugin
        #: False: no installed package declares a plugin of that name (a typo, most likely)
        self.installed = installed


@dataclass
class LoadResult:
    """The observers that loaded, in the order asked for, and the plugins that did not."""

    observers: list[Observer] = field(default_factory=list)
    errors: list[PluginError] = field(default_factory=list)


def find(
    entry_points: Iterable[importlib.metadata.EntryPoint] | None = None,
) -> dict[str, importlib.metadata.EntryPoint]:
    """The plugins of the ``percolator.observers`` group by name (``entry_points``: use
    these instead of the installed ones, for tests and embedding)."""
    if entry_points is None:
        entry_points = importlib.metadata.entry_points(group=GROUP)
    found: dict[str, importlib.metadata.EntryPoint] = {}
    for entry_point in entry_points:
        # Two distributions declaring one name: the first wins, as importlib does.
        found.setdefault(entry_point.name, entry_point)
    return found


#: observer name -> its configuration table (``[worker.observers.NAME]``)
Configs = Mapping[str, Mapping[str, Any]]


def load(
    entry_point: importlib.metadata.EntryPoint, config: Mapping[str, Any] | None = None
) -> Observer:
    """Import, instantiate (with ``config``, if given) and validate one plugin.  Raises
    :class:`PluginError`."""
    name = entry_point.name
    try:
        target = entry_point.load()
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # any import-time failure of third-party code, sys.exit too
        raise PluginError(
            name, f"cannot load {entry_point.value!r}: {describe_plugin_error(exc)}"
        ) from exc
    observer = _instantiate(name, entry_point.value, target, config)
    try:
        check_observer(observer)
    except InvalidArgumentError as exc:
        raise PluginError(name, str(exc)) from None
    if observer.name != name:
        raise PluginError(
            name,
            f"the observer calls itself {observer.name!r}; the entry point must have "
            "the observer's name",
        )
    return observer


def load_observers(
    names: Sequence[str] | None = None,
    entry_points: Iterable[importlib.metadata.EntryPoint] | None = None,
    configs: Configs | None = None,
) -> LoadResult:
    """Load the plugins named (all installed ones if ``names`` is None), each with its
    table of ``configs`` if there is one.  Never raises for one plugin: failures are
    collected in :attr:`LoadResult.errors`."""
    configs = configs or {}
    available = find(entry_points)
    result = LoadResult()
    wanted = list(dict.fromkeys(names)) if names is not None else sorted(available)
    for name in wanted:
        entry_point = available.get(name)
        if entry_point is None:
            known = ", ".join(sorted(available)) or "none installed"
            result.errors.append(
                PluginError(
                    name,
                    f"no such plugin in entry-point group {GROUP!r} ({known})",
                    installed=False,
                )
            )
            continue
        try:
            result.observers.append(load(entry_point, configs.get(name)))
        except PluginError as exc:
            result.errors.append(exc)
    return result


def _instantiate(
    name: str, where: str, target: Any, config: Mapping[str, Any] | None = None
) -> Observer:
    """An observer from what a plugin or a module path names: an instance, a class or a
    factory, called with ``config`` when there is one.  Raises :class:`PluginError` naming
    ``name`` and ``where``."""
    args: tuple[Any, ...] = ()
    if config is not None:
        table = f"[worker.observers.{name}]"
        if isinstance(target, Observer) or not callable(target):
            raise PluginError(
                name,
                f"{where!r} is an observer instance, which cannot take the config "
                f"table {table}; point at a class or factory with one parameter",
            )
        try:
            inspect.signature(target).bind(dict(config))
        except TypeError:
            raise PluginError(
                name,
                f"{where!r} takes no configuration, but the config file has {table}; "
                "give its class or factory one parameter (a dict)",
            ) from None
        except ValueError:  # no signature to look at (a builtin): the call will tell
            pass
        args = (dict(config),)
    if isinstance(target, Observer):
        return target
    if callable(target):
        try:
            made = target(*args)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:
            raise PluginError(
                name, f"{where!r} raised while creating the observer: {describe_plugin_error(exc)}"
            ) from exc
        if not isinstance(made, Observer):
            raise PluginError(
                name, f"{where!r} gave {made!r}, not a percolator.observers.api.Observer"
            )
        return made
    raise PluginError(
        name, f"{where!r} is {target!r}: expected an Observer subclass, instance or factory"
    )


def load_from_path(spec: str, configs: Configs | None = None) -> list[Observer]:
    """The observers ``MODULE:ATTR`` names (see the module docstring), validated; a class
    whose ``name`` has a table in ``configs`` is created with it.

    The current directory goes first on ``sys.path`` for the import, so a module beside
    the caller is found without installing it.  Raises :class:`PluginError` (named after
    ``spec``) for a malformed spec, an import error, a missing attribute or an invalid
    observer."""
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise PluginError(spec, "expected MODULE:ATTR, e.g. myobservers:word_count")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # any import-time failure of the user's code, sys.exit too
        raise PluginError(
            spec, f"cannot import {module_name!r}: {describe_plugin_error(exc)}"
        ) from exc
    target: Any = module
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise PluginError(spec, f"module {module_name!r} has no {attribute!r}") from None
    items = list(target) if isinstance(target, (list, tuple)) else [target]
    if not items:
        raise PluginError(spec, f"{attribute!r} is an empty sequence: no observer to run")
    observers = []
    for item in items:
        declared = getattr(item, "name", None)
        name = declared if isinstance(declared, str) else spec
        config = (configs or {}).get(name)
        observer = _instantiate(name if config is not None else spec, spec, item, config)
        try:
            observers.append(check_observer(observer))
        except InvalidArgumentError as exc:
            raise PluginError(spec, str(exc)) from None
    return observers

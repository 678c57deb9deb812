"""Small concurrency helpers shared by the protocol steps."""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, wait
from typing import Protocol, TypeVar

T = TypeVar("T")
R = TypeVar("R")


def run_all(executor: Executor | None, fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """``fn`` over ``items`` (in parallel on ``executor``), waiting for **every** call to
    finish before raising the first error, so no call is still writing when the caller
    starts cleaning up."""
    if executor is None or len(items) <= 1:
        return [fn(item) for item in items]
    futures = [executor.submit(fn, item) for item in items]
    wait(futures)
    return [f.result() for f in futures]


class ForkAware(Protocol):
    def _after_fork_in_child(self) -> None:
        """Make the child's copy an object of its own: fresh locks, none of the parent's
        threads, leases or work in flight."""


#: every object registered with :func:`renew_after_fork`, while it lives
_fork_aware: weakref.WeakSet[ForkAware] = weakref.WeakSet()


def renew_after_fork(instance: ForkAware) -> None:
    """Call ``instance._after_fork_in_child()`` in the child after every later ``os.fork``
    of this process, as long as the instance lives.  For objects that hold locks or
    threads (which a child inherits held or dead) or a state only the parent may use."""
    _fork_aware.add(instance)


def _after_fork_in_child() -> None:
    for instance in list(_fork_aware):
        instance._after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)

"""Small concurrency helpers shared by the protocol steps."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Executor, wait
from typing import TypeVar

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

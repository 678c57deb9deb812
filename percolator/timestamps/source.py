"""The interface of every timestamp source: :class:`TimestampOracle`."""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from percolator.store.base import Store


class TimestampOracle(abc.ABC):
    """Hands out strictly increasing timestamps.

    Contract: every timestamp returned by any oracle instance sharing the same persisted
    state is strictly greater than every timestamp returned before it (across threads,
    processes, restarts and fail-overs).  Thread-safe.
    """

    @abc.abstractmethod
    def get_timestamp(self) -> int:
        """One fresh timestamp."""

    def get_timestamps(self, count: int) -> list[int]:
        """``count`` fresh timestamps, increasing.  Backends may override to batch."""
        return [self.get_timestamp() for _ in range(count)]

    def attach_store(self, store: Store) -> None:  # noqa: B027 - optional hook
        """Called by :func:`percolator.connect` when it is given this object for ``store``:
        raise :class:`~percolator.errors.OracleError` (or ``ConfigError``) if this oracle's
        timestamps are not the ones ``store`` takes its timestamps from, and make sure the
        first timestamp drawn binds an unbound ``store`` (percolator/timestamps/domain.py).
        Called before the client writes anything; may read the store.

        The default does nothing: an oracle that cannot name its timestamp domain is trusted
        as given (a test's manual oracle, a plugin of its own)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources.  Idempotent."""

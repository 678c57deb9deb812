"""The interface of every timestamp source: :class:`TimestampOracle`."""

from __future__ import annotations

import abc


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

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources.  Idempotent."""

"""A small progress display for long command-line steps.

On a terminal the line is redrawn in place (``\\r``) at most a few times a second; in a log
(CI, a pipe) a plain line is printed every ``log_interval_s`` seconds instead, so logs stay
readable.  It only writes to its stream: no threads, no terminal control beyond ``\\r``.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


def _fmt_duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f}s"
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s"


class Progress:
    """Progress of one step toward ``total`` units (or open-ended with ``total=None``).

    Call :meth:`update` with the absolute count done so far; :meth:`close` prints the final
    line.  Rate is measured from when the bar was created; the remaining time is
    extrapolated from it when a total is known.
    """

    def __init__(
        self,
        label: str,
        total: int | None = None,
        *,
        unit: str = "",
        stream: TextIO | None = None,
        width: int = 24,
        log_interval_s: float = 5.0,
    ) -> None:
        self.label = label
        self.total = total
        self.unit = unit
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self.log_interval_s = log_interval_s
        self.done = 0
        self._started = time.monotonic()
        self._last_draw = 0.0
        self._tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._closed = False

    def _line(self, extra: str) -> str:
        elapsed = time.monotonic() - self._started
        rate = self.done / elapsed if elapsed > 0 else 0.0
        unit = f" {self.unit}" if self.unit else ""
        if self.total:
            fraction = min(1.0, self.done / self.total)
            filled = int(fraction * self.width)
            bar = "#" * filled + "." * (self.width - filled)
            left = (self.total - self.done) / rate if rate > 0 else float("inf")
            eta = _fmt_duration(left) if left != float("inf") else "?"
            text = (
                f"{self.label} [{bar}] {self.done}/{self.total}{unit} {fraction:4.0%} "
                f"{rate:,.0f}{unit}/s, {eta} left"
            )
        else:
            text = f"{self.label} {self.done}{unit} in {_fmt_duration(elapsed)}"
        return f"{text} {extra}".rstrip()

    def update(self, done: int, *, total: int | None = None, extra: str = "") -> None:
        """Record ``done`` units so far (absolute) and redraw if it is time to."""
        self.done = done
        if total is not None:
            self.total = total
        now = time.monotonic()
        if self._tty:
            if now - self._last_draw >= 0.1:
                self.stream.write("\r\x1b[K" + self._line(extra))
                self.stream.flush()
                self._last_draw = now
        elif now - self._last_draw >= self.log_interval_s:
            self.stream.write(self._line(extra) + "\n")
            self.stream.flush()
            self._last_draw = now

    def close(self, extra: str = "") -> float:
        """Print the final line; returns the step's elapsed seconds.  Idempotent."""
        elapsed = time.monotonic() - self._started
        if not self._closed:
            self._closed = True
            line = self._line(extra) + f" (done in {elapsed:.1f}s)"
            self.stream.write(("\r\x1b[K" if self._tty else "") + line + "\n")
            self.stream.flush()
        return elapsed

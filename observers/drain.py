"""Processing every notification synchronously, in the calling thread: for tests, batch
jobs and tools (no threads, no registration, no parking)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from percolator.observers.api import Observer
from percolator.observers.runner import ConflictExhaustedError, Outcome, process_notification

from percolator import notifications
from percolator.errors import PercolatorError
from percolator.notifications import Notification

if TYPE_CHECKING:
    from percolator.client import Client


@dataclass
class DrainReport:
    runs: int = 0
    skipped: int = 0
    conflicts: int = 0
    failures: list[tuple[Notification, str]] = field(default_factory=list)


def run_until_quiet(
    client: Client, observers: Sequence[Observer], *, max_rounds: int = 100
) -> DrainReport:
    """Process every notification of ``observers`` in this thread, round after round,
    until a scan finds none (observers may notify each other).  For tests, batch jobs and
    tools; it neither registers observers nor parks anything.  Raises PercolatorError if
    notifications remain after ``max_rounds`` rounds."""
    by_column = {(o.table, c): o for o in observers for c in o.columns}
    tables = sorted({o.table for o in observers})
    report = DrainReport()
    for _ in range(max_rounds):
        found: list[Notification] = []
        for table in tables:
            columns = [c for (t, c) in by_column if t == table]
            found += notifications.pending(client.store, table, columns)
        if not found:
            return report
        for notification in found:
            observer = by_column[(notification.table, notification.column)]
            try:
                result = process_notification(client, observer, notification, attempts=10)
            except ConflictExhaustedError as exc:
                report.conflicts += exc.conflicts
                continue
            except Exception as exc:
                report.failures.append((notification, f"{type(exc).__name__}: {exc}"))
                continue
            report.conflicts += result.conflicts
            if result.outcome is Outcome.COMMITTED:
                report.runs += 1
            else:
                report.skipped += 1
        if report.failures:
            raise PercolatorError(
                f"{len(report.failures)} observer run(s) failed; first: "
                f"{report.failures[0][0]}: {report.failures[0][1]}"
            )
    raise PercolatorError(f"notifications still pending after {max_rounds} rounds")

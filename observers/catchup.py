"""Catching up on registration: process what an observer's columns held before it watched.

Writes to a column while no observer watches it leave no notification, so a new observer
(or one registered again after an unregistration) would never see them.  :func:`catch_up`
finds them: it scans the lock family of every watched column (the lock cell holds the
cell's latest commit, or a lock in flight) and leaves a notification, at one fresh
timestamp, on each cell that

* a strong observer owes: its ack is below the cell's latest commit (or it has none);
* a weak observer owes: any cell with a commit (it keeps no acks: every one is re-run);
* is locked by a transaction in flight (it may commit without a notification of its own, see
  below; the run resolves the lock, or waits for it, first).

Why that is complete.  Let the registration become visible at ``R``.  The catch-up runs
after :func:`~percolator.observers.api.wait_until_notified`, i.e. after ``R`` + one refresh
interval + a margin, and draws its notification timestamp ``N`` before it scans.  A commit
decides which cells to notify only after its ``commit_ts`` was returned by the oracle, from
an observed set whose load (the store read) started at most one refresh interval before
that decision (percolator/committer.py, percolator/notifications.py ``ObservedColumns``).
So a commit whose set was loaded after ``R`` notifies itself, and one whose set was loaded
before ``R`` drew its ``commit_ts`` before ``R`` + one interval: before ``N`` was drawn
(``commit_ts < N``) and before the scan began.  Its locks were all placed before its
``commit_ts`` was drawn, so the scan sees, on each of its watched cells, either its lock or
its commit (or a later one), and notifies the cell at ``N``.  The run for that notification
starts at ``O > N > commit_ts``: it resolves or waits for the lock and then sees the commit
(or a later one, which covers it).  Were the decision taken at the *start* of the commit, a
writer slow before drawing ``commit_ts`` could place its locks after the scan, or commit
above ``O`` after the run waited on its lock: the run would ack the older commit and clean
``N`` up, and the change would never be processed.

Guarantees: after :func:`~percolator.observers.api.register_observers` returns, every
change of a watched column is either notified by its commit or by the catch-up, so each is
processed (at most once, for a strong observer: the ack decides; a cell already covered only
costs a cleanup).  Re-running a catch-up is harmless (idempotent apart from the triggers).
While it runs the observer's watermark is 0, then held at the oldest change it owes until
those notifications are processed (percolator/watermark.py, "catch-up floors").  A catch-up
that dies half-way leaves the watermark at 0 and is owed: the next registration, worker start
or ``percolator catch-up NAME`` runs it again.

Cost: one scan of the lock family of the watched columns, one ack read per written cell
(strong) and one read of the write history per owed cell.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from percolator import notifications, watermark
from percolator.errors import InvalidArgumentError
from percolator.layout import LOCK, WRITE
from percolator.notifications import read_ack, registrations
from percolator.protocol.cells import CellKey
from percolator.readers import read_safe_point
from percolator.records import LockCell, RecordError
from percolator.store.base import ScanOptions
from percolator.store.checks import UNLIMITED_VERSIONS

if TYPE_CHECKING:
    from percolator.client import Client


def _oldest_owed(
    retained: list[int], in_flight: list[int], ack: int | None, safe_point: int
) -> int | None:
    """A lower bound of the oldest change a cell owes (None: it owes none that is known),
    from its ``retained`` commits (write records and the lock cell's latest commit), the
    start of a lock ``in_flight`` on it, its ``ack`` and the GC safe point read after them.

    GC keeps, per cell, the newest commit at or below its bound (at or below the stored safe
    point) and everything above, or removes a dead cell's history entirely (it may be
    written again): the retained commits are a suffix of the history, and every commit
    removed is at or below ``safe_point``.  So the first retained commit above the ack is
    the oldest owed only if the suffix reaches back to the ack (a retained commit at or
    below it) or nothing removed can be owed (``safe_point <= ack``; without an ack, only
    if GC never ran).  Otherwise the oldest owed change may be gone: every owed change is
    above the ack, so ``ack + 1`` is a bound (0 without an ack)."""
    covered = ack if ack is not None else 0
    candidates = [c for c in retained + in_flight if ack is None or c > ack]
    first = min(candidates) if candidates else None
    complete = safe_point <= covered or (ack is not None and any(c <= ack for c in retained))
    if complete:
        return first
    truncated = ack + 1 if ack is not None else 0
    return truncated if first is None else min(first, truncated)


@dataclass
class CatchUpReport:
    observer: str
    scanned: int = 0
    owed: int = 0
    #: the fresh timestamp of the notifications left (0: none left)
    notify_ts: int = 0
    #: the commit timestamp of the oldest change owed (0: none)
    oldest: int = 0


def catch_up(
    client: Client,
    observer: str,
    *,
    batch: int = 500,
    progress: Callable[[CatchUpReport], None] | None = None,
) -> CatchUpReport:
    """Leave a notification on every cell of ``observer``'s registered columns that it
    still owes (see the module docstring); ``progress`` is called after each batch.

    Call it once every writer notifies the columns (after
    :func:`~percolator.observers.api.wait_until_notified`).  Raises InvalidArgumentError
    if ``observer`` watches no column."""
    regs = [r for r in registrations(client.store).values() if r.observer == observer]
    if not regs:
        raise InvalidArgumentError(f"observer {observer!r} watches no column: nothing to catch up")
    store = client.store
    report = CatchUpReport(observer)
    watermark.begin_catch_up(store, observer, watermark.declared_outputs(regs)[observer])
    notify_ts = client.oracle.get_timestamp()
    oldest: int | None = None
    by_table: dict[str, list[tuple[str, bool]]] = {}
    for reg in regs:
        by_table.setdefault(reg.table, []).append((reg.column, reg.weak))
    for table, columns in sorted(by_table.items()):
        if not store.table_exists(table):
            # Registered before its table exists (e.g. ahead of a bulk load that creates
            # it): there is no data to owe; what is written later notifies as usual.
            continue
        weak = {column: is_weak for column, is_weak in columns}
        qualifiers = [column.encode("utf-8") for column in sorted(weak)]
        page: list[tuple[bytes, str, LockCell]] = []

        def flush(
            page: list[tuple[bytes, str, LockCell]],
            table: str = table,
            weak: dict[str, bool] = weak,
            qualifiers: list[bytes] = qualifiers,
        ) -> None:
            nonlocal oldest
            owed: list[tuple[bytes, str, int | None]] = []
            txn = client.observer_transaction()
            try:
                for row, column, cell in page:
                    if cell.lock is not None:
                        owed.append((row, column, None))
                        continue
                    if cell.last_commit is None:
                        continue
                    ack = None if weak[column] else read_ack(txn, observer, table, row, column)
                    if ack is None or ack < cell.last_commit.commit_ts:
                        owed.append((row, column, ack))
            finally:
                txn.rollback()
            if not owed:
                return
            # The oldest change owed per cell: its first commit above the ack - if GC left
            # it (see _oldest_owed).
            history = store.read_rows(
                table,
                sorted({row for row, _, _ in owed}),
                columns=[(WRITE, q) for q in qualifiers] + [(LOCK, q) for q in qualifiers],
                max_versions=UNLIMITED_VERSIONS,
            )
            # Read after the history: every commit GC removed from it is at or below this.
            safe_point, _ = read_safe_point(store)
            for row, column, ack in owed:
                cells = history.get(row, {})
                commits = [v for v, _ in cells.get((WRITE, column.encode("utf-8")), [])]
                in_flight: list[int] = []
                for _, value in cells.get((LOCK, column.encode("utf-8")), [])[:1]:
                    try:
                        decoded = LockCell.decode(value)
                    except RecordError:
                        continue
                    if decoded.last_commit is not None:
                        commits.append(decoded.last_commit.commit_ts)
                    if decoded.lock is not None:
                        in_flight.append(decoded.lock.start_ts)
                first = _oldest_owed(commits, in_flight, ack, safe_point)
                if first is not None:
                    oldest = first if oldest is None else min(oldest, first)
            keys = [CellKey(table, row, column) for row, column, _ in owed]
            notifications.put_notifications(store, keys, notify_ts)
            report.owed += len(owed)

        for row, cells in store.scan(table, LOCK, ScanOptions(qualifiers=qualifiers)):
            for qualifier, (_, value) in sorted(cells.items()):
                try:
                    cell = LockCell.decode(value)
                except RecordError:
                    continue  # a reader meeting it reports it; nothing to catch up from
                page.append((row, qualifier.decode("utf-8"), cell))
                report.scanned += 1
            if len(page) >= batch:
                flush(page)
                page = []
                if progress is not None:
                    progress(report)
        flush(page)
    report.notify_ts = notify_ts if report.owed else 0
    report.oldest = oldest or 0
    watermark.finish_catch_up(
        store, observer, oldest if oldest is not None else notify_ts, notify_ts
    )
    if progress is not None:
        progress(report)
    return report

"""Parked notifications: runs that kept failing, set aside where an operator finds them.

When a notification's run has failed ``failure_limit`` times in a row (exceptions of the
observer's code, not conflicts), the worker *parks* it: it writes a record to the meta
table and stops running it.  The notification itself stays in the notify family, so
nothing is lost; workers skip the parked change (they reload the parked set every few
seconds).  ``percolator notifications list`` shows the records, ``percolator notifications
retry`` re-queues them: it leaves a fresh notification on the cell and deletes the record,
and the next run starts counting failures from zero.

A record parks **a change, not the cell for ever**: workers skip the cell's notifications
up to the parked one's version (``notify_ts``) only (:func:`skips`).  A later change of the
cell (a newer notification: often the fix of the input that made the observer fail) runs
as usual.  A run that ends (committed, or found the change already covered) read the
cell's latest commit, which covers every change up to its notification; so when a worker
ends a run of a parked cell's newer change, or of the parked change itself (another worker
parked it meanwhile: failure counts are per worker), it deletes the record
(:meth:`ParkingLot.unpark_covered`).  A worker that ran the change before it learnt of
the park leaves the record; the cell then holds no notification at or below the parked
version (only a covering run cleans one up), and the next reload of the parked set by any
worker deletes it (:meth:`ParkingLot.forget_covered`).  A park never replaces a record of
a newer change.

Record format (version 1), one row per parked cell::

    row        b"parked/" + table + b"/" + hex(row) + b"/" + column
    family     META_FAMILY, qualifier b"p", version = an oracle timestamp
    value      JSON {"v": 1, "table", "row_hex", "column", "observer", "failures",
               "last_error", "notify_ts", "parked_at_ms"}

Versions are oracle timestamps so that a retry's delete (at or below the version it read)
never masks a later park of the same cell, which gets a newer timestamp.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from percolator import notifications
from percolator.errors import ConfigError
from percolator.layout import META_FAMILY, META_TABLE, NOTIFY
from percolator.notifications import Notification
from percolator.protocol.cells import CellKey
from percolator.store.base import Delete, Put, ScanOptions
from percolator.store.checks import UNLIMITED_VERSIONS

if TYPE_CHECKING:
    from percolator.client import Client

PARKED_PREFIX = b"parked/"
_QUALIFIER = b"p"
# Error text kept in a record (the rest is in the worker's log).
_MAX_ERROR_CHARS = 2000

Cell = tuple[str, bytes, str]


@dataclass(frozen=True)
class ParkedNotification:
    table: str
    row: bytes
    column: str
    observer: str
    failures: int
    last_error: str
    notify_ts: int
    parked_at_ms: int
    #: store version of the record (needed to delete exactly it)
    version: int = 0

    @property
    def cell(self) -> Cell:
        return (self.table, self.row, self.column)

    def encode(self) -> bytes:
        doc = {
            "v": 1,
            "table": self.table,
            "row_hex": self.row.hex(),
            "column": self.column,
            "observer": self.observer,
            "failures": self.failures,
            "last_error": self.last_error,
            "notify_ts": self.notify_ts,
            "parked_at_ms": self.parked_at_ms,
        }
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, value: bytes, version: int) -> ParkedNotification:
        try:
            doc = json.loads(value)
            if doc.get("v") != 1:
                raise ValueError(f"unknown format version {doc.get('v')!r}")
            return cls(
                table=str(doc["table"]),
                row=bytes.fromhex(doc["row_hex"]),
                column=str(doc["column"]),
                observer=str(doc["observer"]),
                failures=int(doc["failures"]),
                last_error=str(doc["last_error"]),
                notify_ts=int(doc["notify_ts"]),
                parked_at_ms=int(doc["parked_at_ms"]),
                version=version,
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ConfigError(
                f"parked-notification record in {META_TABLE} is malformed ({exc}): {value[:200]!r}"
            ) from None

    def as_dict(self) -> dict[str, object]:
        return {
            "table": self.table,
            "row": self.row.decode("utf-8", "backslashreplace"),
            "row_hex": self.row.hex(),
            "column": self.column,
            "observer": self.observer,
            "failures": self.failures,
            "last_error": self.last_error,
            "notify_ts": self.notify_ts,
            "parked_at_ms": self.parked_at_ms,
        }


def parked_row(table: str, row: bytes, column: str) -> bytes:
    return PARKED_PREFIX + table.encode() + b"/" + row.hex().encode() + b"/" + column.encode()


class ParkingLot:
    """Parked notifications of one store.  Thread-safe (stateless beyond the client)."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def park(
        self, observer: str, notification: Notification, failures: int, last_error: str
    ) -> ParkedNotification:
        """Record ``notification`` as parked (idempotent: a second park replaces the
        record), unless the cell's record already parks a newer notification: that one is
        returned, unchanged (a worker that failed on an older change must not unpark a
        newer one).  The notification itself is left in place."""
        existing = self._record_of(notification.cell)
        if existing is not None and existing.notify_ts > notification.notify_ts:
            return existing
        record = ParkedNotification(
            table=notification.table,
            row=notification.row,
            column=notification.column,
            observer=observer,
            failures=failures,
            last_error=last_error[:_MAX_ERROR_CHARS],
            notify_ts=notification.notify_ts,
            parked_at_ms=int(time.time() * 1000),
        )
        version = self._client.oracle.get_timestamp()
        row = parked_row(record.table, record.row, record.column)
        put = Put(row, META_FAMILY, _QUALIFIER, version, record.encode())
        self._client.store.put(META_TABLE, [put])
        return ParkedNotification(**{**record.__dict__, "version": version})

    def records(
        self, *, observer: str | None = None, table: str | None = None
    ) -> list[ParkedNotification]:
        """Parked notifications, in row order, optionally of one observer / table."""
        stop = PARKED_PREFIX[:-1] + b"0"  # the byte after b"/": exactly the prefix
        options = ScanOptions(start=PARKED_PREFIX, stop=stop, qualifiers=[_QUALIFIER])
        found = []
        for _, cells in self._client.store.scan(META_TABLE, META_FAMILY, options):
            version, value = cells[_QUALIFIER]
            record = ParkedNotification.decode(value, version)
            if observer is not None and record.observer != observer:
                continue
            if table is not None and record.table != table:
                continue
            found.append(record)
        return found

    def parked(self) -> dict[Cell, int]:
        """The parked cells, each with the version of the notification parked: what workers
        skip (:func:`skips`)."""
        return {record.cell: record.notify_ts for record in self.records()}

    def retry(self, records: Iterable[ParkedNotification]) -> list[ParkedNotification]:
        """Re-queue parked notifications: leave a fresh notification on each cell, then
        delete its record.  A crash in between leaves the record (retry again: harmless).
        Returns the records retried."""
        done = []
        for record in records:
            key = CellKey(record.table, record.row, record.column)
            notify_ts = self._client.oracle.get_timestamp()
            notifications.put_notifications(self._client.store, [key], notify_ts)
            row = parked_row(record.table, record.row, record.column)
            self._client.store.delete_versions(
                META_TABLE, [Delete(row, META_FAMILY, _QUALIFIER, record.version)]
            )
            done.append(record)
        return done

    def _record_of(self, cell: Cell) -> ParkedNotification | None:
        table, row, column = cell
        key = parked_row(table, row, column)
        found = self._client.store.read_rows(META_TABLE, [key], columns=[(META_FAMILY, _QUALIFIER)])
        versions = found.get(key, {}).get((META_FAMILY, _QUALIFIER), [])
        if not versions:
            return None
        version, value = versions[0]
        return ParkedNotification.decode(value, version)

    def unpark_covered(self, cell: Cell, notify_ts: int) -> int | None:
        """Delete the cell's record if it parked a notification at or below ``notify_ts``,
        the version of a notification whose run just ended, covering it (module docstring).
        Returns the parked version still in force: None once no record is left, else that
        of a record of a newer notification, which stays (so does a park written after the
        record read here: its version is newer than the one deleted)."""
        record = self._record_of(cell)
        if record is None:
            return None
        if record.notify_ts > notify_ts:
            return record.notify_ts
        self._delete(record)
        return None

    def forget_covered(self, records: Iterable[ParkedNotification]) -> list[ParkedNotification]:
        """Delete those of ``records`` whose cell holds no notification at or below the
        parked version any more, and return them.  Only a run that covered a change
        cleans up its notification, so such a record's change was run after all - by a
        worker that had not loaded the record yet, say (failure counts are per worker) -
        and the record would only report a failure nothing is waiting on."""
        by_table: dict[str, list[ParkedNotification]] = {}
        for record in records:
            by_table.setdefault(record.table, []).append(record)
        gone: list[ParkedNotification] = []
        for table, of_table in by_table.items():
            columns = sorted({(NOTIFY, r.column.encode("utf-8")) for r in of_table})
            found = self._client.store.read_rows(
                table,
                sorted({r.row for r in of_table}),
                columns=columns,
                max_versions=UNLIMITED_VERSIONS,
            )
            for record in of_table:
                versions = found.get(record.row, {}).get((NOTIFY, record.column.encode("utf-8")))
                if not any(version <= record.notify_ts for version, _ in versions or ()):
                    self._delete(record)
                    gone.append(record)
        return gone

    def _delete(self, record: ParkedNotification) -> None:
        """Delete exactly ``record`` (a later park of the cell has a newer version)."""
        row = parked_row(record.table, record.row, record.column)
        self._client.store.delete_versions(
            META_TABLE, [Delete(row, META_FAMILY, _QUALIFIER, record.version)]
        )


def skips(parked: Mapping[Cell, int], notification: Notification) -> bool:
    """Whether workers skip ``notification`` given ``parked`` (:meth:`ParkingLot.parked`):
    its cell is parked at this notification's version or a newer one."""
    parked_ts = parked.get(notification.cell)
    return parked_ts is not None and notification.notify_ts <= parked_ts


def pending(
    client: Client, table: str, columns: Iterable[str] | None = None, *, limit: int | None = None
) -> list[tuple[bytes, str, int]]:
    """Notifications waiting in ``table``: ``(row, column, newest notify version)``, in row
    order (cost proportional to the notifications, not to the table)."""
    return [
        (n.row, n.column, n.notify_ts)
        for n in notifications.pending(client.store, table, columns, limit=limit)
    ]

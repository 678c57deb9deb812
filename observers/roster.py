"""Which workers are running, for operators (``percolator status``).

Each worker publishes one record of itself in the meta table (row ``worker/<worker id>``):
where it runs (host, process id), what it runs (observers, run threads, scanners, batch
size, partitioned or not and how many key groups it holds) and when it was last seen.  The
worker refreshes the record from its housekeeping thread and deletes it when it stops
gracefully; a killed worker's record stays and ages.  A record not refreshed for
:data:`LIVE_MS` is reported as *not seen* (the worker crashed, is paused or cannot reach
the store); one older than :data:`FORGET_MS` is deleted by the next worker that starts.

The roster is informational: nothing in the protocol reads it, so a missing or stale record
never affects a run.  Publishing is one put per refresh, removing one delete; both are
idempotent and may be retried.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from percolator.layout import META_FAMILY, META_TABLE, scan_meta_prefix
from percolator.store.base import Delete, Put, Store

log = logging.getLogger(__name__)

ROSTER_PREFIX = b"worker/"
_QUALIFIER = b"w"
#: a worker refreshes its record this often (from its housekeeping thread)
REFRESH_MS = 5_000
#: a record refreshed within this many milliseconds belongs to a live worker
LIVE_MS = 3 * REFRESH_MS
#: a record not refreshed for this long is deleted by the next worker that starts
FORGET_MS = 24 * 3600 * 1000


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class WorkerRecord:
    """One worker as it describes itself; ``seen_ms`` is when it last refreshed this."""

    worker_id: str
    host: str
    pid: int
    observers: tuple[str, ...]
    threads: int
    scanners: int
    batch_size: int
    partitioned: bool
    #: key groups leased at the last refresh (partitioned workers), else None
    key_groups: int | None
    started_ms: int
    seen_ms: int

    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def decode(cls, value: bytes) -> WorkerRecord:
        """Raises ValueError if ``value`` is not a record of this shape."""
        try:
            doc = json.loads(value)
            return cls(
                worker_id=str(doc["worker_id"]),
                host=str(doc["host"]),
                pid=int(doc["pid"]),
                observers=tuple(str(name) for name in doc["observers"]),
                threads=int(doc["threads"]),
                scanners=int(doc["scanners"]),
                batch_size=int(doc["batch_size"]),
                partitioned=bool(doc["partitioned"]),
                key_groups=None if doc["key_groups"] is None else int(doc["key_groups"]),
                started_ms=int(doc["started_ms"]),
                seen_ms=int(doc["seen_ms"]),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"not a worker record: {exc}") from exc


def _row(worker_id: str) -> bytes:
    return ROSTER_PREFIX + worker_id.encode()


def publish(store: Store, record: WorkerRecord) -> None:
    """Write ``record`` (one put, at version ``seen_ms``: a later refresh replaces it)."""
    store.put(
        META_TABLE,
        [Put(_row(record.worker_id), META_FAMILY, _QUALIFIER, record.seen_ms, record.encode())],
    )


def remove(store: Store, record: WorkerRecord) -> None:
    """Delete the record a worker published last (its graceful stop)."""
    store.delete_versions(
        META_TABLE, [Delete(_row(record.worker_id), META_FAMILY, _QUALIFIER, record.seen_ms)]
    )


@dataclass(frozen=True)
class RosterEntry:
    record: WorkerRecord
    #: milliseconds since the worker last refreshed its record
    age_ms: int

    @property
    def live(self) -> bool:
        return self.age_ms < LIVE_MS


def read_roster(store: Store, at_ms: int | None = None) -> list[RosterEntry]:
    """Every published worker record, newest start first.  One scan of the meta table's
    roster rows; a malformed record is logged and left out."""
    now = now_ms() if at_ms is None else at_ms
    entries = []
    for row, value in scan_meta_prefix(store, ROSTER_PREFIX, _QUALIFIER):
        try:
            record = WorkerRecord.decode(value)
        except ValueError as exc:
            log.warning("ignoring malformed worker record %r in %s: %s", row, META_TABLE, exc)
            continue
        entries.append(RosterEntry(record, max(0, now - record.seen_ms)))
    entries.sort(key=lambda e: (-e.record.started_ms, e.record.worker_id))
    return entries


def forget_old(store: Store, entries: Sequence[RosterEntry]) -> int:
    """Delete the records of ``entries`` older than :data:`FORGET_MS` (workers killed long
    ago); returns how many."""
    old = [e.record for e in entries if e.age_ms >= FORGET_MS]
    if old:
        store.delete_versions(
            META_TABLE,
            [Delete(_row(r.worker_id), META_FAMILY, _QUALIFIER, r.seen_ms) for r in old],
        )
    return len(old)

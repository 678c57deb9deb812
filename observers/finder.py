"""Finding notifications: what a worker's scanner threads do (design notes §4).

Scanners read only the notify family of the observed tables (through
percolator/notifications.py, Percolator's separate locality group), so one pass costs in
proportion to the dirty cells, not to the table.  Each pass starts at a random row (drawn
from rows recently seen dirty) and wraps around.  Scanners publish where they are
(:class:`ScannerPositions`); one that catches up with another scanner (the other's position
falls inside the batch it just scanned) jumps to a new random row instead of trailing it and
racing it for the same cells.  Positions of scanners in other processes are shared through
the meta table, except between partitioned workers: they scan disjoint key groups
(observers/partition.py), so another worker's position says nothing about this one's work,
and a partitioned scanner reads only its worker's groups (a filter evaluated in the store).
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from statistics import median
from typing import TYPE_CHECKING

from percolator.observers.worker_metrics import WorkerMetrics

from percolator.errors import PercolatorError
from percolator.layout import META_FAMILY, META_TABLE
from percolator.notifications import Notification, scan_notifications
from percolator.retry import Backoff, jittered
from percolator.store.base import Delete, Put, ScanOptions, Store

if TYPE_CHECKING:
    from percolator.client import Client

log = logging.getLogger(__name__)

# --------------------------------------------------------------------------- positions

_POSITIONS_PREFIX = b"scanner/"
# A published position older than this is from a dead or stuck scanner: ignored.
_POSITION_STALE_MS = 10_000
# ... and older than this, deleted (a killed worker never removes its own rows).  Worker ids
# are never reused; a worker that was only paused publishes again at a newer version.
_POSITION_EXPIRED_MS = 600_000


@dataclass
class _Position:
    table: str
    row: bytes
    at_ms: int


class ScannerPositions:
    """Where every scanner is: this process's in memory, other processes' through the
    meta table (rows ``scanner/<worker id>/<n>``, published by :meth:`sync`), unless
    ``shared`` is False (then :meth:`sync` does nothing: positions stay in the process)."""

    def __init__(self, client: Client, worker_id: str, *, shared: bool = True) -> None:
        self._client = client
        self._worker_id = worker_id
        self._shared = shared
        self._lock = threading.Lock()
        self._local: dict[int, _Position] = {}
        self._remote: list[_Position] = []
        self._published_version: dict[int, int] = {}

    def _row(self, scanner: int) -> bytes:
        return _POSITIONS_PREFIX + self._worker_id.encode() + b"/" + str(scanner).encode()

    def update(self, scanner: int, table: str, row: bytes) -> None:
        with self._lock:
            self._local[scanner] = _Position(table, row, int(time.time() * 1000))

    def caught_up(self, scanner: int, table: str, before: bytes, after: bytes) -> bool:
        """Whether another scanner's position lies in ``(before, after]`` of ``table``:
        this scanner just scanned up to where the other one is."""
        now = int(time.time() * 1000)
        with self._lock:
            others = [p for i, p in self._local.items() if i != scanner] + self._remote
        return any(
            p.table == table and before < p.row <= after and now - p.at_ms < _POSITION_STALE_MS
            for p in others
        )

    def sync(self) -> None:
        """Publish this process's positions and reload the others' (two store calls)."""
        if not self._shared:
            return
        store = self._client.store
        with self._lock:
            local = dict(self._local)
        puts = []
        for scanner, position in local.items():
            version = max(position.at_ms, self._published_version.get(scanner, 0) + 1)
            self._published_version[scanner] = version
            value = json.dumps(
                {"table": position.table, "row_hex": position.row.hex(), "at_ms": position.at_ms}
            ).encode()
            puts.append(Put(self._row(scanner), META_FAMILY, b"p", version, value))
        if puts:
            store.put(META_TABLE, puts)
        own = _POSITIONS_PREFIX + self._worker_id.encode() + b"/"
        stop = _POSITIONS_PREFIX[:-1] + b"0"
        remote = []
        expired = []
        now = int(time.time() * 1000)
        options = ScanOptions(start=_POSITIONS_PREFIX, stop=stop, qualifiers=[b"p"])
        for row, cells in store.scan(META_TABLE, META_FAMILY, options):
            if row.startswith(own):
                continue
            version, value = cells[b"p"]
            try:
                doc = json.loads(value)
                position = _Position(
                    str(doc["table"]), bytes.fromhex(doc["row_hex"]), int(doc["at_ms"])
                )
            except (ValueError, KeyError, TypeError):
                log.warning("ignoring malformed scanner position %r in %s", row, META_TABLE)
                continue
            if now - position.at_ms > _POSITION_EXPIRED_MS:
                expired.append(Delete(row, META_FAMILY, b"p", version))
            else:
                remote.append(position)
        if expired:
            store.delete_versions(META_TABLE, expired)
        with self._lock:
            self._remote = remote

    def close(self) -> None:
        """Remove this process's published positions."""
        deletes = [
            Delete(self._row(scanner), META_FAMILY, b"p", version)
            for scanner, version in self._published_version.items()
        ]
        if deletes:
            self._client.store.delete_versions(META_TABLE, deletes)


# --------------------------------------------------------------------------- finder

# How many dirty rows per table a finder remembers to start passes from.
_SAMPLE_SIZE = 64
# How often a scanner that waits for the queue to empty looks at it (no store traffic).
_QUEUE_POLL_S = 0.005
# The idle wait follows the median of this many recent empty passes (one slow pass, a store
# hiccup, does not stretch it), and never exceeds _IDLE_WAIT_MAX_S.
_IDLE_PASSES = 5
_IDLE_WAIT_MAX_S = 5.0


class NotificationFinder:
    """The scanners of one worker: each runs :meth:`scan_loop` in its own thread, finds the
    dirty cells of ``columns`` (table -> observed columns) and hands each notification to
    ``offer``, which may block (back-pressure) and says whether it took it.  ``queued``
    says how many offered notifications still wait for a run thread: after a pass that found
    nothing new, the next waits until none does.

    ``hash_ranges`` (partitioned workers) returns, at the start of each table pass, the
    row-hash ranges of the key groups the worker holds: only their notifications are read
    (plus legacy ones, which ``offer`` checks), and nothing when it holds none."""

    def __init__(
        self,
        store: Store,
        columns: Mapping[str, Sequence[str]],
        positions: ScannerPositions,
        offer: Callable[[Notification], bool],
        metrics: WorkerMetrics,
        *,
        stopping: threading.Event,
        scan_batch: int,
        idle_sleep_s: float,
        hash_ranges: Callable[[], list[tuple[int, int]]] | None = None,
        queued: Callable[[], int] = lambda: 0,
    ) -> None:
        self._store = store
        self._queued = queued
        self._hash_ranges = hash_ranges
        self._columns = {table: list(cs) for table, cs in columns.items()}
        self._tables = sorted(self._columns)
        self._positions = positions
        self._offer = offer
        self._metrics = metrics
        self._stopping = stopping
        self._scan_batch = scan_batch
        self._idle_sleep_s = idle_sleep_s
        # Shared by every scanner thread: a plain list per table, replaced item by item.
        self._samples: dict[str, list[bytes]] = {}

    def _random_start(self, table: str, rng: random.Random) -> bytes:
        sample = self._samples.get(table)
        return rng.choice(sample) if sample else b""

    def _remember(self, table: str, row: bytes, rng: random.Random) -> None:
        """Keep a small random sample of dirty rows per table to start passes from."""
        sample = self._samples.setdefault(table, [])
        if len(sample) < _SAMPLE_SIZE:
            sample.append(row)
        else:
            sample[rng.randrange(_SAMPLE_SIZE)] = row

    def scan_loop(self, index: int) -> None:
        """Scanner ``index``: pass after pass over every table, in random order, until the
        worker stops.  A store error backs off (doubling up to 5 s) and starts over."""
        rng = random.Random()
        backoff = Backoff(0.1, 5.0, jitter=0)
        empty_passes: deque[float] = deque(maxlen=_IDLE_PASSES)
        while not self._stopping.is_set():
            submitted = 0
            started = time.monotonic()
            try:
                for table in rng.sample(self._tables, len(self._tables)):
                    submitted += self.scan_table(index, table, rng)
                    if self._stopping.is_set():
                        return
                backoff.reset()
            except PercolatorError as exc:
                delay = backoff.next()
                log.warning("scanner %d: %s; retrying in %.1f s", index, exc, delay)
                self._stopping.wait(delay)
                continue
            if submitted == 0:
                # Idle, a scanner scans about half of the time at most: when its empty passes
                # take longer than idle_sleep_s it waits about as long as they take (their
                # recent median, at most _IDLE_WAIT_MAX_S).  On HBase a pass walks every
                # deleted notification until a major compaction drops them, and back to back
                # such passes kept the region server busy with nothing to do
                # (docs/operations.md, "Deleted notifications on HBase").
                empty_passes.append(time.monotonic() - started)
                idle_s = min(_IDLE_WAIT_MAX_S, max(self._idle_sleep_s, median(empty_passes)))
                self._stopping.wait(jittered(idle_s, rng=rng))
                self._wait_while_queued()

    def _wait_while_queued(self) -> None:
        """After a pass that found nothing new: wait while notifications still wait for a
        run thread.  A pass now would find those again and walk every deleted notification
        of the table to do so (on HBase the region server's largest cost under a backlog),
        and whatever new it found would queue behind them; once the queue is empty the next
        pass finds it in time for the next free thread."""
        while self._queued() > 0 and not self._stopping.wait(_QUEUE_POLL_S):
            pass

    def scan_table(self, index: int, table: str, rng: random.Random) -> int:
        """One pass over ``table``'s notifications from a random row, wrapping around.
        Returns how many notifications it queued."""
        hash_ranges = None if self._hash_ranges is None else self._hash_ranges()
        if hash_ranges is not None and not hash_ranges:
            return 0  # partitioned, and no key group held now
        start = self._random_start(table, rng)
        segments: list[tuple[bytes, bytes | None]] = [(start, None)]
        if start:
            segments.append((b"", start))
        submitted = 0
        columns = self._columns[table]
        for seg_start, seg_stop in segments:
            batch_start = seg_start
            rows_in_batch = 0
            found = scan_notifications(
                self._store,
                table,
                columns,
                start=seg_start,
                stop=seg_stop,
                batch_size=self._scan_batch,
                hash_ranges=hash_ranges,
            )
            for row, notifications in found:
                if self._stopping.is_set():
                    return submitted
                self._remember(table, row, rng)
                for notification in notifications:
                    if self._offer(notification):
                        submitted += 1
                rows_in_batch += 1
                if rows_in_batch >= self._scan_batch:
                    self._positions.update(index, table, row)
                    if self._positions.caught_up(index, table, batch_start, row):
                        self._metrics.jumps.inc()
                        return submitted
                    batch_start, rows_in_batch = row, 0
        self._metrics.passes.inc()
        return submitted

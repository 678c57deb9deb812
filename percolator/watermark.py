"""Per-observer low watermarks, computed from what is stored (MillWheel's low watermark).

Guarantee
---------
The watermark ``W`` of an observer is a timestamp such that **every change of a column it
watches with** ``commit_ts < W`` **has been processed**: a run of that observer committed
after it (strong: its ack covers it), or found nothing to do (the write was rolled back).
"Change" means a change that left a notification: every write that began after the
observer's registration returned (see percolator/notifications.py), plus the data found by
the registration's catch-up (see ``catch-up floors`` below).  Nothing else is needed than
the store and a fresh timestamp: any process can compute it (``percolator status``,
``percolator wait``, :func:`wait_for`).

How it is computed (:func:`compute_watermarks`), for each observer, in this order:

1. ``now`` = a fresh timestamp, taken first.  ``W <= now``.
2. the published value and the catch-up floor are read (meta table, below), then the
   registrations again (the columns scanned are those registered after that read: see
   ``catch-up floors``), then the bulk-load state of the watched tables (``bulk loads``);
3. **in-flight transactions**: the lock family of every watched column is scanned; a cell
   ``Locked`` by a transaction with ``start_ts = s`` holds ``W <= s`` (its commit
   timestamp, if it commits, is above ``s``).  This also covers a commit whose notification
   is written but whose primary is not decided yet: its locks are still there.
4. **pending notifications**: the notify family is scanned; a dirty cell holds ``W`` at or
   below its *oldest* notify version (every version is read, not only the newest).
   Parked notifications keep their notify cells, so they hold it back too.

Why the order makes it safe: take a change committed at ``c < now`` on a watched cell.  When
step 3 reads that cell, either the transaction's lock is there (``W <= s < c``), or it is
gone: it was never written then (impossible: the commit timestamp is drawn after prewrite,
so it would exceed ``now``), or the transaction was rolled back (no change), or it
committed - and a commit writes its notification before its commit point, so step 4 finds
it unless an observer run cleaned it up, which it does only once the change is processed.

**Cascading**: an observer's watermark is also held back by the watermarks of its
*upstream* observers: those whose declared ``outputs`` include a column it watches, and
every observer that declares no ``outputs`` (it may write anything, so it holds back every
other observer; declare outputs to get per-stage watermarks).  An observer that may write
a column it watches (it declares one among its outputs, or declares none) is upstream of
itself.  Cycles are fine: the
watermark is the minimum over everything upstream, transitively.  That alone is not enough:
work an upstream run left for this observer carries the commit timestamp of that run, not
the (older) timestamp of the change it came from.  So a pending notification (or a lock) at
``ts`` on a column an upstream observer writes holds this watermark at or below the
*origin bound*: the newest watermark that upstream observer published from a computation
that finished (a fresh timestamp taken after all its reads) before ``ts``, or 0 if none is
kept.  Why it is safe: a run that committed at ``ts`` covered a change ``c`` not yet
processed when that computation read the store, so that watermark was at most ``c``.  Each
published record keeps the last 64 ``(finished_ts, W)`` pairs for this.

**Scan order**: the origin bound only helps if the downstream observer's scan *sees* the
work an upstream run left for it.  An upstream run that commits between the two scans,
downstream first, would be seen by neither: its notification is cleaned up before the
upstream scan, and its output's notification is written after the downstream scan.  So
observers are scanned upstream first (step 3 then 4 for each); where a cycle makes that
impossible (a cycle, or an observer upstream of itself), every observer scanned before one
of its upstream observers (or with itself upstream) scans its notify family again after all
the others (step 4 only: a run that committed before the upstream
scan wrote this observer's notification before its commit point, so the second scan finds
it, or its run cleaned it up after processing it).

**Registering an upstream observer** (for the first time, again after an unregistration,
or under a new name in a redeploy) resets the published watermarks of every observer
downstream of it, as its catch-up resets its own (:func:`begin_catch_up`): while no
observer upstream owed them anything, theirs rose past changes the new one now owes them.
While an upstream observer is unregistered, its pending work holds nothing downstream.

**Monotonic**: the last published value of each observer is kept in the meta table (row
``watermark/<observer>``, qualifier ``w``, JSON ``{"v": 1, "w": W, "h": HISTORY}``, plus
``"n": NONCE`` in a reset, written by compare-and-set) and the result is the maximum of it
and the computed value.  The computed value alone may go backwards (a transaction that
started long ago prewrites a watched cell later: its lock holds the new computation below
the old one, yet its commit will be above the old value, so the old value stays true).  A
catch-up resets it (below).  The compare-and-set only proves "nothing changed since my
read" if the record never returns to earlier bytes: a computation's record ends with its
own ``finished_ts`` (a fresh timestamp) and a reset carries a random nonce.  A computation
that loses its compare-and-set returns no more than what is published then (the record may
have been reset by a catch-up it did not see).

Catch-up floors
---------------
A registration that starts watching a column catches up on the data already there
(``percolator.observers.api``): it leaves notifications at a fresh timestamp ``t`` on
cells whose latest commit its ack does not cover.  Those changes are older than their
notifications, so while it runs the observer's watermark is held by a *floor* (row
``watermark/<observer>``, qualifier ``f``, JSON ``{"v": 1, "floor": F, "until": t,
"done": BOOL}``): ``W <= 0`` while the catch-up is not done, then ``W <= F`` (the oldest
change it owes) until the computed value passes ``t`` (every catch-up notification is
processed); then the floor is deleted.  A catch-up that died half-way leaves ``done:
false``: the watermark stays at 0, visibly, until a catch-up is run again.

``F`` is only as good as the write history the catch-up reads, and GC truncates it: per
cell it keeps the newest commit at or below its bound (itself at or below the stored safe
point) and everything above, and removes a dead cell's history entirely (the cell may be
written again later).  So the retained commits of a cell are always a suffix of its
history, and the catch-up takes the first retained commit above the ack as the oldest
change owed only when nothing owed can be missing: some retained commit is at or below the
ack (the suffix reaches back to it), or the ack is at or above the GC safe point read after
the history (every removed commit is at or below that safe point, so none of them is
owed).  Otherwise the oldest owed change may be gone: the cell's bound is ``ack + 1`` (every
owed change is above the ack), or 0 without an ack (observers/catchup.py).

A computation reads the floor *before* the registrations it scans: a registration it does
not see runs its catch-up (and resets the published value) after that read, so the
compare-and-set fails.  The other way round, a whole registration and its catch-up could
run between the two reads, and the floor would be applied to columns not scanned.

Bulk loads
----------
A bulk load (percolator/bulkload.py) writes its cells, with notifications at its
``commit_ts`` ``C``, behind a fence (``loading`` in the table's state row) that hides them
from every scan of step 3 and 4 until the load is published.  So while a watched table is
``loading``, the observer's watermark is held at ``W <= C`` (``W <= start_ts`` while the
load has fenced the table but not drawn ``C`` yet).  The state is read after ``now`` and
before the table is scanned.  Why that suffices: if the read finds no load in progress,
either a load was published before it (its cells and notifications were put before the
publish, so the scan finds them unless they were processed), or it fences the table after
the read, and ``begin_load`` draws ``C`` only once its fence is visible: ``C > now >= W``.

Limits: the cost of one computation is a scan of the lock family of the watched columns
(proportional to the watched cells, not only the dirty ones) plus the notify family; a
client with a stale observed set (writes that began before registration returned) may
commit a change without notification, which only a catch-up finds; a manual ``trigger``
of old data does not lower a published watermark (it is a re-run, not a missed change).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from percolator.errors import ConfigError, InvalidArgumentError, PercolatorError
from percolator.layout import LOCK, META_FAMILY, META_TABLE, NOTIFY, name_list
from percolator.notifications import Notification, Registration, registrations
from percolator.records import LockCell, RecordError
from percolator.store.base import ScanOptions, Store
from percolator.store.checks import UNLIMITED_VERSIONS
from percolator.tablestate import LoadState, read_raw_states
from percolator.timestamps.hybrid import physical_ms

if TYPE_CHECKING:
    from percolator.timestamps.source import TimestampOracle

WATERMARK_PREFIX = b"watermark/"
_PUBLISHED = b"w"
_FLOOR = b"f"
_TOMBSTONE = b"-"
# The parked-notification records of percolator/observers/parking.py (format version 1):
# the engine only counts them per observer, it never writes them.
_PARKED_PREFIX = b"parked/"
_PARKED_QUALIFIER = b"p"
_SAMPLES = 5


class WatermarkTimeoutError(PercolatorError):
    """:func:`wait_for` gave up: some observer's watermark did not pass the timestamp."""

    retryable = True


@dataclass(frozen=True)
class Floor:
    """A registration catch-up in progress or not yet fully processed."""

    floor: int
    until: int
    done: bool

    def encode(self) -> bytes:
        doc = {"v": 1, "floor": self.floor, "until": self.until, "done": self.done}
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, value: bytes) -> Floor | None:
        if not value or value == _TOMBSTONE:
            return None
        doc = json.loads(value)
        return cls(int(doc["floor"]), int(doc["until"]), bool(doc["done"]))


@dataclass
class ObserverWatermark:
    """One observer's watermark and what holds it back."""

    observer: str
    #: the low watermark (monotonic, published)
    watermark: int
    #: the fresh timestamp the computation started from
    now_ts: int
    #: computed from this observer's own columns only (before cascading and the max)
    own: int = 0
    #: the upstream observer whose watermark holds this one lowest (None: its own data)
    held_by: str | None = None
    pending: int = 0
    locks: int = 0
    parked: int = 0
    catching_up: bool = False
    #: bulk loads in progress on watched tables: ``(table, load id, bound)``
    loads: list[tuple[str, str, int]] = field(default_factory=list)
    #: a few pending notifications (oldest version each) and in-flight locks, for errors
    pending_samples: list[Notification] = field(default_factory=list)
    lock_samples: list[tuple[str, bytes, str, int]] = field(default_factory=list)
    columns: list[tuple[str, str]] = field(default_factory=list)

    @property
    def lag_ms(self) -> int:
        """How far the watermark is behind ``now`` (milliseconds of physical time)."""
        return max(0, physical_ms(self.now_ts) - physical_ms(self.watermark))

    def as_dict(self) -> dict[str, object]:
        return {
            "observer": self.observer,
            "watermark": self.watermark,
            "lag_ms": self.lag_ms,
            "held_by": self.held_by,
            "pending": self.pending,
            "locks": self.locks,
            "parked": self.parked,
            "catching_up": self.catching_up,
        }

    def describe(self) -> str:
        """One line naming what holds it back (for errors and the command line)."""
        parts = [f"observer {self.observer!r}: watermark {self.watermark} (lag {self.lag_ms} ms)"]
        if self.held_by is not None:
            parts.append(f"held back by upstream observer {self.held_by!r}")
        if self.catching_up:
            parts.append("registration catch-up not finished")
        for table, load_id, bound in self.loads:
            parts.append(f"table {table!r} is being bulk-loaded (load {load_id!r}, at {bound})")
        if self.pending:
            samples = ", ".join(str(n) for n in self.pending_samples)
            parts.append(f"{self.pending} pending notification(s), e.g. {samples}")
        if self.locks:
            samples = ", ".join(f"{t}/{r!r}/{c} locked at {s}" for t, r, c, s in self.lock_samples)
            parts.append(f"{self.locks} transaction lock(s) in flight, e.g. {samples}")
        if self.parked:
            parts.append(f"{self.parked} parked notification(s) (`percolator notifications list`)")
        return "; ".join(parts)


# --------------------------------------------------------------------------- meta records


def _row(observer: str) -> bytes:
    return WATERMARK_PREFIX + observer.encode("utf-8")


def _read_meta(store: Store, observer: str) -> tuple[bytes | None, bytes | None]:
    """``(published bytes, floor bytes)`` of ``observer`` (one row read)."""
    cells = store.read_row(
        META_TABLE, _row(observer), columns=[(META_FAMILY, _PUBLISHED), (META_FAMILY, _FLOOR)]
    )
    published = cells.get((META_FAMILY, _PUBLISHED))
    floor = cells.get((META_FAMILY, _FLOOR))
    return (published[0][1] if published else None, floor[0][1] if floor else None)


# How many (finished_ts, W) pairs a published record keeps (for origins, see "Cascading").
_HISTORY = 64


def _decode_published(value: bytes | None) -> tuple[int, list[tuple[int, int]]]:
    """``(W, [(finished_ts, W), ...])`` of a published record (oldest first).  Reads the
    records of every version of this module (the reset nonce ``n`` is optional)."""
    if not value:
        return 0, []
    doc = json.loads(value)
    return int(doc["w"]), [(int(f), int(w)) for f, w in doc.get("h", [])]


def _encode_published(
    watermark: int, history: Sequence[tuple[int, int]] = (), *, nonce: str | None = None
) -> bytes:
    doc: dict[str, object] = {
        "v": 1,
        "w": watermark,
        "h": [list(pair) for pair in history[-_HISTORY:]],
    }
    if nonce is not None:
        doc["n"] = nonce
    return json.dumps(doc, separators=(",", ":")).encode()


def _origin_bound(history: Sequence[tuple[int, int]], ts: int) -> int:
    """The newest published watermark whose computation finished before ``ts`` (0: none):
    a lower bound of the origin of work an upstream run left at ``ts``."""
    best = 0
    for finished, watermark in history:
        if finished < ts:
            best = max(best, watermark)
    return best


def _cas(store: Store, observer: str, qualifier: bytes, expected: bytes | None, new: bytes) -> bool:
    return store.compare_and_set(META_TABLE, _row(observer), META_FAMILY, qualifier, expected, new)


def begin_catch_up(store: Store, observer: str, outputs: Iterable[tuple[str, str]] | None) -> None:
    """Record that ``observer`` starts catching up (its watermark is 0 until
    :func:`finish_catch_up`), and reset its published watermark to 0.  The floor is written
    first, so a computation that read the old published value fails its compare-and-set.

    The observers downstream of it (transitively, with ``outputs``, what it declares it
    writes, None: anything) are reset to 0 too: published watermarks only rise, and theirs
    may have risen while no observer upstream of them owed anything (this one not yet
    registered, or unregistered for a redeploy), past changes this one now owes them.

    The reset carries a random nonce: an earlier reset (or a fresh registration's) wrote
    ``w: 0`` too, and identical bytes would let a computation that read them before this
    catch-up win its compare-and-set afterwards (ABA) and publish a value computed without
    the floor.  Every other record is unique already: it ends with its computation's
    ``finished_ts``, a fresh timestamp."""
    _set(store, observer, _FLOOR, Floor(0, 0, False).encode())
    _set(store, observer, _PUBLISHED, _encode_published(0, nonce=uuid.uuid4().hex))
    for name in sorted(_downstream(list(registrations(store).values()), observer, outputs)):
        _set(store, name, _PUBLISHED, _encode_published(0, nonce=uuid.uuid4().hex))


def _downstream(
    regs: Sequence[Registration], observer: str, outputs: Iterable[tuple[str, str]] | None
) -> set[str]:
    """The registered observers other than ``observer`` that it is upstream of, directly
    (they watch one of ``outputs``; all of them if None) or through others."""
    declared = None if outputs is None else set(outputs)
    upstream = _upstream(regs)
    found = {
        name
        for name, cols in _watched(regs).items()
        if name != observer and (declared is None or cols & declared)
    }
    frontier = list(found)
    while frontier:
        current = frontier.pop()
        for name, above in upstream.items():
            if current in above and name != observer and name not in found:
                found.add(name)
                frontier.append(name)
    return found


def finish_catch_up(store: Store, observer: str, floor: int, until: int) -> None:
    """The catch-up of ``observer`` left every notification it owed, at or below ``until``;
    the oldest change among them committed at ``floor`` (``until`` if none)."""
    _set(store, observer, _FLOOR, Floor(floor, until, True).encode())


def catch_up_owed(store: Store, observer: str) -> bool:
    """Whether a catch-up of ``observer`` was begun and never finished."""
    _, floor_bytes = _read_meta(store, observer)
    floor = Floor.decode(floor_bytes) if floor_bytes else None
    return floor is not None and not floor.done


def _set(store: Store, observer: str, qualifier: bytes, value: bytes) -> None:
    for _ in range(100):
        cells = store.read_row(META_TABLE, _row(observer), columns=[(META_FAMILY, qualifier)])
        versions = cells.get((META_FAMILY, qualifier))
        current = versions[0][1] if versions else None
        if _cas(store, observer, qualifier, current or None, value):
            return
    raise PercolatorError(f"watermark record of {observer!r} kept changing under us")


# --------------------------------------------------------------------------- computation


def _parked_counts(store: Store) -> dict[str, int]:
    stop = _PARKED_PREFIX[:-1] + b"0"
    options = ScanOptions(start=_PARKED_PREFIX, stop=stop, qualifiers=[_PARKED_QUALIFIER])
    counts: dict[str, int] = {}
    for _, cells in store.scan(META_TABLE, META_FAMILY, options):
        try:
            name = str(json.loads(cells[_PARKED_QUALIFIER][1])["observer"])
        except (ValueError, KeyError, TypeError):
            continue  # a malformed record is reported by `percolator notifications list`
        counts[name] = counts.get(name, 0) + 1
    return counts


def _scan_own(
    store: Store,
    result: ObserverWatermark,
    table: str,
    columns: Sequence[str],
    origin: Callable[[str, str, int], int],
    *,
    locks: bool = True,
) -> int:
    """Steps 3 (unless ``locks`` is False) and 4 for one table: the lowest bound from locks
    and notifications, each mapped to the oldest origin it may carry (``origin``, see
    "Cascading")."""
    bound = result.now_ts
    if not store.table_exists(table):
        return bound  # registered ahead of its table: no change can be pending there yet
    qualifiers = [c.encode("utf-8") for c in columns]
    lock_cells = store.scan(table, LOCK, ScanOptions(qualifiers=qualifiers)) if locks else []
    for row, cells in lock_cells:
        for qualifier, (_, value) in cells.items():
            try:
                lock = LockCell.decode(value).lock
            except RecordError:
                continue  # reported by the reads that meet it; not ours to judge here
            if lock is None:
                continue
            column = qualifier.decode("utf-8")
            bound = min(bound, lock.start_ts, origin(table, column, lock.start_ts))
            result.locks += 1
            if len(result.lock_samples) < _SAMPLES:
                result.lock_samples.append((table, row, column, lock.start_ts))
    return min(bound, _scan_notify(store, result, table, qualifiers, origin))


def _scan_notify(
    store: Store,
    result: ObserverWatermark,
    table: str,
    qualifiers: Sequence[bytes],
    origin: Callable[[str, str, int], int],
) -> int:
    """Step 4 for one table: the lowest bound from the pending notifications (every
    version), each mapped to the oldest origin it may carry."""
    bound = result.now_ts
    dirty: list[bytes] = []
    for row, _ in store.scan(table, NOTIFY, ScanOptions(qualifiers=qualifiers)):
        dirty.append(row)
    for start in range(0, len(dirty), 200):
        rows = dirty[start : start + 200]
        found = store.read_rows(
            table,
            rows,
            columns=[(NOTIFY, q) for q in qualifiers],
            # Every notify version of a dirty cell: the oldest one is wanted.
            max_versions=UNLIMITED_VERSIONS,
        )
        for row, row_cells in found.items():
            for (_, qualifier), versions in sorted(row_cells.items()):
                if not versions:
                    continue
                oldest = min(version for version, _ in versions)
                bound = min(bound, oldest, origin(table, qualifier.decode("utf-8"), oldest))
                result.pending += 1
                if len(result.pending_samples) < _SAMPLES:
                    result.pending_samples.append(
                        Notification(table, row, qualifier.decode(), oldest)
                    )
    return bound


def _scan_order(upstream: Mapping[str, set[str]]) -> list[str]:
    """The observers in an order where each comes after its upstream observers wherever the
    graph allows (a cycle is broken at its smallest name)."""
    remaining = set(upstream)
    order: list[str] = []
    while remaining:
        ready = sorted(name for name in remaining if not upstream[name] & remaining)
        pick = ready[0] if ready else min(remaining)
        order.append(pick)
        remaining.discard(pick)
    return order


def _watched(regs: Iterable[Registration]) -> dict[str, set[tuple[str, str]]]:
    """Observer -> the ``(table, column)`` pairs it watches."""
    watched: dict[str, set[tuple[str, str]]] = {}
    for reg in regs:
        watched.setdefault(reg.observer, set()).add((reg.table, reg.column))
    return watched


def declared_outputs(regs: Iterable[Registration]) -> dict[str, set[tuple[str, str]] | None]:
    """Observer -> the ``(table, column)`` pairs its registrations declare it writes; None
    if one of them declares none (it may write anything)."""
    outputs: dict[str, set[tuple[str, str]] | None] = {}
    for reg in regs:
        declared = None if reg.outputs is None else set(reg.outputs)
        known = outputs.get(reg.observer, set())
        outputs[reg.observer] = None if declared is None or known is None else known | declared
    return outputs


def _upstream(regs: Sequence[Registration]) -> dict[str, set[str]]:
    """Observer -> the observers directly upstream of it (see the module docstring)."""
    watched = _watched(regs)
    outputs = declared_outputs(regs)
    upstream: dict[str, set[str]] = {name: set() for name in watched}
    for name, cols in watched.items():
        for other, out in outputs.items():
            # An observer that may write a column it watches is upstream of itself: work a
            # run leaves for it carries that run's commit timestamp, not its origin's.
            if out is None or out & cols:
                upstream[name].add(other)
    return upstream


@dataclass(frozen=True)
class _Load:
    """A bulk load in progress on a table, and how high it lets the watermark of the
    table's observers be (see "Bulk loads" in the module docstring)."""

    load_id: str
    bound: int


def _decode_load(value: bytes) -> _Load | None:
    """The load in progress a table state row records (None: the table is usable).  A
    record this module cannot read holds the watermark at 0: it cannot rule a load out."""
    try:
        state = LoadState.decode(value)
    except ConfigError as exc:
        return _Load(f"<{exc}>", 0)
    if not state.loading:
        return None
    # Its changes are at ``commit_ts``: ``W <= commit_ts`` claims nothing about them.  While
    # it is 0 the load has fenced the table but not drawn it; it is drawn after the fence is
    # visible, so it will be above ``start_ts`` (drawn before).
    return _Load(state.load_id, state.commit_ts if state.commit_ts else state.start_ts)


def _loads_in_progress(store: Store, tables: Sequence[str]) -> dict[str, _Load]:
    """The tables among ``tables`` fenced by a bulk load not yet published (one read)."""
    loads: dict[str, _Load] = {}
    for table, raw in read_raw_states(store, tables).items():
        load = _decode_load(raw)
        if load is not None:
            loads[table] = load
    return loads


def compute_watermarks(
    store: Store,
    oracle: TimestampOracle,
    *,
    publish: bool = True,
) -> dict[str, ObserverWatermark]:
    """The watermark of every registered observer (see the module docstring for the
    guarantee and the order of reads).  ``publish``: store the result as the observer's
    last published watermark (compare-and-set; a lost race leaves the other value, and the
    result returned is then no higher than it).

    Read-only apart from the published values and finished floors.  Cost: one scan of the
    lock and notify families of every watched column, one read per dirty row batch."""
    regs = list(registrations(store).values())
    now_ts = oracle.get_timestamp()
    # Published values and floors first: a catch-up that resets them after this read makes
    # the compare-and-set below fail (see begin_catch_up).  The registrations used are read
    # *after* them: a registration (or a change of one) that this computation does not see
    # starts its catch-up later, which resets the published value under us.  Read the other
    # way round, a whole registration and catch-up could fit between the two reads: the
    # floor would be read, but the columns it covers not scanned.
    meta: dict[str, tuple[bytes | None, bytes | None]] = {}
    for _ in range(100):
        for name in sorted({reg.observer for reg in regs} - meta.keys()):
            meta[name] = _read_meta(store, name)
        reread = list(registrations(store).values())
        if {reg.observer for reg in reread} <= meta.keys():
            regs = reread
            break
        regs = reread
    else:
        raise PercolatorError("observer registrations kept changing; try again")
    by_observer: dict[str, list[Registration]] = {}
    for reg in regs:
        by_observer.setdefault(reg.observer, []).append(reg)
    upstream = _upstream(regs)
    outputs = declared_outputs(regs)
    # Bulk loads in progress (fenced, not yet published) on the watched tables, read after
    # ``now_ts`` and before the scans (see "Bulk loads" in the module docstring).
    loads = _loads_in_progress(store, sorted({reg.table for reg in regs}))
    histories = {name: _decode_published(meta[name][0])[1] for name in by_observer}
    parked = _parked_counts(store)
    results: dict[str, ObserverWatermark] = {}

    def origin_for(name: str) -> Callable[[str, str, int], int]:
        def origin(table: str, column: str, ts: int) -> int:
            bound = ts
            for other in upstream.get(name, ()):
                out = outputs.get(other)
                if out is None or (table, column) in out:
                    bound = min(bound, _origin_bound(histories.get(other, []), ts))
            return bound

        return origin

    def watched_tables(name: str) -> dict[str, list[str]]:
        tables: dict[str, list[str]] = {}
        for reg in by_observer[name]:
            tables.setdefault(reg.table, []).append(reg.column)
        return {table: sorted(columns) for table, columns in sorted(tables.items())}

    # Upstream observers first (see "Scan order" in the module docstring).
    order = _scan_order({name: upstream.get(name, set()) for name in by_observer})
    for name in order:
        own_regs = by_observer[name]
        result = ObserverWatermark(name, 0, now_ts, parked=parked.get(name, 0))
        result.columns = sorted((r.table, r.column) for r in own_regs)
        bound = now_ts
        for table, columns in watched_tables(name).items():
            load = loads.get(table)
            if load is not None:
                bound = min(bound, load.bound)
                result.loads.append((table, load.load_id, load.bound))
            bound = min(bound, _scan_own(store, result, table, columns, origin_for(name)))
        floor_bytes = meta[name][1]
        floor = Floor.decode(floor_bytes) if floor_bytes else None
        if floor is not None:
            if not floor.done:
                result.catching_up = True
                bound = 0
            elif bound <= floor.until:
                bound = min(bound, floor.floor)
            elif publish:
                # Every catch-up notification is processed: the floor has done its job.
                _cas(store, name, _FLOOR, floor_bytes, _TOMBSTONE)
        result.own = bound
        results[name] = result
    # An observer scanned before one of its upstream observers (a cycle) reads its pending
    # notifications again, now that every observer has been scanned once.
    position = {name: index for index, name in enumerate(order)}
    for name in order:
        # (>=: an observer upstream of itself is scanned "before" itself too.)
        if any(position[other] >= position[name] for other in upstream.get(name, ())):
            scratch = ObserverWatermark(name, 0, now_ts)  # counted in the first scan
            for table, columns in watched_tables(name).items():
                again = _scan_own(store, scratch, table, columns, origin_for(name), locks=False)
                results[name].own = min(results[name].own, again)
    # Taken after every read: a run that commits after it started after those reads.
    finished_ts = oracle.get_timestamp() if publish else 0
    for name, result in results.items():
        # Transitive closure: everything upstream of upstream holds this one back too.
        seen: set[str] = set()
        frontier = list(upstream.get(name, ()))
        effective, held_by = result.own, None
        while frontier:
            other = frontier.pop()
            if other in seen or other == name or other not in results:
                continue
            seen.add(other)
            if results[other].own < effective:
                effective, held_by = results[other].own, other
            frontier.extend(upstream.get(other, ()))
        published_bytes = meta[name][0]
        published, history = _decode_published(published_bytes)
        if published > effective:
            result.watermark, result.held_by = published, None
        else:
            result.watermark, result.held_by = effective, held_by
        if publish:
            record = _encode_published(
                result.watermark, [*history, (finished_ts, result.watermark)]
            )
            if _cas(store, name, _PUBLISHED, published_bytes, record):
                continue
        # Lost the race (or did not publish): the record changed since it was read, maybe
        # reset by a catch-up whose floor this computation did not see.  What is published
        # now is safe (its computation won its compare-and-set, or it is the reset's 0),
        # so is anything below it: never return more than that.
        current_bytes = _read_meta(store, name)[0]
        if current_bytes != published_bytes:
            current = _decode_published(current_bytes)[0]
            if current < result.watermark:
                result.watermark, result.held_by = current, None
    return results


def watermarks(
    store: Store, oracle: TimestampOracle, observers: Iterable[str] | None = None
) -> dict[str, ObserverWatermark]:
    """:func:`compute_watermarks`, restricted to ``observers`` (None: all); raises
    InvalidArgumentError naming an observer that is not registered."""
    results = compute_watermarks(store, oracle)
    if observers is None:
        return results
    wanted = list(observers)
    unknown = [n for n in wanted if n not in results]
    if unknown:
        raise InvalidArgumentError(
            f"observer(s) {', '.join(map(repr, unknown))} not registered; registered: "
            f"{', '.join(sorted(results)) or 'none'}"
        )
    return {n: results[n] for n in wanted}


def wait_for(
    store: Store,
    oracle: TimestampOracle,
    ts: int | None = None,
    observers: Iterable[str] | None = None,
    *,
    timeout: float = 60.0,
    poll_s: float = 0.05,
) -> dict[str, ObserverWatermark]:
    """Return once the watermark of every observer in ``observers`` (None: every registered
    observer) is above ``ts`` (None: a fresh timestamp): then every change they watch that
    committed before ``ts`` is processed, and - through cascading - so is what upstream
    observers derived from it.  Returns the watermarks that passed.

    Raises WatermarkTimeoutError after ``timeout`` seconds naming each observer still
    behind and what holds it (pending notifications with samples, locks, parked ones,
    upstream observers); InvalidArgumentError for an unknown observer or a bad timeout.
    Read-only apart from publishing watermarks."""
    if not isinstance(timeout, (int, float)) or timeout < 0:
        raise InvalidArgumentError(f"timeout must be a number of seconds >= 0, got {timeout!r}")
    names = name_list(observers, "observers") if observers is not None else None
    target = ts if ts is not None else oracle.get_timestamp()
    deadline = time.monotonic() + timeout
    delay = poll_s
    while True:
        current = watermarks(store, oracle, names)
        behind = [w for w in current.values() if w.watermark <= target]
        if not behind:
            return current
        if time.monotonic() >= deadline:
            raise WatermarkTimeoutError(
                f"timed out after {timeout:g} s waiting for the watermark of "
                f"{len(behind)} observer(s) to pass {target}: "
                + " | ".join(w.describe() for w in behind)
            )
        time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(delay * 2, 0.5)

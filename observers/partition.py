"""Partitioned scanning: key groups leased to live workers, with a fencing sequence.

The notify space is divided into a fixed number of *key groups*: equal ranges of the
32-bit row hash (:func:`percolator.notifications.row_hash`), group ``g`` of ``G`` holding
the rows with ``hash * G >> 32 == g`` (``G`` the same in every worker: set ``key_groups``
alike everywhere).  A worker runs only the notifications of the groups it holds a lease
on, so workers stop racing each other for the same cells (Flink's key groups, MillWheel's
key intervals), and it *reads* only those: every notify cell stores its row's hash, and
the scan selects the held hash ranges in the store (a value filter that HBase's region
server evaluates; :meth:`KeyGroupLeases.hash_ranges`).  Random scanning (no partitioning)
stays the default, for a single worker.

Workers share key groups only with workers that run the same observers: the records of
one *partition domain* (a digest of the sorted observer names, :func:`partition_domain`)
are kept apart from another's, so each set of observers covers the whole notify space.
(Shared between workers running different observers, a group leased to one would leave
the other observers' notifications in it to nobody.)

Meta-table records (format version 1; the leases written by compare-and-set only):

===============================  ===================================================
``member/<domain>/<worker id>``  qualifier ``h``: JSON ``{"v": 1, "at_ms": T}`` (at
                                 version ``T``) - heartbeat; deleted when the worker
                                 stops, or by any worker once ten leases old
``keygroup/<domain>/<g>``        qualifier ``l``: JSON ``{"v": 1, "owner": ID, "seq": N,
                                 "expires_ms": T}`` - the lease on group ``g``
===============================  ===================================================

Assignment (:meth:`KeyGroupLeases.rebalance`, every housekeeping interval): a worker
renews its leases, releases those above its fair share (``ceil(groups / live workers)``,
live = heartbeat younger than one lease), and takes free or expired groups up to it.  A
group held by a worker that died moves once its lease ends; one held by a live worker
moves when that worker gives it up.

Fencing: every acquisition increments the group's sequence ``seq``.  A run remembers the
``(group, seq)`` it started under and checks, just before its commit, that the lease still
names this worker with the same sequence and has not expired (:meth:`fences_hold`, one
read for all the groups of a batch of runs).  A worker
that was paused past its lease finds the sequence changed and rolls back: it commits
nothing for a group it lost.  (The check and the commit are two steps, so a pause exactly
between them can still commit; then the ack conflict prevents a second commit of the same
change - the fence stops wasted work, the ack keeps exactly-once.)  The worker's own view
also lapses a quarter lease before the lease does, so it stops offering a group's
notifications before another worker may take it.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import threading
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from percolator.errors import ConfigError
from percolator.layout import META_FAMILY, META_TABLE, scan_meta_prefix
from percolator.notifications import HASH_SPACE, row_hash
from percolator.store.base import Delete, Put

if TYPE_CHECKING:
    from percolator.client import Client

MEMBER_PREFIX = b"member/"
GROUP_PREFIX = b"keygroup/"
_HEARTBEAT = b"h"
_LEASE = b"l"


def partition_domain(observers: Iterable[str]) -> str:
    """The partition domain of a worker running ``observers``: workers share key groups
    only within one (the module docstring)."""
    names = "\n".join(sorted(set(observers))).encode("utf-8")
    return hashlib.sha256(names).hexdigest()[:16]


#: a heartbeat this many leases old belongs to a worker long gone: any worker removes it
_STALE_MEMBER_LEASES = 10

#: The most key groups a partition may have.  Every rebalance (once per housekeeping
#: interval) walks all the groups and their lease rows, so the count costs memory and
#: store reads in every worker; a few groups per worker balance the load (the default is
#: 64), and this is far more than any deployment has workers.
MAX_KEY_GROUPS = 65_536


def group_of(row: bytes, groups: int) -> int:
    """The key group of ``row`` (stable across processes and versions)."""
    return row_hash(row) * groups // HASH_SPACE


def group_hash_range(group: int, groups: int) -> tuple[int, int]:
    """The half-open range of row hashes in ``group``: exactly the hashes ``h`` with
    ``h * groups // HASH_SPACE == group``."""
    return (-(-group * HASH_SPACE // groups), -(-(group + 1) * HASH_SPACE // groups))


def merged_hash_ranges(held: Iterable[int], groups: int) -> list[tuple[int, int]]:
    """The hash ranges of the ``held`` groups, adjacent groups merged into one range (a
    shorter filter for the store)."""
    merged: list[tuple[int, int]] = []
    for group in sorted(set(held)):
        low, high = group_hash_range(group, groups)
        if merged and merged[-1][1] == low:
            merged[-1] = (merged[-1][0], high)
        else:
            merged.append((low, high))
    return merged


@dataclass(frozen=True)
class Lease:
    owner: str
    seq: int
    expires_ms: int

    def encode(self) -> bytes:
        doc = {"v": 1, "owner": self.owner, "seq": self.seq, "expires_ms": self.expires_ms}
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, value: bytes) -> Lease:
        try:
            doc = json.loads(value)
            return cls(str(doc["owner"]), int(doc["seq"]), int(doc["expires_ms"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"key-group lease in {META_TABLE} is malformed ({exc})") from None


class KeyGroupLeases:
    """The key groups one worker holds.  Thread-safe.  ``clock``: wall-clock ms (leases
    are compared across processes: keep clocks within a fraction of ``lease_ms``)."""

    def __init__(
        self,
        client: Client,
        worker_id: str,
        *,
        groups: int = 64,
        lease_ms: int = 10_000,
        clock: Callable[[], float] = time.time,
        domain: str = "",
    ) -> None:
        if not 1 <= groups <= MAX_KEY_GROUPS or lease_ms < 100:
            raise ConfigError(
                f"key groups must be in 1..{MAX_KEY_GROUPS} and lease >= 100 ms, "
                f"got {groups}, {lease_ms}"
            )
        self._client = client
        self.worker_id = worker_id
        #: the partition domain (:func:`partition_domain`); its records are its own
        self.domain = domain
        self._group_prefix = GROUP_PREFIX + domain.encode("utf-8") + b"/"
        self._member_prefix = MEMBER_PREFIX + domain.encode("utf-8") + b"/"
        self._member_row = self._member_prefix + worker_id.encode("utf-8")
        self._heartbeat_version = 0
        self.groups = groups
        self.lease_ms = lease_ms
        self._clock = clock
        self._lock = threading.Lock()
        # group -> (seq, local deadline in ms): valid for offering and running until then
        self._owned: dict[int, tuple[int, int]] = {}

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    def _row(self, group: int) -> bytes:
        return self._group_prefix + b"%05d" % group

    def _cas(self, group: int, expected: bytes | None, lease: Lease) -> bool:
        return self._client.store.compare_and_set(
            META_TABLE, self._row(group), META_FAMILY, _LEASE, expected, lease.encode()
        )

    def live_workers(self) -> list[str]:
        now = self._now_ms()
        live = []
        stale: list[Delete] = []
        prefix = self._member_prefix
        for row, value in scan_meta_prefix(self._client.store, prefix, _HEARTBEAT):
            try:
                at_ms = int(json.loads(value)["at_ms"])
            except (ValueError, KeyError, TypeError):
                continue
            if now - at_ms < self.lease_ms:
                live.append(row[len(prefix) :].decode("utf-8", "replace"))
            elif now - at_ms > _STALE_MEMBER_LEASES * self.lease_ms:
                # At its own version: a heartbeat its worker stored since (a later
                # version) survives the delete.
                stale.append(Delete(row, META_FAMILY, _HEARTBEAT, max(at_ms, 1)))
        if stale:
            self._client.store.delete_versions(META_TABLE, stale)
        return live

    def rebalance(self) -> dict[int, int]:
        """Heartbeat, renew, release the surplus, take free groups (see the module
        docstring).  Returns the groups held, with their sequences."""
        store = self._client.store
        now = self._now_ms()
        # Its version is its time (the stale-heartbeat delete removes exactly it).
        version = max(now, self._heartbeat_version + 1)
        heartbeat = json.dumps({"v": 1, "at_ms": version}).encode()
        store.put(META_TABLE, [Put(self._member_row, META_FAMILY, _HEARTBEAT, version, heartbeat)])
        self._heartbeat_version = version
        live = set(self.live_workers()) | {self.worker_id}
        target = math.ceil(self.groups / len(live))
        current: dict[int, tuple[bytes, Lease]] = {}
        for row, value in scan_meta_prefix(self._client.store, self._group_prefix, _LEASE):
            group = int(row[len(self._group_prefix) :])
            if group < self.groups:
                current[group] = (value, Lease.decode(value))
        held: dict[int, int] = {}
        expires = now + self.lease_ms
        for group, (raw, lease) in sorted(current.items()):
            if lease.owner == self.worker_id and lease.expires_ms > now:
                if len(held) >= target:
                    # Surplus: give it up now (expired at once) so a new worker can take it.
                    self._cas(group, raw, Lease("", lease.seq, 0))
                elif self._cas(group, raw, Lease(self.worker_id, lease.seq, expires)):
                    held[group] = lease.seq
        free = [
            g
            for g in range(self.groups)
            if g not in current or current[g][1].expires_ms <= now or not current[g][1].owner
        ]
        random.shuffle(free)
        for group in free:
            if len(held) >= target:
                break
            found: bytes | None = current[group][0] if group in current else None
            seq = current[group][1].seq if group in current else 0
            if self._cas(group, found, Lease(self.worker_id, seq + 1, expires)):
                held[group] = seq + 1
        deadline = now + self.lease_ms * 3 // 4
        with self._lock:
            self._owned = {g: (seq, deadline) for g, seq in held.items()}
        return held

    def owned(self) -> dict[int, int]:
        """Groups held now (by this worker's view, which lapses before the lease)."""
        now = self._now_ms()
        with self._lock:
            return {g: seq for g, (seq, deadline) in self._owned.items() if deadline > now}

    def hash_ranges(self) -> list[tuple[int, int]]:
        """The row-hash ranges of the groups held now, for the scanners' store-side filter
        (empty: nothing to scan)."""
        return merged_hash_ranges(self.owned(), self.groups)

    def claim(self, row: bytes) -> tuple[int, int] | None:
        """``(group, seq)`` if this worker holds ``row``'s group now, else None."""
        group = group_of(row, self.groups)
        seq = self.owned().get(group)
        return None if seq is None else (group, seq)

    def fences_hold(self, claims: Collection[tuple[int, int]]) -> bool:
        """Whether the stored lease of every ``(group, seq)`` of ``claims`` still names this
        worker at that ``seq`` and has not expired: one read of the meta table for all of
        them, so a batch of runs checks its groups together."""
        rows = sorted({self._row(group) for group, _ in claims})
        found = self._client.store.read_rows(META_TABLE, rows, columns=[(META_FAMILY, _LEASE)])
        now = self._now_ms()
        for group, seq in claims:
            versions = found.get(self._row(group), {}).get((META_FAMILY, _LEASE))
            if not versions:
                return False
            lease = Lease.decode(versions[0][1])
            if lease.owner != self.worker_id or lease.seq != seq or lease.expires_ms <= now:
                return False
        return True

    def release_all(self) -> None:
        """Give every held group up at once, and withdraw the heartbeat, so that the other
        workers count one worker fewer and take the groups at their next rebalance
        (graceful shutdown)."""
        with self._lock:
            owned, self._owned = dict(self._owned), {}
        if self._heartbeat_version:
            withdrawn = Delete(self._member_row, META_FAMILY, _HEARTBEAT, self._heartbeat_version)
            self._client.store.delete_versions(META_TABLE, [withdrawn])
        for group, (seq, _) in owned.items():
            row = self._row(group)
            cells = self._client.store.read_row(META_TABLE, row, columns=[(META_FAMILY, _LEASE)])
            versions = cells.get((META_FAMILY, _LEASE))
            if versions and Lease.decode(versions[0][1]).owner == self.worker_id:
                self._cas(group, versions[0][1], Lease("", seq, 0))

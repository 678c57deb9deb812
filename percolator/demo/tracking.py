"""Following the demo's live changes through the example pipeline, and quiescence.

Latency of one change
---------------------
A change of document X is one transaction, committed at ``C``.  The example pipeline
(observers/pipeline.py) reacts with these observer runs:

* ``doc-clusters`` on ``documents/X/body``: X leaves the cluster of its old body and joins
  the cluster of its new one (clusters are named by the fingerprint of a body); it rewrites
  a cluster's ``canonical`` when that changes;
* ``doc-index`` on ``doc_clusters/F/canonical``, for each cluster F whose canonical the
  ``doc-clusters`` run above wrote;
* ``doc-inlinks`` on ``documents/X/links``.

The change's derived data is up to date once all of them have committed.  Its latency is the
commit timestamp of the last of them minus ``C``.  Both come from the oracle, whose hybrid
timestamps carry wall-clock milliseconds, so the figure is exact to the millisecond and does
not depend on how often anyone looks.

Where the facts come from:

* the worker's ``on_commit`` hook reports every committed run with the commit it covered
  (``observed_commit_ts``) and its own ``commit_ts``.  A run *covers* the change when it ran
  on the change's cell and covered a commit ``>= C``; the first such run counts (a run that
  folds several commits into one, as Percolator does, covers all of them);
* whether the ``doc-clusters`` run, committed at ``C1``, wrote a cluster's canonical is read
  from the store: in a snapshot at ``read_ts = C1`` the canonical's visible commit is
  ``C1`` exactly when that run wrote it (a set or a delete).

A run the hook never reports (its commit was undetermined, so a later run only found the
acknowledgement) leaves its change unmeasured: :meth:`ChangeTracker.finish` reports it as
such once the pipeline is quiet, instead of waiting forever.

Quiescence
----------
:func:`is_quiet` looks for notifications column by column, upstream first.  A run writes
the notifications it causes downstream before its commit point and deletes its own after
it, so when a scan finds an upstream column clean, the downstream notifications of every run
that cleaned it are already there for the next scan to find.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from observers.parking import pending
from observers.pipeline import CanonicalIndex, DuplicateClusters, InboundLinks
from observers.reference import CLUSTERS, DOCUMENTS
from percolator.timestamps import physical_ms

if TYPE_CHECKING:
    from observers.runner import Notification, RunResult
    from percolator.client import Client

#: The pipeline's observed columns, upstream first: ``doc-clusters`` (documents/body) writes
#: the notifications of ``doc-index`` (doc_clusters/canonical).
OBSERVED: tuple[tuple[str, str], ...] = (
    (DOCUMENTS, "body"),
    (DOCUMENTS, "links"),
    (CLUSTERS, "canonical"),
)

CLUSTERS_STAGE = DuplicateClusters.name
INDEX_STAGE = CanonicalIndex.name
INLINKS_STAGE = InboundLinks.name
STAGES = (CLUSTERS_STAGE, INDEX_STAGE, INLINKS_STAGE)

Cell = tuple[str, bytes, str]


def pending_count(client: Client) -> int:
    """Notifications waiting on the pipeline's observed columns (one scan of the notify
    family per column: cost in proportion to the notifications, not to the tables)."""
    return sum(len(pending(client, table, [column])) for table, column in OBSERVED)


def is_quiet(client: Client) -> bool:
    """True when no notification is left (see the module docstring for why the order of
    the scans makes this sound while runs are in flight)."""
    return all(not pending(client, table, [column], limit=1) for table, column in OBSERVED)


@dataclass(frozen=True)
class ChangeLatency:
    """How long one change took to reach every derived table.

    ``stages_ms``: per observer, its run's commit minus the change's commit (``doc-index``:
    the last of its runs); observers that had nothing to do for the change are absent.
    ``measured`` is False when a run was not seen (see the module docstring)."""

    url: str
    kind: str
    commit_ts: int
    stages_ms: dict[str, float]
    measured: bool = True

    @property
    def total_ms(self) -> float | None:
        if not self.measured:
            return None
        return max(self.stages_ms.values(), default=0.0)


@dataclass
class _Open:
    url: str
    kind: str
    commit_ts: int
    fingerprints: tuple[bytes, ...]
    clusters_commit: int | None = None
    inlinks_commit: int | None = None
    #: cluster -> commit of the doc-index run covering it (None: not yet); None: not known
    #: yet which clusters need one
    index_commits: dict[bytes, int | None] | None = None
    done: bool = field(default=False)


class ChangeTracker:
    """Measures :class:`ChangeLatency` of the changes it is told about.

    :meth:`on_commit` is the worker's hook (thread-safe, cheap, never raises); everything
    else is called from one thread: :meth:`expect` after a change committed, :meth:`poll`
    to collect the changes whose derived data has landed since the last call."""

    def __init__(self, client: Client) -> None:
        self._client = client
        self._lock = threading.Lock()
        self._runs = 0
        self._watching = False
        self._events: list[tuple[Cell, int, int]] = []
        self._covers: dict[Cell, list[tuple[int, int]]] = {}
        self._open: list[_Open] = []

    # ---------------------------------------------------------------- worker side

    def on_commit(self, observer: str, notification: Notification, result: RunResult) -> None:
        """The worker's ``on_commit`` hook: counts the run, and records it when watching."""
        with self._lock:
            self._runs += 1
            if (
                self._watching
                and result.observed_commit_ts is not None
                and result.commit_ts is not None
            ):
                self._events.append(
                    (notification.cell, result.observed_commit_ts, result.commit_ts)
                )

    @property
    def runs(self) -> int:
        """Observer runs committed so far (all of them, watched or not)."""
        with self._lock:
            return self._runs

    # ---------------------------------------------------------------- demo side

    def watch(self) -> None:
        """Start recording runs (before the first change is written: its runs may commit
        before :meth:`expect` is called for it)."""
        with self._lock:
            self._watching = True

    def expect(self, url: str, kind: str, commit_ts: int, fingerprints: Iterable[bytes]) -> None:
        """Follow the change of ``url`` committed at ``commit_ts``; ``fingerprints``: the
        clusters it may touch (those of its old and new body)."""
        self._open.append(_Open(url, kind, commit_ts, tuple(sorted(set(fingerprints)))))

    @property
    def outstanding(self) -> int:
        return len(self._open)

    def poll(self) -> list[ChangeLatency]:
        """The changes whose derived data landed since the last call, in expectation order.
        May read the store (one snapshot per change, once its ``doc-clusters`` run is in)."""
        with self._lock:
            events, self._events = self._events, []
        for cell, observed, commit in events:
            self._covers.setdefault(cell, []).append((observed, commit))
        landed = [change for change in self._open if self._advance(change)]
        self._open = [change for change in self._open if not change.done]
        return [self._latency(change) for change in landed]

    def finish(self) -> list[ChangeLatency]:
        """Give up on the changes still open (call once the pipeline is quiet): they are
        returned unmeasured."""
        left = [
            ChangeLatency(c.url, c.kind, c.commit_ts, self._stages(c), measured=False)
            for c in self._open
        ]
        self._open = []
        return left

    # ---------------------------------------------------------------- matching

    def _first_cover(self, cell: Cell, since: int) -> int | None:
        """The earliest commit of a run on ``cell`` that covered a commit ``>= since``."""
        commits = [commit for observed, commit in self._covers.get(cell, ()) if observed >= since]
        return min(commits) if commits else None

    def _canonicals_written(self, fingerprints: tuple[bytes, ...], commit_ts: int) -> list[bytes]:
        """The clusters whose canonical the transaction committed at ``commit_ts`` wrote."""
        written = []
        with self._client.snapshot(commit_ts) as snapshot:
            for fp in fingerprints:
                _, visible = snapshot.get_with_commit_ts(CLUSTERS, fp, "canonical")
                if visible == commit_ts:
                    written.append(fp)
        return written

    def _advance(self, change: _Open) -> bool:
        row = change.url.encode("utf-8")
        if change.clusters_commit is None:
            change.clusters_commit = self._first_cover((DOCUMENTS, row, "body"), change.commit_ts)
        if change.inlinks_commit is None:
            change.inlinks_commit = self._first_cover((DOCUMENTS, row, "links"), change.commit_ts)
        if change.clusters_commit is not None and change.index_commits is None:
            written = self._canonicals_written(change.fingerprints, change.clusters_commit)
            change.index_commits = dict.fromkeys(written)
        if change.index_commits is not None and change.clusters_commit is not None:
            for fp, commit in change.index_commits.items():
                if commit is None:
                    change.index_commits[fp] = self._first_cover(
                        (CLUSTERS, fp, "canonical"), change.clusters_commit
                    )
        change.done = (
            change.clusters_commit is not None
            and change.inlinks_commit is not None
            and change.index_commits is not None
            and all(commit is not None for commit in change.index_commits.values())
        )
        return change.done

    def _stages(self, change: _Open) -> dict[str, float]:
        def after(commit: int) -> float:
            return float(physical_ms(commit) - physical_ms(change.commit_ts))

        stages: dict[str, float] = {}
        if change.clusters_commit is not None:
            stages[CLUSTERS_STAGE] = after(change.clusters_commit)
        index = [c for c in (change.index_commits or {}).values() if c is not None]
        if index:
            stages[INDEX_STAGE] = after(max(index))
        if change.inlinks_commit is not None:
            stages[INLINKS_STAGE] = after(change.inlinks_commit)
        return stages

    def _latency(self, change: _Open) -> ChangeLatency:
        return ChangeLatency(change.url, change.kind, change.commit_ts, self._stages(change))

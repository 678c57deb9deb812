"""Record transaction histories and check them for isolation anomalies (list-append, Elle-style).

The workload
------------
Clients run random transactions over a few hot keys.  The value of a key is a list of unique
integers.  A transaction either **reads** a key (it records the whole list it saw) or
**appends** to it: it reads the list and writes it back with one new element, recorded as a
:class:`Read` followed by an :class:`Append`.  Every element is appended by exactly one
transaction attempt, so a list seen anywhere names, element by element, the transactions whose
writes it contains.  Every attempt is recorded with its outcome: ``committed``, ``aborted``
(the engine said nothing was committed) or ``undetermined`` (the outcome is unknown), and with
its ``start_ts`` and ``commit_ts`` when known.  :func:`run_list_append` runs this workload on a
:class:`~percolator.Client`; :func:`check` needs nothing but the records, so any history in
this format can be checked (``python -m percolator.testing.history check FILE.jsonl``).

The check (offline, deterministic)
----------------------------------
1. **Per transaction**: its *external read* of each key is the list it observed minus its own
   appends (which must be at the end); a read that disagrees with the transaction's own
   earlier operations (a non-repeatable read, own appends missing) is ``internal``.
2. **Committed set**: committed transactions, plus undetermined ones whose appends are visible
   in a read of the committed set (repeated until nothing changes).  Aborted transactions and
   unobserved undetermined ones are left out.  Only reads of the committed set count.
3. **Version order** of each key: the longest list the committed set observed, counting as
   observed the list a transaction wrote back (what it read of the key plus its appends; the
   workload writes exactly that).  Every other observed list must be a prefix of it, else
   ``incompatible-order``.
4. **Observed lists**: an element seen twice is a ``duplicate-element`` (an append applied
   twice); an element nobody appended is a ``garbage-read``; an element of an aborted
   transaction is an ``aborted-read`` (G1a); seeing some but not the last of a transaction's
   appends to one key is an ``intermediate-read`` (G1b).  Together with G1c below these are
   the dirty reads.
5. **Lost updates**: two committed transactions that read the same list of a key and both
   appended to it (SI's first-committer-wins forbids both committing), or a committed append
   missing from its key's version order although an append committed later (by ``commit_ts``)
   is in it.  **Fractured reads** (read atomicity): a transaction sees a write of transaction
   W on one key but not W's append on another key it also read.
6. **Timestamps** (when recorded): along a version order the writers' ``commit_ts`` increase
   (``commit-order``); two committed writers of one key never overlap, i.e. the later one
   started after the earlier one committed (``concurrent-write``); every committed reader of a
   version started at or after its writer's commit and before the next writer's commit
   (``future-read`` / ``stale-read``: the snapshot-read rule of snapshot isolation).
7. **Dependency graph** over the committed set (Adya): ``ww`` from each writer to the next
   writer of a key in its version order, ``wr`` from the writer of the last element a
   transaction read to the reader, ``rw`` from a reader to the writer of the version right
   after the one it read.  Cycles: ``G0`` (ww only), ``G1c`` (ww and wr, at least one wr),
   ``G-single`` (exactly one rw: read skew), ``G-nonadjacent`` (two or more rw, no two of them
   consecutive; ``long-fork`` when it is two readers seeing two writers in opposite orders).
   All of these are forbidden under snapshot isolation.  A cycle whose rw edges include two
   consecutive ones (``G2``, e.g. write skew) is **allowed** under snapshot isolation and is
   reported in :attr:`CheckResult.allowed`, not as an anomaly.

Why closed walks are enough: in a snapshot-isolation history every closed walk of the graph
has two consecutive rw edges.  (Take the walk's transaction X with the earliest commit; the
edge into X is not ww or wr, which would need an earlier commit, so it is ``U -rw-> X``: U
started before X committed.  The edge into U is not wr or ww either: both would need its
source to commit before U started (for ww by first-committer-wins), so before X.  So it is rw
too.)  The search therefore looks for closed walks without consecutive rw edges, by
reachability in a graph of (transaction, "last edge was rw") states; a walk it reports may
pass a transaction twice, and is still a proof of a violation.  For every edge that closes a
cycle of some kind, one shortest cycle through it is reported; the counts are of distinct
cycles, and each kind stops after ``max_cycles`` cycles (flagged in ``truncated``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
import threading
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from percolator.errors import InvalidArgumentError, PercolatorError

if TYPE_CHECKING:
    from percolator.client import Client
    from percolator.transaction import Transaction

COMMITTED = "committed"
ABORTED = "aborted"
UNDETERMINED = "undetermined"
OUTCOMES = (COMMITTED, ABORTED, UNDETERMINED)

# Anomaly kinds, all forbidden under snapshot isolation.
INTERNAL = "internal"
INCOMPATIBLE_ORDER = "incompatible-order"
DUPLICATE_ELEMENT = "duplicate-element"
GARBAGE_READ = "garbage-read"
ABORTED_READ = "aborted-read"  # G1a
INTERMEDIATE_READ = "intermediate-read"  # G1b
LOST_UPDATE = "lost-update"
FRACTURED_READ = "fractured-read"
COMMIT_ORDER = "commit-order"
CONCURRENT_WRITE = "concurrent-write"
FUTURE_READ = "future-read"
STALE_READ = "stale-read"
G0 = "G0"
G1C = "G1c"
G_SINGLE = "G-single"
G_NONADJACENT = "G-nonadjacent"
LONG_FORK = "long-fork"
# Allowed under snapshot isolation (reported, never an anomaly).
G2 = "G2"

_WW, _WR, _RW = 1, 2, 4
_EDGE_NAMES = {_WW: "ww", _WR: "wr", _RW: "rw"}


# ------------------------------------------------------------------------------ records


@dataclass(frozen=True)
class Read:
    """A read of ``key`` that observed the list ``values``."""

    key: str
    values: tuple[int, ...]


@dataclass(frozen=True)
class Append:
    """An append of ``element`` (unique in the whole history for its key) to ``key``."""

    key: str
    element: int


Op = Read | Append


@dataclass(frozen=True)
class Txn:
    """One transaction attempt.  ``id`` is unique in the history; ``outcome`` is one of
    :data:`OUTCOMES`; ``start_ts``/``commit_ts`` are ``None`` when unknown (a read-only
    transaction has no ``commit_ts``).  ``process`` names who ran it, for reports."""

    id: int
    ops: tuple[Op, ...]
    outcome: str
    start_ts: int | None = None
    commit_ts: int | None = None
    process: str = ""

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise InvalidArgumentError(
                f"transaction {self.id}: outcome must be one of {OUTCOMES}, got {self.outcome!r}"
            )

    def to_json(self) -> dict[str, Any]:
        ops: list[list[Any]] = []
        for op in self.ops:
            if isinstance(op, Read):
                ops.append(["r", op.key, list(op.values)])
            else:
                ops.append(["append", op.key, op.element])
        return {
            "id": self.id,
            "outcome": self.outcome,
            "start_ts": self.start_ts,
            "commit_ts": self.commit_ts,
            "process": self.process,
            "ops": ops,
        }

    @staticmethod
    def from_json(obj: dict[str, Any]) -> Txn:
        try:
            ops: list[Op] = []
            for kind, key, value in obj["ops"]:
                if kind == "r":
                    ops.append(Read(str(key), tuple(int(v) for v in value)))
                elif kind == "append":
                    ops.append(Append(str(key), int(value)))
                else:
                    raise InvalidArgumentError(f"unknown operation kind {kind!r}")
            return Txn(
                id=int(obj["id"]),
                ops=tuple(ops),
                outcome=str(obj["outcome"]),
                start_ts=obj.get("start_ts"),
                commit_ts=obj.get("commit_ts"),
                process=str(obj.get("process", "")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidArgumentError(f"malformed transaction record {obj!r}: {exc}") from None


def dump_jsonl(txns: Iterable[Txn], path: str | Path) -> None:
    """Write a history as JSON lines (one transaction per line)."""
    with open(path, "w", encoding="utf-8") as out:
        for txn in txns:
            out.write(json.dumps(txn.to_json(), separators=(",", ":")) + "\n")


def load_jsonl(path: str | Path) -> list[Txn]:
    """Read a history written by :func:`dump_jsonl` (blank lines are skipped)."""
    with open(path, encoding="utf-8") as src:
        return [Txn.from_json(json.loads(line)) for line in src if line.strip()]


# ------------------------------------------------------------------------------ result


@dataclass(frozen=True)
class Anomaly:
    """One instance of an anomaly: its kind, the transactions involved and what happened."""

    kind: str
    txns: tuple[int, ...]
    detail: str
    key: str | None = None


@dataclass
class CheckResult:
    """What :func:`check` found.  ``anomalies`` holds up to ``max_examples`` examples per
    kind, ``counts`` the number of instances of each kind (exact, except cycle kinds flagged in
    ``truncated``).  ``allowed`` and ``allowed_counts`` are the same for phenomena snapshot
    isolation allows (G2 cycles such as write skew).  ``stats`` describes the history."""

    anomalies: list[Anomaly] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    allowed: list[Anomaly] = field(default_factory=list)
    allowed_counts: dict[str, int] = field(default_factory=dict)
    truncated: set[str] = field(default_factory=set)
    stats: dict[str, int] = field(default_factory=dict)

    @property
    def valid(self) -> bool:
        """True when no anomaly forbidden under snapshot isolation was found."""
        return not self.counts

    def of_kind(self, kind: str) -> list[Anomaly]:
        return [a for a in self.anomalies + self.allowed if a.kind == kind]

    def summary(self) -> str:
        s = self.stats
        lines = [
            f"{s.get('txns', 0)} transactions ({s.get('committed', 0)} committed, "
            f"{s.get('aborted', 0)} aborted, {s.get('undetermined', 0)} undetermined of which "
            f"{s.get('inferred_committed', 0)} inferred committed); {s.get('keys', 0)} keys, "
            f"{s.get('ww', 0)} ww / {s.get('wr', 0)} wr / {s.get('rw', 0)} rw edges",
            "anomalies: "
            + (", ".join(f"{k}={v}" for k, v in sorted(self.counts.items())) or "none"),
            "allowed under SI: "
            + (", ".join(f"{k}={v}" for k, v in sorted(self.allowed_counts.items())) or "none"),
        ]
        lines += [f"  {a.kind}: txns {list(a.txns)}: {a.detail}" for a in self.anomalies]
        return "\n".join(lines)


class _Report:
    def __init__(self, result: CheckResult, max_examples: int) -> None:
        self.result = result
        self.max_examples = max_examples

    def add(self, kind: str, txns: Iterable[int], detail: str, key: str | None = None) -> None:
        counts, examples = self.result.counts, self.result.anomalies
        if kind == G2:
            counts, examples = self.result.allowed_counts, self.result.allowed
        counts[kind] = counts.get(kind, 0) + 1
        if counts[kind] <= self.max_examples:
            examples.append(Anomaly(kind, tuple(txns), detail, key))


# ------------------------------------------------------------------------------ check


@dataclass
class _View:
    """What one transaction observed and wrote, derived from its operations."""

    txn: Txn
    ext: dict[str, tuple[int, ...]]  # external read of each key (own appends removed)
    appends: dict[str, list[int]]  # own appends per key, in order


def _derive(txn: Txn, report: _Report | None) -> _View:
    ext: dict[str, tuple[int, ...]] = {}
    appends: dict[str, list[int]] = defaultdict(list)
    for op in txn.ops:
        if isinstance(op, Append):
            appends[op.key].append(op.element)
            continue
        mine = appends.get(op.key, [])
        values = op.values
        if mine:
            if len(values) < len(mine) or list(values[-len(mine) :]) != mine:
                if report is not None:
                    report.add(
                        INTERNAL,
                        [txn.id],
                        f"read {_short(values)} of {op.key!r} lacks its own appends {mine} "
                        "at the end",
                        op.key,
                    )
                continue
            values = values[: -len(mine)]
        if op.key in ext and ext[op.key] != values:
            if report is not None:
                report.add(
                    INTERNAL,
                    [txn.id],
                    f"read {op.key!r} twice with different results: "
                    f"{_short(ext[op.key])} then {_short(values)} (own appends removed)",
                    op.key,
                )
            continue
        ext.setdefault(op.key, values)
    return _View(txn, ext, dict(appends))


def _is_prefix(a: Sequence[int], b: Sequence[int]) -> bool:
    return len(a) <= len(b) and tuple(b[: len(a)]) == tuple(a)


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    return n


def _short(values: Sequence[int], tail: int = 5) -> str:
    """A list for a message: long ones show only their last elements."""
    if len(values) <= tail + 1:
        return str(list(values))
    return f"[...{len(values) - tail} more, {', '.join(str(v) for v in values[-tail:])}]"


def check(txns: Iterable[Txn], *, max_examples: int = 20, max_cycles: int = 500) -> CheckResult:
    """Check a list-append history for anomalies forbidden under snapshot isolation.

    See the module docstring for the algorithm.  Raises :class:`InvalidArgumentError` for a
    malformed history (a duplicate transaction id, an element appended twice to one key)."""
    history = list(txns)
    result = CheckResult()
    report = _Report(result, max_examples)
    by_id: dict[int, Txn] = {}
    for txn in history:
        if txn.id in by_id:
            raise InvalidArgumentError(f"transaction id {txn.id} appears twice in the history")
        by_id[txn.id] = txn

    # Step 1 (internal reads are only anomalies of transactions found committed, below).
    views = {t.id: _derive(t, None) for t in history}
    writer: dict[tuple[str, int], int] = {}
    for view in views.values():
        for key, elements in view.appends.items():
            for element in elements:
                other = writer.setdefault((key, element), view.txn.id)
                if other != view.txn.id:
                    raise InvalidArgumentError(
                        f"element {element} was appended to {key!r} by transactions {other} "
                        f"and {view.txn.id}: elements must be unique per key"
                    )

    # Step 2: the committed set, growing with undetermined transactions seen by it.
    committed = {t.id for t in history if t.outcome == COMMITTED}
    undetermined = [t.id for t in history if t.outcome == UNDETERMINED]
    while True:
        seen = {(k, e) for i in committed for k, vs in views[i].ext.items() for e in vs}
        found = {
            i
            for i in undetermined
            if i not in committed
            and any((k, e) in seen for k, es in views[i].appends.items() for e in es)
        }
        if not found:
            break
        committed |= found
    for i in sorted(committed):
        _derive(by_id[i], report)  # report internal inconsistencies of committed ones

    keys = sorted(
        {k for i in committed for k in views[i].ext}
        | {k for v in views.values() for k in v.appends}
    )
    result.stats = {
        "txns": len(history),
        "committed": sum(t.outcome == COMMITTED for t in history),
        "aborted": sum(t.outcome == ABORTED for t in history),
        "undetermined": len(undetermined),
        "inferred_committed": len(committed) - sum(t.outcome == COMMITTED for t in history),
        "keys": len(keys),
        "reads": sum(len(views[i].ext) for i in committed),
        "appends": len(writer),
    }

    # Step 3: version orders, from what committed transactions read and what those that
    # read a key before appending to it wrote back (their read plus their appends).
    orders: dict[str, tuple[int, ...]] = {}
    for key in keys:
        # (values, 0 = read / 1 = written back, -start_ts, txn): among lists of equal length
        # (only possible in a broken history) reads and later snapshots win, for a
        # deterministic choice.
        observations = []
        for i in committed:
            view = views[i]
            if key not in view.ext:
                continue
            start = -(view.txn.start_ts or 0)
            observations.append((view.ext[key], 0, start, i))
            if key in view.appends:
                observations.append(((*view.ext[key], *view.appends[key]), 1, start, i))
        if not observations:
            orders[key] = ()
            continue
        observations.sort(key=lambda o: (-len(o[0]), o[1], o[2], o[3]))
        longest, _, _, longest_by = observations[0]
        orders[key] = longest
        reported: set[tuple[int, ...]] = set()
        for values, wrote, _, i in observations[1:]:
            if not _is_prefix(values, longest) and values not in reported:
                reported.add(values)
                report.add(
                    INCOMPATIBLE_ORDER,
                    [i, longest_by],
                    f"{key!r}: transaction {i} {'wrote' if wrote else 'read'} {_short(values)}, "
                    f"which is not a prefix of {_short(longest)} (transaction {longest_by}); "
                    f"they part at position {_common_prefix(values, longest)}",
                    key,
                )
    position = {key: {e: n for n, e in reversed(list(enumerate(o)))} for key, o in orders.items()}

    _check_observed(views, committed, writer, report)
    _check_lost_updates(views, committed, writer, orders, position, report)
    _check_fractured(views, committed, writer, report)
    _check_timestamps(views, committed, writer, orders, report)
    graph = _build_graph(views, committed, writer, orders, result.stats)
    _check_cycles(graph, committed, report, max_cycles)
    return result


def _check_observed(
    views: dict[int, _View],
    committed: set[int],
    writer: dict[tuple[str, int], int],
    report: _Report,
) -> None:
    for reader in sorted(committed):
        for key, values in views[reader].ext.items():
            if len(set(values)) != len(values):
                twice = sorted({e for e in values if values.count(e) > 1})
                report.add(
                    DUPLICATE_ELEMENT,
                    [reader, *(writer[(key, e)] for e in twice if (key, e) in writer)],
                    f"{key!r}: read {_short(values)} holds {twice} more than once",
                    key,
                )
            present = set(values)
            writers_seen: set[int] = set()
            for element in values:
                w = writer.get((key, element))
                if w is None:
                    report.add(
                        GARBAGE_READ,
                        [reader],
                        f"{key!r}: read element {element} that no transaction appended",
                        key,
                    )
                elif w != reader:
                    writers_seen.add(w)
            for w in sorted(writers_seen):
                if w not in committed and views[w].txn.outcome == ABORTED:
                    report.add(
                        ABORTED_READ,
                        [reader, w],
                        f"{key!r}: read {views[w].appends[key]} appended by aborted "
                        f"transaction {w}",
                        key,
                    )
                last = views[w].appends[key][-1]
                if last not in present:
                    report.add(
                        INTERMEDIATE_READ,
                        [reader, w],
                        f"{key!r}: read some of transaction {w}'s appends "
                        f"{views[w].appends[key]} but not its last one",
                        key,
                    )


def _check_lost_updates(
    views: dict[int, _View],
    committed: set[int],
    writer: dict[tuple[str, int], int],
    orders: dict[str, tuple[int, ...]],
    position: dict[str, dict[int, int]],
    report: _Report,
) -> None:
    # Two committed appenders that read the same list of a key.
    groups: dict[tuple[str, tuple[int, ...]], list[int]] = defaultdict(list)
    for i in sorted(committed):
        view = views[i]
        for key in view.appends:
            if key in view.ext:
                groups[(key, view.ext[key])].append(i)
    for (key, values), members in sorted(groups.items()):
        if len(members) > 1:
            report.add(
                LOST_UPDATE,
                members,
                f"{key!r}: committed transactions {members} all read {_short(values)} and "
                "appended to it",
                key,
            )
    # A committed append missing from the version order although a later commit is in it.
    for key, order in orders.items():
        latest: tuple[int, int] | None = None  # (commit_ts, txn) of the latest writer in order
        for element in order:
            w = writer.get((key, element))
            c = views[w].txn.commit_ts if w is not None else None
            if (
                w is not None
                and w in committed
                and c is not None
                and (latest is None or c > latest[0])
            ):
                latest = (c, w)
        if latest is None:
            continue
        for i in sorted(committed):
            elements = views[i].appends.get(key)
            c = views[i].txn.commit_ts
            if not elements or c is None or elements[-1] in position[key]:
                continue
            if c < latest[0]:
                report.add(
                    LOST_UPDATE,
                    [i, latest[1]],
                    f"{key!r}: the append of {elements[-1]} (committed at {c}) is missing "
                    f"from the version order, which holds a write committed later at "
                    f"{latest[0]}",
                    key,
                )


def _check_fractured(
    views: dict[int, _View],
    committed: set[int],
    writer: dict[tuple[str, int], int],
    report: _Report,
) -> None:
    multi = {i for i in committed if len(views[i].appends) > 1}
    if not multi:
        return
    for reader in sorted(committed):
        ext = views[reader].ext
        present = {k: set(vs) for k, vs in ext.items()}
        flagged: set[int] = set()
        for key, values in ext.items():
            for element in values:
                w = writer.get((key, element))
                if w is None or w == reader or w not in multi or w in flagged:
                    continue
                for other, elements in views[w].appends.items():
                    if other != key and other in ext and elements[-1] not in present[other]:
                        flagged.add(w)
                        report.add(
                            FRACTURED_READ,
                            [reader, w],
                            f"saw transaction {w}'s append {element} to {key!r} but not its "
                            f"append {elements[-1]} to {other!r} (read {_short(ext[other])})",
                            other,
                        )
                        break


def _check_timestamps(
    views: dict[int, _View],
    committed: set[int],
    writer: dict[tuple[str, int], int],
    orders: dict[str, tuple[int, ...]],
    report: _Report,
) -> None:
    def commit_ts(i: int | None) -> int | None:
        return views[i].txn.commit_ts if i is not None and i in committed else None

    for key, order in orders.items():
        # Writers along the version order commit in increasing order.
        prev: tuple[int, int] | None = None
        for element in order:
            w = writer.get((key, element))
            c = commit_ts(w)
            if w is None or c is None or (prev is not None and prev[1] == w):
                continue
            if prev is not None and c <= prev[0]:
                report.add(
                    COMMIT_ORDER,
                    [prev[1], w],
                    f"{key!r}: version order puts transaction {w} (commit_ts {c}) after "
                    f"transaction {prev[1]} (commit_ts {prev[0]})",
                    key,
                )
            prev = (c, w)
        # Suffix minimum of commit_ts along the order: the earliest later version.
        suffix: list[tuple[int, int] | None] = [None] * (len(order) + 1)
        for n in range(len(order) - 1, -1, -1):
            w = writer.get((key, order[n]))
            c = commit_ts(w)
            best = suffix[n + 1]
            if w is not None and c is not None and (best is None or c < best[0]):
                best = (c, w)
            suffix[n] = best
        for reader in sorted(committed):
            view = views[reader]
            s = view.txn.start_ts
            values = view.ext.get(key)
            if s is None or values is None or not _is_prefix(values, order):
                continue
            if values:
                w = writer.get((key, values[-1]))
                c = commit_ts(w)
                if w is not None and w != reader and c is not None and c > s:
                    report.add(
                        FUTURE_READ,
                        [reader, w],
                        f"{key!r}: started at {s} but read the version committed at {c}",
                        key,
                    )
            n = len(values)
            while n < len(order) and writer.get((key, order[n])) == reader:
                n += 1
            later = suffix[n]
            if later is not None and later[0] <= s:
                report.add(
                    STALE_READ,
                    [reader, later[1]],
                    f"{key!r}: started at {s} but missed the version committed at "
                    f"{later[0]} (read {_short(values)})",
                    key,
                )
    # First-committer-wins: committed writers of one key never overlap.
    writers_of: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
    for i in committed:
        t = views[i].txn
        if t.start_ts is None or t.commit_ts is None:
            continue
        for key in views[i].appends:
            writers_of[key].append((t.commit_ts, t.start_ts, i))
    for key, ws in sorted(writers_of.items()):
        ws.sort()
        for (c_a, _, a), (_, s_b, b) in itertools.pairwise(ws):
            if s_b < c_a:
                report.add(
                    CONCURRENT_WRITE,
                    [a, b],
                    f"{key!r}: both committed although {b} started at {s_b}, before {a} "
                    f"committed at {c_a}",
                    key,
                )


# ------------------------------------------------------------------------------ graph


@dataclass
class _Graph:
    edges: dict[int, dict[int, int]] = field(default_factory=lambda: defaultdict(dict))
    labels: dict[tuple[int, int, int], str] = field(default_factory=dict)

    def add(self, a: int, b: int, kind: int, key: str) -> None:
        if a == b:
            return
        self.edges[a][b] = self.edges[a].get(b, 0) | kind
        self.labels.setdefault((a, b, kind), key)

    def succ(self, node: int, mask: int) -> Iterator[int]:
        for b, kinds in self.edges.get(node, {}).items():
            if kinds & mask:
                yield b

    def describe(self, a: int, b: int, kind: int) -> str:
        return f"-{_EDGE_NAMES[kind]}({self.labels[(a, b, kind)]})->"


def _build_graph(
    views: dict[int, _View],
    committed: set[int],
    writer: dict[tuple[str, int], int],
    orders: dict[str, tuple[int, ...]],
    stats: dict[str, int],
) -> _Graph:
    graph = _Graph()
    for key, order in orders.items():
        writers = [writer.get((key, e)) for e in order]
        prev: int | None = None
        for w in writers:
            if w is None or w not in committed:
                continue
            if prev is not None:
                graph.add(prev, w, _WW, key)
            prev = w
        for reader in committed:
            values = views[reader].ext.get(key)
            if values is None or not _is_prefix(values, order):
                continue
            n = len(values)
            if n:
                w = writers[n - 1]
                if w is not None and w in committed:
                    graph.add(w, reader, _WR, key)
            # The writer of the next version: the first committed writer after what was read.
            for w in writers[n:]:
                if w is not None and w in committed:
                    if w != reader:
                        graph.add(reader, w, _RW, key)
                    break
    for kind in (_WW, _WR, _RW):
        stats[_EDGE_NAMES[kind]] = sum(
            1 for targets in graph.edges.values() for k in targets.values() if k & kind
        )
    return graph


class _Reach:
    """Reachability in a directed graph: strongly connected components (Tarjan, iterative),
    then one bit set per component over its condensation (a DAG)."""

    def __init__(self, nodes: Iterable[int], succ: Callable[[int], Iterable[int]]) -> None:
        self.comp: dict[int, int] = {}
        index: dict[int, int] = {}
        low: dict[int, int] = {}
        stack: list[int] = []
        on_stack: set[int] = set()
        reach: list[int] = []
        counter = 0
        for root in nodes:
            if root in index:
                continue
            work: list[tuple[int, Iterator[int]]] = [(root, iter(succ(root)))]
            index[root] = low[root] = counter
            counter += 1
            stack.append(root)
            on_stack.add(root)
            while work:
                node, children = work[-1]
                advanced = False
                for child in children:
                    if child not in index:
                        index[child] = low[child] = counter
                        counter += 1
                        stack.append(child)
                        on_stack.add(child)
                        work.append((child, iter(succ(child))))
                        advanced = True
                        break
                    if child in on_stack:
                        low[node] = min(low[node], index[child])
                if advanced:
                    continue
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    # Tarjan emits components sinks first: every component reachable from
                    # this one already has its bit set.
                    c = len(reach)
                    members = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        self.comp[member] = c
                        members.append(member)
                        if member == node:
                            break
                    bits = 1 << c
                    for member in members:
                        for child in succ(member):
                            d = self.comp[child]
                            if d != c:
                                bits |= reach[d]
                    reach.append(bits)
        self._reach = reach

    def reaches(self, a: int, b: int) -> bool:
        """True if there is a path (possibly empty) from ``a`` to ``b``."""
        if a not in self.comp or b not in self.comp:
            return False
        return bool((self._reach[self.comp[a]] >> self.comp[b]) & 1)


def _shortest_path(start: int, goal: int, succ: Callable[[int], Iterable[int]]) -> list[int] | None:
    parent: dict[int, int] = {start: start}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        if node == goal:
            path = [node]
            while node != start:
                node = parent[node]
                path.append(node)
            return path[::-1]
        for child in succ(node):
            if child not in parent:
                parent[child] = node
                queue.append(child)
    return None


def _check_cycles(graph: _Graph, committed: set[int], report: _Report, max_cycles: int) -> None:
    nodes = sorted(committed)
    ww = _Reach(nodes, lambda n: graph.succ(n, _WW))
    wwr = _Reach(nodes, lambda n: graph.succ(n, _WW | _WR))
    full = _Reach(nodes, lambda n: graph.succ(n, _WW | _WR | _RW))

    # States for walks without two consecutive rw edges: 2 * node + (last edge was rw).
    def state_succ(state: int) -> Iterator[int]:
        node, after_rw = divmod(state, 2)
        for b, kinds in graph.edges.get(node, {}).items():
            if kinds & (_WW | _WR):
                yield 2 * b
            if kinds & _RW and not after_rw:
                yield 2 * b + 1

    pairs = sorted((a, b, k) for a, targets in graph.edges.items() for b, k in targets.items())
    # Only edges inside a cycle of the full graph can close any cycle at all.
    cyclic = [(a, b, k) for a, b, k in pairs if full.comp[a] == full.comp[b]]
    states = None
    if any(k & _RW for _, _, k in cyclic):
        starts = sorted({2 * n + f for a, b, _ in cyclic for n in (a, b) for f in (0, 1)})
        states = _Reach(starts, state_succ)
    seen: dict[str, set[tuple[int, ...]]] = defaultdict(set)

    def emit(kind: str, cycle: list[tuple[int, int, int]]) -> None:
        nodes_in = [a for a, _, _ in cycle]
        turn = nodes_in.index(min(nodes_in))
        canonical = tuple(nodes_in[turn:] + nodes_in[:turn])
        if canonical in seen[kind] or len(seen[kind]) >= max_cycles:
            if len(seen[kind]) >= max_cycles:
                report.result.truncated.add(kind)
            return
        seen[kind].add(canonical)
        text = f"T{cycle[0][0]} " + " ".join(f"{graph.describe(a, b, k)} T{b}" for a, b, k in cycle)
        report.add(kind, canonical, text)

    def close(a: int, b: int, first: int, mask: int) -> list[tuple[int, int, int]]:
        path = _shortest_path(b, a, lambda n: graph.succ(n, mask))
        assert path is not None
        return [(a, b, first), *_typed(graph, path, mask)]

    for a, b, kinds in cyclic:
        if kinds & _WW and ww.reaches(b, a):
            emit(G0, close(a, b, _WW, _WW))
        elif kinds & (_WW | _WR) and wwr.reaches(b, a):
            emit(G1C, close(a, b, _WR if kinds & _WR else _WW, _WW | _WR))
        elif kinds & _RW:
            if wwr.reaches(b, a):
                emit(G_SINGLE, close(a, b, _RW, _WW | _WR))
            elif states is not None and states.reaches(2 * b + 1, 2 * a):
                walk = _shortest_path(2 * b + 1, 2 * a, state_succ)
                assert walk is not None
                cycle = [(a, b, _RW)]
                for s, t in itertools.pairwise(walk):
                    cycle.append((s // 2, t // 2, _RW if t % 2 else _pick(graph, s // 2, t // 2)))
                rw = sum(k == _RW for _, _, k in cycle)
                long_fork = (
                    rw == 2 and len(cycle) == 4 and all(k in (_RW, _WR) for _, _, k in cycle)
                )
                emit(LONG_FORK if long_fork else G_NONADJACENT, cycle)
            else:
                emit(G2, close(a, b, _RW, _WW | _WR | _RW))


def _pick(graph: _Graph, a: int, b: int) -> int:
    kinds = graph.edges[a][b]
    return _WR if kinds & _WR else _WW if kinds & _WW else _RW


def _typed(graph: _Graph, path: list[int], mask: int) -> list[tuple[int, int, int]]:
    out = []
    for a, b in itertools.pairwise(path):
        kinds = graph.edges[a][b] & mask
        out.append((a, b, _WR if kinds & _WR else _WW if kinds & _WW else _RW))
    return out


# ------------------------------------------------------------------------------ workload


def encode_list(values: Sequence[int]) -> bytes:
    """The stored form of a list: comma-separated decimal integers (empty list: ``b""``)."""
    return ",".join(str(v) for v in values).encode("ascii")


def decode_list(value: bytes | None) -> tuple[int, ...]:
    """Inverse of :func:`encode_list`; an absent cell is the empty list."""
    if not value:
        return ()
    try:
        return tuple(int(part) for part in value.decode("ascii").split(","))
    except ValueError:
        raise InvalidArgumentError(f"not a list-append value: {value[:60]!r}") from None


class Recorder:
    """Thread-safe collector of transaction records.  Ids and elements are ``base + n``, so
    processes given different bases (say ``index * 10**9``) never collide."""

    def __init__(self, base: int = 0) -> None:
        self._lock = threading.Lock()
        self._next = base + 1
        self._txns: list[Txn] = []

    def new_id(self) -> int:
        with self._lock:
            value = self._next
            self._next += 1
            return value

    def add(self, txn: Txn) -> None:
        with self._lock:
            self._txns.append(txn)

    def txns(self) -> list[Txn]:
        with self._lock:
            return list(self._txns)


@dataclass
class _Attempt:
    txn: Transaction
    ops: list[Op] = field(default_factory=list)
    body_done: bool = False


def run_list_append(
    client: Client,
    recorder: Recorder,
    *,
    table: str,
    keys: Sequence[str],
    count: int,
    rng: random.Random,
    column: str = "v",
    max_ops: int = 4,
    read_fraction: float = 0.5,
    max_attempts: int = 10,
    process: str = "",
) -> dict[str, int]:
    """Run ``count`` random list-append transactions through ``client.run`` and record every
    attempt (the workload of the module docstring).

    Outcomes follow the engine's contract: an attempt that ``client.run`` retried, or that
    failed with a retryable error, or failed before its commit started, is ``aborted`` (a
    retryable error promises that nothing was committed); any other failure of the commit is
    ``undetermined``.  Errors (:class:`PercolatorError` only) are recorded, not raised; the
    result counts the errors that ended a transaction, by type name."""
    errors: dict[str, int] = {}
    for _ in range(count):
        chosen = rng.sample(list(keys), rng.randint(1, min(max_ops, len(keys))))
        plan = [(key, rng.random() >= read_fraction) for key in chosen]
        error = _run_recorded(client, recorder, plan, table, column, max_attempts, process)
        if error is not None:
            name = type(error).__name__
            errors[name] = errors.get(name, 0) + 1
    return errors


def _run_recorded(
    client: Client,
    recorder: Recorder,
    plan: list[tuple[str, bool]],
    table: str,
    column: str,
    max_attempts: int,
    process: str,
) -> PercolatorError | None:
    """Run one planned transaction (key, append?) with retries and record every attempt;
    return the error that ended it, if any."""
    attempts: list[_Attempt] = []

    def body(txn: Transaction) -> None:
        attempt = _Attempt(txn)
        attempts.append(attempt)
        for key, append in plan:
            current = decode_list(txn.get(table, key, column))
            attempt.ops.append(Read(key, current))
            if append:
                element = recorder.new_id()
                txn.set(table, key, column, encode_list((*current, element)))
                attempt.ops.append(Append(key, element))
        attempt.body_done = True

    error: PercolatorError | None = None
    try:
        client.run(body, max_attempts=max_attempts)
    except PercolatorError as exc:
        error = exc
    for n, attempt in enumerate(attempts):
        last = n == len(attempts) - 1
        commit_ts = None
        if last and error is None:
            outcome, commit_ts = COMMITTED, attempt.txn.commit_ts
        elif not last or not attempt.body_done or (error is not None and error.retryable):
            # Retried, failed before committing anything, or failed with an error whose
            # contract is "nothing was committed".
            outcome = ABORTED
        else:
            outcome = UNDETERMINED
        recorder.add(
            Txn(
                recorder.new_id(),
                tuple(attempt.ops),
                outcome,
                attempt.txn.start_ts,
                commit_ts,
                process,
            )
        )
    return error


def read_all(
    client: Client,
    recorder: Recorder,
    *,
    table: str,
    keys: Sequence[str],
    column: str = "v",
    process: str = "final",
) -> Txn:
    """Read every key in one snapshot (resolving whatever locks are left) and record it as a
    committed read-only transaction.  Run it after the workload to fix the final state."""
    with client.snapshot() as snapshot:
        ops = tuple(Read(k, decode_list(snapshot.get(table, k, column))) for k in keys)
    txn = Txn(recorder.new_id(), ops, COMMITTED, snapshot.read_ts, None, process)
    recorder.add(txn)
    return txn


def settle_undetermined(
    client: Client, txns: Iterable[Txn], *, table: str, column: str = "v"
) -> list[Txn]:
    """Replace each undetermined outcome by what the store shows, once no lock of it is left
    (run :func:`read_all` first): ``committed`` at the ``commit_ts`` of a commit of its
    ``start_ts`` found on any cell it wrote, else ``aborted``.  The check then verifies that
    the data agree (a partly visible transaction shows up as an anomaly either way)."""
    from percolator.protocol.cells import CellKey, fetch_cells
    from percolator.protocol.resolve import find_commit_in_history

    store = client.store
    out: list[Txn] = []
    for txn in txns:
        written = sorted({op.key for op in txn.ops if isinstance(op, Append)})
        if txn.outcome != UNDETERMINED or not written or txn.start_ts is None:
            out.append(txn)
            continue
        found: set[int] = set()
        for key in written:
            cell = CellKey(table, key.encode(), column)
            raw = fetch_cells(store, [cell], before=None, with_data=False)[cell]
            if raw.lock_cell.locked_by(txn.start_ts):
                raise PercolatorError(
                    f"transaction {txn.id} (start_ts {txn.start_ts}) still holds its lock on "
                    f"{cell}: read every key first (read_all) so that its fate is decided"
                )
            last = raw.lock_cell.last_commit
            if last is not None and last.start_ts == txn.start_ts:
                found.add(last.commit_ts)
            in_history = find_commit_in_history(store, cell, txn.start_ts)
            if in_history is not None:
                found.add(in_history)
        if len(found) > 1:
            raise PercolatorError(
                f"transaction {txn.id} (start_ts {txn.start_ts}) shows different commit "
                f"timestamps {sorted(found)} on its cells"
            )
        commit_ts = found.pop() if found else None
        out.append(
            Txn(
                txn.id,
                txn.ops,
                COMMITTED if commit_ts is not None else ABORTED,
                txn.start_ts,
                commit_ts,
                txn.process,
            )
        )
    return out


# ------------------------------------------------------------------------------ command line


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m percolator.testing.history check FILE...``: check JSON-lines histories together;
    exit status 0 when no anomaly was found, 1 otherwise."""
    parser = argparse.ArgumentParser(prog="python -m percolator.testing.history")
    sub = parser.add_subparsers(dest="command", required=True)
    check_parser = sub.add_parser("check", help="check list-append histories (JSON lines)")
    check_parser.add_argument("files", nargs="+", type=Path)
    args = parser.parse_args(argv)
    txns: list[Txn] = []
    for path in args.files:
        txns.extend(load_jsonl(path))
    result = check(txns)
    print(result.summary())
    return 0 if result.valid else 1


if __name__ == "__main__":
    sys.exit(main())

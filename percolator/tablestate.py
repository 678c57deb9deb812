"""A table's state record in the meta table: the fence of a bulk load.

The one home of the record's format.  :mod:`percolator.bulkload` writes it (and says what
the states mean); clients read it to refuse a table being loaded, and low watermarks read
it to hold a loaded table's observers back (:mod:`percolator.watermark`, "Bulk loads").

Row ``b"tables/" + table`` of the meta table, qualifier ``state``, JSON (format 1)::

    {"v": 1, "state": "loading" | "ready" | "dropping", "load_id": ID, "start_ts": S,
     "commit_ts": C, "lease_expires_ms": T, "created": "pending" | "yes" | "no",
     "fingerprint": F}

``fingerprint`` is absent in records written before it existed, and when the loader gave
none.  A table without this row, or whose row is ``ready`` with no load id, is an ordinary
table.  ``dropping`` (no load id; ``lease_expires_ms``: until when the dropper holds the
name) is written by ``Client.drop_table`` just before it drops the table, so that no load
can begin or take over meanwhile.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from percolator.errors import ConfigError
from percolator.layout import META_FAMILY, META_TABLE
from percolator.records import CommitInfo, Kind, LockCell
from percolator.store.base import Store

STATE_PREFIX = b"tables/"
STATE_QUALIFIER = b"state"
LOADING = "loading"
READY = "ready"
DROPPING = "dropping"


@dataclass(frozen=True)
class LoadState:
    """A table's state in the meta table (see the module docstring)."""

    state: str
    load_id: str
    start_ts: int
    commit_ts: int
    lease_expires_ms: int
    created: str = "pending"
    # What the load writes ("" unknown: a record written before fingerprints, or a loader
    # that gave none); see "Same load id, other input" in percolator/bulkload.py.
    fingerprint: str = ""

    def encode(self) -> bytes:
        doc = {"v": 1, **asdict(self)}
        if not self.fingerprint:
            # Unknown: the record keeps the earlier format byte for byte (readers of that
            # format build a LoadState of exactly its fields).
            del doc["fingerprint"]
        return json.dumps(doc, sort_keys=True).encode()

    @staticmethod
    def decode(raw: bytes) -> LoadState:
        """Raises ConfigError for a record this version cannot read (another format, or
        not a table state at all)."""
        try:
            doc = json.loads(raw)
            version = doc.get("v")
        except (ValueError, AttributeError) as exc:
            raise ConfigError(f"table state is unreadable ({exc})") from None
        if version != 1:
            raise ConfigError(f"table state has unknown format {version!r}")
        doc.pop("v")
        try:
            state = LoadState(**doc)
        except TypeError as exc:
            raise ConfigError(f"table state is unreadable ({exc})") from None
        numbers = (state.start_ts, state.commit_ts, state.lease_expires_ms)
        texts = (state.state, state.load_id, state.created, state.fingerprint)
        if not all(isinstance(n, int) and not isinstance(n, bool) for n in numbers) or not all(
            isinstance(t, str) for t in texts
        ):
            raise ConfigError(f"table state is unreadable (a field has the wrong type): {doc}")
        return state

    @property
    def loading(self) -> bool:
        return self.state == LOADING

    def committed_lock(self) -> bytes:
        """The exact bytes of every loaded cell's lock cell."""
        return LockCell(last_commit=CommitInfo(self.commit_ts, self.start_ts, Kind.PUT)).encode()


#: the state of an ordinary table, written where a state row must say "no load" (a delete
#: marker would mask later compare-and-sets of the row)
ORDINARY = LoadState(READY, "", 0, 0, 0, "no")


def state_row(table: str) -> bytes:
    return STATE_PREFIX + table.encode("utf-8")


def compare_and_set_state(
    store: Store, table: str, expected: bytes | None, new: LoadState | bytes
) -> bool:
    """Replace ``table``'s state record if it holds exactly ``expected`` (None: absent)."""
    value = new.encode() if isinstance(new, LoadState) else new
    return store.compare_and_set(
        META_TABLE, state_row(table), META_FAMILY, STATE_QUALIFIER, expected, value
    )


def read_state(store: Store, table: str) -> tuple[LoadState | None, bytes | None]:
    """The table's load state and its exact bytes (for compare-and-set); (None, None) for
    an ordinary table."""
    cells = store.read_row(META_TABLE, state_row(table), columns=[(META_FAMILY, STATE_QUALIFIER)])
    versions = cells.get((META_FAMILY, STATE_QUALIFIER))
    if not versions:
        return None, None
    raw = versions[0][1]
    return LoadState.decode(raw), raw


def read_raw_states(store: Store, tables: Sequence[str]) -> dict[str, bytes]:
    """The exact bytes of the state records of ``tables`` that have one (one read)."""
    if not tables:
        return {}
    rows = {state_row(table): table for table in tables}
    found = store.read_rows(META_TABLE, sorted(rows), columns=[(META_FAMILY, STATE_QUALIFIER)])
    raw: dict[str, bytes] = {}
    for row, cells in found.items():
        versions = cells.get((META_FAMILY, STATE_QUALIFIER))
        if versions and row in rows:
            raw[rows[row]] = versions[0][1]
    return raw

"""The observer API: what an observer is, and how the columns it watches are registered.

An observer watches columns of one table.  When a transaction writes (or deletes) a watched
cell, the commit leaves a *notification* on that cell; a worker (observers/worker.py) finds
it and calls :meth:`Observer.process` with a fresh transaction, the row and the column.
Whatever that transaction writes commits atomically with the observer's acknowledgement,
and may in turn notify other observers::

    from percolator.observers.api import Observer

    class WordCount(Observer):
        name = "word-count"
        table = "documents"
        columns = ("body",)

        def setup(self, client):
            client.create_table("documents")
            client.create_table("counts")

        def process(self, txn, row, column):
            body = txn.get("documents", row, "body") or b""
            txn.set("counts", row, "words", str(len(body.split())).encode())

Delivery guarantees
-------------------
*Strong* (the default): at most one committed run per change.  A run reads its ack cell
(``!ack/<observer>/<column>``, a transactional cell in the same row) and the latest commit
``C`` of the observed cell; it runs the user code only if the ack is below ``C`` and writes
``ack = C`` in the same transaction, so two racing runs conflict on the ack and at most one
commits.  Several writes between two runs fold into one run that sees the latest value.
After quiescence every observed cell's ack covers its latest write.

*Weak* (``weak = True``): no ack is read or written.  The observer runs at least once after
each change (again, several changes may fold into one run) and may run more than once for
the same change, e.g. when two workers race or a worker dies between its commit and its
cleanup.  Cheaper (no ack conflicts); for idempotent observers.

Contract of :meth:`Observer.process`: it may be called several times for one change, of
which at most one (strong) commits; it must do all its work through ``txn`` (anything else is
not rolled back with it); it must not commit, roll back, or write reserved (``!``) columns;
raising any exception rolls the run back and counts as a failure of that notification
(retryable engine errors - conflicts - are retried without counting).

Registration
------------
The observed ``(table, column)`` pairs live in the engine's meta table (format in
percolator/client.py).  At most **one observer per column**: its notification is cleaned up
as soon as that observer acknowledged it, so a second observer of the same column would
miss changes.  An observer that needs to do two things does both in one ``process``.

:func:`register_observers` returns only once every client is guaranteed to have seen the
registration (one refresh interval): **every transaction that starts after it returns
leaves a notification** when it writes a watched column.  Writes that started earlier may
or may not; to process data that existed before registration, call :func:`trigger`.
"""

from __future__ import annotations

import abc
import json
import re
import struct
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from percolator.client import (
    OBSERVED_QUALIFIER,
    OBSERVED_TOMBSTONE,
    observed_refresh_ms,
    observed_row,
    parse_observed_row,
    scan_observed_rows,
)
from percolator.committer import NOTIFY_VALUE
from percolator.errors import ConfigError, InvalidArgumentError
from percolator.layout import (
    META_FAMILY,
    META_TABLE,
    NOTIFY,
    RESERVED_PREFIX,
    ack_column,
    check_table_name,
    encode_column,
    encode_row,
)
from percolator.store.base import Put, Store
from percolator.transaction import Transaction

if TYPE_CHECKING:
    from percolator.client import Client

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
_U64 = struct.Struct(">Q")
# How long past one refresh interval registration waits, to absorb timer granularity.
_REGISTRATION_MARGIN_S = 0.05
# A registration found already in place is dated by the store's clock (its cell version),
# compared with ours: allow this much skew between the two clocks.
_CLOCK_SKEW_S = 1.0


class Observer(abc.ABC):
    """Base class of observers.  Subclasses set ``name``, ``table`` and ``columns`` (class
    or instance attributes) and implement :meth:`process`.

    ``name``: unique among observers, ``[A-Za-z0-9][A-Za-z0-9_.-]*`` (at most 100
    characters); it names the ack columns, metrics and parked notifications, so renaming an
    observer makes it process every watched cell again.
    ``table``: the table it watches.  ``columns``: the watched columns (non-empty).
    ``weak``: weak notifications (see the module docstring); default strong.
    """

    name: str
    table: str
    columns: Sequence[str]
    weak: bool = False

    def setup(self, client: Client) -> None:  # noqa: B027 - optional hook
        """Create the tables this observer reads and writes.  Called by every worker that
        hosts it, before its first run; must be idempotent (``client.create_table`` is)."""

    @abc.abstractmethod
    def process(self, txn: Transaction, row: bytes, column: str) -> None:
        """React to a change of ``(self.table, row, column)``.  See the module docstring
        for the contract (may be re-run; at most one strong run commits per change)."""

    def __repr__(self) -> str:
        return f"<observer {getattr(self, 'name', '?')!r} on {getattr(self, 'table', '?')}>"


def check_observer(observer: object) -> Observer:
    """Validate an observer's declaration; raises InvalidArgumentError naming what is wrong.
    Returns it, typed."""
    if not isinstance(observer, Observer):
        raise InvalidArgumentError(
            f"{observer!r} is not an observer: subclass percolator.observers.api.Observer"
        )
    name = getattr(observer, "name", None)
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidArgumentError(
            f"observer {type(observer).__name__}: name {name!r} is invalid: use letters, "
            "digits, '_', '-', '.', starting with a letter or digit (at most 100 characters)"
        )
    table = getattr(observer, "table", None)
    try:
        check_table_name(table)
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(f"observer {name!r}: {exc}") from None
    columns = getattr(observer, "columns", None)
    if isinstance(columns, str) or not isinstance(columns, Sequence) or not columns:
        raise InvalidArgumentError(
            f"observer {name!r}: columns must be a non-empty sequence of column names "
            f"(e.g. ('body',)), got {columns!r}"
        )
    for column in columns:
        try:
            encode_column(column)
        except InvalidArgumentError as exc:
            raise InvalidArgumentError(f"observer {name!r}: {exc}") from None
    if len(set(columns)) != len(columns):
        raise InvalidArgumentError(f"observer {name!r}: columns {list(columns)} repeat a name")
    if not isinstance(getattr(observer, "weak", False), bool):
        raise InvalidArgumentError(f"observer {name!r}: weak must be True or False")
    if not callable(getattr(observer, "process", None)):
        raise InvalidArgumentError(f"observer {name!r}: process is not callable")
    return observer


# --------------------------------------------------------------------------- registration


@dataclass(frozen=True)
class Registration:
    """One observed column: which observer watches it, and in which mode."""

    table: str
    column: str
    observer: str
    weak: bool
    #: store version of the registration cell (store time in ms)
    version: int = 0

    def encode(self) -> bytes:
        doc = {"v": 1, "observer": self.observer, "weak": self.weak}
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, table: str, column: str, value: bytes, version: int = 0) -> Registration:
        try:
            doc = json.loads(value)
            if doc.get("v") != 1:
                raise ValueError(f"unknown format version {doc.get('v')!r}")
            return cls(table, column, str(doc["observer"]), bool(doc["weak"]), version)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ConfigError(
                f"registration of observed column {table}/{column} in {META_TABLE} is "
                f"malformed ({exc}): {value[:200]!r}"
            ) from None


def registrations(store: Store) -> dict[tuple[str, str], Registration]:
    """Every observed column, keyed by ``(table, column)`` (one scan of the meta table)."""
    found: dict[tuple[str, str], Registration] = {}
    for row, version, value in scan_observed_rows(store):
        if not value or value == OBSERVED_TOMBSTONE:
            continue
        table, column = parse_observed_row(row)
        found[(table, column)] = Registration.decode(table, column, value, version)
    return found


def _claim_column(store: Store, wanted: Registration) -> tuple[bool, int]:
    """Make ``wanted`` the registration of its column by compare-and-set.

    Returns ``(changed, version_ms)``: whether this call wrote the cell, and the store
    version of the registration (to know how long it has been visible).  Idempotent for
    the same observer; raises ConfigError if another observer holds the column."""
    row = observed_row(wanted.table, wanted.column)
    for _ in range(100):
        cells = store.read_row(META_TABLE, row, columns=[(META_FAMILY, OBSERVED_QUALIFIER)])
        versions = cells.get((META_FAMILY, OBSERVED_QUALIFIER))
        current = versions[0] if versions else None
        if current is not None and current[1] and current[1] != OBSERVED_TOMBSTONE:
            held = Registration.decode(wanted.table, wanted.column, current[1], current[0])
            if held.observer != wanted.observer:
                raise ConfigError(
                    f"column {wanted.table}/{wanted.column} is already watched by observer "
                    f"{held.observer!r}; observer {wanted.observer!r} cannot watch it too "
                    "(one observer per column: unregister the other first)"
                )
            if held.weak == wanted.weak:
                return False, current[0]
        expected = current[1] if current is not None and current[1] else None
        if store.compare_and_set(
            META_TABLE, row, META_FAMILY, OBSERVED_QUALIFIER, expected, wanted.encode()
        ):
            return True, int(time.time() * 1000)
        # Lost a race with another registration of this column: look again.
    raise ConfigError(
        f"could not register observer {wanted.observer!r} on {wanted.table}/{wanted.column}: "
        "the registration cell kept changing under us"
    )


def register_observers(
    client: Client, observers: Iterable[Observer], *, wait: bool = True
) -> float:
    """Register the columns every observer watches (idempotent, safe to race).

    With ``wait`` (the default) it returns only when every client is guaranteed to notify
    writes to those columns (see :func:`wait_until_notified`).  Returns the wall-clock time
    (seconds) since which the newest of the registrations is visible.  Raises ConfigError
    (nothing more is registered) when a column is already watched by another observer."""
    visible_since = 0.0
    for observer in observers:
        check_observer(observer)
        for column in observer.columns:
            wanted = Registration(observer.table, column, observer.name, observer.weak)
            changed, version_ms = _claim_column(client.store, wanted)
            since = time.time() if changed else version_ms / 1000 + _CLOCK_SKEW_S
            visible_since = max(visible_since, since)
    if wait:
        wait_until_notified(client, visible_since)
    return visible_since


def wait_until_notified(client: Client, visible_since: float) -> None:
    """Wait until one refresh interval has passed since ``visible_since`` (a registration's
    visibility, as returned by :func:`register_observers`): from then on every client loads
    an observed set that includes it before it commits."""
    remaining = visible_since + observed_refresh_ms() / 1000 - time.time()
    if remaining > 0:
        time.sleep(remaining + _REGISTRATION_MARGIN_S)
    client.refresh_observed()


def unregister_observer(client: Client, name: str) -> list[tuple[str, str]]:
    """Stop notifying writes to the columns observer ``name`` watches; returns them.

    Notifications already written stay in the store until a worker hosting an observer of
    that column processes them (or forever, harmlessly, if none does).  The observer's ack
    cells stay too: re-registering it later resumes where it stopped."""
    removed = []
    for row, version, value in scan_observed_rows(client.store):
        if not value or value == OBSERVED_TOMBSTONE:
            continue
        table, column = parse_observed_row(row)
        if Registration.decode(table, column, value, version).observer != name:
            continue
        # Expect the exact bytes read: a concurrent change of the registration wins.
        if client.store.compare_and_set(
            META_TABLE, row, META_FAMILY, OBSERVED_QUALIFIER, value, OBSERVED_TOMBSTONE
        ):
            removed.append((table, column))
    client.refresh_observed()
    return removed


# --------------------------------------------------------------------------- helpers


def observer_transaction(client: Client) -> Transaction:
    """A transaction allowed to write reserved columns (the acks), at a fresh timestamp."""
    client._check_open()
    return Transaction(client, client.oracle.get_timestamp(), allow_reserved=True)


def encode_ack(commit_ts: int) -> bytes:
    """An ack's value: the ``commit_ts`` it covers, 8 bytes big-endian."""
    return _U64.pack(commit_ts)


def decode_ack(value: bytes | None, *, where: str = "") -> int | None:
    if value is None:
        return None
    if len(value) != _U64.size:
        raise ConfigError(f"ack cell {where} holds {len(value)} bytes, expected 8: {value!r}")
    ack: int = _U64.unpack(value)[0]
    return ack


def read_ack(txn: Transaction, observer: str, table: str, row: bytes, column: str) -> int | None:
    """The ``commit_ts`` that ``observer`` acknowledged for ``(table, row, column)``."""
    name = ack_column(observer, column)
    return decode_ack(txn.get(table, row, name), where=f"{table}/{row!r}/{name}")


def trigger(client: Client, table: str, rows: Iterable[bytes | str], column: str) -> int:
    """Leave a notification on ``(table, row, column)`` for each row, e.g. to process data
    written before the column was registered.  Returns the notification's timestamp.

    Safe at any time: a strong observer whose ack already covers the cell's latest commit
    only cleans the notification up; a cell never written is skipped.  Idempotent."""
    check_table_name(table)
    qualifier = encode_column(column)
    if column.startswith(RESERVED_PREFIX):
        raise InvalidArgumentError(f"cannot trigger reserved column {column!r}")
    notify_ts = client.oracle.get_timestamp()
    puts = [Put(encode_row(row), NOTIFY, qualifier, notify_ts, NOTIFY_VALUE) for row in rows]
    if puts:
        client.store.put(table, puts)
    return notify_ts

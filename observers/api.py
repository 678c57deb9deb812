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

A plain function does as well, with the :func:`observer` decorator (the decorated name is
then an :class:`Observer` instance, usable wherever a subclass's instance is)::

    from percolator.observers.api import observer

    @observer(name="word-count", table="documents", columns=("body",))
    def word_count(txn, row, column):
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
The observed ``(table, column)`` pairs live in the engine's meta table (the format, the
compare-and-set and each client's cached set are in percolator/notifications.py).  At most
**one observer per column**: its notification is cleaned up as soon as that observer
acknowledged it, so a second observer of the same column would miss changes.  An observer
that needs to do two things does both in one ``process``.

:func:`register_observers` returns only once every client is guaranteed to have seen the
registration (one refresh interval): **every transaction that starts after it returns
leaves a notification** when it writes a watched column, and (``catch_up``, the default) the
data the columns held before - written while no observer watched them, or before this one
did - is notified by a catch-up (observers/catchup.py) before it returns.  :func:`trigger`
re-runs chosen cells by hand.
"""

from __future__ import annotations

import abc
import re
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from percolator.observers import catchup
from percolator.observers.catchup import CatchUpReport

from percolator import notifications, watermark
from percolator.errors import ConfigError, InvalidArgumentError
from percolator.layout import (
    LOCK,
    RESERVED_PREFIX,
    ack_column,
    check_table_name,
    encode_column,
    encode_row,
)
from percolator.notifications import Registration, registrations
from percolator.protocol.cells import CellKey
from percolator.records import Kind, LockCell
from percolator.store.base import ScanOptions

if TYPE_CHECKING:
    from percolator.client import Client
    from percolator.transaction import Transaction

__all__ = [
    "FunctionObserver",
    "Observer",
    "Registration",
    "check_observer",
    "finish_registration",
    "observer",
    "register_observers",
    "registrations",
    "trigger",
    "unregister_observer",
    "wait_until_notified",
]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
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
    ``outputs``: the ``(table, column)`` pairs ``process`` may write, or None (the default:
    unknown).  Only watermarks use it (percolator/watermark.py): an observer that declares
    no outputs holds back the watermark of every other observer, one that does holds back
    only the observers watching those columns.  Declaring too few breaks the cascading
    guarantee of the watermarks downstream; it changes nothing else.
    ``reads``: other columns of the notified row that ``process`` reads.  A worker reads
    them with the observed cell and the ack, for every run of a batch in one store round
    trip, instead of one read per run; ``process`` still reads them through ``txn`` (served
    from what was read).  Only a saving: a column listed and not read, or read and not
    listed, costs a little but changes no result.
    """

    name: str
    table: str
    columns: Sequence[str]
    weak: bool = False
    outputs: Sequence[tuple[str, str]] | None = None
    reads: Sequence[str] = ()

    def setup(self, client: Client) -> None:  # noqa: B027 - optional hook
        """Create the tables this observer reads and writes.  Called by every worker that
        hosts it, before its first run; must be idempotent (``client.create_table`` is)."""

    @abc.abstractmethod
    def process(self, txn: Transaction, row: bytes, column: str) -> None:
        """React to a change of ``(self.table, row, column)``.  See the module docstring
        for the contract (may be re-run; at most one strong run commits per change)."""

    def __repr__(self) -> str:
        return f"<observer {getattr(self, 'name', '?')!r} on {getattr(self, 'table', '?')}>"


#: what :func:`observer` decorates: ``process(txn, row, column)``
ProcessFunction = Callable[["Transaction", bytes, str], None]
#: the optional setup hook of a function observer: ``setup(client)``
SetupFunction = Callable[["Client"], None]


class FunctionObserver(Observer):
    """An observer made of a plain function by :func:`observer`; calling it calls the
    function (so it can be unit-tested as the function it is)."""

    def __init__(
        self,
        function: ProcessFunction,
        *,
        name: str,
        table: str,
        columns: Sequence[str],
        weak: bool = False,
        setup: SetupFunction | None = None,
        reads: Sequence[str] = (),
    ) -> None:
        self.function = function
        self.name = name
        self.table = table
        self.columns = tuple(columns) if isinstance(columns, (list, tuple)) else columns
        self.weak = weak
        self.reads = tuple(reads) if isinstance(reads, (list, tuple)) else reads
        self._setup = setup
        self.__doc__ = function.__doc__
        self.__wrapped__ = function

    def setup(self, client: Client) -> None:
        if self._setup is not None:
            self._setup(client)

    def process(self, txn: Transaction, row: bytes, column: str) -> None:
        self.function(txn, row, column)

    def __call__(self, txn: Transaction, row: bytes, column: str) -> None:
        self.function(txn, row, column)


def observer(
    *,
    name: str,
    table: str,
    columns: Sequence[str],
    weak: bool = False,
    setup: SetupFunction | None = None,
    reads: Sequence[str] = (),
) -> Callable[[ProcessFunction], FunctionObserver]:
    """Make a plain function ``process(txn, row, column)`` an observer.

    The arguments are the class attributes of :class:`Observer` (same rules, same
    contract for the function as for :meth:`Observer.process`); ``setup(client)``, if
    given, is the idempotent setup hook.  The declaration is checked when the decorator
    runs, so a mistake fails at import with :class:`InvalidArgumentError` naming it.  The
    result is an observer instance: an entry point may point at it directly."""

    def decorate(function: ProcessFunction) -> FunctionObserver:
        if not callable(function):
            raise InvalidArgumentError(
                f"@observer({name!r}) decorates {function!r}, not a function"
            )
        if setup is not None and not callable(setup):
            raise InvalidArgumentError(f"observer {name!r}: setup {setup!r} is not callable")
        made = FunctionObserver(
            function, name=name, table=table, columns=columns, weak=weak, setup=setup, reads=reads
        )
        check_observer(made)
        return made

    return decorate


def check_observer_set(observers: Iterable[object]) -> list[Observer]:
    """Validate observers meant to run (or be registered) together: each declaration
    (:func:`check_observer`), distinct names, and one observer per column.  Raises
    InvalidArgumentError / ConfigError naming the clash; touches no store, so a command
    checks its observers with it before it opens (or creates) one.  Returns them, typed."""
    checked: list[Observer] = []
    watched: dict[tuple[str, str], str] = {}
    for candidate in observers:
        observer = check_observer(candidate)
        if any(o.name == observer.name for o in checked):
            raise ConfigError(f"observer {observer.name!r} is given twice")
        checked.append(observer)
        for column in observer.columns:
            other = watched.setdefault((observer.table, column), observer.name)
            if other != observer.name:
                raise ConfigError(
                    f"observers {other!r} and {observer.name!r} both watch "
                    f"{observer.table}/{column}; one observer per column"
                )
    return checked


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
    columns = _check_columns(
        name, "columns", getattr(observer, "columns", None), non_empty=True, example="('body',)"
    )
    if len(set(columns)) != len(columns):
        raise InvalidArgumentError(f"observer {name!r}: columns {list(columns)} repeat a name")
    if not isinstance(getattr(observer, "weak", False), bool):
        raise InvalidArgumentError(f"observer {name!r}: weak must be True or False")
    _check_columns(
        name, "reads", getattr(observer, "reads", ()), non_empty=False, example="('title',)"
    )
    outputs = getattr(observer, "outputs", None)
    if outputs is not None:
        if isinstance(outputs, str) or not isinstance(outputs, Sequence):
            raise InvalidArgumentError(
                f"observer {name!r}: outputs must be a sequence of (table, column) pairs or "
                f"None, got {outputs!r}"
            )
        for pair in outputs:
            if (
                not isinstance(pair, (tuple, list))
                or len(pair) != 2
                or not all(isinstance(part, str) and part for part in pair)
            ):
                raise InvalidArgumentError(
                    f"observer {name!r}: each output must be a (table, column) pair of "
                    f"non-empty strings, got {pair!r}"
                )
    if not callable(getattr(observer, "process", None)):
        raise InvalidArgumentError(f"observer {name!r}: process is not callable")
    return observer


def _check_columns(
    name: str, field: str, value: object, *, non_empty: bool, example: str
) -> Sequence[str]:
    """``value`` (an observer's ``field``) is a sequence (``non_empty``: not empty) of valid
    user column names: returns it, typed."""
    if isinstance(value, str) or not isinstance(value, Sequence) or (non_empty and not value):
        shape = "a non-empty sequence" if non_empty else "a sequence"
        raise InvalidArgumentError(
            f"observer {name!r}: {field} must be {shape} of column names (e.g. {example}), "
            f"got {value!r}"
        )
    for column in value:
        try:
            encode_column(column)
        except InvalidArgumentError as exc:
            label = "" if field == "columns" else f"{field}: "
            raise InvalidArgumentError(f"observer {name!r}: {label}{exc}") from None
    return value


# --------------------------------------------------------------------------- registration


def register_observers(
    client: Client, observers: Iterable[Observer], *, wait: bool = True, catch_up: bool = True
) -> float:
    """Register the columns every observer watches (idempotent, safe to race).

    With ``wait`` (the default) it returns only when every client is guaranteed to notify
    writes to those columns (see :func:`wait_until_notified`), and - with ``catch_up``, the
    default - once the data those columns already held is notified too
    (observers/catchup.py): an observer that starts watching a column it did not watch
    (new, or registered again after :func:`unregister_observer`) processes what is there,
    each change at most once.  With ``wait=False`` the caller must call
    :func:`finish_registration` after the wait.  Returns the wall-clock time (seconds) since
    which the newest of the registrations is visible.  Raises ConfigError, having registered
    nothing, when a column is already watched by another observer (or by two of
    ``observers``); only a registration racing this one can leave part of it claimed."""
    visible_since = 0.0
    chosen = list(observers)
    for observer in chosen:
        check_observer(observer)
    current = registrations(client.store)
    # Every column checked before any is claimed: a conflict on the last column must not
    # leave the first ones registered (a concurrent registration can still win a claim
    # below; then what was claimed before it stays, and re-running after resolving the
    # conflict finishes it).
    wanted_by: dict[tuple[str, str], str] = {}
    for observer in chosen:
        for column in observer.columns:
            key = (observer.table, column)
            holder = current[key].observer if key in current else wanted_by.get(key)
            if holder is not None and holder != observer.name:
                raise ConfigError(
                    f"column {observer.table}/{column} is already watched by observer "
                    f"{holder!r}; observer {observer.name!r} cannot watch it too (one "
                    "observer per column: unregister the other first); nothing was registered"
                )
            wanted_by[key] = observer.name
    for observer in chosen:
        held_by = {
            column: current[(observer.table, column)].observer
            for column in observer.columns
            if (observer.table, column) in current
        }
        fresh = [column for column in observer.columns if held_by.get(column) != observer.name]
        taken = [column for column in fresh if column in held_by]
        # A column held by another observer makes the claim below fail: no catch-up then.
        if catch_up and fresh and not taken:
            # Recorded before the claim: a crash after it leaves the catch-up owed, visibly.
            watermark.begin_catch_up(
                client.store, observer.name, getattr(observer, "outputs", None)
            )
        for column in observer.columns:
            outputs = getattr(observer, "outputs", None)
            wanted = Registration(
                observer.table,
                column,
                observer.name,
                observer.weak,
                outputs=None if outputs is None else tuple((t, c) for t, c in outputs),
            )
            changed, version_ms = notifications.claim_column(client.store, wanted)
            since = time.time() if changed else version_ms / 1000 + _CLOCK_SKEW_S
            visible_since = max(visible_since, since)
    if wait:
        wait_until_notified(client, visible_since)
        finish_registration(client, chosen)
    return visible_since


def finish_registration(
    client: Client,
    observers: Iterable[Observer],
    *,
    progress: Callable[[CatchUpReport], None] | None = None,
) -> list[CatchUpReport]:
    """Run the catch-up each of ``observers`` owes (begun by :func:`register_observers`,
    or left unfinished by a crash).  Call it after :func:`wait_until_notified`."""
    done = []
    for observer in observers:
        if watermark.catch_up_owed(client.store, observer.name):
            done.append(catchup.catch_up(client, observer.name, progress=progress))
    return done


def wait_until_notified(client: Client, visible_since: float) -> None:
    """Wait until one refresh interval has passed since ``visible_since`` (a registration's
    visibility, as returned by :func:`register_observers`): from then on every client loads
    an observed set that includes it before it commits."""
    remaining = visible_since + notifications.observed_refresh_ms() / 1000 - time.time()
    if remaining > 0:
        time.sleep(remaining + _REGISTRATION_MARGIN_S)
    client.refresh_observed()


def unregister_observer(client: Client, name: str) -> list[tuple[str, str]]:
    """Stop notifying writes to the columns observer ``name`` watches; returns them.

    Notifications already written stay in the store until a worker hosting an observer of
    that column processes them (or forever, harmlessly, if none does).  The observer's ack
    cells stay too: registering it again later catches up on what was written meanwhile
    (changes its acks do not cover, see :func:`register_observers`).  A cell deleted
    meanwhile is kept by garbage collection until the observer has run on it (its ack
    predates the delete: percolator/protocol/gc.py ``owes_delete``), so an observer removed
    for good leaves such cells in place until :func:`forget_observer`."""
    removed = notifications.release_columns(client.store, name)
    client.refresh_observed()
    return removed


def forget_observer(
    client: Client,
    name: str,
    *,
    batch: int = 500,
    progress: Callable[[str, int], None] | None = None,
) -> int:
    """Delete every ack of observer ``name``, which must not be registered (ConfigError
    otherwise, nothing deleted); returns how many were deleted.  ``progress(table,
    deleted)`` is called as each table is done (its whole lock family is scanned).

    For an observer removed for good (or renamed): its acks are what garbage collection
    keeps deleted cells for (``owes_delete``), and nothing else removes them.  Registered
    again afterwards, ``name`` owes every cell, as a new observer.  Each batch of deletes is
    a transaction; idempotent, so an interrupted run is finished by running it again.  Run
    it only while no worker runs ``name`` under a registration made meanwhile (it is checked
    before each batch)."""
    if batch < 1:
        raise InvalidArgumentError(f"batch must be at least 1, got {batch!r}")
    prefix = ack_column(name, "").encode("utf-8")
    deleted = 0

    def check_unregistered() -> None:
        if any(reg.observer == name for reg in registrations(client.store).values()):
            raise ConfigError(
                f"observer {name!r} is registered: its acks are what keeps it from running "
                "a change twice; unregister it first"
            )

    def delete(table: str, cells: list[tuple[bytes, str]]) -> None:
        check_unregistered()
        with client.observer_transaction() as txn:
            for row, column in cells:
                txn.delete(table, row, column)

    check_unregistered()
    for table in client.list_tables():
        pending: list[tuple[bytes, str]] = []
        deleted_before = deleted
        for row, cells in client.store.scan(table, LOCK, ScanOptions(batch_size=1000)):
            for qualifier, (_, value) in cells.items():
                if not qualifier.startswith(prefix):
                    continue
                last = LockCell.decode(value).last_commit
                if last is None or last.kind is Kind.DELETE:
                    continue  # never committed, or deleted already (an earlier run)
                pending.append((row, qualifier.decode("utf-8")))
                if len(pending) >= batch:
                    delete(table, pending)
                    deleted += len(pending)
                    pending = []
        if pending:
            delete(table, pending)
            deleted += len(pending)
        if progress is not None:
            progress(table, deleted - deleted_before)
    return deleted


def trigger(client: Client, table: str, rows: Iterable[bytes | str], column: str) -> int:
    """Leave a notification on ``(table, row, column)`` for each row, e.g. to process data
    written before the column was registered.  Returns the notification's timestamp.

    Safe at any time: a strong observer whose ack already covers the cell's latest commit
    only cleans the notification up; a cell never written is skipped.  Idempotent.

    Refuses (InvalidArgumentError, nothing written) a column no observer watches: nothing
    would ever process the notifications (a misspelt table or column, or an observer not
    registered yet - register it, which catches up on existing data by itself)."""
    check_table_name(table)
    encode_column(column)
    if column.startswith(RESERVED_PREFIX):
        raise InvalidArgumentError(f"cannot trigger reserved column {column!r}")
    observed = notifications.load_observed_columns(client.store)
    if (table, column) not in observed:
        listed = sorted(observed)
        watched = ", ".join(f"{t}/{c}" for t, c in listed[:10]) or "none"
        if len(listed) > 10:
            watched += f", ... {len(listed) - 10} more"
        raise InvalidArgumentError(
            f"no observer watches {table}/{column}: its notifications would never be "
            f"processed (observed columns: {watched})"
        )
    if isinstance(rows, (str, bytes, bytearray)):
        # A single row would be taken as its characters: one notification on each.
        raise InvalidArgumentError(
            f"rows must be a collection of row keys, got the single row {rows!r} (use [row])"
        )
    keys = [CellKey(table, encode_row(row), column) for row in rows]
    notify_ts = client.oracle.get_timestamp()
    notifications.put_notifications(client.store, keys, notify_ts)
    return notify_ts

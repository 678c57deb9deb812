"""Physical layout of a user table in the store (design notes §2).

One store table per user table, with four families.  For a user cell ``(row, column)`` the
store qualifier is the column's UTF-8 bytes in every family:

========  =======================  ====================  ================================
family    version                  value                 kept versions
========  =======================  ====================  ================================
``d``     ``start_ts``             the user's bytes      all (GC removes old ones)
``w``     ``commit_ts``            write record          all (GC removes old ones)
``l``     store time (ms)          lock cell             1, in memory: compare-and-set only
``n``     ``commit_ts``            notification hint     all (observer cleanup removes)
========  =======================  ====================  ================================

The notify family belongs to percolator/notifications.py: nothing else reads or writes it.

Column names starting with ``!`` are reserved for the engine (observer acknowledgements,
see percolator/notifications.py); user code cannot write them through the public API.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterable

from percolator.errors import (
    InvalidArgumentError,
    StoreError,
    TableExistsError,
    TableNotFoundError,
)
from percolator.store import checks as store_checks
from percolator.store.base import MAX_ROW_LENGTH, FamilySpec, ScanOptions, Store

DATA = "d"
WRITE = "w"
LOCK = "l"
NOTIFY = "n"

FAMILIES = (DATA, WRITE, LOCK, NOTIFY)

TABLE_FAMILIES = [
    FamilySpec(DATA),
    FamilySpec(WRITE),
    # One version: the lock cell is only ever compare-and-set, its history is never read.
    FamilySpec(LOCK, max_versions=1, in_memory=True),
    FamilySpec(NOTIFY),
]

RESERVED_PREFIX = "!"
#: write-family qualifiers of commit-index entries (``!txn/`` + the column's qualifier): no
#: user column can start with the reserved prefix, so they never collide with a column
COMMIT_INDEX_PREFIX = b"!txn/"
#: columns of observers' acknowledgements: ``!ack/<observer>/<column>`` (observer names
#: hold no ``/``; percolator/notifications.py owns their values)
ACK_PREFIX = f"{RESERVED_PREFIX}ack/"
SYSTEM_TABLE_PREFIX = "percolator_"
META_TABLE = "percolator_meta"
META_FAMILY = "m"
META_FAMILIES = [FamilySpec(META_FAMILY, max_versions=1, in_memory=True)]


def ensure_meta_table(store: Store) -> None:
    """Create the engine's system table if it is missing (idempotent, race-safe)."""
    if store.table_exists(META_TABLE):
        return
    # Another process may create it between the check and the create: that is fine.
    with contextlib.suppress(TableExistsError):
        store.create_table(META_TABLE, META_FAMILIES)


#: the deployment's identity: meta row ``deployment``, qualifier ``id``, a random hex string
#: written once (compare-and-set from absent) and never changed
DEPLOYMENT_ROW = b"deployment"
DEPLOYMENT_QUALIFIER = b"id"


def meta_set_once(store: Store, row: bytes, qualifier: bytes, make: Callable[[], bytes]) -> bytes:
    """The value of a meta cell written once and never changed: the stored one, or
    ``make()`` stored now by compare-and-set from absent.  Race-safe: concurrent first
    callers all return the one value that won.  The meta table must exist."""
    column = [(META_FAMILY, qualifier)]
    for _ in range(3):
        versions = store.read_row(META_TABLE, row, columns=column).get(column[0])
        if versions:
            return versions[0][1]
        store.compare_and_set(META_TABLE, row, META_FAMILY, qualifier, None, make())
    raise StoreError(f"meta cell {row!r}/{qualifier!r} could not be read back after it was written")


def deployment_id(store: Store) -> str:
    """The identity of the deployment ``store`` holds, made on first use (creating the
    meta table if needed).  Race-safe: concurrent first callers agree on one id.  It names
    the timestamp domain of the store's own oracle (percolator/timestamps/domain.py)."""
    ensure_meta_table(store)
    raw = meta_set_once(
        store, DEPLOYMENT_ROW, DEPLOYMENT_QUALIFIER, lambda: uuid.uuid4().hex.encode("ascii")
    )
    return raw.decode("ascii")


def same_deployment(a: Store, b: Store) -> bool:
    """Whether two store objects hold one deployment (the same object, or the same
    :func:`deployment_id`, made on first use)."""
    return a is b or deployment_id(a) == deployment_id(b)


def scan_meta_prefix(store: Store, prefix: bytes, qualifier: bytes) -> list[tuple[bytes, bytes]]:
    """``(row, value)`` of ``qualifier`` in every row of the meta table starting with
    ``prefix`` (one scan; rows without the qualifier are left out)."""
    stop = prefix[:-1] + bytes([prefix[-1] + 1])  # the first row past the prefix
    options = ScanOptions(start=prefix, stop=stop, qualifiers=[qualifier])
    return [
        (row, cells[qualifier][1]) for row, cells in store.scan(META_TABLE, META_FAMILY, options)
    ]


def engine_tables(store: Store) -> list[str]:
    """The store's engine tables: those with every family of :data:`TABLE_FAMILIES`, except
    the system tables.  A store (or an HBase prefix) may also hold tables of its own users
    (raw tables, other applications'): they are not the engine's, and scanning them for
    locks or notifications would fail on the missing families.  One families lookup per
    table; a table dropped meanwhile is left out.

    On HBase a deployment under a longer prefix (``prod_eu_`` beside ``prod_``) has its
    tables under this one's too: they are its, not this one's (its meta table marks it),
    and so are left out; a name the engine cannot have made is left out too."""
    names = store.list_tables()
    nested = [
        name[: -len(META_TABLE)]
        for name in names
        if name.endswith(META_TABLE) and name != META_TABLE
    ]
    found = []
    for name in names:
        if name.startswith(SYSTEM_TABLE_PREFIX) or any(name.startswith(p) for p in nested):
            continue
        try:
            families = {spec.name for spec in store.table_families(name)}
        except (TableNotFoundError, InvalidArgumentError):
            continue
        if families.issuperset(FAMILIES):
            found.append(name)
    return found


# \Z, not $: a name must not end in a newline.
MAX_COLUMN_BYTES = 1024
MAX_VALUE_BYTES = 64 * 1024 * 1024


def check_table_name(name: object, *, allow_system: bool = False) -> str:
    """The table-name rule of users' tables: the stores' rule
    (:func:`percolator.store.checks.check_table_name`), and names starting with
    ``percolator_`` belong to the engine (``allow_system`` lets the engine use them).
    Returns ``name``."""
    store_checks.check_table_name(name)
    assert isinstance(name, str)
    if name.startswith(SYSTEM_TABLE_PREFIX) and not allow_system:
        raise InvalidArgumentError(
            f"table name {name!r} is reserved: names starting with {SYSTEM_TABLE_PREFIX!r} "
            "belong to the engine"
        )
    return name


def encode_row(row: object) -> bytes:
    """Rows are bytes; str is accepted and encoded as UTF-8."""
    if isinstance(row, str):
        try:
            row = row.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidArgumentError(
                f"row {row!r} is not valid UTF-8 text; give it as bytes"
            ) from None
    if not isinstance(row, bytes):
        raise InvalidArgumentError(f"row must be bytes or str, got {type(row).__name__}: {row!r}")
    if not 0 < len(row) <= MAX_ROW_LENGTH:
        raise InvalidArgumentError(f"row key must be 1..{MAX_ROW_LENGTH} bytes, got {len(row)}")
    return row


def encode_column(column: object, *, allow_reserved: bool = False) -> bytes:
    """Columns are non-empty str; the store qualifier is their UTF-8 bytes."""
    if not isinstance(column, str):
        raise InvalidArgumentError(f"column must be a str, got {type(column).__name__}: {column!r}")
    if not column:
        raise InvalidArgumentError("column name must not be empty")
    if column.startswith(RESERVED_PREFIX) and not allow_reserved:
        raise InvalidArgumentError(
            f"column {column!r} is reserved: names starting with {RESERVED_PREFIX!r} "
            "belong to the engine"
        )
    try:
        encoded = column.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgumentError(f"column {column!r} is not valid UTF-8 text") from None
    if len(encoded) > MAX_COLUMN_BYTES:
        raise InvalidArgumentError(
            f"column {column[:40]!r}... is {len(encoded)} bytes; the limit is {MAX_COLUMN_BYTES}"
        )
    return encoded


def decode_column(qualifier: bytes) -> str:
    return qualifier.decode("utf-8")


def check_value(value: object, *, table: str, row: bytes, column: str) -> bytes:
    if not isinstance(value, bytes):
        raise InvalidArgumentError(
            f"value for {table}/{row!r}/{column} must be bytes, got {type(value).__name__}"
        )
    if len(value) > MAX_VALUE_BYTES:
        raise InvalidArgumentError(
            f"value for {table}/{row!r}/{column} is {len(value)} bytes; "
            f"the limit is {MAX_VALUE_BYTES}"
        )
    return value


def commit_index_qualifier(qualifier: bytes) -> bytes:
    """Where the commit-index entries of a cell live in its row's write family (version =
    a transaction's ``start_ts``, value = its ``commit_ts``; see protocol/commit.py)."""
    return COMMIT_INDEX_PREFIX + qualifier


def is_commit_index(qualifier: bytes) -> bool:
    return qualifier.startswith(COMMIT_INDEX_PREFIX)


def ack_column(observer: str, column: str) -> str:
    """The reserved column holding observer ``observer``'s acknowledgement of ``column``."""
    return f"{ACK_PREFIX}{observer}/{column}"


_ACK_PREFIX_BYTES = ACK_PREFIX.encode("ascii")


def acked_qualifier(qualifier: bytes) -> bytes | None:
    """The qualifier of the column an ack column's qualifier acknowledges (``None`` if
    ``qualifier`` is not an ack's): the inverse of :func:`ack_column`, on encoded names."""
    if not qualifier.startswith(_ACK_PREFIX_BYTES):
        return None
    _, slash, column = qualifier[len(_ACK_PREFIX_BYTES) :].partition(b"/")
    return column if slash and column else None


def name_list(names: Iterable[str], what: str) -> list[str]:
    """``names`` as a list; InvalidArgumentError for one bare string (or bytes), which
    would otherwise be taken letter by letter (``columns="body"`` for ``["body"]``)."""
    if isinstance(names, (str, bytes)):
        raise InvalidArgumentError(
            f"{what} must be a list of names, not one {type(names).__name__} "
            f"({what}=[{names!r}] for one)"
        )
    return list(names)

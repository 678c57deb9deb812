"""Argument checks and small helpers shared by every store backend, so that all of them
reject a bad call the same way, before anything is written."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from percolator.errors import InvalidArgumentError
from percolator.store.base import (
    MAX_ROW_LENGTH,
    MAX_VERSION,
    Column,
    CompareAndSet,
    Delete,
    FamilySpec,
    Put,
    ScanOptions,
    check_cell_args,
    check_value,
    check_version,
)

# ``before`` is exclusive, so the largest meaningful bound is one above the largest version.
MAX_BEFORE = MAX_VERSION + 1
# The default FamilySpec.max_versions (HBase's Integer.MAX_VALUE): "keep every version".
UNLIMITED_VERSIONS = 2**31 - 1

# --------------------------------------------------------------------------- shared checks

_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\Z")


_TABLE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,199}\Z")


def check_table_name(name: object) -> str:
    """The one table-name rule, for every store backend and (through
    :func:`percolator.layout.check_table_name`, which adds the engine's reserved prefix) for
    users' tables: portable HBase table qualifiers, 1 to 200 of ``A-Z a-z 0-9 _ . -``
    starting with a letter or digit (``\\Z``, not ``$``: no trailing newline).  Returns
    ``name``."""
    if not isinstance(name, str):
        raise InvalidArgumentError(f"table name must be a str, got {type(name).__name__}")
    if not _TABLE_NAME.match(name):
        raise InvalidArgumentError(
            f"table name {name!r} is invalid: use letters, digits, '_', '-', '.', "
            "starting with a letter or digit (at most 200 characters)"
        )
    return name


def check_family_specs(families: object) -> None:
    """A table needs at least one family; names unique and portable, options well typed."""
    if isinstance(families, (str, bytes)) or not isinstance(families, Sequence) or not families:
        raise InvalidArgumentError(
            f"families must be a non-empty sequence of FamilySpec, got {families!r}"
        )
    seen: set[str] = set()
    for spec in families:
        if not isinstance(spec, FamilySpec):
            raise InvalidArgumentError(f"families must hold FamilySpec, got {spec!r}")
        if not isinstance(spec.name, str) or not _NAME_RE.match(spec.name):
            raise InvalidArgumentError(
                f"family name {spec.name!r} is not valid: use A-Z a-z 0-9 _ . - "
                "and do not start with . or -"
            )
        if spec.name in seen:
            raise InvalidArgumentError(f"family {spec.name!r} is listed twice")
        seen.add(spec.name)
        mv = spec.max_versions
        if not isinstance(mv, int) or isinstance(mv, bool) or not 1 <= mv <= UNLIMITED_VERSIONS:
            raise InvalidArgumentError(
                f"family {spec.name!r}: max_versions must be an int in "
                f"[1, {UNLIMITED_VERSIONS}], got {mv!r}"
            )
        for option in ("in_memory", "block_cache"):
            if not isinstance(getattr(spec, option), bool):
                raise InvalidArgumentError(
                    f"family {spec.name!r}: {option} must be a bool, got {getattr(spec, option)!r}"
                )


def check_family_name(family: object, table_families: Mapping[str, object]) -> None:
    if not isinstance(family, str) or not family:
        raise InvalidArgumentError(f"family must be a non-empty str, got {family!r}")
    if family not in table_families:
        raise InvalidArgumentError(f"unknown family {family!r}; known: {sorted(table_families)}")


def check_row(row: object) -> None:
    if not isinstance(row, bytes):
        raise InvalidArgumentError(f"row must be bytes, got {type(row).__name__}: {row!r}")
    if not 0 < len(row) <= MAX_ROW_LENGTH:
        raise InvalidArgumentError(
            f"row key must be 1..{MAX_ROW_LENGTH} bytes, got {len(row)} bytes"
        )


def _check_int(name: str, value: object, low: int, high: int | None) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidArgumentError(f"{name} must be an int, got {value!r}")
    if value < low or (high is not None and value > high):
        bound = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise InvalidArgumentError(f"{name} must be {bound}, got {value}")


def check_sequence(items: object, what: str) -> Sequence[object]:
    if isinstance(items, (str, bytes)) or not isinstance(items, Sequence):
        raise InvalidArgumentError(f"{what} must be a sequence, got {type(items).__name__}")
    return items


def check_read_args(
    rows: object,
    columns: object,
    families: object,
    before: object,
    min_version: object,
    max_versions: object,
    table_families: Mapping[str, object],
) -> None:
    """The checks of :meth:`Store.read_rows`, identical on every local backend."""
    for row in check_sequence(rows, "rows"):
        check_row(row)
    if columns is not None:
        for column in check_sequence(columns, "columns"):
            if not isinstance(column, tuple) or len(column) != 2:
                raise InvalidArgumentError(
                    f"a column must be a (family, qualifier) tuple, got {column!r}"
                )
            check_family_name(column[0], table_families)
            if not isinstance(column[1], bytes):
                raise InvalidArgumentError(
                    f"qualifier must be bytes, got {type(column[1]).__name__}: {column[1]!r}"
                )
    if families is not None:
        for family in check_sequence(families, "families"):
            check_family_name(family, table_families)
    if before is not None:
        _check_int("before", before, 0, MAX_BEFORE)
    _check_int("min_version", min_version, 0, MAX_VERSION)
    _check_int("max_versions", max_versions, 1, None)
    if max_versions != 1 and (columns is None or families):
        raise InvalidArgumentError(
            f"reading max_versions={max_versions} needs explicit columns and no whole "
            "families (a multi-version read cannot name the qualifiers of a whole family)"
        )


def check_scan_options(opts: object) -> None:
    if not isinstance(opts, ScanOptions):
        raise InvalidArgumentError(f"options must be a ScanOptions, got {opts!r}")
    if not isinstance(opts.start, bytes):
        raise InvalidArgumentError(f"scan start must be bytes, got {opts.start!r}")
    if opts.stop is not None and not isinstance(opts.stop, bytes):
        raise InvalidArgumentError(f"scan stop must be bytes or None, got {opts.stop!r}")
    if opts.qualifiers is not None:
        for qualifier in check_sequence(opts.qualifiers, "scan qualifiers"):
            if not isinstance(qualifier, bytes):
                raise InvalidArgumentError(f"scan qualifiers must be bytes, got {qualifier!r}")
    if opts.before is not None:
        _check_int("scan before", opts.before, 0, MAX_BEFORE)
    _check_int("scan batch_size", opts.batch_size, 1, None)
    if opts.limit is not None:
        _check_int("scan limit", opts.limit, 0, None)
    if opts.value_ranges is not None:
        for item in check_sequence(opts.value_ranges, "scan value_ranges"):
            if (
                not isinstance(item, tuple)
                or len(item) != 2
                or not isinstance(item[0], bytes)
                or not (item[1] is None or isinstance(item[1], bytes))
            ):
                raise InvalidArgumentError(
                    f"scan value_ranges must hold (bytes, bytes or None) pairs, got {item!r}"
                )


def value_in_ranges(value: bytes, ranges: Sequence[tuple[bytes, bytes | None]]) -> bool:
    """Whether ``value`` lies in one of the half-open ``[low, high)`` ranges
    (:attr:`ScanOptions.value_ranges`)."""
    return any(low <= value and (high is None or value < high) for low, high in ranges)


def check_put(put: object, table_families: Mapping[str, object] | None) -> None:
    """The checks of one put (``table_families`` None: the family is checked by the
    caller)."""
    if not isinstance(put, Put):
        raise InvalidArgumentError(f"puts must hold Put, got {put!r}")
    check_cell_args(put.row, put.family, put.qualifier, table_families)
    check_version(put.version)
    check_value(put.value)


def check_compare_and_set(item: CompareAndSet, table_families: Mapping[str, object] | None) -> None:
    """The checks of one compare-and-set's arguments (``table_families`` None: the family
    is checked by the caller)."""
    check_cell_args(item.row, item.family, item.qualifier, table_families)
    if item.expected is not None:
        check_value(item.expected)
    check_value(item.new)


def check_compare_and_sets(
    items: object, table_families: Mapping[str, object] | None, *, conditional_puts: bool
) -> Sequence[CompareAndSet]:
    """The checks of :meth:`Store.compare_and_set_many`'s items (``table_families`` None:
    families are checked by the caller): each a well-formed :class:`CompareAndSet`, and no
    two on one cell (the backends do not order the items of a call).  Puts riding on an
    item (``then_put``) must be well-formed puts of its row, and only where the store has
    ``conditional_puts``."""
    cells = set()
    for item in check_sequence(items, "items"):
        if not isinstance(item, CompareAndSet):
            raise InvalidArgumentError(f"items must hold CompareAndSet, got {item!r}")
        check_compare_and_set(item, table_families)
        cell = (item.row, item.family, item.qualifier)
        if cell in cells:
            raise InvalidArgumentError(
                f"two compare-and-sets of one cell in one call: row {item.row!r}, column "
                f"{item.family}:{item.qualifier!r}"
            )
        cells.add(cell)
        if not isinstance(item.then_put, tuple):
            raise InvalidArgumentError(f"then_put must be a tuple of Put, got {item.then_put!r}")
        if item.then_put and not conditional_puts:
            raise InvalidArgumentError(
                "this store cannot put with a compare-and-set (conditional_puts is False): "
                "send the puts in calls of their own"
            )
        for put in item.then_put:
            check_put(put, table_families)
            if put.row != item.row:
                raise InvalidArgumentError(
                    f"a compare-and-set of row {item.row!r} carries a put of another row "
                    f"{put.row!r}: then_put is atomic only within the row"
                )
            if (put.family, put.qualifier) == (item.family, item.qualifier):
                raise InvalidArgumentError(
                    f"a compare-and-set of row {item.row!r}, column {item.family}:"
                    f"{item.qualifier!r} carries a put of its own cell"
                )
    return items  # type: ignore[return-value]  # checked above


def check_delete(delete: object, table_families: Mapping[str, object]) -> None:
    if not isinstance(delete, Delete):
        raise InvalidArgumentError(f"deletes must hold Delete, got {delete!r}")
    check_cell_args(delete.row, delete.family, delete.qualifier, table_families)
    check_version(delete.at_or_below)


def cas_matches(current: bytes | None, expected: bytes | None) -> bool:
    """HBase's checkAndPut comparison: an absent or empty ``expected`` matches a cell that is
    absent or holds the empty value; anything else must equal the newest value exactly."""
    if not expected:
        return not current
    return current == expected


def selection_by_family(
    columns: Sequence[Column] | None,
    families: Sequence[str] | None,
    table_families: Mapping[str, object],
) -> list[tuple[str, list[bytes] | None]]:
    """What a read selects, as ``(family, sorted qualifiers or None for the whole family)``
    in the table's family order.  Both ``None`` selects every family; an empty sequence
    selects nothing; a whole family wins over single columns of it."""
    if columns is None and families is None:
        return [(name, None) for name in table_families]
    whole = set(families or ())
    quals: dict[str, set[bytes]] = {}
    for family, qualifier in columns or ():
        if family not in whole:
            quals.setdefault(family, set()).add(qualifier)
    out: list[tuple[str, list[bytes] | None]] = []
    for name in table_families:
        if name in whole:
            out.append((name, None))
        elif name in quals:
            out.append((name, sorted(quals[name])))
    return out

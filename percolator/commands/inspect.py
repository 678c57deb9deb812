"""``percolator inspect``: the raw transactional state of cells, decoded.

For one row (``--row``) or a range of rows (``--start``/``--stop``) of a table it shows, per
cell: the lock cell (the lock with its primary, age and TTL, the latest commit it records,
the last rolled-back transaction), the write records (``commit_ts -> kind @ start_ts``), the
data versions, the notification versions and, as cells of their own, the observers'
acknowledgement columns (``!ack/...``).  Like ``fluo scan --raw`` or ``tikv-ctl mvcc``, it is
a tool for looking at what the protocol left behind: it reads the store directly, resolves
nothing and writes nothing, and never creates a store or a table.

``--json`` prints one object ``{"table", "cells": [{"row", "column", "lock", "writes",
"data", "notify"}]}`` with rows as UTF-8 text where they decode and ``0x...`` otherwise.

Exit code: 0, or 2 for a bad option, a missing store or table (one line, like every command).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

from percolator.command_options import (
    POSITIVE_INT,
    add_store_option,
    open_existing_store,
    row_key,
)
from percolator.commands.display import show_bytes
from percolator.errors import ConfigError
from percolator.layout import DATA, LOCK, NOTIFY, WRITE, check_table_name, encode_row
from percolator.records import LockCell, WriteRecord
from percolator.store.base import ScanOptions, Store
from percolator.timestamps import describe, now_ms, physical_ms

#: how many bytes of a value are shown (the rest is counted, not printed)
PREVIEW_BYTES = 64


@dataclass
class CellState:
    row: str
    column: str
    lock: dict[str, Any] | None = None
    writes: list[dict[str, Any]] = field(default_factory=list)
    data: list[dict[str, Any]] = field(default_factory=list)
    notify: list[int] = field(default_factory=list)


def preview(value: bytes) -> str:
    shown = show_bytes(value[:PREVIEW_BYTES])
    more = len(value) - PREVIEW_BYTES
    return f"{shown}... (+{more} bytes)" if more > 0 else shown


def describe_lock_cell(raw: bytes, clock_ms: int) -> dict[str, Any]:
    """The lock cell's content as plain data (an undecodable cell is shown as such)."""
    try:
        cell = LockCell.decode(raw)
    except ValueError as exc:
        return {"malformed": str(exc), "bytes": "0x" + raw.hex()}
    out: dict[str, Any] = {"lock": None, "last_commit": None, "rolled_back": cell.rolled_back}
    if cell.lock is not None:
        lock = cell.lock
        age = clock_ms - physical_ms(lock.start_ts)
        out["lock"] = {
            "start_ts": lock.start_ts,
            "kind": lock.kind.name,
            "primary": f"{lock.primary_table}/{show_bytes(lock.primary_row)}/{lock.primary_column}",
            "ttl_ms": lock.ttl_ms,
            "age_ms": age,
            "expired": age > lock.ttl_ms,
        }
    if cell.last_commit is not None:
        commit = cell.last_commit
        out["last_commit"] = {
            "commit_ts": commit.commit_ts,
            "start_ts": commit.start_ts,
            "kind": commit.kind.name,
        }
    return out


def inspect_rows(
    store: Store, table: str, start: bytes, stop: bytes | None, *, limit: int = 1000
) -> list[CellState]:
    """Every cell of rows in ``[start, stop)``, at most ``limit`` cells, in row order.
    A user table only: the engine's own (``percolator_meta``) has none of its families."""
    check_table_name(table)
    if not store.table_exists(table):
        raise ConfigError(f"table {table!r} does not exist in this store")
    clock = now_ms()
    cells: dict[tuple[bytes, bytes], CellState] = {}

    def state(row: bytes, qualifier: bytes) -> CellState:
        key = (row, qualifier)
        if key not in cells:
            cells[key] = CellState(show_bytes(row), show_bytes(qualifier))
        return cells[key]

    options = ScanOptions(start=start, stop=stop, batch_size=200)
    seen_rows: list[bytes] = []
    for row, found in store.scan(table, LOCK, options):
        seen_rows.append(row)
        for qualifier, (_, value) in found.items():
            state(row, qualifier).lock = describe_lock_cell(value, clock)
        if len(cells) >= limit:
            break
    # The other families of the same rows, every version (history is what this is for).
    versions: dict[bytes, dict[tuple[str, bytes], list[tuple[int, bytes]]]] = defaultdict(dict)
    for offset in range(0, len(seen_rows), 200):
        chunk = seen_rows[offset : offset + 200]
        wanted = [
            (family, q) for (r, q) in cells if r in set(chunk) for family in (WRITE, DATA, NOTIFY)
        ]
        if not wanted:
            continue
        fetched = store.read_rows(
            table, chunk, columns=list(dict.fromkeys(wanted)), max_versions=10_000
        )
        for row, by_column in fetched.items():
            versions[row].update(by_column)
    for (row, qualifier), cell in cells.items():
        found_versions = versions.get(row, {})
        for commit_ts, raw in found_versions.get((WRITE, qualifier), []):
            try:
                record = WriteRecord.decode(raw)
                cell.writes.append(
                    {"commit_ts": commit_ts, "kind": record.kind.name, "start_ts": record.start_ts}
                )
            except ValueError as exc:
                cell.writes.append({"commit_ts": commit_ts, "malformed": str(exc)})
        for start_ts, raw in found_versions.get((DATA, qualifier), []):
            cell.data.append({"start_ts": start_ts, "value": preview(raw), "bytes": len(raw)})
        cell.notify = [ts for ts, _ in found_versions.get((NOTIFY, qualifier), [])]
    return [cells[key] for key in sorted(cells)][:limit]


def render(table: str, states: list[CellState]) -> str:
    if not states:
        return f"{table}: no cells in this range"
    lines: list[str] = []
    for cell in states:
        lines.append(f"{table}/{cell.row}/{cell.column}")
        lock = cell.lock or {}
        if lock.get("malformed"):
            lines.append(f"  lock cell   MALFORMED: {lock['malformed']}")
        if lock.get("lock"):
            held = lock["lock"]
            state = "EXPIRED" if held["expired"] else "live"
            lines.append(
                f"  lock        {held['kind']} by start_ts {held['start_ts']} "
                f"({describe(held['start_ts'])}), primary {held['primary']}, "
                f"age {held['age_ms']} ms of ttl {held['ttl_ms']} ms, {state}"
            )
        else:
            lines.append("  lock        none")
        if lock.get("last_commit"):
            last = lock["last_commit"]
            lines.append(
                f"  latest      {last['kind']} committed at {last['commit_ts']} "
                f"(start_ts {last['start_ts']})"
            )
        if lock.get("rolled_back"):
            lines.append(f"  rolled back start_ts {lock['rolled_back']}")
        for write in cell.writes:
            if "malformed" in write:
                lines.append(f"  write       {write['commit_ts']}: MALFORMED {write['malformed']}")
            else:
                lines.append(
                    f"  write       {write['commit_ts']}: {write['kind']} @ {write['start_ts']}"
                )
        for data in cell.data:
            lines.append(f"  data        {data['start_ts']}: {data['value']!s}")
        if cell.notify:
            lines.append("  notify      " + ", ".join(str(ts) for ts in cell.notify))
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if args.row is not None and (args.start is not None or args.stop is not None):
        raise ConfigError("give either --row or --start/--stop, not both")
    if args.row is not None:
        start = encode_row(args.row)
        stop: bytes | None = start + b"\x00"
    else:
        start = encode_row(args.start) if args.start else b""
        stop = encode_row(args.stop) if args.stop else None
    store = open_existing_store(args.store)
    try:
        states = inspect_rows(store, args.table, start, stop, limit=args.limit)
    finally:
        store.close()
    if args.json:
        json.dump({"table": args.table, "cells": [asdict(s) for s in states]}, sys.stdout, indent=2)
        print()
    else:
        print(render(args.table, states))
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "inspect",
        help="show the raw transactional state of cells (locks, writes, data, notify)",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    add_store_option(parser)
    parser.add_argument("table", help="the user table")
    parser.add_argument(
        "--row", type=row_key, help="one row (the argument's bytes: UTF-8 for text)"
    )
    parser.add_argument("--start", type=row_key, help="first row of a range (inclusive)")
    parser.add_argument("--stop", type=row_key, help="end of a range (exclusive)")
    parser.add_argument("--limit", type=POSITIVE_INT, default=1000, help="at most this many cells")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(func=run)

"""``percolator status``: what needs an operator's attention, read from the store.

It changes no data (it never resolves a lock, moves the safe point or deletes anything), so
it is safe to run at any time against a live deployment:

- **locks**: outstanding lock cells of every user table, an age histogram and the oldest
  ones (age = wall clock - the physical part of the lock's ``start_ts``; ``expired`` = past
  its TTL, so the next reader will roll it back or forward);
- **notifications**: per observed column (and its observer) the pending notifications, the
  parked ones and how many live workers run that observer (text: "no live worker runs it"
  when notifications wait and none does); pending notifications on columns no observer is
  registered for are listed separately (nobody will process them); and how long one scan
  of each table's notify family took, what each worker pass costs at least (on HBase a
  scan far slower than its notifications explain walks deleted ones: docs/operations.md);
- **oracle**: the persisted record (epoch, high-water mark = the limit no timestamp exceeds,
  lease holder and expiry); with ``--oracle grpc://...`` also each server's own answer;
- **gc**: the safe point and the oldest transaction start published by live clients;
- **workers**: the workers in the roster (observers/roster.py): where each runs, its
  observers, run threads, scanners, batch size and key groups, and when it was last seen;
  a worker not seen for a while (killed, paused or cut off from the store) is listed as
  such, not as a problem: a restarted worker has a new id and its old record ages out;
- **watermarks**: each observer's low watermark, its lag and what holds it back.

``--json`` prints one object with the keys ``store``, ``locks`` (``count``, ``expired``,
``by_age`` {bucket: count}, ``oldest`` [..], ``truncated`` tables), ``notifications``
(``observers`` [{observer, table, column, pending, parked, live_workers}], ``unobserved``
[{table, column, pending}], ``scans`` [{table, notifications, seconds}]), ``oracle``
(``record`` or null, ``servers`` [..]), ``gc``
(``safe_point``, ``safe_point_time``, ``oldest_published_start_ts``, ``reservations``),
``workers`` ([{worker_id, host, pid, observers, threads, scanners, batch_size, partitioned,
key_groups, started_ms, seen_ms, seen_ago_ms, live}]), ``watermarks`` (``observers`` [..],
``error``) and ``problems`` (strings).

Exit code: 0 when nothing is wrong, 1 when ``problems`` is not empty (expired locks, parked
notifications, unobserved notifications, no active oracle among ``--oracle``), 2 for a bad
option, an unreachable store, or a store that does not hold a deployment (a missing embedded
path, ``memory:``, an empty store, an HBase ``prefix`` with no engine tables under it): one
line, like every command.  It never creates a store or a table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from percolator import notifications
from percolator.command_options import (
    NON_NEGATIVE_INT,
    POSITIVE_INT,
    add_oracle_option,
    add_store_option,
    connect_existing,
)
from percolator.commands.display import show_bytes
from percolator.errors import ConfigError, OracleError
from percolator.layout import LOCK, META_TABLE, engine_tables
from percolator.records import LockCell
from percolator.store.base import ScanOptions, Store
from percolator.timestamps import describe, now_ms, physical_ms

# Upper bounds (ms) of the lock-age buckets, and their labels.
AGE_BUCKETS = [(1_000, "<1s"), (10_000, "<10s"), (60_000, "<1min"), (600_000, "<10min")]
OLDER = ">=10min"


@dataclass
class LockEntry:
    table: str
    row: str
    column: str
    start_ts: int
    age_ms: int
    ttl_ms: int
    expired: bool
    primary: str


@dataclass
class LockReport:
    count: int = 0
    expired: int = 0
    by_age: dict[str, int] = field(default_factory=dict)
    oldest: list[LockEntry] = field(default_factory=list)
    #: tables whose scan stopped at --scan-limit cells (counts are lower bounds there)
    truncated: list[str] = field(default_factory=list)


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "status",
        help="locks, notification backlog, oracle and GC state of a deployment",
        description="Report outstanding locks by age, pending and parked notifications per "
        "observer, the oracle's epoch and limit and the GC safe point.  Reads only.  Exit "
        "code 0: nothing wrong; 1: something needs attention (listed under problems).",
    )
    add_store_option(parser)
    add_oracle_option(parser)
    parser.add_argument("--table", action="append", help="only this table (repeatable)")
    parser.add_argument(
        "--oldest",
        type=NON_NEGATIVE_INT,
        default=10,
        metavar="N",
        help="list the N oldest locks (default 10)",
    )
    parser.add_argument(
        "--scan-limit",
        type=POSITIVE_INT,
        default=1_000_000,
        metavar="CELLS",
        help="stop counting locks of a table after this many lock cells (default %(default)s)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(func=run)


def _bucket(age_ms: int) -> str:
    for bound, label in AGE_BUCKETS:
        if age_ms < bound:
            return label
    return OLDER


def scan_locks(store: Store, tables: list[str], *, oldest: int, scan_limit: int) -> LockReport:
    """Every lock held in ``tables`` (lock cells in the ``Locked`` state)."""
    report = LockReport(by_age={label: 0 for _, label in AGE_BUCKETS} | {OLDER: 0})
    now = now_ms()
    entries: list[LockEntry] = []
    for table in tables:
        seen = 0
        for row, cells in store.scan(table, LOCK, ScanOptions(batch_size=1000)):
            for qualifier, (_, value) in cells.items():
                seen += 1
                lock = LockCell.decode(value).lock
                if lock is None:
                    continue
                age = max(0, now - physical_ms(lock.start_ts))
                expired = now > lock.expires_at_ms
                report.count += 1
                report.expired += expired
                report.by_age[_bucket(age)] += 1
                primary = (
                    f"{lock.primary_table}/{show_bytes(lock.primary_row)}/{lock.primary_column}"
                )
                entries.append(
                    LockEntry(
                        table,
                        show_bytes(row),
                        qualifier.decode("utf-8"),
                        lock.start_ts,
                        age,
                        lock.ttl_ms,
                        expired,
                        primary,
                    )
                )
            if seen >= scan_limit:
                report.truncated.append(table)
                break
        # Keep only the oldest few while scanning, so a huge table does not hold them all.
        entries = sorted(entries, key=lambda e: e.start_ts)[:oldest]
    report.oldest = entries
    return report


def notification_report(
    client: Any, tables: list[str]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """Per registered observed column: pending and parked; pending unobserved ones; and per
    table, how many notifications one scan of its notify family read and how long it took."""
    from percolator.observers.parking import ParkingLot, skips

    parked: dict[tuple[str, str], int] = {}
    parked_at = ParkingLot(client).parked()
    for table, _, column in parked_at:
        parked[(table, column)] = parked.get((table, column), 0) + 1
    registered = notifications.registrations(client.store)
    pending: dict[tuple[str, str], int] = {}
    scans = []
    for table in tables:
        started, read = time.monotonic(), 0
        for _, found in notifications.scan_notifications(client.store, table, batch_size=1000):
            for notification in found:
                read += 1
                if skips(parked_at, notification):
                    continue  # counted as parked (a newer change of a parked cell is pending)
                key = (table, notification.column)
                pending[key] = pending.get(key, 0) + 1
        seconds = round(time.monotonic() - started, 4)
        scans.append({"table": table, "notifications": read, "seconds": seconds})
    observed = []
    for (table, column), registration in sorted(registered.items()):
        if tables and table not in tables:
            continue
        waiting = pending.get((table, column), 0)
        observed.append(
            {
                "observer": registration.observer,
                "table": table,
                "column": column,
                "pending": waiting,
                "parked": parked.get((table, column), 0),
            }
        )
    unobserved = [
        {"table": table, "column": column, "pending": count}
        for (table, column), count in sorted(pending.items())
        if (table, column) not in registered
    ]
    return observed, unobserved, scans


def oracle_report(store: Store, oracle: str | None) -> dict[str, Any]:
    from percolator.timestamps.record import OracleRecordRegister

    stored = OracleRecordRegister(store).read()
    record = None
    if stored.record is not None:
        r = stored.record
        record = {
            "epoch": r.epoch,
            "limit": r.high_water,
            "limit_time": describe(r.high_water),
            "holder": r.holder,
            "lease_expiry_ms": r.lease_expiry_ms,
            "lease_live": r.leased and r.lease_expiry_ms > now_ms(),
        }
    servers: list[dict[str, Any]] = []
    if oracle:
        servers = _ask_servers(oracle)
    return {"record": record, "servers": servers}


def _ask_servers(oracle: str) -> list[dict[str, Any]]:
    from percolator.oracle.addressing import parse_oracle_url
    from percolator.oracle.client import GrpcOracleClient
    from percolator.oracle.proto_gen import oracle_pb2

    addresses, tls, token, (_, rpc_timeout_s) = parse_oracle_url(oracle)
    client = GrpcOracleClient(addresses, token=token, tls=tls, rpc_timeout_s=rpc_timeout_s)
    servers: list[dict[str, Any]] = []
    try:
        for address in addresses:
            try:
                info = client.info(address)
            except OracleError as exc:
                servers.append({"address": address, "error": str(exc)})
                continue
            servers.append(
                {
                    "address": address,
                    "role": oracle_pb2.Role.Name(info.role).removeprefix("ROLE_").lower(),
                    "epoch": info.epoch,
                    "limit": info.persisted_high_water,
                    "last_issued": info.last_issued,
                }
            )
    finally:
        client.close()
    return servers


def gc_report(store: Store) -> dict[str, Any]:
    from percolator.readers import live_readers, read_safe_point, scan_reservations

    safe_point, _ = read_safe_point(store)
    clock = now_ms()
    oldest = live_readers(store, clock).oldest
    reservations = [
        {
            "name": r.name,
            "ts": r.ts,
            "time": describe(r.ts),
            "expires_in_ms": r.expires_ms - clock,
            "expired": r.expires_ms < clock,
        }
        for r in scan_reservations(store)
    ]
    return {
        "safe_point": safe_point,
        "safe_point_time": describe(safe_point) if safe_point else None,
        "oldest_published_start_ts": oldest,
        "reservations": reservations,
    }


def build_report(client: Any, args: argparse.Namespace) -> dict[str, Any]:
    store: Store = client.store
    # Engine tables only: system tables and other tables sharing the store have no locks.
    tables = engine_tables(store)
    if args.table:
        missing = sorted(set(args.table) - set(tables))
        if missing:
            raise ConfigError(f"--table: no such percolator table {', '.join(map(repr, missing))}")
        tables = [t for t in tables if t in args.table]
    locks = scan_locks(store, tables, oldest=args.oldest, scan_limit=args.scan_limit)
    observed, unobserved, scans = notification_report(client, tables)
    workers = worker_report(store)
    for entry in observed:
        entry["live_workers"] = sum(
            1 for w in workers if w["live"] and entry["observer"] in w["observers"]
        )
    oracle = oracle_report(store, args.oracle)
    problems = []
    if locks.expired:
        problems.append(f"{locks.expired} expired lock(s) waiting for a reader or GC")
    for entry in observed:
        if entry["parked"]:
            problems.append(
                f"{entry['parked']} parked notification(s) of observer {entry['observer']!r}"
            )
    for entry in unobserved:
        problems.append(
            f"{entry['pending']} notification(s) on {entry['table']}/{entry['column']}, "
            "which no observer is registered for"
        )
    if args.oracle:
        errors = [s for s in oracle["servers"] if "error" in s]
        if not any(s.get("role") == "active" for s in oracle["servers"]):
            detail = f" ({errors[0]['error']})" if errors else ""
            problems.append(f"no active oracle among {args.oracle}{detail}")
    return {
        "store": store.url,
        "tables": tables,
        "locks": asdict(locks),
        "notifications": {"observers": observed, "unobserved": unobserved, "scans": scans},
        "oracle": oracle,
        "gc": gc_report(store),
        "workers": workers,
        "watermarks": watermark_report(client, args.oracle),
        "problems": problems,
    }


def worker_report(store: Store) -> list[dict[str, Any]]:
    """The roster's workers (observers/roster.py), newest start first: each record with how
    long ago it was refreshed and whether that is recent enough to call the worker live.
    A store without the meta table (no worker ever ran) has none."""
    from percolator.observers import roster

    if not store.table_exists(META_TABLE):
        return []
    return [
        {**asdict(entry.record), "seen_ago_ms": entry.age_ms, "live": entry.live}
        for entry in roster.read_roster(store)
    ]


def _duration(ms: int) -> str:
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def format_workers(workers: list[dict[str, Any]]) -> list[str]:
    live = sum(1 for w in workers if w["live"])
    lines = [
        f"workers: {live} live"
        + (f", {len(workers) - live} not seen" if live < len(workers) else "")
    ]
    for w in workers:
        groups = f", key groups {w['key_groups']}" if w["partitioned"] else ""
        seen = (
            f"seen {_duration(w['seen_ago_ms'])} ago"
            if w["live"]
            else f"NOT SEEN for {_duration(w['seen_ago_ms'])} (killed, paused or cut off)"
        )
        lines.append(
            f"  {w['worker_id']} (pid {w['pid']}): {', '.join(w['observers'])}; "
            f"threads {w['threads']}, scanners {w['scanners']}, batch {w['batch_size']}"
            f"{groups}; {seen}"
        )
    return lines


def watermark_report(client: Any, oracle_url: str | None) -> dict[str, Any]:
    """Each observer's low watermark, lag and what holds it (percolator/watermark.py),
    computed without publishing anything.  It needs one timestamp: from ``oracle_url``'s
    server when given, else from the in-process oracle; ``error`` says why there is none."""
    from percolator.errors import PercolatorError
    from percolator.timestamps.factory import open_oracle
    from percolator.watermark import compute_watermarks

    try:
        oracle = open_oracle(oracle_url, client.store) if oracle_url else client.oracle
        try:
            found = compute_watermarks(client.store, oracle, publish=False)
        finally:
            if oracle is not client.oracle:
                oracle.close()
    except PercolatorError as exc:
        return {"observers": [], "error": str(exc)}
    return {"observers": [found[name].as_dict() for name in sorted(found)], "error": None}


def format_report(report: dict[str, Any]) -> str:
    lines = [f"store {report['store']}: {len(report['tables'])} table(s)"]
    locks = report["locks"]
    ages = ", ".join(f"{label} {n}" for label, n in locks["by_age"].items() if n)
    more = (
        f" (counted up to the scan limit in {', '.join(locks['truncated'])})"
        if locks["truncated"]
        else ""
    )
    lines.append(
        f"locks: {locks['count']} held, {locks['expired']} expired{more}"
        + (f"; by age: {ages}" if ages else "")
    )
    for e in locks["oldest"]:
        state = "EXPIRED" if e["expired"] else "live"
        lines.append(
            f"  {e['age_ms'] / 1000:8.1f}s {state:7} {e['table']}/{e['row']}/{e['column']} "
            f"start_ts {e['start_ts']} ttl {e['ttl_ms']} ms primary {e['primary']}"
        )
    lines.append("notifications:")
    observers = report["notifications"]["observers"]
    if not observers:
        lines.append("  no observed columns registered")
    width = max([len(o["observer"]) for o in observers] + [8])
    for o in observers:
        lines.append(
            f"  {o['observer']:{width}} {o['table']}/{o['column']}: {o['pending']} pending, "
            f"{o['parked']} parked"
            + (", no live worker runs it" if o["pending"] and not o["live_workers"] else "")
        )
    for u in report["notifications"]["unobserved"]:
        lines.append(f"  (no observer) {u['table']}/{u['column']}: {u['pending']} pending")
    scans = report["notifications"]["scans"]
    if scans:
        slowest = max(scans, key=lambda scan: scan["seconds"])
        lines.append(
            f"  notify scans: {sum(scan['notifications'] for scan in scans)} notification(s) "
            f"in {sum(scan['seconds'] for scan in scans) * 1000:.0f} ms over {len(scans)} "
            f"table(s); slowest {slowest['table']}, {slowest['seconds'] * 1000:.0f} ms for "
            f"{slowest['notifications']}"
        )
    oracle = report["oracle"]
    record = oracle["record"]
    if record is None:
        lines.append("oracle: no record in the store yet (no timestamp issued)")
    else:
        lease = "live" if record["lease_live"] else "none/lapsed"
        lines.append(
            f"oracle: epoch {record['epoch']}, limit {record['limit_time']}, holder "
            f"{record['holder'] or '-'} (lease {lease})"
        )
    for s in oracle["servers"]:
        if "error" in s:
            lines.append(f"  {s['address']}: {s['error']}")
        else:
            lines.append(f"  {s['address']}: {s['role']}, epoch {s['epoch']}")
    gc = report["gc"]
    safe = gc["safe_point_time"] or "none (GC never ran)"
    oldest = gc["oldest_published_start_ts"]
    lines.append(
        f"gc: safe point {safe}; oldest live reader or reservation: "
        + (describe(oldest) if oldest else "none")
    )
    for r in gc["reservations"]:
        state = "expired" if r["expired"] else f"expires in {r['expires_in_ms'] // 1000} s"
        lines.append(f"  reservation {r['name']!r} at {r['time']} ({state})")
    lines += format_workers(report["workers"])
    marks = report["watermarks"]
    if marks["error"]:
        lines.append(f"watermarks: unavailable ({marks['error']})")
    for w in marks["observers"]:
        held = f", held back by {w['held_by']!r}" if w["held_by"] else ""
        catching = ", catch-up not finished" if w["catching_up"] else ""
        lines.append(
            f"watermark {w['observer']}: {w['watermark']} (lag {w['lag_ms'] / 1000:.1f} s; "
            f"{w['pending']} pending, {w['locks']} locks, {w['parked']} parked{held}{catching})"
        )
    lines.append("problems: " + ("none" if not report["problems"] else ""))
    lines += [f"  - {p}" for p in report["problems"]]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    # With the store's oracle (--oracle): the report draws one timestamp (its watermarks'
    # "now"), which must come from the oracle the store takes its timestamps from
    # (percolator/timestamps/domain.py).  A missing or empty store (or a wrong prefix) is
    # an error, never created: see connect_existing.
    with connect_existing(args.store, args.oracle) as client:
        report = build_report(client, args)
    if args.json:
        print(json.dumps(report, sort_keys=True))
    else:
        print(format_report(report))
    sys.stdout.flush()
    return 1 if report["problems"] else 0

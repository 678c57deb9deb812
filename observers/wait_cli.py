"""``percolator wait``, ``percolator watermarks`` and ``percolator catch-up``: entry points of
the ``percolator.commands`` group (see pyproject.toml).

All three open only a store that already holds a deployment (``connect_existing``): they
create no store and no table.  ``wait`` and ``watermarks`` write nothing but the published
watermarks (percolator/watermark.py); ``catch-up`` writes notifications.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from percolator.command_options import (
    SECONDS,
    TIMESTAMP,
    add_oracle_option,
    add_store_option,
    connect_existing,
)


def register_wait(subparsers: Any) -> None:
    wait: argparse.ArgumentParser = subparsers.add_parser(
        "wait",
        help="wait until the observers' low watermarks pass a timestamp",
        description="Return once every change that committed before TS (default: now) is "
        "processed by the observers - and, through cascading, by the observers downstream of "
        "them.  Exit status 0 when it passed, 3 on timeout (naming what is still pending).",
    )
    add_store_option(wait)
    add_oracle_option(wait)
    wait.add_argument(
        "--observer",
        action="append",
        metavar="NAME",
        help="wait for this observer (repeatable; default: every registered observer)",
    )
    wait.add_argument(
        "--timeout", type=SECONDS, default=60.0, metavar="SECONDS", help="default %(default)s"
    )
    wait.add_argument(
        "--ts", type=TIMESTAMP, default=None, help="the timestamp (default: a fresh one)"
    )
    wait.add_argument("--json", action="store_true", help="one JSON object per observer")
    wait.set_defaults(func=run_wait)


def register_watermarks(subparsers: Any) -> None:
    marks: argparse.ArgumentParser = subparsers.add_parser(
        "watermarks",
        help="each observer's low watermark, lag and what holds it back",
    )
    add_store_option(marks)
    add_oracle_option(marks)
    marks.add_argument("--observer", action="append", metavar="NAME", help="only this one")
    marks.add_argument("--json", action="store_true", help="one JSON object per observer")
    marks.set_defaults(func=run_watermarks)


def register_catch_up(subparsers: Any) -> None:
    catch: argparse.ArgumentParser = subparsers.add_parser(
        "catch-up",
        help="notify the cells a registered observer still owes (what registration does)",
        description="Scan the watched columns of observer NAME and leave a notification on "
        "each cell whose latest commit its ack does not cover; a worker then processes them. "
        "Safe to repeat; registration and worker start run it when it is owed.",
    )
    add_store_option(catch)
    add_oracle_option(catch)
    catch.add_argument("name", help="the observer's name")
    catch.add_argument("--quiet", action="store_true", help="no progress lines")
    catch.set_defaults(func=run_catch_up)


def _print(results: dict[str, Any], as_json: bool) -> None:
    for name, mark in sorted(results.items()):
        if as_json:
            print(json.dumps(mark.as_dict(), sort_keys=True))
        else:
            print(
                mark.describe()
                if mark.held_by or mark.pending or mark.locks
                else f"observer {name!r}: watermark {mark.watermark} (lag {mark.lag_ms} ms)"
            )


def run_wait(args: argparse.Namespace) -> int:
    from percolator.watermark import WatermarkTimeoutError

    with connect_existing(args.store, args.oracle) as client:
        try:
            results = client.wait_for(args.ts, args.observer, timeout=args.timeout)
        except WatermarkTimeoutError as exc:
            print(f"percolator wait: {exc}", file=sys.stderr)
            return 3
    _print(results, args.json)
    return 0


def run_watermarks(args: argparse.Namespace) -> int:
    from percolator.watermark import watermarks

    with connect_existing(args.store, args.oracle) as client:
        results = watermarks(client.store, client.oracle, args.observer)
    _print(results, args.json)
    return 0


def run_catch_up(args: argparse.Namespace) -> int:
    from percolator.observers.catchup import CatchUpReport, catch_up

    def progress(report: CatchUpReport) -> None:
        if not args.quiet:
            print(f"scanned {report.scanned} cells, {report.owed} owed", file=sys.stderr)

    with connect_existing(args.store, args.oracle) as client:
        report = catch_up(client, args.name, progress=progress)
    print(
        f"caught up {report.observer}: {report.owed} of {report.scanned} cells notified"
        + (f" at {report.notify_ts}, oldest change owed {report.oldest}" if report.owed else "")
    )
    return 0

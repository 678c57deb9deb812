"""``percolator gc``: one garbage-collection pass (see percolator/protocol/gc.py)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from percolator.command_options import (
    add_oracle_option,
    add_store_option,
    connect_existing,
    float_option,
)
from percolator.protocol.gc import MAX_LIFE_TIME_MS

#: ``--life-time``: seconds, finite, from 0 up to the timestamps' physical range (whole
#: seconds, so the milliseconds handed to the pass never exceed MAX_LIFE_TIME_MS); a larger
#: value is a usage error naming the range, before the store is opened.
MAX_LIFE_TIME_S = MAX_LIFE_TIME_MS // 1000
LIFE_TIME = float_option(0, MAX_LIFE_TIME_S)


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "gc",
        help="remove versions older than the GC life time",
        description="Resolve locks below the safe point, advance the safe point and delete "
        "versions below it.  Reads below the safe point fail with a clear error afterwards.  "
        "A store that does not exist is an error (nothing is created).",
    )
    add_store_option(parser)
    add_oracle_option(parser)
    parser.add_argument(
        "--life-time",
        type=LIFE_TIME,
        default=600.0,
        metavar="SECONDS",
        help=f"keep versions younger than this, at most {MAX_LIFE_TIME_S} s (about 1115 "
        "years; default %(default)s s)",
    )
    parser.add_argument("--table", action="append", help="only this table (repeatable)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    with connect_existing(args.store, args.oracle) as client:
        quiet = args.json

        def progress(message: str) -> None:
            if not quiet:
                print(f"gc: {message}", file=sys.stderr, flush=True)

        report = client.gc(
            life_time_ms=int(args.life_time * 1000), tables=args.table, progress=progress
        )
    if args.json:
        print(json.dumps(report.__dict__, sort_keys=True))
    else:
        print(report.summary())
    return 0

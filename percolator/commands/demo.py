"""``percolator demo``: the whole engine on a generated corpus, in one command.

Starts a timestamp oracle, backfills a generated corpus with Spark, runs the example
observers to quiescence, changes a fraction of the documents while printing each change's
derived updates as they land, recomputes everything with Spark and checks that both agree.
The steps are described in :mod:`percolator.demo.steps`.

Output: a header per step, progress bars on the long ones, a summary table and the path of
a PNG chart.  ``--json`` prints the summary as JSON on stdout (everything else goes to
stderr then).  Exit code 0 when the incremental tables equal the recompute and the
reference, 1 when they differ, 2 for bad configuration (one line), 130 when interrupted.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from percolator.demo import DEFAULT_DOCUMENTS, DEFAULT_MASTER, DEFAULT_WORK_DIR


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "demo",
        help="the whole pipeline on a generated corpus: Spark backfill, observers, live "
        "changes, Spark recompute, compare (embedded store by default)",
        description="Start a timestamp oracle, backfill a generated corpus with Spark, run "
        "the example observers to quiescence, change a fraction of the documents and watch "
        "the incremental updates land, then recompute everything with Spark and check both "
        "agree.  Needs the 'demo' extra (pyspark, matplotlib) and Java 17+.",
    )
    parser.add_argument(
        "--documents", type=int, default=DEFAULT_DOCUMENTS, metavar="N",
        help="corpus size (default %(default)s)",
    )
    parser.add_argument(
        "--change-fraction", type=float, default=0.01, metavar="F",
        help="fraction of the documents changed live (default %(default)s)",
    )
    parser.add_argument("--seed", type=int, default=7, help="corpus seed (default %(default)s)")
    parser.add_argument(
        "--threads", type=int, default=4, help="worker threads (default %(default)s)"
    )
    parser.add_argument(
        "--master", default=DEFAULT_MASTER,
        help="Spark master (default %(default)s; local[*] uses every core)",
    )
    parser.add_argument(
        "--store", default=None,
        help="run on this store instead of a new embedded one, e.g. "
        "hbase://HOST:PORT?prefix=demo_; it must be an empty namespace (a new prefix)",
    )
    parser.add_argument(
        "--oracle", default=None,
        help="use this running oracle service (grpc://HOST:PORT) instead of starting one; "
        "it must serve the --store given",
    )
    parser.add_argument(
        "--work-dir", default=DEFAULT_WORK_DIR, metavar="DIR",
        help="where the run directory (corpus, logs, chart, embedded store) is created; "
        "it is kept (default ./%(default)s)",
    )
    parser.add_argument(
        "--chart", metavar="PATH", help="PNG chart path (default: latency.png in the run directory)"
    )
    parser.add_argument(
        "--clean", action="store_true",
        help="remove the store data the demo wrote when it ends (the embedded store, or the "
        "tables it created on --store); the corpus, logs and chart stay",
    )
    parser.add_argument(
        "--json", action="store_true", help="print the summary as JSON on stdout"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from percolator.demo.report import as_json, print_summary
    from percolator.demo.steps import DemoOptions, run_demo

    options = DemoOptions(
        documents=args.documents,
        change_fraction=args.change_fraction,
        seed=args.seed,
        threads=args.threads,
        master=args.master,
        store=args.store,
        oracle=args.oracle,
        work_dir=args.work_dir,
        chart=args.chart,
        clean=args.clean,
    )
    out = sys.stderr if args.json else sys.stdout
    report = run_demo(options, out)
    print_summary(report, out)
    if args.json:
        print(json.dumps(as_json(report), indent=2, sort_keys=True))
    return 0 if report.ok else 1

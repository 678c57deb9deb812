"""``percolator worker``, ``percolator notifications list|retry`` and
``percolator observers list|register|unregister|forget``: one ``register_*`` function per command,
each an entry point of the ``percolator.commands`` group (see pyproject.toml).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

from percolator.observers.options import MAX_SCANNERS, MAX_THREADS
from percolator.observers.partition import MAX_KEY_GROUPS

import percolator
from percolator import config
from percolator.command_options import (
    PORT,
    POSITIVE_INT,
    SECONDS,
    add_oracle_option,
    add_store_option,
    connect_existing,
    int_option,
    row_key,
)
from percolator.errors import ConfigError, StoreNotFoundError


def register_worker(subparsers: Any) -> None:
    worker: argparse.ArgumentParser = subparsers.add_parser(
        "worker",
        help="run observers on notifications",
        description="Scan the notify family of the observed tables and run the observers "
        "(plugins of the 'percolator.observers' entry-point group).  SIGTERM or Ctrl-C "
        "shuts down gracefully.",
    )
    add_store_option(worker)
    add_oracle_option(worker)
    worker.add_argument(
        "--observer",
        action="append",
        metavar="NAME",
        help="run this observer plugin (repeatable; default: every installed one, and none "
        "installed is an error)",
    )
    worker.add_argument(
        "--create",
        action="store_true",
        help="create the store if it does not exist yet (default: the store must already "
        "hold a deployment, so a mistyped path or HBase prefix is an error, not a new store)",
    )
    worker.add_argument(
        "--observers-from",
        action="append",
        metavar="MODULE:ATTR",
        help="run the observers MODULE:ATTR names (an observer, @observer function, class, "
        "factory, or a list of them), imported with the current directory on the path; "
        "repeatable; with it, installed plugins run only if named with --observer",
    )
    worker.add_argument(
        "--threads",
        type=int_option(1, MAX_THREADS),
        default=None,
        help=f"observer runs in parallel, at most {MAX_THREADS} (default: 1 on the embedded "
        "store, where more threads cost CPU and add nothing; 4 on HBase)",
    )
    worker.add_argument(
        "--scanners",
        type=int_option(1, MAX_SCANNERS),
        default=1,
        help=f"scanner threads, at most {MAX_SCANNERS} (default %(default)s)",
    )
    worker.add_argument(
        "--batch",
        type=POSITIVE_INT,
        default=None,
        help="run up to this many queued notifications of one observer in one transaction "
        "(default 32; only what has piled up: an idle worker runs each change alone; "
        "1: one transaction per notification)",
    )
    worker.add_argument(
        "--partitioned",
        action="store_true",
        help="lease key groups of the notify space with the other workers and run only "
        "their notifications (fenced); default: random scanning of everything",
    )
    worker.add_argument(
        "--key-groups",
        type=int_option(1, MAX_KEY_GROUPS),
        default=None,
        help=f"key groups, at most {MAX_KEY_GROUPS} (the same in every worker; default 64); "
        "with --partitioned only",
    )
    worker.add_argument(
        "--lease-ms",
        type=int_option(100),
        default=None,
        help="how long a worker's key groups stay leased (default 10000); with --partitioned only",
    )
    worker.add_argument(
        "--failure-limit",
        type=POSITIVE_INT,
        default=5,
        help="failures in a row after which a notification is parked (default %(default)s)",
    )
    worker.add_argument(
        "--run-timeout",
        type=SECONDS,
        default=600.0,
        metavar="SECONDS",
        help="a run longer than this is logged as stuck and makes /healthz fail, so that the "
        "worker is restarted (0: never; default %(default)s)",
    )
    worker.add_argument(
        "--drain-timeout",
        type=SECONDS,
        default=30.0,
        metavar="SECONDS",
        help="on shutdown, how long runs in flight may finish before they roll back",
    )
    worker.add_argument(
        "--metrics-port",
        type=PORT,
        default=None,
        help="serve Prometheus metrics at http://HOST:PORT/metrics (0: any free port)",
    )
    worker.add_argument("--metrics-host", default="127.0.0.1")
    # --log-level and --log-format are the command line's global options (percolator.cli);
    # a worker logs at INFO unless told otherwise.
    worker.set_defaults(func=run_worker, default_log_level="INFO")


def register_notifications(subparsers: Any) -> None:
    notifications: argparse.ArgumentParser = subparsers.add_parser(
        "notifications",
        help="list or retry parked notifications",
        description="Notifications whose observer kept failing are parked; list them, fix "
        "the cause, and retry them.",
    )
    actions = notifications.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    listing = actions.add_parser("list", help="list parked (or pending) notifications")
    retry = actions.add_parser("retry", help="re-queue parked notifications")
    for parser in (listing, retry):
        add_store_option(parser)
        add_oracle_option(parser)
        parser.add_argument("--observer", help="only notifications of this observer")
        parser.add_argument("--table", help="only notifications of this table")
        parser.add_argument("--json", action="store_true", help="one JSON object per line")
    listing.add_argument(
        "--pending",
        action="store_true",
        help="list notifications waiting to be processed (needs --table) instead of parked",
    )
    listing.add_argument("--limit", type=POSITIVE_INT, default=None, help="at most this many rows")
    retry.add_argument(
        "--row",
        type=row_key,
        help="only this row (the argument's bytes: UTF-8 for text; --row-hex for any bytes)",
    )
    retry.add_argument("--row-hex", help="only this row, hex-encoded")
    retry.add_argument("--column", help="only this column")
    retry.add_argument(
        "--all", action="store_true", help="retry every parked notification that matches"
    )
    listing.set_defaults(func=run_list)
    retry.set_defaults(func=run_retry)


def register_observers(subparsers: Any) -> None:
    observers: argparse.ArgumentParser = subparsers.add_parser(
        "observers",
        help="list, register or unregister observed columns",
        description="Workers register their observers' columns when they start; these "
        "commands do it by hand (e.g. before loading data that must be observed).",
    )
    observer_actions = observers.add_subparsers(dest="action", metavar="ACTION")
    observer_actions.required = True
    registered = observer_actions.add_parser("list", help="list observed columns")
    register_cmd = observer_actions.add_parser(
        "register",
        help="register observer plugins' columns; returns once every writer notifies them",
    )
    unregister_cmd = observer_actions.add_parser(
        "unregister", help="stop notifying the columns of an observer"
    )
    forget_cmd = observer_actions.add_parser(
        "forget",
        help="delete the acks of an unregistered observer removed for good (or renamed)",
    )
    for parser in (registered, register_cmd, unregister_cmd, forget_cmd):
        add_store_option(parser)
        add_oracle_option(parser)
    registered.add_argument("--json", action="store_true", help="one JSON object per line")
    register_cmd.add_argument(
        "--observer", action="append", metavar="NAME", required=True, help="(repeatable)"
    )
    register_cmd.add_argument(
        "--create", action="store_true", help="create the store if it does not exist yet"
    )
    unregister_cmd.add_argument("name", help="the observer's name")
    forget_cmd.add_argument("name", help="the observer's name (must not be registered)")
    forget_cmd.set_defaults(func=run_observers_forget)
    registered.set_defaults(func=run_observers_list)
    register_cmd.set_defaults(func=run_observers_register)
    unregister_cmd.set_defaults(func=run_observers_unregister)


@contextlib.contextmanager
def _connect_existing_or_hint(store: str, oracle: str | None) -> Iterator[percolator.Client]:
    """:func:`connect_existing`, its error saying how to create a store on purpose."""
    with contextlib.ExitStack() as stack:
        try:
            client = stack.enter_context(connect_existing(store, oracle))
        except StoreNotFoundError as exc:
            raise StoreNotFoundError(f"{exc} (pass --create to make a new store)") from None
        yield client


def _print_ready(message: str) -> None:
    print(message, flush=True)


def _partition_options(args: argparse.Namespace) -> tuple[int, int]:
    """``(key_groups, lease_ms)``; given without --partitioned they are refused, where they
    would be ignored (a worker the operator believes partitioned, scanning everything)."""
    from percolator.observers.worker import WorkerOptions

    given = [
        flag
        for flag, value in (("--key-groups", args.key_groups), ("--lease-ms", args.lease_ms))
        if value is not None
    ]
    if given and not args.partitioned:
        raise ConfigError(f"{' and '.join(given)} apply to --partitioned workers only")
    key_groups = WorkerOptions.key_groups if args.key_groups is None else args.key_groups
    lease_ms = WorkerOptions.lease_ms if args.lease_ms is None else args.lease_ms
    return key_groups, lease_ms


def run_worker(args: argparse.Namespace) -> int:
    from percolator.observers.api import check_observer_set
    from percolator.observers.options import DEFAULT_BATCH_SIZE
    from percolator.observers.plugins import GROUP as PLUGIN_GROUP
    from percolator.observers.plugins import LoadResult, load_from_path, load_observers
    from percolator.observers.worker import Worker, WorkerOptions

    import percolator

    key_groups, lease_ms = _partition_options(args)
    options = WorkerOptions(
        threads=args.threads,
        scanners=args.scanners,
        failure_limit=args.failure_limit,
        drain_timeout_s=args.drain_timeout,
        run_timeout_s=args.run_timeout,
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
        partitioned=args.partitioned,
        key_groups=key_groups,
        lease_ms=lease_ms,
        batch_size=DEFAULT_BATCH_SIZE if args.batch is None else args.batch,
    )
    # --observers-from: observers imported from a module path, to try code without
    # packaging it; then only the plugins named with --observer run beside them.
    tables = config.observer_tables(getattr(args, "config_path", None))
    from_paths = [o for spec in args.observers_from or [] for o in load_from_path(spec, tables)]
    if args.observers_from and args.observer is None:
        loaded = LoadResult()
    else:
        loaded = load_observers(args.observer, configs=tables)
    if args.observer is None and not from_paths and not loaded.observers and not loaded.errors:
        # Nothing is installed: the engine ships no observers (the example pipeline is a
        # package of its own), and a worker with nothing to run is a deployment mistake.
        raise ConfigError(
            f"no observer plugin is installed (entry-point group {PLUGIN_GROUP!r}); install a "
            "package that declares some, e.g. pip install -e examples/docpipeline, or name "
            "a module with --observers-from MODULE:ATTR"
        )
    missing = [error for error in loaded.errors if not error.installed]
    if missing:
        # A name given that no installed package declares (a typo): the operator's to fix
        # now, not a worker that quietly runs without it.  A plugin that is installed but
        # broken is reported and the others run (docs/observers.md).
        raise ConfigError("; ".join(str(error) for error in missing))
    for plugin_error in loaded.errors:
        print(f"percolator worker: {plugin_error}", file=sys.stderr, flush=True)
    observers = [*from_paths, *loaded.observers]
    if not observers:
        raise ConfigError("no observer plugin could be loaded; nothing to run")
    given = [o.name for o in observers]
    for name in sorted(set(tables) - set(given)):
        print(
            f"percolator worker: [worker.observers.{name}] configures no observer this "
            "worker runs; ignored",
            file=sys.stderr,
            flush=True,
        )
    twice = sorted({n for n in given if given.count(n) > 1})
    if twice:
        raise ConfigError(f"observer name(s) {twice} given twice (--observers-from, --observer)")
    # Before the store is opened: observers that cannot run together leave no store.
    check_observer_set(observers)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    # Without --create the store must already hold a deployment: a typo in a path or an
    # HBase prefix would otherwise make a new, empty one that the worker watches forever.
    opened = (
        percolator.connect(args.store, oracle=args.oracle)
        if args.create
        else _connect_existing_or_hint(args.store, args.oracle)
    )
    with opened as client:
        # Fail fast on a wrong store or oracle address: an idle worker would otherwise
        # only notice at its first notification, maybe hours later.
        with client.snapshot():
            pass
        worker = Worker(client, observers, options)
        worker.start()
        for name, message in worker.errors:
            print(f"percolator worker: observer {name!r} left out: {message}", file=sys.stderr)
        names = ",".join(o.name for o in worker.observers)
        port = worker.metrics_port
        _print_ready(
            f"worker ready id={worker.worker_id} observers={names}"
            + (f" metrics=http://{args.metrics_host}:{port}/metrics" if port is not None else "")
        )
        try:
            # A timed wait keeps the main thread responsive to signals on every platform.
            while not stop.wait(0.5):
                pass
        finally:
            worker.stop()
        _print_ready("worker stopped")
    return 0


def _select(args: argparse.Namespace) -> tuple[str | None, str | None]:
    return args.observer, args.table


def run_list(args: argparse.Namespace) -> int:
    from percolator.observers.parking import ParkingLot, pending

    with connect_existing(args.store, args.oracle) as client:
        if args.pending:
            if not args.table:
                raise ConfigError("--pending needs --table")
            rows = pending(client, args.table, limit=args.limit)
            for row, column, notify_ts in rows:
                if args.json:
                    doc = {
                        "table": args.table,
                        "row": row.decode("utf-8", "backslashreplace"),
                        "row_hex": row.hex(),
                        "column": column,
                        "notify_ts": notify_ts,
                    }
                    print(json.dumps(doc, sort_keys=True))
                else:
                    print(
                        f"{args.table}\t{row.decode('utf-8', 'backslashreplace')}\t{column}"
                        f"\t{notify_ts}"
                    )
            return 0
        observer, table = _select(args)
        records = ParkingLot(client).records(observer=observer, table=table)
        if args.limit is not None:
            records = records[: args.limit]
        for record in records:
            if args.json:
                print(json.dumps(record.as_dict(), sort_keys=True))
            else:
                shown = record.row.decode("utf-8", "backslashreplace")
                error = record.last_error.splitlines()[-1] if record.last_error else ""
                print(
                    f"{record.observer}\t{record.table}\t{shown}\t{record.column}\t"
                    f"failures={record.failures}\t{error}"
                )
        if not args.json:
            print(f"{len(records)} parked notification(s)", file=sys.stderr)
        if not records:
            _say_unknown_filters(client, observer, table)
    return 0


def _say_unknown_filters(
    client: percolator.Client, observer: str | None, table: str | None
) -> None:
    """When a filter matched nothing: say if it names no observer or table at all (a typo
    looks like "nothing parked" otherwise)."""
    from percolator.notifications import registrations

    if observer is not None:
        registered = {reg.observer for reg in registrations(client.store).values()}
        if observer not in registered:
            print(f"note: no observer {observer!r} is registered", file=sys.stderr)
    if table is not None and not client.store.table_exists(table):
        print(f"note: table {table!r} does not exist", file=sys.stderr)


def run_retry(args: argparse.Namespace) -> int:
    from percolator.observers.parking import ParkingLot

    if args.row is not None and args.row_hex is not None:
        raise ConfigError("give --row or --row-hex, not both")
    row: bytes | None = None
    if args.row is not None:
        row = args.row
    elif args.row_hex is not None:
        try:
            row = bytes.fromhex(args.row_hex)
        except ValueError:
            raise ConfigError(f"--row-hex {args.row_hex!r} is not hexadecimal") from None
    if not args.all and row is None:
        raise ConfigError("name the notification (--row/--row-hex [--column]) or pass --all")
    with connect_existing(args.store, args.oracle) as client:
        lot = ParkingLot(client)
        observer, table = _select(args)
        chosen = [
            r
            for r in lot.records(observer=observer, table=table)
            if (row is None or r.row == row) and (args.column is None or r.column == args.column)
        ]
        done = lot.retry(chosen)
        for record in done:
            if args.json:
                print(json.dumps(record.as_dict(), sort_keys=True))
            else:
                print(
                    f"retried {record.observer}\t{record.table}\t"
                    f"{record.row.decode('utf-8', 'backslashreplace')}\t{record.column}"
                )
        if done:
            # The notification is back, but only a registered observer runs it.
            from percolator.observers.api import registrations

            registered = {reg.observer for reg in registrations(client.store).values()}
            for name in sorted({r.observer for r in done} - registered):
                print(
                    f"note: observer {name!r} is not registered: its retried notifications "
                    "run only once it is registered again",
                    file=sys.stderr,
                )
        else:
            print("no parked notification matched", file=sys.stderr)
            _say_unknown_filters(client, observer, table)
            return 1
    return 0


def run_observers_list(args: argparse.Namespace) -> int:
    from percolator.observers.api import registrations

    with connect_existing(args.store, args.oracle) as client:
        found = registrations(client.store)
    for (table, column), reg in sorted(found.items()):
        if args.json:
            doc = {"table": table, "column": column, "observer": reg.observer, "weak": reg.weak}
            print(json.dumps(doc, sort_keys=True))
        else:
            print(f"{table}\t{column}\t{reg.observer}" + ("\tweak" if reg.weak else ""))
    return 0


def run_observers_register(args: argparse.Namespace) -> int:
    from percolator.observers.api import check_observer_set, register_observers
    from percolator.observers.plugins import PluginError, load_observers

    import percolator

    loaded = load_observers(args.observer)
    if loaded.errors:
        raise ConfigError("; ".join(str(e) for e in loaded.errors))
    check_observer_set(loaded.observers)  # before --create makes a store
    opened = (
        percolator.connect(args.store, oracle=args.oracle)
        if args.create
        else _connect_existing_or_hint(args.store, args.oracle)
    )
    with opened as client:
        # A wrong or dead oracle fails here, before setup() creates tables and the
        # registration claims columns that no catch-up could then be run for.
        with client.snapshot():
            pass
        for observer in loaded.observers:
            try:
                observer.setup(client)
            except Exception as exc:  # the plugin's code: name it, register nothing
                raise PluginError(
                    observer.name, f"setup() failed: {type(exc).__name__}: {exc}"
                ) from exc
        register_observers(client, loaded.observers)
    for observer in loaded.observers:
        print(f"registered {observer.name}: {observer.table} {', '.join(observer.columns)}")
    return 0


def _check_name(name: str) -> None:
    from percolator.observers.api import _NAME

    # The rule registration checks names with (check_observer): a name it would refuse
    # was never registered, so it is a typo, not an observer that watches nothing.
    if not _NAME.match(name):
        raise ConfigError(
            f"observer name {name!r} is invalid: use letters, digits, '_', '-', '.', "
            "starting with a letter or digit (at most 100 characters)"
        )


def run_observers_forget(args: argparse.Namespace) -> int:
    from percolator.observers.api import forget_observer

    _check_name(args.name)

    def table_done(table: str, deleted: int) -> None:
        # Each table's lock family is scanned whole: say how far a long run has come.
        print(f"{table}: {deleted} ack(s) deleted", file=sys.stderr, flush=True)

    with connect_existing(args.store, args.oracle) as client:
        deleted = forget_observer(client, args.name, progress=table_done)
    print(f"forgot observer {args.name}: {deleted} ack(s) deleted")
    if not deleted:
        # Success either way (forgetting is idempotent), but a misspelt name finds no acks too.
        print(
            f"no ack of observer {args.name!r} was found in any table; if it has run, "
            "check the name's spelling",
            file=sys.stderr,
        )
    return 0


def run_observers_unregister(args: argparse.Namespace) -> int:
    from percolator.observers.api import unregister_observer

    _check_name(args.name)
    with connect_existing(args.store, args.oracle) as client:
        removed = unregister_observer(client, args.name)
    for table, column in removed:
        print(f"unregistered {args.name}: {table} {column}")
    if not removed:
        print(f"observer {args.name!r} watches no column", file=sys.stderr)
        return 1
    return 0

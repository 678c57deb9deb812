"""``percolator hbase start|stop|status|classpath``: a real local HBase for development.

    percolator hbase start [--dir DIR] [--port N] [--heap SIZE] [--foreground] [--timeout S]
    percolator hbase stop [--dir DIR] [--grace S]
    percolator hbase status [--dir DIR] [--json]
    percolator hbase classpath

``start`` prints the store URL (``hbase://127.0.0.1:PORT``) alone on stdout, so
``STORE=$(percolator hbase start)`` works; progress and hints go to stderr.  Exit codes:
0 success, 2 an error of the project's tree (printed as one line by ``percolator.cli``);
``status`` returns 0 when HBase answers, 1 when its JVMs run but it does not answer (still
starting, or broken), 3 when nothing runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import shlex
from pathlib import Path

from percolator.testing.localhbase.launcher import (
    DEFAULT_MASTER_HEAP,
    DEFAULT_START_TIMEOUT_S,
    DEFAULT_STOP_GRACE_S,
    HBaseLauncherError,
    LocalHBase,
    ensure_classpath,
    hbase_version,
    signals_raise_keyboard_interrupt,
    stderr_progress,
)

DEFAULT_DIR = ".hbase-local"
#: below this a standalone HBase (master and region server in one JVM) does not start
MIN_HEAP_MB = 256

STATUS_SERVING = 0
STATUS_NOT_SERVING = 1
STATUS_NOT_RUNNING = 3


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port must be between 1 and 65535, got {port}")
    return port


def _heap(text: str) -> str:
    """A JVM heap size as ``-Xmx`` takes it, in megabytes or gigabytes (``768m``, ``4g``)."""
    match = re.fullmatch(r"([1-9][0-9]*)([mMgG])", text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(
            f"not a heap size: {text!r} (a whole number of megabytes or gigabytes: 768m, 4g)"
        )
    size, unit = int(match.group(1)), match.group(2).lower()
    if size * (1024 if unit == "g" else 1) < MIN_HEAP_MB:
        raise argparse.ArgumentTypeError(
            f"heap {text!r} is below HBase's minimum of {MIN_HEAP_MB}m"
        )
    return f"{size}{unit}"


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"seconds must not be negative, got {value}")
    return value


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``hbase`` command and its actions to the ``percolator`` parser."""
    parser = subparsers.add_parser(
        "hbase",
        help="run a real local HBase (standalone + Thrift gateways) without Docker",
        description=(
            f"Run HBase {hbase_version()} in standalone mode with its Thrift-1 and Thrift-2 "
            "gateways on 127.0.0.1, from jars that Maven resolves into ~/.m2. Needs java (17+) "
            "and mvn. See docs/hbase-local.md."
        ),
    )
    actions = parser.add_subparsers(dest="hbase_action", metavar="ACTION")
    actions.required = True
    dir_help = f"work directory holding data, logs and the state file (default: {DEFAULT_DIR})"

    start = actions.add_parser(
        "start",
        help="start HBase and wait until it serves",
        description=(
            "Start HBase and wait until it answers through Thrift. Prints the store URL on "
            "stdout. Without --foreground, HBase keeps running after this command returns; "
            "stop it with `percolator hbase stop`. Data in DIR survives restarts; delete DIR "
            "for a fresh HBase."
        ),
    )
    start.add_argument("--dir", type=Path, default=Path(DEFAULT_DIR), help=dir_help)
    start.add_argument(
        "--port", type=_port, default=None, help="Thrift port (default: a free port)"
    )
    start.add_argument(
        "--thrift2-port",
        type=_port,
        default=None,
        metavar="PORT",
        help="Thrift-2 gateway port, for compare-and-sets that carry puts (default: a free "
        "port); the printed store URL names it",
    )
    start.add_argument(
        "--bind",
        default="127.0.0.1",
        metavar="HOST",
        help="address the Thrift gateways listen on (default %(default)s; 0.0.0.0 in a "
        "container serving others)",
    )
    start.add_argument(
        "--heap",
        type=_heap,
        default=DEFAULT_MASTER_HEAP,
        metavar="SIZE",
        help="heap of the JVM running the master and the region server (default "
        f"{DEFAULT_MASTER_HEAP}; loads of hundreds of thousands of rows want 2g or more)",
    )
    start.add_argument(
        "--foreground",
        action="store_true",
        help="stay in the foreground; Ctrl-C (or SIGTERM) stops HBase and exits",
    )
    start.add_argument(
        "--timeout",
        type=_seconds,
        default=DEFAULT_START_TIMEOUT_S,
        help=f"seconds to wait for HBase to serve (default: {DEFAULT_START_TIMEOUT_S:.0f})",
    )
    start.set_defaults(func=_start)

    stop = actions.add_parser(
        "stop",
        help="stop the HBase running from DIR (does nothing if none runs)",
        description=(
            "Send SIGTERM to the three JVMs (master, Thrift, Thrift-2), then SIGKILL to any "
            "still alive after the grace period. A standalone HBase takes 2 to 25 s to exit on "
            "SIGTERM (its regions are flushed and closed within the first seconds)."
        ),
    )
    stop.add_argument("--dir", type=Path, default=Path(DEFAULT_DIR), help=dir_help)
    stop.add_argument(
        "--grace",
        type=_seconds,
        default=DEFAULT_STOP_GRACE_S,
        help=f"seconds to wait before SIGKILL (default: {DEFAULT_STOP_GRACE_S:.0f})",
    )
    stop.set_defaults(func=_stop)

    status = actions.add_parser(
        "status",
        help="show whether HBase runs from DIR and answers",
        description="Exit code: 0 serving, 1 running but not answering, 3 not running.",
    )
    status.add_argument("--dir", type=Path, default=Path(DEFAULT_DIR), help=dir_help)
    status.add_argument("--json", action="store_true", help="print the status as JSON")
    status.set_defaults(func=_status)

    classpath = actions.add_parser(
        "classpath",
        help="resolve HBase's jars with Maven if needed; print the classpath file's path",
    )
    classpath.set_defaults(func=_classpath)


def _start(args: argparse.Namespace) -> int:
    hbase = LocalHBase(
        args.dir,
        thrift_port=args.port,
        thrift2_port=args.thrift2_port,
        progress=stderr_progress,
        thrift_bind=args.bind,
        master_heap=args.heap,
    )
    if not args.foreground:
        url = hbase.start(timeout=args.timeout)
        hbase.detach()
        print(url, flush=True)
        stderr_progress(
            f"running in the background; stop it with: percolator hbase stop --dir "
            f"{shlex.quote(str(hbase.workdir))}"
        )
        return 0
    with signals_raise_keyboard_interrupt():
        url = hbase.start(timeout=args.timeout)
        print(url, flush=True)
        stderr_progress("running in the foreground; press Ctrl-C to stop")
        try:
            exited = hbase.wait()
        except KeyboardInterrupt:
            # The normal way to end a foreground instance.  A second Ctrl-C during the stop
            # kills the JVMs at once and ends with "interrupted" (exit code 130).
            hbase.stop()
            stderr_progress("stopped")
            return 0
        hbase.stop()
        raise HBaseLauncherError(f"{exited}; see the logs in {hbase.log_dir}")


def _stop(args: argparse.Namespace) -> int:
    hbase = LocalHBase(args.dir, progress=stderr_progress)
    if hbase.stop(grace_s=args.grace):
        stderr_progress(f"stopped HBase in {hbase.workdir}")
    else:
        stderr_progress(f"no HBase running from {hbase.workdir}")
    return 0


def _status(args: argparse.Namespace) -> int:
    status = LocalHBase(args.dir, progress=None).status()
    if args.json:
        print(json.dumps(dataclasses.asdict(status), indent=2))
    elif not status.running:
        print(f"no HBase running from {status.workdir}")
    else:
        state = "serving" if status.serving else f"not answering ({status.detail})"
        print(f"HBase in {status.workdir}: {state}")
        print(f"  url:     {status.url}")
        print(
            f"  master:  pid {status.master_pid} ({'alive' if status.master_alive else 'gone'}),"
            f" ZooKeeper port {status.zk_port}"
        )
        print(f"  thrift:  pid {status.thrift_pid} ({'alive' if status.thrift_alive else 'gone'})")
        if status.thrift2_port is not None:
            print(
                f"  thrift2: pid {status.thrift2_pid} "
                f"({'alive' if status.thrift2_alive else 'gone'}), port {status.thrift2_port}"
            )
        print(f"  logs:    {', '.join(status.logs)}")
    if status.serving:
        return STATUS_SERVING
    return STATUS_NOT_SERVING if status.running else STATUS_NOT_RUNNING


def _classpath(args: argparse.Namespace) -> int:
    print(ensure_classpath(stderr_progress))
    return 0

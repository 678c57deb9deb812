"""Every benchmark, one command: the performance report ``bench/results.md``.

    bench/run_all                      # full run on a freshly started local HBase (~30-40 min)
    bench/run_all --quick              # smoke run: tiny sizes, one repeat (a few minutes)
    bench/run_all --store 'hbase://127.0.0.1:19090?prefix=runall_'   # an HBase already running
    bench/run_all --only txn,lock      # some steps only (the others show as not measured)

What it does, in order:

1. starts a local HBase (percolator.testing.localhbase, fresh work directory, free ports) unless
   ``--store`` names one; records the machine (CPU, cores, memory, OS, Python, Java, HBase,
   load average, date, source revision);
2. starts one timestamp oracle server on that HBase, used by every engine benchmark;
3. runs each benchmark as its own process with ``--json`` (each in its own table prefix, so
   nothing collides and everything is dropped at the end): raw store baselines
   (store_bench), P1 (oracle_bench), P1c-P4 (txn_bench, on HBase and embedded), P5-P6
   (observer_bench, the scan also embedded), P7-P8 (spark_bench), P9 (lock_bench, HBase and
   embedded), then the scaling runs (transactions vs client threads and value size; observer
   throughput and latency vs worker threads and processes, measured by this module's
   ``observer-scaling`` command);
4. for every missed target, profiles the missing operation in a separate process (this
   module's ``profile`` command: store round trips from the store's counters, timestamps,
   time per operation, top functions under cProfile);
5. stops the oracle, drops every table it created and stops HBase (also on Ctrl-C or
   SIGTERM), then writes ``bench/results.md`` and ``bench/plots/*.png`` (bench/report.py).

Each measurement is repeated ``--repeats`` times inside its benchmark (medians and ranges
are reported).  A benchmark that fails is reported as not measured, with its log; the exit
status is then 1.  The work directory (``--workdir``, default a new temporary directory,
kept) holds every command's output and JSON, and ``raw.json``, from which
``python bench/report.py WORKDIR/raw.json`` rewrites the report.

Internal commands (run as processes by the harness; documented for debugging):

    python bench/run_all.py observer-scaling --store URL --oracle URL --threads T --workers W ...
    python bench/run_all.py profile --kind {txn,oracle,observer,scan,incremental,backfill,lock} ...
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import datetime as dt
import itertools
import json
import os
import platform
import pstats
import random
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

if __package__ in (None, ""):  # run as a script: make ``bench`` and the packages importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from percolator.errors import ConfigError
from percolator.timestamps import TimestampOracle

J = dict[str, Any]
ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"


# --------------------------------------------------------------------------- sizes


@dataclass(frozen=True)
class Sizes:
    """How big each benchmark runs.  ``repeats`` applies to every measurement."""

    repeats: int
    store_ops: int
    txn_ops: int
    txn_threads: int
    oracle_waiters: str
    oracle_seconds: float
    obs_threads: int
    obs_flood: int
    obs_step_seconds: float
    scan_base: int
    scan_growth: int
    scan_dirty: int
    scan_repeats: int
    spark_rows: int
    spark_docs: int
    lock_cells: int
    scaling_threads: tuple[int, ...]
    scaling_values: tuple[int, ...]
    #: (threads per process, processes)
    scaling_observers: tuple[tuple[int, int], ...]
    scaling_flood: int
    scaling_step_seconds: float
    profile_ops: int
    #: untimed store calls of each kind before the first measurement (a fresh HBase JVM
    #: is several times slower until its code is compiled)
    warmup_ops: int
    step_timeout_s: float

    @property
    def spark_rounds(self) -> int:
        # Rounds alternate a live worker and the single-threaded drain: each gets `repeats`.
        return 2 * self.repeats


QUICK = Sizes(
    repeats=1,
    store_ops=200,
    txn_ops=200,
    txn_threads=4,
    oracle_waiters="1,100,1000",
    oracle_seconds=0.5,
    obs_threads=8,
    obs_flood=200,
    obs_step_seconds=2.0,
    scan_base=100,
    scan_growth=100,
    scan_dirty=100,
    scan_repeats=5,
    spark_rows=2000,
    spark_docs=200,
    lock_cells=5,
    scaling_threads=(1, 2, 4, 8),
    scaling_values=(64, 1024, 16384),
    scaling_observers=((1, 1), (4, 1), (2, 2)),
    scaling_flood=100,
    scaling_step_seconds=2.0,
    profile_ops=30,
    warmup_ops=1000,
    step_timeout_s=900,
)

FULL = Sizes(
    repeats=3,
    store_ops=1000,
    txn_ops=1000,
    txn_threads=4,
    oracle_waiters="1,100,1000",
    oracle_seconds=1.5,
    obs_threads=8,
    obs_flood=1500,
    obs_step_seconds=8.0,
    scan_base=1000,
    scan_growth=100,
    scan_dirty=1000,
    scan_repeats=15,
    spark_rows=10_000,
    spark_docs=1000,
    lock_cells=5,
    scaling_threads=(1, 2, 4, 8),
    scaling_values=(64, 1024, 16384),
    scaling_observers=((1, 1), (2, 1), (4, 1), (8, 1), (1, 2), (2, 2), (4, 2)),
    scaling_flood=400,
    scaling_step_seconds=5.0,
    profile_ops=200,
    warmup_ops=5000,
    step_timeout_s=3600,
)

#: step groups, for --only / --skip
GROUPS = ("store", "txn", "oracle", "observers", "spark", "lock", "scaling", "profiles")


# --------------------------------------------------------------------------- namespaces


def with_prefix(url: str, extra: str) -> str:
    """``url`` with ``extra`` appended to its table prefix (HBase URLs)."""
    parts = urlsplit(url)
    options = dict(parse_qsl(parts.query, keep_blank_values=True))
    options["prefix"] = options.get("prefix", "") + extra
    return urlunsplit(parts._replace(query=urlencode(options)))


class Namespaces:
    """One table prefix per step, under a prefix unique to this run, so steps never see each
    other's tables and a shared HBase keeps nothing of ours: :meth:`drop_all` drops every
    table under every prefix handed out (and nothing else)."""

    def __init__(self, base_url: str, run_id: str) -> None:
        self.base_url = base_url
        self.run_id = run_id
        self.urls: list[str] = []

    def url(self, tag: str) -> str:
        url = with_prefix(self.base_url, f"ra{self.run_id}{tag}_")
        self.urls.append(url)
        return url

    def drop_all(self) -> None:
        from percolator.store import open_store

        for url in self.urls:
            try:
                with open_store(url) as store:
                    for table in store.list_tables():
                        store.drop_table(table)
            except Exception as exc:  # reported, and the other prefixes are still cleaned
                print(f"run_all: could not drop the tables under {url}: {exc}", file=sys.stderr)


# --------------------------------------------------------------------------- steps


@dataclass
class StepLog:
    name: str
    command: str
    seconds: float = 0.0
    load_before: float = 0.0
    load_after: float = 0.0
    status: str = "ok"
    error: str = ""
    log: str = ""


class Runner:
    """Runs steps as child processes, one at a time, each writing ``--json``; keeps a log of
    every step.  A failing step is recorded and the run goes on; Ctrl-C or SIGTERM stops the
    running child (SIGTERM, then SIGKILL after a grace period) and propagates."""

    def __init__(self, workdir: Path, timeout_s: float, verbose: bool) -> None:
        self.workdir = workdir
        self.timeout_s = timeout_s
        self.verbose = verbose
        self.steps: list[StepLog] = []
        self.runs: dict[str, J] = {}

    def run(self, name: str, argv: Sequence[str]) -> J | None:
        json_path = self.workdir / f"{name}.json"
        log_path = self.workdir / f"{name}.log"
        command = [sys.executable, *argv, "--json", str(json_path)]
        step = StepLog(name, shlex.join(command), log=str(log_path))
        step.load_before = os.getloadavg()[0]
        print(f"run_all: {name} ...", file=sys.stderr, flush=True)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
        started = time.monotonic()
        with open(log_path, "w", encoding="utf-8") as log:
            log.write(f"$ {step.command}\n")
            log.flush()
            proc = subprocess.Popen(
                command,
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                errors="replace",
            )
            copier = threading.Thread(target=self._copy, args=(proc, log), daemon=True)
            copier.start()
            try:
                returncode = proc.wait(timeout=self.timeout_s)
            except subprocess.TimeoutExpired:
                _stop(proc)
                step.status, step.error = "timeout", f"no result after {self.timeout_s:.0f} s"
                returncode = None
            except BaseException:
                _interrupt(proc)
                raise
            finally:
                copier.join(timeout=10)
        step.seconds = time.monotonic() - started
        step.load_after = os.getloadavg()[0]
        result: J | None = None
        if returncode is not None and returncode != 0:
            step.status = "failed"
            step.error = f"exit status {returncode}: {_last_line(log_path)}"
        elif returncode == 0:
            try:
                result = json.loads(json_path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                step.status, step.error = "failed", f"no JSON result ({exc})"
        if result is not None:
            self.runs[name] = result
        self.steps.append(step)
        print(
            f"run_all: {name} {step.status} in {step.seconds:.0f} s"
            + (f" - {step.error} (log: {log_path})" if step.error else ""),
            file=sys.stderr,
            flush=True,
        )
        return result

    def _copy(self, proc: subprocess.Popen[str], log: Any) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            log.flush()
            if self.verbose:
                sys.stderr.write(f"  | {line}")


def _stop(proc: subprocess.Popen[str], grace_s: float = 30.0) -> None:
    """SIGTERM, then SIGKILL after ``grace_s``: a benchmark gets the chance to stop what it
    started (workers, oracle servers, Spark) and drop its tables."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _interrupt(proc: subprocess.Popen[str]) -> None:
    """Stop a benchmark because the run was interrupted.  After Ctrl-C the benchmark got the
    terminal's SIGINT too and is cleaning up: give it time first.  Otherwise (run_all got
    SIGTERM) send it SIGINT, so its Python cleanup runs, then escalate."""
    try:
        proc.wait(timeout=5)
        return
    except subprocess.TimeoutExpired:
        pass
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        _stop(proc, grace_s=10)


def _last_line(path: Path) -> str:
    try:
        lines = [
            ln
            for ln in path.read_text(encoding="utf-8", errors="replace").splitlines()
            if ln.strip()
        ]
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""


# --------------------------------------------------------------------------- machine


def machine_info() -> J:
    """What the report needs to say about the machine (best effort, never raises)."""
    info: J = {
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else "?",
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu_model"] = line.split(":", 1)[1].strip()
                break
    info.setdefault("cpu_model", platform.processor() or platform.machine())
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                info["memory"] = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
    os_name = platform.platform()
    with contextlib.suppress(OSError):
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                os_name = f"{line.split('=', 1)[1].strip(chr(34))} ({platform.release()})"
    info["os"] = os_name
    try:
        from percolator.testing.localhbase.launcher import find_java

        java = find_java()
        info["java"] = f"{java.version} ({java.executable})"
    except Exception as exc:
        info["java"] = f"unknown ({exc})"
    try:
        import pyspark

        info["spark"] = f"PySpark {pyspark.__version__}"
    except ImportError:
        info["spark"] = "not installed"
    info["source"] = _source_revision()
    return info


def _source_revision() -> str:
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown (not a git checkout)"
    changed = len([ln for ln in status.splitlines() if ln.strip()])
    return f"git {head.strip()}" + (f" with {changed} modified file(s)" if changed else "")


# --------------------------------------------------------------------------- the run


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bench/run_all",
        description="Run every benchmark and write bench/results.md with plots.",
    )
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: tiny sizes, one repeat (a few minutes)"
    )
    parser.add_argument(
        "--repeats", type=int, help="repeats of every measurement (default: 3, or 1 with --quick)"
    )
    parser.add_argument(
        "--store",
        help="use this running HBase (hbase://HOST:PORT[?prefix=P]) instead of starting one",
    )
    parser.add_argument("--only", help=f"comma-separated step groups to run ({','.join(GROUPS)})")
    parser.add_argument("--skip", help="comma-separated step groups to leave out")
    parser.add_argument(
        "--profile-all", action="store_true", help="profile every target, not only the missed ones"
    )
    parser.add_argument("--out", default=str(BENCH / "results.md"), help="report (markdown)")
    parser.add_argument("--plots", default=str(BENCH / "plots"), help="directory of the PNGs")
    parser.add_argument(
        "--workdir", help="where logs and raw JSON go (default: a new temporary directory, kept)"
    )
    parser.add_argument("--verbose", action="store_true", help="show every step's output")
    return parser


def _groups(args: argparse.Namespace) -> set[str]:
    def parse(text: str | None) -> set[str]:
        names = {g.strip() for g in (text or "").split(",") if g.strip()}
        unknown = names - set(GROUPS)
        if unknown:
            raise ConfigError(f"unknown step group(s) {sorted(unknown)}; known: {list(GROUPS)}")
        return names

    chosen = parse(args.only) or set(GROUPS)
    return chosen - parse(args.skip)


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def run_all(argv: Sequence[str] | None) -> int:
    args = _parser().parse_args(argv)
    sizes = QUICK if args.quick else FULL
    if args.repeats is not None:
        if args.repeats < 1:
            print("run_all: --repeats must be >= 1", file=sys.stderr)
            return 2
        sizes = replace(sizes, repeats=args.repeats)
    try:
        groups = _groups(args)
    except ConfigError as exc:
        print(f"run_all: {exc}", file=sys.stderr)
        return 2
    if args.store and not args.store.lower().startswith("hbase://"):
        print(
            f"run_all: --store must be an HBase URL (hbase://HOST:PORT[?prefix=P]), got "
            f"{args.store!r}",
            file=sys.stderr,
        )
        return 2
    if args.store:
        problem = _check_store(args.store)
        if problem:
            print(f"run_all: {problem}", file=sys.stderr)
            return 2
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="run-all-")).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    run_id = uuid.uuid4().hex[:6]
    signal.signal(signal.SIGTERM, _raise_interrupt)
    started = time.monotonic()
    machine = machine_info()
    machine["load_before"] = list(os.getloadavg())
    raw: J = {
        "format": 1,
        "meta": {
            "command": "bench/run_all" + (" " + shlex.join(argv) if argv else ""),
            "mode": "quick" if args.quick else "full",
            "repeats": sizes.repeats,
            "sizes": asdict(sizes),
            "started": machine["date"],
            "workdir": str(workdir),
            "groups": sorted(groups),
        },
        "machine": machine,
        "runs": {},
        "series": {},
        "profiles": {},
        "steps": [],
    }
    runner = Runner(workdir, sizes.step_timeout_s, args.verbose)
    print(f"run_all: work directory {workdir}", file=sys.stderr)
    try:
        with contextlib.ExitStack() as stack:
            if args.store:
                base_url = args.store
                machine["hbase"] = (
                    "external Thrift-1 gateway (its version is not reported through Thrift-1)"
                )
            else:
                from percolator.testing.localhbase.launcher import LocalHBase, hbase_version

                hbase_dir = stack.enter_context(
                    tempfile.TemporaryDirectory(prefix="run-all-hbase-")
                )
                t0 = time.monotonic()
                try:
                    local = stack.enter_context(LocalHBase(hbase_dir))
                except ConfigError as exc:  # HBaseLauncherError: java, maven, ports, start-up
                    print(f"run_all: cannot start a local HBase: {exc}", file=sys.stderr)
                    return 2
                base_url = local.url
                machine["hbase"] = (
                    f"{hbase_version()} standalone + Thrift-1, started fresh "
                    f"for this run ({time.monotonic() - t0:.0f} s to start)"
                )
            machine["store"] = urlsplit(base_url)._replace(query="").geturl()
            namespaces = Namespaces(base_url, run_id)
            stack.callback(namespaces.drop_all)  # runs after the oracle stops, before HBase
            from bench.oracle_bench import oracle_server

            oracle_url = "grpc://" + stack.enter_context(oracle_server(namespaces.url("oracle")))
            machine["oracle"] = (
                "timestamp oracle server (percolator.oracle.cli serve) on the same HBase, "
                "one for the whole run"
            )
            _run_steps(runner, raw, sizes, groups, namespaces, oracle_url, args.profile_all)
    except KeyboardInterrupt:
        print("run_all: interrupted; everything it started has been stopped", file=sys.stderr)
        _save_raw(raw, runner, workdir, started)
        return 130
    raw["machine"]["load_after"] = list(os.getloadavg())
    _save_raw(raw, runner, workdir, started)
    from bench.report import write_report

    out = Path(args.out)
    targets = write_report(raw, out, Path(args.plots))
    for t in targets:
        print(f"  {t.tid:4} {t.verdict:12} {t.figure}", file=sys.stderr)
    failed = [s for s in runner.steps if s.status != "ok"]
    print(
        f"run_all: wrote {out} in {(time.monotonic() - started) / 60:.1f} min"
        + (
            f"; {len(failed)} step(s) failed: {', '.join(s.name for s in failed)}" if failed else ""
        ),
        file=sys.stderr,
    )
    return 1 if failed else 0


def _check_store(url: str) -> str:
    """An error message if ``url`` is not a reachable store, else ""."""
    from percolator.errors import PercolatorError
    from percolator.store import open_store

    try:
        open_store(url).close()
    except PercolatorError as exc:
        return f"cannot use --store {url}: {exc}"
    return ""


def _save_raw(raw: J, runner: Runner, workdir: Path, started: float) -> None:
    raw["runs"] = runner.runs
    raw["steps"] = [asdict(s) for s in runner.steps]
    raw["meta"]["duration_s"] = time.monotonic() - started
    (workdir / "raw.json").write_text(json.dumps(raw, indent=1, sort_keys=True) + "\n")


def _run_steps(
    runner: Runner,
    raw: J,
    sizes: Sizes,
    groups: set[str],
    ns: Namespaces,
    oracle_url: str,
    profile_all: bool,
) -> None:
    r = str(sizes.repeats)

    def py(name: str) -> str:
        return str(BENCH / f"{name}.py")

    def txn_args(store: str | None, threads: int, value_size: int) -> list[str]:
        return [
            py("txn_bench"),
            *(["--store", store] if store else []),
            "--oracle",
            oracle_url,
            "--ops",
            str(sizes.txn_ops),
            "--threads",
            str(threads),
            "--repeats",
            r,
            "--value-size",
            str(value_size),
        ]

    # Untimed: warms the HBase server (JIT) and the page cache before anything is measured.
    runner.run(
        "warmup",
        [
            py("store_bench"),
            "--store",
            ns.url("warm"),
            "--ops",
            str(sizes.warmup_ops),
            "--threads",
            str(sizes.txn_threads),
            "--repeats",
            "1",
            "--warmup",
            "0",
        ],
    )
    if "store" in groups:
        runner.run(
            "store",
            [
                py("store_bench"),
                "--store",
                ns.url("store"),
                "--ops",
                str(sizes.store_ops),
                "--threads",
                str(sizes.txn_threads),
                "--repeats",
                r,
            ],
        )
    if "txn" in groups:
        runner.run("txn_hbase", txn_args(ns.url("txn"), sizes.txn_threads, 64))
        runner.run("txn_embedded", txn_args(None, sizes.txn_threads, 64))
    if "oracle" in groups:
        runner.run(
            "oracle",
            [
                py("oracle_bench"),
                "--store",
                ns.url("orc"),
                "--waiters",
                sizes.oracle_waiters,
                "--repeats",
                r,
                "--seconds",
                str(sizes.oracle_seconds),
            ],
        )
    if "observers" in groups:
        scan = [
            "--scan-base",
            str(sizes.scan_base),
            "--scan-growth",
            str(sizes.scan_growth),
            "--dirty",
            str(sizes.scan_dirty),
            "--scan-repeats",
            str(sizes.scan_repeats),
        ]
        runner.run(
            "observers",
            [
                py("observer_bench"),
                "--store",
                ns.url("obs"),
                "--oracle",
                oracle_url,
                "--threads",
                str(sizes.obs_threads),
                "--flood",
                str(sizes.obs_flood),
                "--flood-repeats",
                r,
                "--step-seconds",
                str(sizes.obs_step_seconds),
                "--half-repeats",
                r,
                *scan,
            ],
        )
        runner.run(
            "scan_embedded", [py("observer_bench"), "--only", "scan", "--oracle", oracle_url, *scan]
        )
    if "spark" in groups:
        runner.run(
            "spark",
            [
                py("spark_bench"),
                "--store",
                ns.url("spark"),
                "--rows",
                str(sizes.spark_rows),
                "--docs",
                str(sizes.spark_docs),
                "--rounds",
                str(sizes.spark_rounds),
                "--repeats",
                r,
            ],
        )
    if "lock" in groups:
        lock = [py("lock_bench"), "--repeats", r, "--cells", str(sizes.lock_cells)]
        runner.run("lock_hbase", [*lock, "--store", ns.url("lock")])
        runner.run("lock_embedded", lock)
    if "scaling" in groups:
        _run_scaling(runner, raw, sizes, ns, oracle_url, txn_args)
    if "profiles" in groups:
        _run_profiles(runner, raw, sizes, ns, oracle_url, profile_all)


def _run_scaling(
    runner: Runner,
    raw: J,
    sizes: Sizes,
    ns: Namespaces,
    oracle_url: str,
    txn_args: Callable[[str | None, int, int], list[str]],
) -> None:
    series = raw["series"]
    # Transactions vs client threads and vs value size; the P2-P4 run is one of the points.
    main = "txn_hbase" if "txn_hbase" in runner.runs else None
    series["txn_threads"] = {}
    for threads in sizes.scaling_threads:
        name = f"txn_threads_{threads}"
        if threads == sizes.txn_threads and main:
            name = main
        else:
            runner.run(name, txn_args(ns.url(f"tt{threads}"), threads, 64))
        series["txn_threads"][str(threads)] = name
    series["value_size"] = {}
    for value in sizes.scaling_values:
        name = f"txn_value_{value}"
        if value == 64 and main:
            name = main
        else:
            runner.run(name, txn_args(ns.url(f"tv{value}"), sizes.txn_threads, value))
        series["value_size"][str(value)] = name
    # Observer throughput and latency vs worker threads and processes.  Latency is measured
    # at one fixed write rate for every setting: half the backlog throughput of the first
    # setting (the smallest), so that every setting can keep up with it.
    series["observers"] = []
    rate = "0.5x"
    for threads, workers in sizes.scaling_observers:
        name = f"obs_t{threads}_w{workers}"
        result = runner.run(
            name,
            [
                str(BENCH / "run_all.py"),
                "observer-scaling",
                "--store",
                ns.url(f"os{threads}w{workers}"),
                "--oracle",
                oracle_url,
                "--threads",
                str(threads),
                "--workers",
                str(workers),
                "--flood",
                str(sizes.scaling_flood),
                "--repeats",
                str(sizes.repeats),
                "--at-rate",
                rate,
                "--step-seconds",
                str(sizes.scaling_step_seconds),
            ],
        )
        series["observers"].append(name)
        if result is not None and rate.endswith("x"):
            rate = f"{float(result['fixed_rate']):.3f}"


def _run_profiles(
    runner: Runner, raw: J, sizes: Sizes, ns: Namespaces, oracle_url: str, profile_all: bool
) -> None:
    from bench.report import MISS, PROFILE_OF, evaluate

    raw["runs"] = runner.runs
    targets = evaluate(raw)
    kinds = sorted({PROFILE_OF[t.tid] for t in targets if profile_all or t.verdict == MISS})
    spark = runner.runs.get("spark", {})
    load = spark.get("load") or {}
    for kind in kinds:
        argv = [
            str(BENCH / "run_all.py"),
            "profile",
            "--kind",
            kind,
            "--store",
            ns.url(f"prof{kind[:4]}"),
            "--oracle",
            oracle_url,
            "--ops",
            str(sizes.profile_ops),
            "--repeats",
            str(sizes.repeats),
        ]
        if kind == "oracle":
            # The coalescing client as P1b measures it (100 threads in one process).
            argv += ["--waiters", "100"]
        elif kind == "scan":
            argv += [
                "--scan-base",
                str(sizes.scan_base),
                "--scan-growth",
                str(sizes.scan_growth),
                "--dirty",
                str(sizes.scan_dirty),
            ]
        elif kind == "incremental":
            # The benchmark's corpus size: what one change costs depends on the corpus.
            docs = sizes.spark_docs
            argv += ["--docs", str(docs), "--fraction", f"{max(0.01, 5 / docs):.4f}"]
        elif kind == "backfill":
            argv += ["--batch", str(load.get("batch", 200))]
        elif kind == "lock":
            argv += ["--cells", str(sizes.lock_cells)]
        result = runner.run(f"profile_{kind}", argv)
        raw["profiles"][kind] = (
            result
            if result is not None
            else {"error": runner.steps[-1].error or runner.steps[-1].status}
        )


# --------------------------------------------------------------------------- observer scaling


def observer_scaling_main(argv: Sequence[str]) -> int:
    """Backlog throughput (median of ``--repeats``) of ``--workers`` worker processes with
    ``--threads`` threads each, then the commit-to-observer-commit latency of paced writes
    at ``--at-rate`` (writes/s, or ``Fx`` for F times the measured backlog throughput)."""
    parser = argparse.ArgumentParser(prog="run_all.py observer-scaling")
    parser.add_argument("--store", required=True)
    parser.add_argument("--oracle", required=True)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--flood", type=int, default=400, help="notifications per backlog")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--at-rate", default="0.5x")
    parser.add_argument("--step-seconds", type=float, default=5.0)
    parser.add_argument("--json", required=True)
    args = parser.parse_args(argv)
    match = re.fullmatch(r"([0-9.]+)(x?)", args.at_rate)
    if match is None:
        parser.error(f"--at-rate must be a rate or a multiple like 0.5x, got {args.at_rate!r}")

    from percolator.observers.api import register_observers

    import percolator
    from bench import observer_bench as ob

    client = percolator.connect(args.store, oracle=args.oracle)
    try:
        observer = ob.LatencyObserver()
        observer.setup(client)
        register_observers(client, [observer])
        with ob.worker_process(args.store, args.threads, args.workers, args.oracle):
            ob.saturation(client, min(100, args.flood), "warm")  # connections, caches
            backlog = [ob.saturation(client, args.flood, f"flood{i}") for i in range(args.repeats)]
            value = float(match.group(1))
            rate = value * statistics.median(backlog) if match.group(2) else value
            step = ob.measure_step(client, rate, args.step_seconds, "fixed")
    finally:
        client.close()
    result = {
        "threads": args.threads,
        "workers": args.workers,
        "flood": args.flood,
        "backlog_runs": backlog,
        "backlog_runs_per_s": statistics.median(backlog),
        "fixed_rate": rate,
        "step": asdict(step) | {"kept_up": step.kept_up},
    }
    print(
        f"{args.workers} worker(s) x {args.threads} threads: backlog "
        f"{statistics.median(backlog):.1f} runs/s; at {rate:.1f} writes/s p50 "
        f"{step.p50_s * 1000:.0f} ms, p99 {step.p99_s * 1000:.0f} ms"
    )
    Path(args.json).write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    return 0


# --------------------------------------------------------------------------- profiles


class CountingOracle(TimestampOracle):
    """Wraps an oracle, counting the timestamps drawn and the time spent waiting for them."""

    def __init__(self, inner: TimestampOracle) -> None:
        self.inner = inner
        self.timestamps = 0
        self.waited_s = 0.0
        self._lock = threading.Lock()

    def get_timestamp(self) -> int:
        started = time.perf_counter()
        try:
            return self.inner.get_timestamp()
        finally:
            with self._lock:
                self.timestamps += 1
                self.waited_s += time.perf_counter() - started

    def get_timestamps(self, count: int) -> list[int]:
        started = time.perf_counter()
        try:
            return self.inner.get_timestamps(count)
        finally:
            with self._lock:
                self.timestamps += count
                self.waited_s += time.perf_counter() - started

    def close(self) -> None:
        self.inner.close()


@dataclass
class Probe:
    """Counts what a piece of work costs: store round trips (the store's own counters),
    timestamps and oracle wait, and wall time."""

    store: Any
    oracle: CountingOracle | None = None
    calls: dict[str, int] = field(default_factory=dict)
    timestamps: int = 0
    waited_s: float = 0.0
    started: float = 0.0

    def start(self) -> None:
        self.calls = dict(self.store.stats.calls)
        self.timestamps = self.oracle.timestamps if self.oracle else 0
        self.waited_s = self.oracle.waited_s if self.oracle else 0.0
        self.started = time.perf_counter()

    def stop(self, per: float, unit: str) -> J:
        """The cost per operation, ``per`` operations having run since :meth:`start`."""
        seconds = time.perf_counter() - self.started
        after = self.store.stats.calls
        trips = {
            op: (n - self.calls.get(op, 0)) / per
            for op, n in after.items()
            if n != self.calls.get(op, 0)
        }
        return {
            "unit": unit,
            "count": per,
            "ms_per_op": seconds * 1000 / per,
            "round_trips_per_op": trips,
            "timestamps_per_op": (
                (self.oracle.timestamps - self.timestamps) / per if self.oracle else 0.0
            ),
            "oracle_ms_per_op": (
                (self.oracle.waited_s - self.waited_s) * 1000 / per if self.oracle else 0.0
            ),
        }


def _short_path(filename: str) -> str:
    if filename == "~":
        return ""
    if "site-packages/" in filename:
        return filename.split("site-packages/", 1)[1]
    root = str(ROOT) + os.sep
    if filename.startswith(root):
        return filename[len(root) :]
    match = re.search(r"/lib/python3[.\d]*/(.*)$", filename)
    return match.group(1) if match else filename


def top_functions(source: cProfile.Profile | pstats.Stats, per: float, n: int = 12) -> list[J]:
    """The ``n`` functions with the most own time, per operation."""
    stats = source if isinstance(source, pstats.Stats) else pstats.Stats(source)
    entries: dict[tuple[str, int, str], tuple[Any, ...]] = stats.stats  # type: ignore[attr-defined]
    ranked = sorted(entries.items(), key=lambda kv: -kv[1][2])[:n]
    out = []
    for (filename, line, name), (_cc, calls, own, cumulative, _callers) in ranked:
        where = _short_path(filename)
        out.append(
            {
                "function": f"{where}:{line}({name})" if where else name,
                "calls_per_op": calls / per,
                "own_ms_per_op": own * 1000 / per,
                "cum_ms_per_op": cumulative * 1000 / per,
            }
        )
    return out


def measure_op(
    op: Callable[[int], object], *, count: int, probe: Probe, unit: str, warmup: int = 3
) -> J:
    """Cost of ``op``: ``warmup`` untimed calls, ``count`` timed calls (no profiler), then
    ``count`` calls under cProfile for the top functions.  Single-threaded, so round trips
    and time per call are those of one operation.  ``op(i)`` gets a fresh ``i`` per call."""
    indexes = itertools.count()
    for _ in range(warmup):
        op(next(indexes))
    probe.start()
    for _ in range(count):
        op(next(indexes))
    result = probe.stop(count, unit)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(count):
        op(next(indexes))
    profiler.disable()
    result["top"] = top_functions(profiler, count)
    result["profiled_ops"] = count
    result["profile_clock"] = "wall"
    return result


@contextlib.contextmanager
def _engine(store_url: str, oracle_url: str | None) -> Iterator[tuple[Any, Any, CountingOracle]]:
    """A client on ``store_url`` whose oracle is counted: ``(client, store, oracle)``."""
    from percolator.oracle.factory import open_oracle

    import percolator
    from percolator.client import ensure_meta_table
    from percolator.store import open_store

    store = open_store(store_url)
    try:
        ensure_meta_table(store)
        oracle = CountingOracle(open_oracle(oracle_url, store))
        client = percolator.connect(store, oracle=oracle)
        try:
            yield client, store, oracle
        finally:
            client.close()
    finally:
        store.close()


def profile_txn(args: argparse.Namespace) -> J:
    from percolator.store import FamilySpec, Put

    ops: J = {}
    value = b"v" * args.value_size
    with _engine(args.store, args.oracle) as (client, store, oracle):
        probe = Probe(store, oracle)
        client.create_table("prof_txn")
        store.create_table("prof_raw", [FamilySpec("d")])
        rows = 2 * args.ops + 10
        for start in range(0, rows, 500):
            store.put(
                "prof_raw",
                [
                    Put(b"r%09d" % i, "d", b"q", 1, value)
                    for i in range(start, min(rows, start + 500))
                ],
            )
        for start in range(0, rows, 200):

            def load(txn: Any, lo: int = start) -> None:
                for i in range(lo, min(rows, lo + 200)):
                    txn.set("prof_txn", b"r%09d" % i, "c", value)

            client.run(load)

        def raw_get(i: int) -> None:
            if not store.read_row("prof_raw", b"r%09d" % i, [("d", b"q")]):
                raise AssertionError(f"raw row {i} missing")

        ops["raw_get"] = measure_op(raw_get, count=args.ops, probe=probe, unit="one get")
        ops["raw_put"] = measure_op(
            lambda i: store.put("prof_raw", [Put(b"p%09d" % i, "d", b"q", 1, value)]),
            count=args.ops,
            probe=probe,
            unit="one put",
        )
        reader = client.transaction()

        def txn_read(i: int) -> None:
            if reader.get("prof_txn", b"r%09d" % i, "c") is None:
                raise AssertionError(f"row {i} missing")

        ops["txn_read"] = measure_op(
            txn_read, count=args.ops, probe=probe, unit="get in an open transaction"
        )
        reader.rollback()

        def txn_1cell(i: int) -> None:
            with client.transaction() as txn:
                txn.set("prof_txn", b"w%09d" % i, "c", value)

        ops["txn_1cell"] = measure_op(
            txn_1cell, count=args.ops, probe=probe, unit="1-cell transaction"
        )

        def txn_10cell(i: int) -> None:
            with client.transaction() as txn:
                for j in range(10):
                    txn.set("prof_txn", b"m%09d-%d" % (i, j), "c", value)

        ops["txn_10cell"] = measure_op(
            txn_10cell, count=max(5, args.ops // 5), probe=probe, unit="10-cell transaction"
        )
    return {"ops": ops, "value_size": args.value_size}


def profile_oracle(args: argparse.Namespace) -> J:
    """The coalescing client under ``--waiters`` threads: rate and RPCs per timestamp
    without a profiler, then CPU per timestamp by function (a thread-CPU-time profiler in
    every waiting thread, merged)."""
    from percolator.oracle.client import GrpcOracleClient
    from percolator.oracle.factory import parse_oracle_url

    from bench._common import run_timed

    addresses, tls, token, _ = parse_oracle_url(args.oracle)
    client = GrpcOracleClient(addresses, token=token, tls=tls, timeout_s=30)
    try:
        client.get_timestamp()
        waiters = args.waiters
        run_timed(lambda _: client.get_timestamp(), max(2 * waiters, 1000), threads=waiters)
        fetches, stamps = client.stats.fetches, client.stats.timestamps
        count = max(20 * waiters, 5000)
        cpu_started = time.process_time()
        timing = run_timed(lambda _: client.get_timestamp(), count, threads=waiters)
        # CPU of this whole process (waiters and gRPC threads), without a profiler running.
        process_cpu_s = time.process_time() - cpu_started
        rpcs_per_ts = (client.stats.fetches - fetches) / max(client.stats.timestamps - stamps, 1)
        profiles = [cProfile.Profile(time.thread_time) for _ in range(waiters)]
        barrier = threading.Barrier(waiters)

        def waiter(t: int) -> None:
            barrier.wait()
            profiles[t].enable()
            for _ in range(t, count, waiters):
                client.get_timestamp()
            profiles[t].disable()

        pool = [threading.Thread(target=waiter, args=(t,)) for t in range(waiters)]
        for th in pool:
            th.start()
        for th in pool:
            th.join()
        stats = pstats.Stats(profiles[0])
        for p in profiles[1:]:
            stats.add(p)
        entries: dict[Any, tuple[Any, ...]] = stats.stats  # type: ignore[attr-defined]
        cpu_s = sum(v[2] for v in entries.values())
    finally:
        client.close()
    return {
        "ops": {
            "batched": {
                "unit": "timestamp (coalescing client)",
                "count": count,
                "waiters": waiters,
                "ms_per_op": 1000 / timing.rate,
                "round_trips_per_op": {},
                "rpcs_per_timestamp": rpcs_per_ts,
                "timestamps_per_op": 1.0,
                "oracle_ms_per_op": 0.0,
                "cpu_us_per_op": cpu_s * 1e6 / count,
                "process_cpu_us_per_op": process_cpu_s * 1e6 / count,
                "top": top_functions(stats, count),
                "profiled_ops": count,
                "profile_clock": "thread CPU",
            }
        }
    }


def profile_observer(args: argparse.Namespace) -> J:
    from percolator.observers.api import register_observers
    from percolator.observers.worker import run_until_quiet

    from bench import observer_bench as ob

    with _engine(args.store, args.oracle) as (client, store, oracle):
        observer = ob.LatencyObserver()
        observer.setup(client)
        register_observers(client, [observer])

        def write(prefix: str, n: int) -> None:
            rows = [f"{prefix}-{i:07d}".encode() for i in range(n)]
            for start in range(0, n, 50):
                with client.transaction() as txn:
                    for row in rows[start : start + 50]:
                        txn.set(ob.EVENTS, row, "value", b"x")

        write("warm", 10)
        run_until_quiet(client, [observer])
        write("timed", args.ops)
        probe = Probe(store, oracle)
        probe.start()
        report = run_until_quiet(client, [observer])
        runs = max(report.runs, 1)
        result = probe.stop(runs, "observer run, scan included")
        write("profiled", args.ops)
        profiler = cProfile.Profile()
        profiler.enable()
        report = run_until_quiet(client, [observer])
        profiler.disable()
        result["top"] = top_functions(profiler, max(report.runs, 1))
        result["profiled_ops"] = report.runs
        result["profile_clock"] = "wall"
    return {"ops": {"observer_run": result}}


def profile_scan(args: argparse.Namespace) -> J:
    from percolator.observers.api import trigger

    from bench import observer_bench as ob
    from percolator.layout import NOTIFY
    from percolator.store.base import ScanOptions

    ops: J = {}
    with _engine(args.store, args.oracle) as (client, store, oracle):
        client.create_table(ob.SCAN_TABLE)
        key_space = 1 << 40
        rng = random.Random(3)
        dirty = [b"row-%010d" % rng.randrange(key_space) for _ in range(args.dirty)]
        trigger(client, ob.SCAN_TABLE, dirty, "value")
        loaded = 0
        for label, size in (
            ("notify_pass_small", args.scan_base),
            ("notify_pass_large", args.scan_base * args.scan_growth),
        ):
            ob.load_rows(client, loaded, size, key_space)
            loaded = size

            def one_pass(_: int) -> None:
                for _row in store.scan(ob.SCAN_TABLE, NOTIFY, ScanOptions(batch_size=500)):
                    pass

            result = measure_op(
                one_pass,
                count=max(3, args.repeats),
                probe=Probe(store, oracle),
                unit="notification pass",
                warmup=1,
            )
            result.update({"rows": size, "dirty": args.dirty})
            ops[label] = result
    return {"ops": ops}


def profile_incremental(args: argparse.Namespace) -> J:
    from percolator.observers import corpus, pipeline
    from percolator.observers.api import register_observers
    from percolator.observers.worker import run_until_quiet

    with _engine(args.store, args.oracle) as (client, store, oracle):
        pipeline.create_tables(client)
        register_observers(client, pipeline.observers())
        current = corpus.generate(args.docs, seed=1)
        corpus.write_documents(client, current)
        run_until_quiet(client, pipeline.observers())  # the initial processing, untimed

        def change(seed: int) -> int:
            nonlocal current
            changes = corpus.mutate(current, fraction=args.fraction, seed=seed)
            current = corpus.apply_changes(current, changes)
            corpus.write_documents(client, changes)
            return len(changes)

        changed = change(2)
        probe = Probe(store, oracle)
        probe.start()
        report = run_until_quiet(client, pipeline.observers())
        result = probe.stop(changed, "changed document, processed to quiescence")
        result.update(
            {"changes": changed, "runs_per_op": report.runs / changed, "documents": args.docs}
        )
        changed = change(3)
        profiler = cProfile.Profile()
        profiler.enable()
        run_until_quiet(client, pipeline.observers())
        profiler.disable()
        result["top"] = top_functions(profiler, changed)
        result["profiled_ops"] = changed
        result["profile_clock"] = "wall"
    return {"ops": {"incremental": result}}


def profile_backfill(args: argparse.Namespace) -> J:
    """A transaction shaped like one backfill batch (spark_jobs/backfill.py: read the batch's
    progress marker, write every cell of ``--batch`` rows of two values and the marker)
    against a raw batched put of the same cells."""
    from percolator.store import FamilySpec, Put

    value = b"v" * args.value_size
    batch = args.batch
    count = max(3, args.ops // 20)
    with _engine(args.store, args.oracle) as (client, store, oracle):
        client.create_table("prof_fill")
        client.create_table("prof_progress")
        store.create_table("prof_rawfill", [FamilySpec("d")])
        probe = Probe(store, oracle)

        def fill(i: int) -> None:
            marker = b"job/batch/%09d" % i
            with client.transaction() as txn:
                if txn.get("prof_progress", marker, "m") is not None:
                    raise AssertionError(f"marker {marker!r} exists")
                for j in range(batch):
                    row = b"row%06d-%05d" % (i, j)
                    txn.set("prof_fill", row, "a", value)
                    txn.set("prof_fill", row, "b", value)
                txn.set("prof_progress", marker, "m", b'{"rows": %d}' % batch)

        def raw(i: int) -> None:
            puts = []
            for j in range(batch):
                row = b"row%06d-%05d" % (i, j)
                puts += [Put(row, "d", b"a", 1, value), Put(row, "d", b"b", 1, value)]
            store.put("prof_rawfill", puts)

        fill_result = measure_op(
            fill, count=count, probe=probe, unit=f"batch of {batch} rows", warmup=1
        )
        raw_result = measure_op(
            raw, count=count, probe=probe, unit=f"batch of {batch} rows", warmup=1
        )
        fill_result["rows"] = raw_result["rows"] = batch
    return {"ops": {"backfill_batch": fill_result, "raw_batch": raw_result}}


def profile_lock(args: argparse.Namespace) -> J:
    import percolator
    from bench.lock_bench import run_trial
    from percolator.context import ClientOptions

    ttl = ClientOptions().lock_ttl_ms
    client = percolator.connect(args.store, oracle=None, lock_ttl_ms=ttl, lock_wait_ms=ttl + 10_000)
    try:
        profiler = cProfile.Profile()
        trial = run_trial(
            client,
            args.store,
            None,
            case="before-commit-point",
            cells=args.cells,
            ttl_ms=ttl,
            profiler=profiler,
        )
    finally:
        client.close()
    return {
        "ops": {
            "resolving_read": {
                "unit": f"read of {args.cells} cells locked by a killed client",
                "count": 1,
                "ms_per_op": trial.read_s * 1000,
                "round_trips_per_op": {k: float(v) for k, v in trial.round_trips.items()},
                "timestamps_per_op": 0.0,
                "oracle_ms_per_op": 0.0,
                "must_wait_s": trial.must_wait_s,
                "ttl_ms": trial.ttl_ms,
                "top": top_functions(profiler, 1),
                "profiled_ops": 1,
                "profile_clock": "wall",
            }
        }
    }


PROFILES: dict[str, Callable[[argparse.Namespace], J]] = {
    "txn": profile_txn,
    "oracle": profile_oracle,
    "observer": profile_observer,
    "scan": profile_scan,
    "incremental": profile_incremental,
    "backfill": profile_backfill,
    "lock": profile_lock,
}


def profile_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="run_all.py profile")
    parser.add_argument("--kind", required=True, choices=sorted(PROFILES))
    parser.add_argument("--store", required=True, help="store URL (a fresh table prefix)")
    parser.add_argument("--oracle", help="grpc://HOST:PORT")
    parser.add_argument("--ops", type=int, default=200, help="operations per measurement")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--value-size", type=int, default=64)
    parser.add_argument("--waiters", type=int, default=1000)
    parser.add_argument("--scan-base", type=int, default=1000)
    parser.add_argument("--scan-growth", type=int, default=100)
    parser.add_argument("--dirty", type=int, default=1000)
    parser.add_argument("--docs", type=int, default=300)
    parser.add_argument("--fraction", type=float, default=0.02)
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument("--cells", type=int, default=5)
    parser.add_argument("--json", required=True)
    args = parser.parse_args(argv)
    if args.kind == "oracle" and not args.oracle:
        parser.error("--kind oracle needs --oracle grpc://HOST:PORT")
    result = PROFILES[args.kind](args)
    result["kind"] = args.kind
    result["store"] = args.store.split("?")[0]
    for name, op in result["ops"].items():
        trips = sum(op["round_trips_per_op"].values())
        print(f"{name}: {op['ms_per_op']:.3f} ms, {trips:.2f} round trips per {op['unit']}")
    Path(args.json).write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    return 0


# --------------------------------------------------------------------------- entry point


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["observer-scaling"]:
        return observer_scaling_main(args[1:])
    if args[:1] == ["profile"]:
        return profile_main(args[1:])
    return run_all(args)


if __name__ == "__main__":
    sys.exit(main())

"""Every benchmark, one command: the performance report ``bench/results.md``.

    bench/run_all                      # full run on a freshly started local HBase (~1 hour)
    bench/run_all --quick              # smoke run: tiny sizes, one repeat (a few minutes)
    bench/run_all --store 'hbase://127.0.0.1:19090?prefix=runall_'   # an HBase already running
    bench/run_all --only txn,lock      # some steps only (the others show as not measured)
    bench/run_all --quick --store embedded --out /tmp/r.md --plots /tmp/plots  # no HBase

What it does, in order:

1. starts a local HBase (percolator.testing.localhbase, fresh work directory, free ports) unless
   ``--store`` names one (or the embedded store); records the machine (CPU, cores, memory,
   OS, Python, Java, HBase, load average, date, source revision);
2. starts one timestamp oracle server on that HBase, used by every engine benchmark;
3. runs each benchmark as its own process with ``--json`` (each in its own table prefix, so
   nothing collides and everything is dropped at the end): raw store baselines
   (store_bench), P1 (oracle_bench), P1c-P4 (txn_bench: on HBase with the oracle server and
   again with the default local oracle, on embedded with its default local oracle), P5-P6
   (observer_bench, the scan also embedded), P7 (spark_bench, with the transactional
   backfill), P8 (bulk_bench, HBase and embedded), P9 (lock_bench, HBase and embedded),
   P10 (cost_bench p10), P11 (gc_bench), P12 (watermark_bench) and P13 (partition_bench),
   each on HBase and embedded, P7b (cost_bench promise, embedded), then
   the scaling runs (transactions vs client threads and value size; observer throughput and
   latency vs worker threads and processes, measured by this module's ``observer-scaling``
   command);
4. for every missed target (bench/targets.py), profiles the workload behind it in a
   separate process (this module's ``profile`` command, bench/profiling.py: store round
   trips from the store's counters, timestamps, time per operation, top functions under
   cProfile);
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
import datetime as dt
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

if __package__ in (None, ""):  # run as a script: make ``bench`` and the packages importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from percolator.errors import ConfigError

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
    #: P8 (bulk_bench): rows of the bulk and raw loads, and of the transactional one
    bulk_rows: int
    bulk_txn_rows: int
    lock_cells: int
    scaling_threads: tuple[int, ...]
    scaling_values: tuple[int, ...]
    #: (threads per process, processes)
    scaling_observers: tuple[tuple[int, int], ...]
    scaling_flood: int
    scaling_step_seconds: float
    #: P10 (cost_bench p10): notifications worked off per measurement
    p10_backlog: int
    #: P7b (cost_bench promise): corpus size and changed fraction per round
    promise_docs: int
    promise_fraction: float
    #: P11 (gc_bench): seconds of steady updates, GC interval and life time
    gc_seconds: float
    gc_every_s: float
    gc_life_time_s: float
    #: P12 (watermark_bench): documents loaded, seconds at half of saturation
    watermark_documents: int
    watermark_seconds: float
    #: P13 (partition_bench): worker process counts and rows written
    partition_workers: str
    partition_rows: int
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
    bulk_rows=2000,
    bulk_txn_rows=200,
    lock_cells=5,
    scaling_threads=(1, 2, 4, 8),
    scaling_values=(64, 1024, 16384),
    scaling_observers=((1, 1), (4, 1), (2, 2)),
    scaling_flood=100,
    scaling_step_seconds=2.0,
    p10_backlog=200,
    promise_docs=300,
    promise_fraction=0.02,
    gc_seconds=12.0,
    gc_every_s=1.0,
    gc_life_time_s=2.0,
    watermark_documents=100,
    watermark_seconds=5.0,
    partition_workers="1,2",
    partition_rows=100,
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
    bulk_rows=50_000,
    bulk_txn_rows=1000,
    lock_cells=5,
    scaling_threads=(1, 2, 4, 8),
    scaling_values=(64, 1024, 16384),
    scaling_observers=((1, 1), (2, 1), (4, 1), (8, 1), (1, 2), (2, 2), (4, 2)),
    scaling_flood=400,
    scaling_step_seconds=5.0,
    p10_backlog=2000,
    promise_docs=100_000,
    promise_fraction=0.01,
    gc_seconds=60.0,
    gc_every_s=2.0,
    gc_life_time_s=5.0,
    watermark_documents=300,
    watermark_seconds=20.0,
    partition_workers="1,2,4",
    partition_rows=4000,
    profile_ops=200,
    warmup_ops=5000,
    step_timeout_s=3600,
)

#: step groups, for --only / --skip
GROUPS = (
    "store",
    "txn",
    "oracle",
    "observers",
    "spark",
    "lock",
    "cost",
    "promise",
    "gc",
    "watermark",
    "partition",
    "scaling",
    "profiles",
)


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
    table under every prefix handed out (and nothing else).  On the embedded store
    (``embedded`` or ``embedded:DIR``) each step gets its own store directory instead, under
    ``DIR`` (default: the work directory)."""

    def __init__(self, base_url: str, run_id: str, workdir: Path) -> None:
        self.base_url = base_url
        self.run_id = run_id
        self.workdir = workdir
        self.embedded = base_url.split(":", 1)[0].lower() == "embedded"
        self.root = (base_url.partition(":")[2] or str(workdir / "stores")).rstrip("/")
        self.urls: list[str] = []

    def url(self, tag: str) -> str:
        name = f"ra{self.run_id}{tag}"
        url = (
            f"embedded:{self.root}/{name}"
            if self.embedded
            else with_prefix(self.base_url, name + "_")
        )
        self.urls.append(url)
        return url

    def embedded_url(self, tag: str) -> str:
        """An embedded store of its own for step ``tag``, under the work directory's
        ``stores`` (for the embedded runs of a benchmark that needs a store URL)."""
        url = f"embedded:{self.workdir / 'stores'}/ra{self.run_id}{tag}"
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
        "--quick",
        action="store_true",
        help="smoke run: tiny sizes, one repeat, no Spark (spark, promise) unless --only names "
        "it (a few minutes)",
    )
    parser.add_argument(
        "--repeats", type=int, help="repeats of every measurement (default: 3, or 1 with --quick)"
    )
    parser.add_argument(
        "--store",
        help="use this running HBase (hbase://HOST:PORT[?prefix=P]) instead of starting one, "
        "or the embedded store (embedded[:DIR]: one store directory per step)",
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
    embedded = bool(args.store) and args.store.split(":", 1)[0].lower() == "embedded"
    if args.store and not embedded and not args.store.lower().startswith("hbase://"):
        print(
            f"run_all: --store must be an HBase URL (hbase://HOST:PORT[?prefix=P]) or "
            f"embedded[:DIR], got {args.store!r}",
            file=sys.stderr,
        )
        return 2
    if args.quick and not args.only:
        # Minutes of JVM start-up: a smoke run asks for Spark by name.
        groups -= {"spark", "promise"}
    if args.store and not embedded:
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
            hbase_pids: dict[str, int | None] = {}  # the JVMs of an HBase this run starts
            if embedded:
                base_url = args.store
                machine["hbase"] = "not used: every benchmark on the embedded store"
            elif args.store:
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
                status = local.status()
                hbase_pids = {
                    "hbase": status.master_pid,
                    "thrift": status.thrift_pid,
                    "thrift2": status.thrift2_pid,
                }
                gateways = "Thrift-1 and Thrift-2" if "thrift2_port=" in base_url else "Thrift-1"
                machine["hbase"] = (
                    f"{hbase_version()} standalone with its {gateways} gateway(s), started fresh "
                    f"for this run ({time.monotonic() - t0:.0f} s to start)"
                )
            machine["store"] = urlsplit(base_url)._replace(query="").geturl()
            namespaces = Namespaces(base_url, run_id, workdir)
            stack.callback(namespaces.drop_all)  # runs after the oracle stops, before HBase
            from bench.oracle_bench import oracle_server

            oracle = stack.enter_context(oracle_server(namespaces.url("oracle")))
            oracle_url = "grpc://" + oracle.address
            # Every benchmark that can also accounts the CPU time of the servers this run
            # started (bench/_common.py: CpuUse): on two cores, who spends the CPU decides.
            processes = Processes(
                hbase=[f"{k}={v}" for k, v in hbase_pids.items() if v is not None],
                oracle=[f"oracle={oracle.pid}"],
            )
            machine["oracle"] = (
                "timestamp oracle server (percolator oracle serve) on the same store, "
                "one for the whole run"
            )
            _run_steps(
                runner, raw, sizes, groups, namespaces, oracle_url, processes, args.profile_all
            )
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


@dataclass
class Processes:
    """The server processes this run started, as ``--cpu-of NAME=PID`` values: the HBase
    JVMs (none when the run uses an HBase it did not start, or the embedded store) and the
    oracle server."""

    hbase: list[str] = field(default_factory=list)
    oracle: list[str] = field(default_factory=list)

    def of(self, *, hbase: bool = False, oracle: bool = False) -> list[str]:
        return (self.hbase if hbase else []) + (self.oracle if oracle else [])


def bench_argv(script: str, *args: str, **options: object) -> list[str]:
    """The command line of ``bench/<script>.py``: ``args``, then ``--option value`` for each
    option (``value_size`` becomes ``--value-size``; None is left out, True is a bare flag)."""
    argv = [str(BENCH / f"{script}.py"), *args]
    for key, value in options.items():
        if value is None or value is False:
            continue
        option = "--" + key.replace("_", "-")
        if isinstance(value, list):  # a repeatable option: once per item
            for item in value:
                argv += [option, str(item)]
            continue
        argv.append(option)
        if value is not True:
            argv.append(str(value))
    return argv


def _run_steps(
    runner: Runner,
    raw: J,
    sizes: Sizes,
    groups: set[str],
    ns: Namespaces,
    oracle_url: str,
    processes: Processes,
    profile_all: bool,
) -> None:
    r = sizes.repeats
    # On HBase, the benchmarks that are cheap on the embedded store run there too, for
    # context; on the embedded store that would measure the same thing twice.
    also_embedded = not ns.embedded

    def txn(
        name: str, store: str | None, threads: int, value_size: int, server: bool = True
    ) -> None:
        runner.run(
            name,
            bench_argv(
                "txn_bench",
                store=store,
                oracle=oracle_url if server else None,
                ops=sizes.txn_ops,
                threads=threads,
                repeats=r,
                value_size=value_size,
                cpu_of=processes.of(hbase=store is not None, oracle=server),
            ),
        )

    def raw_store(name: str, ops: int, repeats: int, warmup: int | None = None) -> None:
        runner.run(
            name,
            bench_argv(
                "store_bench",
                store=ns.url(name),
                ops=ops,
                threads=sizes.txn_threads,
                repeats=repeats,
                warmup=warmup,
            ),
        )

    scan = {
        "scan_base": sizes.scan_base,
        "scan_growth": sizes.scan_growth,
        "dirty": sizes.scan_dirty,
        "scan_repeats": sizes.scan_repeats,
    }
    # Untimed: warms the HBase server (JIT) and the page cache before anything is measured;
    # the untimed calls before its operations also warm the Thrift-2 gateway, which its
    # timed operations do not reach (bench/workloads.py: raw_warmup).
    raw_store("warmup", sizes.warmup_ops, 1, warmup=sizes.warmup_ops)
    # Untimed too: the engine's own calls (reads of several families, compare-and-sets that
    # carry puts) take code paths in the JVMs that raw traffic leaves cold; on a fresh HBase
    # the first 1,000 transactions cost the Thrift-2 gateway 1.8 ms of CPU each, the next
    # 2,000 about 0.6 ms (bench/results.md, the full run at git fbb0b04).
    if "txn" in groups:
        runner.run(
            "warmup_txn",
            bench_argv(
                "txn_bench",
                store=ns.url("warmup_txn"),
                ops=sizes.warmup_ops // 2,
                repeats=1,
                threads=sizes.txn_threads,
            ),
        )
    if "store" in groups:
        raw_store("store", sizes.store_ops, r)
    if "txn" in groups:
        txn("txn_hbase", ns.url("txn"), sizes.txn_threads, 64)
        # The same with the engine's default oracle (local, leased in the store), which a
        # client on one machine gets without running an oracle server.
        txn("txn_hbase_local", ns.url("txnl"), sizes.txn_threads, 64, server=False)
        if also_embedded:
            # The embedded store as it runs by default: with the local oracle.  An oracle
            # server in front of an embedded store is not a configuration anyone runs, and
            # its gRPC calls would be most of what this step measured.
            txn("txn_embedded", None, sizes.txn_threads, 64, server=False)
    if "oracle" in groups:
        runner.run(
            "oracle",
            bench_argv(
                "oracle_bench",
                store=ns.url("orc"),
                waiters=sizes.oracle_waiters,
                repeats=r,
                seconds=sizes.oracle_seconds,
            ),
        )
    if "observers" in groups:
        runner.run(
            "observers",
            bench_argv(
                "observer_bench",
                store=ns.url("obs"),
                oracle=oracle_url,
                threads=sizes.obs_threads,
                flood=sizes.obs_flood,
                flood_repeats=r,
                step_seconds=sizes.obs_step_seconds,
                half_repeats=r,
                **scan,
            ),
        )
        if also_embedded:
            runner.run(
                "scan_embedded",
                bench_argv("observer_bench", only="scan", oracle=oracle_url, **scan),
            )
    if "spark" in groups:
        runner.run(
            "spark",
            bench_argv(
                "spark_bench",
                store=ns.url("spark"),
                rows=sizes.spark_rows,
                docs=sizes.spark_docs,
                rounds=sizes.spark_rounds,
                repeats=r,
            ),
        )
        bulk = {"rows": sizes.bulk_rows, "txn_rows": sizes.bulk_txn_rows, "repeats": r}
        runner.run("bulk", bench_argv("bulk_bench", store=ns.url("bulk"), **bulk))
        if also_embedded:
            runner.run("bulk_embedded", bench_argv("bulk_bench", **bulk))
    if "lock" in groups:
        runner.run(
            "lock_hbase",
            bench_argv("lock_bench", repeats=r, cells=sizes.lock_cells, store=ns.url("lock")),
        )
        if also_embedded:
            runner.run("lock_embedded", bench_argv("lock_bench", repeats=r, cells=sizes.lock_cells))
    if "cost" in groups:
        p10 = {"threads": sizes.txn_threads, "backlog": sizes.p10_backlog, "repeats": r}
        runner.run(
            "p10_hbase",
            bench_argv(
                "cost_bench", "p10", store=ns.url("p10"), cpu_of=processes.of(hbase=True), **p10
            ),
        )
        if also_embedded:
            runner.run(
                "p10_embedded", bench_argv("cost_bench", "p10", store=ns.embedded_url("p10"), **p10)
            )
    if "promise" in groups:
        # On the embedded store only: at 100,000 documents the initial processing alone
        # takes many minutes there, and hours on HBase.
        runner.run(
            "promise_embedded",
            bench_argv(
                "cost_bench",
                "promise",
                docs=sizes.promise_docs,
                fraction=sizes.promise_fraction,
                rounds=2 * r,
            ),
        )
    if "gc" in groups:
        gc = {
            "seconds": sizes.gc_seconds,
            "gc_every": sizes.gc_every_s,
            "life_time": sizes.gc_life_time_s,
        }
        runner.run("gc_hbase", bench_argv("gc_bench", store=ns.url("gc"), **gc))
        if also_embedded:
            runner.run("gc_embedded", bench_argv("gc_bench", **gc))
    if "watermark" in groups:
        wm = {"documents": sizes.watermark_documents, "seconds": sizes.watermark_seconds}
        runner.run("watermark_hbase", bench_argv("watermark_bench", store=ns.url("wm"), **wm))
        if also_embedded:
            runner.run("watermark_embedded", bench_argv("watermark_bench", **wm))
    if "partition" in groups:
        part = {"workers": sizes.partition_workers, "rows": sizes.partition_rows}
        # partition_bench makes a fresh prefix (HBase) or store (embedded) per run itself.
        runner.run(
            "partition_hbase",
            bench_argv("partition_bench", hbase=None if ns.embedded else ns.url("part"), **part),
        )
        if also_embedded:
            runner.run("partition_embedded", bench_argv("partition_bench", **part))
    if "scaling" in groups:
        _run_scaling(runner, raw, sizes, ns, oracle_url, txn)
    if "profiles" in groups:
        _run_profiles(runner, raw, sizes, ns, oracle_url, profile_all)


def _run_scaling(
    runner: Runner,
    raw: J,
    sizes: Sizes,
    ns: Namespaces,
    oracle_url: str,
    txn: Callable[[str, str | None, int, int], None],
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
            txn(name, ns.url(f"tt{threads}"), threads, 64)
        series["txn_threads"][str(threads)] = name
    series["value_size"] = {}
    for value in sizes.scaling_values:
        name = f"txn_value_{value}"
        if value == 64 and main:
            name = main
        else:
            txn(name, ns.url(f"tv{value}"), sizes.txn_threads, value)
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
            bench_argv(
                "run_all",
                "observer-scaling",
                store=ns.url(f"os{threads}w{workers}"),
                oracle=oracle_url,
                threads=threads,
                workers=workers,
                flood=sizes.scaling_flood,
                repeats=sizes.repeats,
                at_rate=rate,
                step_seconds=sizes.scaling_step_seconds,
            ),
        )
        series["observers"].append(name)
        if result is not None and rate.endswith("x"):
            rate = f"{float(result['fixed_rate']):.3f}"


def _run_profiles(
    runner: Runner, raw: J, sizes: Sizes, ns: Namespaces, oracle_url: str, profile_all: bool
) -> None:
    """Profile the workload behind every missed target (every target with
    ``profile_all``), each kind once."""
    from bench.report import MISS, evaluate
    from bench.targets import BY_ID

    raw["runs"] = runner.runs
    kinds = sorted(
        {
            BY_ID[t.tid].profile
            for t in evaluate(raw)
            if BY_ID[t.tid].profile and (profile_all or t.verdict == MISS)
        }
    )
    load = runner.runs.get("spark", {}).get("load") or {}
    docs = sizes.spark_docs
    # What each kind measures like its benchmark does: the coalescing client as P1b
    # measures it (100 threads in one process), the benchmark's scan sizes, corpus size
    # (what one change costs depends on the corpus) and backfill batch.
    options: dict[str, dict[str, object]] = {
        "oracle": {"waiters": 100},
        "scan": {
            "scan_base": sizes.scan_base,
            "scan_growth": sizes.scan_growth,
            "dirty": sizes.scan_dirty,
        },
        "incremental": {"docs": docs, "fraction": f"{max(0.01, 5 / docs):.4f}"},
        "backfill": {"batch": load.get("batch", 200)},
        "lock": {"cells": sizes.lock_cells},
    }
    for kind in kinds:
        result = runner.run(
            f"profile_{kind}",
            bench_argv(
                "run_all",
                "profile",
                kind=kind,
                store=ns.url(f"prof{kind[:4]}"),
                oracle=oracle_url,
                ops=sizes.profile_ops,
                repeats=sizes.repeats,
                **options.get(kind, {}),
            ),
        )
        raw["profiles"][kind] = (
            result
            if result is not None
            else {"error": runner.steps[-1].error or runner.steps[-1].status}
        )


# --------------------------------------------------------------------------- entry point


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["observer-scaling"]:
        from bench.observer_bench import scaling_main

        return scaling_main(args[1:])
    if args[:1] == ["profile"]:
        from bench.profiling import main as profile_main

        return profile_main(args[1:])
    return run_all(args)


if __name__ == "__main__":
    sys.exit(main())

"""The demo's seven steps, run in order by :func:`run_demo`.

1. **oracle** - start the timestamp oracle service (``percolator oracle serve``) on the store,
   as a child process on a free loopback port; everything after uses it (``grpc://``);
2. **corpus** - generate a seeded corpus of web documents (observers/corpus.py) as JSON lines;
3. **backfill** - register the example pipeline's observers, then load the corpus with Spark
   through transactions, exactly once (spark_jobs/backfill.py); the load leaves a
   notification per written cell of an observed column;
4. **catch up** - a worker runs the observers until no notification is left;
5. **live changes** - change a fraction of the documents, one transaction each, while the
   worker runs; print each change once all its derived data has landed, with the latency
   from its commit to the last observer commit it caused (percolator/demo/tracking.py);
6. **recompute** - export the documents at one snapshot and recompute every derived table
   from scratch with Spark (spark_jobs/export.py, spark_jobs/recompute.py);
7. **compare** - the stored incremental tables must equal the recompute exactly, and the
   pure-Python reference (observers/reference.py) of the documents as changed.

Where the data goes: a new run directory under the work directory holds the corpus, the
logs (``oracle.log``, ``spark.log``), the chart and, by default, the store
(``embedded:RUN_DIR/store``).  It is kept.  With ``clean`` the store data the demo wrote is
removed at the end (the store directory, or the tables it created on ``--store``); the
small files stay.

A store given with ``--store`` must be an empty namespace (for HBase: a new ``?prefix=``),
so the demo cannot touch existing data or compete with another oracle for the store's
lease.  With ``--oracle`` (an oracle service already running on that store) only the meta
table the oracle keeps may exist.

Interruption: Ctrl-C or SIGTERM stops the worker, Spark and the oracle, in that order,
before the command exits (130).
"""

from __future__ import annotations

import importlib
import json
import math
import os
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, TextIO

import percolator
from observers import corpus, pipeline, reference
from observers.api import register_observers
from observers.worker import Worker, WorkerOptions
from percolator.demo import DEFAULT_DOCUMENTS, DEFAULT_MASTER, DEFAULT_WORK_DIR
from percolator.demo.chart import write_chart
from percolator.demo.oracle_process import OracleProcess
from percolator.demo.report import DemoReport, Step
from percolator.demo.tracking import (
    CLUSTERS_STAGE,
    INDEX_STAGE,
    INLINKS_STAGE,
    ChangeLatency,
    ChangeTracker,
    is_quiet,
    pending_count,
)
from percolator.errors import ConfigError, OracleUnavailableError, PercolatorError
from percolator.layout import META_TABLE
from percolator.progress import Progress
from percolator.store.url import open_store
from percolator.timestamps import describe

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

STEPS = 7
#: rows per backfill transaction: small batches make the progress bar move smoothly
BACKFILL_BATCH = 50
#: give up when no observer run commits for this long while notifications are pending
STALL_S = 120.0
#: once quiet, how long to wait for the worker to report runs that already committed
REPORT_GRACE_S = 5.0
_POLL_S = 0.5
_STAGE_LABELS = {CLUSTERS_STAGE: "clusters", INDEX_STAGE: "index", INLINKS_STAGE: "inlinks"}


@dataclass(frozen=True)
class DemoOptions:
    """The demo's settings (the command's flags); checked on construction (ConfigError)."""

    documents: int = DEFAULT_DOCUMENTS
    change_fraction: float = 0.01
    seed: int = 7
    threads: int = 4
    master: str = DEFAULT_MASTER
    store: str | None = None
    oracle: str | None = None
    work_dir: str = DEFAULT_WORK_DIR
    chart: str | None = None
    clean: bool = False

    def __post_init__(self) -> None:
        if self.documents < 10:
            raise ConfigError(f"--documents must be at least 10, got {self.documents}")
        if not 0 < self.change_fraction <= 1:
            raise ConfigError(f"--change-fraction must be in (0, 1], got {self.change_fraction}")
        if self.threads < 1:
            raise ConfigError(f"--threads must be at least 1, got {self.threads}")
        if self.oracle is not None and self.store is None:
            raise ConfigError(
                "--oracle needs --store: an oracle service serves the one store it keeps its "
                "state in, and the demo's default store is a new one"
            )


# --------------------------------------------------------------------------- checks


def check_extras() -> None:
    """ConfigError if a package of the ``demo`` extra is missing."""
    for module, used_for in (("pyspark", "Spark"), ("matplotlib", "its chart")):
        try:
            importlib.import_module(module)
        except ImportError:
            raise ConfigError(
                f"the demo needs {module} ({used_for}), which is not installed: "
                "pip install 'percolator-engine[demo]' (or run `make demo`)"
            ) from None


def check_java() -> None:
    """ConfigError if Spark would find no ``java`` to start its driver with (it uses
    ``$JAVA_HOME/bin/java`` when JAVA_HOME is set, else ``java`` on the PATH)."""
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if java is None or not os.access(java, os.X_OK):
        where = f"JAVA_HOME={home} has no bin/java" if home else "no java on the PATH"
        raise ConfigError(f"the demo needs Java 17+ for Spark: {where}")


def check_store(store_url: str, master: str, *, oracle_given: bool) -> frozenset[str]:
    """Check that Spark executors can reach ``store_url`` and that it is an empty namespace;
    returns the tables it has (none, or the oracle's meta table with ``oracle_given``)."""
    from spark_jobs.session import check_store_for_spark

    check_store_for_spark(store_url, master)
    with open_store(store_url) as store:
        tables = frozenset(store.list_tables())
    unexpected = sorted(tables - ({META_TABLE} if oracle_given else set()))
    if unexpected:
        shown = ", ".join(unexpected[:6]) + (", ..." if len(unexpected) > 6 else "")
        raise ConfigError(
            f"store {store_url} is not empty (tables: {shown}); the demo only runs in an "
            "empty namespace, so it cannot touch existing data: use a new ?prefix= on HBase, "
            "a new embedded:PATH, or no --store"
        )
    return tables


def check_oracle(oracle_url: str, store_url: str) -> None:
    """The oracle service at ``oracle_url`` answers and serves ``store_url``."""
    from oracle.client import GrpcOracleClient
    from oracle.factory import parse_oracle_url

    addresses, tls, token, (timeout_s, rpc_timeout_s) = parse_oracle_url(oracle_url)
    client = GrpcOracleClient(
        addresses, token=token, tls=tls, timeout_s=timeout_s, rpc_timeout_s=rpc_timeout_s
    )
    try:
        errors = []
        for address in addresses:
            try:
                info = client.info(address)
            except OracleUnavailableError as exc:
                errors.append(str(exc))
                continue
            with open_store(store_url) as store:
                ours = store.url
            if info.store_url and info.store_url != ours:
                raise ConfigError(
                    f"the oracle at {address} serves the store {info.store_url}, not {ours}; "
                    "give the demo that oracle's store, or leave --oracle out"
                )
            return
        raise OracleUnavailableError("; ".join(errors))
    finally:
        client.close()


def new_run_dir(work_dir: str) -> Path:
    """A new directory ``WORK_DIR/run-YYYYmmdd-HHMMSS[-N]``."""
    base = Path(work_dir)
    stamp = time.strftime("run-%Y%m%d-%H%M%S")
    for attempt in range(1, 100):
        path = base / (stamp if attempt == 1 else f"{stamp}-{attempt}")
        try:
            path.mkdir(parents=True)
        except FileExistsError:
            continue
        except OSError as exc:
            raise ConfigError(
                f"cannot create the run directory {path}: {exc.strerror}"
            ) from None
        return path.resolve()
    raise ConfigError(f"cannot find a free run directory name under {base}")


def check_chart_path(path: Path) -> None:
    if path.is_dir():
        raise ConfigError(f"--chart {path} is a directory; give the PNG file's path")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--chart {path}: cannot create {path.parent}: {exc.strerror}") from None
    if not os.access(path.parent, os.W_OK):
        raise ConfigError(f"--chart {path}: {path.parent} is not writable")


@contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """While active, SIGTERM raises KeyboardInterrupt in the main thread like Ctrl-C, so the
    cleanup runs (a plain SIGTERM would end the process with its children still running)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# --------------------------------------------------------------------------- helpers


def write_corpus_jsonl(path: Path, documents: list[corpus.Document]) -> None:
    """One JSON object per line: ``url``, ``body``, ``links`` (the ``links`` column's text)."""
    with path.open("w", encoding="utf-8") as out:
        for doc in documents:
            links = doc.links_value()
            record = {"url": doc.url, "body": doc.body,
                      "links": links.decode("utf-8") if links is not None else None}
            out.write(json.dumps(record, ensure_ascii=False) + "\n")


def change_kind(old: corpus.Document | None, new: corpus.Document | None) -> str:
    if new is None:
        return "deleted"
    if old is None:
        return "new document"
    body, links = old.body != new.body, old.links != new.links
    if body and links:
        return "new body+links"
    if body:
        return "new body"
    return "new links" if links else "rewritten"


def clusters_touched(old: corpus.Document | None, new: corpus.Document | None) -> set[bytes]:
    """The clusters (fingerprints) a change may update: those of its old and new body."""
    return {
        reference.fingerprint(doc.body.encode("utf-8"))
        for doc in (old, new)
        if doc is not None and doc.body is not None
    }


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def _seconds(value: float) -> str:
    return f"{value:.1f} s" if value >= 0.95 else f"{value * 1000:.0f} ms"


def _stop_spark(spark: SparkSession) -> None:
    # The JVM may be gone already (interrupted): then there is nothing left to stop.
    with suppress(Exception):
        spark.stop()


# --------------------------------------------------------------------------- the run


def run_demo(options: DemoOptions, out: TextIO) -> DemoReport:
    """Check the configuration, then run the seven steps (module docstring).

    Raises a PercolatorError (one line) for bad configuration before anything is started,
    and for a step that fails; KeyboardInterrupt on Ctrl-C or SIGTERM, after cleaning up."""
    tables_before: frozenset[str] = frozenset()
    if options.store is not None:
        tables_before = check_store(
            options.store, options.master, oracle_given=options.oracle is not None
        )
        if options.oracle is not None:
            check_oracle(options.oracle, options.store)
    check_extras()
    check_java()
    chart = Path(options.chart).resolve() if options.chart else None
    if chart is not None:
        check_chart_path(chart)
    run_dir = new_run_dir(options.work_dir)
    store_url = options.store or f"embedded:{run_dir / 'store'}"
    report = DemoReport(store=store_url, run_dir=str(run_dir), documents=options.documents,
                        chart=str(chart or run_dir / "latency.png"))
    print(f"percolator demo: {options.documents} documents, store {store_url}\n"
          f"  run directory {run_dir} (corpus, logs, chart)", file=out, flush=True)
    started = time.monotonic()
    with ExitStack() as stack:
        stack.enter_context(terminate_as_interrupt())
        demo = _Demo(options, store_url, run_dir, report, out, stack)
        if options.clean:
            stack.callback(demo.clean, tables_before)  # last: after the oracle stopped
        demo.run()
        report.total_s = time.monotonic() - started
    return report


class _Demo:
    """State shared by the steps.  Every resource is registered on ``stack`` as soon as it
    exists, so an error or an interrupt anywhere releases what was started, newest first."""

    def __init__(
        self,
        options: DemoOptions,
        store_url: str,
        run_dir: Path,
        report: DemoReport,
        out: TextIO,
        stack: ExitStack,
    ) -> None:
        self.options = options
        self.store_url = store_url
        self.run_dir = run_dir
        self.report = report
        self.out = out
        self.stack = stack
        self.oracle_url = ""
        self.client: percolator.Client | None = None
        self.spark: SparkSession | None = None
        self.documents: list[corpus.Document] = []
        self.corpus_path = run_dir / "corpus.jsonl"
        self.current: list[corpus.Document] = []
        self.recomputed: reference.Tables = {}
        self.tracker: ChangeTracker | None = None
        self.worker: Worker | None = None

    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def header(self, number: int, title: str) -> None:
        self.say(f"\n[{number}/{STEPS}] {title}")

    def step(self, name: str, seconds: float, rows: str, result: str) -> None:
        self.report.steps.append(Step(name, seconds, rows, result))

    def run(self) -> None:
        self.start_oracle()
        self.generate_corpus()
        self.backfill()
        self.catch_up()
        self.live_changes()
        self.recompute()
        self.compare()
        write_chart(self.report, Path(self.report.chart))

    # ---------------------------------------------------------------- 1

    def start_oracle(self) -> None:
        self.header(1, "timestamp oracle")
        started = time.monotonic()
        if self.options.oracle is not None:
            self.oracle_url = self.options.oracle
            where = "the running oracle service"
        else:
            process = OracleProcess(self.store_url, self.run_dir / "oracle.log")
            self.stack.callback(process.stop)
            self.oracle_url = process.url
            where = f"oracle service started (pid {process.pid}, log {process.log_path.name})"
        self.report.oracle = self.oracle_url
        client = percolator.connect(self.store_url, oracle=self.oracle_url)
        self.stack.callback(client.close)
        self.client = client
        first = client.oracle.get_timestamp()  # it serves (a standby would time out here)
        self.say(f"  {where} at {self.oracle_url}\n"
                 f"  first timestamp {describe(first)}; every process of the demo uses it")
        self.step("oracle", time.monotonic() - started, "-", self.oracle_url)

    # ---------------------------------------------------------------- 2

    def generate_corpus(self) -> None:
        count = self.options.documents
        self.header(2, f"generate a corpus of {count} web documents")
        started = time.monotonic()
        self.documents = corpus.generate(count, seed=self.options.seed)
        write_corpus_jsonl(self.corpus_path, self.documents)
        distinct = len({reference.fingerprint((d.body or "").encode()) for d in self.documents})
        links = sum(len(d.links) for d in self.documents)
        self.say(f"  {self.corpus_path.name}: {count} documents, {distinct} distinct bodies "
                 f"(the others are duplicates up to case and punctuation), {links} links")
        self.step("generate corpus", time.monotonic() - started, f"{count} docs",
                  f"{distinct} distinct, {links} links")

    # ---------------------------------------------------------------- 3

    def backfill(self) -> None:
        from percolator.demo.spark import BackfillMonitor, start_spark
        from spark_jobs.backfill import MAX_BUCKETS, BackfillOptions, run_backfill

        assert self.client is not None
        self.header(3, "Spark backfill: load the corpus through transactions, exactly once")
        pipeline.create_tables(self.client)
        observers = pipeline.observers()
        register_observers(self.client, observers)
        self.say(f"  observers registered first ({', '.join(o.name for o in observers)}), so "
                 "the load leaves notifications for them")
        started = time.monotonic()
        log = self.run_dir / "spark.log"
        self.say(f"  starting Spark ({self.options.master}; its log: {log.name})")
        spark = start_spark(self.options.master, f"percolator-demo-{self.run_dir.name}", log)
        self.stack.callback(_stop_spark, spark)
        self.spark = spark
        spark_s = time.monotonic() - started
        self.say(f"  Spark {spark.version} is up ({_seconds(spark_s)})")
        self.step("Spark start", spark_s, "-", f"Spark {spark.version}, {self.options.master}")

        started = time.monotonic()
        rows = self.options.documents
        parallelism = spark.sparkContext.defaultParallelism
        # One write task per bucket; a finished task advances the bar, so have enough.
        buckets = min(MAX_BUCKETS, max(2 * parallelism, math.ceil(rows / (2 * BACKFILL_BATCH))))
        monitor = BackfillMonitor(self.out)
        result = run_backfill(
            spark,
            BackfillOptions(
                store=self.store_url, table=reference.DOCUMENTS,
                inputs=(str(self.corpus_path),), key="url", oracle=self.oracle_url,
                batch_size=BACKFILL_BATCH, buckets=buckets, progress_interval_s=_POLL_S,
            ),
            progress=monitor,
        )
        write_s = monitor.close(result.rows_written + result.rows_skipped)
        self.report.backfill_samples = list(monitor.samples)
        rate = result.rows_written / write_s if write_s > 0 else 0.0
        self.say(f"  {result.rows_written} rows written in {result.batches_written} "
                 f"transactions of up to {result.batch_size} rows over {result.buckets} Spark "
                 f"tasks (input check {_seconds(result.check_seconds)}, writing "
                 f"{_seconds(write_s)}: {rate:.0f} rows/s)")
        self.step("Spark backfill", time.monotonic() - started, f"{result.rows_written} rows",
                  f"{rate:.0f} rows/s")

    # ---------------------------------------------------------------- 4

    def catch_up(self) -> None:
        assert self.client is not None
        client = self.client
        threads = self.options.threads
        self.header(4, f"observers catch up: a worker ({threads} threads) runs until no "
                    "notification is left")
        tracker = self.tracker = ChangeTracker(client)
        worker = Worker(client, pipeline.observers(), WorkerOptions(
            threads=threads, idle_sleep_s=0.01, backoff_base_s=0.05,
            on_commit=tracker.on_commit,
        ))
        # Stopping lets runs in flight commit or roll back; their notifications stay.
        self.stack.callback(worker.stop, 5.0)
        self.worker = worker
        started = time.monotonic()
        worker.start()
        bar = Progress("  observer runs", None, unit="runs", stream=self.out)
        last_runs, last_progress = -1, time.monotonic()
        while True:
            scan_started = time.monotonic()
            left = pending_count(client)  # upstream columns first: sound (tracking.py)
            scan_s = time.monotonic() - scan_started
            runs = tracker.runs
            self.report.drain_samples.append((time.monotonic() - started, left, runs))
            bar.update(runs, total=runs + left, extra=f"- {left} notifications pending")
            if left == 0:
                break
            if runs != last_runs:
                last_runs, last_progress = runs, time.monotonic()
            self._check_progress(worker, last_progress)
            # Counting costs a scan of every notification: on a large backlog, count less
            # often than the worker works.
            time.sleep(max(_POLL_S, 4 * scan_s))
        elapsed = bar.close(extra="- quiet")
        self.step("observers to quiescence", elapsed, f"{tracker.runs} runs",
                  "no notification left")

    def _check_progress(self, worker: Worker, last_progress: float) -> None:
        """Fail instead of waiting forever: parked notifications never clear, and a long
        time without a committed run while work is pending means something is stuck."""
        parked = int(sum(worker.parked_by_observer().values()))
        if parked:
            raise PercolatorError(
                f"{parked} notification(s) were parked after repeated observer failures (the "
                "warnings above say why); `percolator notifications list --store "
                f"{self.store_url}` lists them"
            )
        if time.monotonic() - last_progress > STALL_S:
            raise PercolatorError(
                f"no observer run committed for {STALL_S:.0f} s while notifications are "
                "pending; the warnings above may say why"
            )

    # ---------------------------------------------------------------- 5

    def live_changes(self) -> None:
        assert self.client is not None and self.tracker is not None and self.worker is not None
        client, tracker, worker = self.client, self.tracker, self.worker
        fraction = self.options.change_fraction
        changes = corpus.mutate(self.documents, fraction=fraction, seed=self.options.seed + 1)
        count = _plural(len(changes), "change")
        self.header(5, f"live: change {fraction * 100:g}% of the documents ({count}, one "
                    "transaction each) and watch the derived data land")
        self.say("  latency = commit of the last observer run a change caused - the change's "
                 "commit")
        by_url = {doc.url: doc for doc in self.documents}
        width = min(48, max(len(change.url) for change in changes))
        landed: list[ChangeLatency] = []

        def show(items: list[ChangeLatency]) -> None:
            for item in items:
                landed.append(item)
                self.say(self._live_line(len(landed), len(changes), item, width))

        tracker.watch()
        started = time.monotonic()
        for change in changes:
            corpus.write_documents(client, [change], batch=1)
            # The demo is the only writer of the input columns: the visible commit of the
            # body right after the write is the change's own commit.
            with client.snapshot() as snapshot:
                _, commit_ts = snapshot.get_with_commit_ts(reference.DOCUMENTS, change.url,
                                                           "body")
            if commit_ts is None:
                raise PercolatorError(f"the change of {change.url} left no commit")
            old = by_url.get(change.url)
            tracker.expect(change.url, change_kind(old, change.document), commit_ts,
                           clusters_touched(old, change.document))
            show(tracker.poll())
        quiet_since: float | None = None
        last_count, last_progress = -1, time.monotonic()
        while True:
            show(tracker.poll())
            quiet = is_quiet(client)
            if quiet and not tracker.outstanding:
                break
            now = time.monotonic()
            if quiet:
                quiet_since = quiet_since or now
                if now - quiet_since > REPORT_GRACE_S:
                    show(tracker.finish())
                    continue
            else:
                quiet_since = None
                if tracker.runs != last_count:
                    last_count, last_progress = tracker.runs, now
                self._check_progress(worker, last_progress)
            time.sleep(0.01)
        self.report.incremental_s = time.monotonic() - started
        worker.stop(5.0)  # idle from here on; it must not disturb the timings below
        self.current = corpus.apply_changes(self.documents, changes)
        self.report.changes = landed
        measured = [c.total_ms for c in landed if c.total_ms is not None]
        self.say(f"  {count} written and processed in "
                 f"{_seconds(self.report.incremental_s)}; the worker is stopped")
        self.step("live changes (incremental)", self.report.incremental_s,
                  count,
                  f"max {max(measured):.0f} ms per change" if measured else "not measured")

    def _live_line(self, index: int, total: int, item: ChangeLatency, width: int) -> str:
        position = f"[{index:{len(str(total))}}/{total}]"
        url = item.url if len(item.url) <= width else "..." + item.url[-(width - 3):]
        if item.measured and item.total_ms is not None:
            parts = ", ".join(
                f"{_STAGE_LABELS[stage]} {item.stages_ms[stage]:.0f} ms"
                for stage in (CLUSTERS_STAGE, INDEX_STAGE, INLINKS_STAGE)
                if stage in item.stages_ms
            )
            outcome = f"{parts} -> all updated in {item.total_ms:.0f} ms"
        else:
            outcome = "updated (latency not measured: a run's report was lost)"
        return f"  {position} {url:<{width}} {item.kind:<14} -> {outcome}"

    # ---------------------------------------------------------------- 6

    def recompute(self) -> None:
        from spark_jobs.export import ExportOptions, export_table
        from spark_jobs.recompute import collect_tables, recompute

        assert self.spark is not None
        self.header(6, "full recompute with Spark: export the documents at one snapshot, "
                    "recompute every derived table")
        started = time.monotonic()
        export = export_table(self.spark, ExportOptions(
            self.store_url, reference.DOCUMENTS, columns=("body", "links"),
            oracle=self.oracle_url,
        ))
        self.recomputed = collect_tables(recompute(self.spark, export.df))
        self.report.recompute_s = time.monotonic() - started
        cells = sum(len(row) for table in self.recomputed.values() for row in table.values())
        self.report.derived_cells = cells
        self.say(f"  exported at {describe(export.read_ts)}; {cells} derived cells "
                 f"recomputed in {_seconds(self.report.recompute_s)}")
        self.step("Spark full recompute", self.report.recompute_s, f"{cells} cells",
                  "export + recompute")

    # ---------------------------------------------------------------- 7

    def compare(self) -> None:
        assert self.client is not None
        self.header(7, "compare: the stored incremental tables against the recompute and "
                    "the Python reference")
        started = time.monotonic()
        with self.client.snapshot() as snapshot:
            incremental = reference.read_derived(snapshot)
        against_recompute = reference.diff(self.recomputed, incremental)
        expected = reference.compute(corpus.as_input(self.current))
        against_reference = reference.diff(expected, incremental)
        report = self.report
        report.identical = not against_recompute
        report.matches_reference = not against_reference
        report.problems = [f"vs recompute: {p}" for p in against_recompute[:10]] + [
            f"vs reference: {p}" for p in against_reference[:10]
        ]
        cells = sum(len(row) for table in incremental.values() for row in table.values())
        for name, ok in (("the Spark recompute", report.identical),
                         ("the Python reference", report.matches_reference)):
            self.say(f"  incremental tables {'==' if ok else '!='} {name}"
                     f"{' (byte for byte, ' + str(cells) + ' cells)' if ok else ''}")
        for problem in report.problems:
            self.say(f"    {problem}")
        verdict = "identical" if report.ok else "DIFFERENT"
        self.step("compare", time.monotonic() - started, f"{cells} cells", verdict)

    # ---------------------------------------------------------------- clean

    def clean(self, tables_before: frozenset[str]) -> None:
        """Remove the store data the demo wrote (``--clean``); never raises."""
        try:
            if self.options.store is None:
                shutil.rmtree(self.run_dir / "store", ignore_errors=False)
            else:
                with open_store(self.store_url) as store:
                    for table in sorted(set(store.list_tables()) - tables_before):
                        store.drop_table(table)
            self.report.cleaned = True
        except (OSError, PercolatorError) as exc:
            self.say(f"  could not remove the demo's store data: {exc}")


__all__ = ["DemoOptions", "check_extras", "check_oracle", "check_store", "run_demo"]

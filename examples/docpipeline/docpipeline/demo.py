"""``percolator demo``: the whole engine on a generated corpus, in one command.

A command of this example package (entry-point group ``percolator.commands``), present only
when the package is installed.

Steps (each printed with a header; long ones with a progress bar):

1. **oracle** - start a timestamp oracle server (``percolator oracle serve``) on the store;
2. **corpus** - generate a seeded corpus of web documents (corpus.py) as JSON;
3. **backfill** - load it with Spark through transactions (``percolator.spark_jobs.backfill``); the
   example pipeline's observers are registered first, so the load leaves notifications;
4. **observers** - run a worker until the observers reach quiescence (duplicate clusters,
   inverted index, inbound links are then up to date);
5. **live changes** - change ``--change-fraction`` of the documents, one transaction each,
   while the worker runs, printing the derived updates as they land with their latency;
6. **recompute** - export the documents at one snapshot and recompute every derived table
   from scratch with Spark (recompute.py);
7. **compare** - the incremental tables must equal the recompute exactly (and the pure-Python
   reference, reference.py); the times of both are compared.

A summary table ends the run and a PNG chart of the observer latencies is written to a path
it prints.  Exit code 0 only if the results are identical.  ``--json`` prints the summary as
JSON on stdout (everything else goes to stderr then).

Default store: a fresh embedded store in a new run directory under ``--work-dir`` (kept, so
the data and the chart can be inspected).  ``--store URL`` runs on an existing store (e.g.
``hbase://HOST:PORT?prefix=demo_``); its demo tables must not exist yet.
"""

from __future__ import annotations

import argparse
import json
import queue
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from percolator.command_options import (
    NON_NEGATIVE_INT,
    POSITIVE_INT,
    add_oracle_option,
    float_option,
    int_option,
)
from percolator.errors import ConfigError, PercolatorError

if TYPE_CHECKING:
    from percolator.observers.runner import Notification, RunResult

    import percolator

DEFAULT_WORK_DIR = "demo-out"
# The pipeline's observed columns, upstream first: documents/body feeds doc_clusters/canonical.
OBSERVED = [("documents", "body"), ("documents", "links"), ("doc_clusters", "canonical")]
LIVE_LINES = 25  # live update lines printed before summarising the rest


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "demo",
        help="the whole pipeline on a generated corpus: backfill, observers, live changes, "
        "recompute, compare (embedded store by default)",
        description="Start an oracle, backfill a generated corpus with Spark, run observers to "
        "quiescence, change a fraction of the documents and watch the incremental updates "
        "land, then recompute everything with Spark and check both agree.  Needs the "
        "'demo' extra (pyspark, matplotlib).",
    )
    parser.add_argument(
        "--store",
        default=None,
        help="store URL (default: a fresh embedded store in the run directory); its demo "
        "tables must not exist yet - on HBase use ?prefix=",
    )
    add_oracle_option(parser)
    parser.add_argument(
        "--documents",
        type=int_option(10),
        default=1000,
        metavar="N",
        help="corpus size (%(default)s)",
    )
    parser.add_argument(
        "--change-fraction",
        type=float_option(0, 1, above=True),
        default=0.01,
        metavar="F",
        help="fraction of documents changed live (%(default)s)",
    )
    parser.add_argument(
        "--seed", type=NON_NEGATIVE_INT, default=7, help="corpus seed (%(default)s)"
    )
    parser.add_argument(
        "--threads", type=POSITIVE_INT, default=4, help="worker threads (%(default)s)"
    )
    parser.add_argument("--master", default="local[2]", help="Spark master (%(default)s)")
    parser.add_argument(
        "--work-dir",
        default=DEFAULT_WORK_DIR,
        help="where run directories go (default ./%(default)s)",
    )
    parser.add_argument("--chart", help="PNG path of the latency chart (default: in the run dir)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    parser.set_defaults(func=run)


# --------------------------------------------------------------------------- checks


def _check_args(args: argparse.Namespace) -> None:
    # The numbers are checked by their argparse types (percolator/command_options.py).
    for module, extra in (("pyspark", "demo"), ("matplotlib", "demo")):
        try:
            __import__(module)
        except ImportError:
            raise ConfigError(
                f"the demo needs {module}, which is not installed: "
                f"pip install 'percolator-engine[{extra}]' (or run `make demo`)"
            ) from None


# --------------------------------------------------------------------------- oracle


class OracleServer:
    """A ``percolator oracle serve`` subprocess on a free loopback port."""

    def __init__(self, store_url: str, log_path: Path) -> None:
        self.log_path = log_path
        self._log = log_path.open("w")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "percolator",
                "oracle",
                "serve",
                "--create",
                "--store",
                store_url,
                "--listen",
                "127.0.0.1:0",
            ],
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("oracle: listening on "):
            self.stop()
            tail = log_path.read_text()[-500:].strip()
            raise PercolatorError(f"the oracle did not start: {line.strip() or tail}")
        self.address = line.split()[3]
        self.url = f"grpc://{self.address}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


# --------------------------------------------------------------------------- steps


@dataclass
class Step:
    name: str
    seconds: float
    rows: str
    result: str


@dataclass
class LiveRun:
    observer: str
    row: str
    latency_ms: float


@dataclass
class DemoReport:
    store: str
    oracle: str
    run_dir: str
    documents: int
    changes: int = 0
    steps: list[Step] = field(default_factory=list)
    live: list[LiveRun] = field(default_factory=list)
    incremental_s: float = 0.0
    recompute_s: float = 0.0
    identical: bool = False
    matches_reference: bool = False
    chart: str = ""
    problems: list[str] = field(default_factory=list)

    @property
    def speedup(self) -> float:
        return self.recompute_s / self.incremental_s if self.incremental_s > 0 else 0.0

    @property
    def break_even(self) -> float:
        """The change fraction at which processing changes incrementally costs as much as a
        full recompute: recompute time / (incremental time per change x corpus size)."""
        if not self.changes or not self.incremental_s or not self.documents:
            return 0.0
        per_change = self.incremental_s / self.changes
        return self.recompute_s / (per_change * self.documents)


def _header(out: TextIO, number: int, title: str) -> None:
    print(f"\n[{number}/7] {title}", file=out, flush=True)


def _pending(client: percolator.Client) -> int:
    from percolator.observers.parking import pending

    return sum(len(pending(client, table, [column])) for table, column in OBSERVED)


def _wait_quiet(client: percolator.Client, progress: Any, timeout_s: float = 1800) -> None:
    """Until the observers' low watermarks pass the moment of the call: every change written
    before it, and everything the pipeline derived from it, is processed (``wait_for``,
    percolator/watermark.py).  Waits in one-second slices to show the backlog meanwhile."""
    from percolator.watermark import WatermarkTimeoutError

    target = client.oracle.get_timestamp()
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            client.wait_for(target, timeout=1.0)
        except WatermarkTimeoutError as exc:
            if time.monotonic() > deadline:
                raise PercolatorError(
                    f"observers did not catch up in {timeout_s:.0f} s: {exc}"
                ) from None
        else:
            if progress is not None:
                progress.update(progress.total, extra="(0 pending)")
            return
        if progress is not None:
            left = _pending(client)
            progress.update(
                max(0, progress.total - left) if progress.total else 0, extra=f"({left} pending)"
            )


def _write_corpus(path: Path, documents: list[Any]) -> None:
    with path.open("w", encoding="utf-8") as out:
        for doc in documents:
            links = doc.links_value()
            out.write(
                json.dumps(
                    {"url": doc.url, "body": doc.body, "links": links.decode() if links else None}
                )
                + "\n"
            )


def _refuse_existing_tables(client: percolator.Client) -> None:
    from docpipeline import pipeline

    existing = sorted(set(pipeline.TABLES) & set(client.list_tables()))
    if existing:
        raise ConfigError(
            f"the store {client.store.url} already has demo tables ({', '.join(existing)}); "
            "use a fresh store (omit --store) or, on HBase, a new ?prefix="
        )


def run(args: argparse.Namespace) -> int:
    _check_args(args)
    out = sys.stderr if args.json else sys.stdout
    run_dir = Path(args.work_dir) / time.strftime("run-%Y%m%d-%H%M%S")
    run_dir.mkdir(parents=True, exist_ok=True)
    store_url = args.store or f"embedded:{run_dir / 'store'}"
    report = DemoReport(store_url, "", str(run_dir), args.documents)
    print(f"demo: run directory {run_dir}, store {store_url}", file=out, flush=True)
    oracle: OracleServer | None = None
    try:
        oracle, oracle_url = _step_oracle(args, store_url, run_dir, report, out)
        report.oracle = oracle_url
        _run_pipeline(args, store_url, oracle_url, run_dir, report, out)
    finally:
        if oracle is not None:
            oracle.stop()
    _print_summary(report, out)
    if args.json:
        print(json.dumps(_as_json(report), sort_keys=True))
    return 0 if report.identical and report.matches_reference else 1


def _step_oracle(
    args: argparse.Namespace, store_url: str, run_dir: Path, report: DemoReport, out: TextIO
) -> tuple[OracleServer | None, str]:
    import percolator

    _header(out, 1, "timestamp oracle")
    started = time.monotonic()
    # Check the store first: one clear line if it is unreachable or already used.
    with percolator.connect(store_url, oracle=args.oracle) as client:
        _refuse_existing_tables(client)
    if args.oracle:
        with percolator.connect(store_url, oracle=args.oracle) as client:
            client.snapshot()  # fails with one line if no oracle answers there
        print(f"  using the oracle at {args.oracle}", file=out)
        report.steps.append(Step("oracle", time.monotonic() - started, "-", args.oracle))
        return None, str(args.oracle)
    server = OracleServer(store_url, run_dir / "oracle.log")
    print(f"  oracle serving at {server.url} (log {server.log_path})", file=out, flush=True)
    report.steps.append(Step("oracle", time.monotonic() - started, "-", server.url))
    return server, server.url


def _run_pipeline(
    args: argparse.Namespace,
    store_url: str,
    oracle_url: str,
    run_dir: Path,
    report: DemoReport,
    out: TextIO,
) -> None:
    from percolator.observers.api import register_observers
    from percolator.observers.worker import Worker, WorkerOptions
    from percolator.spark_jobs.backfill import run_backfill
    from percolator.spark_jobs.export import ExportOptions, export_table
    from percolator.spark_jobs.prepare import BackfillOptions
    from percolator.spark_jobs.session import build_session

    import percolator
    from docpipeline import corpus, pipeline, reference
    from docpipeline.recompute import collect_tables, recompute
    from percolator.progress import Progress

    _header(out, 2, f"generate a corpus of {args.documents} documents")
    started = time.monotonic()
    documents = corpus.generate(args.documents, seed=args.seed)
    source = run_dir / "corpus.jsonl"
    _write_corpus(source, documents)
    print(f"  wrote {source} (duplicates, near-duplicates and links included)", file=out)
    report.steps.append(
        Step("generate corpus", time.monotonic() - started, str(args.documents), str(source))
    )

    live_queue: queue.Queue[LiveRun] = queue.Queue()
    counting = {"runs": 0}
    watched: set[bytes] = set()

    def on_commit(observer: str, notification: Notification, result: RunResult) -> None:
        counting["runs"] += 1
        latency = result.latency_s
        if watched and latency is not None:
            row = notification.row.decode("utf-8", "replace")
            live_queue.put(LiveRun(observer, row, latency * 1000))

    _header(out, 3, "backfill the corpus with Spark (exactly once, through transactions)")
    started = time.monotonic()
    # Spark first: it forks to start its JVM, and a process that already runs gRPC threads
    # (the oracle client below) must not fork (the JVM launch then fails at random).
    spark = build_session(args.master, app_name="percolator-demo")
    with percolator.connect(store_url, oracle=oracle_url) as client:
        pipeline.create_tables(client)
        observers = pipeline.observers()
        register_observers(client, observers)

        backfill = run_backfill(
            spark,
            BackfillOptions(
                store=store_url,
                table=reference.DOCUMENTS,
                inputs=(str(source),),
                key="url",
                oracle=oracle_url,
                progress_interval_s=3.0,
            ),
        )
        report.steps.append(
            Step(
                "Spark backfill",
                time.monotonic() - started,
                str(backfill.rows_written),
                f"{backfill.rate:.0f} rows/s",
            )
        )
        print(f"  {backfill.summary()}", file=out, flush=True)

        _header(
            out,
            4,
            "observers catch up (a worker with "
            f"{args.threads} threads runs until no notification is left)",
        )
        started = time.monotonic()
        options = WorkerOptions(
            threads=args.threads, idle_sleep_s=0.01, backoff_base_s=0.05, on_commit=on_commit
        )
        worker = Worker(client, observers, options)
        worker.start()
        try:
            backlog = _pending(client)
            bar = Progress("  notifications", backlog, stream=out)
            _wait_quiet(client, bar)
            elapsed = bar.close(extra=f"{counting['runs']} observer runs committed")
            report.steps.append(
                Step("observers to quiescence", elapsed, f"{counting['runs']} runs", "quiet")
            )

            _header(out, 5, f"change {args.change_fraction:.1%} of the documents, live")
            changes = corpus.mutate(documents, fraction=args.change_fraction, seed=args.seed + 1)
            current = corpus.apply_changes(documents, changes)
            report.changes = len(changes)
            watched.update(c.url.encode() for c in changes)
            started = time.monotonic()
            writer = threading.Thread(
                target=corpus.write_documents,
                args=(client, changes),
                kwargs={"batch": 1},
                daemon=True,
            )
            writer.start()
            printed = 0
            while writer.is_alive() or _pending(client) or not live_queue.empty():
                try:
                    item = live_queue.get(timeout=0.2)
                except queue.Empty:
                    continue
                report.live.append(item)
                if printed < LIVE_LINES:
                    print(
                        f"  {item.observer:13} {item.row[:60]:60} updated "
                        f"{item.latency_ms:6.0f} ms after its change",
                        file=out,
                        flush=True,
                    )
                    printed += 1
            writer.join()
            _wait_quiet(client, None)
            while not live_queue.empty():
                report.live.append(live_queue.get())
            report.incremental_s = time.monotonic() - started
            if len(report.live) > printed:
                print(f"  ... and {len(report.live) - printed} more updates", file=out)
            print(
                f"  {len(changes)} changes processed incrementally in "
                f"{report.incremental_s:.2f} s ({len(report.live)} observer runs)",
                file=out,
            )
            report.steps.append(
                Step(
                    "incremental update",
                    report.incremental_s,
                    f"{len(changes)} changes",
                    f"{len(report.live)} runs",
                )
            )
        finally:
            worker.stop()

        _header(out, 6, "full recompute with Spark (export at one snapshot, recompute all)")
        started = time.monotonic()
        export = export_table(
            spark,
            ExportOptions(
                store_url, reference.DOCUMENTS, columns=("body", "links"), oracle=oracle_url
            ),
        )
        recomputed = collect_tables(recompute(spark, export.df).collect())
        report.recompute_s = time.monotonic() - started
        cells = sum(len(c) for t in recomputed.values() for c in t.values())
        print(
            f"  recomputed {cells} derived cells from {args.documents} documents in "
            f"{report.recompute_s:.2f} s",
            file=out,
        )
        report.steps.append(
            Step("Spark full recompute", report.recompute_s, f"{cells} cells", "from an export")
        )

        _header(out, 7, "compare")
        started = time.monotonic()
        with client.snapshot() as snap:
            incremental = reference.read_derived(snap)
        problems = reference.diff(recomputed, incremental)
        report.identical = not problems
        expected = reference.compute(corpus.as_input(current))
        report.matches_reference = not reference.diff(expected, incremental)
        report.problems = problems[:10]
        verdict = "identical" if report.identical else f"{len(problems)} differences"
        print(
            f"  incremental vs recompute: {verdict}; vs the Python reference: "
            f"{'identical' if report.matches_reference else 'DIFFERENT'}",
            file=out,
        )
        for line in problems[:10]:
            print(f"    {line}", file=out)
        report.steps.append(Step("compare", time.monotonic() - started, f"{cells} cells", verdict))
    chart = Path(args.chart) if args.chart else run_dir / "latency.png"
    report.chart = str(_write_chart(report, chart))


def _write_chart(report: DemoReport, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    by_observer: dict[str, list[float]] = {}
    for item in report.live:
        by_observer.setdefault(item.observer, []).append(item.latency_ms)
    for name, values in sorted(by_observer.items()):
        ordered = sorted(values)
        fractions = [(i + 1) / len(ordered) for i in range(len(ordered))]
        left.step(ordered, fractions, where="post", label=f"{name} (n={len(ordered)})")
    left.set_xlabel("commit of a change -> commit of the observer run (ms)")
    left.set_ylabel("fraction of runs")
    left.set_title("Observer latency (CDF)")
    left.grid(alpha=0.3)
    if by_observer:
        left.legend(loc="lower right", fontsize=8)
    right.bar(
        ["incremental", "Spark recompute"],
        [report.incremental_s, report.recompute_s],
        color=["tab:green", "tab:gray"],
    )
    right.set_ylabel("seconds")
    right.set_title(f"{report.changes} changes: {report.speedup:.1f}x faster incrementally")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def _print_summary(report: DemoReport, out: TextIO) -> None:
    print("\nsummary", file=out)
    width = max(len(s.name) for s in report.steps) if report.steps else 10
    print(f"  {'step':{width}}  {'time':>8}  {'rows':>14}  result", file=out)
    for step in report.steps:
        print(
            f"  {step.name:{width}}  {step.seconds:7.2f}s  {step.rows:>14}  {step.result}", file=out
        )
    if report.live:
        latencies = sorted(item.latency_ms for item in report.live)
        p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
        print(
            f"  observer latency p50 {statistics.median(latencies):.0f} ms, p99 {p99:.0f} ms "
            f"over {len(latencies)} runs",
            file=out,
        )
    if report.incremental_s:
        print(
            f"  incremental {report.incremental_s:.2f} s vs full recompute "
            f"{report.recompute_s:.2f} s: {report.speedup:.1f}x; break-even change "
            f"fraction {report.break_even:.1%} (incremental is cheaper below it)",
            file=out,
        )
    ok = report.identical and report.matches_reference
    print(f"  result: {'OK - incremental == recompute == reference' if ok else 'FAILED'}", file=out)
    if report.chart:
        print(f"  chart: {report.chart}", file=out)
    out.flush()


def _as_json(report: DemoReport) -> dict[str, Any]:
    latencies = sorted(item.latency_ms for item in report.live)
    return {
        "store": report.store,
        "oracle": report.oracle,
        "run_dir": report.run_dir,
        "documents": report.documents,
        "changes": report.changes,
        "steps": [step.__dict__ for step in report.steps],
        "observer_runs_live": len(latencies),
        "latency_ms_p50": statistics.median(latencies) if latencies else None,
        "incremental_s": report.incremental_s,
        "recompute_s": report.recompute_s,
        "speedup": report.speedup,
        "break_even_fraction": report.break_even,
        "identical": report.identical,
        "matches_reference": report.matches_reference,
        "problems": report.problems,
        "chart": report.chart,
    }

"""``percolator demo``, the README's first command.

* End to end, as users run it: the real command in a subprocess, on the embedded default and
  on HBase (``spark``; the HBase one also ``hbase``).  What the demo claims is checked against
  the store itself afterwards: the stored derived tables equal observers/reference.py of the
  stored documents.
* Interrupted (Ctrl-C while the worker runs, SIGTERM while Spark starts): exit code 130 and
  no process left behind - neither the oracle service nor Spark's JVM.
* Bad configuration: one line naming the problem, exit code 2, nothing started.
* The latency tracker on a real worker (memory store, no Spark): each change's stages are
  the observer runs that change really caused.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

import percolator
from observers import corpus, pipeline, reference
from observers.api import register_observers
from observers.worker import Worker, WorkerOptions, run_until_quiet
from percolator.cli import main
from percolator.client import OBSERVED_REFRESH_ENV
from percolator.demo.spark import BackfillMonitor
from percolator.demo.steps import change_kind, clusters_touched
from percolator.demo.tracking import (
    CLUSTERS_STAGE,
    INDEX_STAGE,
    INLINKS_STAGE,
    OBSERVED,
    ChangeTracker,
    is_quiet,
)
from percolator.errors import OracleError
from percolator.store import open_store

ROOT = Path(__file__).resolve().parent.parent
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
STEP_NAMES = [
    "oracle", "generate corpus", "Spark start", "Spark backfill", "observers to quiescence",
    "live changes (incremental)", "Spark full recompute", "compare",
]
# "  [ 3/12] http://... new body  -> clusters 35 ms, ..., inlinks 40 ms -> all updated in 80 ms"
RUN_DIR_LINE = re.compile(r"run directory (\S+)")
LIVE_LINE = re.compile(r"^  \[\s*\d+/\d+\] (\S+)\s+.* -> all updated in (\d+) ms$")


def clean_env() -> dict[str, str]:
    """The environment without the project's settings, as on a fresh machine."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PERCOLATOR_")}


def demo_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "percolator.cli", "demo", *args]


def run_demo(*args: str, cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        demo_command(*args), cwd=cwd, env=clean_env(), capture_output=True, text=True,
        timeout=timeout,
    )


def connect_after_the_demo(store_url: str) -> percolator.Client:
    """A client with the store's own oracle.  The demo's oracle service released its lease
    when it stopped; the store's oracle may take over once the lease's clock margin after
    the release has passed, and refuses until then."""
    deadline = time.monotonic() + 30
    while True:
        client = percolator.connect(store_url)
        try:
            client.oracle.get_timestamp()
            return client
        except OracleError:
            client.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def check_run(result: subprocess.CompletedProcess[str], documents: int) -> dict[str, Any]:
    """What every successful run must show; returns the JSON summary."""
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    summary: dict[str, Any] = json.loads(result.stdout)
    log = result.stderr
    assert summary["ok"] is True
    assert summary["identical"] is True and summary["matches_reference"] is True
    assert summary["problems"] == []
    assert [step["name"] for step in summary["steps"]] == STEP_NAMES
    for number in range(1, 8):
        assert f"[{number}/7] " in log
    # The backfill's progress bar saw the backfill's own progress lines.
    assert f"backfill [########################] {documents}/{documents} rows" in log
    assert "observer runs [" in log and "notifications pending" in log

    # Live: one line per change, each with its latency, matching the JSON.
    changes = summary["changes"]
    assert len(changes) >= 2
    lines = [m for m in map(LIVE_LINE.match, log.splitlines()) if m]
    assert sorted(m.group(1) for m in lines) == sorted(c["url"] for c in changes)
    for change in changes:
        assert change["measured"] is True
        stages = change["stages_ms"]
        assert CLUSTERS_STAGE in stages and INLINKS_STAGE in stages
        assert all(value >= 0 for value in stages.values())
        assert change["latency_ms"] == max(stages.values())
    assert summary["latency_ms"]["max"] == max(c["latency_ms"] for c in changes)
    assert summary["incremental_s"] > 0 and summary["recompute_s"] > 0
    assert summary["speedup"] == pytest.approx(summary["recompute_s"] / summary["incremental_s"])
    assert "result: OK - incremental tables == Spark recompute == Python reference" in log
    assert f"chart: {summary['chart']}" in log

    chart = Path(summary["chart"])
    data = chart.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 10_000

    # Independently of what the demo says: read the store and recompute the reference from
    # the stored documents.
    with connect_after_the_demo(summary["store"]) as client, client.snapshot() as snapshot:
        documents_stored = reference.read_documents(snapshot)
        derived = reference.read_derived(snapshot)
    mutated = [c for c in changes if c["kind"] == "new document"]
    deleted = [c for c in changes if c["kind"] == "deleted"]
    assert len(documents_stored) == documents + len(mutated) - len(deleted)
    assert reference.diff(reference.compute(documents_stored), derived) == []
    assert sum(len(row) for t in derived.values() for row in t.values()) == summary[
        "derived_cells"
    ]
    return summary


# --------------------------------------------------------------------------- end to end


@pytest.mark.spark
def test_demo_on_the_embedded_default(tmp_path: Path) -> None:
    result = run_demo("--documents", "200", "--json", "--work-dir", "out", cwd=tmp_path)
    summary = check_run(result, 200)
    run_dir = Path(summary["run_dir"])
    assert run_dir.parent == tmp_path / "out"
    assert summary["store"] == f"embedded:{run_dir / 'store'}"
    assert summary["oracle"].startswith("grpc://127.0.0.1:")
    assert Path(summary["chart"]) == run_dir / "latency.png"
    assert {p.name for p in run_dir.iterdir()} >= {
        "corpus.jsonl", "oracle.log", "spark.log", "latency.png", "store"
    }
    # Spark's JVM chatter went to its log, not to the terminal.
    assert "log4j" not in result.stderr and "WARN" not in result.stderr


@pytest.mark.spark
@pytest.mark.hbase
def test_demo_on_hbase(tmp_path: Path, hbase_url: str) -> None:
    separator = "&" if "?" in hbase_url else "?"
    store = f"{hbase_url}{separator}prefix=demo{uuid.uuid4().hex[:8]}_"
    try:
        result = run_demo("--documents", "200", "--json", "--store", store, "--work-dir", "out",
                          "--chart", str(tmp_path / "chart.png"), cwd=tmp_path)
        summary = check_run(result, 200)
        assert summary["store"] == store
        assert summary["chart"] == str(tmp_path / "chart.png")
        # A second run on the same namespace refuses to touch what is there.
        again = run_demo("--store", store, "--work-dir", "out", cwd=tmp_path, timeout=120)
        lines = again.stderr.strip().splitlines()
        assert again.returncode == 2 and len(lines) == 1
        assert f"store {store} is not empty" in lines[0]
    finally:
        with open_store(store) as s:
            for table in s.list_tables():
                s.drop_table(table)


def _processes_mentioning(*needles: str) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(needle in cmdline for needle in needles):
            found.append(f"{entry.name}: {cmdline[:200]}")
    return found


@pytest.mark.spark
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="lists processes through /proc")
@pytest.mark.parametrize(
    ("wait_for", "signum", "clean"),
    [
        pytest.param("[4/7]", signal.SIGINT, True, id="ctrl-c-while-the-worker-runs"),
        pytest.param("starting Spark", signal.SIGTERM, False, id="sigterm-while-spark-starts"),
    ],
)
def test_an_interrupted_demo_leaves_no_process_behind(
    tmp_path: Path, wait_for: str, signum: signal.Signals, clean: bool
) -> None:
    args = ["--documents", "200", "--work-dir", "out"] + (["--clean"] if clean else [])
    proc = subprocess.Popen(
        demo_command(*args), cwd=tmp_path, env=clean_env(),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    seen = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            seen.append(line)
            if wait_for in line:
                break
        else:
            pytest.fail("the demo ended before the moment to interrupt it:\n" + "".join(seen))
        run_dir = Path(next(m.group(1) for m in map(RUN_DIR_LINE.search, seen) if m))
        assert _processes_mentioning(str(run_dir)), "the oracle service should be running"
        proc.send_signal(signum)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, stderr
    assert stderr.strip().splitlines()[-1] == "percolator: interrupted"
    # The JVM notices that its parent is gone within a moment; the oracle must be gone
    # already (the demo stopped it).
    assert not _processes_mentioning(str(run_dir / "store"))
    deadline = time.monotonic() + 30
    while _processes_mentioning(f"percolator-demo-{run_dir.name}"):
        assert time.monotonic() < deadline, _processes_mentioning(run_dir.name)
        time.sleep(0.5)
    # --clean removes the store data, also when interrupted; the small files stay.
    assert (run_dir / "store").exists() is not clean
    assert (run_dir / "corpus.jsonl").exists()


# --------------------------------------------------------------------------- bad configuration


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Any:
    """Run ``percolator ...`` in this process, in a clean environment; returns
    ``(exit code, stdout, stderr lines)``."""
    for name in list(os.environ):
        if name.startswith("PERCOLATOR_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)

    def run(*argv: str) -> tuple[int, str, list[str]]:
        try:
            code = main(list(argv))
        except SystemExit as exc:  # argparse
            code = int(exc.code or 0)
        captured = capsys.readouterr()
        return code, captured.out, captured.err.strip().splitlines()

    return run


def test_unknown_option(cli: Any) -> None:
    code, _, err = cli("demo", "--bogus")
    assert code == 2 and err[-1] == "percolator: error: unrecognized arguments: --bogus"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--change-fraction", "2"], "--change-fraction must be in (0, 1], got 2.0"),
        (["--documents", "3"], "--documents must be at least 10, got 3"),
        (["--threads", "0"], "--threads must be at least 1, got 0"),
        (["--oracle", "grpc://127.0.0.1:1"], "--oracle needs --store"),
        (["--store", "memory:"], "a memory: store lives inside one process"),
        (["--store", "hbase://127.0.0.1:1"],
         "cannot reach HBase Thrift gateway at 127.0.0.1:1: connection refused"),
        (["--store", "embedded:s", "--oracle", "grpc://127.0.0.1:1"],
         "oracle 127.0.0.1:1 is unavailable"),
    ],
)
def test_bad_configuration_is_one_line(
    cli: Any, tmp_path: Path, args: list[str], message: str
) -> None:
    code, out, err = cli("demo", "--work-dir", "out", *args)
    assert code == 2 and out == ""
    assert len(err) == 1 and err[0].startswith("percolator: error: ") and message in err[0]
    assert not (tmp_path / "out").exists()  # nothing was started


def test_a_store_in_use_is_refused(cli: Any, tmp_path: Path) -> None:
    used = f"embedded:{tmp_path / 'used'}"
    with percolator.connect(used) as client:
        client.create_table("accounts")
        with client.transaction() as txn:
            txn.set("accounts", b"alice", "balance", b"10")
    code, _, err = cli("demo", "--store", used)
    assert code == 2 and len(err) == 1
    assert f"store {used} is not empty (tables: accounts, " in err[0]
    assert "new ?prefix=" in err[0]
    with percolator.connect(used) as client, client.snapshot() as snapshot:
        assert snapshot.get("accounts", b"alice", "balance") == b"10"


def test_an_oracle_of_another_store_is_refused(cli: Any, tmp_path: Path) -> None:
    from oracle.server import OracleServer, ServerOptions

    server = OracleServer(ServerOptions(f"embedded:{tmp_path / 'a'}", listen="127.0.0.1:0"))
    server.start()
    try:
        code, _, err = cli("demo", "--store", f"embedded:{tmp_path / 'b'}",
                           "--oracle", f"grpc://{server.address}")
    finally:
        server.stop()
    assert code == 2 and len(err) == 1
    assert f"the oracle at {server.address} serves the store embedded:{tmp_path / 'a'}" in err[0]


@pytest.mark.parametrize("module", ["pyspark", "matplotlib"])
def test_a_missing_extra_is_named(
    cli: Any, monkeypatch: pytest.MonkeyPatch, module: str
) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # makes `import module` fail
    code, _, err = cli("demo")
    assert code == 2 and len(err) == 1
    assert f"the demo needs {module}" in err[0]
    assert "pip install 'percolator-engine[demo]'" in err[0]


def test_missing_java_is_named(cli: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-jdk"))
    code, _, err = cli("demo", "--work-dir", "out")
    assert code == 2 and err == [
        f"percolator: error: the demo needs Java 17+ for Spark: JAVA_HOME={tmp_path / 'no-jdk'} "
        "has no bin/java"
    ]
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- parts


def test_the_tracker_attributes_each_run_to_the_change_that_caused_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Changes applied one at a time on a real worker: each change's stages are exactly the
    observer runs the pipeline's specification says it causes.  doc-index runs only when a
    cluster's canonical document changed, which reference.compute tells independently."""
    monkeypatch.setenv(OBSERVED_REFRESH_ENV, "200")
    assert sorted(OBSERVED) == sorted(
        (o.table, c) for o in pipeline.observers() for c in o.columns
    )
    documents = corpus.generate(60, seed=3)
    changes = corpus.mutate(documents, fraction=0.25, seed=5)
    # The same cluster twice in a row: a new document that sorts first joins it (becoming
    # its canonical), then goes again; each change must get its own doc-index run.
    first = "http://a.example/first"
    changes += [
        corpus.Change(first, corpus.Document(first, documents[5].body)),
        corpus.Change(first, None),
    ]
    with percolator.connect(f"memory:demo-{uuid.uuid4().hex}") as client:
        pipeline.create_tables(client)
        register_observers(client, pipeline.observers())
        corpus.write_documents(client, documents)
        run_until_quiet(client, pipeline.observers())
        tracker = ChangeTracker(client)
        worker = Worker(client, pipeline.observers(),
                        WorkerOptions(threads=2, idle_sleep_s=0.005, on_commit=tracker.on_commit))
        worker.start()
        try:
            tracker.watch()
            current = {d.url: d for d in documents}
            canonical_changes = 0
            for change in changes:
                before = reference.compute(corpus.as_input(current.values()))
                corpus.write_documents(client, [change], batch=1)
                with client.snapshot() as snapshot:
                    _, commit_ts = snapshot.get_with_commit_ts("documents", change.url, "body")
                assert commit_ts is not None
                old = current.get(change.url)
                fingerprints = clusters_touched(old, change.document)
                tracker.expect(change.url, change_kind(old, change.document), commit_ts,
                               fingerprints)
                deadline = time.monotonic() + 30
                landed = tracker.poll()
                while not landed:
                    assert time.monotonic() < deadline, f"{change.url} never landed"
                    time.sleep(0.01)
                    landed = tracker.poll()
                [latency] = landed
                if change.document is None:
                    del current[change.url]
                else:
                    current[change.url] = change.document
                after = reference.compute(corpus.as_input(current.values()))

                def canonical(tables: reference.Tables, fp: bytes) -> bytes | None:
                    return tables[reference.CLUSTERS].get(fp, {}).get("canonical")

                moved = any(canonical(before, fp) != canonical(after, fp) for fp in fingerprints)
                canonical_changes += moved
                assert latency.measured and latency.url == change.url
                assert latency.commit_ts == commit_ts
                assert set(latency.stages_ms) == (
                    {CLUSTERS_STAGE, INLINKS_STAGE} | ({INDEX_STAGE} if moved else set())
                ), change
                assert latency.total_ms == max(latency.stages_ms.values())
                assert all(value >= 0 for value in latency.stages_ms.values())
                if moved:  # doc-index runs after the doc-clusters run that notified it
                    assert latency.stages_ms[INDEX_STAGE] >= latency.stages_ms[CLUSTERS_STAGE]
            assert is_quiet(client) and tracker.outstanding == 0
            # The corpus and seed give both kinds of change: the test exercises both paths.
            assert 0 < canonical_changes < len(changes)
        finally:
            worker.stop()


def test_the_tracker_reports_a_change_it_never_saw_land_as_unmeasured() -> None:
    with percolator.connect(f"memory:demo-{uuid.uuid4().hex}") as client:
        tracker = ChangeTracker(client)
        tracker.watch()
        tracker.expect("http://a.example/x", "new body", client.oracle.get_timestamp(), [])
        assert tracker.poll() == [] and tracker.outstanding == 1
        [left] = tracker.finish()
        assert not left.measured and left.total_ms is None and tracker.outstanding == 0


def test_the_backfill_monitor_draws_the_backfills_progress_lines() -> None:
    import io

    out = io.StringIO()
    monitor = BackfillMonitor(out)
    monitor("checking input ['docs.jsonl'] (json)")
    monitor("writing 100 rows into documents as job j (4 buckets, 50 rows per transaction)")
    monitor("40/100 rows done (80 rows/s), 60 remaining, about 1 s left")
    monitor("100/100 rows done (90 rows/s), 0 remaining")
    monitor.close(100)
    assert [rows for _, rows in monitor.samples] == [0, 40, 100, 100]
    assert "backfill [" in out.getvalue() and "100/100 rows 100%" in out.getvalue()

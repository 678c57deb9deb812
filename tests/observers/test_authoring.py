"""What observer authors use: the ``@observer`` decorator, the test bench on the embedded
store, and ``percolator worker --observers-from MODULE:ATTR`` for unpackaged code."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from percolator.observers.api import FunctionObserver, Observer, observer
from percolator.observers.plugins import PluginError, load_from_path
from percolator.observers.testing import ObserverBench

import percolator
from percolator.errors import InvalidArgumentError, PercolatorError
from percolator.transaction import Transaction


def _create(client: percolator.Client) -> None:
    client.create_table("docs")
    client.create_table("lengths")


@observer(name="doc-length", table="docs", columns=("body",), setup=_create)
def doc_length(txn: Transaction, row: bytes, column: str) -> None:
    """Keeps lengths/n = the body's length in bytes."""
    body = txn.get("docs", row, "body")
    if body is None:
        txn.delete("lengths", row, "n")
    else:
        txn.set("lengths", row, "n", str(len(body)).encode())


class Shout(Observer):
    name = "shout"
    table = "lengths"
    columns = ("n",)

    def setup(self, client: percolator.Client) -> None:
        client.create_table("shouts")

    def process(self, txn: Transaction, row: bytes, column: str) -> None:
        n = txn.get("lengths", row, "n")
        txn.set("shouts", row, "text", b"!" * int(n or b"0"))


def test_the_decorator_makes_an_observer_that_stays_callable() -> None:
    assert isinstance(doc_length, FunctionObserver) and isinstance(doc_length, Observer)
    assert (doc_length.name, doc_length.table, doc_length.columns) == (
        "doc-length",
        "docs",
        ("body",),
    )
    assert doc_length.weak is False
    assert doc_length.__doc__ == "Keeps lengths/n = the body's length in bytes."
    calls: list[tuple[bytes, str]] = []

    @observer(name="probe", table="t", columns=["c"], weak=True)
    def probe(txn: Transaction, row: bytes, column: str) -> None:
        calls.append((row, column))

    probe(None, b"r", "c")  # type: ignore[arg-type]  # the plain function, unit-testable
    probe.process(None, b"s", "c")  # type: ignore[arg-type]
    assert calls == [(b"r", "c"), (b"s", "c")] and probe.weak and probe.columns == ("c",)


@pytest.mark.parametrize(
    ("declaration", "message"),
    [
        ({"name": "x", "table": "t", "columns": "body"}, "columns must be a non-empty"),
        ({"name": "bad name", "table": "t", "columns": ("c",)}, "name 'bad name' is invalid"),
        ({"name": "x", "table": "percolator_meta", "columns": ("c",)}, "reserved"),
        ({"name": "x", "table": "t", "columns": ("c",), "setup": 3}, "setup 3 is not callable"),
    ],
)
def test_a_bad_declaration_fails_when_decorating(
    declaration: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        observer(**declaration)(lambda txn, row, column: None)  # type: ignore[arg-type]


def test_the_bench_runs_observers_as_a_worker_would(tmp_path: Path) -> None:
    with ObserverBench([doc_length, Shout()], tmp_path) as bench:
        bench.set("docs", "d1", "body", b"hello")
        report = bench.run()
        assert report.runs == 2  # doc-length, then shout on what it wrote
        assert bench.get("lengths", "d1", "n") == b"5"
        assert bench.get("shouts", "d1", "text") == b"!!!!!"
        assert bench.run().runs == 0  # at most one run per change
        bench.delete("docs", "d1", "body")
        bench.run()
        assert bench.get("lengths", "d1", "n") is None
    # A store in the directory given, left for inspection.
    assert (tmp_path / "store").is_dir()


def test_the_bench_reports_failed_runs_and_cleans_up_its_temporary_store() -> None:
    @observer(name="broken", table="docs", columns=("body",), setup=_create)
    def broken(txn: Transaction, row: bytes, column: str) -> None:
        raise ValueError(f"cannot handle {row!r}")

    with ObserverBench([broken]) as bench:
        directory = Path(bench.url.removeprefix("embedded:")).parent
        bench.set("docs", "d1", "body", b"x")
        with pytest.raises(PercolatorError, match=r"docs/b'd1'/body@\d+: ValueError: cannot han"):
            bench.run(max_rounds=1)
    assert not directory.exists()


MODULE = textwrap.dedent(
    """
    from percolator.observers.api import Observer, observer

    def _tables(client):
        client.create_table("docs")
        client.create_table("lengths")

    @observer(name="doc-length", table="docs", columns=("body",), setup=_tables)
    def doc_length(txn, row, column):
        txn.set("lengths", row, "n", str(len(txn.get("docs", row, "body") or b"")).encode())

    class Other(Observer):
        name = "other"
        table = "docs"
        columns = ("title",)

        def process(self, txn, row, column):
            pass

    class Suffixer(Observer):
        name = "suffixer"
        table = "docs"
        columns = ("title",)

        def __init__(self, config):
            self.suffix = config["suffix"].encode()

        def setup(self, client):
            _tables(client)

        def process(self, txn, row, column):
            txn.set("lengths", row, "title", (txn.get("docs", row, "title") or b"") + self.suffix)

    ALL = [doc_length, Other]
    NOT_AN_OBSERVER = 42
    """
)


@pytest.fixture
def module_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    name = f"authoring_{os.getpid()}_{time.monotonic_ns()}"
    (tmp_path / f"{name}.py").write_text(MODULE)
    (tmp_path / "broken_module.py").write_text("raise RuntimeError('at import')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "name").write_text(name)
    return tmp_path


def test_observers_from_a_module_path(module_dir: Path) -> None:
    name = (module_dir / "name").read_text()
    assert [o.name for o in load_from_path(f"{name}:ALL")] == ["doc-length", "other"]
    assert [o.name for o in load_from_path(f"{name}:doc_length")] == ["doc-length"]
    assert [o.name for o in load_from_path(f"{name}:Other")] == ["other"]
    for spec, message in [
        (name, "expected MODULE:ATTR"),
        (f"{name}:missing", f"module {name!r} has no 'missing'"),
        ("broken_module:x", "cannot import 'broken_module': RuntimeError: at import"),
        ("no_such_module_here:x", "cannot import 'no_such_module_here'"),
        (f"{name}:NOT_AN_OBSERVER", "expected an Observer subclass, instance or factory"),
    ]:
        with pytest.raises(PluginError, match=message):
            load_from_path(spec)


def run_worker_until(
    module_dir: Path, extra: list[str], write: tuple[str, str, bytes], want: tuple[str, str, bytes]
) -> str:
    """Start a worker in ``module_dir``, write one cell, wait for the derived one; its log."""
    url = f"embedded:{module_dir / 'store'}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PERCOLATOR_")}
    env["PERCOLATOR_OBSERVED_REFRESH_MS"] = "200"
    log = module_dir / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "percolator",
                "worker",
                "--store",
                url,
                "--create",
                "--threads",
                "1",
                *extra,
            ],
            cwd=module_dir,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 60
        while "worker ready" not in log.read_text():
            assert worker.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        with percolator.connect(url) as client:
            with client.transaction() as txn:
                txn.set("docs", b"d1", write[0], write[2])
            while True:
                with client.snapshot() as snapshot:
                    if snapshot.get(want[0], b"d1", want[1]) == want[2]:
                        break
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.1)
    finally:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=60) == 0, log.read_text()
    return log.read_text()


def test_a_worker_runs_observers_from_a_module_path(module_dir: Path) -> None:
    name = (module_dir / "name").read_text()
    output = run_worker_until(
        module_dir,
        ["--observers-from", f"{name}:doc_length"],
        write=("body", "", b"four"),
        want=("lengths", "n", b"4"),
    )
    assert "observers=doc-length" in output


def test_a_worker_hands_each_observer_its_config_table(module_dir: Path) -> None:
    name = (module_dir / "name").read_text()
    (module_dir / "worker.toml").write_text(
        '[worker]\nthreads = 1\n\n[worker.observers.suffixer]\nsuffix = "!?"\n\n'
        "[worker.observers.typo]\nx = 1\n"
    )
    output = run_worker_until(
        module_dir,
        ["--config", "worker.toml", "--observers-from", f"{name}:Suffixer"],
        write=("title", "", b"hi"),
        want=("lengths", "title", b"hi!?"),
    )
    assert "observers=suffixer" in output
    assert "[worker.observers.typo] configures no observer this worker runs" in output


def test_a_bad_module_path_stops_the_worker_with_one_line(
    module_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from percolator.cli import main

    url = f"embedded:{module_dir / 'store'}"
    assert main(["worker", "--store", url, "--create", "--observers-from", "nowhere:x"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("percolator: error: observer plugin 'nowhere:x': cannot import")
    assert len(err.splitlines()) == 1


def test_one_observer_given_twice_is_refused(
    module_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from percolator.cli import main

    name = (module_dir / "name").read_text()
    url = f"embedded:{module_dir / 'store'}"
    argv = [
        "worker",
        "--store",
        url,
        "--create",
        "--observers-from",
        f"{name}:doc_length",
        "--observers-from",
        f"{name}:ALL",
    ]
    assert main(argv) == 2
    assert "observer name(s) ['doc-length'] given twice" in capsys.readouterr().err


class NeedsConfig(Observer):
    name = "needs-config"
    table = "docs"
    columns = ("c",)

    def __init__(self, config: dict[str, object]) -> None:
        self.config = config

    def process(self, txn: Transaction, row: bytes, column: str) -> None:
        pass


class TakesNothing(Observer):
    name = "takes-nothing"
    table = "docs"
    columns = ("c",)

    def process(self, txn: Transaction, row: bytes, column: str) -> None:
        pass


def test_plugins_get_their_config_table() -> None:
    from importlib.metadata import EntryPoint

    from percolator.observers.plugins import load_observers

    here = __name__
    points = [
        EntryPoint("needs-config", f"{here}:NeedsConfig", "percolator.observers"),
        EntryPoint("takes-nothing", f"{here}:TakesNothing", "percolator.observers"),
        EntryPoint("doc-length", f"{here}:doc_length", "percolator.observers"),
    ]
    loaded = load_observers(None, points, configs={"needs-config": {"n": 1}})
    assert loaded.errors == []
    (configured,) = [o for o in loaded.observers if isinstance(o, NeedsConfig)]
    assert configured.config == {"n": 1}
    refused = load_observers(
        ["takes-nothing", "doc-length"], points, configs={"takes-nothing": {}, "doc-length": {}}
    )
    messages = sorted(str(e) for e in refused.errors)
    assert "an observer instance, which cannot take the config table" in messages[0]
    assert "[worker.observers.doc-length]" in messages[0]
    assert "takes no configuration, but the config file has " in messages[1]
    assert "[worker.observers.takes-nothing]" in messages[1]


def test_the_config_file_accepts_observer_tables_and_checks_their_shape(tmp_path: Path) -> None:
    from percolator import config
    from percolator.errors import ConfigError
    from tests.test_config import parse

    text = "[worker]\nthreads = 2\n[worker.observers.word-count]\nmin = 3\n"
    assert parse(["worker"], file_text=text, tmp_path=tmp_path).threads == 2
    assert parse(["gc"], file_text=text, tmp_path=tmp_path)  # the whole file is checked
    assert config.observer_tables(tmp_path / "percolator.toml") == {"word-count": {"min": 3}}
    assert config.observer_tables(None) == {}
    with pytest.raises(ConfigError, match=r"\[worker.observers\] must hold one table per"):
        parse(["worker"], file_text="[worker]\nobservers = 3\n", tmp_path=tmp_path)
    with pytest.raises(ConfigError, match="has no option 'observers'"):
        parse(["gc"], file_text="[gc.observers.x]\ny = 1\n", tmp_path=tmp_path)

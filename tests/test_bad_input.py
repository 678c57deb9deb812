"""Bad input to the command line: one clear line naming the culprit and exit code 2 (a
usage or config error), never a traceback, a hang or a silent exit 0."""

from __future__ import annotations

import importlib.metadata
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import percolator
from percolator import cli
from percolator import command_options as options
from percolator.errors import ConfigError, InvalidArgumentError
from percolator.layout import META_FAMILY, META_TABLE
from percolator.metrics import MetricsServer, Registry
from percolator.protocol import gc as gc_protocol
from percolator.readers import SAFE_POINT_ROW
from percolator.store.url import parse_store_url
from tests.cli_process import ROOT, run_percolator


def run(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_percolator(args, env, timeout=60)


@pytest.fixture
def store(tmp_path: Path) -> str:
    url = f"embedded:{tmp_path / 'store'}"
    percolator.connect(url).close()
    return url


def one_error_line(err: str) -> str:
    """The ``percolator: error:`` line of ``err``, which holds no traceback."""
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1, err
    return lines[0]


# ------------------------------------------------------------ numbers: one shared type


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "1e400", "NaN", "x", ""])
def test_seconds_refuse_what_is_not_a_finite_number(text: str) -> None:
    import argparse

    with pytest.raises(argparse.ArgumentTypeError, match="expected a finite number >= 0"):
        options.SECONDS(text)


def test_the_checked_types_accept_their_range() -> None:
    assert options.SECONDS("0") == 0.0 and options.SECONDS(" 2.5 ") == 2.5
    assert options.int_option(1)("7") == 7
    assert options.float_option(0, 1)("1") == 1.0
    import argparse

    for parse, text in [
        (options.int_option(1), "0"),
        (options.int_option(1), "1.5"),
        (options.int_option(0, 10), "11"),
        (options.float_option(0, above=True), "0"),
        (options.float_option(0, 1), "1.01"),
    ]:
        with pytest.raises(argparse.ArgumentTypeError):
            parse(text)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["wait", "--timeout", "nan"], "argument --timeout: 'nan' is not finite"),
        (["wait", "--ts", "-5"], "argument --ts: '-5' is out of range"),
        (["gc", "--life-time", "nan"], "argument --life-time: 'nan' is not finite"),
        (["gc", "--life-time", "inf"], "argument --life-time: 'inf' is not finite"),
        (["gc", "--life-time", "1e400"], "argument --life-time: '1e400' is not finite"),
        (["gc", "--life-time", "-1"], "argument --life-time: '-1' is out of range"),
        (
            ["gc", "--life-time", "1e30"],
            "argument --life-time: '1e30' is out of range: expected a finite number in "
            "[0, 35184372088]",
        ),
        (["gc", "--life-time", "1e306"], "argument --life-time: '1e306' is out of range"),
        (["gc", "--life-time", "35184372089"], "argument --life-time: '35184372089' is out"),
        (["worker", "--drain-timeout", "nan"], "argument --drain-timeout: 'nan' is not finite"),
        (["worker", "--threads", "-3"], "argument --threads: '-3' is out of range"),
        # bounded: a mistyped count would grow the process or run out of OS threads
        (
            ["worker", "--threads", "100000000"],
            "argument --threads: '100000000' is out of range: expected an integer in [1, 256]",
        ),
        (
            ["worker", "--scanners", "5000"],
            "argument --scanners: '5000' is out of range: expected an integer in [1, 256]",
        ),
        (
            ["worker", "--key-groups", "99999999999"],
            "argument --key-groups: '99999999999' is out of range: expected an integer in "
            "[1, 65536]",
        ),
        (["worker", "--metrics-port", "70000"], "argument --metrics-port: '70000' is out"),
        (["oracle", "serve", "--stream-slots", "-1"], "argument --stream-slots: '-1' is out"),
        (
            ["backfill", "in.csv", "--table", "t", "--key", "k", "--progress-interval", "nan"],
            "argument --progress-interval: 'nan' is not finite",
        ),
        (
            ["backfill", "in.csv", "--table", "t", "--key", "k", "--max-value-bytes", "0"],
            "argument --max-value-bytes: '0' is out of range: expected an integer >= 1",
        ),
        (["status", "--oldest", "-1"], "argument --oldest: '-1' is out of range"),
        (["inspect", "t", "--limit", "0"], "argument --limit: '0' is out of range"),
    ],
)
def test_bad_numbers_are_usage_errors(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    missing = f"embedded:{tmp_path / 'none'}"
    with pytest.raises(SystemExit) as info:
        cli.main(
            [*args[:2], "--store", missing, *args[2:]]
            if args[0] == "oracle"
            else [args[0], "--store", missing, *args[1:]]
        )
    assert info.value.code == 2
    assert message in one_error_line(capsys.readouterr().err)


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("env", "PERCOLATOR_GC_LIFE_TIME: bad value 'nan' for --life-time: 'nan' is not finite"),
        ("file", "[gc]: bad value nan for --life-time: 'nan' is not finite"),
    ],
)
def test_non_finite_settings_name_their_source(
    source: str,
    message: str,
    store: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["gc", "--store", store]
    if source == "env":
        monkeypatch.setenv("PERCOLATOR_GC_LIFE_TIME", "nan")
    else:
        path = tmp_path / "p.toml"
        path.write_text("[gc]\nlife-time = nan\n")
        args += ["--config", str(path)]
    assert cli.main(args) == 2
    assert message in one_error_line(capsys.readouterr().err)


def test_a_gc_life_time_beyond_the_timestamps_range_names_its_source(
    store: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PERCOLATOR_GC_LIFE_TIME", "1e30")
    assert cli.main(["gc", "--store", store]) == 2
    assert (
        "PERCOLATOR_GC_LIFE_TIME: bad value '1e30' for --life-time: '1e30' is out of range: "
        "expected a finite number in [0, 35184372088]"
    ) in one_error_line(capsys.readouterr().err)


def test_the_longest_gc_life_time_is_accepted_and_collects_nothing(
    store: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["gc", "--store", store, "--life-time", "35184372088", "--json"]) == 0
    assert '"safe_point": 0' in capsys.readouterr().out


# The longest life time is 2**45 - 1 ms: the physical part of the largest timestamp.
@pytest.mark.parametrize("life_time_ms", [10**30, 2**45, True, -1])
def test_client_gc_refuses_a_life_time_outside_the_timestamps_range(
    store: str, life_time_ms: int
) -> None:
    """The API refuses before the pass does anything: no safe point, not even the store
    clock cell GC stamps first."""
    with percolator.connect(store) as client:
        with pytest.raises(InvalidArgumentError, match="life_time_ms must be"):
            client.gc(life_time_ms=life_time_ms)
        column = (META_FAMILY, gc_protocol.CLOCK_QUALIFIER)
        assert client.store.read_row(META_TABLE, SAFE_POINT_ROW, columns=[column]) == {}
        assert client.safe_point(refresh=True) == 0
        assert client.gc(life_time_ms=2**45 - 1).safe_point == 0
    with pytest.raises(InvalidArgumentError, match=r"must be an int in \[0, 35184372088831\]"):
        gc_protocol.check_life_time_ms(10**30)


def test_a_bad_value_in_another_commands_table_fails_every_command(
    store: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Range checks are part of the options' types, so the whole-file check sees them."""
    path = tmp_path / "p.toml"
    path.write_text("[worker]\nthreads = -3\n")
    assert cli.main(["status", "--store", store, "--config", str(path)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"config file {path} [worker]: bad value -3 for --threads" in line


def test_wait_with_a_nan_timeout_does_not_hang(store: str) -> None:
    result = run(["wait", "--store", store, "--timeout", "nan"])
    assert result.returncode == 2
    assert "argument --timeout: 'nan' is not finite" in result.stderr


def test_an_empty_store_variable_is_an_error_not_the_default_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``PERCOLATOR_STORE=`` (``$STORE`` expanded unset) must not mean ./percolator-data."""
    monkeypatch.chdir(tmp_path)
    percolator.connect("embedded:./percolator-data").close()  # the default store exists
    for value in ("", "   "):
        monkeypatch.setenv("PERCOLATOR_STORE", value)
        assert cli.main(["status"]) == 2
        line = one_error_line(capsys.readouterr().err)
        assert f"PERCOLATOR_STORE: bad value {value!r} for --store: empty" in line


# ------------------------------------------------------------ plugins that call sys.exit


def _distribution(
    directory: Path, module: str, source: str, entry_points: dict[str, list[str]]
) -> dict[str, str]:
    """An installed-looking distribution in ``directory``: ``module``.py holding
    ``source`` and a dist-info declaring ``entry_points`` (group -> ``name = value``
    lines); returns the environment that puts it on a subprocess's module path."""
    (directory / f"{module}.py").write_text(source)
    info = directory / f"{module}-0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.0\n")
    (info / "entry_points.txt").write_text(
        "".join(
            f"[{group}]\n" + "".join(f"{line}\n" for line in lines)
            for group, lines in entry_points.items()
        )
    )
    return _on_path(directory)


def _exiting_distribution(tmp_path: Path, group: str, name: str, value: str) -> dict[str, str]:
    return _distribution(
        tmp_path, "exits_at_import", "import sys\nsys.exit(0)\n", {group: [f"{name} = {value}"]}
    )


def test_a_command_plugin_that_exits_at_import_is_a_broken_plugin(tmp_path: Path) -> None:
    env = _exiting_distribution(tmp_path, cli.GROUP, "aa-exits", "exits_at_import:register")
    result = run(["--help"], env)
    assert result.returncode == 0 and "gc" in result.stdout  # the others still work
    assert result.stderr.splitlines() == [
        "percolator: warning: command plugin 'aa-exits' (exits_at_import:register): cannot "
        "load: SystemExit: called sys.exit(0); left out"
    ]
    result = run(["aa-exits"], env)
    assert result.returncode == 2
    assert "command plugin 'aa-exits' (exits_at_import:register): cannot load: SystemExit" in (
        one_error_line(result.stderr)
    )


def test_a_command_plugin_whose_register_exits_is_left_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "exits_in_register.py").write_text(
        "import sys\ndef register(subparsers):\n    sys.exit(3)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    commands = cli.load_commands(
        [importlib.metadata.EntryPoint("x", "exits_in_register:register", cli.GROUP)]
    )
    assert [str(e) for e in commands.errors] == [
        "command plugin 'x' (exits_in_register:register): failed to add its command: "
        "SystemExit: called sys.exit(3)"
    ]


def test_a_worker_whose_only_observer_plugin_exits_at_import_fails(
    tmp_path: Path, store: str
) -> None:
    env = _exiting_distribution(
        tmp_path, "percolator.observers", "exits", "exits_at_import:Observer"
    )
    result = run(["worker", "--store", store, "--observer", "exits"], env)
    assert result.returncode == 2
    assert (
        "observer plugin 'exits': cannot load 'exits_at_import:Observer': SystemExit"
        in result.stderr
    )
    assert "nothing to run" in one_error_line(result.stderr)
    result = run(["worker", "--store", store, "--observers-from", "exits_at_import:x"], env)
    assert result.returncode == 2
    assert "observer plugin 'exits_at_import:x': cannot import 'exits_at_import': SystemExit" in (
        one_error_line(result.stderr)
    )


def _on_path(directory: Path) -> dict[str, str]:
    """The environment that puts ``directory`` first on a subprocess's module path."""
    return {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(directory), os.environ.get("PYTHONPATH")]))
    }


def _broken_entry_point(tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    env = _distribution(
        tmp_path,
        "raises_at_import",
        "raise RuntimeError('broken plugin')\n",
        {"percolator.observers": ["broken = raises_at_import:Observer"]},
    )
    return ["--observer", "broken"], env


def _broken_module_path(tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    (tmp_path / "raises_at_import.py").write_text("raise RuntimeError('broken plugin')\n")
    return ["--observers-from", "raises_at_import:x"], _on_path(tmp_path)


_TWO_ON_ONE_COLUMN = """
from percolator.observers.api import Observer

class A(Observer):
    name = "first"
    table = "t"
    columns = ("c",)

    def process(self, txn, row, column):
        pass

class B(A):
    name = "second"

both = [A, B]
"""


def _two_observers_of_one_column(tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    (tmp_path / "one_column.py").write_text(_TWO_ON_ONE_COLUMN)
    return ["--observers-from", "one_column:both"], _on_path(tmp_path)


@pytest.mark.parametrize(
    ("observers", "message"),
    [
        (
            _broken_entry_point,
            "observer plugin 'broken': cannot load 'raises_at_import:Observer': RuntimeError",
        ),
        (
            _broken_module_path,
            "observer plugin 'raises_at_import:x': cannot import 'raises_at_import': RuntimeError",
        ),
        (_two_observers_of_one_column, "observers 'first' and 'second' both watch t/c"),
    ],
    ids=["entry point", "module path", "one column twice"],
)
def test_a_worker_with_create_checks_its_observers_before_making_the_store(
    observers: Callable[[Path], tuple[list[str], dict[str, str]]], message: str, tmp_path: Path
) -> None:
    (tmp_path / "plugins").mkdir()
    plugin_args, env = observers(tmp_path / "plugins")
    missing = tmp_path / "new-store"
    result = run(["worker", "--store", f"embedded:{missing}", "--create", *plugin_args], env)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    one_error_line(result.stderr)
    assert not missing.exists()


def test_observers_register_with_create_checks_its_observers_before_making_the_store(
    tmp_path: Path,
) -> None:
    env = _distribution(
        tmp_path,
        "one_column",
        _TWO_ON_ONE_COLUMN,
        {"percolator.observers": ["first = one_column:A", "second = one_column:B"]},
    )
    missing = tmp_path / "new-store"
    register = ["observers", "register", "--observer", "first", "--observer", "second"]
    result = run([*register, "--store", f"embedded:{missing}", "--create"], env)
    assert result.returncode == 2, result.stderr
    assert "observers 'first' and 'second' both watch t/c" in one_error_line(result.stderr)
    assert not missing.exists()


_SETUP_RAISES = """
from percolator.observers.api import Observer

class Good(Observer):
    name = "good"
    table = "t"
    columns = ("c",)

    def process(self, txn, row, column):
        pass

class Bad(Good):
    name = "bad"
    columns = ("d",)

    def setup(self, client):
        raise RuntimeError("cannot reach the index service")
"""


def test_observers_register_names_an_observer_whose_setup_fails_and_registers_none(
    tmp_path: Path,
) -> None:
    env = _distribution(
        tmp_path,
        "setup_raises",
        _SETUP_RAISES,
        {"percolator.observers": ["good = setup_raises:Good", "bad = setup_raises:Bad"]},
    )
    store = f"embedded:{tmp_path / 'store'}"
    percolator.connect(store).close()
    register = ["observers", "register", "--observer", "good", "--observer", "bad"]
    result = run([*register, "--store", store], env)
    assert result.returncode == 2, result.stderr
    assert (
        "observer plugin 'bad': setup() failed: RuntimeError: cannot reach the index service"
        in one_error_line(result.stderr)
    )
    listed = run(["observers", "list", "--store", store])
    assert listed.returncode == 0 and listed.stdout == "", listed


def test_observers_register_with_a_dead_oracle_writes_nothing(tmp_path: Path) -> None:
    store = f"embedded:{tmp_path / 'store'}"
    percolator.connect(store).close()
    dead = "grpc://127.0.0.1:1?timeout_ms=500"  # nothing listens on port 1
    result = run(
        ["observers", "register", "--observer", "doc-index", "--store", store, "--oracle", dead]
    )
    assert result.returncode == 2, result.stderr
    assert "no timestamp oracle among ['127.0.0.1:1'] answered" in one_error_line(result.stderr)
    with percolator.connect(store) as client:
        assert client.store.list_tables() == [META_TABLE]  # no table of doc-index's setup
    listed = run(["observers", "list", "--store", store])
    assert listed.returncode == 0 and listed.stdout == "", listed


# ------------------------------------------------------------ stores, files, ports, bytes


def test_oracle_serve_refuses_a_store_that_does_not_exist(tmp_path: Path) -> None:
    missing = tmp_path / "typo"
    result = run(["oracle", "serve", "--store", f"embedded:{missing}", "--listen", "127.0.0.1:0"])
    assert result.returncode == 2
    line = one_error_line(result.stderr)
    assert f"store 'embedded:{missing}' does not exist" in line and "--create" in line
    assert not missing.exists()


@pytest.mark.parametrize("url", ["hbase://[::1", "hbase://[::1:9090?prefix=p"])
def test_a_malformed_hbase_url_is_a_config_error_naming_it(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ConfigError, match=r"store URL 'hbase://\[::1.*malformed"):
        parse_store_url(url)
    with pytest.raises(ConfigError, match="malformed"):
        percolator.connect(url)
    assert cli.main(["status", "--store", url]) == 2
    assert f"store URL {url!r} is malformed" in one_error_line(capsys.readouterr().err)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        # digits str.isdigit() takes: "²" int() refuses, "٣" int() reads as 3
        ("hbase://127.0.0.1:1?timeout_ms=²", "timeout_ms must be a positive integer"),
        ("hbase://127.0.0.1:1?pool_size=٣", "pool_size must be a positive integer"),
        ("hbase://127.0.0.1:1?thrift2_port=²", "thrift2_port must be a port number"),
        # the byte 0xff, not UTF-8, reaches the command line as a lone surrogate
        ("hbase://\udcff:9090", r"host '\\udcff' is not a host name or address"),
    ],
)
def test_non_ascii_digits_and_hosts_in_an_hbase_url_are_config_errors_naming_it(
    url: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_store_url(url)
    assert cli.main(["status", "--store", url]) == 2
    assert f"store URL {url!r}: " in one_error_line(capsys.readouterr().err)


def test_a_config_file_that_is_not_utf8_names_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "p.toml"
    path.write_bytes(b"\xff\xfe[defaults]\n")
    assert cli.main(["status", "--config", str(path)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"config file {path}: not UTF-8 text" in line


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def test_a_metrics_port_in_use_or_a_bad_host_names_host_and_port(busy_port: int) -> None:
    with pytest.raises(ConfigError, match=f"cannot serve metrics on 127.0.0.1:{busy_port}: "):
        MetricsServer(Registry(), "127.0.0.1", busy_port)
    with pytest.raises(ConfigError, match=r"cannot serve metrics on 999\.1\.1\.1:0: "):
        MetricsServer(Registry(), "999.1.1.1", 0)


def test_a_metrics_host_that_is_not_ascii_or_idna_is_named(store: str) -> None:
    # the byte 0xff, not UTF-8, reaches the command line as a lone surrogate
    with pytest.raises(ConfigError, match=r"metrics host '\\udcff' is not a host name"):
        MetricsServer(Registry(), "\udcff", 0)
    result = run(["worker", "--store", store, "--metrics-host", "\udcff", "--metrics-port", "0"])
    assert result.returncode == 2
    assert "metrics host '\\udcff' is not a host name" in one_error_line(result.stderr)


def test_oracle_serve_with_a_metrics_port_in_use(store: str, busy_port: int) -> None:
    result = run(
        [
            *("oracle", "serve", "--store", store, "--listen", "127.0.0.1:0"),
            *("--metrics-port", str(busy_port)),
        ]
    )
    assert result.returncode == 2
    assert f"cannot serve metrics on 127.0.0.1:{busy_port}" in one_error_line(result.stderr)


def test_row_arguments_are_the_bytes_the_shell_passed() -> None:
    assert options.row_key("abc") == b"abc"
    assert options.row_key("\udcff") == b"\xff"  # $'\xff' on a UTF-8 system
    assert options.row_key("é") == "é".encode()


def test_rows_that_are_not_utf8_are_accepted_as_bytes(
    store: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with percolator.connect(store) as client:
        client.create_table("t")
        with client.transaction() as txn:
            txn.set("t", b"\xff", "c", b"v")
    assert cli.main(["inspect", "t", "--store", store, "--row", "\udcff"]) == 0
    assert "v" in capsys.readouterr().out
    assert cli.main(["inspect", "t", "--store", store, "--start", "\udcff"]) == 0
    assert cli.main(["notifications", "retry", "--store", store, "--row", "\udcff"]) == 1
    assert "no parked notification matched" in capsys.readouterr().err


def test_a_closed_pipe_ends_a_command_quietly(store: str) -> None:
    """``percolator status | head -0``: no BrokenPipeError traceback, SIGPIPE's exit code."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "percolator", "status", "--store", store],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # like `| head -0`
    err = proc.stderr.read().decode()
    assert proc.wait(60) == 141  # cli.BROKEN_PIPE_EXIT: 128 + SIGPIPE
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


# ------------------------------------------------------------ names


def test_export_refuses_a_reserved_column(store: str, tmp_path: Path) -> None:
    out = tmp_path / "out.parquet"
    result = run(
        ["export", "--store", store, "--table", "t", "--output", str(out), "--column", "!x"]
    )
    assert result.returncode == 2
    assert "--column: column '!x' is reserved" in one_error_line(result.stderr)
    assert not out.exists()


def test_observers_unregister_checks_the_name(
    store: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["observers", "unregister", "bad name!", "--store", store]) == 2
    assert "observer name 'bad name!' is invalid" in one_error_line(capsys.readouterr().err)

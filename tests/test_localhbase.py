"""The local HBase launcher, its command line and the session fixture, on real JVMs.

Tests marked ``hbase`` need java and the HBase jars; those marked ``slow`` start (or try to
start) an HBase of their own, next to the session's, and take 15-60 s each.  The others
check the error paths without launching HBase.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path

import happybase
import pytest

from percolator.store import open_store
from percolator.store.base import CompareAndSet, FamilySpec, Put
from percolator.store.url import parse_store_url
from percolator.testing.localhbase import (
    HBaseLauncherError,
    HBaseStartError,
    LocalHBase,
    ensure_classpath,
    probe,
    probe_thrift2,
)
from percolator.testing.localhbase.launcher import (
    _stat_is_ours,
    check_classpath,
    free_port,
    read_classpath,
)

REPO = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- helpers


def _cli(
    *args: str, env: Mapping[str, str] | None = None, timeout: float = 120.0
) -> subprocess.CompletedProcess[str]:
    """Run ``percolator hbase ARGS`` in a separate process."""
    return subprocess.run(
        [sys.executable, "-m", "percolator", "hbase", *args],
        cwd=REPO,
        env=dict(env) if env is not None else None,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _process_gone(pid: int) -> bool:
    """No process with this pid runs: absent, or a zombie (exited, awaiting its reaper)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[0] == "Z"


def _jvms_of(workdir: Path) -> list[int]:
    """Pids of live processes launched for ``workdir`` (found by the marker on their
    command line), whatever the launcher believes."""
    marker = f"-Dpercolator.localhbase.dir={workdir.resolve()}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            arguments = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker in arguments and not _process_gone(int(entry.name)):
            found.append(int(entry.name))
    return found


def _round_trip(host: str, port: int) -> None:
    """Create a table, put a cell, read it back, drop the table."""
    table_name = f"localhbase_test_{uuid.uuid4().hex[:12]}"
    connection = happybase.Connection(host, port, timeout=60_000)
    try:
        connection.create_table(table_name, {"f": {"max_versions": 1}})
        try:
            table = connection.table(table_name)
            table.put(b"row-1", {b"f:q": b"value-1"})
            assert table.row(b"row-1") == {b"f:q": b"value-1"}
            assert table.row(b"row-2") == {}
        finally:
            connection.delete_table(table_name, disable=True)
        assert table_name.encode() not in connection.tables()
    finally:
        connection.close()


def _wait_for(path: Path, text: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        content = path.read_text() if path.exists() else ""
        if text in content:
            return content
        time.sleep(0.5)
    raise AssertionError(f"{text!r} did not appear in {path} within {timeout} s")


@pytest.fixture
def occupied_port() -> Iterator[int]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.fixture
def path_with_java_only(tmp_path: Path) -> Path:
    """A directory holding only ``java`` (a link to the real one), for use as PATH."""
    java = shutil.which("java")
    if java is None:
        pytest.fail("this test needs java on PATH (as the HBase tests do)")
    directory = tmp_path / "bin-java-only"
    directory.mkdir()
    (directory / "java").symlink_to(java)
    return directory


# --------------------------------------------------------------------------- session fixture


@pytest.mark.hbase
def test_session_hbase_answers(hbase_url: str) -> None:
    parsed = parse_store_url(hbase_url)
    assert parsed.scheme == "hbase"
    assert probe(parsed.host, parsed.port) is None
    _round_trip(parsed.host, parsed.port)


def test_session_fixture_fails_without_java_instead_of_skipping(tmp_path: Path) -> None:
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"PERCOLATOR_TEST_HBASE_URL", "PERCOLATOR_TEST_HBASE", "JAVA_HOME"}
    }
    env["PATH"] = str(tmp_path)  # an empty directory: no java, no mvn
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            f"{Path(__file__).name}::test_session_hbase_answers",
        ],
        cwd=Path(__file__).parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "cannot start the test session's HBase" in output
    assert "no `java` on PATH" in output
    assert "1 error" in output
    assert "skipped" not in output


# --------------------------------------------------------------------------- jars


@pytest.mark.hbase
def test_resolved_classpath_has_exactly_one_slf4j_binding() -> None:
    names = [os.path.basename(entry) for entry in read_classpath(ensure_classpath(None))]
    slf4j_bindings = [
        name
        for name in names
        if name.startswith(("log4j-slf4j", "slf4j-reload4j", "slf4j-log4j12", "logback-classic"))
    ]
    assert slf4j_bindings == ["log4j-slf4j-impl-2.17.2.jar"]
    assert not [name for name in names if name.startswith("reload4j-")]
    assert "hbase-thrift-2.6.1.jar" in names
    assert "log4j-1.2-api-2.17.2.jar" in names


def test_check_classpath_rejects_a_second_slf4j_binding(tmp_path: Path) -> None:
    def jars(*names: str) -> list[str]:
        for name in names:
            (tmp_path / name).write_bytes(b"")
        return [str(tmp_path / name) for name in names]

    good = jars("hbase-thrift-2.6.1.jar", "log4j-slf4j-impl-2.17.2.jar", "log4j-1.2-api-2.17.2.jar")
    check_classpath(good)
    with pytest.raises(HBaseLauncherError, match="exactly one slf4j binding"):
        check_classpath([*good, *jars("slf4j-reload4j-1.7.36.jar")])
    with pytest.raises(HBaseLauncherError, match=r"log4j 1\.x implementation"):
        check_classpath([*good, *jars("reload4j-1.2.22.jar")])
    with pytest.raises(HBaseLauncherError, match="missing"):
        check_classpath([*good, str(tmp_path / "absent-1.0.jar")])


_FAKE_MVN = """#!/bin/sh
# Stands in for Maven: records the call, prints what Maven prints, writes the classpath.
echo "$@" >> "$FAKE_MVN_CALLS"
for arg in "$@"; do
  case "$arg" in -Dmdep.outputFile=*) out="${arg#-Dmdep.outputFile=}" ;; esac
done
echo "[INFO] Downloading from central: https://repo.example/a.jar"
echo "[INFO] Downloaded from central: https://repo.example/a.jar (1.5 MB at 3.0 MB/s)"
echo "[INFO] Downloaded from central: https://repo.example/b.pom (512 kB at 1.0 MB/s)"
if [ -n "$FAKE_MVN_FAIL" ]; then
  echo "[ERROR] Failed to execute goal: Could not resolve dependencies for project"
  exit 1
fi
printf '%s' "$FAKE_CLASSPATH" > "$out"
"""


@pytest.fixture
def fake_maven(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path_with_java_only: Path
) -> tuple[Path, list[Path]]:
    """PATH = the real java plus a fake ``mvn``; returns (its call log, the jars it lists)."""
    (path_with_java_only / "mvn").write_text(_FAKE_MVN)
    (path_with_java_only / "mvn").chmod(0o755)
    names = ("hbase-thrift-2.6.1.jar", "log4j-slf4j-impl-2.17.2.jar", "slf4j-api-1.7.33.jar")
    jars = [tmp_path / name for name in names]
    for jar in jars:
        jar.write_bytes(b"")
    calls = tmp_path / "mvn-calls.txt"
    monkeypatch.setenv("PATH", str(path_with_java_only))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("FAKE_MVN_CALLS", str(calls))
    monkeypatch.setenv("FAKE_CLASSPATH", os.pathsep.join(str(jar) for jar in jars))
    return calls, jars


def test_ensure_classpath_runs_maven_once_and_reuses_its_result(
    tmp_path: Path, fake_maven: tuple[Path, list[Path]]
) -> None:
    calls, jars = fake_maven
    messages: list[str] = []
    classpath_file = ensure_classpath(messages.append, cache_dir=tmp_path / "cache")
    assert classpath_file == tmp_path / "cache" / "hbase-2.6.1" / "classpath.txt"
    assert read_classpath(classpath_file) == [str(jar) for jar in jars]
    assert "dependency:build-classpath" in calls.read_text()
    assert any("2 files, 2.0 MB downloaded" in message for message in messages), messages

    assert ensure_classpath(None, cache_dir=tmp_path / "cache") == classpath_file
    assert len(calls.read_text().splitlines()) == 1  # reused, Maven not run again

    jars[-1].unlink()  # a jar vanished from ~/.m2: resolve again
    with pytest.raises(HBaseLauncherError, match="missing"):
        ensure_classpath(None, cache_dir=tmp_path / "cache")
    assert len(calls.read_text().splitlines()) == 2


def test_a_failing_maven_is_reported_with_its_last_lines(
    tmp_path: Path, fake_maven: tuple[Path, list[Path]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_MVN_FAIL", "1")
    with pytest.raises(HBaseLauncherError) as failure:
        ensure_classpath(None, cache_dir=tmp_path / "cache")
    message = str(failure.value)
    assert "Maven could not resolve HBase's jars (exit code 1" in message
    assert "Could not resolve dependencies for project" in message
    assert not (tmp_path / "cache" / "hbase-2.6.1" / "classpath.txt").exists()


# --------------------------------------------------------------------------- missing tools


def test_missing_java_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(HBaseLauncherError, match="no `java` on PATH and JAVA_HOME is not set"):
        ensure_classpath(None, cache_dir=tmp_path / "cache")
    hbase = LocalHBase(tmp_path / "hb", progress=None)
    with pytest.raises(HBaseLauncherError, match="no `java`"):
        hbase.start()
    assert not hbase.state_file.exists()


def test_missing_mvn_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path_with_java_only: Path
) -> None:
    monkeypatch.setenv("PATH", str(path_with_java_only))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    # An empty cache: the jars must be resolved, which needs Maven.
    with pytest.raises(HBaseLauncherError, match=r"no `mvn` \(Apache Maven 3\) on PATH"):
        ensure_classpath(None, cache_dir=tmp_path / "empty-cache")


def test_java_older_than_17_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_java = tmp_path / "java"
    fake_java.write_text("#!/bin/sh\necho 'openjdk version \"11.0.22\" 2024-01-16' >&2\nexit 0\n")
    fake_java.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(HBaseLauncherError, match=r"needs Java 17 or newer.*is Java 11\.0\.22"):
        ensure_classpath(None, cache_dir=tmp_path / "cache")


def test_cli_reports_missing_java_in_one_line(tmp_path: Path) -> None:
    env = {key: value for key, value in os.environ.items() if key != "JAVA_HOME"}
    env["PATH"] = str(tmp_path)
    result = _cli("classpath", env=env)
    assert result.returncode == 2
    assert result.stderr.startswith("percolator: error: cannot run a local HBase: no `java`")
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("heap", "why"),
    [
        ("lots", "not a heap size: 'lots'"),
        ("2gb", "not a heap size"),
        ("0g", "not a heap size"),
        ("100m", "heap '100m' is below HBase's minimum of 256m"),
    ],
)
def test_a_bad_heap_size_is_refused_naming_it(tmp_path: Path, heap: str, why: str) -> None:
    result = _cli("start", "--dir", str(tmp_path / "hb"), "--heap", heap)
    assert result.returncode == 2
    assert f"argument --heap: {why}" in result.stderr
    assert not (tmp_path / "hb").exists()


def test_requested_port_in_use_is_refused_before_launching(
    tmp_path: Path, occupied_port: int
) -> None:
    hbase = LocalHBase(
        tmp_path / "hb",
        thrift_port=occupied_port,
        progress=None,
        classpath_file=tmp_path / "never-read.txt",
    )
    with pytest.raises(HBaseLauncherError, match=f"port {occupied_port} .* already in use"):
        hbase.start()
    assert not hbase.state_file.exists()
    assert not hbase.log_dir.exists()


def test_requested_thrift2_port_in_use_or_shared_is_refused_before_launching(
    tmp_path: Path, occupied_port: int
) -> None:
    taken = LocalHBase(
        tmp_path / "hb",
        thrift2_port=occupied_port,
        progress=None,
        classpath_file=tmp_path / "never-read.txt",
    )
    with pytest.raises(HBaseLauncherError, match=f"port {occupied_port} .*Thrift-2 port"):
        taken.start()
    port = free_port()
    shared = LocalHBase(
        tmp_path / "hb2",
        thrift_port=port,
        thrift2_port=port,
        progress=None,
        classpath_file=tmp_path / "never-read.txt",
    )
    with pytest.raises(HBaseLauncherError, match=f"Thrift and Thrift-2 ports must differ .*{port}"):
        shared.start()
    assert not taken.state_file.exists() and not shared.state_file.exists()


# --------------------------------------------------------------------------- start-up failures


@pytest.mark.hbase
def test_start_failure_with_a_bogus_classpath_shows_the_log_tail(tmp_path: Path) -> None:
    bogus = tmp_path / "classpath.txt"
    bogus.write_text(str(tmp_path / "no-such-hbase.jar"))
    hbase = LocalHBase(tmp_path / "hb", progress=None, classpath_file=bogus)
    with pytest.raises(HBaseStartError) as failure:
        hbase.start(timeout=60)
    message = str(failure.value)
    # Both JVMs fail the same way: the first to exit is named, and its log tail says why
    # (the other may be stopped before it gets that far).  Both logs are shown.
    exited = re.search(
        r"the HBase (master|thrift|thrift2) JVM exited with code 1 during start-up", message
    )
    assert exited is not None, message
    main_class = {
        "master": "master.HMaster",
        "thrift": "thrift.ThriftServer",
        "thrift2": "thrift2.ThriftServer",
    }[exited.group(1)]
    assert f"Could not find or load main class org.apache.hadoop.hbase.{main_class}" in message
    for role in ("master", "thrift", "thrift2"):
        assert f"Last lines of {hbase.log_dir / (role + '.log')}" in message
    assert _jvms_of(hbase.workdir) == []
    assert not hbase.state_file.exists()


@pytest.mark.hbase
@pytest.mark.slow
def test_start_failure_inside_hbase_shows_its_log_tail(tmp_path: Path, occupied_port: int) -> None:
    # The launcher checks the ports it is asked for; forcing the ZooKeeper port through the
    # raw configuration reproduces a port taken after that check, which HBase itself hits.
    hbase = LocalHBase(
        tmp_path / "hb",
        progress=None,
        extra_config={"hbase.zookeeper.property.clientPort": str(occupied_port)},
    )
    with pytest.raises(HBaseStartError) as failure:
        hbase.start(timeout=180)
    message = str(failure.value)
    assert "the HBase master JVM exited with code 1 during start-up" in message
    assert f"Could not start ZK at requested port of {occupied_port}" in message
    assert "First errors in" in message and "Last lines of" in message
    assert _jvms_of(hbase.workdir) == []
    assert not hbase.state_file.exists()


# --------------------------------------------------------------------------- full instances


def test_an_exiting_jvm_counts_as_running_until_it_is_a_zombie() -> None:
    """While a process exits, its command line reads empty but it still runs; a stop that
    took it for gone would report a JVM stopped that is still there."""
    marker = "-Dpercolator.localhbase.dir=/x"
    live = Path("/proc/self/stat").read_text()  # a real line: state R, flags without PF_KTHREAD
    head, _, tail = live.rpartition(")")
    fields = tail.split()

    def stat(state: str, flags: int) -> str:
        return head + ") " + " ".join([state, *fields[1:6], str(flags), *fields[7:]])

    user_flags = int(fields[6])
    command_line = b"java\0" + marker.encode() + b"\0-cp\0x\0"
    assert _stat_is_ours(stat("S", user_flags), command_line, marker)
    assert not _stat_is_ours(stat("S", user_flags), b"java\0other\0", marker)
    assert _stat_is_ours(stat("R", user_flags), b"", marker)  # exiting: memory released
    assert _stat_is_ours(stat("D", user_flags), b"", marker)
    assert not _stat_is_ours(stat("Z", user_flags), b"", marker)  # exited
    assert not _stat_is_ours(stat("Z", user_flags), command_line, marker)
    assert not _stat_is_ours(stat("S", user_flags | 0x00200000), b"", marker)  # kernel thread


@pytest.mark.hbase
def test_second_instance_in_background_serves_and_stops_from_another_process(
    tmp_path: Path, hbase_url: str
) -> None:
    session = parse_store_url(hbase_url)  # the session's HBase keeps running meanwhile
    workdir = tmp_path / "second"
    try:
        started = _cli("start", "--dir", str(workdir), "--heap", "1g", timeout=400)
        assert started.returncode == 0, started.stderr
        url = started.stdout.strip()
        assert url.startswith("hbase://127.0.0.1:")
        assert f"percolator hbase stop --dir {workdir}" in started.stderr

        state = json.loads((workdir / "localhbase.json").read_text())
        port, port2 = state["thrift_port"], state["thrift2_port"]
        assert url == f"hbase://127.0.0.1:{port}?thrift2_port={port2}"
        assert port != session.port
        assert len({port, port2, state["zk_port"], session.port}) == 4
        pids = [state["master_pid"], state["thrift_pid"], state["thrift2_pid"]]
        assert sorted(_jvms_of(workdir)) == sorted(pids)
        master_argv = Path(f"/proc/{state['master_pid']}/cmdline").read_bytes().split(b"\0")
        assert b"-Xmx1g" in master_argv

        # Another process (and a fresh object here) finds it through the state file.
        assert LocalHBase(workdir, progress=None).url == url
        status = _cli("status", "--dir", str(workdir), "--json")
        assert status.returncode == 0, status.stdout
        reported = json.loads(status.stdout)
        assert reported["serving"] is True
        assert [reported[f"{role}_pid"] for role in ("master", "thrift", "thrift2")] == pids
        assert reported["thrift2_alive"] is True and reported["url"] == url

        _round_trip("127.0.0.1", port)
        with open_store(url) as store:  # both gateways answer: a put rides on a compare-and-set
            assert store.conditional_puts
            store.create_table("t", [FamilySpec("l"), FamilySpec("w")])
            ride = (Put(b"r", "w", b"q", 7, b"record"),)
            item = CompareAndSet(b"r", "l", b"q", None, b"lock", ride)
            assert store.compare_and_set_many("t", [item]) == [True]
            assert store.read_row("t", b"r", [("w", b"q")]) == {("w", b"q"): [(7, b"record")]}

        stopped = _cli("stop", "--dir", str(workdir), "--grace", "10")
        assert stopped.returncode == 0, stopped.stderr
        assert "stopped HBase" in stopped.stderr
        assert all(_process_gone(pid) for pid in pids)
        assert _jvms_of(workdir) == []
        assert not (workdir / "localhbase.json").exists()
        assert probe("127.0.0.1", port, timeout_s=2.0) is not None
        assert probe_thrift2("127.0.0.1", port2, timeout_s=2.0) is not None

        assert _cli("status", "--dir", str(workdir)).returncode == 3
        again = _cli("stop", "--dir", str(workdir))
        assert again.returncode == 0
        assert "no HBase running" in again.stderr
    finally:
        LocalHBase(workdir, progress=None).stop(grace_s=0)


@pytest.mark.hbase
@pytest.mark.slow
def test_foreground_instance_cleans_up_on_sigterm(tmp_path: Path, hbase_url: str) -> None:
    workdir = tmp_path / "foreground"
    out, err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    with open(out, "w") as stdout, open(err, "w") as stderr:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "percolator",
                "hbase",
                "start",
                "--foreground",
                "--dir",
                str(workdir),
            ],
            cwd=REPO,
            stdout=stdout,
            stderr=stderr,
            stdin=subprocess.DEVNULL,
        )
    try:
        _wait_for(err, "press Ctrl-C to stop", timeout=400)
        url = out.read_text().strip()
        port = parse_store_url(url).port
        assert port != parse_store_url(hbase_url).port
        state = json.loads((workdir / "localhbase.json").read_text())
        assert state["launcher_pid"] == process.pid
        pids = [state["master_pid"], state["thrift_pid"], state["thrift2_pid"]]

        _round_trip("127.0.0.1", port)

        process.terminate()  # SIGTERM, as a service manager or `kill` would send
        assert process.wait(timeout=90) == 0, err.read_text()
        assert "stopped" in err.read_text()
        assert all(_process_gone(pid) for pid in pids)
        assert _jvms_of(workdir) == []
        assert not (workdir / "localhbase.json").exists()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        LocalHBase(workdir, progress=None).stop(grace_s=0)

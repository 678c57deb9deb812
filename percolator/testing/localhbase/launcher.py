"""Run a real standalone HBase with its Thrift-1 gateway on this machine, without Docker.

Two pieces:

* :func:`ensure_classpath` resolves HBase's jars from Maven Central into ``~/.m2`` (once per
  machine; about 115 MB) and keeps the resulting classpath in a small text file under the
  user's cache directory (``~/.cache/percolator/hbase-<version>/classpath.txt``).  Nothing is
  written into the source tree.
* :class:`LocalHBase` starts two JVMs bound to 127.0.0.1 -- ``HMaster`` in standalone mode
  (ZooKeeper, master and region server in one process) and the Thrift-1 gateway that
  happybase speaks -- and waits until a real request succeeds.

Everything one instance owns lives in its work directory::

    WORKDIR/localhbase.json   state file: pids and ports, so another process can stop it
    WORKDIR/conf/             hbase-site.xml and log4j2.properties (first on the classpath)
    WORKDIR/data/             rootdir, tmp dir and ZooKeeper data (kept across restarts)
    WORKDIR/logs/             master.log and thrift.log (each JVM's stdout and stderr)

A fresh state is a fresh (or deleted) work directory.  POSIX only (process groups, signals).
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import functools
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from percolator.errors import ConfigError

Progress = Callable[[str], None]

MINIMUM_JAVA = 17
STATE_FILE = "localhbase.json"
DEFAULT_START_TIMEOUT_S = 300.0
DEFAULT_STOP_GRACE_S = 30.0
#: heap of the JVM running the master and the region server (``percolator hbase start --heap``)
DEFAULT_MASTER_HEAP = "768m"

# Flags HBase's own bin/hbase adds on JDK 11+; without them HBase 2.6 fails on JDK 17 with
# InaccessibleObjectException (netty, Hadoop's reflection on java.nio and friends).
JDK17_FLAGS = (
    "-XX:+UseG1GC",
    "-Djava.net.preferIPv4Stack=true",
    "-Dorg.apache.hbase.thirdparty.io.netty.tryReflectionSetAccessible=true",
    "--add-modules",
    "jdk.unsupported",
    "--add-opens",
    "java.base/java.io=ALL-UNNAMED",
    "--add-opens",
    "java.base/java.nio=ALL-UNNAMED",
    "--add-opens",
    "java.base/sun.nio.ch=ALL-UNNAMED",
    "--add-opens",
    "java.base/java.lang=ALL-UNNAMED",
    "--add-opens",
    "java.base/jdk.internal.ref=ALL-UNNAMED",
    "--add-opens",
    "java.base/java.lang.reflect=ALL-UNNAMED",
    "--add-opens",
    "java.base/java.util=ALL-UNNAMED",
    "--add-opens",
    "java.base/java.util.concurrent=ALL-UNNAMED",
    "--add-exports",
    "java.base/jdk.internal.misc=ALL-UNNAMED",
    "--add-exports",
    "java.security.jgss/sun.security.krb5=ALL-UNNAMED",
    "--add-exports",
    "java.base/sun.net.dns=ALL-UNNAMED",
    "--add-exports",
    "java.base/sun.net.util=ALL-UNNAMED",
)

# Put on both JVMs' command lines.  It marks them as belonging to one work directory, so a
# pid read back from a state file is only signalled while it still is that JVM (pids are
# reused after the process ends).
_WORKDIR_PROPERTY = "-Dpercolator.localhbase.dir="

_MASTER_CLASS = "org.apache.hadoop.hbase.master.HMaster"
_THRIFT_CLASS = "org.apache.hadoop.hbase.thrift.ThriftServer"
_THRIFT2_CLASS = "org.apache.hadoop.hbase.thrift2.ThriftServer"
#: The JVMs of one instance, in launch order
_ROLES = ("master", "thrift", "thrift2")

# slf4j 1.7 picks one binding at random when several are present; HBase then logs through
# whichever won (or nowhere).  The pom excludes all but log4j-slf4j-impl; this is checked.
_SLF4J_BINDINGS = re.compile(
    r"^(log4j-slf4j-impl|log4j-slf4j2-impl|slf4j-reload4j|slf4j-log4j12|logback-classic|"
    r"slf4j-simple|slf4j-jdk14|slf4j-nop)-\d[^/]*\.jar$"
)
# A log4j 1.x implementation would shadow log4j-1.2-api (same package names).
_LOG4J1_IMPLEMENTATIONS = re.compile(r"^(reload4j|log4j)-1\.\d[\d.]*\.jar$")

_LOG4J2_PROPERTIES = """\
# Written by percolator's local HBase launcher; both JVMs log to stderr, which the launcher
# sends to WORKDIR/logs/<role>.log.
status = warn
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{ISO8601} %-5p [%t] %c{2}: %m%n
rootLogger = INFO,console
"""


class HBaseLauncherError(ConfigError):
    """The local HBase cannot be set up, started or stopped.

    Raised for a missing or too old ``java``, a missing ``mvn``, a failed jar resolution, a
    port already in use, or a start-up failure (the message then carries the last lines of
    the HBase logs).  Not retryable as such: the message says what to fix.
    """


class HBaseStartError(HBaseLauncherError):
    """HBase was launched but did not become ready (a JVM exited or the timeout passed).

    Everything the failed start launched has been stopped when this is raised.
    """


def stderr_progress(message: str) -> None:
    """The default progress reporter: one line per message on stderr."""
    print(f"hbase: {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- tools


@dataclass(frozen=True)
class JavaRuntime:
    """A ``java`` executable and its feature version (17 for ``17.0.15``)."""

    executable: str
    version: str
    feature: int


_VERSION_LINE = re.compile(r'version "([^"]+)"')


def find_java() -> JavaRuntime:
    """Find ``java`` (``$JAVA_HOME/bin/java`` if ``JAVA_HOME`` is set, else on ``PATH``) and
    check that it is Java 17 or newer.

    Raises :class:`HBaseLauncherError` naming what is missing or too old.
    """
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidate = Path(java_home) / "bin" / "java"
        if not os.access(candidate, os.X_OK):
            raise HBaseLauncherError(
                f"JAVA_HOME is set to {java_home!r} but {candidate} is not an executable; "
                f"point JAVA_HOME at a JDK {MINIMUM_JAVA} or newer, or unset it to use the "
                "java on PATH"
            )
        executable = str(candidate)
    else:
        found = shutil.which("java")
        if found is None:
            raise HBaseLauncherError(
                "cannot run a local HBase: no `java` on PATH and JAVA_HOME is not set. "
                f"Install a JDK {MINIMUM_JAVA} or newer (Debian/Ubuntu: "
                f"apt-get install openjdk-{MINIMUM_JAVA}-jdk-headless) or set JAVA_HOME. "
                f"PATH={os.environ.get('PATH', '')!r}"
            )
        executable = found
    try:
        result = subprocess.run(
            [executable, "-version"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise HBaseLauncherError(f"cannot run {executable} -version: {exc}") from None
    output = result.stderr + result.stdout
    match = _VERSION_LINE.search(output)
    if result.returncode != 0 or match is None:
        raise HBaseLauncherError(
            f"cannot tell the Java version of {executable}: `java -version` exited with "
            f"{result.returncode} and printed {output.strip()[:300]!r}"
        )
    version = match.group(1)
    feature = _java_feature(version)
    if feature < MINIMUM_JAVA:
        raise HBaseLauncherError(
            f"HBase {hbase_version()} needs Java {MINIMUM_JAVA} or newer, but {executable} is "
            f"Java {version}; install a JDK {MINIMUM_JAVA}+ and put it first on PATH or set "
            "JAVA_HOME to it"
        )
    return JavaRuntime(executable, version, feature)


def _java_feature(version: str) -> int:
    """``"1.8.0_292"`` -> 8, ``"17.0.15"`` -> 17, ``"21-ea"`` -> 21; 0 if unparsable."""
    parts = re.split(r"[._+-]", version)
    try:
        first = int(parts[0])
        return int(parts[1]) if first == 1 and len(parts) > 1 else first
    except ValueError:
        return 0


def find_maven() -> str:
    """The ``mvn`` on PATH, or :class:`HBaseLauncherError` saying how to get it."""
    found = shutil.which("mvn")
    if found is None:
        raise HBaseLauncherError(
            "cannot resolve HBase's jars: no `mvn` (Apache Maven 3) on PATH. Install it "
            "(Debian/Ubuntu: apt-get install maven); the jars are then downloaded once from "
            f"Maven Central into ~/.m2 (about 115 MB). PATH={os.environ.get('PATH', '')!r}"
        )
    return found


# --------------------------------------------------------------------------- jars


def _packaged_pom() -> Path:
    return Path(__file__).with_name("pom.xml")


@functools.lru_cache(maxsize=1)
def hbase_version() -> str:
    """The HBase version the packaged pom.xml resolves (its single source of truth)."""
    text = _packaged_pom().read_text(encoding="utf-8")
    match = re.search(r"<hbase\.version>([^<]+)</hbase\.version>", text)
    if match is None:
        raise HBaseLauncherError(f"{_packaged_pom()} has no <hbase.version> property")
    return match.group(1).strip()


def default_cache_dir() -> Path:
    """``$PERCOLATOR_CACHE_DIR``, else ``$XDG_CACHE_HOME/percolator``, else
    ``~/.cache/percolator``; the jars' classpath file goes in ``hbase-<version>/`` below."""
    explicit = os.environ.get("PERCOLATOR_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "percolator"


def read_classpath(classpath_file: Path) -> list[str]:
    """The jar paths of a classpath file written by :func:`ensure_classpath`."""
    text = classpath_file.read_text(encoding="utf-8").strip()
    return [entry for entry in text.split(os.pathsep) if entry]


def check_classpath(entries: list[str]) -> None:
    """Check that a resolved classpath can run HBase and log: the jars exist, hbase-thrift is
    there, and there is exactly one slf4j binding and no log4j 1.x implementation.

    Raises :class:`HBaseLauncherError` naming the offending jars.
    """
    names = [os.path.basename(entry) for entry in entries]
    missing = [entry for entry in entries if not os.path.isfile(entry)]
    if missing:
        raise HBaseLauncherError(
            f"{len(missing)} jar(s) of the HBase classpath are missing, e.g. {missing[0]}"
        )
    if not any(name == f"hbase-thrift-{hbase_version()}.jar" for name in names):
        raise HBaseLauncherError(f"the HBase classpath has no hbase-thrift-{hbase_version()}.jar")
    bindings = [name for name in names if _SLF4J_BINDINGS.match(name)]
    if len(bindings) != 1:
        raise HBaseLauncherError(
            f"the HBase classpath must hold exactly one slf4j binding, found {bindings}; "
            "fix the exclusions in percolator/testing/localhbase/pom.xml"
        )
    log4j1 = [name for name in names if _LOG4J1_IMPLEMENTATIONS.match(name)]
    if log4j1:
        raise HBaseLauncherError(
            f"the HBase classpath holds a log4j 1.x implementation {log4j1} next to "
            "log4j-1.2-api; fix the exclusions in percolator/testing/localhbase/pom.xml"
        )


@contextlib.contextmanager
def _exclusive_lock(path: Path, *, wait: bool) -> Iterator[None]:
    """Hold an advisory lock on ``path`` (created if needed) for the block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as handle:
        flags = fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB)
        try:
            fcntl.flock(handle.fileno(), flags)
        except BlockingIOError:
            raise HBaseLauncherError(
                f"another process holds the lock {path} (it is starting HBase there); "
                "wait for it to finish"
            ) from None
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def ensure_classpath(
    progress: Progress | None = stderr_progress, *, cache_dir: Path | None = None
) -> Path:
    """Return the path of a file listing HBase's jars, resolving them with Maven if needed.

    Idempotent and safe to call from several processes at once (they serialise on a lock
    file; only the first runs Maven).  The file is reused while the packaged pom.xml is
    unchanged and every jar it names still exists in ``~/.m2``; otherwise Maven runs again
    (``mvn -B dependency:build-classpath``), which downloads what ``~/.m2`` lacks.  Maven's
    full output goes to ``mvn.log`` next to the classpath file; ``progress`` gets a short
    line every few seconds (files and megabytes downloaded so far).

    Raises :class:`HBaseLauncherError` if ``java`` is missing or older than 17, if Maven is
    needed but ``mvn`` is missing, or if Maven fails (the message holds its last lines).
    """
    report = progress or (lambda _message: None)
    # Maven runs on Java too, and HBase will: naming a missing java first avoids a confusing
    # Maven failure.
    find_java()
    pom = _packaged_pom()
    pom_bytes = pom.read_bytes()
    digest = hashlib.sha256(pom_bytes).hexdigest()
    target = (cache_dir or default_cache_dir()) / f"hbase-{hbase_version()}"
    classpath_file = target / "classpath.txt"
    stamp_file = target / "pom.sha256"
    with _exclusive_lock(target / ".lock", wait=True):
        if _classpath_is_current(classpath_file, stamp_file, digest):
            return classpath_file
        mvn = find_maven()
        (target / "pom.xml").write_bytes(pom_bytes)
        fresh = target / "classpath.txt.new"
        with contextlib.suppress(FileNotFoundError):
            fresh.unlink()
        _run_maven(mvn, target, fresh, report)
        entries = read_classpath(fresh)
        check_classpath(entries)
        os.replace(fresh, classpath_file)
        stamp_file.write_text(digest + "\n", encoding="utf-8")
        report(
            f"HBase {hbase_version()} jars ready: {len(entries)} jars; classpath in "
            f"{classpath_file}"
        )
        return classpath_file


def _classpath_is_current(classpath_file: Path, stamp_file: Path, digest: str) -> bool:
    try:
        if stamp_file.read_text(encoding="utf-8").strip() != digest:
            return False
        entries = read_classpath(classpath_file)
    except OSError:
        return False
    return bool(entries) and all(os.path.isfile(entry) for entry in entries)


_DOWNLOADED = re.compile(r"Downloaded from [^:]+: \S+ \(([\d.]+) (B|kB|MB|GB)")
_UNIT = {"B": 1, "kB": 1000, "MB": 1000**2, "GB": 1000**3}


def _run_maven(mvn: str, workdir: Path, output: Path, report: Progress) -> None:
    log_path = workdir / "mvn.log"
    command = [
        mvn,
        "-B",
        "-Dstyle.color=never",
        "-f",
        str(workdir / "pom.xml"),
        "dependency:build-classpath",
        "-Dmdep.includeScope=runtime",
        f"-Dmdep.outputFile={output}",
    ]
    report(
        f"resolving HBase {hbase_version()} jars with Maven (a fresh machine downloads "
        f"about 115 MB into ~/.m2; full log: {log_path})"
    )
    started = time.monotonic()
    last_report = started
    files = 0
    size = 0.0
    with (
        open(log_path, "w", encoding="utf-8") as log,
        subprocess.Popen(
            command,
            cwd=workdir,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
        ) as proc,
    ):
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                log.write(line)
                match = _DOWNLOADED.search(line)
                if match:
                    files += 1
                    size += float(match.group(1)) * _UNIT[match.group(2)]
                now = time.monotonic()
                if now - last_report >= 3.0:
                    last_report = now
                    report(
                        f"Maven: {files} files downloaded, {size / 1e6:.1f} MB "
                        f"({now - started:.0f} s)"
                    )
            code = proc.wait()
        except BaseException:
            # Ctrl-C or an error while streaming: do not leave Maven running behind us.
            proc.kill()
            raise
    elapsed = time.monotonic() - started
    if code != 0 or not output.is_file():
        raise HBaseLauncherError(
            f"Maven could not resolve HBase's jars (exit code {code}, command "
            f"{' '.join(command)}). Last lines of {log_path}:\n{_tail(log_path, 25)}"
        )
    report(f"Maven finished in {elapsed:.0f} s ({files} files, {size / 1e6:.1f} MB downloaded)")


# --------------------------------------------------------------------------- helpers


def _tail(path: Path, lines: int) -> str:
    """The last ``lines`` lines of a text file (empty if it does not exist)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 256 * 1024))
            data = handle.read()
    except OSError:
        return ""
    return "\n".join(data.decode("utf-8", errors="replace").splitlines()[-lines:])


def _first_errors(path: Path, limit: int) -> list[str]:
    """The first lines of a log that report an error: the cause usually comes first and the
    shutdown noise last, so a tail alone can miss it."""
    found: list[str] = []
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if re.search(r"\b(ERROR|FATAL)\b|^Error:|^Exception|Could not", line):
                    found.append(line.rstrip())
                    if len(found) >= limit:
                        break
    except OSError:
        pass
    return found


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # As servers do: a port whose old connections linger in TIME_WAIT is free to bind.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


Probe = Callable[[str, int, float], str | None]

# Created and dropped by probe_tables_work(); never left behind by a successful start.
PROBE_TABLE = b"percolator_localhbase_ready_probe"


def _reason(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"[:300]


def probe(host: str, port: int, timeout_s: float = 5.0) -> str | None:
    """Ask the Thrift-1 gateway at ``host:port`` for its table list.

    Returns ``None`` if HBase answered, else a one-line reason.  The Thrift port opens before
    HBase can serve, so an open port proves nothing: only a real request does.  This one is
    read-only and cheap (fit for a shared server) but weaker than :func:`probe_tables_work`:
    HBase lists tables while its master is still initialising, when creating a table still
    waits.
    """
    import happybase  # deferred: only needed when talking to HBase

    try:
        connection = happybase.Connection(
            host, port, timeout=int(timeout_s * 1000), autoconnect=False
        )
        try:
            connection.open()
            connection.tables()
        finally:
            connection.close()
    except Exception as exc:  # any failure means "not serving yet"; the reason is reported
        return _reason(exc)
    return None


def probe_thrift2(host: str, port: int, timeout_s: float = 5.0) -> str | None:
    """Ask the gateway at ``host:port`` which Thrift it serves; ``None`` if it answered that
    it is a Thrift-2 gateway, else a one-line reason.  (The question is answered by the
    gateway itself; :func:`probe` on the Thrift-1 port is what proves HBase serves.)"""
    from percolator.store import thrift2  # deferred: only needed when talking to HBase

    try:
        client, transport = thrift2.connect(host, port, int(timeout_s * 1000))
        try:
            kind = client.getThriftServerType()
        finally:
            transport.close()
    except Exception as exc:  # any failure means "not serving yet"; the reason is reported
        return _reason(exc)
    if kind != thrift2.SERVER_TYPE_TWO:
        return f"{host}:{port} is a Thrift gateway of type {kind}, not Thrift-2"
    return None


def _url(thrift_port: int, thrift2_port: int | None) -> str:
    """The store URL of a local instance (an instance started before the Thrift-2 gateway
    was part of it has none)."""
    base = f"hbase://127.0.0.1:{thrift_port}"
    return base if thrift2_port is None else f"{base}?thrift2_port={thrift2_port}"


def probe_tables_work(host: str, port: int, timeout_s: float = 15.0) -> str | None:
    """Create :data:`PROBE_TABLE`, write and read a cell, drop it; ``None`` if all worked.

    The readiness check of a freshly started instance: it passes only once the master has
    finished initialising and a region server serves new regions, which is what tests and
    users do first.  Not for shared servers (it creates a table).  A call cut short by
    ``timeout_s`` may leave the table behind (HBase finishes the creation on its own); the
    next call drops it first.
    """
    reason = probe(host, port, timeout_s=min(timeout_s, 5.0))
    if reason is not None:
        return reason
    import happybase  # deferred: only needed when talking to HBase

    try:
        connection = happybase.Connection(
            host, port, timeout=int(timeout_s * 1000), autoconnect=False
        )
        try:
            connection.open()
            if PROBE_TABLE in connection.tables():
                connection.delete_table(PROBE_TABLE, disable=True)
            connection.create_table(PROBE_TABLE, {"f": {"max_versions": 1}})
            table = connection.table(PROBE_TABLE)
            table.put(b"row", {b"f:q": b"ready"})
            if table.row(b"row") != {b"f:q": b"ready"}:
                return "the probe table did not return the cell just written"
            connection.delete_table(PROBE_TABLE, disable=True)
        finally:
            connection.close()
    except Exception as exc:  # any failure means "not ready yet"; the reason is reported
        return _reason(exc)
    return None


def wait_until_serving(
    host: str,
    port: int,
    timeout_s: float,
    progress: Progress | None = None,
    *,
    still_starting: Callable[[], str | None] | None = None,
    check: Probe = probe,
) -> float:
    """Call ``check`` (default :func:`probe`) until it passes; return the seconds it took.

    ``still_starting`` (optional) is called between attempts; if it returns a message (for
    example "the master exited"), waiting stops at once with :class:`HBaseStartError`.
    ``progress`` gets the elapsed time every few seconds.  Raises :class:`HBaseStartError`
    on timeout, naming the last failure.
    """
    started = time.monotonic()
    last_report = started
    while True:
        if still_starting is not None:
            problem = still_starting()
            if problem is not None:
                raise HBaseStartError(problem)
        elapsed = time.monotonic() - started
        reason = check(host, port, max(1.0, min(10.0, timeout_s - elapsed)))
        now = time.monotonic()
        if reason is None:
            return now - started
        if now - started >= timeout_s:
            raise HBaseStartError(
                f"HBase at {host}:{port} did not answer within {timeout_s:.0f} s; "
                f"last attempt: {reason}"
            )
        if progress is not None and now - last_report >= 5.0:
            last_report = now
            progress(f"waiting for HBase on {host}:{port} ({now - started:.0f} s)")
        time.sleep(0.5)


# A kernel thread's flag in /proc/PID/stat (include/linux/sched.h).
_PF_KTHREAD = 0x00200000


def _pid_is_ours(pid: int, marker: str) -> bool:
    """Whether ``pid`` is a live (not zombie) process whose command line holds ``marker``.

    Without /proc (not Linux) only liveness is checked.
    """
    proc = Path(f"/proc/{pid}")
    if proc.parent.is_dir():
        try:
            stat = (proc / "stat").read_text()
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            return False
        return _stat_is_ours(stat, cmdline, marker)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stat_is_ours(stat: str, cmdline: bytes, marker: str) -> bool:
    """The decision of :func:`_pid_is_ours` from ``/proc/PID/stat`` and ``cmdline``.

    A process that is exiting has already released its memory, so its command line reads
    empty, yet it runs (closing files and sockets) until its state turns to zombie.  Such a
    process still counts as ours: a stop that saw "not ours" there would report a JVM gone
    that another process still sees running.  The only other processes without a command
    line are kernel threads, which carry a flag saying so.
    """
    # The fields after the parenthesised command name: state, ppid, pgrp, session,
    # tty_nr, tpgid, flags, ...
    fields = stat.rpartition(")")[2].split()
    if fields[:1] == ["Z"]:
        return False
    if cmdline == b"":
        return len(fields) > 6 and not int(fields[6]) & _PF_KTHREAD
    return marker.encode() in cmdline.split(b"\0")


def _xml_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


# --------------------------------------------------------------------------- instances


@dataclass
class _Jvm:
    """One launched JVM.  ``popen`` is set only in the process that launched it."""

    role: str  # one of _ROLES
    pid: int
    log: Path
    marker: str
    popen: subprocess.Popen[bytes] | None = None

    def alive(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is None
        return _pid_is_ours(self.pid, self.marker)

    def exit_code(self) -> int | None:
        return self.popen.poll() if self.popen is not None else None

    def signal(self, signum: int) -> None:
        if not self.alive():
            return
        # Each JVM leads its own process group (start_new_session), so the group is the JVM.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signum)


@dataclass(frozen=True)
class HBaseStatus:
    """What :meth:`LocalHBase.status` found (``json.dumps(dataclasses.asdict(status))``)."""

    workdir: str
    running: bool  # at least one of the JVMs is alive
    serving: bool  # HBase answered a request through both gateways just now
    url: str | None
    thrift_port: int | None
    zk_port: int | None
    master_pid: int | None
    thrift_pid: int | None
    master_alive: bool
    thrift_alive: bool
    logs: tuple[str, ...]
    detail: str  # why it is not serving, or ""
    thrift2_port: int | None = None
    thrift2_pid: int | None = None
    thrift2_alive: bool = False


class LocalHBase:
    """A standalone HBase plus its Thrift-1 and Thrift-2 gateways, owned through a work
    directory.  The store speaks Thrift-1 (happybase) and sends the compare-and-sets that
    carry puts to the Thrift-2 gateway, whose port its URL names (``thrift2_port=``).

    ``start()`` picks free loopback ports (unless given), writes the configuration, launches
    the three JVMs in their own process groups and returns once HBase answers through both
    gateways.
    ``stop()`` sends SIGTERM, then SIGKILL after a grace period.  ``stop()`` and
    ``status()`` also work from another process: they read the state file the starting
    process wrote into the work directory.

    Used as a context manager, the instance is started on entry and stopped on exit.  While
    this process owns running JVMs an ``atexit`` hook stops them; call :meth:`detach` to
    leave them running on purpose (``percolator hbase start`` does).  Not thread-safe.
    """

    def __init__(
        self,
        workdir: Path | str,
        thrift_port: int | None = None,
        zk_port: int | None = None,
        progress: Progress | None = stderr_progress,
        *,
        classpath_file: Path | None = None,
        master_heap: str = DEFAULT_MASTER_HEAP,
        thrift_heap: str = "256m",
        stop_grace_s: float = DEFAULT_STOP_GRACE_S,
        extra_config: Mapping[str, str] | None = None,
        thrift_bind: str = "127.0.0.1",
        thrift2_port: int | None = None,
    ) -> None:
        self.workdir = Path(workdir).expanduser().resolve()
        # The Thrift gateway's listen address.  Loopback by default; a container serving
        # other containers binds 0.0.0.0.  Probes always go through loopback.
        self._thrift_bind = thrift_bind
        self._requested_thrift_port = thrift_port
        self._requested_zk_port = zk_port
        self._requested_thrift2_port = thrift2_port
        self.thrift_port = thrift_port  # the ports in use once started
        self.thrift2_port = thrift2_port
        self.zk_port = zk_port
        self._progress: Progress = progress or (lambda _message: None)
        self._classpath_file = classpath_file
        self._master_heap = master_heap
        self._thrift_heap = thrift_heap
        self._stop_grace_s = stop_grace_s
        self._extra_config = dict(extra_config or {})
        self._jvms: list[_Jvm] = []
        self._atexit_registered = False
        self._started_at = 0.0

    # ----------------------------------------------------------------- paths

    @property
    def state_file(self) -> Path:
        return self.workdir / STATE_FILE

    @property
    def conf_dir(self) -> Path:
        return self.workdir / "conf"

    @property
    def log_dir(self) -> Path:
        return self.workdir / "logs"

    @property
    def _marker(self) -> str:
        return _WORKDIR_PROPERTY + str(self.workdir)

    @property
    def url(self) -> str:
        """``hbase://127.0.0.1:PORT?thrift2_port=PORT2`` of this instance (started here or
        found in the state file); :class:`HBaseLauncherError` if it has not been started."""
        port, port2 = (self.thrift_port, self.thrift2_port) if self._jvms else (None, None)
        if port is None:
            state = self._read_state()
            port = state.get("thrift_port") if state else None
            port2 = state.get("thrift2_port") if state else None
        if not isinstance(port, int):
            raise HBaseLauncherError(f"no local HBase has been started in {self.workdir}")
        return _url(port, port2 if isinstance(port2, int) else None)

    # ----------------------------------------------------------------- state file

    def _read_state(self) -> dict[str, Any] | None:
        try:
            data = json.loads(self.state_file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise HBaseLauncherError(f"cannot read {self.state_file}: {exc}") from None
        if not isinstance(data, dict):
            raise HBaseLauncherError(f"{self.state_file} does not hold a JSON object")
        return data

    def _write_state(self, *, ready: bool) -> None:
        by_role = {jvm.role: jvm for jvm in self._jvms}
        state = {
            "format": 1,
            "hbase_version": hbase_version(),
            "workdir": str(self.workdir),
            "thrift_port": self.thrift_port,
            "zk_port": self.zk_port,
            "master_pid": by_role["master"].pid if "master" in by_role else None,
            "thrift_pid": by_role["thrift"].pid if "thrift" in by_role else None,
            "thrift2_port": self.thrift2_port,
            "thrift2_pid": by_role["thrift2"].pid if "thrift2" in by_role else None,
            "launcher_pid": os.getpid(),
            "started_at": self._started_at,
            "ready": ready,
        }
        # Write-then-rename so a reader never sees half a file.
        temporary = self.state_file.with_suffix(".json.tmp")
        temporary.write_text(json.dumps(state, indent=2) + "\n", encoding="utf-8")
        os.replace(temporary, self.state_file)

    def _jvms_from_state(self) -> tuple[list[_Jvm], dict[str, Any] | None]:
        """The JVMs this instance knows: its own, or those named by the state file."""
        if self._jvms:
            return self._jvms, None
        state = self._read_state()
        if state is None:
            return [], None
        jvms = []
        for role in _ROLES:
            pid = state.get(f"{role}_pid")
            if isinstance(pid, int):
                jvms.append(_Jvm(role, pid, self.log_dir / f"{role}.log", self._marker))
        return jvms, state

    # ----------------------------------------------------------------- start

    def start(self, timeout: float = DEFAULT_START_TIMEOUT_S) -> str:
        """Start HBase and wait until it serves; return :attr:`url`.

        Raises :class:`HBaseLauncherError` before launching anything if java/mvn are missing,
        a requested port is taken, or an instance is already running in the work directory;
        :class:`HBaseStartError` if a JVM exits or ``timeout`` seconds pass first -- the
        message then holds the last lines of the logs, and everything launched has been
        stopped.  A Ctrl-C during the wait also stops what was launched.
        """
        if self._jvms:
            raise HBaseLauncherError(f"this LocalHBase in {self.workdir} is already started")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._started_at = time.time()
        with _exclusive_lock(self.workdir / ".lock", wait=False):
            self._refuse_if_running()
            self._check_requested_ports()
            classpath_file = self._classpath_file or ensure_classpath(self._progress)
            java = find_java()
            self._choose_ports()
            self._write_config()
            started = time.monotonic()
            self._progress(
                f"starting HBase {hbase_version()} in {self.workdir} (Thrift port "
                f"{self.thrift_port}, Thrift-2 port {self.thrift2_port}, ZooKeeper port "
                f"{self.zk_port}; logs in {self.log_dir})"
            )
            try:
                classpath = f"{self.conf_dir}{os.pathsep}{classpath_file.read_text().strip()}"
                self._launch(
                    java.executable,
                    "master",
                    self._master_heap,
                    classpath,
                    [_MASTER_CLASS, "start"],
                )
                self._write_state(ready=False)
                self._launch(
                    java.executable,
                    "thrift",
                    self._thrift_heap,
                    classpath,
                    [_THRIFT_CLASS, "-b", self._thrift_bind, "-p", str(self.thrift_port), "start"],
                )
                self._launch(
                    java.executable,
                    "thrift2",
                    self._thrift_heap,
                    classpath,
                    [
                        _THRIFT2_CLASS,
                        "-b",
                        self._thrift_bind,
                        "-p",
                        str(self.thrift2_port),
                        "start",
                    ],
                )
                self._register_atexit()
                # Written after each launch, before the wait: a launcher killed mid-start
                # leaves enough behind for `percolator hbase stop` to clean up.
                self._write_state(ready=False)
                # Thrift-1 proves HBase serves (a table round trip); Thrift-2 answers next.
                for port, check in (
                    (self.thrift_port, probe_tables_work),
                    (self.thrift2_port, probe_thrift2),
                ):
                    assert port is not None
                    wait_until_serving(
                        "127.0.0.1",
                        port,
                        max(0.0, timeout - (time.monotonic() - started)),
                        self._progress,
                        still_starting=self._failed_during_start,
                        check=check,
                    )
                self._write_state(ready=True)
            except HBaseStartError as exc:
                jvms = list(self._jvms)
                # Nothing worth keeping in a failed start: a short grace.  The logs are read
                # afterwards, when each JVM has written all it will.
                self._stop_jvms(jvms, grace_s=5.0)
                raise HBaseStartError(self._failure_message(str(exc), jvms)) from None
            except BaseException:
                self._stop_jvms(self._jvms, grace_s=5.0)
                raise
        self._progress(
            f"HBase is serving at {self.url} (ready after {time.monotonic() - started:.0f} s)"
        )
        return self.url

    def _refuse_if_running(self) -> None:
        jvms, state = self._jvms_from_state()
        if state is None:
            return
        alive = [jvm for jvm in jvms if jvm.alive()]
        if alive:
            pids = ", ".join(f"{jvm.role} pid {jvm.pid}" for jvm in alive)
            raise HBaseLauncherError(
                f"an HBase is already running from {self.workdir} ({pids}, Thrift port "
                f"{state.get('thrift_port')}); stop it first: percolator hbase stop --dir "
                f"{self.workdir}"
            )
        # Left behind by an instance that died or was killed: nothing to stop.
        self.state_file.unlink()

    def _check_requested_ports(self) -> None:
        requested = {
            "Thrift": self._requested_thrift_port,
            "Thrift-2": self._requested_thrift2_port,
            "ZooKeeper": self._requested_zk_port,
        }
        for name, port in requested.items():
            # An occupied Thrift port could be another HBase, which would then pass the
            # readiness check in our place: refuse rather than risk it.
            if port is not None and _port_in_use(port):
                raise HBaseLauncherError(
                    f"port {port} on 127.0.0.1 (requested {name} port) is already in use; "
                    "choose another or leave it unset to pick a free one"
                )
        given = [(name, port) for name, port in requested.items() if port is not None]
        for i, (name, port) in enumerate(given):
            for other, other_port in given[i + 1 :]:
                if port == other_port:
                    raise HBaseLauncherError(
                        f"the {name} and {other} ports must differ (both {port})"
                    )

    def _choose_ports(self) -> None:
        # Free ports are picked as late as possible: another process could take one before
        # HBase binds it (the master then exits and start() reports it).
        requested = [self._requested_thrift_port, self._requested_thrift2_port]
        requested.append(self._requested_zk_port)
        taken = {port for port in requested if port is not None}
        chosen: list[int] = []
        for wanted in requested:
            port = wanted
            # Two kernel picks (or a pick and a request) can coincide; re-pick the unrequested.
            while port is None or port in chosen or (wanted is None and port in taken):
                port = free_port()
            chosen.append(port)
        self.thrift_port, self.thrift2_port, self.zk_port = chosen

    def _write_config(self) -> None:
        data = self.workdir / "data"
        for directory in (self.conf_dir, self.log_dir, data):
            directory.mkdir(parents=True, exist_ok=True)
        properties = {
            "hbase.cluster.distributed": "false",
            "hbase.rootdir": (data / "root").as_uri(),
            "hbase.tmp.dir": str(data / "tmp"),
            "hbase.zookeeper.property.dataDir": str(data / "zk"),
            "hbase.zookeeper.quorum": "127.0.0.1",
            "hbase.zookeeper.property.clientPort": str(self.zk_port),
            # The local filesystem cannot hflush; HBase refuses to start without this.
            "hbase.unsafe.stream.capability.enforce": "false",
            # No web UIs, random RPC ports: several instances can share one machine.
            "hbase.master.info.port": "-1",
            "hbase.regionserver.info.port": "-1",
            "hbase.thrift.info.port": "-1",
            "hbase.localcluster.assign.random.ports": "true",
            # The 60 s default drops idle happybase connections ("TSocket read 0 bytes").
            "hbase.thrift.server.socket.read.timeout": "86400000",
            # The host name may not resolve to loopback.
            "hbase.unsafe.regionserver.hostname": "localhost",
            "hbase.master.hostname": "localhost",
        }
        properties.update(self._extra_config)
        body = "".join(
            f"  <property><name>{_xml_escape(key)}</name><value>{_xml_escape(value)}</value>"
            "</property>\n"
            for key, value in properties.items()
        )
        (self.conf_dir / "hbase-site.xml").write_text(
            f'<?xml version="1.0"?>\n<configuration>\n{body}</configuration>\n', encoding="utf-8"
        )
        (self.conf_dir / "log4j2.properties").write_text(_LOG4J2_PROPERTIES, encoding="utf-8")

    def _launch(self, java: str, role: str, heap: str, classpath: str, main: list[str]) -> None:
        log_path = self.log_dir / f"{role}.log"
        if log_path.exists():
            os.replace(log_path, log_path.with_suffix(".log.1"))  # keep the previous run's log
        command = [
            java,
            f"-Xmx{heap}",
            *JDK17_FLAGS,
            f"-Dlog4j2.configurationFile={self.conf_dir / 'log4j2.properties'}",
            self._marker,
            "-cp",
            classpath,
            *main,
        ]
        with open(log_path, "wb") as log:
            popen = subprocess.Popen(
                command,
                cwd=self.workdir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                # Own session and process group: a Ctrl-C in the terminal reaches only the
                # launcher, which then stops the JVMs in order; background instances survive
                # the terminal closing.
                start_new_session=True,
            )
        self._jvms.append(_Jvm(role, popen.pid, log_path, self._marker, popen))

    def _first_exit(self) -> str | None:
        """ "the HBase <role> JVM exited ..." for the first launched JVM that has ended."""
        for jvm in self._jvms:
            code = jvm.exit_code()
            if code is not None:
                how = (
                    f"was killed by {signal.Signals(-code).name}"
                    if code < 0 and -code in signal.valid_signals()
                    else f"exited with code {code}"
                )
                return f"the HBase {jvm.role} JVM {how}"
        return None

    def _failed_during_start(self) -> str | None:
        message = self._first_exit()
        return None if message is None else f"{message} during start-up"

    def _failure_message(self, reason: str, jvms: list[_Jvm]) -> str:
        parts = [f"HBase in {self.workdir} failed to start: {reason}."]
        for jvm in jvms:
            errors = _first_errors(jvm.log, 5)
            if errors:
                parts.append(f"First errors in {jvm.log}:\n" + "\n".join(errors))
            tail = _tail(jvm.log, 30)
            parts.append(f"Last lines of {jvm.log}:\n{tail if tail else '(empty)'}")
        return "\n".join(parts)

    def _register_atexit(self) -> None:
        if not self._atexit_registered:
            atexit.register(self._stop_at_exit)
            self._atexit_registered = True

    def _unregister_atexit(self) -> None:
        if self._atexit_registered:
            atexit.unregister(self._stop_at_exit)
            self._atexit_registered = False

    def _stop_at_exit(self) -> None:
        if self._jvms:
            self.stop()

    def detach(self) -> None:
        """Leave the running JVMs running when this process exits (no atexit stop).

        They can be stopped later through the state file: ``LocalHBase(workdir).stop()``.
        """
        self._unregister_atexit()
        self._jvms = []

    # ----------------------------------------------------------------- wait / stop / status

    def wait(self, poll_s: float = 1.0) -> str:
        """Block until one of the JVMs this process launched exits; return a message naming
        it and its exit code.  Interrupted by Ctrl-C (KeyboardInterrupt) as usual."""
        if not self._jvms:
            raise HBaseLauncherError(f"this LocalHBase in {self.workdir} is not started")
        while True:
            message = self._first_exit()
            if message is not None:
                return message
            time.sleep(poll_s)

    def stop(self, grace_s: float | None = None) -> bool:
        """Stop the instance; return whether anything was running.

        Idempotent.  Works on an instance started here or, through the state file, by another
        process.  Both JVMs get SIGTERM, then SIGKILL if still alive after ``grace_s``
        (default: the ``stop_grace_s`` given to the constructor).  On SIGTERM HBase flushes
        and closes its regions within a second or two; a standalone master then spends about
        20 s more because its shutdown hooks stop the in-process ZooKeeper before the region
        server has deregistered, and the region server retries it.  A short grace therefore
        loses nothing for a throw-away instance.  The state file is removed once both JVMs
        are gone.  A Ctrl-C during the stop kills them at once and re-raises.
        """
        jvms, _state = self._jvms_from_state()
        was_running = any(jvm.alive() for jvm in jvms)
        if was_running:
            self._progress(f"stopping HBase in {self.workdir}")
        self._stop_jvms(jvms, self._stop_grace_s if grace_s is None else grace_s)
        return was_running

    def _stop_jvms(self, jvms: list[_Jvm], grace_s: float) -> None:
        try:
            for jvm in jvms:
                jvm.signal(signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while any(jvm.alive() for jvm in jvms) and time.monotonic() < deadline:
                time.sleep(0.2)
        finally:
            # Also reached on Ctrl-C or an error above: never leave a JVM behind.
            for jvm in jvms:
                if jvm.alive():
                    self._progress(
                        f"{jvm.role} (pid {jvm.pid}) still running after {grace_s:.0f} s; "
                        "killing it"
                    )
                    jvm.signal(signal.SIGKILL)
            for jvm in jvms:
                if jvm.popen is not None:
                    jvm.popen.wait()
            kill_deadline = time.monotonic() + 10.0
            while any(jvm.alive() for jvm in jvms) and time.monotonic() < kill_deadline:
                time.sleep(0.1)
        survivors = [jvm for jvm in jvms if jvm.alive()]
        if survivors:
            raise HBaseLauncherError(
                "could not stop " + ", ".join(f"{jvm.role} pid {jvm.pid}" for jvm in survivors)
            )
        with contextlib.suppress(FileNotFoundError):
            self.state_file.unlink()
        self._jvms = []
        self._unregister_atexit()

    def status(self, probe_timeout_s: float = 3.0) -> HBaseStatus:
        """Report whether the JVMs are alive and whether HBase answers a request now."""
        jvms, state = self._jvms_from_state()
        by_role = {jvm.role: jvm for jvm in jvms}
        if state is None and self._jvms:
            thrift_port, zk_port = self.thrift_port, self.zk_port
        else:
            thrift_port = state.get("thrift_port") if state else None
            zk_port = state.get("zk_port") if state else None
        thrift2_port = state.get("thrift2_port") if state else self.thrift2_port
        if not isinstance(thrift2_port, int):
            thrift2_port = None
        alive = {role: (role in by_role and by_role[role].alive()) for role in _ROLES}
        running = any(alive.values())
        detail = ""
        serving = False
        if not running:
            detail = "not running"
        elif not isinstance(thrift_port, int):
            detail = "state file names no Thrift port"
        else:
            reason = probe("127.0.0.1", thrift_port, timeout_s=probe_timeout_s)
            if reason is None and thrift2_port is not None:
                reason = probe_thrift2("127.0.0.1", thrift2_port, timeout_s=probe_timeout_s)
            serving = reason is None
            detail = reason or ""
        return HBaseStatus(
            workdir=str(self.workdir),
            running=running,
            serving=serving,
            url=_url(thrift_port, thrift2_port) if running and thrift_port else None,
            thrift_port=thrift_port if isinstance(thrift_port, int) else None,
            zk_port=zk_port if isinstance(zk_port, int) else None,
            master_pid=by_role["master"].pid if "master" in by_role else None,
            thrift_pid=by_role["thrift"].pid if "thrift" in by_role else None,
            master_alive=alive["master"],
            thrift_alive=alive["thrift"],
            logs=tuple(str(self.log_dir / f"{role}.log") for role in _ROLES),
            detail=detail,
            thrift2_port=thrift2_port,
            thrift2_pid=by_role["thrift2"].pid if "thrift2" in by_role else None,
            thrift2_alive=alive["thrift2"],
        )

    @property
    def pids(self) -> dict[str, int]:
        """Role -> pid of the JVMs this instance knows (own or from the state file)."""
        jvms, _state = self._jvms_from_state()
        return {jvm.role: jvm.pid for jvm in jvms}

    # ----------------------------------------------------------------- context manager

    def __enter__(self) -> LocalHBase:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


@contextlib.contextmanager
def signals_raise_keyboard_interrupt() -> Iterator[None]:
    """In the main thread, turn SIGTERM and SIGHUP into KeyboardInterrupt for the block.

    A foreground launcher then cleans up the same way on ``kill`` and on a closed terminal
    as on Ctrl-C (Python's default for SIGTERM ends the process without running cleanup).
    """

    def _raise(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

    previous = {signum: signal.signal(signum, _raise) for signum in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)

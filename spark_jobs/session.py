"""Build the SparkSession the jobs run in, passing the master URL and Spark configuration
through.

Defaults (each one can be overridden by ``conf``):

* master ``local[*]`` unless one is given, or the process was started by ``spark-submit``
  (which chose the master already);
* ``spark.ui.enabled=false``, ``spark.ui.showConsoleProgress=false`` (the jobs report their
  own progress) and ``spark.sql.shuffle.partitions`` equal to the local core
  count in local mode: bulk jobs here are bound by the store, not by Spark's shuffle, and
  200 tiny shuffle partitions only add task overhead;
* in local mode, executors run this very interpreter (``PYSPARK_PYTHON`` defaults to
  ``sys.executable``), so they import the same ``percolator`` and ``spark_jobs`` packages.
  On a cluster, install the project on every node (or ship it with ``--py-files``).

pyspark is imported lazily, so the command line works (and says what is missing) when the
optional ``spark`` extra is not installed.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from percolator.errors import ConfigError, PercolatorError
from percolator.store.url import parse_store_url

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_MASTER = "local[*]"
DEFAULT_LOG_LEVEL = "WARN"
_LOG_LEVELS = ("ALL", "DEBUG", "ERROR", "FATAL", "INFO", "OFF", "TRACE", "WARN")


def import_pyspark() -> Any:
    """The ``pyspark`` module, or ConfigError naming the missing extra."""
    try:
        import pyspark
    except ImportError as exc:
        raise ConfigError(
            f"the Spark jobs need pyspark ({exc}); install the project's 'spark' extra: "
            "pip install 'percolator-engine[spark]'"
        ) from None
    return pyspark


def is_local_master(master: str) -> bool:
    """True for ``local``, ``local[N]``, ``local[*]``, ``local[N,F]`` (one machine)."""
    return re.fullmatch(r"local(\[[0-9*]+(,\s*[0-9]+)?\])?", master.strip()) is not None


def parse_conf(pairs: list[str] | None) -> dict[str, str]:
    """``["k=v", ...]`` from the command line as a dict; ConfigError for a malformed pair."""
    conf: dict[str, str] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"Spark configuration {pair!r} must look like KEY=VALUE")
        conf[key.strip()] = value
    return conf


def build_session(
    master: str | None = None,
    conf: Mapping[str, str] | None = None,
    *,
    app_name: str = "percolator",
    log_level: str = DEFAULT_LOG_LEVEL,
) -> SparkSession:
    """Get or create the SparkSession (see the module docstring for the defaults).

    If a session is already active in this process it is returned as it is (Spark allows
    one SparkContext per process); ``conf`` is then applied only where Spark allows runtime
    changes (SQL options)."""
    import_pyspark()
    from pyspark.sql import SparkSession

    if log_level.upper() not in _LOG_LEVELS:
        raise ConfigError(f"Spark log level {log_level!r} is not one of {list(_LOG_LEVELS)}")
    user_conf = dict(conf or {})
    builder = SparkSession.builder.appName(app_name)
    if master is None and "PYSPARK_GATEWAY_PORT" not in os.environ:
        # Not under spark-submit (which sets the gateway port and the master itself).
        master = user_conf.pop("spark.master", DEFAULT_MASTER)
    if master is not None:
        builder = builder.master(master)
    local = master is not None and is_local_master(master)
    # The jobs report their own progress; Spark's console bar would garble it.
    defaults: dict[str, str] = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
    }
    if local:
        defaults["spark.sql.shuffle.partitions"] = str(max(2, os.cpu_count() or 2))
        # Executors must import this project: run them with this interpreter.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    for key, value in {**defaults, **user_conf}.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel(log_level.upper())
    return session


def session_master(spark: SparkSession) -> str:
    """The master URL the session runs on."""
    return str(spark.sparkContext.master)


# --------------------------------------------------------------------------- shared by the jobs


class SparkJobError(PercolatorError):
    """A Spark job failed; the message names the first cause found (an executor's Python
    exception, or Spark's own reason)."""


def check_store_for_spark(store_url: object, master: str) -> str:
    """The store URL, if executors can reach it from ``master``; ConfigError otherwise.

    ``memory:`` lives inside one process and executors are other processes; ``embedded:``
    lives in one directory on one machine, so it needs a local master."""
    if not isinstance(store_url, str):
        raise ConfigError(
            f"the Spark jobs need a store URL string (executors open their own connection), "
            f"got {type(store_url).__name__}"
        )
    parsed = parse_store_url(store_url)
    if parsed.scheme == "memory":
        raise ConfigError(
            f"store {store_url!r}: a memory: store lives inside one process, but Spark "
            "executors run in other processes; use embedded:PATH (local mode) or hbase://"
        )
    if parsed.scheme == "embedded" and not is_local_master(master):
        raise ConfigError(
            f"store {store_url!r}: the embedded store lives in one directory of one machine, "
            f"but master {master!r} may run executors elsewhere; use hbase:// on a cluster "
            "(or a local[...] master)"
        )
    return str(parsed) if parsed.scheme == "embedded" else store_url


_PY_ERROR_LINE = re.compile(r"^([A-Za-z_][\w.]*(Error|Exception|Exit)[\w]*): (.+)$")


def spark_failure_reason(exc: BaseException) -> str:
    """One line saying why a Spark action failed.

    Spark wraps an executor's Python exception in several layers (Py4JJavaError ->
    SparkException -> PythonException with the executor's traceback as text).  The most
    useful line is the last ``SomeError: message`` line of that traceback."""
    text = str(exc)
    found = ""
    for line in text.splitlines():
        match = _PY_ERROR_LINE.match(line.strip())
        if match and not match.group(1).startswith(("py4j.", "org.apache.spark.")):
            found = f"{match.group(1).rsplit('.', 1)[-1]}: {match.group(3)}"
    if found:
        return found
    for line in text.splitlines():
        line = line.strip()
        if line:
            return line[:500]
    return type(exc).__name__

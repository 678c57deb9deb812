"""Fixtures of the Spark job tests.

* ``spark``: ONE SparkSession for the whole test session (the JVM takes tens of seconds to
  start on a busy two-core machine).  Master ``local[2,4]``: two cores, and up to four
  attempts per task, so tests can make a task fail and watch Spark retry it.
* ``store_url``: a fresh store on the backends Spark executors can share (embedded in a
  temporary directory; HBase with a unique table prefix, marked ``hbase``, tables dropped
  afterwards).  ``embedded_url``: the embedded store only.
* every test runs with a 200 ms observed-set refresh interval, so registering observers
  waits 0.2 s instead of 2 s (only the driver's clients register or cache long enough to
  care; executors open fresh clients per task).

HBase comes from the session fixture ``hbase_url`` (tests/conftest.py).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import pytest

from percolator.client import OBSERVED_REFRESH_ENV
from percolator.store import open_store

SPARK_MASTER = "local[2,4]"


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    from percolator.spark_jobs.session import build_session

    session = build_session(
        SPARK_MASTER,
        {
            "spark.sql.shuffle.partitions": "2",
            "spark.default.parallelism": "2",
            "spark.driver.memory": "1g",
            # Keep task retries quick: no waiting between attempts on the same executor.
            "spark.locality.wait": "0s",
        },
        app_name="percolator-tests",
        log_level="ERROR",
    )
    yield session
    session.stop()


@pytest.fixture(autouse=True)
def fast_refresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(OBSERVED_REFRESH_ENV, "200")


def with_prefix(base_url: str, prefix: str) -> str:
    parts = urlsplit(base_url)
    options = dict(parse_qsl(parts.query, keep_blank_values=True))
    options["prefix"] = options.get("prefix", "") + prefix
    return urlunsplit(parts._replace(query=urlencode(options)))


def _namespace(request: pytest.FixtureRequest, backend: str, tmp_path: Path) -> Iterator[str]:
    if backend == "embedded":
        yield f"embedded:{tmp_path / 'store'}"
        return
    base: str = request.getfixturevalue("hbase_url")
    url = with_prefix(base, f"sp{uuid.uuid4().hex[:10]}_")
    try:
        yield url
    finally:
        with open_store(url) as store:
            for table in store.list_tables():
                store.drop_table(table)


@pytest.fixture(
    params=[
        pytest.param("embedded", id="embedded"),
        pytest.param("hbase", id="hbase", marks=pytest.mark.hbase),
    ]
)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from _namespace(request, request.param, tmp_path)


@pytest.fixture
def embedded_url(tmp_path: Path) -> str:
    return f"embedded:{tmp_path / 'store'}"

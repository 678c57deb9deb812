"""Fixtures of the Spark job tests; backends and namespaces come from tests/conftest.py
(Spark executors need a store they can share: ``shared_store_url``, ``embedded_url``).

* ``spark``: ONE SparkSession for the whole test session (the JVM takes tens of seconds to
  start on a busy two-core machine).  Master ``local[2,4]``: two cores, and up to four
  attempts per task, so tests can make a task fail and watch Spark retry it.
* every test runs with a 200 ms observed-set refresh interval (``fast_observed_refresh``), so
  registering observers waits 0.2 s instead of 2 s (only the driver's clients register or
  cache long enough to care; executors open fresh clients per task).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

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
def fast_refresh(fast_observed_refresh: None) -> None:
    """The jobs' tests register observers: do not wait 2 s for each."""

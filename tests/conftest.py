"""Session-wide test fixtures: the real HBase the suite runs against.

``hbase_url`` (session scope, created only when a test asks for it) gives
``hbase://HOST:PORT`` of an HBase that answers through its Thrift-1 gateway:

* ``PERCOLATOR_TEST_HBASE_URL`` set: that server, after checking that it answers (it is
  shared, so tests must use unique table names or a ``?prefix=`` of their own);
* otherwise a :class:`~percolator.testing.localhbase.LocalHBase` started in a temporary directory
  for this session and stopped at its end (about 20-30 s to start on two cores; its logs
  stay under pytest's temporary directory);
* optionally, ``PERCOLATOR_TEST_HBASE=docker`` with ``PERCOLATOR_TEST_HBASE_IMAGE`` naming an
  image that serves Thrift-1 on port 9090: a container through testcontainers, when Docker
  is reachable (else the local launcher, with a notice).  Never required.

A missing ``java`` or ``mvn`` fails the tests that need HBase with the launcher's message:
the suite never skips them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator

import pytest

from percolator.errors import ConfigError
from percolator.store.url import parse_store_url
from percolator.testing.localhbase import HBaseLauncherError, LocalHBase, wait_until_serving

# The session's HBase holds nothing worth keeping: do not wait out HBase's ~20 s standalone
# shutdown (regions are flushed and closed within a second or two of SIGTERM).
_SESSION_STOP_GRACE_S = 10.0
_EXTERNAL_READY_TIMEOUT_S = 30.0


def terminal_progress(config: pytest.Config) -> Callable[[str], None]:
    """A progress reporter that reaches the terminal even while pytest captures output
    (starting HBase takes long enough that a silent wait looks like a hang)."""
    capture = config.pluginmanager.getplugin("capturemanager")
    reporter = config.pluginmanager.getplugin("terminalreporter")

    def report(message: str) -> None:
        line = f"[hbase] {message}"
        if reporter is None:  # e.g. a pytest-xdist worker
            print(line, file=sys.stderr, flush=True)
        elif capture is not None:
            with capture.global_and_fixture_disabled():
                reporter.write_line(line)
        else:
            reporter.write_line(line)

    return report


@pytest.fixture(scope="session")
def hbase_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    progress = terminal_progress(request.config)
    external = os.environ.get("PERCOLATOR_TEST_HBASE_URL", "").strip()
    if external:
        yield _check_external(external, progress)
        return
    if os.environ.get("PERCOLATOR_TEST_HBASE", "").strip().lower() == "docker":
        container = _start_container(progress)
        if container is not None:
            url, stop = container
            try:
                yield url
            finally:
                stop()
            return
    hbase = LocalHBase(tmp_path_factory.mktemp("hbase"), progress=progress)
    try:
        url = hbase.start()
    except HBaseLauncherError as exc:
        pytest.fail(f"cannot start the test session's HBase: {exc}", pytrace=False)
    try:
        yield url
    finally:
        hbase.stop(grace_s=_SESSION_STOP_GRACE_S)


def _check_external(url: str, progress: Callable[[str], None]) -> str:
    try:
        parsed = parse_store_url(url)
    except ConfigError as exc:
        pytest.fail(f"PERCOLATOR_TEST_HBASE_URL is not a store URL: {exc}", pytrace=False)
    if parsed.scheme != "hbase":
        pytest.fail(
            f"PERCOLATOR_TEST_HBASE_URL={url!r} must be an hbase://HOST:PORT URL", pytrace=False
        )
    try:
        wait_until_serving(parsed.host, parsed.port, _EXTERNAL_READY_TIMEOUT_S, progress)
    except HBaseLauncherError as exc:
        pytest.fail(
            f"PERCOLATOR_TEST_HBASE_URL={url!r} does not answer: {exc}. Start one with "
            "`percolator hbase start`, or unset the variable to let the tests start their own.",
            pytrace=False,
        )
    return url


def _start_container(
    progress: Callable[[str], None],
) -> tuple[str, Callable[[], None]] | None:
    """Optional: HBase in Docker through testcontainers.  None when Docker is unreachable."""
    image = os.environ.get("PERCOLATOR_TEST_HBASE_IMAGE", "").strip()
    if not image:
        pytest.fail(
            "PERCOLATOR_TEST_HBASE=docker needs PERCOLATOR_TEST_HBASE_IMAGE: an image that "
            "serves HBase's Thrift-1 gateway on port 9090",
            pytrace=False,
        )
    try:
        from testcontainers.core.container import DockerContainer

        import docker  # type: ignore[import-untyped]  # comes with testcontainers

        docker.from_env().ping()
    except Exception as exc:  # no package, no daemon, no permission: all mean "no Docker"
        progress(
            f"PERCOLATOR_TEST_HBASE=docker but Docker is not reachable ({exc}); "
            "starting a local HBase instead"
        )
        return None
    container = DockerContainer(image).with_exposed_ports(9090)
    container.start()
    try:
        host = container.get_container_host_ip()
        port = int(container.get_exposed_port(9090))
        wait_until_serving(host, port, 300.0, progress)
    except HBaseLauncherError as exc:
        container.stop()
        pytest.fail(f"HBase in the container of {image!r} does not answer: {exc}", pytrace=False)
    except BaseException:
        container.stop()
        raise
    return f"hbase://{host}:{port}", container.stop

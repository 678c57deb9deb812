"""The metrics mechanism: counters at zero from the start, process metrics, gauges read at
scrape time, and the HTTP endpoint with its health path."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from percolator.errors import InvalidArgumentError
from percolator.metrics import Labels, MetricsServer, Registry, parse_text


def get(server: MetricsServer, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.fixture
def registry() -> Registry:
    return Registry()


@pytest.fixture
def serve(registry: Registry) -> Iterator[list[MetricsServer]]:
    servers: list[MetricsServer] = []
    yield servers
    for server in servers:
        server.close()


def test_counters_and_histograms_start_at_zero_before_their_first_event(
    registry: Registry,
) -> None:
    registry.counter("t_plain_total", "unlabelled")
    runs = registry.counter("t_runs_total", "labelled", ("observer",))
    latency = registry.histogram("t_latency_seconds", "labelled", [0.1, 1.0], ("observer",))
    registry.declare(observer=["a", "b"])
    values = parse_text(registry.render())
    assert values["t_plain_total"] == 0
    assert values['t_runs_total{observer="a"}'] == 0 == values['t_runs_total{observer="b"}']
    assert values['t_latency_seconds_count{observer="a"}'] == 0
    assert values['t_latency_seconds_bucket{observer="b",le="+Inf"}'] == 0

    runs.inc(observer="a")
    runs.inc(2, observer="a")
    latency.observe(0.5, observer="b")
    values = parse_text(registry.render())
    assert values['t_runs_total{observer="a"}'] == 3 == runs.value(observer="a")
    assert values['t_runs_total{observer="b"}'] == 0 == runs.value(observer="b")
    assert values['t_latency_seconds_bucket{observer="b",le="0.1"}'] == 0
    assert values['t_latency_seconds_bucket{observer="b",le="1.0"}'] == 1
    assert latency.count(observer="b") == 1 and latency.count(observer="a") == 0


def test_labels_other_than_the_declared_ones_are_refused(registry: Registry) -> None:
    runs = registry.counter("t_runs_total", "labelled", ("observer",))
    plain = registry.counter("t_plain_total", "unlabelled")
    with pytest.raises(InvalidArgumentError, match="t_runs_total has labels"):
        runs.inc(table="x")
    with pytest.raises(InvalidArgumentError, match="t_plain_total has labels"):
        plain.inc(observer="x")


def test_gauges_are_read_at_scrape_time_plain_or_labelled(registry: Registry) -> None:
    level = [1.0]
    per_observer: dict[Labels, float] = {(("observer", "a"),): 4.0}
    registry.gauge("t_level", "plain", lambda: level[0])
    registry.gauge("t_backlog", "labelled", lambda: per_observer)
    level[0] = 7
    per_observer[(("observer", "b"),)] = 5
    values = parse_text(registry.render())
    assert values["t_level"] == 7
    assert values['t_backlog{observer="a"}'] == 4 and values['t_backlog{observer="b"}'] == 5


def test_each_registry_has_the_process_metrics_and_its_own_series() -> None:
    first, second = Registry(), Registry()
    first.counter("t_same_total", "one").inc()
    second.counter("t_same_total", "two")  # no clash: registries are per process role
    values = parse_text(first.render())
    assert values["t_same_total"] == 1 and parse_text(second.render())["t_same_total"] == 0
    assert values["process_cpu_seconds_total"] >= 0
    assert values["process_resident_memory_bytes"] > 0
    assert any(key.startswith("python_info{") for key in values)
    assert any(key.startswith("python_gc_collections_total{") for key in values)


def test_the_endpoint_serves_metrics_at_zero_and_process_metrics(
    registry: Registry, serve: list[MetricsServer]
) -> None:
    registry.counter("t_events_total", "events", ("kind",)).declare(kind="x")
    serve.append(server := MetricsServer(registry))
    status, text = get(server, "/metrics")
    assert status == 200
    values = parse_text(text)
    assert values['t_events_total{kind="x"}'] == 0
    assert "process_cpu_seconds_total" in values
    assert get(server, "/other")[0] == 404


def test_healthz_answers_200_while_healthy_and_503_with_the_reason(
    registry: Registry, serve: list[MetricsServer]
) -> None:
    serve.append(always := MetricsServer(registry))
    assert get(always, "/healthz") == (200, "ok\n")

    problem: list[str | None] = [None]
    serve.append(checked := MetricsServer(registry, health=lambda: problem[0]))
    assert get(checked, "/healthz") == (200, "ok\n")
    problem[0] = "the lease driver stopped"
    assert get(checked, "/healthz") == (503, "unhealthy: the lease driver stopped\n")

    def broken() -> str | None:
        raise RuntimeError("cannot tell")

    serve.append(failing := MetricsServer(registry, health=broken))
    status, text = get(failing, "/healthz")
    assert status == 503 and "RuntimeError: cannot tell" in text


def test_a_failing_gauge_fails_the_scrape_not_the_endpoint(
    registry: Registry, serve: list[MetricsServer]
) -> None:
    def broken() -> float:
        raise RuntimeError("store down")

    registry.gauge("t_broken", "fails", broken)
    serve.append(server := MetricsServer(registry))
    status, text = get(server, "/metrics")
    assert status == 500 and "store down" in text
    assert get(server, "/healthz")[0] == 200

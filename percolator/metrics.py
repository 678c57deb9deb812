"""The one metrics mechanism of every process (workers, oracle servers): Prometheus metrics
through ``prometheus_client``, and an HTTP endpoint that serves them with a health path.

* :class:`Registry`: one per process role, never ``prometheus_client``'s global default, so
  two of them in one process (tests, an embedding application) never mix.  Each includes the
  process metrics: ``process_*`` (CPU seconds, resident memory, open files, start time; on
  Linux), ``python_info`` and ``python_gc_*``.
* Counters and histograms **start at zero**: an unlabelled one is exposed from its creation
  on; a labelled one for every label value declared with :meth:`Registry.declare` (or the
  metric's own ``declare``) before its first increment, so a dashboard's ``rate()`` sees the
  series from the start instead of from the first event.
* Gauges are read from a callback at scrape time: a number, or ``{labels: value}``.
* :class:`MetricsServer`: ``GET /metrics`` (the text exposition format 0.0.4) and
  ``GET /healthz`` (200 ``ok`` while the process's health check passes, 503 with the reason
  when it does not) from a daemon thread.

Metric names are fixed by the code that defines them (``percolator.oracle.metrics``,
``percolator.observers.metrics``) and documented in docs/.  Everything here is thread-safe.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Generic, TypeVar
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import prometheus_client
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

from percolator.errors import ConfigError, InvalidArgumentError
from percolator.hostnames import encodable_host

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIEnvironment

#: The one format served.  Only this one: the documented names give the gauge
#: ``percolator_observer_parked`` beside the counter ``percolator_observer_parked_total``,
#: two metrics in this format but one family name in OpenMetrics.
TEXT_FORMAT = "text/plain; version=0.0.4; charset=utf-8"

#: The labels of one series, as sorted ``(name, value)`` pairs.
Labels = tuple[tuple[str, str], ...]

#: A health check: ``None`` while healthy, else a short reason (served with status 503).
HealthCheck = Callable[[], "str | None"]

#: What a gauge callback returns: one number, or one number per label set.
GaugeValue = float | Mapping[Labels, float]


_Metric = TypeVar("_Metric", prometheus_client.Counter, prometheus_client.Histogram)


class _Series(Generic[_Metric]):
    """What counters and histograms share: label handling on a ``prometheus_client`` metric."""

    def __init__(self, metric: _Metric, name: str, labels: Sequence[str]) -> None:
        self.name = name
        self.labels = tuple(labels)
        self._metric: _Metric = metric

    def _check(self, labels: Mapping[str, str]) -> None:
        if sorted(labels) != sorted(self.labels):
            raise InvalidArgumentError(
                f"metric {self.name} has labels {list(self.labels)}, got {sorted(labels)}"
            )

    def _child(self, labels: Mapping[str, str]) -> _Metric:
        self._check(labels)
        if not self.labels:
            return self._metric
        child: _Metric = self._metric.labels(**labels)
        return child

    def declare(self, **labels: str) -> None:
        """Expose the series of these label values at zero before its first event."""
        self._child(labels)

    def _sample(self, suffix: str, labels: Mapping[str, str]) -> float:
        self._check(labels)
        for family in self._metric.collect():
            for sample in family.samples:
                if sample.name.endswith(suffix) and sample.labels == labels:
                    return float(sample.value)
        return 0.0


class Counter(_Series[prometheus_client.Counter]):
    """A monotonically increasing count (exposed as ``NAME_total``)."""

    def inc(self, amount: float = 1, **labels: str) -> None:
        self._child(labels).inc(amount)

    def value(self, **labels: str) -> float:
        """The current count of one series (for tests and tools)."""
        return self._sample("_total", labels)


class Histogram(_Series[prometheus_client.Histogram]):
    """Observations counted into cumulative buckets, with their sum and count."""

    def observe(self, value: float, **labels: str) -> None:
        self._child(labels).observe(value)

    def count(self, **labels: str) -> int:
        """How many observations one series has had (for tests and tools)."""
        return int(self._sample("_count", labels))


class _CallbackGauge:
    """A gauge read from ``read()`` at scrape time (a ``prometheus_client`` collector).

    It has no ``describe()``: registering must not call the callback (it may be costly),
    and prometheus_client's name check would take the gauge ``X`` for the counter
    ``X_total``'s family (see :data:`TEXT_FORMAT`)."""

    def __init__(self, name: str, help_text: str, read: Callable[[], GaugeValue]) -> None:
        self.name = name
        self.help = help_text
        self._read = read

    def collect(self) -> Iterator[Metric]:
        value = self._read()
        if not isinstance(value, Mapping):
            yield GaugeMetricFamily(self.name, self.help, value=float(value))
            return
        names = [name for name, _ in next(iter(value), ())]
        family = GaugeMetricFamily(self.name, self.help, labels=names)
        for labels, number in sorted(value.items()):
            by_name = dict(labels)
            family.add_metric([by_name[name] for name in names], float(number))
        yield family


class Registry:
    """The metrics of one process role, with the process metrics.  See the module docstring."""

    def __init__(self) -> None:
        self.collector_registry = prometheus_client.CollectorRegistry()
        prometheus_client.ProcessCollector(registry=self.collector_registry)
        prometheus_client.PlatformCollector(registry=self.collector_registry)
        prometheus_client.GCCollector(registry=self.collector_registry)
        self._series: list[Counter | Histogram] = []

    def counter(self, name: str, help_text: str, labels: Sequence[str] = ()) -> Counter:
        """A counter; ``name`` ends in ``_total`` as Prometheus names counters."""
        metric = prometheus_client.Counter(
            name, help_text, labels, registry=self.collector_registry
        )
        self._series.append(counter := Counter(metric, name, labels))
        return counter

    def histogram(
        self, name: str, help_text: str, buckets: Sequence[float], labels: Sequence[str] = ()
    ) -> Histogram:
        metric = prometheus_client.Histogram(
            name, help_text, labels, registry=self.collector_registry, buckets=buckets
        )
        self._series.append(histogram := Histogram(metric, name, labels))
        return histogram

    def gauge(self, name: str, help_text: str, read: Callable[[], GaugeValue]) -> None:
        """A gauge whose value ``read()`` returns at scrape time; a callback that raises
        fails that scrape (500), not the process."""
        self.collector_registry.register(_CallbackGauge(name, help_text, read))

    def declare(self, **values: Iterable[str]) -> None:
        """Start at zero every series of the labelled counters and histograms whose label
        names are all given: ``declare(observer=["a", "b"])`` exposes ``{observer="a"}``
        and ``{observer="b"}`` of each metric labelled by ``observer`` alone."""
        choices = {name: list(options) for name, options in values.items()}
        for series in self._series:
            if not series.labels or not set(series.labels) <= set(choices):
                continue
            for combination in itertools.product(*(choices[n] for n in series.labels)):
                series.declare(**dict(zip(series.labels, combination, strict=True)))

    def render(self) -> str:
        """The text exposition of every metric (what ``GET /metrics`` serves)."""
        return prometheus_client.generate_latest(self.collector_registry).decode()


class _ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass  # one log line per scrape is noise


def _reply(start_response: StartResponse, status: str, text: str) -> list[bytes]:
    body = (text + "\n").encode()
    start_response(
        status, [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body)))]
    )
    return [body]


def _problem(health: HealthCheck) -> str | None:
    try:
        return health()
    except Exception as exc:  # a check that fails says the process is not healthy
        return f"health check failed: {type(exc).__name__}: {exc}"


class MetricsServer:
    """Serves ``registry`` at ``http://HOST:PORT/metrics`` and the health of the process at
    ``/healthz``, from a daemon thread.  ``port=0`` picks a free port (see :attr:`port`).

    ``health``: the process's health check (see :data:`HealthCheck`); without one the
    process is healthy while it serves.  A host that is not ASCII or IDNA, a port in use or
    an unknown host raises :class:`ConfigError` naming it."""

    def __init__(
        self,
        registry: Registry,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        health: HealthCheck | None = None,
    ) -> None:
        if not encodable_host(host):
            raise ConfigError(
                f"metrics host {host!r} is not a host name or address (not ASCII or IDNA)"
            )
        check: HealthCheck = health if health is not None else (lambda: None)

        def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
            path = environ.get("PATH_INFO", "")
            if path == "/metrics":
                try:
                    body = registry.render().encode()
                except Exception as exc:  # a failing gauge must not kill the endpoint
                    return _reply(
                        start_response,
                        "500 Internal Server Error",
                        f"rendering metrics failed: {exc}",
                    )
                start_response(
                    "200 OK", [("Content-Type", TEXT_FORMAT), ("Content-Length", str(len(body)))]
                )
                return [body]
            if path == "/healthz":
                problem = _problem(check)
                if problem is None:
                    return _reply(start_response, "200 OK", "ok")
                return _reply(start_response, "503 Service Unavailable", f"unhealthy: {problem}")
            return _reply(
                start_response, "404 Not Found", "only /metrics and /healthz are served here"
            )

        try:
            self._server = make_server(
                host, port, app, server_class=_ThreadingWSGIServer, handler_class=_QuietHandler
            )
        except OSError as exc:  # port in use, unknown host (socket.gaierror), no permission
            reason = exc.strerror or str(exc) or type(exc).__name__
            raise ConfigError(f"cannot serve metrics on {host}:{port}: {reason}") from None
        self.port = int(self._server.server_port)
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="metrics-http", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def parse_text(text: str) -> dict[str, float]:
    """Parse exposition text into ``{"name{labels}": value}`` (for tests and tools).  Keys
    are canonical: labels sorted by name, except a bucket's ``le``, which comes last."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            ordered = sorted(sample.labels.items(), key=lambda item: (item[0] == "le", item[0]))
            labels = ",".join(f'{name}="{_escape(value)}"' for name, value in ordered)
            values[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return values


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')

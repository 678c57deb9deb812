"""Worker metrics in the Prometheus text exposition format (0.0.4), served over the
standard library's HTTP server at ``GET /metrics``.

Metrics carry labels (``observer="..."``), which is why this is not oracle/metrics.py (its
gauges and histograms are unlabelled).  All classes are thread-safe.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

Labels = tuple[tuple[str, str], ...]

# Commit-to-run latency buckets, in seconds.
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: Labels) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels) + "}"


def _number(value: float) -> str:
    if value == float("inf"):
        return "+Inf"
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _key(labels: dict[str, str]) -> Labels:
    return tuple(sorted(labels.items()))


class Counter:
    def __init__(self, name: str, help_text: str) -> None:
        self.name, self.help = name, help_text
        self._lock = threading.Lock()
        self._values: dict[Labels, float] = {}

    def inc(self, amount: float = 1, **labels: str) -> None:
        key = _key(labels)
        with self._lock:
            self._values[key] = self._values.get(key, 0) + amount

    def value(self, **labels: str) -> float:
        with self._lock:
            return self._values.get(_key(labels), 0)

    def render(self) -> list[str]:
        with self._lock:
            items = sorted(self._values.items())
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} counter"]
        return lines + [f"{self.name}{_labels(k)} {_number(v)}" for k, v in items]


class Gauge:
    """A labelled gauge read from a callback at scrape time: ``read()`` returns
    ``{labels: value}``."""

    def __init__(self, name: str, help_text: str, read: Callable[[], dict[Labels, float]]) -> None:
        self.name, self.help = name, help_text
        self._read = read

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} gauge"]
        for labels, value in sorted(self._read().items()):
            lines.append(f"{self.name}{_labels(labels)} {_number(value)}")
        return lines


class Histogram:
    def __init__(self, name: str, help_text: str, buckets: Sequence[float]) -> None:
        self.name, self.help = name, help_text
        self._bounds = sorted(buckets)
        self._lock = threading.Lock()
        # labels -> (counts per bucket (last: above every bound), sum, count)
        self._series: dict[Labels, tuple[list[int], float, int]] = {}

    def observe(self, value: float, **labels: str) -> None:
        key = _key(labels)
        index = bisect.bisect_left(self._bounds, value)
        with self._lock:
            counts, total, count = self._series.get(key, ([0] * (len(self._bounds) + 1), 0, 0))
            counts[index] += 1
            self._series[key] = (counts, total + value, count + 1)

    def count(self, **labels: str) -> int:
        with self._lock:
            return self._series.get(_key(labels), ([], 0.0, 0))[2]

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        with self._lock:
            series = sorted((k, (list(c), s, n)) for k, (c, s, n) in self._series.items())
        for labels, (counts, total, count) in series:
            cumulative = 0
            for bound, n in zip([*self._bounds, float("inf")], counts, strict=True):
                cumulative += n
                bucket = (*labels, ("le", _number(bound)))
                lines.append(f"{self.name}_bucket{_labels(bucket)} {cumulative}")
            lines.append(f"{self.name}_sum{_labels(labels)} {_number(total)}")
            lines.append(f"{self.name}_count{_labels(labels)} {count}")
        return lines


class Registry:
    def __init__(self) -> None:
        self._metrics: list[Counter | Gauge | Histogram] = []

    def counter(self, name: str, help_text: str) -> Counter:
        self._metrics.append(metric := Counter(name, help_text))
        return metric

    def gauge(self, name: str, help_text: str, read: Callable[[], dict[Labels, float]]) -> Gauge:
        self._metrics.append(metric := Gauge(name, help_text, read))
        return metric

    def histogram(self, name: str, help_text: str, buckets: Sequence[float]) -> Histogram:
        self._metrics.append(metric := Histogram(name, help_text, buckets))
        return metric

    def render(self) -> str:
        lines: list[str] = []
        for metric in self._metrics:
            lines += metric.render()
        return "\n".join(lines) + "\n"


class MetricsServer:
    """Serves ``registry.render()`` at ``http://HOST:PORT/metrics`` from a daemon thread.
    ``port=0`` picks a free port (see :attr:`port`)."""

    def __init__(self, registry: Registry, host: str = "127.0.0.1", port: int = 0) -> None:
        render = registry.render

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404, "only /metrics is served here")
                    return
                try:
                    body = render().encode()
                except Exception as exc:  # a failing gauge must not kill the endpoint
                    self.send_error(500, f"rendering metrics failed: {exc}")
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass  # one log line per scrape is noise

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="observer-metrics", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def parse_text(text: str) -> dict[str, float]:
    """Parse exposition text into ``{"name{labels}": value}`` (for tests and tools)."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, raw = line.rpartition(" ")
            values[key] = float(raw)
    return values

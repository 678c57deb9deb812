"""Minimal Prometheus metrics: counters, callback gauges, histograms, and a tiny HTTP
endpoint (``GET /metrics``, text exposition format 0.0.4) on the standard library.

Thread-safe.  Label values are rendered escaped; names are fixed by the code.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

Labels = tuple[tuple[str, str], ...]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _fmt_labels(labels: Labels, extra: tuple[str, str] | None = None) -> str:
    items = list(labels) + ([extra] if extra else [])
    if not items:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in items) + "}"


def _fmt_value(value: float) -> str:
    if value == float("inf"):
        return "+Inf"
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


class Counter:
    def __init__(self, name: str, help_text: str) -> None:
        self.name = name
        self.help = help_text
        self._lock = threading.Lock()
        self._values: dict[Labels, float] = {}

    def inc(self, amount: float = 1, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        with self._lock:
            self._values[key] = self._values.get(key, 0) + amount

    def value(self, **labels: str) -> float:
        with self._lock:
            return self._values.get(tuple(sorted(labels.items())), 0)

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} counter"]
        with self._lock:
            items = sorted(self._values.items()) or [((), 0.0)]
        lines += [f"{self.name}{_fmt_labels(k)} {_fmt_value(v)}" for k, v in items]
        return lines


class Gauge:
    """A gauge whose value is read from a callback at scrape time."""

    def __init__(self, name: str, help_text: str, read: Callable[[], float]) -> None:
        self.name = name
        self.help = help_text
        self._read = read

    def render(self) -> list[str]:
        return [
            f"# HELP {self.name} {self.help}",
            f"# TYPE {self.name} gauge",
            f"{self.name} {_fmt_value(self._read())}",
        ]


class Histogram:
    def __init__(self, name: str, help_text: str, buckets: Sequence[float]) -> None:
        self.name = name
        self.help = help_text
        self._bounds = sorted(buckets)
        self._lock = threading.Lock()
        self._counts = [0] * (len(self._bounds) + 1)  # last: above every bound
        self._sum = 0.0
        self._count = 0

    def observe(self, value: float) -> None:
        index = bisect.bisect_left(self._bounds, value)
        with self._lock:
            self._counts[index] += 1
            self._sum += value
            self._count += 1

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        with self._lock:
            counts, total, count = list(self._counts), self._sum, self._count
        cumulative = 0
        for bound, n in zip([*self._bounds, float("inf")], counts, strict=True):
            cumulative += n
            le = ("le", _fmt_value(bound))
            lines.append(f"{self.name}_bucket{_fmt_labels((), le)} {cumulative}")
        lines.append(f"{self.name}_sum {_fmt_value(total)}")
        lines.append(f"{self.name}_count {count}")
        return lines


class Registry:
    def __init__(self) -> None:
        self._metrics: list[Counter | Gauge | Histogram] = []

    def counter(self, name: str, help_text: str) -> Counter:
        metric = Counter(name, help_text)
        self._metrics.append(metric)
        return metric

    def gauge(self, name: str, help_text: str, read: Callable[[], float]) -> Gauge:
        metric = Gauge(name, help_text, read)
        self._metrics.append(metric)
        return metric

    def histogram(self, name: str, help_text: str, buckets: Sequence[float]) -> Histogram:
        metric = Histogram(name, help_text, buckets)
        self._metrics.append(metric)
        return metric

    def render(self) -> str:
        lines: list[str] = []
        for metric in self._metrics:
            lines += metric.render()
        return "\n".join(lines) + "\n"


class MetricsServer:
    """Serves ``registry.render()`` at ``http://HOST:PORT/metrics`` from a daemon thread."""

    def __init__(self, registry: Registry, host: str, port: int) -> None:
        render = registry.render

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404, "only /metrics is served here")
                    return
                body = render().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass  # scrapes are not worth a log line each

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="oracle-metrics", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def parse_text(text: str) -> dict[str, float]:
    """Parse exposition text into ``{"name{labels}": value}`` (for tests and tools)."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, raw = line.rpartition(" ")
        values[key] = float(raw)
    return values

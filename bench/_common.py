"""Helpers shared by the benchmarks: timed runs over threads, percentiles, medians over
repeats, tables (plain text and markdown), an oracle wrapper that counts timestamps and the
wait for them, a client built on it, and a probe of what a piece of work costs.

A benchmark measures one operation with :func:`run_timed` (per-call latencies plus the
wall-clock rate), repeats that a few times, and reports the **median** of the repeats with
their spread (:func:`summarize`), because single runs on a shared two-core machine are noisy.
The operations themselves are written once, in :mod:`bench.workloads`.

Every timed run also records where the CPU went (:class:`CpuUse`): this process, the
processes named with :func:`watch_processes` (the HBase JVMs, the oracle server), and the
rest of the machine.  On two cores shared by client and servers, a rate is often bounded by
CPU rather than by waiting, and only this split says which side to make cheaper.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

import percolator
from percolator.store import Store, open_store
from percolator.timestamps import TimestampOracle


def percentile(values: Sequence[float], p: float) -> float:
    """The ``p``-th percentile (0..100) with linear interpolation between closest ranks
    (numpy's default).  ``values`` need not be sorted; NaN for no values."""
    if not 0 <= p <= 100:
        raise ValueError(f"percentile must be in [0, 100], got {p}")
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


#: the processes whose CPU time every :class:`CpuMeter` also reads, by name
_watched: dict[str, int] = {}


def watch_processes(named: Mapping[str, int]) -> None:
    """From now on, account the CPU time of these processes (name -> pid) in every
    measurement of this process (``--cpu-of NAME=PID`` of the benchmarks that take it)."""
    _watched.clear()
    _watched.update(named)


def parse_cpu_of(values: Sequence[str]) -> dict[str, int]:
    """``["hbase=123", "oracle=456"]`` -> ``{"hbase": 123, "oracle": 456}``; a malformed
    item raises ValueError naming it."""
    named: dict[str, int] = {}
    for value in values:
        name, sep, pid = value.partition("=")
        if not sep or not name or not pid.isdigit():
            raise ValueError(f"--cpu-of wants NAME=PID, got {value!r}")
        named[name] = int(pid)
    return named


def add_cpu_of_argument(parser: argparse.ArgumentParser) -> None:
    """The repeatable ``--cpu-of NAME=PID`` option of the benchmarks that account the CPU of
    server processes; :func:`watch_cpu_of` applies it."""
    parser.add_argument(
        "--cpu-of",
        action="append",
        default=[],
        metavar="NAME=PID",
        help="also account the CPU time of this server process (repeatable: the HBase JVMs, "
        "the oracle server)",
    )


def watch_cpu_of(parser: argparse.ArgumentParser, values: Sequence[str]) -> None:
    """:func:`watch_processes` for the parsed ``--cpu-of`` values; a malformed one is a usage
    error of ``parser`` (exit 2, naming it)."""
    try:
        watch_processes(parse_cpu_of(values))
    except ValueError as exc:
        parser.error(str(exc))


_TICK_S = 1 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01


def machine_cpu_s() -> float | None:
    """CPU seconds every core of the machine spent busy since boot (``/proc/stat``: all but
    idle and iowait), or None where that file does not exist."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = f.readline().split()
    except OSError:
        return None
    # cpu user nice system idle iowait irq softirq steal [guest guest_nice: already in user]
    ticks = [int(x) for x in fields[1:9]]
    return (sum(ticks) - ticks[3] - ticks[4]) * _TICK_S


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` (all its threads), or None if it is gone
    or unreadable."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            after_name = f.read().rpartition(")")[2].split()
    except OSError:
        return None
    return (int(after_name[11]) + int(after_name[12])) * _TICK_S


@dataclass(frozen=True)
class CpuUse:
    """CPU seconds spent during one measurement of ``wall_s`` seconds: by this process (all
    its threads), by each watched process, and by the whole machine (every process on every
    core; None where the machine's figure is unavailable)."""

    wall_s: float
    process_s: float
    machine_s: float | None
    cores: int
    named_s: Mapping[str, float] = field(default_factory=dict)

    @property
    def busy(self) -> float | None:
        """The share of the machine's cores that were busy (1.0: every core, all the time)."""
        if self.machine_s is None or self.wall_s <= 0:
            return None
        return self.machine_s / (self.wall_s * self.cores)

    def per_item_ms(self, items: int) -> dict[str, float]:
        """Milliseconds of CPU per item: ``client`` (this process), each watched process,
        ``rest`` (everything else on the machine: other processes, the kernel's own work)
        and ``machine`` (the total), plus ``busy`` (see :attr:`busy`)."""
        if items <= 0:
            return {}
        out = {"client": self.process_s * 1000 / items}
        out.update({name: s * 1000 / items for name, s in self.named_s.items()})
        if self.machine_s is not None:
            rest = self.machine_s - self.process_s - sum(self.named_s.values())
            out["rest"] = max(rest, 0.0) * 1000 / items
            out["machine"] = self.machine_s * 1000 / items
        busy = self.busy
        if busy is not None:
            out["busy"] = busy
        return out


class CpuMeter:
    """Reads the CPU clocks when made; :meth:`stop` returns what was spent since."""

    def __init__(self) -> None:
        self._named = dict(_watched)
        self._named_start = {name: process_cpu_s(pid) for name, pid in self._named.items()}
        self._machine_start = machine_cpu_s()
        self._process_start = time.process_time()
        self._wall_start = time.perf_counter()

    def stop(self) -> CpuUse:
        wall = time.perf_counter() - self._wall_start
        process = time.process_time() - self._process_start
        machine_end = machine_cpu_s()
        named: dict[str, float] = {}
        for name, pid in self._named.items():
            start, end = self._named_start[name], process_cpu_s(pid)
            if start is not None and end is not None:
                named[name] = end - start
        machine = (
            None
            if self._machine_start is None or machine_end is None
            else machine_end - self._machine_start
        )
        return CpuUse(wall, process, machine, os.cpu_count() or 1, named)


@dataclass(frozen=True)
class Timing:
    """One timed run: ``ops`` calls in ``seconds`` of wall-clock time, over all threads.

    ``items_per_op`` says how many items (cells, rows, ...) one call handles, so a batched
    operation can report both calls/s and items/s.
    """

    ops: int
    seconds: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    max_ms: float
    threads: int = 1
    items_per_op: int = 1
    #: where the CPU went during the run (None: not measured)
    cpu: CpuUse | None = None

    @property
    def rate(self) -> float:
        """Calls per second."""
        return self.ops / self.seconds if self.seconds > 0 else math.inf

    @property
    def item_rate(self) -> float:
        """Items per second (calls per second times ``items_per_op``)."""
        return self.rate * self.items_per_op

    @staticmethod
    def from_latencies(
        latencies_s: Sequence[float],
        seconds: float,
        *,
        threads: int = 1,
        items_per_op: int = 1,
        cpu: CpuUse | None = None,
    ) -> Timing:
        ms = [x * 1000 for x in latencies_s]
        return Timing(
            ops=len(ms),
            seconds=seconds,
            p50_ms=percentile(ms, 50),
            p95_ms=percentile(ms, 95),
            p99_ms=percentile(ms, 99),
            max_ms=max(ms) if ms else math.nan,
            threads=threads,
            items_per_op=items_per_op,
            cpu=cpu,
        )

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {
            "ops": self.ops,
            "seconds": self.seconds,
            "rate": self.rate,
            "item_rate": self.item_rate,
            "items_per_op": self.items_per_op,
            "threads": self.threads,
            "p50_ms": self.p50_ms,
            "p95_ms": self.p95_ms,
            "p99_ms": self.p99_ms,
            "max_ms": self.max_ms,
        }
        if self.cpu is not None:
            out["cpu_ms_per_item"] = self.cpu_per_item()
        return out

    def cpu_per_item(self) -> dict[str, float]:
        """CPU milliseconds per item (see :meth:`CpuUse.per_item_ms`); {} if not measured."""
        return {} if self.cpu is None else self.cpu.per_item_ms(self.ops * self.items_per_op)


def run_timed(
    op: Callable[[int], object], count: int, *, threads: int = 1, items_per_op: int = 1
) -> Timing:
    """Call ``op(i)`` for every ``i`` in ``range(count)``, spread over ``threads`` threads
    (thread ``t`` takes ``i = t, t + threads, ...``), timing each call and the whole run.

    All threads start together (a barrier), and the wall-clock time runs from that start to
    the end of the last thread.  The first exception raised by ``op`` in any thread is
    re-raised here after every thread stopped, so a broken benchmark never reports numbers.
    """
    if count < 0 or threads < 1:
        raise ValueError(f"need count >= 0 and threads >= 1, got {count}, {threads}")
    threads = min(threads, max(count, 1))
    latencies: list[list[float]] = [[] for _ in range(threads)]
    errors: list[BaseException] = []
    clocks: list[tuple[float, CpuMeter]] = []

    def start_clocks() -> None:
        # Run by the last thread to reach the barrier, before any is let go: started later
        # (by the caller's thread once it has the GIL back), the clocks would miss the
        # first milliseconds of work.
        clocks.append((time.perf_counter(), CpuMeter()))

    barrier = threading.Barrier(threads + 1, action=start_clocks)
    stop = threading.Event()

    def worker(t: int) -> None:
        barrier.wait()
        out = latencies[t]
        clock = time.perf_counter
        for i in range(t, count, threads):
            if stop.is_set():
                return
            started = clock()
            try:
                op(i)
            except BaseException as exc:  # re-raised by the caller's thread
                errors.append(exc)
                stop.set()
                return
            out.append(clock() - started)

    workers = [threading.Thread(target=worker, args=(t,), daemon=True) for t in range(threads)]
    for w in workers:
        w.start()
    barrier.wait()
    for w in workers:
        w.join()
    started, meter = clocks[0]
    seconds = time.perf_counter() - started
    cpu = meter.stop()
    if errors:
        raise errors[0]
    return Timing.from_latencies(
        [x for per_thread in latencies for x in per_thread],
        seconds,
        threads=threads,
        items_per_op=items_per_op,
        cpu=cpu,
    )


def median_per_key(dicts: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """For each key that every dict has, the median of its values (in the first dict's key
    order): the repeats of :meth:`Timing.cpu_per_item` reduced to one figure each."""
    if not dicts:
        return {}
    return {
        key: statistics.median(d[key] for d in dicts)
        for key in dicts[0]
        if all(key in d for d in dicts)
    }


@dataclass(frozen=True)
class Spread:
    """The median of repeated measurements and their range."""

    median: float
    low: float
    high: float
    count: int

    @property
    def relative(self) -> float:
        """``(high - low) / median``: 0.1 means the repeats spread over 10 % of the median."""
        return (self.high - self.low) / self.median if self.median else math.nan

    def as_dict(self) -> dict[str, float | int]:
        return {"median": self.median, "low": self.low, "high": self.high, "count": self.count}


def spread(values: Sequence[float]) -> Spread:
    """Median, minimum and maximum of repeated measurements."""
    if not values:
        raise ValueError("spread of no values")
    return Spread(statistics.median(values), min(values), max(values), len(values))


@dataclass(frozen=True)
class Summary:
    """Repeated :class:`Timing` runs of one operation, reduced to medians.

    ``rate`` and ``item_rate`` carry the spread over repeats; the latency percentiles are
    the medians of each repeat's percentile.
    """

    rate: Spread
    item_rate: Spread
    p50_ms: float
    p95_ms: float
    p99_ms: float
    ops_per_repeat: int
    items_per_op: int
    threads: int

    def as_dict(self) -> dict[str, object]:
        return {
            "rate": self.rate.as_dict(),
            "item_rate": self.item_rate.as_dict(),
            "p50_ms": self.p50_ms,
            "p95_ms": self.p95_ms,
            "p99_ms": self.p99_ms,
            "ops_per_repeat": self.ops_per_repeat,
            "items_per_op": self.items_per_op,
            "threads": self.threads,
        }


def summarize(runs: Sequence[Timing]) -> Summary:
    """Reduce repeats of one operation to medians (and the spread of the rates)."""
    if not runs:
        raise ValueError("summarize needs at least one run")
    return Summary(
        rate=spread([r.rate for r in runs]),
        item_rate=spread([r.item_rate for r in runs]),
        p50_ms=statistics.median(r.p50_ms for r in runs),
        p95_ms=statistics.median(r.p95_ms for r in runs),
        p99_ms=statistics.median(r.p99_ms for r in runs),
        ops_per_repeat=runs[0].ops,
        items_per_op=runs[0].items_per_op,
        threads=runs[0].threads,
    )


def fmt_rate(value: float) -> str:
    """A rate with a precision that suits its size: ``12.3``, ``1234``, ``45.6k``."""
    if math.isnan(value):
        return "-"
    if value >= 100_000:
        return f"{value / 1000:.0f}k"
    if value >= 10_000:
        return f"{value / 1000:.1f}k"
    if value >= 100:
        return f"{value:.0f}"
    return f"{value:.1f}"


def fmt_ms(value: float) -> str:
    if math.isnan(value):
        return "-"
    return f"{value:.3f}" if value < 1 else f"{value:.2f}" if value < 100 else f"{value:.0f}"


def fmt_spread(s: Spread) -> str:
    """``low-high (x%)``: the range of a rate and its width relative to the median."""
    return f"{fmt_rate(s.low)}-{fmt_rate(s.high)} ({s.relative * 100:.0f}%)"


def format_table(
    headers: Sequence[str], rows: Iterable[Sequence[object]], *, markdown: bool = False
) -> str:
    """A table: plain text (the first column left-aligned, the others right-aligned) or,
    with ``markdown``, a GitHub markdown table."""
    if markdown:
        return _markdown_table(headers, rows)
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]

    def line(row: Sequence[str]) -> str:
        return "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(cells[0]), rule, *(line(r) for r in cells[1:])])


def _markdown_table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    def cell(value: object) -> str:
        return str(value).replace("|", "\\|").replace("\n", " ")

    lines = [
        "| " + " | ".join(cell(h) for h in headers) + " |",
        "| " + " | ".join("---" for _ in headers) + " |",
    ]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def print_table(
    headers: Sequence[str], rows: Sequence[Sequence[object]], *, file: TextIO | None = None
) -> None:
    print(format_table(headers, rows), file=file if file is not None else sys.stdout)


# --------------------------------------------------------------------------- the oracle


class CountingOracle(TimestampOracle):
    """Wraps an oracle, counting the timestamps drawn and adding up the wall-clock time
    spent waiting for them (over all threads)."""

    def __init__(self, inner: TimestampOracle) -> None:
        self.inner = inner
        self.timestamps = 0
        self.waited_s = 0.0
        self._lock = threading.Lock()

    def get_timestamp(self) -> int:
        started = time.perf_counter()
        try:
            return self.inner.get_timestamp()
        finally:
            self._count(1, started)

    def get_timestamps(self, count: int) -> list[int]:
        started = time.perf_counter()
        try:
            return self.inner.get_timestamps(count)
        finally:
            self._count(count, started)

    def _count(self, timestamps: int, started: float) -> None:
        waited = time.perf_counter() - started
        with self._lock:
            self.timestamps += timestamps
            self.waited_s += waited

    def close(self) -> None:
        self.inner.close()


@contextlib.contextmanager
def counted_client(
    store: str | Store, oracle_url: str | None, **options: int
) -> Iterator[tuple[percolator.Client, Store, CountingOracle]]:
    """A client on ``store`` (a URL, or an open store left open) whose oracle
    (``oracle_url``, or the store's own for None) is a :class:`CountingOracle`; yields
    ``(client, store, oracle)`` and closes what it opened."""
    from percolator.layout import ensure_meta_table
    from percolator.timestamps.factory import open_oracle

    with contextlib.ExitStack() as stack:
        if isinstance(store, str):
            store = open_store(store)
            stack.callback(store.close)
        ensure_meta_table(store)
        oracle = CountingOracle(open_oracle(oracle_url, store))
        client = percolator.connect(store, oracle=oracle, **options)
        stack.callback(client.close)
        yield client, store, oracle


@dataclass
class Probe:
    """Counts what a piece of work costs: store round trips (the store's own counters),
    timestamps and oracle wait, and wall time."""

    store: Store
    oracle: CountingOracle | None = None
    calls: dict[str, int] = field(default_factory=dict)
    timestamps: int = 0
    waited_s: float = 0.0
    started: float = 0.0

    def start(self) -> None:
        self.calls = dict(self.store.stats.calls)
        self.timestamps = self.oracle.timestamps if self.oracle else 0
        self.waited_s = self.oracle.waited_s if self.oracle else 0.0
        self.started = time.perf_counter()

    def stop(self, per: float, unit: str) -> dict[str, Any]:
        """The cost per operation, ``per`` operations having run since :meth:`start`."""
        seconds = time.perf_counter() - self.started
        after = self.store.stats.calls
        trips = {
            op: (n - self.calls.get(op, 0)) / per
            for op, n in after.items()
            if n != self.calls.get(op, 0)
        }
        return {
            "unit": unit,
            "count": per,
            "ms_per_op": seconds * 1000 / per,
            "round_trips_per_op": trips,
            "timestamps_per_op": (
                (self.oracle.timestamps - self.timestamps) / per if self.oracle else 0.0
            ),
            "oracle_ms_per_op": (
                (self.oracle.waited_s - self.waited_s) * 1000 / per if self.oracle else 0.0
            ),
        }

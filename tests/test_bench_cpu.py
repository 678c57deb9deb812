"""Where the benchmarks say the CPU went (bench/_common.py: CpuMeter, CpuUse): this process,
the server processes named with ``--cpu-of``, the rest of the machine; and how the report
and run_all carry it (bench/report.py, bench/targets.py, bench/run_all.py)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from bench._common import (
    CpuMeter,
    CpuUse,
    machine_cpu_s,
    median_per_key,
    parse_cpu_of,
    run_timed,
    watch_processes,
)
from bench.report import _p10_section, cpu_columns
from bench.run_all import Processes, bench_argv
from bench.targets import observer_cost

needs_proc = pytest.mark.skipif(machine_cpu_s() is None, reason="needs Linux's /proc/stat")


@pytest.fixture(autouse=True)
def _no_watched_processes() -> Iterator[None]:
    yield
    watch_processes({})


def _spin(seconds: float) -> None:
    """Spend ``seconds`` of this thread's CPU time."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_parse_cpu_of_names_a_malformed_item() -> None:
    assert parse_cpu_of(["hbase=12", "oracle=7"]) == {"hbase": 12, "oracle": 7}
    for bad in ("hbase", "=12", "hbase=", "hbase=x1"):
        with pytest.raises(ValueError, match=f"NAME=PID, got {bad!r}"):
            parse_cpu_of([bad])


@needs_proc
def test_the_meter_splits_this_process_a_watched_one_and_the_rest() -> None:
    # A child that spins for a while: its CPU goes to its name, not to this process.
    child = subprocess.Popen(
        [sys.executable, "-c", "import time\nend = time.time() + 30\nwhile time.time() < end: pass"]
    )
    try:
        time.sleep(0.3)  # past its start-up
        watch_processes({"spinner": child.pid})
        meter = CpuMeter()
        _spin(0.4)
        use = meter.stop()
    finally:
        child.kill()
        child.wait()
    assert 0.35 <= use.process_s <= 0.6
    assert use.named_s["spinner"] > 0.2
    assert use.machine_s is not None
    # The machine's busy time holds both (ticks are 10 ms: allow that rounding).
    assert use.machine_s >= use.process_s + use.named_s["spinner"] - 0.05
    per = use.per_item_ms(4)
    assert per["client"] == pytest.approx(use.process_s * 250)
    assert per["spinner"] == pytest.approx(use.named_s["spinner"] * 250)
    assert per["rest"] >= 0
    assert per["machine"] == pytest.approx(use.machine_s * 250)
    assert 0 < per["busy"] <= 1.05


def test_a_process_that_is_gone_is_left_out() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    watch_processes({"gone": child.pid})
    assert "gone" not in CpuMeter().stop().named_s


def test_per_item_figures_of_a_use() -> None:
    use = CpuUse(wall_s=2.0, process_s=1.0, machine_s=3.0, cores=2, named_s={"hbase": 1.5})
    assert use.busy == 0.75
    assert use.per_item_ms(1000) == {
        "client": 1.0,
        "hbase": 1.5,
        "rest": 0.5,
        "machine": 3.0,
        "busy": 0.75,
    }
    assert CpuUse(1.0, 0.5, None, 2).per_item_ms(10) == {"client": 50.0}
    assert use.per_item_ms(0) == {}


@needs_proc
def test_timed_runs_carry_their_cpu_per_item() -> None:
    timing = run_timed(lambda i: _spin(0.002), 50, threads=2, items_per_op=2)
    per = timing.as_dict()["cpu_ms_per_item"]
    assert isinstance(per, dict)
    # 50 calls of >= 2 ms CPU each, 100 items: at least ~1 ms of this process per item.
    assert per["client"] >= 0.9
    assert per["machine"] >= per["client"] - 0.5


def test_median_per_key_keeps_keys_every_repeat_has() -> None:
    assert median_per_key([{"a": 1.0, "b": 5.0}, {"a": 3.0}, {"a": 2.0, "b": 1.0}]) == {"a": 2.0}
    assert median_per_key([]) == {}


def _p10_run() -> dict[str, Any]:
    return {
        "threads": 4,
        "backlog": 100,
        "repeats": 2,
        "default_batch_size": 32,
        "median_per_s": {
            "observer_block_batch32": 300.0,
            "raw_pairs": 1000.0,
            "observer_block": 100.0,
        },
        "runs_per_s": {"raw_pairs": [900.0, 1100.0], "observer_block_batch32": [280.0, 320.0]},
        "p10_default_runs": [0.31, 0.29],
        "cpu_runs": {
            "raw_pairs": [
                {"client": 0.3, "hbase": 0.5, "rest": 0.2, "machine": 1.0, "busy": 0.9},
                {"client": 0.3, "hbase": 0.7, "rest": 0.2, "machine": 1.2, "busy": 0.9},
            ],
            "observer": [
                {"client": 1.0, "hbase": 2.0, "rest": 0.6, "machine": 3.6, "busy": 0.95},
                {"client": 1.2, "hbase": 2.2, "rest": 0.6, "machine": 4.0, "busy": 0.97},
            ],
        },
    }


def test_the_p10_reading_compares_cpu_per_run_with_cpu_per_pair() -> None:
    text = observer_cost(_p10_run()).measured
    assert "per run 3.80 ms (the worker's process 1.10) vs per raw pair 1.10 ms (0.30)" in text
    assert "96% / 90% busy" in text
    plain = _p10_run()
    del plain["cpu_runs"]
    assert "CPU" not in observer_cost(plain).measured


def test_the_report_shows_the_cpu_split_of_p10() -> None:
    raw = {"machine": {"store": "hbase://h:1"}, "steps": [], "runs": {"p10_hbase": _p10_run()}}
    section = _p10_section(raw)
    header = "| one item is | items/s | client CPU ms | hbase CPU ms | rest CPU ms | busy |"
    assert header in section
    assert "| raw get + put pair | 1000 | 0.300 | 0.600 | 0.200 | 90% |" in section
    assert "| worker run (batches of up to 32) | 300 | 1.10 | 2.10 | 0.600 | 96% |" in section


def test_cpu_columns_are_left_out_without_figures() -> None:
    assert cpu_columns([{}, {}]) == ([], [[], []])
    headers, rows = cpu_columns([{"client": 1.0}, {}])
    assert headers == ["client CPU ms", "rest CPU ms", "busy"]
    assert rows == [["1.00", "-", "-"], ["-", "-", "-"]]


def test_run_all_names_the_servers_it_started_to_each_benchmark() -> None:
    processes = Processes(hbase=["hbase=10", "thrift=11"], oracle=["oracle=12"])
    argv = bench_argv("txn_bench", store="s", cpu_of=processes.of(hbase=True, oracle=True))
    assert argv[1:] == [
        "--store",
        "s",
        "--cpu-of",
        "hbase=10",
        "--cpu-of",
        "thrift=11",
        "--cpu-of",
        "oracle=12",
    ]
    assert bench_argv("txn_bench", cpu_of=processes.of())[1:] == []
    assert processes.of(oracle=True) == ["oracle=12"]

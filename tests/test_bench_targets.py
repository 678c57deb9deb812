"""The performance report's judging of P1c, P3, P7b and P10-P13 from their benchmarks' JSON
(bench/targets.py, bench/report.py): which figure is read, which goal applies, and what
is reported rather than judged."""

from __future__ import annotations

from typing import Any

import pytest

from bench.report import MISS, NOT_MEASURED, PASS, REPORTED, judge
from bench.targets import BY_ID

J = dict[str, Any]


def _raw(store: str, **runs: J) -> J:
    return {"machine": {"store": store}, "runs": runs, "steps": []}


def _p10(ratios: list[float]) -> J:
    pairs = [1000.0] * len(ratios)
    return {
        "threads": 4,
        "backlog": 100,
        "default_batch_size": 32,
        "median_per_s": {
            "observer_block_batch32": 400.0,
            "raw_pairs": 1000.0,
            "observer_block": 100.0,
        },
        "runs_per_s": {"raw_pairs": pairs},
        "p10_default_runs": ratios,
    }


def test_p10_needs_both_stores_goals_on_an_hbase_run() -> None:
    target = BY_ID["P10"]
    # HBase 0.35x meets its 0.3x goal; embedded 0.4x misses its own 0.5x goal.
    result = judge(
        target,
        _raw("hbase://h:1", p10_hbase=_p10([0.35, 0.36, 0.34]), p10_embedded=_p10([0.4, 0.4, 0.4])),
    )
    assert result.verdict == MISS
    assert "missed" in result.embedded
    result = judge(
        target,
        _raw(
            "hbase://h:1", p10_hbase=_p10([0.35, 0.36, 0.34]), p10_embedded=_p10([0.55, 0.6, 0.52])
        ),
    )
    assert result.verdict == PASS
    assert result.figure.startswith("0.350x")


def test_p10_on_an_embedded_run_is_judged_against_the_embedded_goal() -> None:
    target = BY_ID["P10"]
    assert judge(target, _raw("embedded", p10_hbase=_p10([0.4]))).verdict == MISS
    assert judge(target, _raw("embedded", p10_hbase=_p10([0.51]))).verdict == PASS


def _promise(docs: int, identical: bool = True) -> J:
    # Rounds alternate worker, drain, worker, drain.
    return {
        "documents": docs,
        "changes_runs": [10, 10, 20, 20],
        "incremental_runs": {"worker": [1.0, 4.0], "drain": [2.0, 2.0]},
        "recompute_runs": [10.0, 10.0, 20.0, 20.0],
        "identical": identical,
    }


def test_p7b_break_even_is_read_per_worker_round() -> None:
    result = judge(BY_ID["P7b"], _raw("hbase://h:1", promise_embedded=_promise(100_000)))
    # Worker rounds: 10 s / (0.1 s x 100,000) = 0.1%, 20 s / (0.2 s x 100,000) = 0.1%.
    assert result.figure.startswith("0.1%")
    assert result.verdict == MISS
    assert "100,000 documents" in result.measured


def test_p7b_is_never_met_below_the_goals_corpus_size() -> None:
    small = _promise(1_000)  # break-even 10% and 10%: the figure alone would meet 10%
    result = judge(BY_ID["P7b"], _raw("hbase://h:1", promise_embedded=small))
    assert result.figure.startswith("10.0%")
    assert result.verdict == MISS
    assert "not judged as met" in result.measured
    big = _promise(100_000)
    big["recompute_runs"] = [1000.0, 0.0, 2000.0, 0.0]
    assert judge(BY_ID["P7b"], _raw("hbase://h:1", promise_embedded=big)).verdict == PASS
    big["identical"] = False
    assert judge(BY_ID["P7b"], _raw("hbase://h:1", promise_embedded=big)).verdict == MISS


@pytest.mark.parametrize(("versions", "bytes_", "verdict"), [(1.5, 1.9, PASS), (1.5, 2.5, MISS)])
def test_p11_judges_the_larger_growth(versions: float, bytes_: float, verdict: str) -> None:
    run = {
        "cells": 200,
        "seconds": 60.0,
        "commits": 5000,
        "gc_every_s": 2.0,
        "life_time_s": 5.0,
        "versions_first": 100.0,
        "versions_last": 100.0 * versions,
        "bytes_first": 10.0,
        "bytes_last": 10.0 * bytes_,
        "versions_ratio": versions,
        "bytes_ratio": bytes_,
    }
    assert judge(BY_ID["P11"], _raw("hbase://h:1", gc_hbase=run)).verdict == verdict


def test_p12_and_p13_are_reported_not_judged() -> None:
    watermark = {
        "saturation_docs_per_s": 60.0,
        "rate_docs_per_s": 30.0,
        "seconds": 20.0,
        "threads": 4,
        "stage1_p50_s": 0.4,
        "stage2_added_p50_s": 0.1,
        "observers": {
            "doc-clusters": {"stage": 1, "p50_s": 0.4, "p95_s": 0.9},
            "doc-inlinks": {"stage": 1, "p50_s": 0.1, "p95_s": 1.0},
            "doc-index": {"stage": 2, "p50_s": 0.5, "p95_s": 1.1},
        },
    }
    result = judge(BY_ID["P12"], _raw("hbase://h:1", watermark_hbase=watermark))
    assert (result.verdict, result.score) == (REPORTED, None)
    assert result.figure == "stage 1: 0.40 s, p95 1.00 s / stage 2: 0.50 s, p95 1.10 s"
    partition = {
        "results": [
            {
                "workers": w,
                "mode": m,
                "rows": 400,
                "seconds": 4.0 / w**0.5,
                "runs": 400,
                "scanned_per_run": 1.0,
                "conflicts_per_run": 0.0,
            }
            for w in (1, 4)
            for m in ("random", "partitioned")
        ]
    }
    result = judge(BY_ID["P13"], _raw("hbase://h:1", partition_hbase=partition))
    assert result.verdict == REPORTED
    assert result.figure == "4 / 1 workers: 2.00x runs/s"


def test_a_target_whose_step_did_not_run_is_not_measured() -> None:
    assert judge(BY_ID["P11"], _raw("hbase://h:1")).verdict == NOT_MEASURED


def _txn(share: float) -> J:
    timing = {"item_rate": 100.0, "p50_ms": 1.0, "p99_ms": 2.0}
    return {
        "threads": 4,
        "oracle": "x",
        "oracle_share": [share],
        "timings": [{"txn_1cell": timing}],
    }


def test_p1c_shows_the_default_oracle_beside_the_judged_server_figure() -> None:
    raw = _raw("hbase://h:1", txn_hbase=_txn(0.35), txn_hbase_local=_txn(0.04))
    result = judge(BY_ID["P1c"], raw)
    assert result.verdict == MISS  # judged on the oracle server's run
    assert result.figure.startswith("35.0%")
    assert "default oracle (local, in the store), not judged: 4.0%" in result.measured


def _txn_ratio(p3: float) -> J:
    timing = {"item_rate": 100.0}
    return {
        "threads": 4,
        "timings": [{"txn_1cell": timing, "raw_put": timing}],
        "ratios": {"P3 1-cell txn / raw put": {"median": p3, "low": p3, "high": p3}},
    }


def test_p3_has_a_goal_per_store() -> None:
    target = BY_ID["P3"]
    # 0.20x meets the embedded store's 0.15x goal, not HBase's 0.30x.
    raw = _raw("hbase://h:1", txn_hbase=_txn_ratio(0.31), txn_embedded=_txn_ratio(0.20))
    result = judge(target, raw)
    assert result.verdict == PASS
    assert "met" in result.embedded
    raw = _raw("hbase://h:1", txn_hbase=_txn_ratio(0.31), txn_embedded=_txn_ratio(0.12))
    result = judge(target, raw)
    assert result.verdict == MISS
    assert "missed" in result.embedded
    assert judge(target, _raw("hbase://h:1", txn_hbase=_txn_ratio(0.20))).verdict == MISS
    assert judge(target, _raw("embedded", txn_hbase=_txn_ratio(0.20))).verdict == PASS


def _bulk(raw_runs: list[float], bulk_runs: list[float]) -> J:
    return {
        "rows": 50_000,
        "txn_rows": 1000,
        "batch": 500,
        "runs": {"raw": raw_runs, "bulk": bulk_runs, "transactional": [300.0] * len(raw_runs)},
        "rows_per_s": {"raw": 10_000.0, "bulk": 5_500.0, "transactional": 300.0},
        "bulk_ratio": 0.55,
        "transactional_ratio": 0.03,
    }


def test_p8_judges_the_bulk_mode_and_shows_the_transactional_one() -> None:
    target = BY_ID["P8"]
    result = judge(target, _raw("hbase://h:1", bulk=_bulk([10_000.0, 8_000.0], [5_500.0, 4_800.0])))
    assert result.verdict == PASS
    assert result.figure.startswith("0.550x (0.550-0.600)")
    assert "transactional mode" in result.measured and "0.030x" in result.measured
    missed = _bulk([10_000.0], [4_000.0]) | {"bulk_ratio": 0.4}
    assert judge(target, _raw("hbase://h:1", bulk=missed)).verdict == MISS
    # The transactional backfill of spark_bench is not what P8 judges.
    assert judge(target, _raw("hbase://h:1", spark={"load": {}})).verdict == NOT_MEASURED

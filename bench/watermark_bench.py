"""Low-watermark lag per stage of the example pipeline at half of saturation (target P12).

    python bench/watermark_bench.py                          # embedded store in a temp dir
    python bench/watermark_bench.py --store 'hbase://127.0.0.1:9090?prefix=wmbench_'
    python bench/watermark_bench.py --seconds 30 --threads 4 --json out.json

The pipeline of examples/docpipeline runs in one in-process worker (``--threads`` run
threads), its observers declaring their outputs so each has its own watermark:

* stage 1: ``doc-clusters`` (documents/body) and ``doc-inlinks`` (documents/links);
* stage 2: ``doc-index`` (doc_clusters/canonical, written by doc-clusters).

1. **load**: ``--documents`` documents, processed until the watermarks pass (``wait_for``).
2. **saturation**: a burst of ``--burst`` changed documents written at once; the rate at
   which the pipeline's watermark passes them is the saturation point S (documents/s).
3. **half of saturation**: single-document transactions paced at S/2 for ``--seconds``
   while a sampler computes every observer's watermark every ``--sample-ms`` (publishing
   it, as ``percolator status``/metrics would) and records the lag ``now - W``.  Reported
   per observer: median, p95 and max lag; per stage, the median lag and what the second
   stage adds to the first - next to MillWheel's 1.8 s at the first stage and < 200 ms
   more per later stage (MillWheel paper, section 8.2).

A downstream watermark is held at the newest upstream watermark *published* before the
work it waits for (its origin bound, percolator/watermark.py), so the second stage's lag
includes up to one sampling interval: ``--sample-ms`` is part of the figure (measured on
embedded, two loaded cores: stage 2 added ~0.5 s at 500 ms, ~0.01 s p50 / 0.2 s p95 at
100 ms).

Writer, worker and sampler share this process (and, on two cores, the machine with the
store): the machine's load average is printed with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``bench`` and the packages importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from docpipeline import corpus, pipeline
from docpipeline.reference import CLUSTERS, DOCUMENTS, INLINKS
from percolator.observers.api import Observer
from percolator.observers.worker import Worker, WorkerOptions

import percolator
from bench._common import percentile
from percolator.watermark import compute_watermarks

MILLWHEEL_FIRST_STAGE_S = 1.8
MILLWHEEL_PER_STAGE_S = 0.2

STAGES = {"doc-clusters": 1, "doc-inlinks": 1, "doc-index": 2}
OUTPUTS = {
    "doc-clusters": (
        (DOCUMENTS, "fingerprint"),
        (CLUSTERS, "terms"),
        (CLUSTERS, "members"),
        (CLUSTERS, "canonical"),
    ),
    "doc-index": ((CLUSTERS, "indexed"),),
    "doc-inlinks": ((INLINKS, "count"), (DOCUMENTS, "links_applied")),
}


def declared_observers() -> list[Observer]:
    """The pipeline's observers, each declaring the watched columns it writes (the
    columns it writes under generated names are watched by no one)."""
    found = pipeline.observers()
    for observer in found:
        observer.outputs = OUTPUTS[observer.name]
    return found


def saturation(client: percolator.Client, documents: list[Any], burst: int, seed: int) -> float:
    changes = corpus.mutate(documents, fraction=min(1.0, burst / len(documents)), seed=seed)
    started = time.monotonic()
    corpus.write_documents(client, changes, batch=10)
    client.wait_for(timeout=600)
    return len(changes) / (time.monotonic() - started)


def half_saturation(
    client: percolator.Client,
    documents: list[Any],
    rate: float,
    seconds: float,
    sample_s: float,
    seed: int,
) -> dict[str, list[float]]:
    lags: dict[str, list[float]] = {name: [] for name in STAGES}
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            for name, mark in compute_watermarks(client.store, client.oracle).items():
                if name in lags:
                    lags[name].append(mark.lag_ms / 1000)
            stop.wait(sample_s)

    sampler = threading.Thread(target=sample, daemon=True)
    changes = corpus.mutate(documents, fraction=1.0, seed=seed)
    sampler.start()
    started = time.monotonic()
    written = 0
    try:
        while time.monotonic() - started < seconds:
            due = started + written / rate
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            corpus.write_documents(client, [changes[written % len(changes)]], batch=1)
            written += 1
    finally:
        stop.set()
        sampler.join()
    client.wait_for(timeout=600)
    return lags


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", default=None, help="store URL (default: a temp embedded)")
    parser.add_argument("--documents", type=int, default=300)
    parser.add_argument("--burst", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--sample-ms", type=int, default=500)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    tmp = tempfile.TemporaryDirectory(prefix="wmbench-")
    store_url = args.store or f"embedded:{tmp.name}/store"
    client = percolator.connect(store_url)
    worker = Worker(
        client,
        declared_observers(),
        WorkerOptions(threads=args.threads, idle_sleep_s=0.01, backoff_base_s=0.05),
    )
    try:
        pipeline.create_tables(client)
        worker.start()
        documents = corpus.generate(args.documents, seed=args.seed)
        corpus.write_documents(client, documents, batch=10)
        client.wait_for(timeout=600)
        sat = saturation(client, documents, args.burst, args.seed + 1)
        rate = sat / 2
        lags = half_saturation(
            client, documents, rate, args.seconds, args.sample_ms / 1000, args.seed + 2
        )
    finally:
        worker.stop()
        client.close()
        tmp.cleanup()
    load = os.getloadavg()
    report: dict[str, Any] = {
        "store": store_url.split(":")[0],
        "saturation_docs_per_s": round(sat, 1),
        "rate_docs_per_s": round(rate, 1),
        "seconds": args.seconds,
        "threads": args.threads,
        "load_average": [round(x, 2) for x in load],
        "cpus": os.cpu_count(),
        "observers": {},
    }
    print(
        f"store {report['store']}, {args.threads} run threads, load average "
        f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs"
    )
    print(
        f"saturation S = {sat:.1f} documents/s; paced at S/2 = {rate:.1f}/s for "
        f"{args.seconds:.0f} s, watermark sampled every {args.sample_ms} ms"
    )
    print(f"{'observer':14} {'stage':>5} {'samples':>7} {'p50 lag':>9} {'p95 lag':>9} {'max':>9}")
    for name, values in lags.items():
        p50 = statistics.median(values) if values else float("nan")
        p95 = percentile(values, 95) if values else float("nan")
        top = max(values) if values else float("nan")
        report["observers"][name] = {
            "stage": STAGES[name],
            "samples": len(values),
            "p50_s": round(p50, 3),
            "p95_s": round(p95, 3),
            "max_s": round(top, 3),
        }
        print(
            f"{name:14} {STAGES[name]:>5} {len(values):>7} {p50:>8.2f}s {p95:>8.2f}s {top:>8.2f}s"
        )
    first = report["observers"]["doc-clusters"]["p50_s"]
    second = report["observers"]["doc-index"]["p50_s"]
    report["stage1_p50_s"] = first
    report["stage2_added_p50_s"] = round(second - first, 3)
    print(
        f"stage 1 (doc-clusters) p50 lag {first:.2f} s vs MillWheel "
        f"{MILLWHEEL_FIRST_STAGE_S} s; stage 2 (doc-index) adds {second - first:+.2f} s vs "
        f"MillWheel < {MILLWHEEL_PER_STAGE_S} s per stage"
    )
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

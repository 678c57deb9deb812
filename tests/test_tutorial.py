"""docs/writing-observers.md, walked end to end on the test session's HBase: the observer
module exactly as the page prints it, a real `percolator worker --observers-from` process, a
write, `percolator wait`, and the derived value the page promises.  (The compose deployment's
own-observer image is checked by tests/deploy/compose_run.py.)"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

import percolator
from percolator.store.backends import with_table_prefix

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "writing-observers.md"


def page_module() -> str:
    """The code block that follows "`wordcount.py`:" on the page."""
    text = PAGE.read_text()
    found = re.search(r"`wordcount\.py`:\s*```python\n(.*?)```", text, re.S)
    assert found, "docs/writing-observers.md lost its wordcount.py block"
    return found.group(1)


def test_the_tutorial_observer_watches_a_column_no_bundled_example_watches() -> None:
    from docpipeline import pipeline

    watched = {(o.table, c) for o in pipeline.observers() for c in o.columns}
    assert ("notes", "text") not in watched
    assert 'table = "notes"' in page_module()


@pytest.mark.hbase
def test_the_tutorial_runs_on_a_local_hbase(hbase_url: str, tmp_path: Path) -> None:
    (tmp_path / "wordcount.py").write_text(page_module())
    store = with_table_prefix(hbase_url, f"tut{uuid.uuid4().hex[:8]}_")
    env = dict(os.environ, PYTHONPATH=str(tmp_path), PERCOLATOR_OBSERVED_REFRESH_MS="300")
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "percolator",
            "worker",
            "--store",
            store,
            "--create",
            "--observers-from",
            "wordcount:WordCount",
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        assert worker.stdout is not None
        for line in worker.stdout:  # the page: wait for "worker ready ..."
            if "worker ready" in line:
                break
            assert time.monotonic() < deadline, "the worker never became ready"
        else:
            raise AssertionError(f"the worker exited ({worker.wait()}) before it was ready")
        with percolator.connect(store) as client, client.transaction() as txn:
            txn.set("notes", b"d1", "text", b"hello observer world")
        waited = subprocess.run(
            [
                sys.executable,
                "-m",
                "percolator",
                "wait",
                "--store",
                store,
                "--observer",
                "word-count",
                "--timeout",
                "60",
            ],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert waited.returncode == 0, waited.stdout + waited.stderr
        with percolator.connect(store) as client, client.snapshot() as snap:
            assert snap.get("note_counts", b"d1", "words") == b"3"
    finally:
        worker.terminate()
        worker.wait(timeout=60)

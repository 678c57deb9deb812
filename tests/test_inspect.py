"""``percolator inspect``: raw cell state, decoded, from the store; never creates anything."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import percolator
from percolator.cli import main
from percolator.testing import ProtocolHarness


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    url = f"embedded:{tmp_path / 'store'}"
    with percolator.connect(url) as client:
        client.create_table("t")
        with client.transaction() as txn:
            txn.set("t", b"r1", "a", b"hello")
        with client.transaction() as txn:
            txn.set("t", b"r1", "a", b"world")
        harness = ProtocolHarness(client.store, "t")
        start_ts = client.oracle.get_timestamp()
        harness.must_prewrite(
            [(b"r2", "b", b"pending")], primary=(b"r1", "a"), start_ts=start_ts, ttl_ms=60_000
        )
    return url


def test_shows_lock_commits_and_versions(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["inspect", "--store", store_url, "t"]) == 0
    out = capsys.readouterr().out
    assert "t/r1/a" in out and "t/r2/b" in out
    assert "data" in out and "world" in out and "hello" in out
    assert "primary t/r1/a" in out and "live" in out  # the pending lock, with its primary


def test_json_has_every_version(store_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", "--store", store_url, "t", "--row", "r1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (cell,) = doc["cells"]
    assert (cell["row"], cell["column"]) == ("r1", "a")
    assert [d["value"] for d in cell["data"]] == ["world", "hello"]
    assert len(cell["writes"]) == 2
    assert cell["lock"]["lock"] is None
    assert cell["lock"]["last_commit"]["kind"] == "PUT"


def test_range_and_limit(store_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", "--store", store_url, "t", "--start", "r2", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [c["row"] for c in doc["cells"]] == ["r2"]
    assert doc["cells"][0]["lock"]["lock"]["primary"] == "t/r1/a"
    assert main(["inspect", "--store", store_url, "t", "--limit", "1", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["cells"]) == 1


def test_missing_store_is_an_error_and_is_not_created(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nowhere"
    assert main(["inspect", "--store", f"embedded:{missing}", "t"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not missing.exists()


def test_memory_store_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", "--store", "memory:", "t"]) == 2
    assert "memory:" in capsys.readouterr().err


def test_missing_table_and_bad_options(store_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", "--store", store_url, "nope"]) == 2
    assert "'nope' does not exist" in capsys.readouterr().err
    # The engine's own table has none of a user table's families: named as such.
    assert main(["inspect", "--store", store_url, "percolator_meta"]) == 2
    assert "'percolator_meta' is reserved" in capsys.readouterr().err
    assert main(["inspect", "--store", store_url, "t", "--row", "a", "--start", "b"]) == 2
    with pytest.raises(SystemExit) as exit_info:  # a usage error, from the option's type
        main(["inspect", "--store", store_url, "t", "--limit", "0"])
    assert exit_info.value.code == 2
    assert "argument --limit: '0' is out of range" in capsys.readouterr().err

"""The list of backends the tests parametrize over (percolator/store/backends.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from percolator.store import BACKENDS, open_store, parse_store_url, with_table_prefix
from percolator.store.backends import without_url_options


def test_every_backend_names_a_url_scheme_open_store_knows(tmp_path: Path) -> None:
    assert [b.name for b in BACKENDS] == ["memory", "embedded", "hbase"]
    for backend in BACKENDS:
        url = backend.namespace_url(
            "tok", directory=tmp_path / backend.name, server_url="hbase://h:1"
        )
        assert parse_store_url(url).scheme == backend.name
    memory, embedded, hbase = BACKENDS
    assert (memory.shared, embedded.shared, hbase.shared) == (False, True, True)
    assert [b.needs_server for b in BACKENDS] == [False, False, True]
    with open_store(memory.namespace_url("tok")) as a, open_store("memory:tok") as b:
        assert a is b  # a memory namespace is the named in-process store


def test_a_table_prefix_is_added_to_the_one_a_url_has() -> None:
    assert with_table_prefix("hbase://h:1", "a_") == "hbase://h:1?prefix=a_"
    url = with_table_prefix("hbase://h:1?prefix=x_&pool_size=2", "a_")
    assert parse_store_url(url).options == {"prefix": "x_a_", "pool_size": "2"}


def test_options_left_out_of_a_url_keep_the_others() -> None:
    url = "hbase://h:1?prefix=x_&thrift2_port=9095&pool_size=2"
    assert parse_store_url(without_url_options(url, "thrift2_port")).options == {
        "prefix": "x_",
        "pool_size": "2",
    }
    assert without_url_options("hbase://h:1?thrift2_port=9095", "thrift2_port") == "hbase://h:1"


def test_a_namespace_needs_what_its_backend_needs() -> None:
    _, embedded, hbase = BACKENDS
    with pytest.raises(ValueError, match="directory"):
        embedded.namespace_url("tok")
    with pytest.raises(ValueError, match="server"):
        hbase.namespace_url("tok")

"""Tests of the memory store beyond the shared contract: the process-wide named stores."""

from __future__ import annotations

import uuid

import pytest

from percolator.errors import InvalidArgumentError
from percolator.store import FamilySpec, Put, open_store
from percolator.store.memory import MemoryStore


def test_named_stores_are_shared_within_the_process() -> None:
    name = f"shared-{uuid.uuid4().hex}"
    first = open_store(f"memory:{name}")
    second = open_store(f"memory:{name}")
    assert first is second
    assert first.url == f"memory:{name}"
    first.create_table("t", [FamilySpec("d")])
    first.put("t", [Put(b"r", "d", b"q", 1, b"v")])
    assert MemoryStore.named(name).read_row("t", b"r") == {("d", b"q"): [(1, b"v")]}
    # Closing one client does not discard the shared store.
    first.close()
    assert second.read_row("t", b"r") == {("d", b"q"): [(1, b"v")]}


def test_unnamed_stores_are_private() -> None:
    first = open_store("memory:")
    second = open_store("memory:")
    assert first is not second
    first.create_table("t", [FamilySpec("d")])
    assert second.list_tables() == []


def test_a_name_must_be_a_non_empty_string() -> None:
    with pytest.raises(InvalidArgumentError):
        MemoryStore.named("")

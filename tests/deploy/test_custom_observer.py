"""The custom-observer image's package (docker/custom-observer/): its observer watches a
column no bundled example watches (so a worker with every plugin installed never refuses the
clash), and it does what its docstring says on a real store."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from docpipeline import pipeline
from percolator.observers.api import register_observers
from percolator.observers.worker import run_until_quiet

import percolator
from tests.deploy.compose import ROOT

PACKAGE = ROOT / "docker/custom-observer"


@pytest.fixture
def note_words() -> Iterator[type]:
    sys.path.insert(0, str(PACKAGE))
    try:
        import note_words

        yield note_words.NoteWords
    finally:
        sys.path.remove(str(PACKAGE))
        sys.modules.pop("note_words", None)


def test_its_entry_point_names_the_observer() -> None:
    text = (PACKAGE / "pyproject.toml").read_text()
    assert '[project.entry-points."percolator.observers"]' in text
    assert 'note-words = "note_words:NoteWords"' in text


def test_no_bundled_example_watches_its_column(note_words: type) -> None:
    watched = {(o.table, c) for o in pipeline.observers() for c in o.columns}
    assert {(note_words.table, c) for c in note_words.columns}.isdisjoint(watched)


def test_it_counts_words_and_follows_deletes(note_words: type, tmp_path: Path) -> None:
    client = percolator.connect(f"embedded:{tmp_path / 'store'}")
    try:
        observer = note_words()
        observer.setup(client)
        register_observers(client, [observer])

        def write(txn: percolator.Transaction) -> None:
            txn.set("notes", "a", "text", b"one two  three")
            txn.set("notes", "b", "text", b"")

        client.run(write)
        assert run_until_quiet(client, [observer]).failures == []
        with client.snapshot() as snap:
            assert snap.get("note_stats", "a", "words") == b"3"
            assert snap.get("note_stats", "b", "words") == b"0"
        client.run(lambda txn: txn.delete("notes", "a", "text"))
        run_until_quiet(client, [observer])
        with client.snapshot() as snap:
            assert snap.get("note_stats", "a", "words") is None
    finally:
        client.close()

"""The example pipeline (docpipeline/pipeline.py) against its from-scratch reference
(docpipeline/reference.py), and the encoding the reference specifies."""

from __future__ import annotations

import hashlib

import pytest
from docpipeline import corpus, pipeline, reference
from percolator.observers.api import register_observers
from percolator.observers.worker import Worker, WorkerOptions, run_until_quiet

import percolator
from percolator.errors import InvalidArgumentError
from tests.observers.conftest import connect

# --------------------------------------------------------------------------- encoding


def test_tokens_are_ascii_lowercased_alphanumeric_runs() -> None:
    body = "Hello, WORLD-42 caf\u00e9\tX\u00c9y".encode()
    assert reference.tokens(body) == [b"hello", b"world", b"42", b"caf", b"x", b"y"]


def test_fingerprint_is_sha256_of_the_space_joined_tokens() -> None:
    assert reference.fingerprint(b"  A b, A!") == hashlib.sha256(b"a b a").hexdigest().encode()
    assert reference.fingerprint(b"A b A") == reference.fingerprint(b"a\nB...a")


def test_terms_and_links_encodings() -> None:
    assert reference.terms(b"b a B c a b") == b"a\t2\nb\t3\nc\t1"
    assert reference.terms(b"...") == b""
    raw = b"http://b/\tsecond\r\nhttp://a/\tfirst\n\nhttp://a/\tfirst\nhttp://a/\n\tno target"
    assert reference.links(raw) == b"http://a/\t\nhttp://a/\tfirst\nhttp://b/\tsecond"
    assert reference.anchors_by_target(reference.links(raw)) == {
        b"http://a/": b"\nfirst",
        b"http://b/": b"second",
    }
    assert reference.links(b"!bad\tx\nok\ty") == b"ok\ty"


def test_compute_on_a_tiny_corpus() -> None:
    docs = {
        b"http://b/": {"body": b"Same text", "links": b"http://t/\tgo"},
        b"http://a/": {"body": b"same  TEXT!"},
        b"http://c/": {"body": b"other", "links": b"http://t/\tgo\nhttp://t/\tthere"},
    }
    out = reference.compute(docs)
    same = reference.fingerprint(b"same text")
    other = reference.fingerprint(b"other")
    assert out[reference.CLUSTERS][same] == {
        "members": b"http://a/\nhttp://b/",
        "canonical": b"http://a/",
        "terms": b"same\t1\ntext\t1",
        "indexed": b"http://a/\nsame\t1\ntext\t1",
    }
    assert out[reference.INDEX][b"same"] == {same.decode(): b"http://a/\t1"}
    assert out[reference.INDEX][b"other"] == {other.decode(): b"http://c/\t1"}
    assert out[reference.INLINKS] == {
        b"http://t/": {
            "from:http://b/": b"go",
            "from:http://c/": b"go\nthere",
            "count": b"2",
        }
    }
    assert out[reference.DOCUMENTS][b"http://a/"] == {"fingerprint": same}
    assert out[reference.DOCUMENTS][b"http://b/"]["links_applied"] == b"http://t/\tgo"


def test_an_invalid_document_url_is_rejected() -> None:
    with pytest.raises(InvalidArgumentError, match="document URL"):
        reference.compute({b"bad\nurl": {"body": b"x"}})


def test_the_corpus_is_deterministic_and_has_duplicates_and_links() -> None:
    docs = corpus.generate(120, seed=5)
    assert docs == corpus.generate(120, seed=5)
    assert docs != corpus.generate(120, seed=6)
    out = reference.compute(corpus.as_input(docs))
    sizes = [len(r["members"].split(b"\n")) for r in out[reference.CLUSTERS].values()]
    assert max(sizes) >= 3
    assert max(int(r["count"]) for r in out[reference.INLINKS].values()) >= 10
    changes = corpus.mutate(docs, fraction=0.1, seed=2)
    assert changes == corpus.mutate(docs, fraction=0.1, seed=2)
    assert any(c.document is None for c in corpus.mutate(docs, fraction=0.5, seed=2))


# --------------------------------------------------------------------------- incremental


def check(client: percolator.Client, expected_docs: list[corpus.Document]) -> None:
    snapshot = client.snapshot()
    stored = reference.read_documents(snapshot)
    assert stored == corpus.as_input(expected_docs)
    expected = reference.compute(stored)
    actual = reference.read_derived(snapshot)
    assert reference.diff(expected, actual) == []
    assert actual == expected


def test_incremental_updates_match_a_recompute_after_every_round(store_url: str) -> None:
    small = store_url.startswith("hbase")
    client = connect(store_url)
    observers = pipeline.observers()
    for observer in observers:
        observer.setup(client)
    register_observers(client, observers)
    docs = corpus.generate(20 if small else 60, seed=11)
    corpus.write_documents(client, docs)
    run_until_quiet(client, observers)
    check(client, docs)
    for round_ in range(1 if small else 2):
        changes = corpus.mutate(docs, fraction=0.25, seed=round_)
        corpus.write_documents(client, changes)
        docs = corpus.apply_changes(docs, changes)
        run_until_quiet(client, observers)
        check(client, docs)
    client.close()


def test_a_canonical_document_moving_to_another_cluster_keeps_both_indexes(
    memory_url: str,
) -> None:
    """Document a is canonical of cluster X; its body changes to that of cluster Y, where it
    becomes canonical too.  Both clusters' postings must be right whatever the order of the
    index runs (postings belong to clusters, not to URLs)."""
    client = connect(memory_url)
    observers = pipeline.observers()
    for observer in observers:
        observer.setup(client)
    register_observers(client, observers)
    docs = [
        corpus.Document("http://a/", "shared words here"),
        corpus.Document("http://b/", "shared words here"),
        corpus.Document("http://c/", "shared words elsewhere"),
    ]
    corpus.write_documents(client, docs)
    run_until_quiet(client, observers)
    moved = [corpus.Change("http://a/", corpus.Document("http://a/", "Shared words, ELSEWHERE"))]
    corpus.write_documents(client, moved)
    run_until_quiet(client, observers)
    check(client, corpus.apply_changes(docs, moved))
    client.close()


def test_a_worker_with_many_threads_matches_the_recompute(local_store_url: str) -> None:
    client = connect(local_store_url)
    worker = Worker(
        client, pipeline.observers(), WorkerOptions(threads=8, scanners=2, idle_sleep_s=0.01)
    )
    worker.start()
    try:
        docs = corpus.generate(60, seed=3)
        corpus.write_documents(client, docs)
        changes = corpus.mutate(docs, fraction=0.3, seed=9)
        corpus.write_documents(client, changes)
        # Every write above is processed, and what the pipeline derived from it.
        client.wait_for(timeout=120)
    finally:
        worker.stop()
    check(client, corpus.apply_changes(docs, changes))
    client.close()

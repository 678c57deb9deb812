"""A seeded corpus of web-like documents for the example pipeline: the same seed always gives
the same documents, byte for byte.

What it contains, on purpose:

* bodies drawn from a Zipf-like vocabulary, with mixed case, punctuation, line breaks and
  non-ASCII characters (all token separators under the pipeline's normalization);
* duplicates: a share of documents copy an earlier body, exactly or with only case,
  punctuation and spacing changed (same fingerprint), so clusters have several members
  and their canonical document can change as documents come and go;
* links with anchor texts, preferring popular targets (so some targets have many inbound
  links and their counts are contended), a few to pages outside the corpus, and a few
  repeated or self links;
* :func:`mutate`: a seeded batch of changes (new bodies, new links, deletions, new
  documents) to exercise incremental updates.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from docpipeline.reference import DOCUMENTS
from percolator.transaction import Transaction

if TYPE_CHECKING:
    from percolator.client import Client

_SEPARATORS = (" ", " ", " ", "  ", ", ", ". ", "\n", "; ", " - ", " \u2014 ", "! ", " \u00e9 ")
_SYLLABLES = "ka lo mi ne ru ta so vi pe da gu zo fi ha be xu wa ye qo ji".split()  # noqa: SIM905


@dataclass(frozen=True)
class Document:
    url: str
    body: str | None
    links: tuple[tuple[str, str], ...] = ()

    def links_value(self) -> bytes | None:
        """The ``links`` column (see reference.py), None if there are none."""
        if not self.links:
            return None
        return "\n".join(f"{target}\t{anchor}" for target, anchor in self.links).encode()


@dataclass(frozen=True)
class Change:
    """Replace the document at ``url`` with ``document`` (None: delete it)."""

    url: str
    document: Document | None


def _vocabulary(rng: random.Random, size: int) -> list[str]:
    words: list[str] = []
    seen = set()
    while len(words) < size:
        word = "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 3)))
        if word not in seen:
            seen.add(word)
            words.append(word)
    return words


class _Generator:
    def __init__(self, seed: int, vocabulary: int) -> None:
        self.rng = random.Random(seed)
        self.words = _vocabulary(self.rng, vocabulary)
        self.weights = [1.0 / (rank + 1) for rank in range(len(self.words))]

    def url(self, index: int) -> str:
        site = index % 17
        path = f"page{index}"
        if index % 23 == 5:
            path += "-caf\u00e9"  # a non-ASCII URL
        return f"http://site{site}.example/{path}"

    def body(self, words: tuple[int, int]) -> str:
        count = self.rng.randint(*words)
        chosen = self.rng.choices(self.words, self.weights, k=count)
        parts = []
        for word in chosen:
            if self.rng.random() < 0.1:
                word = word.capitalize()
            parts.append(word)
            parts.append(self.rng.choice(_SEPARATORS))
        return "".join(parts).strip()

    def variant(self, body: str) -> str:
        """Same tokens, different bytes: case, punctuation and spacing changed."""
        mode = self.rng.randrange(3)
        if mode == 0:
            return body
        if mode == 1:
            return body.upper()
        return "  " + body.replace(" ", " ,  ").replace("\n", " ") + " !"

    def anchor(self) -> str:
        return " ".join(self.rng.choices(self.words, self.weights, k=self.rng.randint(1, 3)))

    def links(self, urls: Sequence[str], max_links: int) -> tuple[tuple[str, str], ...]:
        out = []
        for _ in range(self.rng.randint(0, max_links)):
            roll = self.rng.random()
            if roll < 0.08:
                target = f"http://elsewhere.example/{self.rng.randrange(50)}"
            else:
                # Prefer early (popular) documents: contended inbound counts.
                rank = min(int(self.rng.paretovariate(1.2)) - 1, len(urls) - 1)
                target = urls[rank] if self.rng.random() < 0.6 else self.rng.choice(urls)
            out.append((target, self.anchor()))
        if out and self.rng.random() < 0.1:
            out.append(out[0])  # a repeated link: anchors are deduplicated
        return tuple(out)


def generate(
    count: int,
    *,
    seed: int = 0,
    duplicate_rate: float = 0.25,
    max_links: int = 5,
    vocabulary: int = 300,
    words: tuple[int, int] = (8, 40),
) -> list[Document]:
    """``count`` documents, deterministic for a given seed and parameters."""
    gen = _Generator(seed, vocabulary)
    urls = [gen.url(i) for i in range(count)]
    docs: list[Document] = []
    for url in urls:
        if docs and gen.rng.random() < duplicate_rate:
            original = gen.rng.choice(docs).body or ""
            body = gen.variant(original)
        else:
            body = gen.body(words)
        docs.append(Document(url, body, gen.links(urls, max_links)))
    return docs


def mutate(
    docs: Sequence[Document],
    *,
    fraction: float,
    seed: int = 1,
    delete_rate: float = 0.15,
    new_rate: float = 0.15,
    max_links: int = 5,
    vocabulary: int = 300,
) -> list[Change]:
    """A seeded batch of changes touching about ``fraction`` of ``docs``: new bodies (some
    duplicating another document), new links, deletions, and new documents."""
    gen = _Generator(seed, vocabulary)
    urls = [d.url for d in docs]
    by_url = {d.url: d for d in docs}
    changes: list[Change] = []
    touched = gen.rng.sample(urls, max(1, round(len(urls) * fraction))) if urls else []
    for url in touched:
        roll = gen.rng.random()
        old = by_url[url]
        if roll < delete_rate:
            changes.append(Change(url, None))
        elif roll < 0.5:
            other = gen.rng.choice(docs).body or ""
            body = gen.variant(other) if gen.rng.random() < 0.5 else gen.body((8, 40))
            changes.append(Change(url, Document(url, body, old.links)))
        elif roll < 0.8:
            changes.append(Change(url, Document(url, old.body, gen.links(urls, max_links))))
        else:
            changes.append(
                Change(url, Document(url, gen.body((8, 40)), gen.links(urls, max_links)))
            )
    for i in range(round(len(touched) * new_rate)):
        url = gen.url(len(urls) + 1000 + i)
        changes.append(Change(url, Document(url, gen.body((8, 40)), gen.links(urls, max_links))))
    return changes


def write_documents(
    client: Client, changes: Iterable[Change | Document], *, batch: int = 10
) -> int:
    """Write documents (or apply changes) in transactions of ``batch`` documents, each
    retried as a whole on conflict.  Returns how many documents were written."""
    items = [c if isinstance(c, Change) else Change(c.url, c) for c in changes]
    client.create_table(DOCUMENTS)
    for start in range(0, len(items), batch):
        group = items[start : start + batch]

        def write(txn: Transaction, group: list[Change] = group) -> None:
            for change in group:
                doc = change.document
                if doc is None:
                    txn.delete(DOCUMENTS, change.url, "body")
                    txn.delete(DOCUMENTS, change.url, "links")
                    continue
                if doc.body is None:
                    txn.delete(DOCUMENTS, doc.url, "body")
                else:
                    txn.set(DOCUMENTS, doc.url, "body", doc.body.encode("utf-8"))
                value = doc.links_value()
                if value is None:
                    txn.delete(DOCUMENTS, doc.url, "links")
                else:
                    txn.set(DOCUMENTS, doc.url, "links", value)

        client.run(write, max_attempts=50)
    return len(items)


def as_input(docs: Iterable[Document]) -> dict[bytes, dict[str, bytes]]:
    """The ``documents`` input columns these documents become (for reference.compute)."""
    out: dict[bytes, dict[str, bytes]] = {}
    for doc in docs:
        cells: dict[str, bytes] = {}
        if doc.body is not None:
            cells["body"] = doc.body.encode("utf-8")
        value = doc.links_value()
        if value is not None:
            cells["links"] = value
        if cells:
            out[doc.url.encode("utf-8")] = cells
    return out


def apply_changes(docs: Sequence[Document], changes: Iterable[Change]) -> list[Document]:
    """The documents after ``changes`` (in memory, for the expected result)."""
    by_url = {d.url: d for d in docs}
    for change in changes:
        if change.document is None:
            by_url.pop(change.url, None)
        else:
            by_url[change.url] = change.document
    return [by_url[url] for url in sorted(by_url)]

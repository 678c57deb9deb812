"""An example pipeline in the spirit of Percolator's own indexing system.

Documents (URL, body, outgoing links) are written to ``documents``; three observers keep
the derived tables up to date, each change processed incrementally:

1. :class:`DuplicateClusters` (``doc-clusters``, watches ``documents/body``) files each
   document under the fingerprint of its normalized content in ``doc_clusters``: the
   cluster's members, its canonical document (the smallest URL) and its terms.  It
   remembers each document's current cluster in ``documents/fingerprint``, so a changed or
   deleted body leaves its old cluster.
2. :class:`CanonicalIndex` (``doc-index``, watches ``doc_clusters/canonical``, written by the
   first) keeps the inverted index ``doc_index`` of canonical documents only: one posting
   per (token, cluster) naming the cluster's canonical document; when the canonical
   document changes the postings are rewritten, when the cluster disappears they go.
3. :class:`InboundLinks` (``doc-inlinks``, watches ``documents/links``) keeps, per link
   target, one cell per linking document with its anchor texts, and the count of linking
   documents, in ``doc_inlinks``; it remembers what it applied in
   ``documents/links_applied`` to undo it when the links change.

The exact contents of every derived table are specified in reference.py, which
also recomputes them from scratch; the tests check both agree byte for byte, also after
workers were killed at random moments.

Concurrency: every read-modify-write of shared state (a cluster's members, a target's
count) is inside the observer's transaction, so snapshot isolation turns concurrent updates
of the same cluster or target into write-write conflicts (one run retries), never lost
updates.  Cluster membership and canonical are always written together with ``members``,
which every membership change writes, so two documents joining one cluster conflict.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from percolator.observers.api import Observer

from docpipeline.reference import (
    CLUSTERS,
    DOCUMENTS,
    FROM_PREFIX,
    INDEX,
    INLINKS,
    anchors_by_target,
    check_url,
    encode_members,
    fingerprint,
    links,
    parse_members,
    parse_terms,
    terms,
)
from percolator.transaction import Transaction

if TYPE_CHECKING:
    from percolator.client import Client

TABLES = (DOCUMENTS, CLUSTERS, INDEX, INLINKS)


def create_tables(client: Client) -> None:
    """Create the pipeline's tables (idempotent)."""
    for table in TABLES:
        client.create_table(table)


class _PipelineObserver(Observer):
    def setup(self, client: Client) -> None:
        create_tables(client)


class DuplicateClusters(_PipelineObserver):
    """Duplicate clusters by content fingerprint, with a canonical document each."""

    name = "doc-clusters"
    table = DOCUMENTS
    columns = ("body",)
    reads = ("fingerprint",)

    def process(self, txn: Transaction, row: bytes, column: str) -> None:
        check_url(row)
        body = txn.get(DOCUMENTS, row, "body")
        old = txn.get(DOCUMENTS, row, "fingerprint")
        new = fingerprint(body) if body is not None else None
        if old is not None and old != new:
            self._leave(txn, old, row)
        if new is not None and body is not None:
            self._join(txn, new, row, body)
            if old != new:
                txn.set(DOCUMENTS, row, "fingerprint", new)
        elif old is not None:
            txn.delete(DOCUMENTS, row, "fingerprint")

    @staticmethod
    def _join(txn: Transaction, fp: bytes, url: bytes, body: bytes) -> None:
        cluster = txn.get_row(CLUSTERS, fp, ["members", "canonical"])
        members = parse_members(cluster.get("members"))
        if url in members:
            return
        if not members:
            txn.set(CLUSTERS, fp, "terms", terms(body))
        members.append(url)
        txn.set(CLUSTERS, fp, "members", encode_members(members))
        canonical = min(members)
        if cluster.get("canonical") != canonical:
            txn.set(CLUSTERS, fp, "canonical", canonical)

    @staticmethod
    def _leave(txn: Transaction, fp: bytes, url: bytes) -> None:
        cluster = txn.get_row(CLUSTERS, fp, ["members", "canonical"])
        members = [m for m in parse_members(cluster.get("members")) if m != url]
        if not members:
            for column in ("members", "canonical", "terms"):
                txn.delete(CLUSTERS, fp, column)
            return
        txn.set(CLUSTERS, fp, "members", encode_members(members))
        canonical = min(members)
        if cluster.get("canonical") != canonical:
            txn.set(CLUSTERS, fp, "canonical", canonical)


class CanonicalIndex(_PipelineObserver):
    """Inverted index of canonical documents:
    ``doc_index[token][fingerprint] = canonical URL + "\t" + count``."""

    name = "doc-index"
    table = CLUSTERS
    columns = ("canonical",)
    reads = ("terms", "indexed")

    def process(self, txn: Transaction, row: bytes, column: str) -> None:
        cluster = txn.get_row(CLUSTERS, row, ["canonical", "terms", "indexed"])
        canonical = cluster.get("canonical")
        indexed = cluster.get("indexed")
        wanted = None
        if canonical is not None:
            wanted = canonical + b"\n" + cluster.get("terms", b"")
        if indexed == wanted:
            return
        posting_column = row.decode("ascii")
        if indexed is not None:
            _, _, old_terms = indexed.partition(b"\n")
            for token, _count in parse_terms(old_terms):
                txn.delete(INDEX, token, posting_column)
        if canonical is not None and wanted is not None:
            # Later writes of the same cell replace the deletes above.
            for token, count in parse_terms(cluster.get("terms", b"")):
                txn.set(INDEX, token, posting_column, canonical + b"\t" + count)
            txn.set(CLUSTERS, row, "indexed", wanted)
        else:
            txn.delete(CLUSTERS, row, "indexed")


class InboundLinks(_PipelineObserver):
    """Inbound links per target: anchors per linking document, and their count."""

    name = "doc-inlinks"
    table = DOCUMENTS
    columns = ("links",)
    reads = ("links_applied",)

    def process(self, txn: Transaction, row: bytes, column: str) -> None:
        source = check_url(row)
        new_text = links(txn.get(DOCUMENTS, row, "links"))
        old_text = txn.get(DOCUMENTS, row, "links_applied") or b""
        if new_text == old_text:
            return
        new, old = anchors_by_target(new_text), anchors_by_target(old_text)
        column_name = FROM_PREFIX + source
        for target in sorted(old.keys() | new.keys()):
            before, after = old.get(target), new.get(target)
            if before == after:
                continue
            if after is None:
                txn.delete(INLINKS, target, column_name)
                delta = -1
            else:
                txn.set(INLINKS, target, column_name, after)
                delta = 1 if before is None else 0
            if delta:
                count = int(txn.get(INLINKS, target, "count") or b"0") + delta
                if count > 0:
                    txn.set(INLINKS, target, "count", str(count).encode())
                else:
                    txn.delete(INLINKS, target, "count")
        if new_text:
            txn.set(DOCUMENTS, row, "links_applied", new_text)
        else:
            txn.delete(DOCUMENTS, row, "links_applied")


def observers() -> list[Observer]:
    """The pipeline's three observers (what the entry points name)."""
    return [DuplicateClusters(), CanonicalIndex(), InboundLinks()]

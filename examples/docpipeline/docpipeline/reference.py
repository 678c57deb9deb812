"""The example pipeline's derived tables, computed from scratch, and their exact encoding.

The incremental observers (pipeline.py) must leave the derived tables exactly equal,
byte for byte, to :func:`compute` over the same documents.  Any other implementation (a Spark
recompute, say) reproduces them by following this specification.

Input: table ``documents``
--------------------------
Row key: the document's URL, UTF-8.  A valid URL is non-empty, at most 1000 bytes, contains
no ``\\t``, ``\\n`` or ``\\r``, and does not start with ``!``.

* ``body``: the text, UTF-8.
* ``links``: the outgoing links, UTF-8, one per line (lines separated by ``\\n``): the target
  URL, a ``\\t``, the anchor text.  A line without ``\\t`` is a target with an empty anchor.
  Lines whose target is empty, or not a valid URL, are ignored; so is a trailing ``\\r``.

Derived values
--------------
Everything below is bytes; "text" means UTF-8, integers are ASCII decimal without sign or
leading zeros, "sorted" means by unsigned bytes of the UTF-8 encoding, lists are joined with
``\\n`` and have no trailing newline.

*tokens(body)*: ASCII-lowercase the body's bytes (``A``-``Z`` -> ``a``-``z``, every other byte
unchanged), then take the maximal runs of bytes in ``[a-z0-9]``, in order.  Every other
byte (punctuation, whitespace, any byte of a non-ASCII character) separates tokens.

*fingerprint(body)*: the lowercase hex SHA-256 of the tokens joined by single spaces (64
ASCII characters).  Documents with equal fingerprints are duplicates (one cluster).

*terms(body)*: one line per distinct token, sorted: ``token \\t count`` (occurrences).

*links(doc)*: the distinct ``(target, anchor)`` pairs of the document's valid link lines,
sorted by target, then anchor, each written ``target \\t anchor``.

Documents with a ``body`` (the cluster observer) and documents with ``links`` (the link
observer) are processed independently; a document with neither contributes nothing.

====================  ===========================  ==========================================
table / row           column                       value
====================  ===========================  ==========================================
``documents`` / URL   ``fingerprint``              fingerprint(body) (only if body present)
``documents`` / URL   ``links_applied``            links(doc) (only if non-empty)
``doc_clusters`` / F  ``members``                  sorted URLs of the documents whose
                                                   fingerprint is F
``doc_clusters`` / F  ``canonical``                the first of those URLs (sorted)
``doc_clusters`` / F  ``terms``                    terms(body) of the members (equal for all)
``doc_clusters`` / F  ``indexed``                  canonical + ``\\n`` + terms
``doc_index`` / tok   F (a cluster's fingerprint)  canonical + ``\\t`` + count of the token
                                                   tok in it (one cell per token of terms)
``doc_inlinks`` / T   ``from:`` + source URL       sorted distinct anchors of the links from
                                                   source to T, joined with ``\\n``
``doc_inlinks`` / T   ``count``                    number of distinct sources linking to T
====================  ===========================  ==========================================

F is the fingerprint as ASCII; tok a token; T a link target's URL.  Only canonical
documents are indexed: a posting belongs to a cluster and names the cluster's canonical
document, so a document moving between clusters never disturbs another cluster's postings.
Rows and cells not listed do not exist (a cluster with no members has no row at all).
Observer acknowledgements (reserved ``!`` columns) are not part of the derived tables.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from percolator.errors import InvalidArgumentError

if TYPE_CHECKING:
    from percolator.transaction import Snapshot

DOCUMENTS = "documents"
CLUSTERS = "doc_clusters"
INDEX = "doc_index"
INLINKS = "doc_inlinks"
DERIVED_TABLES = (CLUSTERS, INDEX, INLINKS)
#: columns of ``documents`` written by the observers (the rest is input)
DERIVED_DOCUMENT_COLUMNS = ("fingerprint", "links_applied")
INPUT_COLUMNS = ("body", "links")
FROM_PREFIX = "from:"

# table -> row -> column -> value
Tables = dict[str, dict[bytes, dict[str, bytes]]]

_TOKEN = re.compile(rb"[a-z0-9]+")
# "from:" + URL must fit a column name (1024 bytes).
_MAX_URL_BYTES = 1000


# --------------------------------------------------------------------------- pure functions


def is_valid_url(url: bytes) -> bool:
    return (
        0 < len(url) <= _MAX_URL_BYTES
        and not url.startswith(b"!")
        and not any(c in url for c in (b"\t", b"\n", b"\r"))
        and _is_utf8(url)
    )


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def check_url(url: bytes) -> str:
    """The URL as str; raises InvalidArgumentError for an invalid document URL."""
    if not is_valid_url(url):
        raise InvalidArgumentError(
            f"document URL {url[:100]!r} is invalid: it must be 1..{_MAX_URL_BYTES} bytes of "
            "UTF-8 without tab, CR or newline, not starting with '!'"
        )
    return url.decode("utf-8")


def tokens(body: bytes) -> list[bytes]:
    return _TOKEN.findall(body.lower())  # bytes.lower() changes only A-Z


def fingerprint(body: bytes) -> bytes:
    return hashlib.sha256(b" ".join(tokens(body))).hexdigest().encode("ascii")


def terms(body: bytes) -> bytes:
    counts = Counter(tokens(body))
    return b"\n".join(t + b"\t" + str(counts[t]).encode() for t in sorted(counts))


def parse_terms(text: bytes) -> list[tuple[bytes, bytes]]:
    """``[(token, count)]`` of a terms value."""
    if not text:
        return []
    pairs = []
    for line in text.split(b"\n"):
        token, _, count = line.partition(b"\t")
        pairs.append((token, count))
    return pairs


def links(value: bytes | None) -> bytes:
    """The normalized links of a ``links`` input value (empty: no valid link)."""
    if value is None:
        return b""
    pairs = set()
    for line in value.split(b"\n"):
        if line.endswith(b"\r"):
            line = line[:-1]
        target, _, anchor = line.partition(b"\t")
        if target and is_valid_url(target) and _is_utf8(anchor):
            pairs.add((target, anchor))
    return b"\n".join(t + b"\t" + a for t, a in sorted(pairs))


def anchors_by_target(normalized: bytes | None) -> dict[bytes, bytes]:
    """``{target: anchors value}`` of normalized links (anchors sorted, ``\\n``-joined)."""
    grouped: dict[bytes, list[bytes]] = defaultdict(list)
    if normalized:
        for line in normalized.split(b"\n"):
            target, _, anchor = line.partition(b"\t")
            grouped[target].append(anchor)  # already sorted and distinct
    return {target: b"\n".join(anchors) for target, anchors in grouped.items()}


def parse_members(value: bytes | None) -> list[bytes]:
    return value.split(b"\n") if value else []


def encode_members(urls: Iterable[bytes]) -> bytes:
    return b"\n".join(sorted(set(urls)))


# --------------------------------------------------------------------------- recompute


def compute(documents: Mapping[bytes, Mapping[str, bytes]]) -> Tables:
    """The derived tables of ``documents`` (URL -> input columns), from scratch.

    The ``documents`` entry of the result holds only the derived columns."""
    out: Tables = {DOCUMENTS: {}, CLUSTERS: {}, INDEX: {}, INLINKS: {}}
    clusters: dict[bytes, list[bytes]] = defaultdict(list)
    bodies: dict[bytes, bytes] = {}
    inbound: dict[bytes, dict[str, bytes]] = defaultdict(dict)
    for url, columns in documents.items():
        source = check_url(url)
        body = columns.get("body")
        if body is not None:
            fp = fingerprint(body)
            clusters[fp].append(url)
            bodies[fp] = body
            out[DOCUMENTS].setdefault(url, {})["fingerprint"] = fp
        normalized = links(columns.get("links"))
        if normalized:
            out[DOCUMENTS].setdefault(url, {})["links_applied"] = normalized
            for target, anchors in anchors_by_target(normalized).items():
                inbound[target][FROM_PREFIX + source] = anchors
    for fp, members in clusters.items():
        canonical = min(members)
        cluster_terms = terms(bodies[fp])
        out[CLUSTERS][fp] = {
            "members": encode_members(members),
            "canonical": canonical,
            "terms": cluster_terms,
            "indexed": canonical + b"\n" + cluster_terms,
        }
        for token, count in parse_terms(cluster_terms):
            out[INDEX].setdefault(token, {})[fp.decode("ascii")] = canonical + b"\t" + count
    for target, sources in inbound.items():
        out[INLINKS][target] = {**sources, "count": str(len(sources)).encode()}
    return out


# --------------------------------------------------------------------------- reading


def read_documents(snapshot: Snapshot) -> dict[bytes, dict[str, bytes]]:
    """The input columns of every document, as of ``snapshot``."""
    return {row: cells for row, cells in snapshot.scan(DOCUMENTS, columns=list(INPUT_COLUMNS))}


def read_derived(snapshot: Snapshot) -> Tables:
    """The derived tables as stored, as of ``snapshot`` (same shape as :func:`compute`)."""
    out: Tables = {
        DOCUMENTS: dict(snapshot.scan(DOCUMENTS, columns=list(DERIVED_DOCUMENT_COLUMNS)))
    }
    for table in DERIVED_TABLES:
        out[table] = dict(snapshot.scan(table))
    return out


def diff(expected: Tables, actual: Tables, *, limit: int = 20) -> list[str]:
    """Human-readable differences (empty: equal byte for byte)."""
    problems = []
    for table in sorted(set(expected) | set(actual)):
        want, got = expected.get(table, {}), actual.get(table, {})
        for row in sorted(set(want) | set(got)):
            a, b = want.get(row, {}), got.get(row, {})
            for column in sorted(set(a) | set(b)):
                if a.get(column) != b.get(column):
                    problems.append(
                        f"{table}/{row!r}/{column}: expected {a.get(column)!r}, "
                        f"stored {b.get(column)!r}"
                    )
                    if len(problems) >= limit:
                        return problems
    return problems

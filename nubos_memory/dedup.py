"""Duplicate detection: an exact content fingerprint and a near-duplicate cosine.

* The *fingerprint* of a record is a hash of the set of its terms (title and
  body, the package tokenizer: case-folded, stop words dropped): case, stop
  words, word order and repeats do not change it.  Re-logging the same
  learning therefore maps to the record already stored, and nothing is
  embedded.  Candidates are found through the postings of the record's rarest
  term, so the check costs a handful of fingerprints, not one per record.
* A *near duplicate* is a live record whose vector has a cosine of at least
  ``memory.near_duplicate`` with the new one's (default 0.90 for the packaged
  model; the data it was chosen on: adr/0009).  It is reported as
  ``duplicate_of`` instead of being stored, unless the writer insists
  (``--force``).
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

import numpy as np

from .tokenize import tokenize

if TYPE_CHECKING:
    from .lexical import PostingsBM25
    from .recordlog import LogScan
    from .vector_index import VectorIndex



def content_terms(record: dict[str, Any]) -> frozenset[str]:
    return frozenset(tokenize(f"{record['title']}\n{record.get('body') or ''}"))


def fingerprint(record: dict[str, Any]) -> str:
    """The content fingerprint (see module docstring)."""
    terms = content_terms(record)
    if terms:
        basis = "\x1f".join(sorted(terms))
    else:  # only stop words or punctuation: fall back to the case-folded, space-normalised text
        basis = " ".join(f"{record['title']} {record.get('body') or ''}".casefold().split())
    return hashlib.sha256(basis.encode("utf-8")).hexdigest()[:32]


def find_exact(record: dict[str, Any], scan: "LogScan", lexical: "PostingsBM25", alive: np.ndarray) -> int | None:
    """The position of a live record with the same fingerprint, if any."""
    terms = content_terms(record)
    if not terms:
        return None
    rarest = min(terms, key=lexical.document_frequency)
    if lexical.document_frequency(rarest) <= 0:
        return None  # a term no live record holds: nothing can match
    want = fingerprint(record)
    for pos in lexical.postings(rarest).tolist():
        if pos < len(alive) and alive[pos] and fingerprint(scan.records[pos]) == want:
            return pos
    return None


def nearest(vectors: np.ndarray, index: "VectorIndex | None", allowed: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """For each vector, the label of the most similar allowed row of ``index`` and its cosine
    (-1 and -inf when there is none)."""
    labels = np.full(len(vectors), -1, dtype=np.int64)
    sims = np.full(len(vectors), -np.inf, dtype=np.float32)
    if index is None or not len(index) or (allowed is not None and not len(allowed)):
        return labels, sims
    for i, vec in enumerate(vectors):
        top_labels, top_sims = index.top(vec, 1, allowed)
        if len(top_labels):
            labels[i], sims[i] = top_labels[0], top_sims[0]
    return labels, sims


def within_batch(vectors: np.ndarray, keep: np.ndarray, threshold: float) -> list[tuple[int, int, float]]:
    """Greedy, in batch order: ``(i, j, cosine)`` for each kept vector i that is a near duplicate
    of an earlier kept vector j; i is then no longer kept (``keep`` is updated)."""
    found = []
    block = 1024
    for a in range(0, len(vectors), block):
        b = min(a + block, len(vectors))
        sims = vectors[a:b] @ vectors[:b].T
        for i in range(a, b):
            if not keep[i] or i == 0:
                continue
            row = np.where(keep[:i], sims[i - a, :i], -np.inf)
            j = int(np.argmax(row))
            if row[j] >= threshold:
                keep[i] = False
                found.append((i, j, float(row[j])))
    return found

"""Lexical scoring: BM25 over title, body and tags, behind a small interface.

The scores' definition is fixed (and pinned by tests) so the engine can
change without moving them::

    score(q, d) = Σ_{t ∈ set(q)} idf(t) · tf(t,d)·(k1+1) / (tf(t,d) + k1·(1 − b + b·|d|/avgdl))
    idf(t)      = ln(1 + (N − n(t) + 0.5) / (n(t) + 0.5))        k1 = 1.5, b = 0.75

This is rank-bm25's ``BM25Okapi`` with the Lucene idf (``tests/bm25_reference.py`` holds
rank-bm25 itself as the reference the tests compare against; it is a test dependency only).  ``self_score(q)`` is
what the query itself would score as a document of average length,
``Σ_{t ∈ set(q), idf(t) > 0} idf(t) · c(t)·(k1+1) / (c(t) + k1)`` with ``c(t)``
the term's count in the query; fusion normalises by it (see ``fusion.py``).  rank-bm25's own idf,
``ln((N − n + 0.5)/(n + 0.5))`` floored at ε·mean, goes negative for a term in
more than half of the documents, so in a small memory the record that
contains the query's words can score *below* zero; the Lucene form is always
positive and keeps rare terms ranked first.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from .. import scratch

K1 = 1.5
B = 0.75
KEPT_BYTES = 16 << 20  # a warm process keeps the scored postings of recent terms, at most this much


class LexicalScorer(Protocol):
    """What the query path needs from a lexical engine."""

    def scores(self, terms: Sequence[str]) -> np.ndarray:
        """Raw BM25 score of every document for the (deduplicated) query terms."""

    def idf(self, term: str) -> float:
        """The term's idf; 0 for a term no document contains."""

    def self_score(self, terms: Sequence[str]) -> float:
        """The query's BM25 score against itself as a document of average length."""


def self_score(idf: Callable[[str], float], terms: Sequence[str]) -> float:
    """``Σ idf(t)·c(k1+1)/(c+k1)`` over the distinct terms (see module docstring)."""
    counts: dict[str, int] = {}
    for t in terms:
        counts[t] = counts.get(t, 0) + 1
    return sum(idf(t) * c * (K1 + 1) / (c + K1) for t, c in counts.items())


class SharedStatistics:
    """One BM25 statistic over several indexes (the project's and the user's memory, ``search/fused.py``):
    the document count, each term's document frequency and the average length are those of all of them
    together, so each index scores its documents exactly as one index holding every document would."""

    def __init__(self, engines: "Sequence[PostingsBM25]"):
        self.engines = list(engines)
        self._df: dict[str, int] = {}

    def live(self) -> int:
        return sum(e.live for e in self.engines)

    def df(self, term: str) -> int:
        found = self._df.get(term)
        if found is None:
            found = self._df[term] = sum(e.document_frequency(term) for e in self.engines)
        return found

    def avgdl(self) -> float:
        live = self.live()
        return (sum(e.live_length() for e in self.engines) / live or 1.0) if live else 1.0


def _nbytes(parts: list[tuple[slice | np.ndarray, np.ndarray]]) -> int:
    """What a term's kept parts hold: the scores, and the document ids a part owns (the delta's: the base's
    are views of the postings)."""
    return sum(part.nbytes + (run.nbytes if isinstance(run, np.ndarray) and run.base is None else 0)
               for run, part in parts)


class PostingsBM25:
    """The same BM25 from an inverted index held in numpy arrays (CSR postings).

    Scoring touches only the postings of the query's terms, so it costs
    milliseconds at 100k records where rank-bm25, which loops over every
    document for every term, costs hundreds (adr/0005).  The postings are a
    frozen CSR *base* plus a small *delta* of documents appended since, kept
    in lists; when the delta outgrows ``MERGE_FRACTION`` of the base it is
    merged in, with numpy, so appends never rebuild the index term by term.
    Only raw term frequencies and lengths are stored: idf and the average
    length are taken at query time, so appending never invalidates a score.
    ``remove`` takes a document out of the statistics (document count, df,
    average length) and out of the scores, so they equal those of an index
    built without it.  ``arrays``/``from_arrays`` persist it without pickle
    (``lexcache.py``).
    """

    MERGE_MIN = 1024
    MERGE_FRACTION = 0.05

    def __init__(self) -> None:
        self.vocab: dict[str, int] = {}
        self._indptr = np.zeros(1, dtype=np.int64)  # base: postings of term t at indptr[t]:indptr[t+1]
        self._docs = np.zeros(0, dtype=np.int32)
        self._tfs = np.zeros(0, dtype=np.float32)
        self._base_df = np.zeros(0, dtype=np.int64)
        self._delta: dict[int, tuple[list[int], list[int]]] = {}  # term id -> (docs, tfs) appended
        self._delta_docs = 0
        self.doc_len = np.zeros(0, dtype=np.float64)
        self._norm: np.ndarray | None = None  # k1·(1 − b + b·len/avgdl) for the current size ...
        self._norm_avgdl = 0.0  # ... and the average length it was made with (shared or not)
        self._length: float | None = None  # (``live_length``, made once per change of the documents)
        self.removed: set[int] = set()
        self._removed_df: dict[int, int] = {}  # term id -> removed documents holding it
        self._removed_len = 0.0
        self.shared: SharedStatistics | None = None  # scoring under several indexes' statistic (``share``)
        # Each recent term's scored postings, ``idf·tf·(k1+1) / (tf + norm)`` by part, under ``_kept_norm``
        # (the key holds the idf): the frequent terms of a project's queries are not scored again (issue 27)
        self._kept: OrderedDict[tuple[int, float], list[tuple[slice | np.ndarray, np.ndarray]]] = OrderedDict()
        self._kept_norm: np.ndarray | None = None
        self._kept_bytes = 0
        self._kept_lock = threading.Lock()

    def share(self, statistics: SharedStatistics | None) -> None:
        """Score with ``statistics`` (document count, df, average length) instead of this index's own, until
        called again with None."""
        self.shared = statistics  # (the norm follows the average length: ``scores``)

    def _changed(self) -> None:
        """The documents changed: every statistic made of them, and every score kept, is made again."""
        self._norm = self._length = None
        self._keep_for(None)

    def live_length(self) -> float:
        """The live documents' total length."""
        if self._length is None:
            self._length = float(self.doc_len.sum()) - self._removed_len
        return self._length

    @property
    def size(self) -> int:
        """Documents ever added (doc ids run 0..size-1), removed ones included."""
        return len(self.doc_len)

    @property
    def live(self) -> int:
        return self.size - len(self.removed)

    def remove(self, doc: int, tokens: Sequence[str]) -> None:
        """Take document ``doc`` (added with ``tokens``) out of every statistic and score."""
        if doc in self.removed or not 0 <= doc < self.size:
            return
        self.removed.add(doc)
        for tok in set(tokens):
            tid = self.vocab.get(tok)
            if tid is not None:
                self._removed_df[tid] = self._removed_df.get(tid, 0) + 1
        self._removed_len += float(self.doc_len[doc])
        self._changed()

    def add(self, docs: Sequence[Sequence[str]]) -> None:
        """Append tokenised documents (doc ids continue from ``size``)."""
        start = self.size
        lengths = np.empty(len(docs), dtype=np.float64)
        vocab, delta = self.vocab, self._delta
        for offset, tokens in enumerate(docs):
            lengths[offset] = len(tokens)
            counts: dict[str, int] = {}
            for tok in tokens:
                counts[tok] = counts.get(tok, 0) + 1
            for tok, tf in counts.items():
                tid = vocab.get(tok)
                if tid is None:
                    tid = vocab[tok] = len(vocab)
                entry = delta.get(tid)
                if entry is None:
                    entry = delta[tid] = ([], [])
                entry[0].append(start + offset)
                entry[1].append(tf)
        self.doc_len = np.concatenate([self.doc_len, lengths])
        self._delta_docs += len(docs)
        self._changed()
        if self._delta_docs > max(self.MERGE_MIN, self.MERGE_FRACTION * (self.size - self._delta_docs)):
            self.merge()

    def merge(self) -> None:
        """Fold the delta into the CSR base (vectorised; O(postings))."""
        if not self._delta:
            self._delta_docs = 0
            return
        n_terms = len(self.vocab)
        old_terms = len(self._indptr) - 1
        base_counts = np.zeros(n_terms, dtype=np.int64)
        base_counts[:old_terms] = np.diff(self._indptr)
        delta_counts = np.zeros(n_terms, dtype=np.int64)
        for tid, (d, _) in self._delta.items():
            delta_counts[tid] = len(d)
        indptr = np.zeros(n_terms + 1, dtype=np.int64)
        np.cumsum(base_counts + delta_counts, out=indptr[1:])
        docs = np.empty(int(indptr[-1]), dtype=np.int32)
        tfs = np.empty(int(indptr[-1]), dtype=np.float32)
        # Each base posting moves right by the delta postings of the terms before its own.
        shift = np.repeat(indptr[:old_terms] - self._indptr[:-1], base_counts[:old_terms])
        where = np.arange(len(self._docs), dtype=np.int64) + shift
        docs[where] = self._docs
        tfs[where] = self._tfs
        for tid, (d, t) in self._delta.items():  # delta docs are newer: they follow the base's
            at = int(indptr[tid] + base_counts[tid])
            docs[at:at + len(d)] = d
            tfs[at:at + len(t)] = t
        self._indptr, self._docs, self._tfs = indptr, docs, tfs
        self._base_df = base_counts + delta_counts
        self._delta, self._delta_docs = {}, 0
        self._keep_for(None)  # (what is kept holds views of the postings merged away)

    def _df(self, tid: int) -> int:
        base = int(self._base_df[tid]) if tid < len(self._base_df) else 0
        extra = self._delta.get(tid)
        return base + (len(extra[0]) if extra else 0) - self._removed_df.get(tid, 0)

    def document_frequency(self, term: str) -> int:
        """Live documents holding ``term``."""
        tid = self.vocab.get(term)
        return 0 if tid is None else self._df(tid)

    def _parts(self, tid: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """A term's postings as ``(doc ids, term frequencies)``: the base's, then the delta's."""
        parts = []
        if tid < len(self._indptr) - 1:
            lo, hi = self._indptr[tid], self._indptr[tid + 1]
            parts.append((self._docs[lo:hi], self._tfs[lo:hi]))
        extra = self._delta.get(tid)
        if extra:
            parts.append((np.asarray(extra[0], dtype=np.int64), np.asarray(extra[1], dtype=np.float32)))
        return parts

    def postings(self, term: str) -> np.ndarray:
        """Ids of the documents holding ``term`` (removed ones included)."""
        tid = self.vocab.get(term)
        parts = [] if tid is None else [docs.astype(np.int64) for docs, _ in self._parts(tid)]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def idf(self, term: str) -> float:
        if self.shared is not None:  # the statistic of every index shared with (a term only another holds too)
            df, live = self.shared.df(term), self.shared.live()
            return math.log(1.0 + (live - df + 0.5) / (df + 0.5)) if df > 0 and live else 0.0
        tid = self.vocab.get(term)
        if tid is None or not self.live:
            return 0.0
        df = self._df(tid)
        if df <= 0:
            return 0.0  # only removed documents held it
        return math.log(1.0 + (self.live - df + 0.5) / (df + 0.5))

    def idf_all(self, term: str) -> float:
        """The term's idf over every document ever added, removed ones included (an as-of query)."""
        tid = self.vocab.get(term)
        if tid is None:
            return 0.0
        df = self._df(tid) + self._removed_df.get(tid, 0)
        return math.log(1.0 + (self.size - df + 0.5) / (df + 0.5))

    def self_score(self, terms: Sequence[str], *, removed_too: bool = False) -> float:
        return self_score(self.idf_all if removed_too else self.idf, terms)

    def avgdl(self) -> float:
        """The live documents' average length (1 when there are none, or all are empty)."""
        if self.shared is not None:
            return self.shared.avgdl()
        return (self.live_length() / self.live or 1.0) if self.live else 1.0

    def score_tokens(self, terms: Sequence[str], tokens: Sequence[str]) -> float:
        """BM25 of a document that is not in the index (``tokens``) under the live statistics: what
        :meth:`scores` would give it (same terms, same order of sums; ``search/sideweight.py``)."""
        counts: dict[str, int] = {}
        for tok in tokens:
            counts[tok] = counts.get(tok, 0) + 1
        norm = K1 * (1.0 - B + B * len(tokens) / self.avgdl())
        total = 0.0
        for term in dict.fromkeys(terms):
            tf = counts.get(term)
            if tf and term in self.vocab:
                total += self.idf(term) * tf * (K1 + 1.0) / (tf + norm)
        return total

    def scores(self, terms: Sequence[str], *, removed_too: bool = False, keep: bool = True) -> np.ndarray:
        """Raw BM25 of every document; ``removed_too``: removed documents keep theirs, every score
        taken with the statistics of every document ever added (an as-of query ranks records
        retired since, whose terms the live statistics may no longer know).  ``keep``: the terms'
        scored postings are kept for the next query (not for a side-weight estimate's pseudo-queries)."""
        out = np.zeros(self.size, dtype=np.float64)
        if not (self.size if removed_too else self.live):
            return out
        norm = K1 * (1.0 - B + B * self.doc_len / (float(self.doc_len.mean()) or 1.0)) if removed_too \
            else self._current_norm()
        keep = keep and not removed_too
        if not removed_too:
            self._keep_for(norm)
        for term in dict.fromkeys(terms):
            tid = self.vocab.get(term)
            if tid is None:
                continue
            idf = self.idf_all(term) if removed_too else self.idf(term)
            kept = None if removed_too else self._kept_parts((tid, idf))  # (a term kept: its scores as made)
            if kept is not None:
                for run, part in kept:
                    out[run] += part
            else:
                made = self._add_term(out, tid, idf, norm, keep)
                if keep:
                    self._keep((tid, idf), made, norm)
        if self.removed and not removed_too:
            out[np.fromiter(self.removed, dtype=np.int64, count=len(self.removed))] = 0.0
        return out

    def _current_norm(self) -> np.ndarray:
        """``k1·(1 − b + b·len/avgdl)`` of every document under the live (or shared) statistic, made again only
        when the average length changed (so queries under one shared statistic after another keep theirs)."""
        avgdl = self.avgdl()
        if self._norm is None or self._norm_avgdl != avgdl:
            self._norm, self._norm_avgdl = K1 * (1.0 - B + B * self.doc_len / avgdl), avgdl
        return self._norm

    def _add_term(self, out: np.ndarray, tid: int, idf: float, norm: np.ndarray, keep: bool
                  ) -> list[tuple[slice | np.ndarray, np.ndarray]]:
        """Add one term's ``idf·tf·(k1+1) / (tf + norm)`` to ``out``; with ``keep``, its parts as added."""
        made = []
        for docs, tf32 in self._parts(tid):
            # in place (the same operations in the same order: the same bits); a term in a run of
            # consecutive documents (one in most of them) skips the gathers
            run = slice(int(docs[0]), int(docs[-1]) + 1) if len(docs) and docs[-1] - docs[0] == len(docs) - 1 \
                else docs  # (a term's documents are distinct and in order)
            tf, part = scratch.floats(len(docs))
            tf[...] = tf32
            np.multiply(tf, idf, out=part)
            part *= K1 + 1.0
            np.add(norm[run], tf, out=tf)  # the denominator, where tf was
            part /= tf
            out[run] += part
            if keep:
                made.append((run, part.copy()))
        return made

    def _keep_for(self, norm: np.ndarray | None) -> None:
        """Forget the kept scores unless they were made under ``norm`` (a document added or removed, another
        average length, the postings merged: another norm, or None)."""
        with self._kept_lock:
            if self._kept_norm is not norm or norm is None:
                self._kept.clear()
                self._kept_bytes = 0
                self._kept_norm = norm

    def _kept_parts(self, key: tuple[int, float]) -> list[tuple[slice | np.ndarray, np.ndarray]] | None:
        with self._kept_lock:
            found = self._kept.get(key)
            if found is not None:
                self._kept.move_to_end(key)
            return found

    def _keep(self, key: tuple[int, float], parts: list[tuple[slice | np.ndarray, np.ndarray]],
              norm: np.ndarray) -> None:
        """Keep a term's scored postings (made under ``norm``), the least recently used going first."""
        size = _nbytes(parts)
        if size > KEPT_BYTES // 8:
            return  # (a term in most of a million documents: kept, it would push out every other)
        with self._kept_lock:
            if self._kept_norm is not norm or key in self._kept:
                return  # (the documents changed meanwhile, or another thread kept it)
            self._kept[key] = parts
            self._kept_bytes += size
            while self._kept_bytes > KEPT_BYTES:
                _, gone = self._kept.popitem(last=False)
                self._kept_bytes -= _nbytes(gone)

    # -- persistence as plain arrays (no pickle) -----------------------------------
    def arrays(self) -> tuple[list[str], dict[str, np.ndarray]]:
        """The vocabulary (in term-id order) and the numpy arrays that rebuild this index."""
        self.merge()
        terms = [""] * len(self.vocab)
        for term, tid in self.vocab.items():
            terms[tid] = term
        removed_df = np.zeros(len(self.vocab), dtype=np.int32)
        for tid, n in self._removed_df.items():
            removed_df[tid] = n
        return terms, {"indptr": self._indptr, "docs": self._docs, "tfs": self._tfs,
                       "df": self._base_df.astype(np.int32), "doc_len": self.doc_len,
                       "removed": np.array(sorted(self.removed), dtype=np.int64), "removed_df": removed_df}

    @classmethod
    def from_arrays(cls, terms: list[str], arrays: dict[str, np.ndarray]) -> "PostingsBM25":
        self = cls()
        self.vocab = {t: i for i, t in enumerate(terms)}
        self._indptr = np.asarray(arrays["indptr"], dtype=np.int64)
        self._docs = np.asarray(arrays["docs"], dtype=np.int32)
        self._tfs = np.asarray(arrays["tfs"], dtype=np.float32)
        self._base_df = np.diff(self._indptr)
        self.doc_len = np.asarray(arrays["doc_len"], dtype=np.float64)
        removed = arrays.get("removed")
        if removed is not None and len(removed):
            self.removed = {int(d) for d in removed}
            self._removed_df = {int(t): int(n) for t, n in enumerate(arrays["removed_df"]) if n}
            self._removed_len = float(self.doc_len[np.asarray(removed, dtype=np.int64)].sum())
        return self

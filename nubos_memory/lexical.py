"""Lexical scoring: BM25 over title, body and tags, behind a small interface.

The scores' definition is fixed (and pinned by tests) so the engine can
change without moving them::

    score(q, d) = Σ_{t ∈ set(q)} idf(t) · tf(t,d)·(k1+1) / (tf(t,d) + k1·(1 − b + b·|d|/avgdl))
    idf(t)      = ln(1 + (N − n(t) + 0.5) / (n(t) + 0.5))        k1 = 1.5, b = 0.75

This is rank-bm25's ``BM25Okapi`` with the Lucene idf.  ``self_score(q)`` is
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
from typing import Protocol, Sequence

import numpy as np

K1 = 1.5
B = 0.75


class LexicalScorer(Protocol):
    """What the query path needs from a lexical engine."""

    def scores(self, terms: Sequence[str]) -> np.ndarray:
        """Raw BM25 score of every document for the (deduplicated) query terms."""

    def idf(self, term: str) -> float:
        """The term's idf; 0 for a term no document contains."""

    def self_score(self, terms: Sequence[str]) -> float:
        """The query's BM25 score against itself as a document of average length."""


def self_score(idf, terms: Sequence[str]) -> float:
    """``Σ idf(t)·c(k1+1)/(c+k1)`` over the distinct terms (see module docstring)."""
    counts: dict[str, int] = {}
    for t in terms:
        counts[t] = counts.get(t, 0) + 1
    return sum(idf(t) * c * (K1 + 1) / (c + K1) for t, c in counts.items())


def _make_bm25(corpus: list[list[str]]):  # imported lazily: rank_bm25 is not needed by light verbs
    from rank_bm25 import BM25Okapi

    class LuceneIdfBM25(BM25Okapi):
        def _calc_idf(self, nd: dict[str, int]) -> None:
            n = self.corpus_size
            self.idf = {t: math.log(1.0 + (n - df + 0.5) / (df + 0.5)) for t, df in nd.items()}

    return LuceneIdfBM25(corpus, k1=K1, b=B)


class RankBM25Scorer:
    """rank-bm25 over pre-tokenised documents."""

    def __init__(self, docs: list[list[str]]):
        self.size = len(docs)
        # rank-bm25 divides by the corpus size; an empty corpus scores nothing.
        self._bm25 = _make_bm25(docs) if docs else None

    def idf(self, term: str) -> float:
        return 0.0 if self._bm25 is None else float(self._bm25.idf.get(term, 0.0))

    def scores(self, terms: Sequence[str]) -> np.ndarray:
        unique = [t for t in dict.fromkeys(terms) if self.idf(t) > 0]
        if self._bm25 is None or not unique:
            return np.zeros(self.size, dtype=np.float64)
        return np.asarray(self._bm25.get_scores(unique), dtype=np.float64)

    def self_score(self, terms: Sequence[str]) -> float:
        return self_score(self.idf, terms)


class PostingsBM25:
    """The same BM25 from an inverted index held in numpy arrays (CSR postings).

    Scoring touches only the postings of the query's terms, so it costs
    milliseconds at 100k records where rank-bm25, which loops over every
    document for every term, costs hundreds.  ``add`` appends documents;
    ``arrays``/``from_arrays`` persist it without pickle (see ``lexcache.py``).
    """

    def __init__(self) -> None:
        self.vocab: dict[str, int] = {}
        self.df: list[int] = []
        self._post_docs: list[list[int]] = []
        self._post_tf: list[list[int]] = []
        self.doc_len = np.zeros(0, dtype=np.float64)
        self._frozen: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    @property
    def size(self) -> int:
        return int(len(self.doc_len))

    def add(self, docs: Sequence[Sequence[str]]) -> None:
        """Append tokenised documents (doc ids continue from ``size``)."""
        self._thaw()
        start = self.size
        lengths = np.empty(len(docs), dtype=np.float64)
        for offset, tokens in enumerate(docs):
            lengths[offset] = len(tokens)
            counts: dict[str, int] = {}
            for tok in tokens:
                counts[tok] = counts.get(tok, 0) + 1
            for tok, tf in counts.items():
                tid = self.vocab.get(tok)
                if tid is None:
                    tid = self.vocab[tok] = len(self.df)
                    self.df.append(0)
                    self._post_docs.append([])
                    self._post_tf.append([])
                self.df[tid] += 1
                self._post_docs[tid].append(start + offset)
                self._post_tf[tid].append(tf)
        self.doc_len = np.concatenate([self.doc_len, lengths])

    def _thaw(self) -> None:
        if self._frozen is None:
            return
        indptr, docs, tfs = self._frozen
        self._post_docs = [docs[indptr[i]:indptr[i + 1]].tolist() for i in range(len(indptr) - 1)]
        self._post_tf = [tfs[indptr[i]:indptr[i + 1]].tolist() for i in range(len(indptr) - 1)]
        self._frozen = None

    def _postings(self, tid: int) -> tuple[np.ndarray, np.ndarray]:
        if self._frozen is not None:
            indptr, docs, tfs = self._frozen
            return docs[indptr[tid]:indptr[tid + 1]], tfs[indptr[tid]:indptr[tid + 1]]
        return np.asarray(self._post_docs[tid], dtype=np.int64), np.asarray(self._post_tf[tid], dtype=np.float32)

    def idf(self, term: str) -> float:
        tid = self.vocab.get(term)
        if tid is None or not self.size:
            return 0.0
        df = self.df[tid]
        return math.log(1.0 + (self.size - df + 0.5) / (df + 0.5))

    def self_score(self, terms: Sequence[str]) -> float:
        return self_score(self.idf, terms)

    def scores(self, terms: Sequence[str]) -> np.ndarray:
        out = np.zeros(self.size, dtype=np.float64)
        if not self.size:
            return out
        avgdl = float(self.doc_len.mean()) or 1.0
        for term in dict.fromkeys(terms):
            tid = self.vocab.get(term)
            if tid is None:
                continue
            docs, tf = self._postings(tid)
            tf = tf.astype(np.float64)
            norm = K1 * (1.0 - B + B * self.doc_len[docs] / avgdl)
            out[docs] += self.idf(term) * tf * (K1 + 1.0) / (tf + norm)
        return out

    # -- persistence as plain arrays (no pickle) -----------------------------------
    def arrays(self) -> tuple[list[str], dict[str, np.ndarray]]:
        """The vocabulary (in term-id order) and the numpy arrays that rebuild this index."""
        if self._frozen is not None:
            indptr, docs, tfs = self._frozen
        else:
            lens = np.fromiter((len(p) for p in self._post_docs), dtype=np.int64, count=len(self._post_docs))
            indptr = np.zeros(len(lens) + 1, dtype=np.int64)
            np.cumsum(lens, out=indptr[1:])
            docs = np.fromiter((d for p in self._post_docs for d in p), dtype=np.int32, count=int(indptr[-1]))
            tfs = np.fromiter((t for p in self._post_tf for t in p), dtype=np.float32, count=int(indptr[-1]))
        terms = [""] * len(self.vocab)
        for term, tid in self.vocab.items():
            terms[tid] = term
        return terms, {"indptr": indptr, "docs": docs, "tfs": tfs, "df": np.asarray(self.df, dtype=np.int32),
                       "doc_len": self.doc_len}

    @classmethod
    def from_arrays(cls, terms: list[str], arrays: dict[str, np.ndarray]) -> "PostingsBM25":
        self = cls()
        self.vocab = {t: i for i, t in enumerate(terms)}
        self.df = arrays["df"].tolist()
        self.doc_len = np.asarray(arrays["doc_len"], dtype=np.float64)
        self._frozen = (arrays["indptr"], arrays["docs"], arrays["tfs"])
        return self

"""Lexical scoring: BM25 over title, body and tags, behind a small interface.

The scores' definition is fixed (and pinned by tests) so the engine can
change without moving them::

    score(q, d) = Σ_{t ∈ set(q)} idf(t) · tf(t,d)·(k1+1) / (tf(t,d) + k1·(1 − b + b·|d|/avgdl))
    idf(t)      = ln(1 + (N − n(t) + 0.5) / (n(t) + 0.5))        k1 = 1.5, b = 0.75

This is rank-bm25's ``BM25Okapi`` with the Lucene idf.  rank-bm25's own idf,
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

    def upper_bound(self, terms: Sequence[str]) -> float:
        """The most any document could score: Σ idf(t)·(k1+1) over distinct terms."""
        return sum(self.idf(t) for t in dict.fromkeys(terms)) * (K1 + 1)

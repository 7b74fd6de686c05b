"""rank-bm25 as the reference definition of our BM25 scores (adr/0005).

``PostingsBM25`` must give rank-bm25's ``BM25Okapi`` scores (k1 1.5, b 0.75) with the Lucene idf,
to 1e-9; the tests (and ``bench/bench_scale.py``) compare it with this.  rank-bm25 is a test
dependency only: the product never imports it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from nubos_memory.index.lexical import K1, B, self_score


def _make_bm25(corpus: list[list[str]]) -> Any:
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



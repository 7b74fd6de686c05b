"""Fusing the lexical and the vector signal into one ranking.

``alpha`` fusion (default)::

    score = α · norm(bm25) + (1 − α) · cosine      both signals exist
    score = norm(bm25)                              no vector for the record (absent, not zero)
    score = (1 − α) · cosine                        no shared term; kept only if cosine ≥ threshold

Both scores are exact for every candidate: a record outside one side's
top-N still gets its real BM25 score and its real cosine.  ``norm`` divides
by ``max(best, S(q))`` where ``best`` is the best BM25 score among the records
the filters allow and ``S(q)`` is the query's self-score (what the query
itself would score as a document of average length, ``lexical.py``): a strong
best match maps to 1.0, a weak best match is not inflated to 1.0 (see
adr/0002 for the SciFact numbers).

``rrf`` fusion: Σ 1/(k + rank) over the lists that hold the candidate, k=60.

``importance`` (a record's 0–1 weight, e.g. from a memory file's frontmatter)
multiplies the fused score by ``0.9 + 0.2·importance`` (1.0 when unset).  It is
applied after fusion and the threshold, so it never brings in a record that
fusion did not keep, and it can only swap two hits whose fused scores are
within a factor of 1.1/0.9 ≈ 1.22 of each other (adr/0009).
"""

from __future__ import annotations

from dataclasses import dataclass

RRF_K = 60
IMPORTANCE_SPAN = 0.2  # factor range: 1 ± span/2


def importance_factor(importance: float | None) -> float:
    """The bounded multiplier a record's importance applies to its fused score."""
    if importance is None:
        return 1.0
    return 1.0 - IMPORTANCE_SPAN / 2 + IMPORTANCE_SPAN * min(max(float(importance), 0.0), 1.0)


def bm25_normaliser(best: float, self_score: float) -> float:
    """The divisor that maps raw BM25 scores of one query into [0, 1]."""
    return max(best, self_score, 1e-12)


@dataclass
class Candidate:
    """One record's signals for a query (``cosine`` None = no vector: absent)."""

    position: int
    lexical_raw: float
    lexical_norm: float
    cosine: float | None
    lexical_rank: int | None = None
    vector_rank: int | None = None
    score: float = 0.0
    fused: float = 0.0  # the score before importance
    retrieval: str = "bm25"


def fuse_alpha(cands: list[Candidate], alpha: float, threshold: float) -> list[Candidate]:
    """Score candidates by α-fusion; drop vector-only ones under the threshold."""
    kept = []
    for c in cands:
        if c.cosine is None:
            if c.lexical_raw <= 0:
                continue
            c.score, c.retrieval = c.lexical_norm, "bm25"
        elif c.lexical_raw > 0:
            c.score, c.retrieval = alpha * c.lexical_norm + (1 - alpha) * c.cosine, "hybrid"
        elif c.cosine >= threshold:
            c.score, c.retrieval = (1 - alpha) * c.cosine, "vector"
        else:
            continue
        kept.append(c)
    return kept


def fuse_rrf(cands: list[Candidate], threshold: float, k: int = RRF_K) -> list[Candidate]:
    """Reciprocal-rank fusion over the lexical and vector candidate lists."""
    kept = []
    for c in cands:
        lex_rank = c.lexical_rank if c.lexical_raw > 0 else None
        vec_rank = c.vector_rank if c.cosine is not None else None
        if lex_rank is None and (vec_rank is None or c.cosine is None or c.cosine < threshold):
            continue
        c.score = (1.0 / (k + lex_rank) if lex_rank is not None else 0.0) + (
            1.0 / (k + vec_rank) if vec_rank is not None else 0.0)
        c.retrieval = "hybrid" if lex_rank and vec_rank else ("bm25" if lex_rank else "vector")
        kept.append(c)
    return kept

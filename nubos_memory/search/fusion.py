"""Fusing the lexical and the vector signal into one ranking.

``z`` fusion (default; adr/0002 has the data that chose it)::

    score = w · z(b') + (1 − w) · z(c')     both signals exist        (w = memory.alpha, 0.3)
    score = z(b')                          no vector for the record (absent, not zero)

``b'`` and ``c'`` are a record's BM25 and cosine with its neighbours' context
(``neighbours.py``), and ``z`` standardises each side by its mean and standard
deviation over the query's scope, so the two are on one scale whatever the
corpus: no per-corpus α, and a weak side spreads its scores thin instead of
drowning the strong one.  A candidate is admitted if it has a lexical score or
its cosine reaches the threshold.  The fused value is squashed into (0, 1) by
the logistic function for display (``squash``); the order is unchanged.

``alpha`` fusion (0.1's default, still available)::

    score = α · norm(bm25) + (1 − α) · cosine      both signals exist
    score = norm(bm25)                              no vector for the record (absent, not zero)
    score = (1 − α) · cosine                        no shared term; kept only if cosine ≥ threshold

where ``norm`` divides by ``max(best, S(q))``: ``best`` is the best BM25 score
among the records the filters allow and ``S(q)`` the query's self-score.

``rrf`` fusion: Σ 1/(k + rank) over the lists that hold the candidate, k=60.

Only ``z`` fuses the signals with their neighbours' context; ``alpha`` and
``rrf`` keep the plain ones (``uses_context``).  A query ranks by the rule
:func:`ranker` looks up: ``FUSIONS`` by the fusion's name, or ``ONE_SIGNAL``
when the query's mode ranks by one side alone (``lexical``, ``vector``).

Both scores are exact for every candidate: a record outside one side's top-N
still gets its real BM25 score and its real cosine.

``importance`` (a record's 0–1 weight, e.g. from a memory file's frontmatter)
multiplies the (positive) score by ``0.9 + 0.2·importance`` (1.0 when unset).
It is applied after fusion and admission, so it never brings in a record that
fusion did not keep, and it can only swap two hits whose scores are within a
factor of 1.1/0.9 ≈ 1.22 of each other (adr/0009).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .. import scratch

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


def zscore_stats(values: np.ndarray) -> tuple[float, float]:
    """Mean and standard deviation (floored, so a flat side cannot divide by zero)."""
    if len(values) == 0:
        return 0.0, 1.0
    mean = float(values.mean())
    if values.dtype != np.float64:
        return mean, max(float(values.std()), 1e-9)
    # numpy's std (the same operations: the same bits), its deviations in a reused array
    deviations, _ = scratch.floats(len(values))
    np.subtract(values, mean, out=deviations)
    np.multiply(deviations, deviations, out=deviations)
    return mean, max(math.sqrt(float(np.add.reduce(deviations)) / len(values)), 1e-9)


def squash(fused: float) -> float:
    """A fused z-score as a score in (0, 1): the logistic function (monotonic)."""
    return 1.0 / (1.0 + math.exp(-max(min(fused, 50.0), -50.0)))


@dataclass(slots=True)  # (a query makes one per candidate, a few hundred)
class Candidate:
    """One record's signals for a query (``cosine`` None = no vector: absent).  ``query._candidates``
    passes the first ten fields by position: their order is part of that call."""

    position: int
    lexical_raw: float
    lexical_norm: float
    cosine: float | None
    lexical_rank: int | None = None
    vector_rank: int | None = None
    lexical_context: float = 0.0  # b': BM25 with the neighbours' context
    lexical_z: float = 0.0
    cosine_context: float | None = None  # c'
    cosine_z: float | None = None
    score: float = 0.0
    fused: float = 0.0  # the score before importance
    retrieval: str = "bm25"


def fuse_z(cands: list[Candidate], weight: float, threshold: float) -> list[Candidate]:
    """Score candidates by z fusion; admit those with a lexical score or a cosine ≥ threshold."""
    kept = []
    for c in cands:
        lexical = c.lexical_raw > 0  # its own terms: a neighbour's context never admits a record
        if c.cosine is None or c.cosine_z is None:
            if not lexical:
                continue
            c.score, c.retrieval = c.lexical_z, "bm25"
        elif lexical or c.cosine >= threshold:
            c.score = weight * c.lexical_z + (1 - weight) * c.cosine_z
            c.retrieval = "hybrid" if lexical else "vector"
        else:
            continue
        kept.append(c)
    return kept


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


def fuse_z_squashed(cands: list[Candidate], weight: float, threshold: float) -> list[Candidate]:
    """z fusion with each kept candidate's score squashed into (0, 1) (the order is unchanged)."""
    kept = fuse_z(cands, weight, threshold)
    for c in kept:
        c.score = squash(c.score)
    return kept


def fuse_rrf_ranked(cands: list[Candidate], weight: float, threshold: float) -> list[Candidate]:
    """rrf fusion as a :data:`Ranker` (it has no weight)."""
    return fuse_rrf(cands, threshold)


def rank_lexical(cands: list[Candidate], weight: float, threshold: float) -> list[Candidate]:
    """Mode ``lexical``: the candidates with a BM25 score of their own, by it (normalised, with context)."""
    kept = [c for c in cands if c.lexical_raw > 0]
    for c in kept:
        c.score, c.retrieval = c.lexical_norm, "bm25"
    return kept


def rank_vector(cands: list[Candidate], weight: float, threshold: float) -> list[Candidate]:
    """Mode ``vector``: the vector side's candidates, by cosine with context."""
    kept = []
    for c in cands:
        if c.cosine_context is not None and c.vector_rank is not None:
            c.score, c.retrieval = c.cosine_context, "vector"
            kept.append(c)
    return kept


Ranker = Callable[[list[Candidate], float, float], list[Candidate]]
"""Scores the candidates in place and returns those kept: ``(candidates, weight, threshold)``."""

FUSIONS: dict[str, Ranker] = {"z": fuse_z_squashed, "alpha": fuse_alpha, "rrf": fuse_rrf_ranked}
ONE_SIGNAL: dict[str, Ranker] = {"lexical": rank_lexical, "vector": rank_vector}
CONTEXTUAL_FUSIONS = frozenset(("z",))  # the fusions that use the neighbours' context


def ranker(mode: str, fusion: str) -> Ranker:
    """The rule a query ranks by: its mode's one signal, or (mode ``hybrid``) the named fusion."""
    return ONE_SIGNAL[mode] if mode in ONE_SIGNAL else FUSIONS[fusion]


def uses_context(mode: str, fusion: str) -> bool:
    """Whether the ranking uses the neighbours' context (one signal alone always does)."""
    return mode in ONE_SIGNAL or fusion in CONTEXTUAL_FUSIONS

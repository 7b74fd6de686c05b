"""The query's lexical side: BM25 of every record, with its neighbours' context (``b'``)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .fusion import bm25_normaliser, zscore_stats
from .neighbours import CONTEXT_LEXICAL, with_context
from .plan import Scope, take, top
from .snapshot import Snapshot


@dataclass
class LexicalSide:
    """BM25 by position (``raw``: the record's own terms; ``scores``: ``b'``) and what ranking needs."""

    raw: np.ndarray
    scores: np.ndarray
    mean: float  # of b' over the scope (z fusion)
    sd: float
    normaliser: float  # maps b' into [0, 1] (``fusion.bm25_normaliser``)
    rank: dict[int, int]  # lexical candidates: position -> rank by b'


def lexical_side(snap: Snapshot, terms: list[str], scope: Scope, *, propose: bool,
                 past: bool = False) -> LexicalSide:
    """Every record's ``b'``, its distribution over the scope, and (with ``propose``) the
    ``scope.n_cand`` best records with a BM25 score of their own, ranked with context.  ``past``: the
    scope may hold records retired since (an as-of query), which are scored too."""
    lexical = snap.lexical_engine()
    raw = lexical.scores(terms, removed_too=past)
    g = scope.gate
    scores = with_context(raw, np.arange(len(raw)), scope.prev, scope.nxt, CONTEXT_LEXICAL * g) if g > 0 else raw
    in_scope = take(scores, scope.positions)
    mean, sd = zscore_stats(in_scope)
    normaliser = bm25_normaliser(float(in_scope.max()), lexical.self_score(terms, removed_too=past))
    rank: dict[int, int] = {}
    if propose:
        if g <= 0 and np.count_nonzero(in_scope) >= scope.n_cand:
            # without context a score is the record's own: the best n are all records with a term of
            # the query when n of them have one (no copies of a million scores)
            matching, ranked_by = scope.positions, in_scope
        else:
            own = take(raw, scope.positions) > 0  # own terms; ranked with context
            matching, ranked_by = (scope.positions, in_scope) if own.all() \
                else (scope.positions[own], scores[scope.positions[own]])  # (a term in every record: no copies)
        rank = {int(p): i + 1 for i, p in enumerate(top(matching, ranked_by, scope.n_cand))}
    return LexicalSide(raw, scores, mean, sd, normaliser, rank)

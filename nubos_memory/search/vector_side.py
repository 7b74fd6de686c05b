"""The query's vector side: its cosine with the records' stored vectors, with the neighbours' context (``c'``).

Up to ``vectors.EXACT_LIMIT`` records in scope every cosine is computed; above,
HNSW proposes candidates and a fixed sample of the scope (``STATS_SAMPLE``
records, ``STATS_SAMPLE_PIECES`` where best pieces are read on demand) stands in for the distribution; the records whose best piece is closest to the query
are candidates beside HNSW's (a several-piece record's cosine mixes its best piece's and its
pooled vector's, a record with HyPE questions scores the better of that and its closest question's:
``index/vectors.py``).  Only the cosines a query needs are
computed (``Cosines``): the candidates', their neighbours', the lexical
candidates' and the distribution's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from .. import codes
from ..errors import EmbeddingError
from ..index import vectors as vector_index
from ..index.vectors import mix
from .fusion import zscore_stats
from .neighbours import CONTEXT_VECTOR, with_context
from .plan import Scope, distinct, take, top

if TYPE_CHECKING:
    from ..embed.base import Embedder
    from ..embed.helper import Pending
    from .snapshot import Snapshot, VectorState

STATS_SAMPLE = 1000  # records whose cosine stands in for the distribution in a large scope
# ... where best pieces are read on demand (``Cosines.lazy``): a quarter as many, as best piece v2 keeps about
# four times v1's piece rows a long record, so the statistics read as many rows as they did (adr/0002)
STATS_SAMPLE_PIECES = STATS_SAMPLE // 4
PIECE_POOL = 4  # above EXACT_LIMIT: the n_cand × this closest records by pooled vector have their pieces read


@dataclass
class VectorSide:
    """The query's cosines: ``cos`` by position where ``known``, plus what ranking needs."""

    cos: np.ndarray
    known: np.ndarray  # bool by position: the cosine was computed (the record has a vector)
    rank: dict[int, int] = field(default_factory=dict)  # vector candidates: position -> rank by cosine
    mean: float = 0.0
    sd: float = 1.0
    pending: int = 0


class Cosines:
    """The query vector's cosine with each record, computed when first asked for."""

    def __init__(self, state: VectorState):
        """Made before the query's vector is known (:meth:`aim` gives it): what needs none is ready."""
        self.state = state
        self.q = np.zeros(0, dtype=np.float32)
        n = len(state.labels)
        self.cos = np.zeros(n, dtype=np.float64)
        self.known = np.zeros(n, dtype=bool)
        self.extra = np.array(sorted(state.extra), dtype=np.int64)  # embedded for this answer only: usually none
        # each label's best piece cosine (NaN: a record of one piece); None: no record has pieces.  Above
        # EXACT_LIMIT records it is made for the labels asked about only (``score_pieces``): a scan of every
        # piece row cost more than the rest of a warm query at 100k records (issue 27)
        index = state.index
        self.lazy = index is not None and len(index) > vector_index.EXACT_LIMIT and index.has_pieces()
        self.best: np.ndarray | None = None
        self._scored = np.zeros(0, dtype=bool)
        if index is not None and self.lazy:
            self.best, self._scored = np.full(len(index), np.nan, dtype=np.float32), np.zeros(len(index), dtype=bool)
        self.asked: np.ndarray | None = None

    def aim(self, q: np.ndarray) -> None:
        """The query's vector: the cosines are of it from now on."""
        self.q = q
        index = self.state.index
        if index is not None and not self.lazy:
            self.best = index.best_pieces(q)
        # each label's closest HyPE question's cosine (NaN: none); None: no record has questions
        self.asked = index.best_questions(q) if index is not None else None

    def compute(self, positions: np.ndarray, *, kept: bool = False) -> None:
        """The cosines of these positions that are not known yet (those with a vector); ``kept``: the same
        positions are asked query after query, their rows are kept (``VectorIndex.kept_rows``)."""
        todo = positions[~self.known[positions]]
        if not len(todo):
            return
        index, labels = self.state.index, self.state.labels
        with_label = todo[labels[todo] >= 0]
        if index is not None and len(with_label):
            self.score_pieces(labels[with_label])
            self.cos[with_label] = index.cosines(labels[with_label], self.q, self.best, self.asked, kept=kept)
            self.known[with_label] = True
        for p in (todo[np.isin(todo, self.extra)].tolist() if len(self.extra) else ()):
            pooled = float(np.dot(self.state.extra[p], self.q))
            pieces = self.state.extra_pieces.get(p)
            best = float(np.max(pieces @ self.q)) if pieces is not None and len(pieces) else float("nan")
            self.cos[p] = float(mix(np.array([pooled]), np.array([best]))[0])
            self.known[p] = True

    def score_pieces(self, labels: np.ndarray) -> None:
        """Make ``best`` for these labels where it is made on demand (``lazy``)."""
        if self.lazy and self.best is not None and self.state.index is not None:
            todo = labels[~self._scored[labels]]
            if len(todo):
                self.best[todo] = self.state.index.best_pieces_of(self.q, todo)
                self._scored[todo] = True

    def with_vector(self, positions: np.ndarray) -> np.ndarray:
        """The positions whose record has a vector (stored, or embedded for this answer)."""
        has_vec = take(self.state.labels, positions) >= 0
        if len(self.extra):
            has_vec |= np.isin(positions, self.extra)
        found: np.ndarray = positions if has_vec.all() else positions[has_vec]
        return found


def query_vector(embedder: Embedder, text: str, ahead: Pending | None = None) -> np.ndarray:
    """The query's unit vector (``EmbeddingError`` when the model gives an unusable one): from the helper
    process it was handed to (``ahead``), else embedded now."""
    q = None
    if ahead is not None:
        if ahead.text == text:
            q = ahead.result()
        else:  # (never: the caller hands over the text embedded here; a vector of another text is never taken)
            ahead.close()
    if q is None:
        q = embedder.embed_search([text])[0]  # a query: the model's query prefix, if it has one
    if not vector_index.usable(q[None, :])[0]:
        raise EmbeddingError("the model gave a non-finite or zero vector for the query; it is answered by keywords "
                             "(memory-stats.runtime says what embeds)", code=codes.EMBEDDING_INVALID)
    return q


def vector_side(vector: Callable[[], np.ndarray], state: VectorState, snap: Snapshot, scope: Scope,
                lex_cands: np.ndarray) -> VectorSide:
    """Cosines of the candidates (vector top-n_cand, their neighbours, the lexical candidates), and
    the mean and sd of ``c'`` over the scope (every record's up to ``EXACT_LIMIT``, else a sample).
    ``vector`` gives the query's vector; it is asked once what needs none is done (a warm process's helper
    embeds it meanwhile: ``embed/helper.py``)."""
    cosines = Cosines(state)
    in_scope = cosines.with_vector(scope.positions)
    side = VectorSide(cosines.cos, cosines.known, pending=int(len(scope.positions) - len(in_scope)))
    exact = len(in_scope) <= vector_index.EXACT_LIMIT
    # the records the statistics are of (exact: all, their neighbours' cosines computed with them), and the
    # rows read for them
    stats_of = in_scope if exact else in_scope[_sample(len(in_scope), STATS_SAMPLE_PIECES if cosines.lazy
                                                       else STATS_SAMPLE)]
    rows = scope.neighbourhood(stats_of)
    cosines.aim(vector())
    if not len(in_scope):
        return side
    if exact:
        cosines.compute(rows)
        order = top(in_scope, cosines.cos[in_scope], scope.n_cand)
    else:
        order = _approximate_top(cosines, in_scope, snap, scope, rows)
    side.rank = _ranks(order, cosines.known, scope)
    cosines.compute(lex_cands)
    ctx = with_context(cosines.cos, stats_of, scope.prev, scope.nxt, CONTEXT_VECTOR * scope.gate, of=cosines.known)
    side.mean, side.sd = zscore_stats(ctx)
    return side


def _approximate_top(cosines: Cosines, in_scope: np.ndarray, snap: Snapshot, scope: Scope,
                     stats_rows: np.ndarray) -> np.ndarray:
    """HNSW's best ``n_cand`` records (and those embedded for this answer); ``stats_rows``: the rows of the
    fixed sample of the scope the statistics are of (read first: the same rows every query)."""
    index, labels, extra = cosines.state.index, cosines.state.labels, cosines.extra
    if index is None:
        top_labels = np.zeros(0, dtype=np.int64)
    else:
        whole = len(in_scope) == len(index)
        allowed = None if whole else labels[in_scope[labels[in_scope] >= 0]]
        # The records whose best piece is closest join HNSW's: among the ``PIECE_POOL`` × n_cand closest
        # by pooled vector (``lazy``: only their pieces are read), else among every record in scope.
        wide, _ = index.top(cosines.q, scope.n_cand * (PIECE_POOL if cosines.lazy else 1), allowed)
        top_labels, pool = wide[:scope.n_cand], (wide if cosines.lazy else allowed)
        cosines.score_pieces(wide)
        for closest, among in ((cosines.best, pool), (cosines.asked, allowed)):  # and whose question is closest
            if closest is not None:
                top_labels = np.concatenate([top_labels, index.top_by_pieces(closest, scope.n_cand, among)])
    proposed = snap.positions_of(distinct(top_labels))
    proposed = proposed[proposed >= 0]
    at = np.minimum(np.searchsorted(scope.positions, proposed), max(len(scope.positions) - 1, 0))
    inside = scope.positions[at] == proposed if len(scope.positions) else np.zeros(len(proposed), dtype=bool)
    proposed = np.concatenate([proposed[inside],  # never a row outside the scope (positions are sorted)
                               extra[np.isin(extra, scope.positions)] if len(extra) else extra])
    cosines.compute(stats_rows, kept=True)  # (first: the same rows every query)
    cosines.compute(scope.neighbourhood(proposed))
    order: np.ndarray = top(proposed, cosines.cos[proposed], scope.n_cand)
    return order


@lru_cache(maxsize=8)
def _sample(n: int, size: int) -> np.ndarray:
    """Which of ``n`` records in scope (by index, in order) stand in for the distribution: a fixed sample
    for a given scope size, drawn once per size (read only)."""
    rng = np.random.default_rng(n)
    chosen = np.sort(rng.choice(n, min(size, n), replace=False))
    chosen.flags.writeable = False
    return chosen


def _ranks(order: np.ndarray, known: np.ndarray, scope: Scope) -> dict[int, int]:
    """The vector candidates' ranks: ``order``, then (with context on) their neighbours in scope."""
    rank = {int(p): i + 1 for i, p in enumerate(order)}
    if scope.gate > 0:
        scoped = np.zeros(len(known), dtype=bool)
        scoped[scope.positions] = True
        for p in order.tolist():
            for nb in (scope.prev[p], scope.nxt[p]):
                if nb >= 0 and known[nb] and scoped[nb]:
                    rank.setdefault(int(nb), len(rank) + 1)
    return rank

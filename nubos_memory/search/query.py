"""The query path: filter → both signals, with neighbour context → candidates → fusion → top-k.

1. **Filters** give the scope: the live records the query may return.
2. **Lexical**: BM25 of every record (``index/lexical.py``), then each record's
   context from its neighbours in the log (``neighbours.py``): ``b'``.
3. **Vector**: the query's cosine with the records' stored vectors, and the
   same context: ``c'``.  Up to ``EXACT_LIMIT`` records every cosine is
   computed; above, HNSW proposes candidates and a fixed sample of the scope
   (1,000 records) stands in for the distribution.
4. **Candidates**: the 100 best by ``b'`` (records with a lexical score) and
   the 100 best by cosine with their neighbours; each gets both scores exactly.
   A record is admitted if it has a lexical score or its cosine reaches the
   threshold (0.25).
5. **Fusion** (``fusion.py``; default ``z``): each side as a z-score over the
   scope for this query, ``w·z(b') + (1 − w)·z(c')`` with ``w = memory.alpha``
   (0.3); a record without a vector keeps its lexical z-score alone (absent,
   not zero).  The hit's ``score`` is the fused value squashed into (0, 1)
   by the logistic function, times the record's importance factor.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np

from ..errors import EmbeddingError, StoreError
from ..index import vectors as vector_index
from ..limits import MAX_ECHO, MAX_TAGS
from ..records import recency
from ..tokenize import tokenize
from .dedup import collapse as collapse_near
from .fusion import (
    Candidate,
    bm25_normaliser,
    fuse_alpha,
    fuse_rrf,
    fuse_z,
    importance_factor,
    squash,
    zscore_stats,
)
from .neighbours import CONTEXT_LEXICAL, CONTEXT_VECTOR, with_context
from .snapshot import Snapshot, VectorState

if TYPE_CHECKING:
    from ..config import MemoryConfig
    from ..embed.base import Embedder
    from ..log import LogScan
    from ..types import Hit, QueryResult

def echo(text: str) -> str:
    """A caller's string as an answer repeats it: at most ``MAX_ECHO`` characters."""
    return text if len(text) <= MAX_ECHO else text[: MAX_ECHO - 1] + "…"


QUERY_EMBED_BUDGET_S = 1.0  # the most a query spends embedding records that have no vector yet
STATS_SAMPLE = 1000  # records whose cosine stands in for the distribution in a large scope


class Searchable(Protocol):
    """What a query needs of a memory (``api.memory.Memory`` provides it)."""

    config: "MemoryConfig"
    snap: Snapshot

    @property
    def embedder(self) -> "Embedder": ...

    def scan(self) -> "LogScan": ...

    def sync_vectors(self, allowed: np.ndarray | None, *, budget_s: float | None = None) -> VectorState: ...


def _top(positions: np.ndarray, scores: np.ndarray, n: int) -> np.ndarray:
    """The ``n`` best positions by score (ties: earlier record first)."""
    if len(positions) > n:
        part = np.argpartition(-scores, n - 1)[:n]
        positions, scores = positions[part], scores[part]
    return positions[np.lexsort((positions, -scores))]


@dataclass
class VectorSide:
    """The query's cosines: ``cos`` by position where ``known``, plus what ranking needs."""

    cos: np.ndarray
    known: np.ndarray  # bool by position: the cosine was computed (the record has a vector)
    rank: dict[int, int] = field(default_factory=dict)  # vector candidates: position -> rank by cosine
    mean: float = 0.0
    sd: float = 1.0
    pending: int = 0


def _vector_side(mem: Searchable, state: VectorState, text: str, scope: np.ndarray, n_cand: int,
                 prev: np.ndarray, nxt: np.ndarray, g: float, lex_cands: np.ndarray) -> VectorSide:
    """Cosines of the candidates (vector top-n_cand, their neighbours, the lexical candidates), and
    the mean and sd of ``c'`` over the scope (every record's up to ``EXACT_LIMIT``, else a sample)."""
    q = mem.embedder.embed([text])[0]
    if not vector_index.usable(q[None, :])[0]:
        raise EmbeddingError("the model gave a non-finite or zero vector for the query; it is answered by keywords "
                             "(memory-stats.runtime says what embeds)", code="embedding-invalid")
    index, labels = state.index, state.labels
    n = len(labels)
    cos = np.zeros(n, dtype=np.float64)
    known = np.zeros(n, dtype=bool)
    extra = np.array(sorted(state.extra), dtype=np.int64)  # embedded for this answer only: usually none

    def compute(positions: np.ndarray) -> None:
        todo = positions[~known[positions]]
        if not len(todo):
            return
        with_label = todo[labels[todo] >= 0]
        if index is not None and len(with_label):
            cos[with_label] = index.cosines(labels[with_label], q)
            known[with_label] = True
        for p in todo[np.isin(todo, extra)].tolist():
            cos[p] = float(np.dot(state.extra[p], q))
            known[p] = True

    has_vec = labels[scope] >= 0
    if len(extra):
        has_vec |= np.isin(scope, extra)
    in_scope = scope[has_vec]
    pending = int(len(scope) - len(in_scope))
    side = VectorSide(cos, known, pending=pending)
    if not len(in_scope):
        return side

    def neighbourhood(ps: np.ndarray) -> np.ndarray:
        """Positions and, with context on, their neighbours (whose cosines context needs)."""
        if g <= 0:
            return ps
        return np.unique(np.concatenate([ps, prev[ps][prev[ps] >= 0], nxt[ps][nxt[ps] >= 0]]))

    if len(in_scope) <= vector_index.EXACT_LIMIT:
        compute(neighbourhood(in_scope))
        order = _top(in_scope, cos[in_scope], n_cand)
        stats_of = in_scope
    else:
        whole = index is not None and len(in_scope) == len(index)
        top_labels, _ = (index.top(q, n_cand, None if whole else labels[in_scope[labels[in_scope] >= 0]])
                         if index is not None else (np.zeros(0, dtype=np.int64), None))
        top = mem.snap.positions_of(top_labels)
        top = np.concatenate([top[top >= 0], extra[np.isin(extra, scope)]])
        rng = np.random.default_rng(len(in_scope))  # a fixed sample for a given memory size
        stats_of = np.sort(rng.choice(in_scope, min(STATS_SAMPLE, len(in_scope)), replace=False))
        compute(neighbourhood(np.unique(np.concatenate([top, stats_of]))))
        order = _top(top, cos[top], n_cand)
    side.rank = {int(p): i + 1 for i, p in enumerate(order)}
    if g > 0:  # the vector candidates' neighbours in scope are candidates too
        scoped = np.zeros(n, dtype=bool)
        scoped[scope] = True
        for p in order.tolist():
            for nb in (prev[p], nxt[p]):
                if nb >= 0 and known[nb] and scoped[nb]:
                    side.rank.setdefault(int(nb), len(side.rank) + 1)
    compute(lex_cands)
    ctx = with_context(cos, stats_of, prev, nxt, CONTEXT_VECTOR * g, of=known)
    side.mean, side.sd = zscore_stats(ctx)
    return side


def run_query(mem: Searchable, text: str, *, k: int, type: str | None, phase: str | None, tags: list[str],
              alpha: float, fusion: str, explain: bool, mode: str = "hybrid", collapse: bool = True,
              phase_exact: bool = False) -> "QueryResult":
    """Answer one query; never fails because of the vector layer (it reports ``degraded``).

    ``mode`` "lexical" or "vector" ranks by one signal only (with its neighbour context).  With
    ``collapse``, near duplicates among the hits (cosine ≥ ``memory.near_duplicate``) are one hit:
    the newest of them by ``created_at`` (``records.recency``) is shown, ranked and scored as the best of them, the others counted in
    its ``collapsed`` field (``dedup.collapse``).
    """
    cfg = mem.config
    scan = mem.scan()
    records = scan.records
    out: QueryResult = {
        "hits": [],
        "degraded": None,
        "query": {"text": echo(text), "k": k, "fusion": fusion, "alpha": alpha, "threshold": cfg.threshold,
                  "filters": {"type": type, "phase": None if phase is None else echo(phase),
                              "tags": [echo(t) for t in tags[:MAX_TAGS]]}},
        "counts": {"records": scan.live_count, "candidates": 0, "pending": 0},
        "warnings": scan.warnings(),
    }
    if len(text) > MAX_ECHO:
        out["query"]["text_chars"] = len(text)  # the text echoed above is its beginning
    if phase is not None and phase_exact:
        out["query"]["filters"]["phase_exact"] = True
    if mode != "hybrid":
        out["query"]["mode"] = mode
    terms = tokenize(text)
    if not records or not terms:
        if records and not terms:
            out["warnings"].append({"code": "query-no-terms",
                                    "message": "the query has only stop words or punctuation"})
        return out  # an empty store or a term-less query never loads the model
    snap = mem.snap
    allowed = snap.allowed(type, phase, tags, phase_exact=phase_exact)
    scope = np.flatnonzero(snap.alive) if allowed is None else allowed
    if len(scope) == 0:
        if scan.live_count:
            out["warnings"].append({"code": "filters-match-nothing",
                                    "message": "no live record passes the filters (type, phase, tags); "
                                               "drop or widen them", "filters": out["query"]["filters"]})
        return out
    n_cand = max(cfg.candidates, k)
    contextual = fusion == "z" or mode != "hybrid"  # alpha and rrf keep their plain signals
    prev, nxt = snap.neighbours()
    state = mem.sync_vectors(allowed, budget_s=QUERY_EMBED_BUDGET_S) if mode != "lexical" else None
    g = 0.0
    if contextual and cfg.context == "auto":
        g = snap.context_gate(state.manifest if state is not None and state.degraded is None else None)

    lexical = snap.lexical_engine()
    raw = lexical.scores(terms)
    lex_ctx = with_context(raw, np.arange(len(raw)), prev, nxt, CONTEXT_LEXICAL * g) if g > 0 else raw
    in_scope = lex_ctx[scope]
    lex_mean, lex_sd = zscore_stats(in_scope)
    best = float(in_scope.max())
    divisor = bm25_normaliser(best, lexical.self_score(terms))
    lex_rank: dict[int, int] = {}
    if mode != "vector":
        matching = scope[raw[scope] > 0]  # own terms; ranked with context
        lex_rank = {int(p): i + 1 for i, p in enumerate(_top(matching, lex_ctx[matching], n_cand))}

    vec: VectorSide | None = None
    if state is not None:
        degraded = state.degraded
        if degraded is None:
            try:
                vec = _vector_side(mem, state, text, scope, n_cand, prev, nxt, g,
                                   np.array(sorted(lex_rank), dtype=np.int64))
            except (StoreError, EmbeddingError) as exc:  # found only now (a graph checked on first use, the model)
                degraded = exc.to_dict()
            else:
                out["counts"]["pending"] = vec.pending
                out["warnings"] += state.notes()
                if vec.pending:
                    out["warnings"].append({
                        "code": "index-behind",
                        "message": f"{vec.pending} record(s) have no vector yet and were ranked lexically; "
                                   "they are embedded in the background or by later writes, or run memory-rebuild",
                    })
        if degraded is not None:
            shown = {"code": degraded["code"], "message": degraded["message"]}
            if degraded.get("details"):
                shown["details"] = degraded["details"]
            out["degraded"] = shown

    cand_pos = np.array(sorted(set(lex_rank) | set(vec.rank if vec else ())), dtype=np.int64)
    # Every candidate's numbers at once (numpy), then one plain loop to hold them.
    raw_c = raw[cand_pos].tolist()
    ctx_c = lex_ctx[cand_pos]
    norm_c = (ctx_c / divisor).tolist()
    zl_c = ((ctx_c - lex_mean) / lex_sd).tolist()
    ctx_list = ctx_c.tolist()
    if vec is not None and len(cand_pos):
        has_c = vec.known[cand_pos].tolist()
        cos_c = vec.cos[cand_pos].tolist()
        cctx = with_context(vec.cos, cand_pos, prev, nxt, CONTEXT_VECTOR * g, of=vec.known)
        cctx_c = cctx.tolist()
        zc_c = ((cctx - vec.mean) / vec.sd).tolist()
    else:
        has_c = [False] * len(cand_pos)
        cos_c = cctx_c = zc_c = has_c
    vec_rank = vec.rank if vec is not None else {}
    cands = [
        Candidate(position=p, lexical_raw=raw_c[i], lexical_norm=norm_c[i], cosine=cos_c[i] if has_c[i] else None,
                  lexical_rank=lex_rank.get(p), vector_rank=vec_rank.get(p), lexical_context=ctx_list[i],
                  lexical_z=zl_c[i], cosine_context=cctx_c[i] if has_c[i] else None,
                  cosine_z=zc_c[i] if has_c[i] else None)
        for i, p in enumerate(cand_pos.tolist())
    ]
    out["counts"]["candidates"] = len(cands)
    if mode == "vector":
        kept = []
        for c in cands:
            if c.cosine_context is not None and c.vector_rank is not None:
                c.score, c.retrieval = c.cosine_context, "vector"
                kept.append(c)
    elif mode == "lexical":
        kept = [c for c in cands if c.lexical_raw > 0]
        for c in kept:
            c.score, c.retrieval = c.lexical_norm, "bm25"
    elif fusion == "z":
        kept = fuse_z(cands, alpha, cfg.threshold)
        for c in kept:
            c.score = squash(c.score)
    elif fusion == "alpha":
        for c in cands:  # today's rule on the plain signals
            c.lexical_norm = c.lexical_raw / bm25_normaliser(float(raw[scope].max()), lexical.self_score(terms))
        kept = fuse_alpha(cands, alpha, cfg.threshold)
    else:
        kept = fuse_rrf(cands, cfg.threshold)
    for c in kept:  # importance reorders near-ties only; it never admits a record (fusion.py)
        c.fused = c.score
        c.score *= importance_factor(records[c.position].get("importance"))
    kept.sort(key=lambda c: (-c.score, c.position))
    threshold = cfg.near_duplicate
    if collapse and threshold is not None and state is not None and state.degraded is None and kept:
        vectors, has = state.vectors_of([c.position for c in kept])
        groups = collapse_near(kept, vectors, has, threshold, k)
    else:
        groups = [[c] for c in kept[:k]]
    for group in groups[:k]:
        c = max(group, key=lambda g_: recency(records[g_.position]))  # the newest statement, by its time
        rec = records[c.position]
        hit: Hit = {"id": rec["id"], "score": round(group[0].score, 6), "retrieval": c.retrieval, "record": rec}
        if len(group) > 1:
            hit["collapsed"] = {"count": len(group) - 1,
                                "ids": [records[m.position]["id"] for m in group if m is not c]}
        if explain:
            hit["explain"] = {
                "lexical": {"raw": round(c.lexical_raw, 6), "with_context": round(c.lexical_context, 6),
                            "normalised": round(c.lexical_norm, 6), "z": round(c.lexical_z, 6),
                            "rank": c.lexical_rank},
                "vector": None if c.cosine is None else {
                    "cosine": round(c.cosine, 6), "with_context": round(c.cosine_context or 0.0, 6),
                    "z": round(c.cosine_z or 0.0, 6), "rank": c.vector_rank},
                "alpha": alpha,
                "fusion": fusion,
                "context_gate": round(g, 4),
                "normaliser": round(divisor, 6),
                "fused": round(c.fused, 6),
                "importance": rec.get("importance"),
            }
        out["hits"].append(hit)
    return out

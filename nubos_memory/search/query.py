"""The query path: filter → candidates from both sides → exact scores → fusion → top-k."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import numpy as np

from ..errors import EmbeddingError, StoreError
from ..tokenize import tokenize
from .dedup import collapse as collapse_near
from .fusion import Candidate, bm25_normaliser, fuse_alpha, fuse_rrf, importance_factor
from .snapshot import Snapshot, VectorState

if TYPE_CHECKING:
    from ..config import MemoryConfig
    from ..embed.base import Embedder
    from ..store.recordlog import LogScan
    from ..types import Hit, QueryResult

QUERY_EMBED_BUDGET_S = 1.0  # the most a query spends embedding records that have no vector yet


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


def _vector_side(mem: Searchable, state: VectorState, text: str, scope: np.ndarray, allowed: np.ndarray | None,
                 n_cand: int, lex_rank: dict[int, int]) -> tuple[dict[int, float], dict[int, int], int]:
    """The vector candidates' ranks, the exact cosine of every candidate (both sides'), and how many
    records in scope have no vector yet."""
    q = mem.embedder.embed([text])[0]
    index, labels = state.index, state.labels
    with_vec = scope[labels[scope] >= 0]
    scored: list[tuple[float, int]] = []
    if index is not None and len(with_vec):
        whole = len(with_vec) == len(index)  # every row of the index is a candidate
        top_labels, top_sims = index.top(q, n_cand, None if whole else labels[with_vec])
        top_pos = mem.snap.positions_of(top_labels)
        scored = [(sim, p) for p, sim in zip(top_pos.tolist(), top_sims.tolist()) if p >= 0]
    extra = list(state.extra)  # embedded for this answer only: usually none
    if extra and allowed is not None:
        allowed_set = set(allowed.tolist())
        extra = [p for p in extra if p in allowed_set]
    scored += [(float(np.dot(state.extra[p], q)), p) for p in extra]
    scored.sort(key=lambda t: (-t[0], t[1]))
    vec_rank = {p: i + 1 for i, (_, p) in enumerate(scored[:n_cand])}
    cosine: dict[int, float] = {}
    candidates = sorted(set(lex_rank) | set(vec_rank))
    if index is not None:
        with_label = [p for p in candidates if labels[p] >= 0]
        for p, c in zip(with_label, index.cosines(labels[with_label], q).tolist()):
            cosine[p] = c
    for p in candidates:
        if p in state.extra:
            cosine[p] = float(np.dot(state.extra[p], q))
    return cosine, vec_rank, int(len(scope) - len(with_vec) - len(extra))


def run_query(mem: Searchable, text: str, *, k: int, type: str | None, phase: str | None, tags: list[str],
              alpha: float, fusion: str, explain: bool, mode: str = "hybrid", collapse: bool = True
              ) -> "QueryResult":
    """Answer one query; never fails because of the vector layer (it reports ``degraded``).

    ``mode`` "lexical" or "vector" ranks by one signal only (used by memory-eval).  With
    ``collapse``, near duplicates among the hits (cosine ≥ ``memory.near_duplicate``) are one hit:
    the newest of them is shown, ranked and scored as the best of them, the others counted in
    its ``collapsed`` field (``dedup.collapse``).
    """
    cfg = mem.config
    scan = mem.scan()
    records = scan.records
    out: QueryResult = {
        "hits": [],
        "degraded": None,
        "query": {"text": text, "k": k, "fusion": fusion, "alpha": alpha, "threshold": cfg.threshold,
                  "filters": {"type": type, "phase": phase, "tags": tags}},
        "counts": {"records": len(records), "candidates": 0, "pending": 0},
        "warnings": scan.warnings(),
    }
    if mode != "hybrid":
        out["query"]["mode"] = mode
    terms = tokenize(text)
    if not records or not terms:
        if records and not terms:
            out["warnings"].append({"code": "query-no-terms",
                                    "message": "the query has only stop words or punctuation"})
        return out  # an empty store or a term-less query never loads the model
    snap = mem.snap
    allowed = snap.allowed(type, phase, tags)
    if allowed is not None and len(allowed) == 0:
        return out
    n_cand = max(cfg.candidates, k)

    lexical = snap.lexical_engine()
    raw = lexical.scores(terms)
    scope = np.arange(len(records)) if allowed is None else allowed
    best = float(raw[scope].max())
    divisor = bm25_normaliser(best, lexical.self_score(terms))
    lex_rank: dict[int, int] = {}
    if mode != "vector":
        matching = scope[raw[scope] > 0]
        lex_rank = {int(p): i + 1 for i, p in enumerate(_top(matching, raw[matching], n_cand))}

    cosine: dict[int, float] = {}
    vec_rank: dict[int, int] = {}
    state = None
    if mode != "lexical":
        state = mem.sync_vectors(allowed, budget_s=QUERY_EMBED_BUDGET_S)
        degraded = state.degraded
        if degraded is None:
            try:
                cosine, vec_rank, pending = _vector_side(mem, state, text, scope, allowed, n_cand, lex_rank)
            except (StoreError, EmbeddingError) as exc:  # found only now (a graph checked on first use, the model)
                degraded = exc.to_dict()
            else:
                out["counts"]["pending"] = pending
                if pending:
                    out["warnings"].append({
                        "code": "index-behind",
                        "message": f"{pending} record(s) have no vector yet and were ranked lexically; later "
                                   "queries index them in batches, or run memory-rebuild now",
                    })
        if degraded is not None:
            shown = {"code": degraded["code"], "message": degraded["message"]}
            if degraded.get("details"):
                shown["details"] = degraded["details"]
            out["degraded"] = shown
    cand_pos = sorted(set(lex_rank) | set(vec_rank))

    cands = [
        Candidate(position=p, lexical_raw=r, lexical_norm=r / divisor,
                  cosine=cosine.get(p), lexical_rank=lex_rank.get(p), vector_rank=vec_rank.get(p))
        for p, r in zip(cand_pos, raw[cand_pos].tolist() if cand_pos else [])
    ]
    out["counts"]["candidates"] = len(cands)
    if mode == "vector":
        kept = []
        for c in cands:
            if c.cosine is not None:
                c.score, c.retrieval = c.cosine, "vector"
                kept.append(c)
    elif mode == "lexical":
        kept = [c for c in cands if c.lexical_raw > 0]
        for c in kept:
            c.score, c.retrieval = c.lexical_norm, "bm25"
    elif fusion == "alpha":
        kept = fuse_alpha(cands, alpha, cfg.threshold)
    else:
        kept = fuse_rrf(cands, cfg.threshold)
    for c in kept:  # importance reorders near-ties only; it never admits a record (fusion.py)
        c.fused = c.score
        c.score *= importance_factor(records[c.position].get("importance"))
    kept.sort(key=lambda c: (-c.score, c.position))
    threshold = cfg.near_duplicate
    if collapse and threshold is not None and state is not None and state.degraded is None:
        groups = collapse_near(kept, lambda c: state.vector_of(c.position), threshold)
    else:
        groups = [[c] for c in kept]
    for group in groups[:k]:
        c = max(group, key=lambda g: g.position)  # the newest of near duplicates is shown
        rec = records[c.position]
        hit: Hit = {"id": rec["id"], "score": round(group[0].score, 6), "retrieval": c.retrieval, "record": rec}
        if len(group) > 1:
            hit["collapsed"] = {"count": len(group) - 1,
                                "ids": [records[g.position]["id"] for g in group if g is not c]}
        if explain:
            hit["explain"] = {
                "lexical": {"raw": round(c.lexical_raw, 6), "normalised": round(c.lexical_norm, 6),
                            "rank": c.lexical_rank},
                "vector": None if c.cosine is None else {"cosine": round(c.cosine, 6), "rank": c.vector_rank},
                "alpha": alpha,
                "fusion": fusion,
                "normaliser": round(divisor, 6),
                "fused": round(c.fused, 6),
                "importance": rec.get("importance"),
            }
        out["hits"].append(hit)
    return out


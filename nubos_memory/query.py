"""The query path: filter → candidates from both sides → exact scores → fusion → top-k."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .fusion import Candidate, bm25_normaliser, fuse_alpha, fuse_rrf
from .lexical import RankBM25Scorer
from .records import lexical_text
from .tokenize import tokenize

if TYPE_CHECKING:
    from .memory import Memory


def _matches(record: dict[str, Any], type_: str | None, phase: str | None, tags: list[str]) -> bool:
    if type_ is not None and record["type"] != type_:
        return False
    if phase is not None and record.get("phase") != phase:
        return False
    if tags and not set(tags) & set(record.get("tags") or ()):
        return False
    return True


def run_query(mem: "Memory", text: str, *, k: int, type: str | None, phase: str | None, tags: list[str],
              alpha: float, fusion: str, explain: bool) -> dict[str, Any]:
    """Answer one query; never fails because of the vector layer (it reports ``degraded``)."""
    cfg = mem.config
    scan = mem.scan()
    records = scan.records
    out: dict[str, Any] = {
        "hits": [],
        "degraded": None,
        "query": {"text": text, "k": k, "fusion": fusion, "alpha": alpha, "threshold": cfg.threshold,
                  "filters": {"type": type, "phase": phase, "tags": tags}},
        "counts": {"records": len(records), "candidates": 0, "pending": 0},
        "warnings": scan.warnings(),
    }
    terms = tokenize(text)
    if not records or not terms:
        if records and not terms:
            out["warnings"].append({"code": "query-no-terms",
                                    "message": "the query has only stop words or punctuation"})
        return out  # an empty store or a term-less query never loads the model
    mask = np.fromiter((_matches(r, type, phase, tags) for r in records), dtype=bool, count=len(records))
    allowed = np.flatnonzero(mask)
    if len(allowed) == 0:
        return out

    lexical = RankBM25Scorer([tokenize(lexical_text(r)) for r in records])
    raw = lexical.scores(terms)
    best = float(raw[allowed].max()) if len(allowed) else 0.0
    divisor = bm25_normaliser(best, lexical.upper_bound(terms))
    n_cand = max(cfg.candidates, k)
    lex_allowed = allowed[raw[allowed] > 0]
    lex_order = lex_allowed[np.lexsort((lex_allowed, -raw[lex_allowed]))][:n_cand]
    lex_rank = {int(p): i + 1 for i, p in enumerate(lex_order)}

    state = mem._sync_vectors([records[i] for i in allowed], cap=cfg.max_pending_embed, blocking=False,
                              verb="memory-query")
    cosine: dict[int, float] = {}
    vec_rank: dict[int, int] = {}
    if state.degraded is None:
        q = mem.embedder.embed([text])[0]
        index = state.index
        labels = np.full(len(records), -1, dtype=np.int64)
        extra_pos: list[int] = []
        for p in allowed:
            label = state.vector_label(records[p])
            if label is not None:
                labels[p] = label
            elif records[p]["id"] in state.extra:
                extra_pos.append(int(p))
        indexed_pos = allowed[labels[allowed] >= 0]
        scored: list[tuple[float, int]] = []
        if index is not None and len(indexed_pos):
            position_of = {int(labels[p]): int(p) for p in indexed_pos}
            whole = len(indexed_pos) == len(records) == len(index)
            top_labels, top_sims = index.top(q, n_cand, None if whole else labels[indexed_pos])
            scored += [(float(s), position_of[int(lb)]) for lb, s in zip(top_labels, top_sims)
                       if int(lb) in position_of]
        for p in extra_pos:
            scored.append((float(np.dot(state.extra[records[p]["id"]], q)), p))
        scored.sort(key=lambda t: (-t[0], t[1]))
        vec_rank = {p: i + 1 for i, (_, p) in enumerate(scored[:n_cand])}
        cand_pos = sorted(set(lex_rank) | set(vec_rank))
        # Exact cosine for every candidate that has a vector, whichever side found it.
        if index is not None:
            with_label = [p for p in cand_pos if labels[p] >= 0]
            for p, c in zip(with_label, index.cosines(labels[with_label], q)):
                cosine[p] = float(c)
        for p in cand_pos:
            if records[p]["id"] in state.extra and p not in cosine:
                cosine[p] = float(np.dot(state.extra[records[p]["id"]], q))
        out["counts"]["pending"] = int(len(allowed) - len(indexed_pos) - len(extra_pos))
        if out["counts"]["pending"]:
            out["warnings"].append({
                "code": "index-behind",
                "message": f"{out['counts']['pending']} record(s) have no vector yet and were ranked lexically; "
                           "later queries index them in batches, or run memory-rebuild now",
            })
    else:
        out["degraded"] = {"code": state.degraded["code"], "message": state.degraded["message"]}
        if state.degraded.get("details"):
            out["degraded"]["details"] = state.degraded["details"]
        cand_pos = sorted(lex_rank)

    cands = [
        Candidate(position=p, lexical_raw=float(raw[p]), lexical_norm=float(raw[p]) / divisor,
                  cosine=cosine.get(p), lexical_rank=lex_rank.get(p), vector_rank=vec_rank.get(p))
        for p in cand_pos
    ]
    out["counts"]["candidates"] = len(cands)
    kept = fuse_alpha(cands, alpha, cfg.threshold) if fusion == "alpha" else fuse_rrf(cands, cfg.threshold)
    kept.sort(key=lambda c: (-c.score, c.position))
    for c in kept[:k]:
        rec = records[c.position]
        hit: dict[str, Any] = {"id": rec["id"], "score": round(c.score, 6), "retrieval": c.retrieval, "record": rec}
        if explain:
            hit["explain"] = {
                "lexical": {"raw": round(c.lexical_raw, 6), "normalised": round(c.lexical_norm, 6),
                            "rank": c.lexical_rank},
                "vector": None if c.cosine is None else {"cosine": round(c.cosine, 6), "rank": c.vector_rank},
                "alpha": alpha,
                "fusion": fusion,
                "normaliser": round(divisor, 6),
            }
        out["hits"].append(hit)
    return out

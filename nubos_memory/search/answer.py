"""The shape of a query's answer: what it echoes of the request, and its hits.

A hit is a group of near duplicates (``dedup.collapse``) shown as its newest
member by ``created_at`` (``records.recency``), ranked and scored as the best
of them, the others counted in its ``collapsed`` field; with ``explain`` it
carries the signals that ranked it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..limits import MAX_ECHO, MAX_TAGS
from ..records import echo, recency
from .dedup import collapse as collapse_near
from .dedup import contradictions

if TYPE_CHECKING:
    from ..config import MemoryConfig
    from ..log import LogScan
    from ..types import Hit, QueryResult, Record
    from .fusion import Candidate
    from .plan import Request
    from .snapshot import VectorState


def empty_answer(cfg: MemoryConfig, scan: LogScan, req: Request) -> QueryResult:
    """The answer before any record is ranked: the request echoed, the memory's counts and warnings."""
    out: QueryResult = {
        "hits": [],
        "degraded": None,
        "query": {"text": echo(req.text), "k": req.k, "fusion": req.fusion, "alpha": req.alpha,
                  "threshold": cfg.threshold,
                  "filters": {"type": req.type, "phase": None if req.phase is None else echo(req.phase),
                              "tags": [echo(t) for t in req.tags[:MAX_TAGS]]}},
        "counts": {"records": scan.live_count, "candidates": 0, "pending": 0},
        "warnings": scan.warnings(),
    }
    if len(req.text) > MAX_ECHO:
        out["query"]["text_chars"] = len(req.text)  # the text echoed above is its beginning
    if req.phase is not None and req.phase_exact:
        out["query"]["filters"]["phase_exact"] = True
    if req.domain is not None:
        out["query"]["filters"]["domain"] = echo(req.domain)  # only when given: other answers are unchanged
    if req.since is not None:
        out["query"]["filters"]["since"] = echo(req.since)
    if req.as_of is not None:
        out["query"]["filters"]["as_of"] = echo(req.as_of)
    if req.mode != "hybrid":
        out["query"]["mode"] = req.mode
    return out


def groups_of(kept: list[Candidate], state: VectorState | None, near_duplicate: float | None, collapse: bool,
              k: int) -> list[list[Candidate]]:
    """The best ``k`` hits' groups: near duplicates together when ``collapse`` and the vectors allow
    it, else one candidate each."""
    if collapse and near_duplicate is not None and state is not None and state.degraded is None and kept:
        vectors, has = state.vectors_of([c.position for c in kept])
        return collapse_near(kept, vectors, has, near_duplicate, k)
    return [[c] for c in kept[:k]]


def conflicts_of(shown: Record, older: list[Record]) -> list[dict[str, Any]]:
    """The collapsed statements that disagree with the one shown (``dedup.contradiction``): the newer
    statement won, and the agent is told there was a disagreement."""
    out = []
    for rec, kind in zip(older, contradictions(shown, older)):
        if kind is not None:
            out.append({"id": rec["id"], "kind": kind, "created_at": rec.get("created_at"),
                        "said": rec["title"][:160]})
    return out


def hit_of(group: list[Candidate], records: Sequence[Record], explain: dict[str, Any] | None) -> Hit:
    """One hit: the group's newest record, scored as its best; ``explain`` (the query's part of
    the explanation) adds the signals."""
    members = [records[m.position] for m in group]  # (each record read once)
    newest = max(range(len(group)), key=lambda i: recency(members[i])) if len(group) > 1 else 0
    c, rec = group[newest], members[newest]  # the newest statement, by its time
    hit: Hit = {"id": rec["id"], "score": round(group[0].score, 6), "retrieval": c.retrieval, "record": rec}
    if len(group) > 1:
        older = members[:newest] + members[newest + 1:]
        hit["collapsed"] = {"count": len(older), "ids": [r["id"] for r in older]}
        conflicts = conflicts_of(rec, older)
        if conflicts:
            hit["conflicts"] = conflicts
    if explain is not None:
        hit["explain"] = explained(c, rec, explain)
    return hit


def explained(c: Candidate, rec: Record, query_part: dict[str, Any]) -> dict[str, Any]:
    """Why a candidate ranked where it did: both signals, then the query's fusion settings
    (``query_part``: alpha, fusion, context_gate, normaliser, side_weight), the fused score and the importance."""
    return {
        "lexical": {"raw": round(c.lexical_raw, 6), "with_context": round(c.lexical_context, 6),
                    "normalised": round(c.lexical_norm, 6), "z": round(c.lexical_z, 6), "rank": c.lexical_rank},
        "vector": None if c.cosine is None else {
            "cosine": round(c.cosine, 6), "with_context": round(c.cosine_context or 0.0, 6),
            "z": round(c.cosine_z or 0.0, 6), "rank": c.vector_rank},
        **query_part,
        "fused": round(c.fused, 6),
        "importance": rec.get("importance"),
    }

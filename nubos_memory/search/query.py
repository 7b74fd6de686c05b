"""The query path: filter → both signals, with neighbour context → candidates → fusion → top-k.

1. **Filters** give the scope: the live records the query may return
   (``_filtered``, ``_scope``; ``plan.Scope``).
2. **Lexical**: BM25 of every record (``index/lexical.py``), then each record's
   context from its neighbours in the log (``neighbours.py``): ``b'``
   (``lexical_side.py``).
3. **Vector**: the query's cosine with the records' stored vectors, and the
   same context: ``c'`` (``vector_side.py``).  Up to ``EXACT_LIMIT`` records
   every cosine is computed; above, HNSW proposes candidates and a fixed sample
   of the scope (1,000 records) stands in for the distribution.
4. **Candidates**: the 100 best by ``b'`` (records with a lexical score) and
   the 100 best by cosine with their neighbours; each gets both scores exactly
   (``_candidates``).  A record is admitted if it has a lexical score or its
   cosine reaches the threshold (0.25).
5. **Fusion** (``fusion.py``; default ``z``): each side as a z-score over the
   scope for this query, ``w·z(b') + (1 − w)·z(c')`` with ``w`` the memory's side
   weight (``sideweight.py``) or ``memory.alpha`` (0.3); a record without a vector keeps its lexical z-score alone (absent,
   not zero).  The hit's ``score`` is the fused value squashed into (0, 1)
   by the logistic function, times the record's importance factor (``_ranked``).

The answer's shape (near duplicates collapsed, ``explain``) is ``answer.py``'s.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from .. import codes
from ..errors import EmbeddingError, StoreError
from ..limits import MAX_TAGS
from ..records import echo, iso_to_epoch, lexical_text, phase_matches
from ..tokenize import tokenize
from . import sideweight
from .answer import empty_answer, groups_of, hit_of
from .fusion import Candidate, importance_factor, ranker, uses_context
from .lexical_side import LexicalSide, lexical_side
from .neighbours import CONTEXT_VECTOR, live_neighbours, with_context
from .plan import Request, Scope
from .syntax import Matcher, Parsed, expansions, scored_terms
from .timeline import live_mask
from .vector_side import Cosines, VectorSide, query_vector, vector_side

if TYPE_CHECKING:
    from ..config import MemoryConfig
    from ..embed.base import Embedder
    from ..embed.helper import Pending
    from ..log import LogScan
    from ..recordlist import RecordList
    from ..types import Hit, QueryResult, Record
    from .snapshot import Snapshot, VectorState

QUERY_EMBED_BUDGET_S = 1.0  # the most a query spends embedding records that have no vector yet


class Searchable(Protocol):
    """What a query needs of a memory (``api.memory.Memory`` provides it)."""

    config: "MemoryConfig"
    snap: "Snapshot"

    @property
    def embedder(self) -> "Embedder": ...

    def scan(self) -> "LogScan": ...

    def sync_vectors(self, allowed: np.ndarray | None, *, budget_s: float | None = None) -> "VectorState": ...


def run_query(mem: Searchable, text: str, *, k: int, type: str | None, phase: str | None, tags: list[str],
              alpha: float, fusion: str, explain: bool, mode: str = "hybrid", collapse: bool = True,
              phase_exact: bool = False, since: str | None = None, as_of: str | None = None,
              positions: np.ndarray | None = None, side_weights: bool = False,
              syntax: Parsed | None = None, domain: str | None = None, ahead: Pending | None = None
              ) -> "QueryResult":
    """Answer one query; never fails because of the vector layer (it reports ``degraded``).

    ``mode`` "lexical" or "vector" ranks by one signal only (with its neighbour context).  With
    ``collapse``, near duplicates among the hits (cosine ≥ ``memory.near_duplicate``) are one hit:
    the newest of them by ``created_at`` (``records.recency``) is shown, ranked and scored as the best of them, the others counted in
    its ``collapsed`` field (``dedup.collapse``).  ``as_of`` (ISO-8601) answers from the records live
    at that time (``timeline.py``), ranked by the same path.  ``positions`` restricts the query to those
    records (by log position) before anything is ranked, like the other filters.  ``side_weights``:
    z fusion's weight is the memory's estimate (``sideweight.py``, kept in the manifest) where there
    is one, else ``alpha``; the answer's ``query.alpha`` says which was used.  ``syntax``: the text's
    query syntax (``syntax.parse``; None: a bag of words, as always), applied by ``_with_syntax``.
    ``domain``: only records of that domain, a filter like ``type`` (echoed only when given).  ``ahead``:
    :func:`vector_text` already handed to the embedder's helper process (``Embedder.search_ahead``).
    """
    req = Request(text, k, type, phase, tags, alpha, fusion, explain, mode, collapse, phase_exact, since, as_of,
                  positions=positions, side_weights=side_weights, domain=domain)
    got = gather(mem, req, syntax, ahead)
    return got if not isinstance(got, Gathered) else finish(mem, got)


@dataclass
class Gathered:
    """One memory's part of a query up to its candidates: the answer so far, both sides and the scope
    their statistics are over (``search/fused.py`` pools them across memories before ``finish``)."""

    out: "QueryResult"
    records: "RecordList"
    req: Request
    scope: Scope
    state: "VectorState | None"
    lex: LexicalSide
    vec: VectorSide | None


def hand_over(embedder: Embedder, text: str) -> Pending | None:
    """``text`` handed to the embedder's helper process, which embeds it while the query does the rest
    (``embed/helper.py``: a warm process's); None: it is embedded when the vector side needs it, and a
    model that fails then is reported there (``degraded``), as it always was."""
    try:
        return embedder.search_ahead(text)
    except (StoreError, EmbeddingError):
        return None


def vector_text(text: str, syntax: Parsed | None) -> str:
    """What the vector side embeds of a query's text: its free words when it is read as syntax, else all of it."""
    return text if syntax is None or syntax.plain else syntax.free_text()


def gather(mem: Searchable, req: Request, syntax: Parsed | None = None,
           ahead: Pending | None = None) -> "Gathered | QueryResult":
    """Stages 1-3 of a query (filters, both sides); the answer itself when there is nothing to rank.
    ``ahead``: the vector side's text already handed to the embedder's helper (else handed here)."""
    text = req.text
    scan = mem.scan()
    out = empty_answer(mem.config, scan, req)
    live = None if req.as_of is None else _as_of(mem.snap, scan, req.as_of, out)
    if live is None and mem.snap.expired:
        out["counts"]["records"] = int(mem.snap.alive.sum())  # expired records are not live
    terms = tokenize(text)
    if syntax is not None:
        terms, text, req = _with_syntax(mem.snap, scan, syntax, req, out)
    filtered = _filtered(mem.snap, scan, req, terms, out, live)
    if filtered is None:
        return out
    if ahead is None and req.mode != "lexical":
        ahead = hand_over(mem.embedder, text)
    try:
        scope, state = _scope(mem, req, *filtered, live)
        req = _side_weighted(req, state, out)
        lex = lexical_side(mem.snap, terms, scope, propose=req.mode != "vector", past=live is not None)
        vec = _vector_stage(mem, state, text, scope, lex, out, live, ahead)
    finally:
        if ahead is not None:
            ahead.close()  # (its answer taken if the query did not need it: the helper is free again)
    return Gathered(out, scan.records, req, scope, state, lex, vec)


def candidates(got: Gathered) -> list[Candidate]:
    """Stage 4: the candidates of a gathered query, each with both signals."""
    return _candidates(got.lex, got.vec, got.scope)


def finish(mem: Searchable, got: Gathered, cands: list[Candidate] | None = None, *,
           threshold: float | None = None) -> "QueryResult":
    """Stages 4-5: candidates (``cands``: already made), fusion and the top ``k`` hits (``threshold``:
    the cosine a vector-only hit needs, default the memory's)."""
    cands = candidates(got) if cands is None else cands
    got.out["counts"]["candidates"] = len(cands)
    kept = _ranked(cands, got.records, got.req, mem.config.threshold if threshold is None else threshold)
    got.out["hits"] = _hits(kept, got.records, got.state, mem.config, got.req, got.scope, got.lex)
    return got.out


# -- 1. filters ------------------------------------------------------------------------------
def _as_of(snap: Snapshot, scan: LogScan, as_of: str, out: QueryResult) -> np.ndarray:
    """Which records were live at ``as_of`` (by position), counted in the answer's ``query.as_of``."""
    live = live_mask(scan, iso_to_epoch(as_of) or 0.0, snap.timeline)
    count = int(live.sum())
    out["counts"]["records"] = count
    out["query"]["as_of"] = {"time": out["query"]["filters"]["as_of"], "live": count,
                             "retired_since": int((live & ~snap.alive[:len(live)]).sum()), "without_vector": 0}
    return live


def _filtered(snap: Snapshot, scan: LogScan, req: Request, terms: list[str], out: QueryResult,
              live: np.ndarray | None = None) -> tuple[np.ndarray | None, np.ndarray] | None:
    """What the filters allow (None: every live record) and the scope's positions; None (with a
    warning on the answer where one helps) when there is nothing to rank.  ``live``: the records
    live at an as-of query's time (default: those live now)."""
    if not scan.records or not terms:
        if scan.records and not terms:
            out["warnings"].append({"code": codes.QUERY_NO_TERMS,
                                    "message": "the query has only stop words or punctuation"})
        return None  # an empty store or a term-less query never loads the model
    allowed = snap.allowed(req.type, req.phase, req.tags, phase_exact=req.phase_exact, alive=live,
                           domain=req.domain)
    positions = np.flatnonzero(snap.alive) if allowed is None else allowed
    if req.since is not None:
        allowed = positions = _created_since(scan, positions, req.since)
    if req.positions is not None:
        allowed = positions = positions[np.isin(positions, req.positions)]
    if len(positions) == 0:
        if live is not None:
            out["warnings"].append({"code": codes.FILTERS_MATCH_NOTHING,
                                    "message": "no record live at the as_of time passes the filters",
                                    "filters": out["query"]["filters"]})
        elif scan.live_count:
            out["warnings"].append({"code": codes.FILTERS_MATCH_NOTHING,
                                    "message": "no live record passes the filters (type, phase, tags, domain); "
                                               "drop or widen them", "filters": out["query"]["filters"]})
        return None
    return allowed, positions


def _with_syntax(snap: Snapshot, scan: LogScan, parsed: Parsed, req: Request,
                 out: QueryResult) -> tuple[list[str], str, Request]:
    """The terms BM25 scores, the text the vector side embeds and the request restricted to the records
    that pass the syntax's conditions and field filters (``syntax.py``); a malformed text is read as
    plain words, with a warning."""
    if parsed.plain:
        out["warnings"].append({"code": codes.QUERY_SYNTAX, "message": parsed.warning or ""})
        if req.explain:
            out["query"]["parsed"] = {"plain": True}
        return tokenize(req.text), vector_text(req.text, parsed), req
    engine = snap.lexical_engine()
    prefixes = expansions(parsed, engine)
    size = len(scan.records)
    mask = Matcher(engine, lambda p: lexical_text(scan.records[p]), size, prefixes).all(parsed.conditions)
    if parsed.filters:
        fields = _field_mask(snap, scan, parsed.filters)
        mask = fields if mask is None else mask & fields
        out["query"]["filters"]["fields"] = {k: [echo(v) for v in vs[:MAX_TAGS]] for k, vs in parsed.filters.items()}
    if req.explain:
        out["query"]["parsed"] = parsed.explained(prefixes)
    if mask is not None:
        positions = np.flatnonzero(mask)
        if req.positions is not None:
            positions = positions[np.isin(positions, req.positions)]
        req = replace(req, positions=positions)
    return scored_terms(parsed, prefixes), vector_text(req.text, parsed), req


def _field_mask(snap: Snapshot, scan: LogScan, filters: dict[str, list[str]]) -> np.ndarray:
    """The records passing the text's field filters: any value of one field, every field."""
    n = len(scan.records)
    mask = np.ones(n, dtype=bool)
    for name, values in filters.items():
        if name == "id":
            ok = np.fromiter((rid in values for rid in scan.records.values("id")), dtype=bool, count=n)
        else:
            facet = {"type": snap.types, "phase": snap.phases, "domain": snap.domains}.get(name, snap.tags)
            ok = facet.where(_passes(name, values), n)
        mask &= ok
    return mask


def _passes(field: str, values: list[str]) -> Callable[[Any], bool]:
    """Whether a record's value of ``field`` (type, phase, domain; tags otherwise) passes a field filter."""
    if field == "phase":
        return lambda phase: any(phase_matches(phase, v) for v in values)
    if field in ("type", "domain"):
        return lambda value: value in values
    return lambda tags: any(t in values for t in tags or ())


def _created_since(scan: LogScan, positions: np.ndarray, since: str) -> np.ndarray:
    """The positions whose record was created at or after ``since`` (one without a time is left out)."""
    start = iso_to_epoch(since)
    times = [iso_to_epoch(scan.records[p].get("created_at")) for p in positions]
    keep: np.ndarray = positions[np.fromiter((t is not None and start is not None and t >= start for t in times),
                                             dtype=bool, count=len(times))]
    return keep


def _scope(mem: Searchable, req: Request, allowed: np.ndarray | None, positions: np.ndarray,
           live: np.ndarray | None = None) -> tuple[Scope, VectorState | None]:
    """The scope with its neighbours (among the records live now, or at an as-of query's time:
    ``live``) and context gate, and the vector layer caught up for it (None in mode ``lexical``).
    alpha and rrf keep their plain signals (gate 0)."""
    cfg, snap = mem.config, mem.snap
    scope = Scope(positions, *(snap.neighbours() if live is None else live_neighbours(live)),
                  n_cand=max(cfg.candidates, req.k))
    state = mem.sync_vectors(allowed, budget_s=QUERY_EMBED_BUDGET_S) if req.mode != "lexical" else None
    if uses_context(req.mode, req.fusion) and cfg.context == "auto":
        scope.gate = snap.context_gate(state.manifest if state is not None and state.degraded is None else None)
    return scope, state


def _side_weighted(req: Request, state: VectorState | None, out: QueryResult) -> Request:
    """The request with z fusion's weight from the memory's estimate (``sideweight.weight_of``),
    when the caller asked for it and the hybrid fuses by z; the answer echoes the weight used."""
    if not req.side_weights or req.mode != "hybrid" or req.fusion != "z" or state is None:
        return req
    side = sideweight.weight_of(state.manifest)
    weight = float(side["weight"]) if side is not None else req.alpha
    out["query"]["alpha"] = weight
    raw = (state.manifest or {}).get("side_weight")
    return replace(req, alpha=weight, side_weight=sideweight.explained(raw, weight))


# -- 3. vector side --------------------------------------------------------------------------
def _vector_stage(mem: Searchable, state: VectorState | None, text: str, scope: Scope, lex: LexicalSide,
                  out: QueryResult, live: np.ndarray | None = None, ahead: Pending | None = None
                  ) -> VectorSide | None:
    """The vector side, or None: in mode ``lexical``, or when the vector layer fails (found before
    this query or only now: a graph checked on first use, the model), which ``degraded`` says.  In an
    as-of query (``live``), records retired since may have no vector: they are ranked by their
    keywords, counted in ``query.as_of.without_vector``, not as the index being behind."""
    if state is None:
        return None
    degraded = state.degraded
    vec = None
    if degraded is None:
        try:
            vec = vector_side(lambda: query_vector(mem.embedder, text, ahead), state, mem.snap, scope,
                              np.array(sorted(lex.rank), dtype=np.int64))
        except (StoreError, EmbeddingError) as exc:
            degraded = exc.to_dict()
        else:
            pending = vec.pending
            if live is not None:
                gone = scope.positions[~mem.snap.alive[scope.positions]]
                missing = int(len(gone) - len(Cosines(state).with_vector(gone))) if len(gone) else 0
                out["query"]["as_of"]["without_vector"] = missing
                pending -= missing
            _note_vectors(out, state, pending)
    if degraded is not None:
        shown = {"code": degraded["code"], "message": degraded["message"]}
        if degraded.get("details"):
            shown["details"] = degraded["details"]
        out["degraded"] = shown
    return vec


def _note_vectors(out: QueryResult, state: VectorState, pending: int) -> None:
    """The answer's count of records without a vector, and the vector layer's warnings."""
    out["counts"]["pending"] = pending
    out["warnings"] += state.notes()
    if pending:
        out["warnings"].append({
            "code": codes.INDEX_BEHIND,
            "message": f"{pending} record(s) have no vector yet and were ranked lexically; "
                       "they are embedded in the background or by later writes, or run memory-rebuild",
        })


# -- 4. candidates ---------------------------------------------------------------------------
def _candidates(lex: LexicalSide, vec: VectorSide | None, scope: Scope) -> list[Candidate]:
    """Both sides' candidates, each with both signals (computed at once in numpy, then held)."""
    positions = np.array(sorted(set(lex.rank) | set(vec.rank if vec else ())), dtype=np.int64)
    contexts = lex.scores[positions]
    raw = lex.raw[positions].tolist()
    normalised = (contexts / lex.normaliser).tolist()
    lexical_z = ((contexts - lex.mean) / lex.sd).tolist()
    lexical_context = contexts.tolist()
    cosine, cosine_context, cosine_z = _vector_columns(vec, positions, scope)
    lexical_rank, vector_rank = lex.rank.get, (vec.rank if vec is not None else {}).get
    # (the fields by position, in their declared order: a few hundred keyword calls cost ~0.15 ms a query)
    return [
        Candidate(p, raw[i], normalised[i], cosine[i], lexical_rank(p), vector_rank(p), lexical_context[i],
                  lexical_z[i], cosine_context[i], cosine_z[i])
        for i, p in enumerate(positions.tolist())
    ]


Column = list[float | None]


def _vector_columns(vec: VectorSide | None, positions: np.ndarray, scope: Scope) -> tuple[Column, Column, Column]:
    """The candidates' cosine, ``c'`` and z-score of ``c'`` (None where a record has no vector)."""
    if vec is None or not len(positions):
        return [None] * len(positions), [None] * len(positions), [None] * len(positions)
    known = vec.known[positions]
    contexts = with_context(vec.cos, positions, scope.prev, scope.nxt, CONTEXT_VECTOR * scope.gate, of=vec.known)
    columns: tuple[Column, Column, Column] = (vec.cos[positions].tolist(), contexts.tolist(),
                                              ((contexts - vec.mean) / vec.sd).tolist())
    if known.all():  # (the usual case: every candidate has a vector)
        return columns
    has = known.tolist()
    cosine, cosine_context, cosine_z = ([v if h else None for v, h in zip(column, has)] for column in columns)
    return cosine, cosine_context, cosine_z


# -- 5. fusion -------------------------------------------------------------------------------
def _ranked(cands: list[Candidate], records: RecordList, req: Request, threshold: float) -> list[Candidate]:
    """The candidates kept by the query's ranking rule (``fusion.ranker``), best first; importance
    reorders near-ties only, it never admits a record (``fusion.py``)."""
    kept = ranker(req.mode, req.fusion)(cands, req.alpha, threshold)
    # (a column: no record decoded)
    for c, importance in zip(kept, records.values_at([c.position for c in kept], "importance")):
        c.fused = c.score
        if importance is not None:
            c.score *= importance_factor(importance)
    # best first, ties by position: the candidates come in position order (``_candidates``), which a stable
    # sort keeps among equal scores (reverse=True too), without a key tuple per candidate
    kept.sort(key=attrgetter("score"), reverse=True)
    return kept


def _hits(kept: list[Candidate], records: Sequence[Record], state: VectorState | None, cfg: MemoryConfig,
          req: Request, scope: Scope, lex: LexicalSide) -> list[Hit]:
    """The best ``k`` hits, near duplicates collapsed (``answer.py``)."""
    groups = groups_of(kept, state, cfg.near_duplicate, req.collapse, req.k)
    query_part: dict[str, Any] | None = None
    if req.explain:
        query_part = {"alpha": req.alpha, "fusion": req.fusion, "context_gate": round(scope.gate, 4),
                      "normaliser": round(lex.normaliser, 6)}
        if req.side_weight is not None:
            query_part["side_weight"] = req.side_weight
    return [hit_of(group, records, query_part) for group in groups[:req.k]]

"""Issue 24 harness: today's query path as numpy over Q x N matrices, with the vector side and the
fusion weight swappable.

It reuses the product read-only: ``evaluation.load_beir`` + ``runner._corpus_records`` (the records
memory-eval writes), ``records.embed_text`` / ``lexical_text``, ``tokenize``, ``PostingsBM25``, the
ONNX ``ModelEmbedder`` and ``pooling.pieces_for`` / ``pool_pieces`` (a record's pieces and its pooled
vector, exactly as written), ``neighbours.coherence`` / ``gate`` and the metric functions.
``check()`` compares every mode with memory-eval's JSON (results/product_baseline.json).

Embeddings (pieces, pooled records, queries, leave-one-out texts) are cached by text hash with the
product's ``CachedEmbedder`` under ~/.cache/nubos-memory/issue24 (memory-eval's own cache is read
first).  Reproduced query path (query.py):

* b' = bm25 + 0.5 g max(bm25 prev, bm25 next); c' = cos + 0.3 g max(...); g = coherence gate;
* z over the whole memory (cosine stats from a fixed 1,000-record sample above 5,000 records);
* candidates: top n_cand (= 101 in memory-eval) of raw>0 by b'  U  top n_cand by cos (+ neighbours
  when g > 0); admitted: raw > 0 or cos >= 0.25; hybrid score w z(b') + (1-w) z(c').
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
import numpy as np  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from nubos_memory.config import MemoryConfig  # noqa: E402
from nubos_memory.embed import make_embedder  # noqa: E402
from nubos_memory.embed.pooling import pieces_for, pool_pieces  # noqa: E402
from nubos_memory.evaluation import load_beir  # noqa: E402
from nubos_memory.evaluation.embedcache import CachedEmbedder, default_cache_dir  # noqa: E402
from nubos_memory.evaluation.runner import _corpus_records  # noqa: E402
from nubos_memory.index.lexical import B, K1, PostingsBM25  # noqa: E402
from nubos_memory.records import embed_text, lexical_text  # noqa: E402
from nubos_memory.search.neighbours import coherence, gate  # noqa: E402
from nubos_memory.tokenize import tokenize  # noqa: E402

DATA = REPO.parent / "shared" / "datasets"
SESS = Path(os.environ.get("ISSUE24_SESSIONS", "/tmp/issue24/sessions"))
SETS = {
    "sessions": [SESS / f"conv-0{i}" for i in range(5)],
    "turns": [DATA / "locomo-dev" / f"conv-0{i}" for i in range(5)],
    "scifact": [DATA / "scifact"],
}
N_CAND = 101  # memory-eval asks for depth 101, so each side proposes 101
THR = 0.25
EXACT_LIMIT = 5000
STATS_SAMPLE = 1000

# ------------------------------------------------------------------ embedding (product ONNX, cached)
_EMB: dict = {}


def emb():
    if "e" not in _EMB:
        cfg = MemoryConfig()
        inner = make_embedder(cfg.provider, cfg.model or "", cfg.runtime, cfg.device)
        ce = CachedEmbedder(inner, default_cache_dir().parent / "issue24")
        main = CachedEmbedder(inner, default_cache_dir())  # memory-eval's cache, read only
        for k, i in main._keys.items():
            if k not in ce._keys:
                ce._keys[k] = len(ce._vecs)
                ce._vecs.append(main._vecs[i])
        _EMB["e"], _EMB["inner"] = ce, inner
    return _EMB["e"]


def embed(texts: list[str]) -> np.ndarray:
    e = emb()
    out = [e.embed(texts[i:i + 64]) for i in range(0, len(texts), 64)] if texts else [np.zeros((0, 384), np.float32)]
    e.save()
    return np.concatenate(out).astype(np.float64)


def embed_queries(texts: list[str]) -> np.ndarray:
    """One text at a time, as the product embeds a query (its single-text path)."""
    e = emb()
    keys = [hashlib.sha256(t.encode()).hexdigest()[:32] for t in texts]
    out = []
    for t, k in zip(texts, keys):
        out.append(e.embed([t])[0])
    e.save()
    return np.stack(out).astype(np.float64)


def split_pieces(texts: list[str]) -> tuple[list[str], np.ndarray]:
    runtime = _EMB["inner"].runtime() if "inner" in _EMB else (emb(), _EMB["inner"].runtime())[1]
    pieces, owner = pieces_for(runtime, texts)
    return pieces, np.asarray(owner)


# ------------------------------------------------------------------ data
@dataclass
class Unit:
    name: str
    recs: list[dict]
    ids: list[str]
    qids: list[str]
    qtexts: list[str]
    qrels: dict
    tokens: list[list[str]] = None
    raw: np.ndarray = None  # Q x N BM25
    selfs: np.ndarray = None
    qv: np.ndarray = None  # Q x d
    pv: np.ndarray = None  # pieces x d
    owner: np.ndarray = None  # piece -> record
    pooled: np.ndarray = None  # N x d (pool_pieces of the pieces: what the product stores)
    g: float = 0.0
    extra: dict = field(default_factory=dict)


def load(folder: Path, split: str = "test", name: str | None = None) -> Unit:
    corpus, queries, qrels = load_beir(folder, split)
    ids_map, recs = _corpus_records(corpus)
    ids = [str(d["_id"]) for d in corpus]
    qids = sorted(qrels, key=lambda q: (len(q), q))
    u = Unit(name or folder.name, recs, ids, qids, [queries[q] for q in qids], qrels)
    u.tokens = [tokenize(lexical_text(r)) for r in recs]
    bm = PostingsBM25()
    bm.add(u.tokens)
    u.bm = bm
    u.raw = np.zeros((len(qids), len(recs)))
    u.selfs = np.zeros(len(qids))
    for i, t in enumerate(u.qtexts):
        terms = tokenize(t)
        if terms:
            u.raw[i] = bm.scores(terms)
            u.selfs[i] = bm.self_score(terms)
    texts = [embed_text(r) for r in recs]
    pieces, owner = split_pieces(texts)
    u.pv = embed(pieces)
    u.owner = owner
    u.pooled = pool_pieces(u.pv.astype(np.float32), owner, len(recs)).astype(np.float64)
    u.qv = embed_queries(u.qtexts)
    u.g = gate(coherence(u.pooled))
    u.starts = np.flatnonzero(np.r_[True, owner[1:] != owner[:-1]])
    return u


def piece_max(u: Unit, qv: np.ndarray) -> np.ndarray:
    """Q x N: each record's best piece cosine."""
    pc = qv @ u.pv.T
    return np.maximum.reduceat(pc, u.starts, axis=1)


# ------------------------------------------------------------------ the query path
def _nbmax(x: np.ndarray) -> np.ndarray:
    prev = np.full_like(x, -np.inf)
    nxt = np.full_like(x, -np.inf)
    prev[:, 1:], nxt[:, :-1] = x[:, :-1], x[:, 1:]
    m = np.maximum(prev, nxt)
    return np.where(np.isfinite(m), m, 0.0)


def top_mask(s: np.ndarray, n: int, valid: np.ndarray | None = None) -> np.ndarray:
    s = s if valid is None else np.where(valid, s, -np.inf)
    order = np.argsort(-s, axis=1, kind="stable")[:, :n]
    m = np.zeros(s.shape, dtype=bool)
    np.put_along_axis(m, order, True, axis=1)
    return m if valid is None else m & valid


def zstats(x: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    if n > EXACT_LIMIT:
        idx = np.sort(np.random.default_rng(n).choice(np.arange(n), STATS_SAMPLE, replace=False))
        x = x[:, idx]
    return x.mean(1), np.maximum(x.std(1), 1e-9)


@dataclass
class Sides:
    raw: np.ndarray
    cos: np.ndarray
    bctx: np.ndarray
    cctx: np.ndarray
    zl: np.ndarray
    zc: np.ndarray
    lex_top: np.ndarray
    vec_top: np.ndarray


def sides(u: Unit, cos: np.ndarray, raw: np.ndarray | None = None, g: float | None = None) -> Sides:
    raw = u.raw if raw is None else raw
    g = u.g if g is None else g
    bctx = raw + 0.5 * g * _nbmax(raw) if g > 0 else raw
    cctx = cos + 0.3 * g * _nbmax(cos) if g > 0 else cos
    n = raw.shape[1]
    lm, ls = bctx.mean(1), np.maximum(bctx.std(1), 1e-9)
    cm, cs = zstats(cctx, n)
    zl = (bctx - lm[:, None]) / ls[:, None]
    zc = (cctx - cm[:, None]) / cs[:, None]
    lex_top = top_mask(bctx, N_CAND, raw > 0)
    vt = top_mask(cos, N_CAND)
    if g > 0:
        nb = np.zeros_like(vt)
        nb[:, 1:] |= vt[:, :-1]
        nb[:, :-1] |= vt[:, 1:]
        vt = vt | nb
    return Sides(raw, cos, bctx, cctx, zl, zc, lex_top, vt)


def rank_hybrid(s: Sides, w) -> tuple[np.ndarray, np.ndarray]:
    w = np.asarray(w, dtype=np.float64).reshape(-1, 1) if np.ndim(w) else w
    keep = (s.lex_top | s.vec_top) & ((s.raw > 0) | (s.cos >= THR))
    return w * s.zl + (1 - w) * s.zc, keep


def rank_lexical(s: Sides):
    return s.bctx, s.lex_top


def rank_vector(s: Sides):
    return s.cctx, s.vec_top


def rank_alpha(u: Unit, cos: np.ndarray, alpha: float = 0.3):
    raw = u.raw
    bm = raw / np.maximum(np.maximum(raw.max(1), u.selfs), 1e-12)[:, None]
    keep = (top_mask(raw, N_CAND, raw > 0) | top_mask(cos, N_CAND)) & ((raw > 0) | (cos >= THR))
    return np.where(raw > 0, alpha * bm + (1 - alpha) * cos, (1 - alpha) * cos), keep


def rank_rrf(u: Unit, cos: np.ndarray, k: int = 60):
    raw = u.raw
    lt, vt = top_mask(raw, N_CAND, raw > 0), top_mask(cos, N_CAND)

    def ranks(x, m):
        order = np.argsort(-np.where(m, x, -np.inf), axis=1, kind="stable")
        r = np.empty_like(order)
        np.put_along_axis(r, order, np.arange(1, x.shape[1] + 1)[None, :].repeat(x.shape[0], 0), axis=1)
        return r
    s = np.where(lt, 1.0 / (k + ranks(raw, lt)), 0) + np.where(vt, 1.0 / (k + ranks(cos, vt)), 0)
    keep = (lt | vt) & ((raw > 0) | (cos >= THR))
    return s, keep


# ------------------------------------------------------------------ metrics
def gains(u: Unit) -> np.ndarray:
    if "gains" not in u.extra:
        pos = {d: i for i, d in enumerate(u.ids)}
        G = np.zeros(u.raw.shape)
        for qi, q in enumerate(u.qids):
            for d, gval in u.qrels[q].items():
                if d in pos:
                    G[qi, pos[d]] = gval
        u.extra["gains"] = G
    return u.extra["gains"]


def metrics(u: Unit, score: np.ndarray, keep: np.ndarray) -> dict[str, np.ndarray]:
    """Per query: recall@5, recall@10, nDCG@10, MRR@10 (trec_eval / memory-eval definitions)."""
    G = gains(u)
    s = np.where(keep, score, -np.inf)
    order = np.argsort(-s, axis=1, kind="stable")[:, :10]
    valid = np.take_along_axis(keep, order, axis=1)
    g = np.take_along_axis(G, order, axis=1) * valid
    npos = np.maximum((G > 0).sum(1), 1)
    disc = 1.0 / np.log2(np.arange(2, 12))
    ideal = (-np.sort(-G, axis=1)[:, :10] * disc).sum(1)
    hit = g > 0
    first = np.where(hit.any(1), hit.argmax(1) + 1, 0)
    return {"recall@5": hit[:, :5].sum(1) / npos, "recall@10": hit.sum(1) / npos,
            "ndcg@10": np.where(ideal > 0, (g * disc).sum(1) / np.maximum(ideal, 1e-12), 0.0),
            "mrr@10": np.where(first > 0, 1.0 / np.maximum(first, 1), 0.0)}


_UNITS: dict[str, list[Unit]] = {}


def units(name: str) -> list[Unit]:
    if name not in _UNITS:
        _UNITS[name] = [load(f, name=f"{name}/{f.name}") for f in SETS[name]]
    return _UNITS[name]


def mean_over(per_unit: list[dict[str, np.ndarray]]) -> dict[str, float]:
    return {m: float(np.concatenate([p[m] for p in per_unit]).mean()) for m in per_unit[0]}


def check() -> None:
    base = json.loads((REPO / "experiments" / "issue24" / "results" / "product_baseline.json").read_text())
    for name in SETS:
        us = units(name)
        rows = {}
        for mode in ("lexical", "vector", "hybrid", "alpha", "rrf"):
            per = []
            for u in us:
                s = sides(u, u.qv @ u.pooled.T)
                sc = {"lexical": lambda: rank_lexical(s), "vector": lambda: rank_vector(s),
                      "hybrid": lambda: rank_hybrid(s, 0.3), "alpha": lambda: rank_alpha(u, s.cos),
                      "rrf": lambda: rank_rrf(u, s.cos)}[mode]()
                per.append(metrics(u, *sc))
            rows[mode] = mean_over(per)
            ref = base[f"{name}@k10"]["modes"][mode]
            ref5 = base.get(f"{name}@k5", {}).get("modes", {}).get(mode, {})
            print(f"{name:9s} {mode:8s} harness r@5 {rows[mode]['recall@5']:.4f} r@10 {rows[mode]['recall@10']:.4f} "
                  f"ndcg {rows[mode]['ndcg@10']:.4f} mrr {rows[mode]['mrr@10']:.4f} | product r@5 "
                  f"{ref5.get('recall@5', float('nan')):.4f} r@10 {ref['recall@10']:.4f} ndcg {ref['ndcg@10']:.4f} "
                  f"mrr {ref['mrr@10']:.4f}", flush=True)


if __name__ == "__main__":
    check()

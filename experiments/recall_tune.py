"""Recall on short conversational memories: templates, fusion and neighbour context.

An offline harness for the LoCoMo-recall issue.  It reuses the package's own
pieces read-only -- ``PostingsBM25`` + ``tokenize`` + ``lexical_text`` for BM25,
``SentenceTransformerEmbedder`` (window pooling included) for vectors,
``load_beir`` and the metric functions of ``nubos_memory.evaluation`` -- and
precomputes, per memory, the full query x record matrices of raw BM25 and of
cosine similarity.  Every fusion variant is then a few numpy operations over
those matrices, so hundreds of variants run in seconds.

Memories ("units"): LoCoMo conv-00..04 (each conversation its own memory; split
"test"), SciFact (one memory; its train queries choose, its test queries report).

The product's query path, reproduced (``--check`` compares with memory-eval):

* candidates = BM25 top-100 (raw > 0, ties by log position) U vector top-100
  (exact scan, ties by position); every candidate gets its exact raw BM25 and
  its exact cosine;
* alpha fusion: ``a*bm25/max(best, S(q)) + (1-a)*cos``; raw = 0 is kept only if
  cos >= 0.25 and scores ``(1-a)*cos``; rank by (-score, position).

Embeddings are cached as .npy (+ .json sidecar with the sha256 of the texts)
under $RECALL_TUNE_CACHE (default /tmp/recall_tune_cache); before embedding, a
text is looked up in memory-eval's own cache (~/.cache/nubos-memory).

Datasets: $LOCOMO_DIR and $SCIFACT_DIR, else ``locomo-dev/`` and ``scifact/`` under
$NUBOS_MEMORY_DATASETS, else under ../shared/datasets beside the repository.

Run (repository root, project venv)::

    .venv/bin/python experiments/recall_tune.py embed --units locomo --templates nl,colon,colon_nl,body,dot,ctxprev,ctxnext,ctx3
    .venv/bin/python experiments/recall_tune.py embed --units scifact --templates nl,smart
    .venv/bin/python experiments/recall_tune.py embed --units agent --templates nl,smart
    .venv/bin/python experiments/recall_tune.py check --units conv-00,scifact   # vs memory-eval JSON in $RT_BASE
    .venv/bin/python experiments/recall_tune_exp.py final        # experiments: see recall_tune_exp.py

``proposal()`` at the end is the recommended default as the product would run it
(experiments/recall_tune_results.md).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from nubos_memory.evaluation import load_beir, ndcg_at_k, recall_at_k, record_id  # noqa: E402
from nubos_memory.index.lexical import PostingsBM25  # noqa: E402
from nubos_memory.records import MAX_BODY, MAX_TITLE, lexical_text  # noqa: E402
from nubos_memory.tokenize import tokenize  # noqa: E402

# Datasets: $LOCOMO_DIR / $SCIFACT_DIR, else under $NUBOS_MEMORY_DATASETS, else ../shared/datasets beside the repository.
DATASETS = Path(os.environ.get("NUBOS_MEMORY_DATASETS") or REPO.parent / "shared" / "datasets")
LOCOMO = Path(os.environ.get("LOCOMO_DIR") or DATASETS / "locomo-dev")
SCIFACT = Path(os.environ.get("SCIFACT_DIR") or DATASETS / "scifact")
CACHE = Path(os.environ.get("RECALL_TUNE_CACHE", "/tmp/recall_tune_cache"))
N_CAND = 100
THRESHOLD = 0.25
K = 10


# ------------------------------------------------------------------ templates
def t_nl(recs, i):  # today: "{title}\n{body}"
    return recs[i]["title"] + "\n" + recs[i]["body"]


def t_colon(recs, i):  # "{title}: {body}"
    return recs[i]["title"] + ": " + recs[i]["body"]


def t_colon_nl(recs, i):  # "{title}:\n{body}" -- same wordpieces as colon, keeps the first line for the chunker
    return recs[i]["title"] + ":\n" + recs[i]["body"]


def _punct_title(title: str) -> str:
    """The title with a colon unless it already ends in punctuation."""
    t = title.rstrip()
    return t if t[-1:] in ".:!?;" else t + ":"


def t_smart(recs, i):  # "{title}:\n{body}", no colon after a title that ends in punctuation
    return _punct_title(recs[i]["title"]) + "\n" + recs[i]["body"]


def t_body(recs, i):
    return recs[i]["body"] or recs[i]["title"]


def t_dot(recs, i):  # "{title}.\n{body}"
    t = recs[i]["title"].rstrip()
    return (t if t[-1:] in ".:!?;" else t + ".") + "\n" + recs[i]["body"]


def _line(rec) -> str:
    return _punct_title(rec["title"]) + " " + rec["body"]


def t_ctxprev(recs, i):  # "{prev title}: {prev body}\n{title}: {body}" -- this record last
    cur = _punct_title(recs[i]["title"]) + "\n" + recs[i]["body"]
    return (_line(recs[i - 1]) + "\n" + cur) if i > 0 else cur


def t_ctxnext(recs, i):  # the record first, then the next one
    cur = _punct_title(recs[i]["title"]) + "\n" + recs[i]["body"]
    return (cur + "\n" + _line(recs[i + 1])) if i + 1 < len(recs) else cur


def t_ctx3(recs, i):  # previous, this, next
    parts = []
    if i > 0:
        parts.append(_line(recs[i - 1]))
    parts.append(_line(recs[i]))
    if i + 1 < len(recs):
        parts.append(_line(recs[i + 1]))
    return "\n".join(parts)


TEMPLATES: dict[str, Callable] = {
    "nl": t_nl, "colon": t_colon, "colon_nl": t_colon_nl, "smart": t_smart, "body": t_body, "dot": t_dot,
    "ctxprev": t_ctxprev, "ctxnext": t_ctxnext, "ctx3": t_ctx3,
}


# ------------------------------------------------------------------ data
@dataclass
class Unit:
    name: str
    recs: list[dict]
    ids: list[str]
    qids: list[str]
    qtexts: list[str]
    qrels: dict[str, dict[str, int]]  # qid -> {doc id: gain} (all splits we use)
    splits: dict[str, np.ndarray]  # split -> indices into qids
    raw: np.ndarray = None  # Q x N raw BM25
    selfs: np.ndarray = None  # Q self-scores
    gains: np.ndarray = None  # Q x N gains
    doclen: np.ndarray = None  # tokens per record (lexical)
    qvec: np.ndarray = None
    dvec: dict[str, np.ndarray] = field(default_factory=dict)
    cos: dict[str, np.ndarray] = field(default_factory=dict)


def _records(corpus):
    recs, ids = [], []
    for doc in corpus:
        did = str(doc.get("_id"))
        text = str(doc.get("text") or "")
        title = str(doc.get("title") or "").strip() or (text[:80].strip() or did)
        recs.append({"id": record_id(did), "title": title[:MAX_TITLE], "body": text[:MAX_BODY], "tags": []})
        ids.append(did)
    return recs, ids


AGENT_QUERIES = {  # sanity check on examples/agent-memories.jsonl: README's four examples + paraphrases
    "how do I ship a build?": "lrn-0002",
    "Add SCIM deprovisioning so Okta can suspend users in a tenant": "res-0015",
    "plan: sign access tokens for the new mobile API": "dec-0001",
    "review: invoice export endpoint loads every customer row one by one": "crt-0001",
    "why did the signature check on incoming webhooks fail?": "lrn-0003",
    "storing amounts of money": "lrn-0005",
    "German characters render as empty boxes in generated documents": "lrn-0009",
    "which background job library should we use": "res-0005",
    "tests fail in CI around midnight": "lrn-0018",
    "how do we undo a bad deploy?": "lrn-0024",
    "pods restarted during a database failover": "lrn-0022",
    "passwords leaking in build output": "crt-0010",
}


def load_agent() -> Unit:
    recs = [json.loads(line) for line in open(REPO / "examples" / "agent-memories.jsonl", encoding="utf-8")]
    ids = [r["id"] for r in recs]
    qids = [f"test:a{i:02d}" for i in range(len(AGENT_QUERIES))]
    qrels = {q: {d: 1} for q, d in zip(qids, AGENT_QUERIES.values())}
    return Unit("agent", recs, ids, qids, list(AGENT_QUERIES), qrels, {"test": np.arange(len(qids))})


def load_unit(name: str) -> Unit:
    if name == "agent":
        return load_agent()
    if name.startswith("conv-"):
        corpus, queries, qrels = load_beir(LOCOMO / name, "test")
        splits_q = {"test": qrels}
    elif name == "scifact":
        corpus, queries, tr = load_beir(SCIFACT, "train")
        _, _, te = load_beir(SCIFACT, "test")
        splits_q = {"train": tr, "test": te}
    else:
        raise SystemExit(f"unknown unit {name}")
    recs, ids = _records(corpus)
    qids, qrels_all, splits = [], {}, {}
    for split, qr in splits_q.items():
        # memory-eval's order: sorted by (len, id)
        order = sorted(qr, key=lambda q: (len(q), q))
        idx = []
        for q in order:
            key = f"{split}:{q}"
            idx.append(len(qids))
            qids.append(key)
            qrels_all[key] = qr[q]
        splits[split] = np.array(idx)
    qtexts = [queries[q.split(":", 1)[1]] for q in qids]
    return Unit(name, recs, ids, qids, qtexts, qrels_all, splits)


def build_lexical(u: Unit) -> None:
    bm = PostingsBM25()
    docs = [tokenize(lexical_text(r)) for r in u.recs]
    bm.add(docs)
    u.doclen = np.array([len(d) for d in docs], dtype=np.float64)
    Q, N = len(u.qids), len(u.recs)
    u.raw = np.zeros((Q, N), dtype=np.float64)
    u.selfs = np.zeros(Q)
    for qi, text in enumerate(u.qtexts):
        terms = tokenize(text)
        if terms:
            u.raw[qi] = bm.scores(terms)
            u.selfs[qi] = bm.self_score(terms)
    pos = {d: i for i, d in enumerate(u.ids)}
    u.gains = np.zeros((Q, N), dtype=np.float32)
    for qi, q in enumerate(u.qids):
        for d, g in u.qrels[q].items():
            if d in pos:
                u.gains[qi, pos[d]] = g
    u.bm = bm
    u.tokens = docs


# ------------------------------------------------------------------ embeddings
_EMB = None


def embedder():
    global _EMB
    if _EMB is None:
        import torch

        torch.set_num_threads(int(os.environ.get("RT_THREADS", "2")))
        from nubos_memory.limits import DEFAULT_MODEL
        from nubos_memory.embed.model import ModelEmbedder as SentenceTransformerEmbedder

        _EMB = SentenceTransformerEmbedder(DEFAULT_MODEL)
    return _EMB


def _eval_cache():
    """memory-eval's cache (text sha256[:32] -> vector), read-only."""
    from nubos_memory.evaluation import default_cache_dir

    out = {}
    root = default_cache_dir()
    if not root.is_dir():
        return out
    for folder in root.iterdir():
        try:
            keys = json.loads((folder / "keys.json").read_bytes())
            vecs = np.load(folder / "vectors.npy", allow_pickle=False)
        except (OSError, ValueError):
            continue
        if len(keys) == len(vecs) and vecs.shape[1] == 384:
            out.update({k: vecs[i] for i, k in enumerate(keys)})
    return out


def _save_npy(path: Path, arr: np.ndarray, texts: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    np.save(buf, arr.astype(np.float32), allow_pickle=False)
    path.write_bytes(buf.getvalue())
    path.with_suffix(".json").write_text(json.dumps({"sha256": _digest(texts), "n": len(texts)}))


def _digest(texts: list[str]) -> str:
    h = hashlib.sha256()
    for t in texts:
        h.update(t.encode("utf-8") + b"\x00")
    return h.hexdigest()


def embed_texts(texts: list[str], path: Path, label: str) -> np.ndarray:
    side = path.with_suffix(".json")
    if path.exists() and side.exists() and json.loads(side.read_text())["sha256"] == _digest(texts):
        return np.load(path, allow_pickle=False)
    cache = _eval_cache()
    keys = [hashlib.sha256(t.encode("utf-8")).hexdigest()[:32] for t in texts]
    out = np.zeros((len(texts), 384), dtype=np.float32)
    todo = []
    for i, k in enumerate(keys):
        if k in cache:
            out[i] = cache[k]
        else:
            todo.append(i)
    print(f"[embed] {label}: {len(texts)} texts, {len(texts) - len(todo)} from memory-eval's cache", file=sys.stderr)
    t0 = time.time()
    step = 256
    for s in range(0, len(todo), step):
        chunk = todo[s:s + step]
        out[chunk] = embedder().embed([texts[i] for i in chunk])
        print(f"[embed] {label}: {min(s + step, len(todo))}/{len(todo)} {time.time() - t0:.0f}s", file=sys.stderr)
    _save_npy(path, out, texts)
    return out


def load_vectors(u: Unit, template: str, allow_embed: bool = True) -> None:
    if u.qvec is None:
        u.qvec = embed_texts(u.qtexts, CACHE / u.name / "queries.npy", f"{u.name} queries")
    if template in u.dvec:
        return
    texts = [TEMPLATES[template](u.recs, i) for i in range(len(u.recs))]
    path = CACHE / u.name / f"docs-{template}.npy"
    if not allow_embed and not path.exists():
        raise SystemExit(f"no cached vectors for {u.name}/{template}")
    u.dvec[template] = embed_texts(texts, path, f"{u.name} {template}")
    u.cos[template] = u.qvec.astype(np.float64) @ u.dvec[template].astype(np.float64).T


# ------------------------------------------------------------------ ranking + metrics
def top_mask(scores: np.ndarray, n: int, valid: np.ndarray | None = None) -> np.ndarray:
    """Q x N bool: each row's n best (ties by position) among ``valid``."""
    s = scores if valid is None else np.where(valid, scores, -np.inf)
    order = np.argsort(-s, axis=1, kind="stable")[:, :n]
    m = np.zeros(s.shape, dtype=bool)
    np.put_along_axis(m, order, True, axis=1)
    if valid is not None:
        m &= valid
    return m


def rank_metrics(u: Unit, fused: np.ndarray, keep: np.ndarray, rows: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Per-query recall@10, nDCG@10, recall@100 of the ranking by ``fused`` among ``keep``."""
    if rows is not None:
        fused, keep, gains = fused[rows], keep[rows], u.gains[rows]
    else:
        gains = u.gains
    s = np.where(keep, fused, -np.inf)
    order = np.argsort(-s, axis=1, kind="stable")[:, :100]
    valid = np.take_along_axis(keep, order, axis=1)
    g = np.take_along_axis(gains, order, axis=1) * valid
    npos = (gains > 0).sum(1)
    r10 = (g[:, :K] > 0).sum(1) / np.maximum(npos, 1)
    r100 = (g > 0).sum(1) / np.maximum(npos, 1)
    disc = 1.0 / np.log2(np.arange(2, K + 2))
    dcg = (g[:, :K] * disc).sum(1)
    ideal = -np.sort(-gains, axis=1)[:, :K]
    idcg = (ideal * disc).sum(1)
    ndcg = np.where(idcg > 0, dcg / np.maximum(idcg, 1e-12), 0.0)
    return {"recall@10": r10, "ndcg@10": ndcg, "recall@100": r100}


def _selftest_metrics(u: Unit, fused, keep, rows) -> None:
    """Cross-check the vectorised metrics against nubos_memory.evaluation's on a few queries."""
    m = rank_metrics(u, fused, keep, rows)
    for j, qi in enumerate(rows[:25]):
        s = np.where(keep[qi], fused[qi], -np.inf)
        order = [int(p) for p in np.argsort(-s, kind="stable")[:100] if keep[qi, p]]
        ranked = [u.ids[p] for p in order]
        rel = u.qrels[u.qids[qi]]
        assert abs(recall_at_k(ranked, rel, 10) - m["recall@10"][j]) < 1e-9
        assert abs(ndcg_at_k(ranked, rel, 10) - m["ndcg@10"][j]) < 1e-6


# ------------------------------------------------------------------ scoring context
@dataclass
class Ctx:
    """What a fusion rule sees for one unit and template (all Q x N)."""

    u: Unit
    raw: np.ndarray
    bm: np.ndarray  # raw / max(best, S(q))
    cos: np.ndarray
    lex_top: np.ndarray  # BM25 top-100 (raw > 0)
    vec_top: np.ndarray  # vector top-100
    pool: np.ndarray  # union


def make_ctx(u: Unit, template: str, raw: np.ndarray | None = None, cos: np.ndarray | None = None,
             extra_pool: np.ndarray | None = None) -> Ctx:
    raw = u.raw if raw is None else raw
    cos = u.cos[template] if cos is None else cos
    best = raw.max(1)
    div = np.maximum(np.maximum(best, u.selfs), 1e-12)
    bm = raw / div[:, None]
    lex_top = top_mask(raw, N_CAND, raw > 0)
    vec_top = top_mask(cos, N_CAND)
    pool = lex_top | vec_top
    if extra_pool is not None:
        pool = pool | extra_pool
    return Ctx(u, raw, bm, cos, lex_top, vec_top, pool)


# ------------------------------------------------------------------ fusion rules
def f_lexical(c: Ctx):
    return c.bm, c.lex_top


def f_vector(c: Ctx):
    return c.cos, c.vec_top


def f_alpha(c: Ctx, alpha=0.3, thr=THRESHOLD):
    keep = c.pool & ((c.raw > 0) | (c.cos >= thr))
    return alpha * c.bm + (1 - alpha) * c.cos, keep


def _stats(scores: np.ndarray, top: np.ndarray, n: int = N_CAND):
    """Mean, std, max, min of each row's scores over that side's own top list."""
    cnt = top.sum(1)
    s = np.where(top, scores, 0.0)
    mean = s.sum(1) / np.maximum(cnt, 1)
    var = np.where(top, (scores - mean[:, None]) ** 2, 0.0).sum(1) / np.maximum(cnt, 1)
    mx = np.where(top, scores, -np.inf).max(1)
    mn = np.where(top, scores, np.inf).min(1)
    return mean, np.sqrt(var), mx, mn, cnt


def norm_side(scores: np.ndarray, top: np.ndarray, how: str) -> np.ndarray:
    mean, std, mx, mn, cnt = _stats(scores, top)
    if how == "z":
        return (scores - mean[:, None]) / np.maximum(std, 1e-9)[:, None]
    if how == "minmax":
        return (scores - mn[:, None]) / np.maximum(mx - mn, 1e-9)[:, None]
    if how == "dbsf":  # (s - (mu - 3 sd)) / (6 sd)
        return (scores - (mean - 3 * std)[:, None]) / np.maximum(6 * std, 1e-9)[:, None]
    if how == "max":
        return scores / np.maximum(mx, 1e-9)[:, None]
    raise ValueError(how)


def f_norm(c: Ctx, how="z", w_lex=0.5, lex_src="raw", thr=THRESHOLD, lex_pool="top"):
    """Each side normalised by its own top-100 distribution for the query, then a weighted sum.

    ``lex_src``: "raw" (raw BM25) or "bm" (self-score normalised; the same up to a per-query factor
    for z/minmax/dbsf).  Vector-only candidates (raw = 0) keep the cosine threshold as admission and
    score with their real (zero) BM25 normalised like any other."""
    lex = c.raw if lex_src == "raw" else c.bm
    nl = norm_side(lex, c.lex_top, how)
    nv = norm_side(c.cos, c.vec_top, how)
    keep = c.pool & ((c.raw > 0) | (c.cos >= thr))
    return w_lex * nl + (1 - w_lex) * nv, keep


def sharpness(scores: np.ndarray, top: np.ndarray, how: str, k: int = 10) -> np.ndarray:
    """How sharply a side separates its best candidates (per query)."""
    mean, std, mx, mn, cnt = _stats(scores, top)
    srt = -np.sort(-np.where(top, scores, -np.inf), axis=1)
    srt = np.where(np.isfinite(srt), srt, np.nan)
    topk = np.nanmean(srt[:, :k], axis=1)
    if how == "gap1k":  # (s1 - mean of top k) / sd over top-100
        return (mx - topk) / np.maximum(std, 1e-9)
    if how == "gapk":  # (mean of top k - mean top 100) / sd
        return (topk - mean) / np.maximum(std, 1e-9)
    if how == "cv":
        return std / np.maximum(np.abs(mean), 1e-9)
    if how == "gap12":
        return (srt[:, 0] - np.nan_to_num(srt[:, 1], nan=srt[:, 0])) / np.maximum(std, 1e-9)
    raise ValueError(how)


def f_sharp(c: Ctx, how="z", sharp="gapk", k=10, power=1.0, thr=THRESHOLD, floor=0.0):
    nl = norm_side(c.raw, c.lex_top, how)
    nv = norm_side(c.cos, c.vec_top, how)
    sl = np.nan_to_num(sharpness(c.raw, c.lex_top, sharp, k)) ** power
    sv = np.nan_to_num(sharpness(c.cos, c.vec_top, sharp, k)) ** power
    wl = (sl + floor) / np.maximum(sl + sv + 2 * floor, 1e-9)
    keep = c.pool & ((c.raw > 0) | (c.cos >= thr))
    return wl[:, None] * nl + (1 - wl[:, None]) * nv, keep


def exact_rank(scores: np.ndarray) -> np.ndarray:
    """1-based rank of every record by score (ties by position), per row."""
    order = np.argsort(-scores, axis=1, kind="stable")
    r = np.empty_like(order)
    np.put_along_axis(r, order, np.arange(1, scores.shape[1] + 1)[None, :].repeat(scores.shape[0], 0), axis=1)
    return r


def f_rrf(c: Ctx, k=60, exact=True, tiebreak=True, thr=THRESHOLD, w_lex=0.5):
    """RRF.  ``exact``: both ranks from the full exact score orderings (every candidate has both);
    else a side contributes only for its own top-100 (the product's --fusion rrf).
    Tie-break: + 1e-6 * (bm + cos)."""
    rl = exact_rank(np.where(c.raw > 0, c.raw, -np.inf))
    rv = exact_rank(c.cos)
    if exact:
        sl = np.where(c.raw > 0, 1.0 / (k + rl), 0.0)
        sv = 1.0 / (k + rv)
    else:
        sl = np.where(c.lex_top, 1.0 / (k + rl), 0.0)
        sv = np.where(c.vec_top, 1.0 / (k + rv), 0.0)
    s = 2 * (w_lex * sl + (1 - w_lex) * sv)
    if tiebreak:
        s = s + 1e-7 * (c.bm + c.cos)
    keep = c.pool & ((c.raw > 0) | (c.cos >= thr))
    return s, keep


# ------------------------------------------------------------------ neighbour smoothing
def neighbour_gate(u: Unit, template: str, how: str, c0: float = 0.3, L0: float = 64.0) -> tuple[np.ndarray, np.ndarray]:
    """Weights g_prev[i] (record i <- i-1) and g_next[i] (record i <- i+1), in [0, 1]."""
    N = len(u.recs)
    gp, gn = np.zeros(N), np.zeros(N)
    gp[1:] = 1.0
    gn[:-1] = 1.0
    if how in ("sim", "sim+len"):
        v = u.dvec[template].astype(np.float64)
        adj = (v[1:] * v[:-1]).sum(1)  # cos(i, i+1)
        g = np.clip((adj - c0) / (1.0 - c0), 0.0, 1.0) if c0 < 1 else (adj >= c0).astype(float)
        gp[1:] *= g
        gn[:-1] *= g
    if how in ("simstep",):
        v = u.dvec[template].astype(np.float64)
        adj = (v[1:] * v[:-1]).sum(1)
        g = (adj >= c0).astype(float)
        gp[1:] *= g
        gn[:-1] *= g
    if how.startswith("coh"):  # memory-level coherence gate, "coh" or "coh0.05" (κ0)
        k0 = float(how[3:] or 0.1)
        gp *= coherence_gate(u, template, k0)
        gn *= coherence_gate(u, template, k0)
    if how.startswith("ramp"):  # "ramp0.02-0.08": 0 below κ_lo, 1 above κ_hi, linear between
        lo, hi = (float(x) for x in how[4:].split("-"))
        k, _, _ = coherence(u.dvec[template])
        g = float(np.clip((k - lo) / (hi - lo), 0.0, 1.0))
        gp *= g
        gn *= g
    if how in ("len", "sim+len"):
        short = np.minimum(1.0, L0 / np.maximum(u.doclen, 1.0))  # 1 for records up to L0 tokens
        gp *= short
        gn *= short
    return gp, gn


def coherence(v: np.ndarray) -> tuple[float, float, float]:
    """How much the log order carries topic: mean cosine of adjacent records minus the mean cosine
    of all pairs (both O(N·d): the all-pairs mean is (|Σv|² − N) / (N(N − 1)) for unit vectors)."""
    v = v.astype(np.float64)
    n = len(v)
    if n < 3:
        return 0.0, 0.0, 0.0
    adj = float((v[1:] * v[:-1]).sum(1).mean())
    tot = v.sum(0)
    allp = float((tot @ tot - (v * v).sum()) / (n * (n - 1)))
    return adj - allp, adj, allp


def coherence_gate(u: Unit, template: str, kappa0: float = 0.1) -> float:
    """The memory-level gate: clip(κ / κ0, 0, 1)."""
    k, _, _ = coherence(u.dvec[template])
    return float(np.clip(k / kappa0, 0.0, 1.0))


def smooth(scores: np.ndarray, gp: np.ndarray, gn: np.ndarray, beta: float, how: str = "add") -> np.ndarray:
    """s'(i) = s(i) + beta * (g_prev s(i-1) + g_next s(i+1)) / 2   ("add")
    or       s(i) + beta * max(g_prev s(i-1), g_next s(i+1))        ("max")."""
    prev = np.zeros_like(scores)
    nxt = np.zeros_like(scores)
    prev[:, 1:] = scores[:, :-1]
    nxt[:, :-1] = scores[:, 1:]
    if how == "add":
        return scores + beta * (gp[None, :] * prev + gn[None, :] * nxt) / 2
    if how == "max":
        return scores + beta * np.maximum(gp[None, :] * prev, gn[None, :] * nxt)
    if how == "prev":
        return scores + beta * gp[None, :] * prev
    if how == "next":
        return scores + beta * gn[None, :] * nxt
    raise ValueError(how)


# ------------------------------------------------------------------ experiment plumbing
LOCOMO_UNITS = [f"conv-0{i}" for i in range(5)]
_UNITS: dict[str, Unit] = {}


def unit(name: str) -> Unit:
    if name not in _UNITS:
        u = load_unit(name)
        build_lexical(u)
        _UNITS[name] = u
    return _UNITS[name]


def shuffled(name: str, seed: int = 0) -> Unit:
    """A copy of a LoCoMo unit with its records in random order: neighbours are unrelated."""
    key = f"{name}-shuf{seed}"
    base = unit(name)
    if key in _UNITS:
        u = _UNITS[key]
        for t, v in base.dvec.items():  # templates loaded since the copy was made
            if t not in u.dvec and not t.startswith("ctx"):
                u.dvec[t] = v[u.perm]
                u.cos[t] = base.cos[t][:, u.perm]
        return u
    perm = np.random.default_rng(seed).permutation(len(base.recs))
    u = Unit(key, [base.recs[p] for p in perm], [base.ids[p] for p in perm], base.qids, base.qtexts, base.qrels,
             base.splits)
    u.raw, u.selfs, u.gains, u.doclen = base.raw[:, perm], base.selfs, base.gains[:, perm], base.doclen[perm]
    u.qvec = base.qvec
    for t, v in base.dvec.items():
        if not t.startswith("ctx"):
            u.dvec[t] = v[perm]
            u.cos[t] = base.cos[t][:, perm]
    u.perm = perm
    _UNITS[key] = u
    return u


def evaluate_rule(u: Unit, template: str, rule, split: str | None = None, **ctx_kw) -> dict[str, np.ndarray]:
    ctx = make_ctx(u, template, **ctx_kw)
    fused, keep = rule(ctx)
    rows = u.splits[split] if split else u.splits[next(iter(u.splits))]
    return rank_metrics(u, fused, keep, rows)


def mean_se(x: np.ndarray) -> tuple[float, float]:
    return float(x.mean()), float(x.std(ddof=1) / math.sqrt(len(x))) if len(x) > 1 else 0.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd", choices=["embed", "check"])
    ap.add_argument("--units", default="locomo")
    ap.add_argument("--templates", default="nl")
    args = ap.parse_args()
    names = LOCOMO_UNITS if args.units == "locomo" else args.units.split(",")
    if args.cmd == "embed":
        for name in names:
            u = load_unit(name)
            for t in args.templates.split(","):
                load_vectors(u, t)
    elif args.cmd == "check":
        check(names)


def check(names) -> None:
    """The harness's defaults vs memory-eval's JSON (``$RT_BASE``/base-<unit>[-<split>].json)."""
    base_dir = Path(os.environ.get("RT_BASE", "/tmp/rt"))
    for name in names:
        u = unit(name)
        load_vectors(u, "nl")
        ctx = make_ctx(u, "nl")
        for split, rows in u.splits.items():
            base_path = base_dir / (f"base-{name}.json" if name.startswith("conv") else f"base-{name}-{split}.json")
            base = json.loads(base_path.read_text()) if base_path.exists() else None
            for mode, rule in (("lexical", f_lexical), ("vector", f_vector), ("hybrid", f_alpha)):
                fused, keep = rule(ctx)
                _selftest_metrics(u, fused, keep, rows)
                m = rank_metrics(u, fused, keep, rows)
                ref = base["modes"].get(mode, {}) if base else {}
                print(f"{name:8s} {split:5s} {mode:8s} harness r@10 {m['recall@10'].mean():.4f} "
                      f"ndcg@10 {m['ndcg@10'].mean():.4f} | memory-eval r@10 {ref.get('recall@10')} "
                      f"ndcg@10 {ref.get('ndcg@10')}")


if __name__ == "__main__":
    main()


# ------------------------------------------------------------------ whole-memory normalisations (appended)
def full_stats_cos(u: Unit, template: str, cos: np.ndarray | None = None):
    """Mean and sd of each query's cosine over the whole memory: q·μ and sqrt(qᵀΣq − (q·μ)²),
    computable in O(d²) from Σv and Σvvᵀ kept per memory (here simply from the matrix)."""
    c = u.cos[template] if cos is None else cos
    return c.mean(1), c.std(1)


def f_alpha_c(c: Ctx, alpha=0.3, thr=THRESHOLD, centre="full", scale=False, lex="self"):
    """α-fusion with the cosine centred on the query's background similarity m (its mean cosine over
    the memory): cos' = (cos − m)/(1 − m), or z over the memory when ``scale``.  ``lex``: "self"
    (today's bm25/max(best, S)), "best" (bm25/best), "zfull" (z over the memory)."""
    if centre == "full":
        m, sd = c.cos.mean(1), c.cos.std(1)
    else:  # over the vector top-100
        m, sd, _, _, _ = _stats(c.cos, c.vec_top)
    cv = (c.cos - m[:, None]) / (np.maximum(sd, 1e-9)[:, None] if scale else (1 - m)[:, None])
    if lex == "self":
        lb = c.bm
    elif lex == "best":
        lb = c.raw / np.maximum(c.raw.max(1), 1e-12)[:, None]
    else:
        lm, ls = c.raw.mean(1), c.raw.std(1)
        lb = (c.raw - lm[:, None]) / np.maximum(ls, 1e-9)[:, None]
    keep = c.pool & ((c.raw > 0) | (c.cos >= thr))
    return alpha * lb + (1 - alpha) * cv, keep


def f_zfull(c: Ctx, w_lex=0.5, thr=THRESHOLD):
    """Each side as a z-score over the whole memory for the query, weighted sum."""
    lm, ls = c.raw.mean(1), c.raw.std(1)
    cm, cs = c.cos.mean(1), c.cos.std(1)
    zl = (c.raw - lm[:, None]) / np.maximum(ls, 1e-9)[:, None]
    zc = (c.cos - cm[:, None]) / np.maximum(cs, 1e-9)[:, None]
    keep = c.pool & ((c.raw > 0) | (c.cos >= thr))
    return w_lex * zl + (1 - w_lex) * zc, keep


def f_zvar(c: Ctx, w_lex=0.3, lexz="all", cosz="all", thr=THRESHOLD, sample: np.ndarray | None = None):
    """z-fusion variants.  lexz: "all" (z over every record), "pos" (over records sharing a term),
    "log" (z of log1p(raw) over all).  cosz: "all" or "sample" (mean/sd from ``sample`` positions)."""
    raw = np.log1p(c.raw) if lexz == "log" else c.raw
    if lexz == "pos":
        pos = c.raw > 0
        cnt = np.maximum(pos.sum(1), 1)
        lm = np.where(pos, raw, 0).sum(1) / cnt
        ls = np.sqrt(np.where(pos, (raw - lm[:, None]) ** 2, 0).sum(1) / cnt)
    else:
        lm, ls = raw.mean(1), raw.std(1)
    zl = (raw - lm[:, None]) / np.maximum(ls, 1e-9)[:, None]
    cs = c.cos[:, sample] if (cosz == "sample" and sample is not None) else c.cos
    cm, csd = cs.mean(1), cs.std(1)
    zc = (c.cos - cm[:, None]) / np.maximum(csd, 1e-9)[:, None]
    keep = c.pool & ((c.raw > 0) | (c.cos >= thr))
    return w_lex * zl + (1 - w_lex) * zc, keep


# ------------------------------------------------------------------ the proposal, as the product would run it
def _z(x: np.ndarray, mean: np.ndarray, sd: np.ndarray) -> np.ndarray:
    return (x - mean[:, None]) / np.maximum(sd, 1e-9)[:, None]


def _shift(x: np.ndarray):
    prev = np.full_like(x, -np.inf)
    nxt = np.full_like(x, -np.inf)
    prev[:, 1:] = x[:, :-1]
    nxt[:, :-1] = x[:, 1:]
    return prev, nxt


def neighbour_max(x: np.ndarray, gp: np.ndarray, gn: np.ndarray) -> np.ndarray:
    """max(g_prev·x(i−1), g_next·x(i+1)), neighbours with gate 0 ignored (0 when none)."""
    prev, nxt = _shift(x)
    prev = np.where(gp[None, :] > 0, gp[None, :] * prev, -np.inf)
    nxt = np.where(gn[None, :] > 0, gn[None, :] * nxt, -np.inf)
    m = np.maximum(prev, nxt)
    return np.where(np.isfinite(m), m, 0.0)


def proposal(u: Unit, template: str, w_lex: float = 0.3, beta_l: float = 0.5, beta_v: float = 0.3,
             gate: str = "ramp0.02-0.08", order: str = "smooth-then-z", pool: str = "product",
             admit: str = "smoothed", cos_stats: str = "all", thr: float = THRESHOLD, mode: str = "hybrid",
             sample_n: int = 1000, seed: int = 0):
    """Scores and admission (Q x N) of the proposed default.

    1. neighbours: records i−1, i+1 in log order, weighted by the memory's coherence gate g
       (0 for a memory whose log order carries no topic: SciFact, shuffled LoCoMo);
    2. context: s'(i) = s(i) + β·g·max(s(i−1), s(i+1)) on raw BM25 (β_l) and on the cosine (β_v);
    3. normalisation: each side as a z-score over the whole memory for the query;
    4. fusion: w·z_lex + (1 − w)·z_cos;  admission: shares a term (own or, with context, a
       neighbour's) or cosine ≥ 0.25.
    """
    gp, gn = neighbour_gate(u, template, gate)
    raw, cos = u.raw, u.cos[template]
    if beta_l or beta_v:
        nraw = neighbour_max(raw, gp, gn)
        ncos = neighbour_max(cos, gp, gn)
    if order == "smooth-then-z":
        raw_s = raw + beta_l * nraw if beta_l else raw
        cos_s = cos + beta_v * ncos if beta_v else cos
        zl = _z(raw_s, raw_s.mean(1), raw_s.std(1))
        if cos_stats == "sample":
            idx = np.random.default_rng(seed).choice(cos.shape[1], min(sample_n, cos.shape[1]), replace=False)
            zc = _z(cos_s, cos_s[:, idx].mean(1), cos_s[:, idx].std(1))
        else:
            zc = _z(cos_s, cos_s.mean(1), cos_s.std(1))
    else:  # z of the record's own scores (statistics of the plain signals), then context on the z-scores
        raw_s = raw + beta_l * nraw if beta_l else raw
        cos_s = cos + beta_v * ncos if beta_v else cos
        if cos_stats == "sample":
            idx = np.random.default_rng(seed).choice(cos.shape[1], min(sample_n, cos.shape[1]), replace=False)
            cm, cs = cos[:, idx].mean(1), cos[:, idx].std(1)
        else:
            cm, cs = cos.mean(1), cos.std(1)
        zl0, zc0 = _z(raw, raw.mean(1), raw.std(1)), _z(cos, cm, cs)
        zl = zl0 + beta_l * neighbour_max(zl0, gp, gn) if beta_l else zl0
        zc = zc0 + beta_v * neighbour_max(zc0, gp, gn) if beta_v else zc0
    lexical_hit = (raw_s > 0) if admit == "smoothed" else (raw > 0)
    lex_top = top_mask(raw_s, N_CAND, lexical_hit)
    if pool == "product":  # vector top-100 by the plain cosine (what HNSW returns) + its gated neighbours
        vt = top_mask(cos, N_CAND)
        nb = np.zeros_like(vt)
        nb[:, 1:] |= vt[:, :-1] & (gp[None, 1:] > 0)
        nb[:, :-1] |= vt[:, 1:] & (gn[None, :-1] > 0)
        vec_top = vt | nb
    else:
        vec_top = top_mask(cos_s, N_CAND)
    if mode == "lexical":
        return zl, lex_top
    if mode == "vector":
        return zc, vec_top
    keep = (lex_top | vec_top) & (lexical_hit | (cos >= thr))
    return w_lex * zl + (1 - w_lex) * zc, keep

"""``memory-eval``: retrieval quality and latency on a BEIR-format dataset.

The corpus is indexed through the product's real write path into a scratch
memory (title → record title, text → body), and every query runs through the
real query path.  Metrics follow trec_eval: nDCG@k with linear gains (the
qrel score), recall@k, recall@100, MRR@k (k = 10 unless ``--k``); latency
p50/p95 per mode, measured around the query call (query embedding included).

Embeddings may be cached between runs (``embedcache``): a derived cache, safe to delete.
"""

from __future__ import annotations

import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import codes
from ..embed.base import Embedder
from ..errors import InputError
from ..fsio import dumps
from ..limits import EVAL_MODES, MAX_BODY, MAX_TITLE
from .beir import load_beir, record_id
from .embedcache import CachedEmbedder, default_cache_dir
from .metrics import mrr_at_k, ndcg_at_k, percentile, recall_at_k

if TYPE_CHECKING:
    from ..store.base import Store

MODES = EVAL_MODES


def _query_kwargs(mode: str, alpha: float | None) -> dict[str, Any]:
    """How memory-eval's modes map onto ``Memory.query``: ``hybrid`` is the configured default
    fusion (``z``); ``alpha`` and ``rrf`` are the other fusions; ``lexical`` and ``vector`` one side."""
    if mode in ("lexical", "vector"):
        return {"mode": mode, "alpha": alpha}
    return {"fusion": None if mode == "hybrid" else mode, "alpha": alpha}


def _corpus_records(corpus: list[dict[str, Any]]) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """The corpus's documents as records, and each record id's document id."""
    ids: dict[str, str] = {}
    records = []
    for doc in corpus:
        did = str(doc.get("_id"))
        rid = record_id(did)
        ids[rid] = did
        text = str(doc.get("text") or "")
        title = str(doc.get("title") or "").strip() or (text[:80].strip() or did)
        records.append({"id": rid, "type": "research", "title": title[:MAX_TITLE], "body": text[:MAX_BODY]})
    return ids, records


def _score_mode(mem: Any, mode: str, judged: list[str], queries: dict[str, str], qrels: dict[str, Any],
                ids: dict[str, str], names: tuple[str, ...], *, depth: int, k: int, alpha: float | None,
                ignore_identical_ids: bool, progress: Callable[[str, int, int], None] | None) -> dict[str, Any]:
    """Every judged query in one mode: the mean of each metric, latencies, degraded answers."""
    per_query: dict[str, list[float]] = {m: [] for m in names}
    latencies = []
    degraded = 0
    for n, qid in enumerate(judged, start=1):
        t = time.perf_counter()
        try:
            res: Any = mem.query(queries[qid], k=depth, track=False, collapse=False,
                                 **_query_kwargs(mode, alpha))
        except InputError:  # an empty query text in the dataset: no hits
            res = {"hits": [], "degraded": None}
        latencies.append((time.perf_counter() - t) * 1000)
        degraded += res["degraded"] is not None
        ranked = [ids.get(h["id"], h["id"]) for h in res["hits"]]
        if ignore_identical_ids:  # a query's own text in the corpus is no hit (BEIR EvaluateRetrieval)
            ranked = [d for d in ranked if d != qid]
        rel = qrels[qid]
        for name, value in zip(names, (ndcg_at_k(ranked, rel, k), recall_at_k(ranked, rel, k),
                                       recall_at_k(ranked, rel, 100), mrr_at_k(ranked, rel, k))):
            per_query[name].append(value)
        if progress:
            progress(mode, n, len(judged))
    return {
        **{m: round(sum(v) / len(judged), 4) for m, v in per_query.items()},
        "latency_ms": {"p50": round(percentile(latencies, 50), 2), "p95": round(percentile(latencies, 95), 2)},
        "degraded_queries": degraded,
        "per_query": per_query,
        "latencies": latencies,
    }


def _side_weight(mem: Any, alpha: float | None) -> dict[str, Any]:
    """The z-fusion weight the hybrid mode used in this memory and the estimate behind it
    (``search/sideweight.py``): a given ``alpha`` overrides it."""
    from ..api.stats import side_weight

    out = side_weight(mem.config, mem.store.read_manifest())
    if alpha is not None:
        out["weight"] = alpha
    return out


def evaluate_one(source_config: dict[str, Any], folder: Path, *, split: str = "test",
                 modes: tuple[str, ...] = MODES, k: int = 10, alpha: float | None = None,
                 max_queries: int | None = None, embedder: Embedder | None = None, cache: bool = True,
                 ignore_identical_ids: bool = True, progress: Callable[[str, int, int], None] | None = None
                 ) -> dict[str, Any]:
    """Index ``folder``'s corpus into a scratch memory and score every judged query (one dataset).
    The answer keeps each query's metric values (``per_query``) for averaging across datasets."""
    from ..api.memory import Memory
    from ..config import CONFIG_FILE, STATE_DIR
    from ..embed import make_embedder
    from ..limits import MAX_K

    corpus, queries, qrels = load_beir(folder, split)
    config = {**source_config, "enabled": True}
    if config.get("backend") == "postgres":  # a scratch namespace, dropped afterwards: never the team's memory
        config["postgres"] = {**(config.get("postgres") or {}), "namespace": f"nubos-eval-{uuid.uuid4().hex[:12]}"}
    inner = embedder or make_embedder(config.get("provider", "local"), config.get("model") or "",
                                      config.get("runtime", "auto"), config.get("device", "auto"),
                                      queries=config.get("queries", "int8"))
    where = default_cache_dir() if cache else None
    emb: Embedder = CachedEmbedder(inner, where) if where is not None else inner
    scratch = Path(tempfile.mkdtemp(prefix="nubos-eval-"))
    scratch_store: Store | None = None  # a scratch namespace of a team database is dropped afterwards
    try:
        (scratch / STATE_DIR).mkdir()
        (scratch / STATE_DIR / CONFIG_FILE).write_bytes(dumps({"memory": config}))
        mem = Memory.open(scratch, embedder=emb, user=False)  # never the user-level memory (usermemory.py)
        scratch_store = mem.store
        ids, records = _corpus_records(corpus)
        start = time.perf_counter()
        batch = 512
        for i in range(0, len(records), batch):
            mem.index(records[i: i + batch], verb="memory-eval", force=True)  # the corpus as it is
            if progress:
                progress("index", min(i + batch, len(records)), len(records))
        index_s = time.perf_counter() - start
        embedded, from_cache = getattr(emb, "misses", None), getattr(emb, "hits", None)
        if isinstance(emb, CachedEmbedder):
            emb.save()
        mem.use_embedder(inner)  # queries embed for real: their latency includes the model
        judged = sorted(qrels, key=lambda q: (len(q), q))[: max_queries or None]
        depth = min(max(k, 100) + 1, MAX_K)  # one more: a query's own document may be dropped (BEIR's protocol)
        names = (f"ndcg@{k}", f"recall@{k}", "recall@100", f"mrr@{k}")
        out_modes: dict[str, Any] = {}
        for mode in modes:
            out_modes[mode] = _score_mode(mem, mode, judged, queries, qrels, ids, names, depth=depth, k=k, alpha=alpha,
                                          ignore_identical_ids=ignore_identical_ids, progress=progress)
        return {
            "dataset": str(folder),
            "split": split,
            "docs": len(corpus),
            "queries": len(judged),
            "model": mem.embedder.model_id,
            "fingerprint": inner.fingerprint,
            "fusion": mem.config.fusion,
            "alpha": mem.config.alpha if alpha is None else alpha,
            "side_weight": _side_weight(mem, alpha),
            "threshold": mem.config.threshold,
            "index": {"seconds": round(index_s, 2), "records": len(records),
                      "embedded": embedded, "from_cache": from_cache},
            "modes": out_modes,
        }
    finally:
        if scratch_store is not None:
            scratch_store.discard()
        shutil.rmtree(scratch, ignore_errors=True)


def evaluate(source_config: dict[str, Any], folders: Path | list[Path], *, split: str = "test",
             modes: tuple[str, ...] = MODES, k: int = 10, alpha: float | None = None,
             max_queries: int | None = None, embedder: Embedder | None = None, cache: bool = True,
             ignore_identical_ids: bool = True, progress: Callable[[str, int, int], None] | None = None
             ) -> dict[str, Any]:
    """Score one BEIR folder, or several (each its own memory, e.g. one LoCoMo conversation each):
    with several, ``modes`` holds the question-weighted average and ``datasets`` each one."""
    from ..limits import MAX_K

    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
        raise InputError(f"k must be an integer in 1..{MAX_K}", code=codes.QUERY_INVALID_K, details={"k": k})
    paths = [folders] if isinstance(folders, Path) else list(folders)
    if not paths:
        raise InputError("give at least one BEIR folder", code=codes.BEIR_INVALID)
    runs = [evaluate_one(source_config, p, split=split, modes=modes, k=k, alpha=alpha, max_queries=max_queries,
                         embedder=embedder, cache=cache, ignore_identical_ids=ignore_identical_ids,
                         progress=progress) for p in paths]
    protocol = {"ignore_identical_ids": ignore_identical_ids, "collapse": False,
                "note": "a hit whose id equals the query's id is not counted (BEIR EvaluateRetrieval)"
                if ignore_identical_ids else "hits whose id equals the query's id are counted (--keep-identical-ids)"}
    for run in runs:
        for mode in run["modes"].values():
            mode.pop("latencies")
            mode.pop("per_query")
    if len(runs) == 1:
        return {**runs[0], "protocol": protocol}
    return {**_average(runs, modes), "protocol": protocol, "datasets": runs}


def _average(runs: list[dict[str, Any]], modes: tuple[str, ...]) -> dict[str, Any]:
    """Question-weighted averages over datasets (each metric's mean over all their queries)."""
    total = sum(r["queries"] for r in runs)
    averaged: dict[str, Any] = {}
    for mode in modes:
        metrics = [m for m in runs[0]["modes"][mode] if m not in ("latency_ms", "degraded_queries")]
        averaged[mode] = {m: round(sum(r["modes"][mode][m] * r["queries"] for r in runs) / total, 4) for m in metrics}
        averaged[mode]["degraded_queries"] = sum(r["modes"][mode]["degraded_queries"] for r in runs)
    first = runs[0]
    return {"dataset": [r["dataset"] for r in runs], "split": first["split"], "docs": sum(r["docs"] for r in runs),
            "queries": total, "model": first["model"], "fingerprint": first["fingerprint"], "fusion": first["fusion"],
            "alpha": first["alpha"], "threshold": first["threshold"], "modes": averaged,
            "side_weights": [{"dataset": r["dataset"], **r["side_weight"]} for r in runs]}


def markdown_report(result: dict[str, Any], k: int = 10) -> str:
    """A markdown table of a memory-eval answer: each dataset and, with several, their average."""
    runs = result.get("datasets") or [result]
    modes = list(result["modes"])
    lines = [f"memory-eval, split `{result['split']}`, model `{result['model']}`, fusion `{result['fusion']}` "
             f"(α {result['alpha']}); {result['protocol']['note']}.", "",
             "| dataset | queries | mode | nDCG@" + str(k) + " | recall@" + str(k) + " | recall@100 | MRR@" + str(k)
             + " |", "| --- | --- | --- | --- | --- | --- | --- |"]
    rows = [(Path(r["dataset"]).name, r) for r in runs]
    if len(runs) > 1:
        rows.append(("**average (question-weighted)**", result))
    for name, r in rows:
        for mode in modes:
            m = r["modes"][mode]
            lines.append(f"| {name} | {r['queries']} | {mode} | {m[f'ndcg@{k}']:.4f} | {m[f'recall@{k}']:.4f} "
                         f"| {m['recall@100']:.4f} | {m[f'mrr@{k}']:.4f} |")
    weights = [f"{Path(r['dataset']).name} {r['side_weight']['weight']}" for r in runs if "side_weight" in r]
    if weights:
        lines += ["", "hybrid (z) lexical weight per memory (memory.side_weights): " + ", ".join(weights)]
    return "\n".join(lines) + "\n"

"""``memory-eval``: retrieval quality and latency on a BEIR-format dataset.

The corpus is indexed through the product's real write path into a scratch
memory (title → record title, text → body), and every query runs through the
real query path.  Metrics follow trec_eval: nDCG@k with linear gains (the
qrel score), recall@k, recall@100, MRR@k (k = 10 unless ``--k``); latency
p50/p95 per mode, measured around the query call (query embedding included).

Embeddings may be cached between runs in ``$NUBOS_MEMORY_CACHE`` (default
``~/.cache/nubos-memory``), keyed by the embedder's fingerprint and the text's
hash: a derived cache, safe to delete.
"""

from __future__ import annotations

import csv
import hashlib
import math
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..embed.base import Embedder
from ..errors import InputError
from ..fsio import JSONDecodeError, atomic_write_bytes, dumps, ensure_dir, loads
from ..limits import EVAL_MODES, MAX_BODY, MAX_TITLE
from ..records import valid_id

if TYPE_CHECKING:
    from ..store.base import Store

MODES = EVAL_MODES


# -- metrics (pure functions, tested against hand-computed values) ---------------------
def ndcg_at_k(ranked: list[str], qrels: dict[str, int], k: int = 10) -> float:
    """nDCG@k with trec_eval's linear gains: DCG = Σ rel_i / log2(i + 1), i from 1."""
    dcg = sum(qrels.get(doc, 0) / math.log2(i + 2) for i, doc in enumerate(ranked[:k]))
    ideal = sorted((g for g in qrels.values() if g > 0), reverse=True)[:k]
    idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal))
    return dcg / idcg if idcg > 0 else 0.0


def recall_at_k(ranked: list[str], qrels: dict[str, int], k: int) -> float:
    relevant = {d for d, g in qrels.items() if g > 0}
    return len(relevant & set(ranked[:k])) / len(relevant) if relevant else 0.0


def mrr_at_k(ranked: list[str], qrels: dict[str, int], k: int = 10) -> float:
    for i, doc in enumerate(ranked[:k]):
        if qrels.get(doc, 0) > 0:
            return 1.0 / (i + 1)
    return 0.0


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else 0.0


# -- the dataset ------------------------------------------------------------------------
def _jsonl(path: Path) -> list[dict[str, Any]]:
    out = []
    try:
        with open(path, "rb") as f:
            for number, line in enumerate(f, start=1):
                if line.strip():
                    try:
                        out.append(loads(line))
                    except JSONDecodeError:
                        raise InputError(f"{path.name} line {number} is not JSON", code="beir-invalid",
                                         details={"file": str(path), "line": number}) from None
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror}", code="beir-invalid", details={"file": str(path)}) from None
    return out


def load_beir(folder: Path, split: str) -> tuple[list[dict[str, Any]], dict[str, str], dict[str, dict[str, int]]]:
    """Corpus records, query texts and qrels of one split."""
    if not folder.is_dir():
        raise InputError(f"{folder} is not a BEIR folder", code="beir-invalid", details={"path": str(folder)})
    corpus = _jsonl(folder / "corpus.jsonl")
    queries = {str(q.get("_id")): str(q.get("text", "")) for q in _jsonl(folder / "queries.jsonl")}
    qrels: dict[str, dict[str, int]] = {}
    path = folder / "qrels" / f"{split}.tsv"
    try:
        with open(path, newline="", encoding="utf-8") as f:
            for row in csv.DictReader(f, delimiter="\t"):
                qrels.setdefault(row["query-id"], {})[row["corpus-id"]] = int(row["score"])
    except (OSError, KeyError, ValueError) as exc:
        raise InputError(f"cannot read qrels {path}: {exc}", code="beir-invalid", details={"file": str(path)}) from None
    qrels = {q: r for q, r in qrels.items() if q in queries}
    if not corpus or not qrels:
        raise InputError("the dataset has no documents or no judged queries", code="beir-invalid",
                         details={"docs": len(corpus), "judged_queries": len(qrels)})
    return corpus, queries, qrels


def record_id(doc_id: str) -> str:
    """BEIR ids become record ids unchanged when they are valid ones, else a stable hash."""
    return doc_id if valid_id(doc_id) else "beir-" + hashlib.sha256(doc_id.encode()).hexdigest()[:24]


# -- an embedding cache around the real embedder ------------------------------------------
class CachedEmbedder(Embedder):
    """Delegates to ``inner``; remembers vectors by text hash under its fingerprint."""

    def __init__(self, inner: Embedder, folder: Path):
        super().__init__(inner.model_id)
        self.inner = inner
        self.provider = inner.provider
        self.version = inner.version
        self.folder = folder / inner.fingerprint
        self._keys: dict[str, int] = {}
        self._vecs: list[np.ndarray] = []
        self.hits = self.misses = 0
        try:
            keys = loads((self.folder / "keys.json").read_bytes())
            vecs = np.load(self.folder / "vectors.npy", allow_pickle=False)
            if len(keys) == len(vecs):
                self._keys = {k: i for i, k in enumerate(keys)}
                self._vecs = list(vecs)
        except (OSError, ValueError, JSONDecodeError):
            pass
        self._saved = len(self._keys)

    def known_dim(self) -> int | None:
        return self.inner.known_dim()

    def spec(self, dim: int | None = None) -> dict[str, Any]:
        return self.inner.spec(dim)

    @property
    def dim(self) -> int:
        return self.inner.dim

    def embed(self, texts: list[str]) -> np.ndarray:
        keys = [hashlib.sha256(t.encode("utf-8")).hexdigest()[:32] for t in texts]
        todo = [i for i, k in enumerate(keys) if k not in self._keys]
        if todo:
            fresh = self.inner.embed([texts[i] for i in todo])
            for i, vec in zip(todo, fresh):
                if keys[i] not in self._keys:
                    self._keys[keys[i]] = len(self._vecs)
                    self._vecs.append(vec)
        self.misses += len(todo)
        self.hits += len(texts) - len(todo)
        return np.stack([self._vecs[self._keys[k]] for k in keys]).astype(np.float32)

    def save(self) -> None:
        if len(self._keys) == self._saved:
            return
        ensure_dir(self.folder)
        keys = [""] * len(self._keys)
        for k, i in self._keys.items():
            keys[i] = k
        import io

        buf = io.BytesIO()
        np.save(buf, np.stack(self._vecs).astype(np.float32), allow_pickle=False)
        atomic_write_bytes(self.folder / "vectors.npy", buf.getvalue())
        atomic_write_bytes(self.folder / "keys.json", dumps(keys))
        self._saved = len(keys)


def default_cache_dir() -> Path | None:
    """Where dataset embeddings are kept between runs (None: no safe cache folder; nothing is kept)."""
    from ..userdirs import user_cache_dir

    cache = user_cache_dir()
    return cache / "embeddings" if cache is not None else None


# -- the run ---------------------------------------------------------------------------------
def _query_kwargs(mode: str, alpha: float | None) -> dict[str, Any]:
    """How memory-eval's modes map onto ``Memory.query``: ``hybrid`` is the configured default
    fusion (``z``); ``alpha`` and ``rrf`` are the other fusions; ``lexical`` and ``vector`` one side."""
    if mode in ("lexical", "vector"):
        return {"mode": mode, "alpha": alpha}
    return {"fusion": None if mode == "hybrid" else mode, "alpha": alpha}


def evaluate_one(source_config: dict[str, Any], folder: Path, *, split: str = "test",
                 modes: tuple[str, ...] = MODES, k: int = 10, alpha: float | None = None,
                 max_queries: int | None = None, embedder: Embedder | None = None, cache: bool = True,
                 ignore_identical_ids: bool = True, progress: Callable[[str, int, int], None] | None = None
                 ) -> dict[str, Any]:
    """Index ``folder``'s corpus into a scratch memory and score every judged query (one dataset).
    The answer keeps each query's metric values (``per_query``) for averaging across datasets."""
    from ..config import CONFIG_FILE, STATE_DIR
    from ..embed import make_embedder
    from ..limits import MAX_K
    from .memory import Memory

    corpus, queries, qrels = load_beir(folder, split)
    config = {**source_config, "enabled": True}
    if config.get("backend") == "postgres":  # a scratch namespace, dropped afterwards: never the team's memory
        config["postgres"] = {**(config.get("postgres") or {}), "namespace": f"nubos-eval-{uuid.uuid4().hex[:12]}"}
    inner = embedder or make_embedder(config.get("provider", "local"), config.get("model") or "",
                                      config.get("runtime", "auto"), config.get("device", "auto"))
    where = default_cache_dir() if cache else None
    emb: Embedder = CachedEmbedder(inner, where) if where is not None else inner
    scratch = Path(tempfile.mkdtemp(prefix="nubos-eval-"))
    scratch_store: Store | None = None  # a scratch namespace of a team database is dropped afterwards
    try:
        (scratch / STATE_DIR).mkdir()
        (scratch / STATE_DIR / CONFIG_FILE).write_bytes(dumps({"memory": config}))
        mem = Memory.open(scratch, embedder=emb)
        scratch_store = mem.store
        ids: dict[str, str] = {}
        records = []
        for doc in corpus:
            did = str(doc.get("_id"))
            rid = record_id(did)
            ids[rid] = did
            text = str(doc.get("text") or "")
            title = str(doc.get("title") or "").strip() or (text[:80].strip() or did)
            records.append({"id": rid, "type": "research", "title": title[:MAX_TITLE], "body": text[:MAX_BODY]})
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
            out_modes[mode] = {
                **{m: round(sum(v) / len(judged), 4) for m, v in per_query.items()},
                "latency_ms": {"p50": round(percentile(latencies, 50), 2), "p95": round(percentile(latencies, 95), 2)},
                "degraded_queries": degraded,
                "per_query": per_query,
                "latencies": latencies,
            }
        return {
            "dataset": str(folder),
            "split": split,
            "docs": len(corpus),
            "queries": len(judged),
            "model": mem.embedder.model_id,
            "fingerprint": inner.fingerprint,
            "fusion": mem.config.fusion,
            "alpha": mem.config.alpha if alpha is None else alpha,
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
        raise InputError(f"k must be an integer in 1..{MAX_K}", code="query-invalid-k", details={"k": k})
    paths = [folders] if isinstance(folders, Path) else list(folders)
    if not paths:
        raise InputError("give at least one BEIR folder", code="beir-invalid")
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
            "alpha": first["alpha"], "threshold": first["threshold"], "modes": averaged}


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
    return "\n".join(lines) + "\n"

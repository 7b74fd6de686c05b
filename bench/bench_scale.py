"""Speed, memory and scale of nubos-memory against the raw libraries, in one run.

Builds memories of 1k, 10k and 100k records from real text (SciFact abstracts and their
sentences) embedded by the real packaged model. 100k reuses the 10k real vectors with small
seeded perturbations (never uniform random vectors). Every product number is printed next to
the raw library doing the same work in the same run, so ratios hold on a noisy machine.

Run: .venv/bin/python bench/bench_scale.py [--sizes 1000,10000,100000] [--queries 200]
Writes bench/results/scale-<date>.json and prints a table (docs/benchmarks.md records it).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from nubos_memory import Memory  # noqa: E402
from nubos_memory.config import DEFAULT_MODEL  # noqa: E402
from nubos_memory.embedders import Embedder, SentenceTransformerEmbedder  # noqa: E402
from nubos_memory.evaluate import CachedEmbedder  # noqa: E402
from nubos_memory.lexical import RankBM25Scorer  # noqa: E402
from nubos_memory.records import lexical_text  # noqa: E402
from nubos_memory.tokenize import tokenize  # noqa: E402

DATA = REPO.parent / "shared" / "datasets" / "scifact"
CACHE = REPO / "bench" / ".cache"


def real_texts(n: int) -> list[dict]:
    """n realistic records: SciFact abstracts first, then single sentences of them."""
    docs = [json.loads(line) for line in (DATA / "corpus.jsonl").open()]
    out = [{"title": d["title"], "body": d["text"]} for d in docs]
    i = 0
    while len(out) < n:
        d = docs[i % len(docs)]
        sents = [s for s in d["text"].split(". ") if len(s) > 40]
        j = i // len(docs)
        if j < len(sents):
            out.append({"title": d["title"][:60] + f" (finding {j + 1})", "body": sents[j]})
        i += 1
        if i > 50 * len(docs):
            break
    return out[:n]


class PerturbedEmbedder(Embedder):
    """Variant texts 'base ⟨vN⟩' get the base text's real vector plus small seeded noise."""

    provider = "local"

    def __init__(self, real: Embedder, sigma: float = 0.03):
        super().__init__(real.model_id)
        self.real, self.sigma = real, sigma

    def spec(self, dim=None):
        return self.real.spec(dim)

    def known_dim(self):
        return self.real.known_dim()

    @property
    def dim(self):
        return self.real.dim

    def embed(self, texts):
        bases = [t.split(" ⟨v", 1)[0] for t in texts]
        vecs = self.real.embed(bases).copy()
        for row, t in enumerate(texts):
            if t != bases[row]:
                seed = int.from_bytes(hashlib.sha256(t.encode()).digest()[:8], "little")
                vecs[row] += np.random.default_rng(seed).normal(0, self.sigma, vecs.shape[1]).astype(np.float32)
                vecs[row] /= np.linalg.norm(vecs[row])
        return vecs


def p(values, q):
    return float(np.percentile(values, q)) if values else float("nan")


def timed(fn, repeat):
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1000)
    return out


def make_memory(root: Path, embedder: Embedder, records: list[dict]) -> tuple[Memory, float]:
    (root / ".nubos-pilot").mkdir(parents=True)
    (root / ".nubos-pilot/config.json").write_text(json.dumps({"memory": {"enabled": True}}))
    mem = Memory.open(root, embedder=embedder)
    t = time.perf_counter()
    for i in range(0, len(records), 10_000):
        mem.index([{"type": "research", **r} for r in records[i:i + 10_000]])
    return mem, time.perf_counter() - t


def cli(root: Path, *args: str, env=None) -> float:
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "nubos_memory", *args, "--root", str(root)], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})})
    assert proc.returncode == 0, proc.stderr
    return (time.perf_counter() - t) * 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1000,10000,100000")
    ap.add_argument("--queries", type=int, default=200)
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    queries = [json.loads(line)["text"] for line in (DATA / "queries.jsonl").open()][: args.queries]
    st = SentenceTransformerEmbedder(DEFAULT_MODEL)
    cached = CachedEmbedder(st, CACHE / "embeddings")
    base = real_texts(min(max(sizes), 10_000))
    t = time.perf_counter()
    cached.embed([f"{r['title']}\n{r['body']}" for r in base])  # real vectors for every base record
    cached.save()
    print(f"# base embeddings ready ({len(base)} records, {cached.misses} newly embedded, "
          f"{time.perf_counter() - t:.0f}s)", flush=True)
    results: dict = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.node()} {platform.machine()} "
                     f"{os.cpu_count()} cpu, python {platform.python_version()}", "sizes": {}}

    # Index throughput vs raw model.encode, same texts, same batch size (32), uncached.
    sample = [{"type": "research", "title": r["title"] + " (throughput)", "body": r["body"]} for r in base[:384]]
    texts = [f"{r['title']}\n{r['body']}" for r in sample]
    model = st._load()
    t = time.perf_counter()
    model.encode(texts, batch_size=32, normalize_embeddings=True)
    raw_s = time.perf_counter() - t
    with tempfile.TemporaryDirectory() as d:
        mem, prod_s = make_memory(Path(d), SentenceTransformerEmbedder(DEFAULT_MODEL), [])
        mem.embedder._model = model  # same loaded model: measure indexing, not loading
        mem.embedder._dim = 384
        t = time.perf_counter()
        mem.index(sample)
        prod_s = time.perf_counter() - t
    results["index_throughput"] = {"records": len(sample), "raw_encode_per_s": len(sample) / raw_s,
                                   "memory_index_per_s": len(sample) / prod_s, "ratio": raw_s / prod_s}
    print(f"# index throughput: raw {len(sample) / raw_s:.1f}/s, memory-index {len(sample) / prod_s:.1f}/s "
          f"(ratio {raw_s / prod_s:.2f})", flush=True)

    qvecs = st.embed(queries)
    for n in sizes:
        if n <= len(base):
            recs = base[:n]
            emb: Embedder = cached
        else:
            recs = [{"title": r["title"], "body": r["body"] + f" ⟨v{v}⟩"} if v else r
                    for v in range(n // len(base) + 1) for r in base][:n]
            emb = PerturbedEmbedder(cached)
        root = Path(tempfile.mkdtemp(prefix=f"nubos-bench-{n}-"))
        row: dict = {}
        mem, build_s = make_memory(root, emb, recs)
        row["build_s"] = build_s
        mem._embedder = st  # queries embed for real
        mem.query("warm up the model")
        lat = []
        for q in queries:
            t = time.perf_counter()
            mem.query(q, k=10)
            lat.append((time.perf_counter() - t) * 1000)
        row["hybrid_warm_ms"] = {"p50": p(lat, 50), "p95": p(lat, 95)}
        lat_lex = timed(lambda: mem.query(queries[0], k=10, mode="lexical"), 50)
        row["lexical_warm_ms_p50"] = p(lat_lex, 50)
        # Raw libraries on the same data.
        row["raw_encode_query_ms_p50"] = p(timed(lambda: st.embed([queries[1]]), 50), 50)
        _, index, _ = mem.snap.vectors()
        vecs = np.asarray(index.vectors)
        graph = index.hnsw()
        graph.set_ef(index.ef_search)
        row["raw_hnsw_ms_p50"] = p([timed(lambda q=q: graph.knn_query(q.reshape(1, -1), k=10, num_threads=1), 1)[0]
                                    for q in qvecs[:100]], 50)
        row["raw_numpy_exact_ms_p50"] = p([timed(lambda q=q: np.argpartition(-(vecs @ q), 10)[:10], 1)[0]
                                           for q in qvecs[:100]], 50)
        hits = 0
        for q in qvecs:
            exact = set(np.argsort(-(vecs @ q))[:10].tolist())
            approx = set(graph.knn_query(q.reshape(1, -1), k=10, num_threads=1)[0][0].tolist())
            hits += len(exact & approx)
        row["hnsw_recall@10"] = hits / (10 * len(qvecs))
        if n <= 10_000:
            rb = RankBM25Scorer([tokenize(lexical_text({"tags": [], **r})) for r in recs])
            row["raw_rank_bm25_ms_p50"] = p(timed(lambda: rb.scores(tokenize(queries[2])), 10), 50)
        engine = mem.snap.lexical_engine()
        row["postings_bm25_ms_p50"] = p(timed(lambda: engine.scores(tokenize(queries[2])), 50), 50)
        # Rebuild with vectors cached (no model change).
        t = time.perf_counter()
        r = mem.rebuild()
        row["rebuild_cached_s"] = time.perf_counter() - t
        row["rebuild_embedded"] = r["embedded"]
        # Cold CLI, fresh processes: stats and a lexical-only query (no torch import).
        row["cold_stats_ms"] = statistics.median(cli(root, "memory-stats") for _ in range(5))
        row["cold_lexical_query_ms"] = statistics.median(
            cli(root, "memory-query", "--mode", "lexical", queries[3]) for _ in range(5))
        row["python_startup_ms"] = statistics.median(
            timed(lambda: subprocess.run([sys.executable, "-c", "pass"]), 5))
        # Peak RSS of a warm process at this size (fresh process: load, 20 hybrid queries).
        probe = ("import json,resource,sys; sys.path.insert(0, %r); from nubos_memory import Memory; "
                 "m = Memory.open(%r); [m.query(q, k=10) for q in json.loads(sys.argv[1])]; "
                 "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)") % (str(REPO), str(root))
        out = subprocess.run([sys.executable, "-c", probe, json.dumps(queries[:20])], capture_output=True, text=True)
        row["warm_peak_rss_mb"] = int(out.stdout.strip().splitlines()[-1]) / 1024 if out.returncode == 0 else None
        if out.returncode != 0:
            row["rss_error"] = out.stderr[-500:]
        results["sizes"][n] = row
        print(f"# {n}: " + json.dumps(row), flush=True)
        shutil.rmtree(root, ignore_errors=True)
    out_dir = REPO / "bench" / "results"
    out_dir.mkdir(exist_ok=True)
    (out_dir / f"scale-{results['date']}.json").write_text(json.dumps(results, indent=2))
    print("\n| size | hybrid warm p50 / p95 ms | lexical warm p50 | raw encode p50 | raw hnsw p50 | numpy exact p50 "
          "| rank-bm25 p50 | postings BM25 p50 | HNSW recall@10 | rebuild (cached) s | cold stats ms "
          "| cold lexical query ms | peak RSS MB |")
    print("|" + "---|" * 13)
    for n, r in results["sizes"].items():
        print(f"| {n} | {r['hybrid_warm_ms']['p50']:.1f} / {r['hybrid_warm_ms']['p95']:.1f} "
              f"| {r['lexical_warm_ms_p50']:.1f} | {r['raw_encode_query_ms_p50']:.1f} | {r['raw_hnsw_ms_p50']:.2f} "
              f"| {r['raw_numpy_exact_ms_p50']:.2f} | {r.get('raw_rank_bm25_ms_p50', float('nan')):.1f} "
              f"| {r['postings_bm25_ms_p50']:.2f} | {r['hnsw_recall@10']:.3f} | {r['rebuild_cached_s']:.1f} "
              f"| {r['cold_stats_ms']:.0f} | {r['cold_lexical_query_ms']:.0f} | {r['warm_peak_rss_mb'] or 0:.0f} |")
    it = results["index_throughput"]
    print(f"\nindex throughput: memory-index {it['memory_index_per_s']:.1f} rec/s vs raw encode "
          f"{it['raw_encode_per_s']:.1f}/s → {it['ratio']:.2f}x")


if __name__ == "__main__":
    main()

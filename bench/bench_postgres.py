"""Team memory on PostgreSQL against the file store, in one run (issue: team memory; adr/0014; issue 21).

1. Scale, hash embedder: the same records (SciFact abstracts and their sentences) in both stores at
   each of ``--sizes`` (default 20k and 100k); warm hybrid query p50/p95 through one open Memory,
   cold `np-tools memory-query` / `memory-add` (a fresh process, no memory-serve), the database's
   HNSW index (size, planner, candidate recall), and a new machine's first query (a process with a
   fresh NUBOS_MEMORY_CACHE, which copies every shared vector from the database).  The hash
   embedder (hash-384) keeps the model's time (the same for both stores) from hiding the stores'
   difference.  Target (issue 21): a warm Postgres hybrid query within 2x the file store's.
2. Scale, real packaged model (all-MiniLM-L6-v2) at ``--model-size`` (default 20k): the texts are
   embedded once (a CachedEmbedder both stores share, filled before either is timed) and the query
   vectors too, so both stores' numbers are store time; the model's own query time is reported
   beside them.  100k with the model is not measured (about 25 minutes of embedding on 2 cores).
3. Quality parity (only with --scifact: about 12 minutes): SciFact (test) through memory-eval on
   both stores, real packaged model: nDCG@10 per mode, and the difference.

PostgreSQL: $NUBOS_MEMORY_TEST_DSN, else a pgserver (PostgreSQL 16 from the wheel) in a temp folder.
SciFact (the records' texts, and part 3) from --datasets, else $NUBOS_MEMORY_DATASETS, else
../shared/datasets beside the repository.
Run: .venv/bin/python bench/bench_postgres.py [--sizes 20000 100000] [--model-size 20000] [--queries 200]
     [--scifact] [--datasets FOLDER] [--out bench/results/postgres-2026-11-23b.json]
Writes the JSON and prints a markdown table per embedder (docs/benchmarks.md records it).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import benchdata  # noqa: E402
from bench_scale import real_texts  # noqa: E402

from nubos_memory import Memory  # noqa: E402
from nubos_memory.evaluation import CachedEmbedder  # noqa: E402

if TYPE_CHECKING:
    from nubos_memory.store.postgres import PgStore

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
HASH = {"provider": "hash", "model": "hash-384", "near_duplicate": None}
LOCAL = {"provider": "local", "model": MODEL, "near_duplicate": None}
BATCH = 10_000  # records per memory-index call while loading
TARGET_RATIO = 2.0


def project(root: Path, memory: dict[str, Any]) -> Path:
    (root / ".nubos-pilot").mkdir(parents=True)
    (root / ".nubos-pilot/config.json").write_text(json.dumps({"memory": {"enabled": True, **memory}}))
    return root


def cli(root: Path, *args: str, env: dict[str, str] | None = None) -> tuple[float, str, str]:
    """A fresh process (no memory-serve): its wall time in ms, its stdout and its stderr."""
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "nubos_memory", *args, "--root", str(root)], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(REPO), "NUBOS_MEMORY_NO_SERVER": "1",
                                          **(env or {})})
    ms = (time.perf_counter() - t) * 1000
    assert proc.returncode == 0, f"{args[0]} failed:\n{proc.stderr[-4000:]}"
    return ms, proc.stdout, proc.stderr


def cli_ms(root: Path, *args: str) -> float:
    return cli(root, *args)[0]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def scifact(work: Path, pg: dict[str, Any], data: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, memory in (("files", {}), ("postgres", pg)):
        root = project(work / f"eval-{name}", memory)
        t = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "nubos_memory", "memory-eval", "--root", str(root),
                               "--beir", str(data), "--split", "test", "--progress", "none"],
                              capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
        assert proc.returncode == 0, proc.stderr[-2000:]
        doc = json.loads(proc.stdout)
        out[name] = {"seconds": round(time.perf_counter() - t, 1),
                     "ndcg@10": {m: v["ndcg@10"] for m, v in doc["modes"].items()},
                     "p50_ms": {m: v["latency_ms"]["p50"] for m, v in doc["modes"].items()}}
        log(f"scifact {name}: {out[name]}")
    out["difference"] = {m: round(out["postgres"]["ndcg@10"][m] - out["files"]["ndcg@10"][m], 4)
                         for m in out["files"]["ndcg@10"]}
    return out


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def workload(size: int, queries: int, data: Path) -> tuple[list[dict[str, str]], list[str]]:
    texts = real_texts(size, data)  # abstracts and their sentences run out near 50k: revisits make up the rest
    base_texts, k = list(texts), 1
    while len(texts) < size:
        k += 1
        texts += [{"title": f"{r['title']} (revisit {k})", "body": r["body"]} for r in base_texts[: size - len(texts)]]
    records = [{"type": "research", "id": f"r{i}", **r} for i, r in enumerate(texts[:size])]
    asks = [r["title"][:60] for r in records[:: max(1, len(records) // queries)]][:queries]
    return records, asks


def warm(mem: Memory, asks: list[str]) -> dict[str, float]:
    """Warm hybrid query latency through one open Memory (20 queries of warm-up first)."""
    for q in asks[:20]:
        mem.query(q, track=False)
    lat = []
    for q in asks:
        t = time.perf_counter()
        mem.query(q, track=False)
        lat.append((time.perf_counter() - t) * 1000)
    return {"warm_p50_ms": round(statistics.median(lat), 2), "warm_p95_ms": round(pct(lat, 95), 2)}


def new_machine(root: Path, work: Path, label: str, ask: str, onnx: bool) -> dict[str, Any]:
    """A new machine's first query: a process with its own, empty NUBOS_MEMORY_CACHE, end to end
    (it copies every shared vector from the database).  With ``onnx`` the model's ONNX export (kept
    in the same cache folder, made once per machine) is copied in first, so that the number is the
    first query's and not the export's."""
    cache = work / f"cache-new-{label}"
    if onnx and (Path(os.environ["NUBOS_MEMORY_CACHE"]) / "onnx").is_dir():
        shutil.copytree(Path(os.environ["NUBOS_MEMORY_CACHE"]) / "onnx", cache / "onnx")
    ms, stdout, stderr = cli(root, "memory-query", ask, env={"NUBOS_MEMORY_CACHE": str(cache)})
    doc = json.loads(stdout)
    return {"new_machine_first_query_ms": round(ms), "new_machine_pending": (doc.get("counts") or {}).get("pending"),
            "new_machine_hits": len(doc.get("hits") or []),
            "new_machine_exported_onnx": "exporting the embedding model" in stderr}


def scale(work: Path, pg: Callable[[str], dict[str, Any]], size: int, queries: int, kind: str, data: Path,
          embedder: CachedEmbedder | None = None) -> dict[str, Any]:
    """Both stores at one size under one embedder (``hash``: hash-384; ``model``: the packaged model
    through ``embedder``, a CachedEmbedder already holding every record's and query's vector)."""
    records, asks = workload(size, queries, data)
    config = HASH if kind == "hash" else LOCAL
    label = f"{kind}-{size}"
    out: dict[str, Any] = {"records": len(records), "queries": len(asks),
                 "embedder": "hash-384 (no model time)" if kind == "hash" else
                 f"{MODEL} (vectors from a shared cache: store time only)"}
    if embedder is not None:
        out.update(prefill(embedder, records, asks))
    answers: dict[str, list[list[str]]] = {}
    for name, memory in (("files", config), ("postgres", {**config, **pg(label)})):
        root = project(work / f"{label}-{name}", memory)
        mem = Memory.open(root, embedder=embedder)
        misses = embedder.misses if embedder is not None else 0
        log(f"{label} {name}: loading {len(records):,} records")
        t = time.perf_counter()
        for i in range(0, len(records), BATCH):
            mem.index(records[i:i + BATCH], force=True)
        row: dict[str, Any] = {"index_s": round(time.perf_counter() - t, 1)}
        if embedder is not None:
            row["model_embeds_while_loading"] = embedder.misses - misses  # 0: the cache held every text
        if name == "postgres":
            row["index_state"] = ((mem.store.status().get("index") or {}).get("state"))
        log(f"{label} {name}: loaded in {row['index_s']} s; timing queries")
        row.update(warm(mem, asks))
        answers[name] = [[h["id"] for h in mem.query(q, k=10, track=False)["hits"]] for q in asks]
        if kind == "hash":
            row["cold_query_ms"] = round(statistics.median(cli_ms(root, "memory-query", asks[i]) for i in range(5)))
            row["cold_add_ms"] = round(statistics.median(
                cli_ms(root, "memory-add", "--type", "learning", "--title", f"bench note {uuid.uuid4().hex}")
                for _ in range(3)))
        if name == "postgres":
            row.update(pgvector_side(mem, asks))
            row.update(new_machine(root, work, label, asks[-1], onnx=kind == "model"))
            if kind == "hash":  # a second machine's full rebuild: its own cache, vectors from the database
                t = time.perf_counter()
                _, stdout, _ = cli(root, "memory-rebuild", env={"NUBOS_MEMORY_CACHE": str(work / f"cache-rebuild-{label}")})
                row["second_machine_rebuild_s"] = round(time.perf_counter() - t, 1)
                row["second_machine_shared"] = json.loads(stdout).get("shared")
        out[name] = row
        log(f"{label} {name}: {row}")
        del mem
        gc.collect()
    out["warm_ratio"] = round(out["postgres"]["warm_p50_ms"] / out["files"]["warm_p50_ms"], 2)
    out["warm_p95_ratio"] = round(out["postgres"]["warm_p95_ms"] / out["files"]["warm_p95_ms"], 2)
    out["same_top10"] = round(sum(a == b for a, b in zip(answers["files"], answers["postgres"])) / len(asks), 3)
    if kind == "hash":
        out["target_met"] = out["warm_ratio"] <= TARGET_RATIO
    return out


def prefill(embedder: CachedEmbedder, records: list[dict[str, str]], asks: list[str]) -> dict[str, float]:
    """Embed every record's text (as the store embeds it) and every query once, before either store
    is timed; and the model's own time for one query, which both stores pay on top of theirs."""
    from nubos_memory.records import embed_text, validate_batch

    texts = [embed_text(r) for r in validate_batch(records, ["research"])]
    t = time.perf_counter()
    for i in range(0, len(texts), 2_000):
        embedder.embed(texts[i:i + 2_000])
        log(f"model: {min(i + 2_000, len(texts)):,}/{len(texts):,} texts embedded")
    embedder.embed(asks)
    embed_s = time.perf_counter() - t
    embedder.save()
    lat = []
    for q in asks[:50]:
        t = time.perf_counter()
        embedder.inner.embed([q])
        lat.append((time.perf_counter() - t) * 1000)
    return {"model_embed_s": round(embed_s, 1), "model_query_embed_p50_ms": round(statistics.median(lat[5:]), 2)}


def pgvector_side(mem: Memory, asks: list[str]) -> dict[str, Any]:
    """The database's HNSW index: its size, whether the planner uses it, how long a candidate query
    takes, and how many of the exact top-100 it proposes (recall@100 of the candidates)."""
    import numpy as np

    store = cast("PgStore", mem.store)
    manifest, index = store.load_current()
    assert manifest is not None and index is not None, "the namespace has no vectors"
    fingerprint, dim = manifest["embedding"]["fingerprint"], manifest["embedding"]["dim"]
    assert dim is not None
    name = store.index_name(fingerprint)
    with store.db() as conn:
        sizes = conn.execute("SELECT pg_relation_size(to_regclass(%s)), "
                             "pg_total_relation_size('nubos_memory_embeddings')", (name,)).fetchone()
    recall, ms = [], []
    for q in asks:
        vec = mem.embedder.embed([q])[0]
        t = time.perf_counter()
        keys = store.nearest(fingerprint, dim, vec, 100, 100)
        assert keys is not None, "the database gave no candidates"
        ms.append((time.perf_counter() - t) * 1000)
        exact = set(np.argsort(-(np.asarray(index.vectors) @ vec))[:100].tolist())
        labels = {index.label_of_hash(k) for k in keys}
        recall.append(len(exact & labels) / 100)
    with store.db() as conn:
        plan = [r[0] for r in conn.execute(
            f"EXPLAIN SELECT key FROM nubos_memory_embeddings WHERE namespace = %s AND fingerprint = %s "
            f"ORDER BY embedding::vector({int(dim)}) <=> %b::vector({int(dim)}) LIMIT 100",
            (store.namespace, fingerprint, vec), prepare=False).fetchall()]
    return {"hnsw_index_mb": round((sizes[0] or 0) / 2**20, 1), "embeddings_table_mb": round(sizes[1] / 2**20, 1),
            "planner_uses_index": any(name in line for line in plan),
            "candidates_p50_ms": round(statistics.median(ms), 2), "candidates_recall@100": round(sum(recall) / len(recall), 4)}


def table(title: str, runs: list[dict[str, Any]], kind: str) -> str:
    cols = ["records", "store", "index s", "warm p50 ms", "warm p95 ms", "p50 ratio"]
    if kind == "hash":
        cols += ["cold query ms", "cold add ms"]
    cols += ["new machine 1st query ms (pending)", "HNSW MB / table MB", "planner uses index",
             "candidates p50 ms", "recall@100", "same top-10"]
    lines = [f"\n{title}\n", "| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]
    for s in runs:
        for name in ("files", "postgres"):
            r, pg = s[name], name == "postgres"
            cells = [f"{s['records']:,}", name, r["index_s"], r["warm_p50_ms"], r["warm_p95_ms"],
                     f"{s['warm_ratio']}x" if pg else "1x"]
            if kind == "hash":
                cells += [r["cold_query_ms"], r["cold_add_ms"]]
            cells += ([f"{r['new_machine_first_query_ms']} ({r['new_machine_pending']})",
                       f"{r['hnsw_index_mb']} / {r['embeddings_table_mb']}", r["planner_uses_index"],
                       r["candidates_p50_ms"], r["candidates_recall@100"], s["same_top10"]] if pg else
                      ["", "", "", "", "", ""])
            lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def measure(result: dict[str, Any], work: Path, pg: Any, args: argparse.Namespace, data: Path, run: str) -> None:
    """The run's parts into ``result``: hash-embedder scale, the real model, SciFact parity (each
    skipped part named under ``not_measured``)."""
    result["hash"] = []
    for size in args.sizes:
        result["hash"].append(scale(work, pg, size, args.queries, "hash", data))
    result["model"] = []
    if args.model_size:
        from nubos_memory.embed.model import ModelEmbedder

        cached = CachedEmbedder(ModelEmbedder(MODEL), args.model_cache or work / "model-cache")
        result["model"].append(scale(work, pg, args.model_size, args.queries, "model", data, embedder=cached))
    else:
        result["not_measured"].append(f"{MODEL}: skipped (--model-size 0)")
    if args.model_size < 100_000:
        result["not_measured"].append(f"{MODEL} at 100,000 records: not measured (embedding 100k texts takes "
                                      "about 25 minutes on this machine's 2 cores)")
    if args.scifact:
        result["scifact"] = scifact(work, {"backend": "postgres",
                                           "postgres": {"namespace": f"bench-{run}-eval", "timeout_s": 300}}, data)
    else:
        result["not_measured"].append("SciFact parity: skipped (run with --scifact, about 12 minutes)")


def main() -> None:
    started = time.perf_counter()
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[20_000, 100_000])
    ap.add_argument("--model-size", type=int, default=20_000, help="records for the real model (0: skip)")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--scifact", action="store_true", help="run the SciFact parity part (about 12 minutes)")
    ap.add_argument("--skip-scifact", action="store_true", help="the default; kept for older command lines")
    ap.add_argument("--model-cache", type=Path, default=None,
                    help="folder for the model's vectors (default: in the run's temp folder)")
    ap.add_argument("--keep", action="store_true", help="keep the run's temp folder")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "postgres-2026-11-23b.json")
    benchdata.add_flag(ap)
    args = ap.parse_args()
    data = benchdata.scifact(args.datasets)
    server = None
    dsn = os.environ.get("NUBOS_MEMORY_TEST_DSN")
    work = Path(tempfile.mkdtemp(prefix="nubos-bench-pg-"))
    if not dsn:
        from pgserver.postgres_server import get_server

        server = get_server(work / "pg", cleanup_mode="stop")
        dsn = server.get_uri()
    os.environ["NUBOS_MEMORY_DSN"] = dsn
    os.environ.setdefault("NUBOS_MEMORY_CACHE", str(work / "cache"))
    run = uuid.uuid4().hex[:8]

    def pg(label: str) -> dict[str, Any]:
        return {"backend": "postgres", "postgres": {"namespace": f"bench-{run}-{label}", "timeout_s": 300}}

    result: dict[str, Any] = {"date": date.today().isoformat(), "machine": f"{platform.machine()}, {os.cpu_count()} cpus",
                    "postgres": "pgserver 0.1.4 (PostgreSQL 16.2), same machine" if server else "NUBOS_MEMORY_TEST_DSN",
                    "target": f"warm postgres hybrid p50 within {TARGET_RATIO:g}x the file store's (hash embedder)",
                    "not_measured": []}
    try:
        measure(result, work, pg, args, data, run)
    finally:
        if server is not None:
            server.cleanup()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    result["runtime_s"] = round(time.perf_counter() - started)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    if "scifact" in result:
        print("\n| mode | files nDCG@10 | postgres nDCG@10 | difference |\n| --- | --- | --- | --- |")
        for m, d in result["scifact"]["difference"].items():
            print(f"| {m} | {result['scifact']['files']['ndcg@10'][m]} | {result['scifact']['postgres']['ndcg@10'][m]} "
                  f"| {d:+.4f} |")
    print(table("Hash embedder (hash-384): " + result["target"], result["hash"], "hash"))
    for s in result["hash"]:
        p = s["postgres"]
        print(f"\n{s['records']:,} records: p50 ratio {s['warm_ratio']}x, p95 ratio {s['warm_p95_ratio']}x, target "
              f"{'met' if s['target_met'] else 'NOT met'}; index state {p['index_state']}; second machine rebuild "
              f"{p['second_machine_rebuild_s']} s ({p['second_machine_shared']} shared)")
    if result["model"]:
        print(table(f"Real model ({MODEL}), vectors cached: store time only", result["model"], "model"))
        for s in result["model"]:
            print(f"\n{s['records']:,} records: model embedding {s['model_embed_s']} s once for both stores; the model's "
                  f"own query embedding p50 {s['model_query_embed_p50_ms']} ms on top of either store's; index state "
                  f"{s['postgres']['index_state']}; the new machine's first query loads the model (its ONNX export "
                  f"copied in beforehand; exported again: {s['postgres']['new_machine_exported_onnx']})")
    for line in result["not_measured"]:
        print(f"\nnot measured: {line}")
    print(f"\nruntime {result['runtime_s']} s; JSON: {args.out}")


if __name__ == "__main__":
    main()

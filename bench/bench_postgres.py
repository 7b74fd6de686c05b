"""Team memory on PostgreSQL against the file store, in one run (issue: team memory; adr/0014).

1. Quality parity: SciFact (test) through memory-eval on both stores, real packaged model
   (embeddings cached once for both runs): nDCG@10 per mode, and the difference.
2. Scale: the same 100k records (SciFact abstracts and their sentences) in both stores; warm
   hybrid query p50/p95 through one open Memory, and cold `np-tools memory-query` (a fresh
   process, no memory-serve). The scale part uses the deterministic hash embedder, so that the
   model's time (the same for both stores) does not hide the stores' difference.

PostgreSQL: $NUBOS_MEMORY_TEST_DSN, else a pgserver (PostgreSQL 16 from the wheel) in a temp folder.
Run: .venv/bin/python bench/bench_postgres.py [--size 100000] [--queries 200] [--skip-scifact]
Writes bench/results/postgres-<date>.json and prints a table (docs/benchmarks.md records it).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import date
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench_scale import real_texts  # noqa: E402

from nubos_memory import Memory  # noqa: E402

SCIFACT = REPO.parent / "shared" / "datasets" / "scifact"


def project(root: Path, memory: dict) -> Path:
    (root / ".nubos-pilot").mkdir(parents=True)
    (root / ".nubos-pilot/config.json").write_text(json.dumps({"memory": {"enabled": True, **memory}}))
    return root


def cli_ms(root: Path, *args: str) -> float:
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "nubos_memory", *args, "--root", str(root)], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(REPO), "NUBOS_MEMORY_NO_SERVER": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return (time.perf_counter() - t) * 1000


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def scifact(work: Path, pg: dict) -> dict:
    out = {}
    for name, memory in (("files", {}), ("postgres", pg)):
        root = project(work / f"eval-{name}", memory)
        t = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "nubos_memory", "memory-eval", "--root", str(root),
                               "--beir", str(SCIFACT), "--split", "test", "--progress", "none"],
                              capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
        assert proc.returncode == 0, proc.stderr[-2000:]
        doc = json.loads(proc.stdout)
        out[name] = {"seconds": round(time.perf_counter() - t, 1),
                     "ndcg@10": {m: v["ndcg@10"] for m, v in doc["modes"].items()},
                     "p50_ms": {m: v["latency_ms"]["p50"] for m, v in doc["modes"].items()}}
        print(f"scifact {name}: {out[name]}", file=sys.stderr)
    out["difference"] = {m: round(out["postgres"]["ndcg@10"][m] - out["files"]["ndcg@10"][m], 4)
                         for m in out["files"]["ndcg@10"]}
    return out


def scale(work: Path, pg: dict, size: int, queries: int) -> dict:
    texts = real_texts(size)  # abstracts and their sentences run out near 50k: revisits make up the rest
    base_texts, k = list(texts), 1
    while len(texts) < size:
        k += 1
        texts += [{"title": f"{r['title']} (revisit {k})", "body": r["body"]} for r in base_texts[: size - len(texts)]]
    records = [{"type": "research", "id": f"r{i}", **r} for i, r in enumerate(texts)]
    asks = [r["title"][:60] for r in records[:: max(1, len(records) // queries)]][:queries]
    base = {"provider": "hash", "model": "hash-384", "near_duplicate": None}
    out: dict = {"records": len(records), "queries": len(asks), "embedder": "hash-384 (no model time)"}
    answers: dict[str, list] = {}
    for name, memory in (("files", base), ("postgres", {**base, **pg})):
        root = project(work / f"scale-{name}", memory)
        mem = Memory.open(root)
        t = time.perf_counter()
        for i in range(0, len(records), 10_000):
            mem.index(records[i:i + 10_000], force=True)
        index_s = time.perf_counter() - t
        for q in asks[:20]:
            mem.query(q, track=False)  # warm up
        lat = []
        for q in asks:
            t = time.perf_counter()
            mem.query(q, track=False)
            lat.append((time.perf_counter() - t) * 1000)
        answers[name] = [[h["id"] for h in mem.query(q, track=False)["hits"]] for q in asks]
        cold = [cli_ms(root, "memory-query", asks[i]) for i in range(5)]
        add = [cli_ms(root, "memory-add", "--type", "learning", "--title", f"bench note {uuid.uuid4().hex}")
               for _ in range(3)]
        out[name] = {"index_s": round(index_s, 1), "warm_p50_ms": round(statistics.median(lat), 2),
                     "warm_p95_ms": round(pct(lat, 95), 2), "cold_query_ms": round(statistics.median(cold)),
                     "cold_add_ms": round(statistics.median(add))}
        if name == "postgres":
            out[name].update(pgvector_side(mem, asks))
            t = time.perf_counter()  # a second machine: its own cache, vectors from the database
            proc = subprocess.run([sys.executable, "-m", "nubos_memory", "memory-rebuild", "--root", str(root)],
                                  capture_output=True, text=True,
                                  env={**os.environ, "PYTHONPATH": str(REPO), "NUBOS_MEMORY_NO_SERVER": "1",
                                       "NUBOS_MEMORY_CACHE": str(work / "cache-second-machine")})
            assert proc.returncode == 0, proc.stderr[-2000:]
            out[name]["second_machine_rebuild_s"] = round(time.perf_counter() - t, 1)
            out[name]["second_machine_shared"] = json.loads(proc.stdout).get("shared")
        print(f"scale {name}: {out[name]}", file=sys.stderr)
    out["warm_ratio"] = round(out["postgres"]["warm_p50_ms"] / out["files"]["warm_p50_ms"], 2)
    out["same_top10"] = round(sum(a == b for a, b in zip(answers["files"], answers["postgres"])) / len(asks), 3)
    return out


def pgvector_side(mem: Memory, asks: list[str]) -> dict:
    """The database's HNSW index: its size, whether the planner uses it, how long a candidate query
    takes, and how many of the exact top-100 it proposes (recall@100 of the candidates)."""
    import numpy as np

    store = mem.store
    manifest, index = store.load_current()
    fingerprint, dim = manifest["embedding"]["fingerprint"], manifest["embedding"]["dim"]
    name = store.index_name(fingerprint)
    with store.db() as conn:
        sizes = conn.execute("SELECT pg_relation_size(%s::regclass), pg_total_relation_size('nubos_memory_embeddings')",
                             (name,)).fetchone()
    recall, ms = [], []
    for q in asks:
        vec = mem.embedder.embed([q])[0]
        t = time.perf_counter()
        keys = store.nearest(fingerprint, dim, vec, 100, 100)
        ms.append((time.perf_counter() - t) * 1000)
        exact = set(np.argsort(-(np.asarray(index.vectors) @ vec))[:100].tolist())
        labels = {index.label_of_hash(k) for k in keys}
        recall.append(len(exact & labels) / 100)
    with store.db() as conn:
        plan = [r[0] for r in conn.execute(
            f"EXPLAIN SELECT key FROM nubos_memory_embeddings WHERE namespace = %s AND fingerprint = %s "
            f"ORDER BY embedding::vector({int(dim)}) <=> %b::vector({int(dim)}) LIMIT 100",
            (store.namespace, fingerprint, vec), prepare=False).fetchall()]
    return {"hnsw_index_mb": round(sizes[0] / 2**20, 1), "embeddings_table_mb": round(sizes[1] / 2**20, 1),
            "planner_uses_index": any(name in line for line in plan),
            "candidates_p50_ms": round(statistics.median(ms), 2), "candidates_recall@100": round(sum(recall) / len(recall), 4)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=100_000)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--skip-scifact", action="store_true")
    args = ap.parse_args()
    server = None
    dsn = os.environ.get("NUBOS_MEMORY_TEST_DSN")
    work = Path(tempfile.mkdtemp(prefix="nubos-bench-pg-"))
    if not dsn:
        import pgserver

        server = pgserver.get_server(work / "pg", cleanup_mode="stop")
        dsn = server.get_uri()
    os.environ["NUBOS_MEMORY_DSN"] = dsn
    os.environ.setdefault("NUBOS_MEMORY_CACHE", str(work / "cache"))
    pg = {"backend": "postgres", "postgres": {"namespace": f"bench-{uuid.uuid4().hex[:8]}"}}
    result: dict = {"date": date.today().isoformat(), "machine": f"{platform.machine()}, {os.cpu_count()} cpus",
                    "postgres": "pgserver 0.1.4 (PostgreSQL 16.2), same machine" if server else "NUBOS_MEMORY_TEST_DSN"}
    try:
        if not args.skip_scifact:
            result["scifact"] = scifact(work, {"backend": "postgres", "postgres": {"namespace": "bench-eval"}})
        result["scale"] = scale(work, pg, args.size, args.queries)
    finally:
        if server is not None:
            server.cleanup()
    path = REPO / "bench" / "results" / f"postgres-{result['date']}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    if "scifact" in result:
        print("\n| mode | files nDCG@10 | postgres nDCG@10 | difference |\n| --- | --- | --- | --- |")
        for m, d in result["scifact"]["difference"].items():
            print(f"| {m} | {result['scifact']['files']['ndcg@10'][m]} | {result['scifact']['postgres']['ndcg@10'][m]} "
                  f"| {d:+.4f} |")
    s = result["scale"]
    p = s["postgres"]
    print(f"\npgvector HNSW: {p['hnsw_index_mb']} MB index, {p['embeddings_table_mb']} MB table, planner uses it: "
          f"{p['planner_uses_index']}, candidates p50 {p['candidates_p50_ms']} ms, recall@100 {p['candidates_recall@100']}; "
          f"same top-10 as the file store: {s['same_top10']}; second machine rebuild {p['second_machine_rebuild_s']} s")
    print(f"\n| {s['records']:,} records | index s | warm p50 ms | warm p95 ms | cold query ms | cold add ms |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name in ("files", "postgres"):
        r = s[name]
        print(f"| {name} | {r['index_s']} | {r['warm_p50_ms']} | {r['warm_p95_ms']} | {r['cold_query_ms']} "
              f"| {r['cold_add_ms']} |")


if __name__ == "__main__":
    main()

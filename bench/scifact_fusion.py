"""Choose the hybrid-scoring defaults on SciFact *train*, report *test*.

Needs the embeddings of bench/scifact_embed.py (bench/.cache/scifact/). Evaluates exactly what
the product does: candidates = BM25 top-N ∪ dense top-N; every candidate scored exactly on both
signals; fused = α·norm(bm25) + (1−α)·cos; a candidate with no shared term kept only if
cos ≥ threshold. BM25 is the product's (nubos_memory.lexical, Lucene idf) over the product's
tokenizer. Metric: nDCG@10 with trec_eval linear gains.

Run: .venv/bin/python bench/scifact_fusion.py [DATA_DIR] > bench/scifact_fusion.txt
"""

from __future__ import annotations

import csv
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from nubos_memory.lexical import RankBM25Scorer  # noqa: E402
from nubos_memory.tokenize import tokenize  # noqa: E402

DATA = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[2] / "shared/datasets/scifact")
CACHE = Path(__file__).resolve().parent / ".cache" / "scifact"


def qrels(split: str) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    with open(DATA / "qrels" / f"{split}.tsv") as f:
        for row in csv.DictReader(f, delimiter="\t"):
            if int(row["score"]) > 0:
                out.setdefault(row["query-id"], set()).add(row["corpus-id"])
    return out


def ndcg10(ranked: list[int], rel: set[int]) -> float:
    dcg = sum(1.0 / np.log2(i + 2) for i, d in enumerate(ranked[:10]) if d in rel)
    idcg = sum(1.0 / np.log2(i + 2) for i in range(min(len(rel), 10)))
    return dcg / idcg


def main() -> None:
    t0 = time.time()
    docs = [json.loads(line) for line in (DATA / "corpus.jsonl").open()]
    queries = {q["_id"]: q["text"] for q in map(json.loads, (DATA / "queries.jsonl").open())}
    doc_ids = json.loads((CACHE / "docs.json").read_text())
    assert doc_ids == [d["_id"] for d in docs]
    pos = {d: i for i, d in enumerate(doc_ids)}
    q_ids = json.loads((CACHE / "queries.json").read_text())
    qvec_all = np.load(CACHE / "queries.npy")
    qrow = {q: i for i, q in enumerate(q_ids)}
    scorer = RankBM25Scorer([tokenize(d["title"] + "\n" + d["text"]) for d in docs])
    dense = {"trunc": np.load(CACHE / "docs_trunc.npy")}
    chunks, owner = np.load(CACHE / "chunks.npy"), np.load(CACHE / "chunk_owner.npy")
    n = len(docs)
    mean = np.zeros((n, chunks.shape[1]), dtype=np.float32)
    np.add.at(mean, owner, chunks)
    dense["chunk-mean"] = mean / np.linalg.norm(mean, axis=1, keepdims=True)
    first = np.zeros(n, dtype=bool)
    firstvec = np.zeros_like(mean)
    seen = set()
    for i, o in enumerate(owner):
        if o not in seen:
            seen.add(o)
            firstvec[o] = chunks[i]
    w = firstvec + mean / np.bincount(owner, minlength=n)[:, None]
    dense["first+mean"] = w / np.linalg.norm(w, axis=1, keepdims=True)
    print(f"# loaded in {time.time() - t0:.1f}s; {len(chunks)} chunks for {n} docs", flush=True)

    splits = {s: qrels(s) for s in ("train", "test")}
    pre: dict[str, list] = {}
    for split, qr in splits.items():
        rows = []
        for qid, rel in qr.items():
            terms = tokenize(queries[qid])
            raw = scorer.scores(terms)
            qv = qvec_all[qrow[qid]]
            cos = {k: v @ qv for k, v in dense.items()}
            cos["chunk-max"] = np.full(n, -1.0, dtype=np.float32)
            np.maximum.at(cos["chunk-max"], owner, chunks @ qv)
            rows.append((raw, scorer.upper_bound(terms), cos, {pos[d] for d in rel}))
        pre[split] = rows
    print(f"# scored in {time.time() - t0:.1f}s", flush=True)

    def run(split, *, dense_kind="trunc", norm="max", beta=0.5, c=10.0, alpha=0.6, thr=-1.0, N=100, mode="alpha"):
        total = 0.0
        for raw, ub, cos_all, rel in pre[split]:
            cos = cos_all[dense_kind]
            if mode == "bm25":
                ranked = list(np.argsort(-raw, kind="stable")[:10])
                total += ndcg10([d for d in ranked if raw[d] > 0], rel)
                continue
            if mode == "dense":
                total += ndcg10(list(np.argsort(-cos, kind="stable")[:10]), rel)
                continue
            lex = np.flatnonzero(raw > 0)
            lex = lex[np.argsort(-raw[lex], kind="stable")][:N]
            vec = np.argsort(-cos, kind="stable")[:N]
            cand = np.union1d(lex, vec)
            best = raw.max()
            if mode == "rrf":
                lr = {d: i + 1 for i, d in enumerate(lex)}
                vr = {d: i + 1 for i, d in enumerate(vec)}
                s = np.array([(1 / (60 + lr[d]) if d in lr else 0) + (1 / (60 + vr[d]) if d in vr else 0) for d in cand])
            else:
                r = raw[cand]
                if norm == "max":
                    ln = r / max(best, 1e-12)
                elif norm == "ub":
                    ln = r / max(ub, 1e-12)
                elif norm == "mix":
                    ln = r / max(best, beta * ub, 1e-12)
                elif norm == "sat":
                    ln = r / (r + c)
                s = alpha * ln + (1 - alpha) * cos[cand]
                s = np.where((r <= 0) & (cos[cand] < thr), -np.inf, s)
            order = cand[np.argsort(-s, kind="stable")][:10]
            total += ndcg10(list(order), rel)
        return total / len(pre[split])

    def both(**kw):
        return run("train", **kw), run("test", **kw)

    print("\n## baselines (train, test)")
    print("bm25", both(mode="bm25"))
    for k in ("trunc", "chunk-mean", "chunk-max", "first+mean"):
        print("dense", k, both(mode="dense", dense_kind=k))
    print("rrf trunc", both(mode="rrf"))

    print("\n## normalisation x alpha, dense=trunc (train | test)")
    alphas = [round(a, 1) for a in np.arange(0.1, 1.0, 0.1)]
    variants = [("max", {}), ("ub", {}), ("mix", {"beta": 0.25}), ("mix", {"beta": 0.5}), ("mix", {"beta": 0.75}),
                ("sat", {"c": 5.0}), ("sat", {"c": 10.0}), ("sat", {"c": 20.0})]
    best_cfg = None
    for norm, extra in variants:
        tr = [run("train", norm=norm, alpha=a, **extra) for a in alphas]
        te = [run("test", norm=norm, alpha=a, **extra) for a in alphas]
        label = norm + "".join(f" {k}={v}" for k, v in extra.items())
        print(f"{label:14s} train " + " ".join(f"{x:.3f}" for x in tr) + " | test " + " ".join(f"{x:.3f}" for x in te))
        i = int(np.argmax(tr))
        if best_cfg is None or tr[i] > best_cfg[0]:
            best_cfg = (tr[i], norm, extra, alphas[i], te[i])
    print("alphas", alphas)
    print("best on train:", best_cfg)
    _, norm, extra, alpha, _ = best_cfg

    print("\n## dense variant with the chosen normalisation (alpha grid; train | test)")
    for k in ("trunc", "chunk-mean", "chunk-max", "first+mean"):
        tr = [run("train", dense_kind=k, norm=norm, alpha=a, **extra) for a in alphas]
        te = [run("test", dense_kind=k, norm=norm, alpha=a, **extra) for a in alphas]
        print(f"{k:11s} train " + " ".join(f"{x:.3f}" for x in tr) + " | test " + " ".join(f"{x:.3f}" for x in te))

    print("\n## threshold for vector-only hits (chosen norm, alpha; trunc) train, test")
    for thr in [-1.0, 0.0, 0.1, 0.2, 0.25, 0.3, 0.35, 0.4, 0.5, 0.6, 0.7]:
        print(thr, both(norm=norm, alpha=alpha, thr=thr, **extra))

    print("\n## candidates per side (train, test)")
    for N in (20, 50, 100, 200, 1000):
        print(N, both(norm=norm, alpha=alpha, N=N, **extra))
    print(f"# done in {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()

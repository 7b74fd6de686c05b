"""Retrieval quality on long abstracts and on short conversational memories, in one run.

Runs ``memory-eval`` (the product's real write and query paths) on SciFact (test, and train where
the defaults were chosen) and on LoCoMo dev (conversations 0-4, one memory each, averaged over
their questions), every mode, and prints the markdown table docs/benchmarks.md shows.  Raw results
go to bench/results/recall-<date>.json.  Datasets: ``--datasets``, else $NUBOS_MEMORY_DATASETS,
else ../shared/datasets beside the repository.

    .venv/bin/python bench/bench_recall.py [--splits test,train] [--locomo-only] [--datasets FOLDER]
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import benchdata  # noqa: E402

from nubos_memory.config import MemoryConfig  # noqa: E402
from nubos_memory.evaluation import MODES, evaluate  # noqa: E402


def table(rows: list[tuple[str, dict[str, Any]]]) -> str:
    out = ["| data | queries | mode | nDCG@10 | recall@10 | recall@100 | MRR@10 | p50 ms |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, res in rows:
        for mode in MODES:
            m = res["modes"][mode]
            p50 = m.get("latency_ms", {}).get("p50")
            out.append(f"| {name} | {res['queries']} | {mode} | {m['ndcg@10']:.4f} | {m['recall@10']:.4f} "
                       f"| {m['recall@100']:.4f} | {m['mrr@10']:.4f} | {'' if p50 is None else p50} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--splits", default="test,train", help="SciFact splits to run")
    ap.add_argument("--locomo-only", action="store_true")
    benchdata.add_flag(ap)
    args = ap.parse_args()
    locomo = benchdata.locomo(args.datasets)
    scifact = None if args.locomo_only else benchdata.scifact(args.datasets)
    config = {**MemoryConfig().to_dict(), "enabled": True}
    rows = []
    res = evaluate(config, locomo, split="test")
    rows.append(("LoCoMo dev (5 conversations)", res))
    per_conv = {Path(d["dataset"]).name: {m: d["modes"][m]["recall@10"] for m in MODES} for d in res["datasets"]}
    if scifact is not None:
        for split in args.splits.split(","):
            rows.append((f"SciFact {split}", evaluate(config, scifact, split=split)))
    print(table(rows))
    print("\nLoCoMo recall@10 per conversation:\n")
    print("| conversation | " + " | ".join(MODES) + " |")
    print("| --- | " + " | ".join("---" for _ in MODES) + " |")
    for conv, by_mode in per_conv.items():
        print(f"| {conv} | " + " | ".join(f"{by_mode[m]:.4f}" for m in MODES) + " |")
    stamp = datetime.date.today().isoformat()
    out = REPO / "bench" / "results" / f"recall-{stamp}.json"
    out.write_text(json.dumps(dict(rows), indent=1))
    print(f"\nraw results: {out.relative_to(REPO)}")


if __name__ == "__main__":
    main()

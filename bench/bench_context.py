"""memory-context (issue 25): what one per-turn block costs beside a plain warm query.

One memory of 10,000 synthetic records (the hash embedder: no model, so the query itself is as cheap
as it gets and what memory-context adds is the largest share it can be), 20 of them hot (10 written
with ``hot: true``, 10 pinned with ``memory-pin``) and 200 of type ``handoff``.  The same 100 task
texts run warm as ``Memory.query(k=8, max_tokens=4000)`` and as ``Memory.context(max_tokens=4000,
k=8, recent=3)``, alternating, several rounds, neither recording usage; the table gives medians, p90
and the ratio.

Run: .venv/bin/python bench/bench_context.py [--records 10000] [--hot 20] [--rounds 5]
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from benchsynth import WORDS, p90, project, timed  # noqa: E402


def records(n: int, hot_on_write: int, handoffs: int, rng: random.Random) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        words = " ".join(rng.choice(WORDS) for _ in range(12))
        rec: dict[str, Any] = {"id": f"r{i}", "type": "handoff" if i % (n // handoffs) == 1 else "learning",
                               "title": f"note {i}: {words[:40]}", "body": words,
                               "created_at": f"2026-{1 + i % 12:02d}-{1 + i % 28:02d}T00:00:00Z"}
        if i < hot_on_write:
            rec["hot"] = True
        out.append(rec)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--records", type=int, default=10_000)
    ap.add_argument("--hot", type=int, default=20)
    ap.add_argument("--handoffs", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    rng = random.Random(7)
    base = Path(tempfile.mkdtemp(prefix="nubos-context-bench-"))
    try:
        mem = project(base / "proj")
        mem.index(records(args.records, args.hot // 2, args.handoffs, random.Random(11)))
        mem.pin([f"r{i}" for i in range(args.hot // 2, args.hot)])
        texts = [" ".join(rng.choice(WORDS) for _ in range(4)) for _ in range(100)]

        def query(text: str) -> Any:
            return mem.query(text, k=8, max_tokens=4000, track=False)

        def context(text: str) -> Any:
            return mem.context(text, max_tokens=4000, k=8, recent=3, track=False)

        timed(query, texts[:10])
        timed(context, texts[:10])
        q_runs: list[float] = []
        c_runs: list[float] = []
        for _ in range(args.rounds):
            q_runs += timed(query, texts)
            c_runs += timed(context, texts)
        block = context(texts[0])
        sections = block["sections"]
        assert len(sections["hot"]["hits"]) + len([s for s in block["budget"]["left_out"] if s["section"] == "hot"]) \
            == args.hot, "every hot record is in the block or said to be left out"
        q, c = statistics.median(q_runs), statistics.median(c_runs)
        print(f"records {args.records}, hot {args.hot}, handoffs {args.handoffs}, {len(q_runs)} calls each "
              f"(hash embedder)\n")
        print(f"one block: hot {len(sections['hot']['hits'])} hits / relevant {len(sections['relevant']['hits'])} / "
              f"recent {len(sections['recent']['hits'])}, {block['budget']['used']} of 4000 tokens\n")
        print("| measure | memory-query (k 8, 4000 tokens) | memory-context (k 8, recent 3, 4000 tokens) | ratio |")
        print("| --- | --- | --- | --- |")
        print(f"| warm, median ms | {q:.2f} | {c:.2f} | {c / q:.2f}× |")
        print(f"| warm, p90 ms | {p90(q_runs):.2f} | {p90(c_runs):.2f} | |")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()

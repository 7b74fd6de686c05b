"""Anchors (issue 23): what checking cited code costs a warm query, and memory-verify at scale.

Two memories hold the same 10,000 synthetic records (the hash embedder: no model, so the query
itself is as cheap as it gets and the anchors' share is the largest it can be); in one, every record
cites a line range of one of 1,000 source files.  The same 100 hybrid queries (k = 10: ten anchored
hits each) run warm on both, alternating, several rounds; the table gives the medians and the
overhead.  Then ``memory-verify`` of the anchored memory, cold: a fresh process (the CLI, Python start
included) and a fresh library object.  Targets: overhead <= 10 %, verify <= 2 s.

Run: .venv/bin/python bench/bench_anchors.py [--records 10000] [--files 1000]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from benchsynth import WORDS, p90, project, timed  # noqa: E402

from nubos_memory.api.memory import Memory  # noqa: E402
from nubos_memory.config import load_project  # noqa: E402
from nubos_memory.embed.hashing import HashEmbedder  # noqa: E402


def sources(root: Path, files: int, rng: random.Random) -> None:
    for f in range(files):
        path = root / "src" / f"mod{f // 100}" / f"file{f}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(f"def f{f}_{i}():\n    return {rng.randrange(1000)}  # {rng.choice(WORDS)}\n"
                                for i in range(60)))


def records(n: int, files: int, anchored: bool, rng: random.Random) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        words = " ".join(rng.choice(WORDS) for _ in range(12))
        rec: dict[str, Any] = {"id": f"r{i}", "type": "learning", "title": f"note {i}: {words[:40]}", "body": words}
        if anchored:
            start = 1 + 2 * rng.randrange(50)
            rec["anchors"] = [f"src/mod{(i % files) // 100}/file{i % files}.py:{start}-{start + 3}"]
        out.append(rec)
    return out


def timed_queries(mem: Memory, queries: list[str]) -> list[float]:
    return timed(lambda q: mem.query(q, k=10, track=False), queries)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--records", type=int, default=10_000)
    ap.add_argument("--files", type=int, default=1_000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    rng = random.Random(7)
    base = Path(tempfile.mkdtemp(prefix="nubos-anchors-bench-"))
    try:
        plain, anchored = project(base / "plain"), project(base / "anchored")
        sources(base / "anchored", args.files, rng)
        texts = records(args.records, args.files, True, random.Random(11))
        plain.index([{k: v for k, v in r.items() if k != "anchors"} for r in texts])
        anchored.index(texts)
        queries = [" ".join(rng.choice(WORDS) for _ in range(4)) for _ in range(100)]
        timed_queries(plain, queries[:10])
        timed_queries(anchored, queries[:10])  # warm: the cited files are read once here
        a_runs, b_runs = [], []
        for _ in range(args.rounds):
            a_runs += timed_queries(plain, queries)
            b_runs += timed_queries(anchored, queries)
        hit = anchored.query(queries[0], k=10, track=False)["hits"]
        assert all(h.get("freshness") == "verified" for h in hit), "every hit is anchored and verified"
        env = {**os.environ, "PYTHONPATH": str(REPO), "NUBOS_MEMORY_NO_SERVER": "1"}
        t0 = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "nubos_memory", "memory-verify", "--root", str(base / "anchored")],
                              capture_output=True, text=True, env=env, check=True)
        cli_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        fresh = Memory(load_project(base / "anchored"), embedder=HashEmbedder("hash-256"))
        report = fresh.verify()
        lib_s = time.perf_counter() - t0
        assert json.loads(done.stdout)["anchored"] == args.records == report["anchored"]
        a, b = statistics.median(a_runs), statistics.median(b_runs)
        print(f"records {args.records}, files {args.files}, queries {len(a_runs)} per memory (k = 10)\n")
        print("| measure | without anchors | with anchors | overhead |")
        print("| --- | --- | --- | --- |")
        print(f"| warm hybrid query, median ms | {a:.2f} | {b:.2f} | {100 * (b - a) / a:+.1f} % |")
        print(f"| warm hybrid query, p90 ms | {p90(a_runs):.2f} | {p90(b_runs):.2f} | |")
        print(f"\n| memory-verify, {args.records} anchored records over {args.files} files | seconds |")
        print("| --- | --- |")
        print(f"| cold CLI process (Python start included) | {cli_s:.2f} |")
        print(f"| fresh library object | {lib_s:.2f} |")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()

"""Costs that should not grow with the memory (issue 27): the same calls at each size, in one run.

The hash embedder at 384 dimensions (no model: the figures are the store's and the search's, and a
million records can be built here). Each memory is a log of synthetic notes (35 words from 5,000)
built by ``memory-rebuild`` into the canonical form, unless ``--memories DIR`` already holds
``DIR/<size>``. Per size:

* warm ``memory-add`` of one record in a process that has the memory open (median of 7, and the
  slowest: a write that merges segments pays for the merge), then the warm hybrid query p50;
* one-shot calls, each a fresh ``python -m nubos_memory`` process: ``memory-query`` (hybrid),
  ``--mode lexical``, ``memory-stats``, ``memory-add`` (median of ``--runs``);
* a ``memory-query`` CLI call answered by a running ``memory-serve``, against ``python -c pass``;
* the peak RSS (``VmHWM``) of a process that opens the memory, answers 20 hybrid queries, takes one
  write and answers 20 more.

Run: .venv/bin/python bench/bench_flat.py [--sizes 1000,10000,100000] [--memories DIR] [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "NUBOS_MEMORY_NO_SERVER": "1"}
CONFIG = {"memory": {"enabled": True, "provider": "hash", "model": "hash-384"}}

WARM = r"""
import json, statistics, sys, time
sys.path.insert(0, sys.argv[1])
from nubos_memory import Memory
mem = Memory.open(sys.argv[2], user=False)
mem.query("w12 w400", k=10)
adds, queries = [], []
for i in range(7):
    t = time.perf_counter()
    mem.add({"type": "learning", "title": f"warm add {i} w1 w7 {time.time_ns()}", "body": "w3 w4 w5 w6"}, force=True)
    adds.append((time.perf_counter() - t) * 1000)
for i in range(50):
    t = time.perf_counter()
    mem.query(f"w{i * 7} w{i * 13 + 5} w{i * 31 + 9}", k=10)
    queries.append((time.perf_counter() - t) * 1000)
print(json.dumps({"add_ms": adds, "query_p50_ms": statistics.median(queries)}))
"""

RSS = r"""
import sys, time
sys.path.insert(0, sys.argv[1])
from nubos_memory import Memory
mem = Memory.open(sys.argv[2], user=False)
for i in range(20):
    mem.query(f"w{i} w{i + 40}", k=10)
mem.add({"type": "learning", "title": f"rss probe {time.time_ns()}", "body": "one write"}, force=True)
for i in range(20):
    mem.query(f"w{i + 3} w{i + 70}", k=10)
print(next(line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM")))
"""

ONESHOT = {
    "query": ["memory-query", "w12 w400 w33"],
    "lexical": ["memory-query", "--mode", "lexical", "w12 w400"],
    "stats": ["memory-stats"],
    "add": ["memory-add", "--type", "learning", "--title", "a fresh note w1 w2", "--body", "w3 w4 w5"],
}


def write_log(root: Path, n: int) -> None:
    """A log of ``n`` synthetic notes in groups of 5,000 (what ``memory-index`` batches write)."""
    folder = root / ".nubos-pilot" / "memory"
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    (root / ".nubos-pilot" / "config.json").write_text(json.dumps(CONFIG))
    rng = random.Random(1)
    words = [f"w{i}" for i in range(5000)]
    with open(folder / "records.jsonl", "w") as f:
        for start in range(0, n, 5000):
            m = min(5000, n - start)
            f.write(json.dumps({"op": "group", "lines": m, "gid": f"{start:012x}"}, separators=(",", ":")) + "\n")
            for i in range(m):  # (a group's lines, then its commit line: log.py)
                rec: dict[str, Any] = {"id": str(uuid.UUID(int=rng.getrandbits(128), version=4)), "type": "learning", "phase": None,
                       "title": " ".join(rng.choice(words) for _ in range(5)),
                       "body": " ".join(rng.choice(words) for _ in range(30)), "tags": [], "provenance": None,
                       "created_at": f"2026-11-01T00:00:00.{(start + i) % 1000000:06d}Z"}
                f.write(json.dumps(rec, separators=(",", ":")) + "\n")
            f.write(json.dumps({"op": "commit", "gid": f"{start:012x}"}, separators=(",", ":")) + "\n")


def build(root: Path, n: int) -> float:
    """A memory of ``n`` synthetic notes at ``root`` (the log, then ``memory-rebuild``); seconds it took."""
    write_log(root, n)
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "nubos_memory", "memory-rebuild", "--root", str(root)], env=ENV,
                   check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t


def cli(root: Path, argv: list[str], env: dict[str, str] | None = None, code: Path = REPO) -> float:
    """Milliseconds of one ``python -m nubos_memory`` call (``code``: the checkout that runs it)."""
    env = {**(env or ENV), "PYTHONPATH": str(code)}
    t = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "nubos_memory", *argv, "--root", str(root)], env=env, cwd=str(code),
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)
    took = time.perf_counter() - t
    if done.returncode != 0:
        raise SystemExit(f"{argv[0]} failed in {code}: {done.stderr.decode()[:500]}")
    return took * 1000


def bare() -> float:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    return (time.perf_counter() - t) * 1000


def served(root: Path, runs: int) -> dict[str, float]:
    """CLI queries answered by a running memory-serve, interleaved with bare Python starts."""
    env = {k: v for k, v in ENV.items() if k != "NUBOS_MEMORY_NO_SERVER"}
    server = subprocess.Popen([sys.executable, "-m", "nubos_memory", "memory-serve", "--root", str(root)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert server.stderr is not None and '"serving"' in server.stderr.readline()
        cli(root, ["memory-query", "warm up"], env)
        calls, floor = [], []
        for i in range(runs * 2):
            calls.append(cli(root, ["memory-query", f"w{i} w{i + 9}"], env))
            floor.append(bare())
        return {"served_query_ms": statistics.median(calls), "python_pass_ms": statistics.median(floor)}
    finally:
        server.send_signal(signal.SIGTERM)
        server.communicate(timeout=60)


def one_size(root: Path, runs: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, argv in ONESHOT.items():
        out[f"oneshot_{name}_ms"] = statistics.median(cli(root, argv) for _ in range(runs))
    warm = json.loads(subprocess.run([sys.executable, "-c", WARM, str(REPO), str(root)], env=ENV, check=True,
                                     capture_output=True, text=True).stdout)
    out["warm_add_ms"] = statistics.median(warm["add_ms"])
    out["warm_add_max_ms"] = max(warm["add_ms"])
    out["warm_query_p50_ms"] = warm["query_p50_ms"]
    out.update(served(root, runs))
    rss = subprocess.run([sys.executable, "-c", RSS, str(REPO), str(root)], env=ENV, check=True,
                         capture_output=True, text=True).stdout.strip()
    out["warm_peak_rss_mb"] = int(rss) / 1024
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--sizes", default="1000,10000,100000")
    ap.add_argument("--memories", type=Path, help="a folder of prebuilt memories, one per size (DIR/<size>)")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    # As bin/setup does: compiled modules, so no call pays for compiling them (PYTHONDONTWRITEBYTECODE)
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "nubos_memory")], check=True)
    scratch = Path(tempfile.mkdtemp(prefix="bench-flat-"))
    results: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "sizes": {}}
    try:
        for n in sizes:
            root = (args.memories / str(n)) if args.memories else scratch / str(n)
            if not (root / ".nubos-pilot" / "memory" / "manifest.json").exists():
                results.setdefault("rebuild_s", {})[str(n)] = build(root, n)
            results["sizes"][str(n)] = one_size(root, args.runs)
            print(n, json.dumps(results["sizes"][str(n)]), flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print_table(results)
    out = REPO / "bench" / "results"
    out.mkdir(exist_ok=True)
    (out / f"flat-{time.strftime('%Y-%m-%d')}.json").write_text(json.dumps(results, indent=2))


def print_table(results: dict[str, Any]) -> None:
    rows = [("warm memory-add, median of 7 (ms)", "warm_add_ms"), ("warm memory-add, slowest of 7 (ms)", "warm_add_max_ms"),
            ("warm hybrid query p50 (ms)", "warm_query_p50_ms"), ("one-shot memory-query, hybrid (ms)", "oneshot_query_ms"),
            ("one-shot memory-query --mode lexical (ms)", "oneshot_lexical_ms"),
            ("one-shot memory-stats (ms)", "oneshot_stats_ms"), ("one-shot memory-add (ms)", "oneshot_add_ms"),
            ("CLI query served by memory-serve (ms)", "served_query_ms"), ("python -c pass (ms)", "python_pass_ms"),
            ("warm peak RSS (MB)", "warm_peak_rss_mb")]
    sizes = list(results["sizes"])
    print("| figure | " + " | ".join(f"{int(s):,}" for s in sizes) + " | largest / smallest |")
    print("| --- | " + " | ".join("---" for _ in sizes) + " | --- |")
    for label, key in rows:
        values = [results["sizes"][s][key] for s in sizes]
        ratio = values[-1] / values[0] if values[0] else float("nan")
        print(f"| {label} | " + " | ".join(f"{v:,.1f}" for v in values) + f" | {ratio:.2f}× |")


if __name__ == "__main__":
    main()

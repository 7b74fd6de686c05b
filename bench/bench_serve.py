"""End-to-end CLI latency at 10k records: warm (memory-serve running) vs cold, vs bare Python start.

Uses the real packaged model and the 10k base records of bench/bench_scale.py (their embeddings
come from memory-eval's embedding cache, filled by that script). SciFact from --datasets, else
$NUBOS_MEMORY_DATASETS, else ../shared/datasets beside the repository.
Run: .venv/bin/python bench/bench_serve.py [--datasets FOLDER]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import benchdata  # noqa: E402
from bench_scale import cache_dir, cli, make_memory, real_texts  # noqa: E402

from nubos_memory.embed.model import ModelEmbedder  # noqa: E402
from nubos_memory.evaluation import CachedEmbedder  # noqa: E402
from nubos_memory.limits import DEFAULT_MODEL  # noqa: E402


def main(n: int = 10_000, repeats: int = 20) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    benchdata.add_flag(ap)
    data = benchdata.scifact(ap.parse_args().datasets)
    queries = [json.loads(line)["text"] for line in (data / "queries.jsonl").open()][:repeats]
    root = Path(tempfile.mkdtemp(prefix="nubos-serve-bench-"))
    try:
        make_memory(root, CachedEmbedder(ModelEmbedder(DEFAULT_MODEL), cache_dir()),
                    real_texts(n, data))
        bare = statistics.median(_bare() for _ in range(5))
        cold = [cli(root, "memory-query", q, env={"NUBOS_MEMORY_NO_SERVER": "1"}) for q in queries[:5]]
        server = subprocess.Popen([sys.executable, "-m", "nubos_memory", "memory-serve", "--root", str(root)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env={**os.environ, "PYTHONPATH": str(REPO)})
        assert server.stderr is not None and '"serving"' in server.stderr.readline()
        warm = [cli(root, "memory-query", q) for q in queries]
        warm_stats = [cli(root, "memory-stats") for _ in range(5)]
        server.send_signal(signal.SIGTERM)
        server.communicate(timeout=30)
        result = {"records": n, "python_start_ms": bare,
                  "cli_query_warm_ms": {"p50": statistics.median(warm), "max": max(warm)},
                  "cli_stats_warm_ms_p50": statistics.median(warm_stats),
                  "cli_query_cold_ms": {"p50": statistics.median(cold), "max": max(cold)}}
        print(json.dumps(result, indent=2))
        out = REPO / "bench" / "results"
        out.mkdir(exist_ok=True)
        (out / f"serve-{time.strftime('%Y-%m-%d')}.json").write_text(json.dumps(result, indent=2))
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _bare() -> float:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"])
    return (time.perf_counter() - t) * 1000


if __name__ == "__main__":
    main()

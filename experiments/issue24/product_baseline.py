"""Today's product on the three issue-24 sets, through memory-eval's Python API (the real write and
query paths, ONNX runtime, embedding cache under ~/.cache/nubos-memory): every mode, k=10 and (for
the session set) k=5.  Writes experiments/issue24/results/product_baseline.json.

    .venv/bin/python experiments/issue24/product_baseline.py
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from nubos_memory.config import MemoryConfig  # noqa: E402
from nubos_memory.evaluation import evaluate  # noqa: E402

DATA = REPO.parent / "shared" / "datasets"
SESS = Path("/tmp/issue24/sessions")
SETS = {
    "sessions": [SESS / f"conv-0{i}" for i in range(5)],
    "turns": [DATA / "locomo-dev" / f"conv-0{i}" for i in range(5)],
    "scifact": [DATA / "scifact"],
}

if __name__ == "__main__":
    which = sys.argv[1:] or list(SETS)
    config = {**MemoryConfig().to_dict(), "enabled": True}
    out_path = REPO / "experiments" / "issue24" / "results" / "product_baseline.json"
    out = json.loads(out_path.read_text()) if out_path.exists() else {}
    for name in which:
        for k in ((5, 10) if name == "sessions" else (10,)):
            t = time.time()
            res = evaluate(config, SETS[name], split="test", k=k)
            out[f"{name}@k{k}"] = res
            print(name, k, f"{time.time() - t:.0f}s", {m: {x: v for x, v in r.items() if x != 'latency_ms'}
                                                      for m, r in res["modes"].items()}, flush=True)
            out_path.write_text(json.dumps(out, indent=1))

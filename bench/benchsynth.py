"""What the synthetic benchmarks share (bench_anchors, bench_asof, bench_context; not a benchmark itself).

A scratch memory on the hash embedder (no model: each query is as cheap as it gets, so whatever a
feature adds is the largest share it can be), the word list their records and queries are drawn
from, a timer over a list of texts, and the 90th percentile.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from nubos_memory.api.memory import Memory  # noqa: E402
from nubos_memory.config import load_project  # noqa: E402
from nubos_memory.embed.hashing import HashEmbedder  # noqa: E402

WORDS = ["retry", "cache", "build", "deploy", "token", "schema", "index", "query", "lock", "vector", "merge", "branch",
         "commit", "worker", "queue", "timeout", "policy", "budget", "shard", "replica", "socket", "parser", "config",
         "migration", "release", "rollback", "metric"]


def project(root: Path) -> Memory:
    """A fresh memory at ``root`` on the hash embedder."""
    (root / ".nubos-pilot").mkdir(parents=True)
    (root / ".nubos-pilot" / "config.json").write_text(json.dumps(
        {"memory": {"enabled": True, "provider": "hash", "model": "hash-256"}}))
    return Memory(load_project(root), embedder=HashEmbedder("hash-256"), user=False)  # never the user memory


def timed(call: Callable[[str], Any], texts: list[str]) -> list[float]:
    """Milliseconds of ``call`` on each text."""
    out = []
    for text in texts:
        t0 = time.perf_counter()
        call(text)
        out.append((time.perf_counter() - t0) * 1000)
    return out


def p90(xs: list[float]) -> float:
    return sorted(xs)[int(0.9 * (len(xs) - 1))]

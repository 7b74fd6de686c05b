"""One-shot CLI calls on a large memory (issue 27): this checkout against a baseline checkout, same run.

Each call is a fresh ``python -m nubos_memory`` process (process start included), as an agent's tool
call is.  The memory is built once with the hash embedder at 384 dimensions (``--records`` synthetic
notes; no model, so the figures are the store's and the search's, not the model's) unless ``--memory``
names one.  The two checkouts run alternately, ``--runs`` times each; the table gives medians.
``python -c pass`` is the floor.

Run: .venv/bin/python bench/bench_oneshot.py [--records 100000] [--memory DIR] [--baseline CHECKOUT] [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CALLS = {
    "memory-query (hybrid)": ["memory-query", "w12 w400 w33"],
    "memory-query --mode lexical": ["memory-query", "--mode", "lexical", "w12 w400"],
    "memory-stats": ["memory-stats"],
    "memory-add": ["memory-add", "--type", "learning", "--title", "a fresh note w1 w2", "--body", "w3 w4 w5"],
}


def build(root: Path, n: int) -> None:
    sys.path.insert(0, str(REPO))
    from nubos_memory.api.memory import Memory

    (root / ".nubos-pilot").mkdir(parents=True, exist_ok=True)
    (root / ".nubos-pilot" / "config.json").write_text(json.dumps(
        {"memory": {"enabled": True, "provider": "hash", "model": "hash-384"}}))
    rng = random.Random(1)
    words = [f"w{i}" for i in range(5000)]
    mem = Memory.open(root, user=False)
    for start in range(0, n, 5000):
        mem.index([{"type": "learning", "title": " ".join(rng.choice(words) for _ in range(5)),
                    "body": " ".join(rng.choice(words) for _ in range(30))} for _ in range(min(5000, n - start))])


def timed(code: Path, argv: list[str], root: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(code), "HF_HUB_OFFLINE": "1"}
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "nubos_memory", *argv, "--root", str(root)], env=env, cwd=str(code),
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)
    took = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{argv[0]} failed in {code}: {done.stderr.decode()[:500]}")
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--memory", type=Path, help="an existing memory to use (else one is built in a temp folder)")
    ap.add_argument("--baseline", type=Path, help="another checkout of nubos-memory to compare with")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    root = args.memory or Path(tempfile.mkdtemp(prefix="bench-oneshot-")) / "memory"
    if args.memory is None:
        build(root, args.records)
    codes = {"this": REPO, **({"baseline": args.baseline} if args.baseline else {})}
    floor = statistics.median(timed_pass() for _ in range(args.runs))
    rows = []
    for name, argv in CALLS.items():
        took: dict[str, list[float]] = {k: [] for k in codes}
        for _ in range(args.runs):
            for label, code in codes.items():
                took[label].append(timed(code, argv, root))
        rows.append((name, {k: statistics.median(v) for k, v in took.items()}))
    print(f"python -c pass: {floor * 1000:.0f} ms")
    print("| call | " + " | ".join(f"{k} (s)" for k in codes) + " |")
    print("| --- | " + " | ".join("---" for _ in codes) + " |")
    for name, med in rows:
        print(f"| {name} | " + " | ".join(f"{med[k]:.2f}" for k in codes) + " |")


def timed_pass() -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    return time.perf_counter() - t0


if __name__ == "__main__":
    main()

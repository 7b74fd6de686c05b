"""Time (issue 23): what ``memory-query --as-of`` costs a warm hybrid query.

One memory holds 10,000 synthetic records (the hash embedder: no model, so the query itself is as
cheap as it gets and the as-of share is the largest it can be), created over a year; 1,000 of them
are superseded by later records and 1,000 forgotten (so an as-of query in the middle of the year
ranks records retired since), and 500 carry a ``valid_until``.  The same 100 hybrid queries (k = 10)
run warm without and with ``as_of`` (mid-year), alternating, several rounds; the table gives the
medians.  Target: as-of <= 2x the normal query.

Run: .venv/bin/python bench/bench_asof.py [--records 10000] [--rounds 5]
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

from nubos_memory.api.memory import Memory  # noqa: E402

AS_OF = "2025-07-01T00:00:00Z"


def day(i: int, n: int) -> str:
    d = 365 * i // n
    return f"2025-{1 + d // 31 % 12:02d}-{1 + d % 28:02d}T12:00:00Z"


def records(n: int, rng: random.Random) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        words = " ".join(rng.choice(WORDS) for _ in range(12))
        rec: dict[str, Any] = {"id": f"r{i}", "type": "learning", "title": f"note {i}: {words[:40]}", "body": words,
                               "created_at": day(i, n)}
        if i % 20 == 7:
            rec["valid_until"] = day(min(n - 1, i + n // 10), n)
        if i >= n // 2 and i % 10 == 3:  # a correction of an earlier note
            rec["supersedes"] = f"r{i - n // 2}"
        out.append(rec)
    return out


def timed_queries(mem: Memory, queries: list[str], as_of: str | None) -> list[float]:
    return timed(lambda q: mem.query(q, k=10, track=False, as_of=as_of), queries)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--records", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    rng = random.Random(7)
    base = Path(tempfile.mkdtemp(prefix="nubos-asof-bench-"))
    try:
        mem = project(base / "m")
        mem.index(records(args.records, random.Random(11)))
        mem.forget([f"r{i}" for i in range(1, args.records, 10)], reason="bench")
        queries = [" ".join(rng.choice(WORDS) for _ in range(4)) for _ in range(100)]
        timed_queries(mem, queries[:10], None)
        timed_queries(mem, queries[:10], AS_OF)  # warm: the timeline's arrays are filled here
        a_runs, b_runs = [], []
        for _ in range(args.rounds):
            a_runs += timed_queries(mem, queries, None)
            b_runs += timed_queries(mem, queries, AS_OF)
        answer = mem.query(queries[0], k=10, track=False, as_of=AS_OF)
        assert answer["hits"] and answer["query"]["as_of"]["retired_since"] > 0
        a, b = statistics.median(a_runs), statistics.median(b_runs)
        print(f"records {args.records} ({answer['query']['as_of']['live']} live at {AS_OF}, "
              f"{answer['query']['as_of']['retired_since']} of them retired since), {len(a_runs)} queries each "
              "(k = 10, hybrid, hash embedder)\n")
        print("| measure | normal | --as-of | ratio |")
        print("| --- | --- | --- | --- |")
        print(f"| warm hybrid query, median ms | {a:.2f} | {b:.2f} | {b / a:.2f}x |")
        print(f"| warm hybrid query, p90 ms | {p90(a_runs):.2f} | {p90(b_runs):.2f} | {p90(b_runs) / p90(a_runs):.2f}x |")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()

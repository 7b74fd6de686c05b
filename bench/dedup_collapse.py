"""Duplicates that never eat information: measured through the product with the packaged model.

For each labelled pair (a, b), a scratch memory stores a, then b (``memory-add`` semantics, the real
write path), then answers a query made of a's title and one made of b's title (k = 5, the real
query path).  Three kinds of pairs:

* re-logs (``bench/data/dedup_pairs.jsonl``, label ``duplicate``): the same learning in other
  words.  Wanted: stored, and *collapsed* at query time (the pair shows up once in the top-k).
* corrections (``bench/data/correction_pairs.jsonl``): a number, version, negation, identifier or
  decision changed in otherwise identical text.  Wanted: never lost (b is stored), and b (the newest)
  is what the query shows.
* hard distinct pairs (``dedup_pairs.jsonl``, label ``distinct``): same topic, another fact.
  Wanted: stored, and both shown (never collapsed).

Run from the repository root:

    .venv/bin/python bench/dedup_collapse.py [--report bench/dedup_collapse_results.md]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nubos_memory import Memory  # noqa: E402
from nubos_memory.config import DEFAULT_MODEL  # noqa: E402
from nubos_memory.embed.model import ModelEmbedder  # noqa: E402

DATA = ROOT / "bench" / "data"


def load(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def one_pair(emb, pair: dict, base: Path, n: int) -> dict:
    root = base / f"p{n}"
    (root / ".nubos-pilot").mkdir(parents=True)
    (root / ".nubos-pilot" / "config.json").write_text(json.dumps({"memory": {"enabled": True}}))
    mem = Memory.open(root, embedder=emb)
    a = mem.add({"type": "learning", **pair["a"]})
    b = mem.add({"type": "learning", **pair["b"]})
    out = {"stored": b["added"] == 1, "exact": b["duplicate_of"] is not None,
           "named": b["near_duplicate_of"] == a["id"], "similarity": b["similarity"]}
    for which in ("a", "b"):
        hits = mem.query(pair[which]["title"], k=5, track=False)["hits"]
        shown = [h["id"] for h in hits if h["id"] in (a["id"], b["id"])]
        out[f"shown_{which}"] = shown
        out[f"collapsed_{which}"] = any(h.get("collapsed") for h in hits)
    out["b_id"] = b["id"]
    return out


def run(report: Path | None) -> str:
    emb = ModelEmbedder(DEFAULT_MODEL)
    labelled = load(DATA / "dedup_pairs.jsonl")
    groups = {
        "re-logs": [p for p in labelled if p["label"] == "duplicate"],
        "corrections": load(DATA / "correction_pairs.jsonl"),
        "hard distinct": [p for p in labelled if p["label"] == "distinct"],
    }
    base = Path(tempfile.mkdtemp(prefix="nubos-collapse-"))
    rows, by_kind = [], defaultdict(lambda: [0, 0, 0])
    try:
        n = 0
        results: dict[str, list[dict]] = {}
        for name, pairs in groups.items():
            results[name] = []
            for pair in pairs:
                n += 1
                r = one_pair(emb, pair, base, n)
                results[name].append(r)
                if name == "corrections":
                    k = by_kind[pair["kind"]]
                    k[0] += 1
                    k[1] += r["stored"]
                    k[2] += r["shown_a"][:1] == [r["b_id"]] or r["b_id"] in r["shown_a"]
        for name, res in results.items():
            total = len(res)
            stored = sum(r["stored"] for r in res)
            once = sum(len(r["shown_a"]) == 1 and len(r["shown_b"]) == 1 for r in res)
            newest = sum(r["b_id"] in r["shown_a"] and r["b_id"] in r["shown_b"] for r in res)
            both = sum(len(r["shown_a"]) == 2 and len(r["shown_b"]) == 2 for r in res)
            named = sum(r["named"] for r in res)
            rows.append(f"| {name} | {total} | {stored} | {named} | {once} | {both} | {newest} |")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    lines = [
        "# Duplicates through the product: stored, named, collapsed",
        "",
        f"Model `{DEFAULT_MODEL}`, `memory.near_duplicate` 0.90 (collapse threshold), k = 5. Per pair: a scratch "
        "memory, add a, add b, query a's title and b's title. `python bench/dedup_collapse.py`.",
        "",
        "| pairs | n | b stored | b named a near duplicate | shown once (collapsed) in both queries | "
        "both shown in both queries | b (the newest) shown in both queries |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        *rows,
        "",
        "Corrections by kind (b stored / b shown for a query with a's own title):",
        "",
        "| kind | n | b stored | b shown |",
        "| --- | --- | --- | --- |",
        *[f"| {k} | {v[0]} | {v[1]} | {v[2]} |" for k, v in sorted(by_kind.items())],
        "",
    ]
    text = "\n".join(lines)
    if report:
        report.write_text(text)
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--report", type=Path, help="also write the markdown report here")
    args = ap.parse_args()
    print(run(args.report))


if __name__ == "__main__":
    main()

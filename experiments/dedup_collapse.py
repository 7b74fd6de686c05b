"""Duplicates that never eat information: measured through the product with the packaged model.

For each labelled pair (a, b), a scratch memory stores a, then b (``memory-add`` semantics, the real
write path), then answers a query made of a's title and one made of b's title (k = 5, the real
query path).  Four kinds of pairs:

* re-logs (``bench/data/dedup_pairs.jsonl``, label ``duplicate``): the same learning in other
  words.  Wanted: stored, and *collapsed* at query time (the pair shows up once in the top-k).
* corrections (``bench/data/correction_pairs.jsonl``): a number, version, negation, identifier or
  decision changed in otherwise identical text.  Wanted: never lost (b is stored), and b (the newest)
  is what the query shows.
* hard distinct pairs (``dedup_pairs.jsonl``, label ``distinct``): same topic, another fact.
  Wanted: stored, and both shown (never collapsed).
* contradictions and agreements (``bench/data/contradiction_pairs.jsonl``, written by hand): b
  contradicts a (label ``contradicting``: a timeout, a limit, an ordering, enable/disable, a tool, a
  port, a version, a path), or both hold at once (label ``agreeing``).  Measured: how often a is
  *hidden* from the default answer (its id in neither query's hits: collapsed into b), and how a
  hidden a is shown: b (the newest) is the hit, its JSON ``collapsed.ids`` names a, and the markdown
  answer (``render_markdown``, what ``memory-query --format md`` prints) has the "folded into this
  one" line naming a.

Run from the repository root:

    .venv/bin/python experiments/dedup_collapse.py [--report experiments/dedup_collapse_results.md]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nubos_memory import Memory  # noqa: E402
from nubos_memory.api.context import render_markdown  # noqa: E402
from nubos_memory.config import DEFAULT_MODEL  # noqa: E402
from nubos_memory.embed.model import ModelEmbedder  # noqa: E402
from nubos_memory.records import embed_text  # noqa: E402

DATA = ROOT / "bench" / "data"
FOLD_LINE = "folded into this one"
RUN_DATE, RUN_HOST = "2026-11-23", "2 vCPU, shared"  # where the committed report was measured


def load(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def one_pair(emb, pair: dict, base: Path, n: int, *, detail: bool = False) -> dict:
    root = base / f"p{n}"
    (root / ".nubos-pilot").mkdir(parents=True)
    (root / ".nubos-pilot" / "config.json").write_text(json.dumps({"memory": {"enabled": True}}))
    mem = Memory.open(root, embedder=emb)
    a = mem.add({"type": "learning", **pair["a"]})
    b = mem.add({"type": "learning", **pair["b"]})
    out = {"stored": b["added"] == 1, "exact": b["duplicate_of"] is not None,
           "named": b["near_duplicate_of"] == a["id"], "similarity": b["similarity"]}
    for which in ("a", "b"):
        result = mem.query(pair[which]["title"], k=5, track=False)
        hits = result["hits"]
        shown = [h["id"] for h in hits if h["id"] in (a["id"], b["id"])]
        out[f"shown_{which}"] = shown
        out[f"collapsed_{which}"] = any(h.get("collapsed") for h in hits)
        if detail:  # how a hidden a is shown: the hit that holds it, in JSON and in markdown
            holder = next((h for h in hits if a["id"] in (h.get("collapsed") or {}).get("ids", ())), None)
            md = render_markdown(result)
            out[f"all_{which}"] = [h["id"] for h in hits]
            out[f"holder_{which}"] = holder["id"] if holder else None
            out[f"fold_{which}"] = any(FOLD_LINE in line and a["id"] in line for line in md.splitlines())
    out["a_id"], out["b_id"] = a["id"], b["id"]
    if detail:
        if out["named"]:
            out["cosine"], out["cosine_from"] = b["similarity"], "add"
        else:  # not named (below the threshold, or another record was nearer): the two stored texts
            recs = {g["id"]: g["record"] for g in mem.get([a["id"], b["id"]], track=False)["records"]}
            va, vb = emb.embed([embed_text(recs[a["id"]]), embed_text(recs[b["id"]])])
            out["cosine"], out["cosine_from"] = round(float(va @ vb), 4), "embedded"
    return out


def contradiction_rows(results: dict[str, list[tuple[dict, dict]]]) -> tuple[list[str], list[str]]:
    """The contradicting / agreeing table, and the list of hidden contradicting pairs."""
    rows, hidden_list = [], []
    for label, res in results.items():
        hidden = [(p, r) for p, r in res if r["a_id"] not in r["all_a"] and r["a_id"] not in r["all_b"]]
        newest = sum(r["b_id"] in r["all_a"] and r["b_id"] in r["all_b"] for _, r in hidden)
        in_json = sum(r["holder_a"] == r["b_id"] and r["holder_b"] == r["b_id"] for _, r in hidden)
        folded = sum(r["fold_a"] and r["fold_b"] for _, r in hidden)
        high = sum(r["cosine"] >= 0.90 for _, r in res)
        cos = sorted(r["cosine"] for _, r in res)
        rows.append(f"| {label} | {len(res)} | {sum(r['stored'] for _, r in res)} | {cos[0]:.2f} / "
                    f"{cos[len(cos) // 2]:.2f} / {cos[-1]:.2f} | {high} | {len(hidden)} | "
                    f"{newest} | {in_json} | {folded} |")
        if label == "contradicting":
            for p, r in sorted(hidden, key=lambda pr: -pr[1]["cosine"]):
                how = ("b shown, `collapsed.ids` names a, fold line in markdown"
                       if r["holder_a"] == r["b_id"] == r["holder_b"] and r["fold_a"] and r["fold_b"]
                       else f"holder {r['holder_a']}/{r['holder_b']}, fold line {r['fold_a']}/{r['fold_b']}")
                hidden_list.append(f"| {r['cosine']:.4f} | {p['kind']} | {p['a']['title']} | {p['b']['title']} | "
                                   f"{how} |")
    return rows, hidden_list


def run(report: Path | None) -> str:
    emb = ModelEmbedder(DEFAULT_MODEL)
    labelled = load(DATA / "dedup_pairs.jsonl")
    groups = {
        "re-logs": [p for p in labelled if p["label"] == "duplicate"],
        "corrections": load(DATA / "correction_pairs.jsonl"),
        "hard distinct": [p for p in labelled if p["label"] == "distinct"],
    }
    contra = load(DATA / "contradiction_pairs.jsonl")
    base = Path(tempfile.mkdtemp(prefix="nubos-collapse-"))
    rows, by_kind = [], defaultdict(lambda: [0, 0, 0])
    started = time.perf_counter()
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
        by_label: dict[str, list[tuple[dict, dict]]] = {"contradicting": [], "agreeing": []}
        for pair in contra:
            n += 1
            by_label[pair["label"]].append((pair, one_pair(emb, pair, base, n, detail=True)))
        c_rows, hidden_list = contradiction_rows(by_label)
        seconds = time.perf_counter() - started
    finally:
        shutil.rmtree(base, ignore_errors=True)
    lines = [
        "# Duplicates through the product: stored, named, collapsed",
        "",
        f"Run {RUN_DATE} on {RUN_HOST}. Model `{DEFAULT_MODEL}`, `memory.near_duplicate` 0.90 (collapse "
        "threshold), k = 5. Per pair: a scratch memory, add a, add b, query a's title and b's title. "
        "`python experiments/dedup_collapse.py --report experiments/dedup_collapse_results.md`.",
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
        "## Contradictions: hidden from the default answer, and how they are shown",
        "",
        "`bench/data/contradiction_pairs.jsonl`, written by hand: b contradicts a (`contradicting`), or both "
        "hold at once (`agreeing`: same topic, compatible facts).  *a hidden*: a's id is in neither query's "
        "hits (collapsed into b).  Of the hidden: b (the newest) is a hit in both queries; b's JSON "
        "`collapsed.ids` names a in both; the markdown answer (`render_markdown`, `memory-query --format md`) "
        f"has the \"{FOLD_LINE}\" line naming a in both.  Cosine: the add answer's `similarity` when b "
        "named a, else the two stored texts (`records.embed_text`) embedded.",
        "",
        "| pairs | n | b stored | cosine min / median / max | cosine ≥ 0.90 | a hidden (collapsed into b) | "
        "of those: b (newest) shown | `collapsed.ids` names a | fold line in markdown |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        *c_rows,
        "",
        "Every hidden contradicting pair (highest cosine first):",
        "",
        "| cosine | kind | a (older, hidden) | b (newer, shown) | shown how |",
        "| --- | --- | --- | --- | --- |",
        *(hidden_list or ["| – | – | none | – | – |"]),
        "",
        f"Run time {seconds:.0f} s for all {n} pairs, model load excluded.",
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

"""Choose the near-duplicate cosine threshold for memory writes on labelled pairs.

A new record counts as a near duplicate of a stored one when the cosine of
their embeddings (``title + "\\n" + body``, the product's embedder and model)
reaches a threshold.  This script measures, on labelled pairs, how that
threshold trades duplicate recall against false positives:

* ``bench/data/dedup_pairs.jsonl``: hand-written ``duplicate`` pairs (the same
  memory re-logged in other words) and hard ``distinct`` pairs (same topic,
  different fact/decision/bug/value);
* easy distinct pairs: every pair of two different records of
  ``examples/agent-memories.jsonl``.

It prints a markdown report: cosine distributions per group, recall and
false-positive rates for thresholds 0.70..0.98, and the recommended threshold,
the lowest one at which no distinct pair (hard or easy) is flagged, since a
wrongly rejected write loses data while a missed duplicate only costs a copy.

Run from the repository root:

    .venv/bin/python experiments/dedup_threshold.py [--report experiments/dedup_threshold_results.md]
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nubos_memory.config import DEFAULT_MODEL  # noqa: E402
from nubos_memory.embed.model import ModelEmbedder  # noqa: E402

PAIRS = ROOT / "bench" / "data" / "dedup_pairs.jsonl"
EXAMPLES = ROOT / "examples" / "agent-memories.jsonl"
THRESHOLDS = [round(0.70 + 0.01 * i, 2) for i in range(29)]  # 0.70 .. 0.98


def load_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def text(rec: dict) -> str:
    return f"{rec['title']}\n{rec.get('body') or ''}"


def cosines(emb, pairs: list[tuple[dict, dict]]) -> np.ndarray:
    """Cosine of each (a, b) pair; every distinct text is embedded once."""
    texts = sorted({text(r) for pair in pairs for r in pair})
    index = {t: i for i, t in enumerate(texts)}
    vecs = emb.embed(texts)
    a = vecs[[index[text(x)] for x, _ in pairs]]
    b = vecs[[index[text(y)] for _, y in pairs]]
    return np.einsum("ij,ij->i", a, b)


def summary_row(name: str, c: np.ndarray) -> str:
    qs = np.percentile(c, [0, 5, 25, 50, 75, 95, 100])
    return f"| {name} | {len(c)} | " + " | ".join(f"{q:.3f}" for q in qs) + " |"


def build_report(labelled: list[dict], dup: np.ndarray, hard: np.ndarray, easy: np.ndarray) -> str:
    dups = [p for p in labelled if p["label"] == "duplicate"]
    hards = [p for p in labelled if p["label"] == "distinct"]
    out = [
        "# Near-duplicate threshold for memory writes",
        "",
        f"Model `{DEFAULT_MODEL}` via `ModelEmbedder`, text = title + \"\\n\" + body. "
        f"Pairs: {len(dup)} duplicate, {len(hard)} hard distinct (`{PAIRS.relative_to(ROOT)}`), "
        f"{len(easy)} easy distinct (all pairs of `{EXAMPLES.relative_to(ROOT)}`). "
        "A pair is flagged when cosine >= threshold.",
        "",
        "## Cosine distributions",
        "",
        "| group | n | min | p5 | p25 | median | p75 | p95 | max |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        summary_row("duplicate", dup),
        summary_row("hard distinct", hard),
        summary_row("easy distinct", easy),
        "",
        "## Per threshold",
        "",
        "| threshold | dup recall | FP hard distinct | FP easy distinct |",
        "|---:|---:|---:|---:|",
    ]
    for t in THRESHOLDS:
        out.append(
            f"| {t:.2f} | {np.mean(dup >= t):.3f} | {np.mean(hard >= t):.3f} ({int(np.sum(hard >= t))}) "
            f"| {np.mean(easy >= t):.4f} ({int(np.sum(easy >= t))}) |"
        )

    # Lowest grid threshold above every distinct cosine (none flagged).
    worst = max(hard.max(), easy.max())
    rec = next((t for t in THRESHOLDS if t > worst), None)
    out += ["", "## Recommendation", ""]
    if rec is None:
        out.append(f"No threshold up to {THRESHOLDS[-1]:.2f} keeps every distinct pair unflagged "
                   f"(highest distinct cosine {worst:.3f}).")
        return "\n".join(out) + "\n"
    out += [
        f"Lowest threshold with no hard- or easy-distinct pair flagged: **{rec:.2f}** "
        f"(highest hard distinct {hard.max():.3f}, highest easy distinct {easy.max():.3f}). "
        f"Duplicate recall there: **{np.mean(dup >= rec):.3f}** ({int(np.sum(dup >= rec))}/{len(dup)}).",
        "",
        "### Hard-distinct pairs closest to the threshold",
        "",
        "| cosine | kind | a | b |",
        "|---:|---|---|---|",
    ]
    for i in np.argsort(-hard)[:10]:
        p = hards[i]
        out.append(f"| {hard[i]:.3f} | {p['kind']} | {p['a']['title']} | {p['b']['title']} |")
    missed = [i for i in np.argsort(dup) if dup[i] < rec]
    out += ["", f"### Duplicate pairs missed at {rec:.2f} ({len(missed)})", ""]
    if missed:
        out += ["| cosine | kind | a | b |", "|---:|---|---|---|"]
        for i in missed:
            p = dups[i]
            out.append(f"| {dup[i]:.3f} | {p['kind']} | {p['a']['title']} | {p['b']['title']} |")
    else:
        out.append("None.")
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", type=Path, help="also write the markdown report to this file")
    args = parser.parse_args()

    labelled = load_jsonl(PAIRS)
    examples = load_jsonl(EXAMPLES)
    emb = ModelEmbedder(DEFAULT_MODEL)

    dup = cosines(emb, [(p["a"], p["b"]) for p in labelled if p["label"] == "duplicate"])
    hard = cosines(emb, [(p["a"], p["b"]) for p in labelled if p["label"] == "distinct"])
    easy = cosines(emb, list(itertools.combinations(examples, 2)))

    report = build_report(labelled, dup, hard, easy)
    print(report)
    if args.report:
        args.report.write_text(report, encoding="utf-8")


if __name__ == "__main__":
    main()

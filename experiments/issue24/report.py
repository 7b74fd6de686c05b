"""Markdown tables of results/exp_<N>.json (README.md quotes them).  .venv/bin/python experiments/issue24/report.py [N]"""
import json
import sys
from pathlib import Path

n = sys.argv[1] if len(sys.argv) > 1 else "100"
r = json.loads((Path(__file__).resolve().parent / "results" / f"exp_{n}.json").read_text())
T = r["table"]
SETS = {"sessions": "recall@5", "turns": "recall@10", "scifact": "ndcg@10"}


def cell(v):
    return f"{v['recall@5']:.4f} / {v['recall@10']:.4f} / {v['ndcg@10']:.4f} / {v['mrr@10']:.4f}"


print("### a. best-piece vector scoring, cos = λ·max_piece + (1−λ)·pooled (hybrid: z at w 0.3)\n")
print("cells: recall@5 / recall@10 / nDCG@10 / MRR@10\n")
for name in SETS:
    print(f"\n**{name}**\n\n| λ | lexical | vector | hybrid (z, w 0.3) | alpha | w 0.5 | w 0.7 |\n| --- | --- | --- | --- | --- | --- | --- |")
    for lam in ("0.0", "0.25", "0.5", "0.75", "1.0"):
        row = T[f"{name}|{lam}"]
        print(f"| {lam} | {cell(row['lexical'])} | {cell(row['vector'])} | {cell(row['hybrid:fixed'])} | "
              f"{cell(row['alpha'])} | {cell(row['hybrid:w0.5'])} | {cell(row['hybrid:w0.7'])} |")
print("\n### b/c. label-free side weight rules (headline metric per set: sessions recall@5, turns recall@10, "
      "SciFact nDCG@10; w per memory in brackets)\n")
rules = ["fixed", "argmax", "amx0", "amx0.005", "amx0.01", "amx0.02", "share1", "share2", "diff1", "diff2"]
print("| set | λ | lexical | vector | " + " | ".join(rules) + " |\n| --- | --- | --- | --- | " + " | ".join("---" for _ in rules) + " |")
for name, m in SETS.items():
    for lam in ("0.0", "0.5", "1.0"):
        row = T[f"{name}|{lam}"]
        cells = []
        for k in rules:
            v = row[f"hybrid:{k}"]
            ws = v["w"]
            wtxt = "" if len(set(ws)) == 1 and ws[0] == 0.3 else " [" + ",".join(f"{w:g}" for w in ws) + "]"
            cells.append(f"{v[m]:.4f}{wtxt}")
        print(f"| {name} | {lam} | {row['lexical'][m]:.4f} | {row['vector'][m]:.4f} | " + " | ".join(cells) + " |")
print("\n### pseudo-query known-item MRR per memory (leave-one-out), λ 0 / 0.5\n")
print("| memory | N | pieces re-embedded | lexical | vector λ0 | vector λ0.5 | best hybrid w (λ0) | best hybrid w (λ0.5) |\n| --- | --- | --- | --- | --- | --- | --- | --- |")
for u, p in r["pseudo"].items():
    b0, b5 = p["by_lambda"]["0.0"], p["by_lambda"]["0.5"]
    a0 = max(b0["hyb_mrr"], key=lambda w: b0["hyb_mrr"][w])
    a5 = max(b5["hyb_mrr"], key=lambda w: b5["hyb_mrr"][w])
    print(f"| {u} | {p['n']} | {p['pieces_embedded']} | {b0['lex_mrr']:.3f} | {b0['vec_mrr']:.3f} | {b5['vec_mrr']:.3f} | "
          f"{a0} ({b0['hyb_mrr'][a0]:.3f}) | {a5} ({b5['hyb_mrr'][a5]:.3f}) |")

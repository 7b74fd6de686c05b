"""c. the weight from pseudo-queries on one vector side (λ_w), scoring with another (λ_s); paired SEs vs lexical.
    .venv/bin/python experiments/issue24/cross.py"""
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import exp as E  # noqa: E402
import harness as H  # noqa: E402

us = E.all_units()
pseudo = {k: E._fix(v) for k, v in json.loads(Path("/tmp/issue24/pseudo_100.json").read_text()).items()}
M = {"sessions": "recall@5", "turns": "recall@10", "scifact": "ndcg@10"}
print("| set | λ_s (scoring) | λ_w (weight) | rule | w | r@5 | r@10 | nDCG@10 | MRR@10 | Δ headline vs lexical ± SE | Δ vs fixed 0.3 ± SE |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for name, lst in us.items():
    for lam_s in (0.0, 0.5):
        sides = [H.sides(u, E.vec_cos(u, u.qv, lam_s)) for u in lst]
        lex = [H.metrics(u, *H.rank_lexical(s)) for u, s in zip(lst, sides)]
        fix = [H.metrics(u, *H.rank_hybrid(s, 0.3)) for u, s in zip(lst, sides)]
        for lam_w in (0.0, 0.5):
            for rule in ("amx0", "amx0.005", "amx0.01"):
                ws = [E.w_rule(rule, pseudo[u.name], lam_w) for u in lst]
                per = [H.metrics(u, *H.rank_hybrid(s, w)) for u, s, w in zip(lst, sides, ws)]
                m = H.mean_over(per)
                k = M[name]
                d = np.concatenate([p[k] for p in per]) - np.concatenate([p[k] for p in lex])
                d2 = np.concatenate([p[k] for p in per]) - np.concatenate([p[k] for p in fix])
                se = lambda x: x.std(ddof=1) / np.sqrt(len(x))
                print(f"| {name} | {lam_s} | {lam_w} | {rule} | {','.join(f'{w:g}' for w in ws)} | {m['recall@5']:.4f} | "
                      f"{m['recall@10']:.4f} | {m['ndcg@10']:.4f} | {m['mrr@10']:.4f} | {d.mean():+.4f} ± {se(d):.4f} | "
                      f"{d2.mean():+.4f} ± {se(d2):.4f} |", flush=True)

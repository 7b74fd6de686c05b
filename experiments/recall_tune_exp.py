"""Experiments for experiments/recall_tune_results.md (harness: experiments/recall_tune.py).

    .venv/bin/python experiments/recall_tune_exp.py templates
    .venv/bin/python experiments/recall_tune_exp.py fusion
    .venv/bin/python experiments/recall_tune_exp.py smooth
    .venv/bin/python experiments/recall_tune_exp.py final
"""

from __future__ import annotations

import functools
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import recall_tune as rt  # noqa: E402

LOCO = rt.LOCOMO_UNITS


def loco(template: str, rule, metric="recall@10", shuffled=False, per_conv=False, smooth=None):
    """Question-weighted LoCoMo metric (per-question array over all five conversations)."""
    out, per = [], {}
    for name in LOCO:
        u = rt.unit(name)
        rt.load_vectors(u, template, allow_embed=False)
        if shuffled:
            u = rt.shuffled(name)
        kw = smooth(u, template) if smooth else {}
        m = rt.evaluate_rule(u, template, rule, "test", **kw)[metric]
        out.append(m)
        per[name] = m.mean()
    arr = np.concatenate(out)
    return (arr, per) if per_conv else arr


def sci(template: str, rule, split="train", metric="ndcg@10", smooth=None):
    u = rt.unit("scifact")
    rt.load_vectors(u, template, allow_embed=False)
    kw = smooth(u, template) if smooth else {}
    return rt.evaluate_rule(u, template, rule, split, **kw)[metric]


def fmt(x):
    return f"{x.mean():.4f}"


def paired(a, b):
    d = a - b
    return f"{d.mean():+.4f} ± {d.std(ddof=1) / math.sqrt(len(d)):.4f}"


P = functools.partial


def exp_templates():
    temps = ["nl", "colon", "colon_nl", "smart", "dot", "body", "ctxprev", "ctxnext", "ctx3"]
    print("| template | vector r@10 | hybrid α0.3 r@10 | hybrid z(0.5) r@10 | per conv (vector) |")
    print("|---|---|---|---|---|")
    base = loco("nl", rt.f_vector)
    for t in temps:
        try:
            v, per = loco(t, rt.f_vector, per_conv=True)
        except SystemExit as e:
            print(t, e)
            continue
        h = loco(t, rt.f_alpha)
        z = loco(t, P(rt.f_norm, how="z", w_lex=0.5))
        print(f"| {t} | {fmt(v)} ({paired(v, base)}) | {fmt(h)} | {fmt(z)} | "
              + " ".join(f"{x:.3f}" for x in per.values()) + " |")


FUSIONS = {
    "alpha 0.3 (today)": P(rt.f_alpha, alpha=0.3),
    **{f"alpha {a}": P(rt.f_alpha, alpha=a) for a in (0.5, 0.7)},
    **{f"{how} w{w}": P(rt.f_norm, how=how, w_lex=w) for how in ("z", "minmax", "dbsf", "max")
       for w in (0.4, 0.5, 0.6)},
    **{f"sharp z {s} k{k}": P(rt.f_sharp, how="z", sharp=s, k=k) for s in ("gap1k", "gapk", "gap12") for k in (5, 10)},
    **{f"sharp minmax {s}": P(rt.f_sharp, how="minmax", sharp=s) for s in ("gap1k", "gapk")},
    **{f"rrf k{k} exact": P(rt.f_rrf, k=k, exact=True) for k in (10, 30, 60)},
    "rrf k60 top-lists (product)": P(rt.f_rrf, k=60, exact=False, tiebreak=False),
}


def exp_fusion(templates=("nl",), sci_templates=("nl",)):
    for t, st in zip(templates, sci_templates):
        print(f"\n### LoCoMo template {t}, SciFact template {st}\n")
        lex_l, vec_l = loco(t, rt.f_lexical), loco(t, rt.f_vector)
        lex_s, vec_s = sci(st, rt.f_lexical), sci(st, rt.f_vector)
        print(f"lexical: LoCoMo {fmt(lex_l)} SciFact-train {fmt(lex_s)}; vector: LoCoMo {fmt(vec_l)} SciFact-train {fmt(vec_s)}\n")
        print("| fusion | LoCoMo r@10 | − max(part) | SciFact train nDCG@10 | − max(part) |")
        print("|---|---|---|---|---|")
        for name, rule in FUSIONS.items():
            a, b = loco(t, rule), sci(st, rule)
            best_l = lex_l if lex_l.mean() >= vec_l.mean() else vec_l
            best_s = lex_s if lex_s.mean() >= vec_s.mean() else vec_s
            print(f"| {name} | {fmt(a)} | {paired(a, best_l)} | {fmt(b)} | {paired(b, best_s)} |")


def main():
    which = sys.argv[1]
    if which == "templates":
        exp_templates()
    elif which == "fusion":
        ts = sys.argv[2].split(",") if len(sys.argv) > 2 else ["nl"]
        ss = sys.argv[3].split(",") if len(sys.argv) > 3 else ["nl"] * len(ts)
        exp_fusion(ts, ss)




# ------------------------------------------------------------------ the proposal: final numbers
def prop(**kw):
    """A rule (for evaluate-style calls) from recall_tune.proposal's keyword arguments."""
    def run(u, t, split, metric):
        f, k = rt.proposal(u, t, **kw)
        return rt.rank_metrics(u, f, k, u.splits[split])[metric]
    return run


def loco_p(run, template="smart", metric="recall@10", shuffled=False):
    per, out = {}, []
    for name in LOCO:
        u = rt.unit(name)
        rt.load_vectors(u, template, allow_embed=False)
        if shuffled:
            u = rt.shuffled(name)
        m = run(u, template, "test", metric)
        per[name] = m
        out.append(m)
    return np.concatenate(out), per


def sci_p(run, split, template="smart", metric="ndcg@10"):
    u = rt.unit("scifact")
    rt.load_vectors(u, template, allow_embed=False)
    return run(u, template, split, metric)


def today(mode):
    rule = {"hybrid": rt.f_alpha, "lexical": rt.f_lexical, "vector": rt.f_vector}[mode]

    def run(u, t, split, metric):
        c = rt.make_ctx(u, t)
        return rt.rank_metrics(u, *rule(c), u.splits[split])[metric]
    return run


def exp_final():
    P_H = prop()
    systems = {
        "today hybrid (nl, α 0.3)": (today("hybrid"), "nl"),
        "today lexical": (today("lexical"), "nl"),
        "today vector (nl)": (today("vector"), "nl"),
        "smart template, α 0.3": (today("hybrid"), "smart"),
        "smart + z-fusion (no context)": (prop(beta_l=0, beta_v=0), "smart"),
        "**proposal** hybrid": (P_H, "smart"),
        "proposal lexical (with context)": (prop(mode="lexical"), "smart"),
        "proposal vector (smart, with context)": (prop(mode="vector"), "smart"),
        "vector smart (no context)": (prop(mode="vector", beta_l=0, beta_v=0), "smart"),
        "α 0.3 + smart + context": (None, "smart"),
    }

    def alpha_ctx(u, t, split, metric):
        gp, gn = rt.neighbour_gate(u, t, "ramp0.02-0.08")
        raw = u.raw + 0.5 * rt.neighbour_max(u.raw, gp, gn)
        cos = u.cos[t] + 0.3 * rt.neighbour_max(u.cos[t], gp, gn)
        c = rt.make_ctx(u, t, raw=raw, cos=cos)
        c.cos = u.cos[t] + 0.3 * rt.neighbour_max(u.cos[t], gp, gn)
        return rt.rank_metrics(u, *rt.f_alpha(c), u.splits[split])[metric]
    systems["α 0.3 + smart + context"] = (alpha_ctx, "smart")

    res = {}
    print("| system | " + " | ".join(LOCO) + " | LoCoMo r@10 | LoCoMo nDCG@10 | SciFact train nDCG@10 | SciFact test nDCG@10 |")
    print("|---|" + "---|" * (len(LOCO) + 4))
    for name, (run, t) in systems.items():
        a, per = loco_p(run, t)
        n, _ = loco_p(run, t, metric="ndcg@10")
        s_tr, s_te = sci_p(run, "train", t), sci_p(run, "test", t)
        res[name] = (a, n, s_tr, s_te)
        print(f"| {name} | " + " | ".join(f"{per[c].mean():.3f}" for c in LOCO)
              + f" | {a.mean():.4f} | {n.mean():.4f} | {s_tr.mean():.4f} | {s_te.mean():.4f} |")
    print("\nPaired differences (mean ± SE over questions/claims):\n")
    print("| comparison | LoCoMo r@10 | SciFact train nDCG@10 | SciFact test nDCG@10 |")
    print("|---|---|---|---|")
    H = res["**proposal** hybrid"]
    for other in ("today hybrid (nl, α 0.3)", "proposal lexical (with context)", "proposal vector (smart, with context)",
                  "today lexical", "today vector (nl)", "α 0.3 + smart + context", "smart + z-fusion (no context)"):
        O = res[other]
        print(f"| proposal − {other} | {paired(H[0], O[0])} | {paired(H[2], O[2])} | {paired(H[3], O[3])} |")
    # robustness: shuffled log order, weak vector side
    print("\nRobustness (LoCoMo recall@10): log order shuffled (neighbours unrelated), and a weak vector side "
          "(body-only template, vector r@10 0.29):\n")
    print("| system | shuffled | body-only template |")
    print("|---|---|---|")
    for name, run in (("today α 0.3", today("hybrid")), ("α 0.3 + context", alpha_ctx), ("proposal", P_H),
                      ("proposal lexical", prop(mode="lexical")), ("proposal vector", prop(mode="vector"))):
        sh, _ = loco_p(run, "smart", shuffled=True)
        bo, _ = loco_p(run, "body")
        print(f"| {name} | {sh.mean():.4f} | {bo.mean():.4f} |")


def exp_gates():
    """Neighbour context: which gate keeps it from hurting memories whose order carries no topic."""
    print("| memory | κ (adjacent − all-pairs cosine) | gate ramp(0.02–0.08) |")
    print("|---|---|---|")
    for name in LOCO + ["scifact", "agent"]:
        u = rt.unit(name)
        rt.load_vectors(u, "smart", allow_embed=False)
        k, adj, allp = rt.coherence(u.dvec["smart"])
        g = rt.neighbour_gate(u, "smart", "ramp0.02-0.08")[0][1]
        print(f"| {name} | {k:.3f} ({adj:.3f} − {allp:.3f}) | {g:.2f} |")
        if name.startswith("conv"):
            s = rt.shuffled(name)
            k, adj, allp = rt.coherence(s.dvec["smart"])
            g = rt.neighbour_gate(s, "smart", "ramp0.02-0.08")[0][1]
            print(f"| {name} shuffled | {k:.3f} ({adj:.3f} − {allp:.3f}) | {g:.2f} |")
    print("\n| gate | LoCoMo | LoCoMo shuffled | SciFact train | SciFact test |")
    print("|---|---|---|---|---|")
    for gate in ("none", "sim", "ramp0.02-0.08"):
        run = prop(gate=gate)
        a, _ = loco_p(run)
        sh, _ = loco_p(run, shuffled=True)
        print(f"| {gate} | {a.mean():.4f} | {sh.mean():.4f} | {sci_p(run, 'train').mean():.4f} | "
              f"{sci_p(run, 'test').mean():.4f} |")




def exp_sensitivity():
    print("| variant | LoCoMo r@10 | LoCoMo shuffled | LoCoMo body-only | SciFact train | SciFact test |")
    print("|---|---|---|---|---|---|")
    rows = [(f"w_lex {w}", prop(w_lex=w), "smart") for w in (0.2, 0.25, 0.3, 0.35, 0.4)]
    rows += [(f"β_lex {bl} β_cos {bv}", prop(beta_l=bl, beta_v=bv), "smart")
             for bl, bv in ((0.3, 0.2), (0.5, 0.2), (0.5, 0.5), (0.7, 0.3), (1.0, 0.3))]
    rows += [("proposal with today's template (nl)", prop(), "nl"),
             ("z then context (statistics of the plain scores)", prop(order="z-then-smooth"), "smart"),
             ("cosine statistics from a 1,000-record sample", prop(cos_stats="sample"), "smart"),
             ("admission on own terms only", prop(admit="own"), "smart")]
    for name, run, t in rows:
        a, _ = loco_p(run, t)
        sh, _ = loco_p(run, t, shuffled=True)
        bo, _ = loco_p(run, "body")
        print(f"| {name} | {a.mean():.4f} | {sh.mean():.4f} | {bo.mean():.4f} | {sci_p(run, 'train', t).mean():.4f} | "
              f"{sci_p(run, 'test', t).mean():.4f} |")


def exp_conditions():
    """Fusion rules (no neighbour context) across four conditions: hybrid − best part."""
    conds = [("LoCoMo smart", lambda r: loco("smart", r)), ("LoCoMo nl", lambda r: loco("nl", r)),
             ("LoCoMo body-only (weak vector)", lambda r: loco("body", r)),
             ("SciFact train", lambda r: sci("smart", r, "train"))]
    parts = {n: (f(rt.f_lexical), f(rt.f_vector)) for n, f in conds}
    rules = {"α 0.3 (today)": P(rt.f_alpha, alpha=0.3), "α 0.4": P(rt.f_alpha, alpha=0.4),
             "α 0.5": P(rt.f_alpha, alpha=0.5),
             **{f"z over own top-100, w {w}": P(rt.f_norm, how="z", w_lex=w) for w in (0.5, 0.6)},
             **{f"max-normalised, w {w}": P(rt.f_norm, how="max", w_lex=w) for w in (0.4, 0.5)},
             **{f"z over the whole memory, w {w}": P(rt.f_zfull, w_lex=w) for w in (0.2, 0.3, 0.4)},
             "sharpness-weighted z (gap top-5)": P(rt.f_sharp, how="z", sharp="gapk", k=5),
             "sharpness-weighted minmax (gap top-1 vs top-10)": P(rt.f_sharp, how="minmax", sharp="gap1k"),
             **{f"RRF k {k} (exact ranks, score tie-break)": P(rt.f_rrf, k=k) for k in (10, 60)},
             "RRF k 60 (product, top lists)": P(rt.f_rrf, k=60, exact=False, tiebreak=False)}
    print("| fusion | " + " | ".join(n for n, _ in conds) + " | worst margin | SciFact test |")
    print("|---|" + "---|" * (len(conds) + 2))
    print("| parts: lexical / vector | " + " | ".join(f"{l.mean():.4f} / {v.mean():.4f}" for l, v in parts.values())
          + " | | |")
    for name, r in rules.items():
        cells, marg = [], []
        for n, f in conds:
            h = f(r)
            best = max(parts[n][0].mean(), parts[n][1].mean())
            cells.append(f"{h.mean():.4f} ({h.mean() - best:+.3f})")
            marg.append(h.mean() - best)
        print(f"| {name} | " + " | ".join(cells) + f" | {min(marg):+.3f} | {sci('smart', r, 'test').mean():.4f} |")


def exp_sci_templates():
    print("| SciFact template | split | vector | hybrid α 0.3 | hybrid z (whole memory, w 0.3) |")
    print("|---|---|---|---|---|")
    for t in ("nl", "smart"):
        for split in ("train", "test"):
            v, h, z = (sci(t, r, split) for r in (rt.f_vector, rt.f_alpha, P(rt.f_zfull, w_lex=0.3)))
            v0, h0, z0 = (sci("nl", r, split) for r in (rt.f_vector, rt.f_alpha, P(rt.f_zfull, w_lex=0.3)))
            print(f"| {t} | {split} | {v.mean():.4f} ({paired(v, v0)}) | {h.mean():.4f} ({paired(h, h0)}) | "
                  f"{z.mean():.4f} ({paired(z, z0)}) |")


def main2():
    which = sys.argv[1]
    cmds = {"final": exp_final, "gates": exp_gates, "sensitivity": exp_sensitivity,
            "conditions": exp_conditions, "sci_templates": exp_sci_templates}
    if which in cmds:
        cmds[which]()
    else:
        main()


if __name__ == "__main__":
    main2()

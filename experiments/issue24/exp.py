"""Issue 24 experiments on the harness (harness.py): best-piece vector scoring, label-free side
weights from leave-one-out pseudo-queries, and both together.

    .venv/bin/python experiments/issue24/exp.py [N]      # N pseudo-queries per memory (default 100)

Writes results/exp_<N>.json and prints the markdown tables README.md quotes.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as H  # noqa: E402

from nubos_memory.embed.chunking import _BREAK  # noqa: E402
from nubos_memory.embed.pooling import pool_pieces  # noqa: E402
from nubos_memory.records import embed_text  # noqa: E402
from nubos_memory.tokenize import tokenize  # noqa: E402

PKL = Path("/tmp/issue24/units.pkl")
LAMBDAS = (0.0, 0.25, 0.5, 0.75, 1.0)
GRID = np.round(np.arange(0.1, 0.91, 0.1), 2)
MIN_TERMS = 3


def all_units() -> dict[str, list[H.Unit]]:
    if PKL.exists():
        return pickle.loads(PKL.read_bytes())
    us = {name: H.units(name) for name in H.SETS}
    for lst in us.values():
        for u in lst:
            u.bm = u.bm  # PostingsBM25 pickles (numpy arrays + lists)
    PKL.write_bytes(pickle.dumps(us))
    return us


def vec_cos(u: H.Unit, qv: np.ndarray, lam: float) -> np.ndarray:
    pooled = qv @ u.pooled.T
    if lam == 0:
        return pooled
    return lam * H.piece_max(u, qv) + (1 - lam) * pooled


# ------------------------------------------------------------------ pseudo-queries
def _h(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def draw(u: H.Unit, n: int) -> list[tuple[int, int, int]]:
    """Up to ``n`` (record, start, end) sentence spans of record bodies, deterministic for the log: every
    (record id, sentence index) pair ordered by its sha256, the first ``n`` that qualify (the sentence
    has >= 3 terms and so does the rest of the record: leave-one-out needs both)."""
    cands = []
    for i, r in enumerate(u.recs):
        body = r["body"]
        spans = H_spans(body)
        if len(spans) < 2:
            continue
        for j, (a, b) in enumerate(spans):
            cands.append((_h(r["id"], str(j)), i, a, b))
    cands.sort()
    out = []
    for _, i, a, b in cands:
        body = u.recs[i]["body"]
        s, rest = body[a:b], body[:a] + body[b:]
        if len(set(tokenize(s))) >= MIN_TERMS and len(set(tokenize(rest))) >= MIN_TERMS:
            out.append((i, a, b))
        if len(out) >= n:
            break
    return out


def H_spans(text: str) -> list[tuple[int, int]]:
    out, pos = [], 0
    for m in _BREAK.finditer(text):
        if m.start() > pos and text[pos:m.start()].strip():
            out.append((pos, m.start()))
        pos = m.end()
    if pos < len(text) and text[pos:].strip():
        out.append((pos, len(text)))
    return out


def bm25_doc(u: H.Unit, terms: list[str], doc_tokens: list[str]) -> float:
    avgdl = float(u.bm.doc_len.mean())
    tf: dict[str, int] = {}
    for t in doc_tokens:
        tf[t] = tf.get(t, 0) + 1
    norm = H.K1 * (1 - H.B + H.B * len(doc_tokens) / avgdl)
    return sum(u.bm.idf(t) * tf[t] * (H.K1 + 1) / (tf[t] + norm) for t in set(terms) if t in tf)


def pseudo(u: H.Unit, n: int) -> dict:
    """Leave-one-out known-item pseudo-queries: a sentence of a record is the query; the record with
    that sentence removed is the one right answer (both sides lose the verbatim match)."""
    from nubos_memory.records import lexical_text

    drawn = draw(u, n)
    if not drawn:
        return {"n": 0}
    qtexts = [u.recs[i]["body"][a:b].strip() for i, a, b in drawn]
    qv = H.embed_queries(qtexts)
    raw = np.zeros((len(drawn), len(u.recs)))
    target = np.array([i for i, _, _ in drawn])
    rest_recs = []
    for k, (i, a, b) in enumerate(drawn):
        terms = tokenize(qtexts[k])
        raw[k] = u.bm.scores(terms)
        r = dict(u.recs[i])
        r["body"] = (r["body"][:a] + r["body"][b:]).strip()
        rest_recs.append(r)
        raw[k, i] = bm25_doc(u, terms, tokenize(lexical_text(r)))
    pieces, owner = H.split_pieces([embed_text(r) for r in rest_recs])
    pv = H.embed(pieces)
    rest_pooled = pool_pieces(pv.astype(np.float32), owner, len(drawn)).astype(np.float64)
    rest_max = np.full(len(drawn), -np.inf)
    np.maximum.at(rest_max, owner, (pv * qv[owner]).sum(1))
    rows = np.arange(len(drawn))
    out = {"n": len(drawn), "pieces_embedded": len(pieces), "by_lambda": {}}

    def mrr(score):
        t = score[rows, target]
        rank = 1 + (score > t[:, None]).sum(1)
        return 1.0 / rank

    lex_rr = mrr(raw)
    for lam in LAMBDAS:
        cos = vec_cos(u, qv, lam)
        cos[rows, target] = lam * rest_max + (1 - lam) * (rest_pooled * qv).sum(1) if lam else (rest_pooled * qv).sum(1)
        vec_rr = mrr(cos)
        s = H.sides(u, cos, raw=raw, g=0.0)
        hyb = {float(w): float(mrr(w * s.zl + (1 - w) * s.zc).mean()) for w in GRID}
        out["by_lambda"][lam] = {"lex_mrr": float(lex_rr.mean()), "vec_mrr": float(vec_rr.mean()), "hyb_mrr": hyb}
    return out


# ------------------------------------------------------------------ weight rules
def w_rule(rule: str, p: dict, lam: float) -> float:
    if p.get("n", 0) < 20:
        return 0.3
    st = p["by_lambda"][lam]
    ml, mv = st["lex_mrr"], st["vec_mrr"]
    if rule == "fixed":
        return 0.3
    if rule.startswith("amx"):  # argmax within eps of the best, nearest 0.3; no signal (both sides' MRR < 0.15): 0.3
        eps = float(rule[3:])
        if max(ml, mv) < 0.15:
            return 0.3
        best = max(st["hyb_mrr"].values())
        return min((w for w, v in st["hyb_mrr"].items() if v >= best - eps - 1e-12), key=lambda w: (abs(w - 0.3), w))
    if rule == "argmax":  # the grid weight with the best pseudo hybrid MRR (ties: nearest 0.3)
        best = max(st["hyb_mrr"].values())
        return min((w for w, v in st["hyb_mrr"].items() if v >= best - 1e-12), key=lambda w: abs(w - 0.3))
    if rule.startswith("share"):  # w = 0.3 + k·(share_lex − 0.5), share_lex = ml/(ml+mv), clipped to [0.1, 0.9]
        k = float(rule[5:] or 1.0)
        return float(np.clip(0.3 + k * (ml / max(ml + mv, 1e-9) - 0.5), 0.1, 0.9))
    if rule.startswith("diff"):  # w = 0.3 + k·(ml − mv), clipped
        k = float(rule[4:] or 1.0)
        return float(np.clip(0.3 + k * (ml - mv), 0.1, 0.9))
    raise ValueError(rule)


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    us = all_units()
    res: dict = {"n": n, "sets": {}}
    pcache = Path(f"/tmp/issue24/pseudo_{n}.json")
    pseudo_all = json.loads(pcache.read_text()) if pcache.exists() else {}
    for name, lst in us.items():
        for u in lst:
            if u.name not in pseudo_all:
                pseudo_all[u.name] = json.loads(json.dumps(pseudo(u, n)))
                pcache.write_text(json.dumps(pseudo_all))
    res["pseudo"] = pseudo_all
    rules = ["fixed", "argmax", "share1", "share2", "diff1", "diff2", "amx0", "amx0.005", "amx0.01", "amx0.02"]
    table = {}
    for name, lst in us.items():
        for lam in LAMBDAS:
            cos_by = [vec_cos(u, u.qv, lam) for u in lst]
            sides_by = [H.sides(u, c) for u, c in zip(lst, cos_by)]
            row = {"lexical": H.mean_over([H.metrics(u, *H.rank_lexical(s)) for u, s in zip(lst, sides_by)]),
                   "vector": H.mean_over([H.metrics(u, *H.rank_vector(s)) for u, s in zip(lst, sides_by)]),
                   "alpha": H.mean_over([H.metrics(u, *H.rank_alpha(u, c)) for u, c in zip(lst, cos_by)])}
            for rule in rules:
                lam_key = lam if lam in LAMBDAS else 0.0
                ws = [w_rule(rule, _fix(pseudo_all[u.name]), lam_key) for u in lst]
                row[f"hybrid:{rule}"] = H.mean_over([H.metrics(u, *H.rank_hybrid(s, w)) for u, s, w in zip(lst, sides_by, ws)])
                row[f"hybrid:{rule}"]["w"] = [round(w, 2) for w in ws]
            for w in (0.1, 0.3, 0.5, 0.7):
                row[f"hybrid:w{w}"] = H.mean_over([H.metrics(u, *H.rank_hybrid(s, w)) for u, s in zip(lst, sides_by)])
            table[f"{name}|{lam}"] = row
            print(name, lam, {k: (round(v['recall@5'], 4), round(v['recall@10'], 4), round(v['ndcg@10'], 4), v.get('w'))
                              for k, v in row.items()}, flush=True)
    res["table"] = table
    out = Path(__file__).resolve().parent / "results" / f"exp_{n}.json"
    out.write_text(json.dumps(res, indent=1))


def _fix(p: dict) -> dict:
    """JSON turned the λ keys into strings."""
    if "by_lambda" in p:
        p = {**p, "by_lambda": {float(k): {**v, "hyb_mrr": {float(a): b for a, b in v["hyb_mrr"].items()}}
                                for k, v in p["by_lambda"].items()}}
    return p


if __name__ == "__main__":
    main()

"""The metrics of ``memory-eval``, as trec_eval computes them (pure functions, tested against
hand-computed values): nDCG@k with linear gains, recall@k, MRR@k; and latency percentiles."""

from __future__ import annotations

import math

import numpy as np


def ndcg_at_k(ranked: list[str], qrels: dict[str, int], k: int = 10) -> float:
    """nDCG@k with trec_eval's linear gains: DCG = Σ rel_i / log2(i + 1), i from 1."""
    dcg = sum(qrels.get(doc, 0) / math.log2(i + 2) for i, doc in enumerate(ranked[:k]))
    ideal = sorted((g for g in qrels.values() if g > 0), reverse=True)[:k]
    idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal))
    return dcg / idcg if idcg > 0 else 0.0


def recall_at_k(ranked: list[str], qrels: dict[str, int], k: int) -> float:
    relevant = {d for d, g in qrels.items() if g > 0}
    return len(relevant & set(ranked[:k])) / len(relevant) if relevant else 0.0


def mrr_at_k(ranked: list[str], qrels: dict[str, int], k: int = 10) -> float:
    for i, doc in enumerate(ranked[:k]):
        if qrels.get(doc, 0) > 0:
            return 1.0 / (i + 1)
    return 0.0


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else 0.0

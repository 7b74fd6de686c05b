"""Per-query cost of the proposal's extra work (numpy, one query, one thread), vs the plain fusion.

    .venv/bin/python experiments/recall_tune_cost.py
"""
import time

import numpy as np

try:
    from threadpoolctl import threadpool_limits
    threadpool_limits(1)
except Exception:  # pragma: no cover
    pass


def extra_exact(raw, cos, g, bl=0.5, bv=0.3):
    """What the proposal adds when every cosine is at hand (exact scan, N <= 5,000): neighbour
    max on both full score vectors, and their mean/sd."""
    nb = np.zeros_like(raw)
    nb[1:] = raw[:-1]
    nb[:-1] = np.maximum(nb[:-1], raw[1:])
    raw_s = raw + bl * g * nb
    nbc = np.zeros_like(cos)
    nbc[1:] = cos[:-1]
    nbc[:-1] = np.maximum(nbc[:-1], cos[1:])
    cos_s = cos + bv * g * nbc
    return raw_s.mean(), raw_s.std(), cos_s.mean(), cos_s.std()


def extra_graph(raw, V, q, cand, sample, g, bl=0.5, bv=0.3):
    """The same above EXACT_LIMIT (HNSW): BM25 as above; cosine statistics from a fixed sample of
    1,000 records (and their neighbours), and the neighbours' cosines for ~200 candidates."""
    nb = np.zeros_like(raw)
    nb[1:] = raw[:-1]
    nb[:-1] = np.maximum(nb[:-1], raw[1:])
    raw_s = raw + bl * g * nb
    idx = np.r_[sample, np.maximum(sample - 1, 0), np.minimum(sample + 1, len(V) - 1)]
    c = V[idx] @ q
    k = len(sample)
    cs = c[:k] + bv * g * np.maximum(c[k:2 * k], c[2 * k:])
    nbr = V[np.r_[np.maximum(cand - 1, 0), np.minimum(cand + 1, len(V) - 1)]] @ q
    return raw_s.mean(), raw_s.std(), cs.mean(), cs.std(), nbr


def bench(f, *a, reps=200):
    f(*a)
    t = time.perf_counter()
    for _ in range(reps):
        f(*a)
    return (time.perf_counter() - t) / reps * 1000


rng = np.random.default_rng(0)
for n in (680, 5_000, 100_000):
    V = rng.standard_normal((n, 384)).astype(np.float32)
    V /= np.linalg.norm(V, axis=1, keepdims=True)
    q = V[0]
    raw = np.where(rng.random(n) < 0.05, rng.random(n) * 10, 0.0)
    scan = bench(lambda: V @ q)
    if n <= 5_000:
        cos = (V @ q).astype(np.float64)
        e = bench(extra_exact, raw, cos, 1.0)
        print(f"N={n:6d}: exact scan V@q {scan:.2f} ms; proposal's extra work {e:.3f} ms per query")
    else:
        cand = rng.choice(n, 200, replace=False)
        sample = np.sort(rng.choice(n, 1000, replace=False))
        e = bench(extra_graph, raw, V, q, cand, sample, 1.0)
        print(f"N={n:6d}: (HNSW regime) proposal's extra work {e:.3f} ms per query")

# index-time: coherence κ = mean adjacent cosine − mean all-pairs cosine, O(N·d)
for n in (5183, 100_000):
    V = rng.standard_normal((n, 384)).astype(np.float32)
    t = time.perf_counter()
    adj = float((V[1:] * V[:-1]).sum(1).mean())
    tot = V.sum(0)
    allp = float((tot @ tot - (V * V).sum()) / (n * (n - 1)))
    print(f"coherence over N={n}: {(time.perf_counter() - t) * 1000:.1f} ms (once per index generation)")

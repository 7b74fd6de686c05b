"""Context for short records: a record's neighbours in the log (adr/0002, issue 12).

In a conversation, or a session of notes, the turn that answers a question
follows the turn that holds the question's words; one short record alone often
lacks the words a query uses.  So a record also gets a share of its neighbours'
scores::

    b'(i) = b(i) + 0.5 · g · max(b(prev), b(next))     raw BM25
    c'(i) = c(i) + 0.3 · g · max(c(prev), c(next))     cosine

where prev and next are the adjacent *live* records in log order (filters
ignored: a neighbour gives context even when it is not a hit itself), and ``g``
is one number per memory, the *coherence gate*: how much the log order
carries topic.  With κ = (mean cosine of adjacent records) − (mean cosine of
all pairs), ``g = clip((κ − 0.02) / 0.06, 0, 1)``.  A memory whose order carries
no topic (SciFact's abstracts: κ 0.006; a conversation shuffled: κ ≈ 0) gets
no context at all; conversations (κ 0.10–0.20) and session notes
(``examples/agent-memories.jsonl``: 0.11) get all of it.  No extra vectors.
"""

from __future__ import annotations

import numpy as np

CONTEXT_LEXICAL = 0.5
CONTEXT_VECTOR = 0.3
GATE_LOW, GATE_HIGH = 0.02, 0.08
SAMPLE_PAIRS = 20_000  # adjacent pairs looked at to estimate κ in a large memory


def live_neighbours(alive: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each position, the previous and the next live position (-1: none): the last live position
    up to each one, and the first from each one, each in one pass."""
    n = len(alive)
    prev = np.full(n, -1, dtype=np.int64)
    nxt = np.full(n, -1, dtype=np.int64)
    if n == 0 or not alive.any():
        return prev, nxt
    at = np.arange(n, dtype=np.int64)
    prev[1:] = np.maximum.accumulate(np.where(alive, at, -1))[:-1]  # the last live one before p
    first = np.minimum.accumulate(np.where(alive, at, n)[::-1])[::-1]  # the first live one at or after p
    nxt[:-1] = np.where(first[1:] < n, first[1:], -1)
    return prev, nxt


def coherence(vectors: np.ndarray) -> float:
    """κ of unit vectors in log order: mean cosine of adjacent rows minus mean cosine of all pairs
    (the all-pairs mean is (|Σv|² − N) / (N(N − 1)), so both cost O(N·d))."""
    n = len(vectors)
    if n < 3:
        return 0.0
    v = np.asarray(vectors, dtype=np.float64)
    if n - 1 > SAMPLE_PAIRS:  # a fixed, evenly spread sample of adjacent pairs
        idx = np.linspace(0, n - 2, SAMPLE_PAIRS).astype(np.int64)
        adjacent = float(np.einsum("ij,ij->i", v[idx], v[idx + 1]).mean())
    else:
        adjacent = float(np.einsum("ij,ij->i", v[:-1], v[1:]).mean())
    total = v.sum(axis=0)
    all_pairs = float((total @ total - np.einsum("ij,ij->", v, v)) / (n * (n - 1)))
    return adjacent - all_pairs


def gate(kappa: float) -> float:
    """The coherence gate g in [0, 1] (see module docstring)."""
    return float(np.clip((kappa - GATE_LOW) / (GATE_HIGH - GATE_LOW), 0.0, 1.0))


def with_context(scores: np.ndarray, positions: np.ndarray, prev: np.ndarray, nxt: np.ndarray, weight: float,
                 of: np.ndarray | None = None) -> np.ndarray:
    """``s(i) + weight · max(s(prev), s(next))`` for ``positions``, from ``scores`` indexed by
    position (``of``: which positions have a score at all; a neighbour without one is ignored)."""
    own = scores[positions]
    if weight == 0.0 or len(positions) == 0:
        return np.asarray(own, dtype=np.float64)
    best = np.full(len(positions), -np.inf)
    for side in (prev[positions], nxt[positions]):
        ok = side >= 0
        if of is not None:
            ok &= of[np.where(ok, side, 0)]
        vals = np.where(ok, scores[np.where(ok, side, 0)], -np.inf)
        best = np.maximum(best, vals)
    best = np.where(np.isfinite(best), best, 0.0)
    return np.asarray(own + weight * best, dtype=np.float64)

"""What one query asks (``Request``) and where it looks (``Scope``): what the query's stages share."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import scratch


@dataclass(frozen=True)
class Request:
    """The arguments of one query, as ``run_query`` received them."""

    text: str
    k: int
    type: str | None
    phase: str | None
    tags: list[str]
    alpha: float
    fusion: str
    explain: bool
    mode: str = "hybrid"
    collapse: bool = True
    phase_exact: bool = False
    since: str | None = None  # ISO-8601: only records created at or after it
    as_of: str | None = None  # ISO-8601: the memory as it stood then (``timeline.py``)
    positions: np.ndarray | None = field(default=None, compare=False)  # only these records (``--branch current``)
    side_weights: bool = False  # z fusion takes the memory's estimated weight, not ``alpha`` (sideweight.py)
    side_weight: dict[str, Any] | None = field(default=None, compare=False)  # the estimate used (``--explain``)
    domain: str | None = None  # only records of this domain (``records.py``)


@dataclass
class Scope:
    """The records a query may return (``positions``: live, through the filters), their neighbours
    in the log (``prev``/``nxt``, -1: none), how many candidates each side proposes, and the weight
    of the neighbours' context (``gate``, the coherence gate g; 0: none)."""

    positions: np.ndarray
    prev: np.ndarray
    nxt: np.ndarray
    n_cand: int
    gate: float = 0.0

    def neighbourhood(self, ps: np.ndarray) -> np.ndarray:
        """Positions and, with context on, their neighbours (whose scores context needs)."""
        if self.gate <= 0:
            return ps
        prev, nxt = self.prev[ps], self.nxt[ps]
        return distinct(np.concatenate([ps, prev[prev >= 0], nxt[nxt >= 0]]))


def take(values: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """``values[positions]`` for sorted distinct positions; ``values`` itself (not a copy: read only) when
    they are every position (a scope without filters: at a million records each gather costs ~2 ms)."""
    return values if len(positions) == len(values) else values[positions]


def top(positions: np.ndarray, scores: np.ndarray, n: int) -> np.ndarray:
    """The ``n`` best positions by score (ties: earlier record first, at the cut too: which of the
    records tied with the ``n``-th best are kept does not depend on how the arrays are laid out)."""
    if len(positions) > n:
        chosen = _best(positions, scores, n)
        positions, scores = positions[chosen], scores[chosen]
    return positions[np.lexsort((positions, -scores))]


def _best(positions: np.ndarray, scores: np.ndarray, n: int) -> np.ndarray:
    """The indexes of the ``n`` best scores; of those tied with the ``n``-th best, the earliest positions."""
    if n <= 0:
        return np.zeros(0, dtype=np.int64)
    work, _ = scratch.floats(len(scores))  # (the scores negated, partitioned in place: no new array; so
    np.negative(scores, out=work)          # ``scores`` must not be one of scratch's arrays)
    work.partition(n - 1)
    cut = scores.dtype.type(-work[n - 1])  # the n-th best score
    if np.isnan(cut):  # fewer than n scores that are numbers: all of them, then the NaNs (worst), earliest first
        kept, missing = np.flatnonzero(~np.isnan(scores)), np.flatnonzero(np.isnan(scores))
        need = n - len(kept)
        return np.concatenate([kept, missing[np.argpartition(positions[missing], need - 1)[:need]]
                               if need < len(missing) else missing])
    kept = np.flatnonzero(scores >= cut)
    if len(kept) == n:
        return kept
    at = scores[kept]
    tied = kept[at == cut]
    need = n - (len(kept) - len(tied))
    first = np.argpartition(positions[tied], need - 1)[:need] if need < len(tied) else slice(None)
    return np.concatenate([kept[at > cut], tied[first]])


def distinct(values: np.ndarray) -> np.ndarray:
    """The sorted distinct values of a 1-d array: ``np.unique`` without its first call's import of
    ``numpy.ma`` (13 ms of a one-shot query)."""
    ordered = np.sort(values)
    if len(ordered) < 2:
        return ordered
    return ordered[np.concatenate(([True], ordered[1:] != ordered[:-1]))]

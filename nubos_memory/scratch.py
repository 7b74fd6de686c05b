"""Reused float64 work arrays for the passes a query makes over every record.

At a million records a fresh array of one float64 per record is 8 MB whose pages fault in at the
first write (~0.5 ms each); a query that makes several of them pays that on every call.  A thread
takes its own arrays here (so concurrent queries never share one) and keeps them for its next query;
short arrays are simply new ones.  A caller must be done with the arrays before it asks again.
"""

from __future__ import annotations

import threading

import numpy as np

MIN_ITEMS = 1 << 16  # shorter arrays are cheap to make: they come new
_HELD = threading.local()


def floats(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Two float64 arrays of ``n`` items, their contents undefined: this thread's, reused, for long
    ones (each call returns the same two: use them before asking again)."""
    if n < MIN_ITEMS:
        return np.empty(n), np.empty(n)
    held: tuple[np.ndarray, np.ndarray] | None = getattr(_HELD, "arrays", None)
    if held is None or len(held[0]) < n:
        held = _HELD.arrays = (np.empty(n), np.empty(n))
    return held[0][:n], held[1][:n]

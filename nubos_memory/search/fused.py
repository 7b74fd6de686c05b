"""One ranking over several memories (the project's and the user's, ``api/usermemory.py``).

Each memory keeps its own log, lock and index; a query over both must still rank their records on
one scale, as if they were one memory.  So, as ``store/worktrees.py`` makes several worktrees' logs
one log with one statistic, the query here takes **one scope statistic** over both:

* **BM25** is taken with the statistic of both indexes together (document count, each term's
  document frequency, average length: ``index.lexical.SharedStatistics``), so a record scores what
  it would in one index holding both memories' records;
* the **z-scores** of each side (``fusion.py``) are taken over the union of both scopes: each
  memory's mean and deviation over its scope are pooled exactly (counts, sums of squares), and the
  ``alpha`` fusion's normaliser is the largest of both (the best score of the union, or the query's
  self-score under the shared statistic);
* ``rrf`` ranks each side's candidates of both memories in one list.

Then each memory ranks its candidates (the project's weight and threshold for both) and gives its
best ``k`` (near duplicates collapse within a memory), and the union is ordered by score.  Up to
neighbours' context (each memory's log is its own sequence) and the sample that stands for a large
scope's cosines, the fused scores equal those of one memory holding both (``tests/test_user_memory.py``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING

from ..index.lexical import SharedStatistics
from .query import Gathered, Searchable, candidates, finish, gather

if TYPE_CHECKING:
    from collections.abc import Iterator

    from ..types import QueryResult as QueryAnswer
    from .fusion import Candidate
    from .plan import Request
    from .syntax import Parsed


@contextmanager
def shared_statistics(memories: Sequence[Searchable]) -> "Iterator[None]":
    """While inside, every memory's BM25 uses the statistic of all of them together.  This changes the
    memories' own lexical engines for the duration: a ``Memory`` serves one call at a time (the warm
    server, HTTP and MCP hold one reader lock per memory: ``interfaces/warm.py``), so no other query sees
    the shared statistic; a library user who shares one ``Memory`` between threads must do the same."""
    engines = []
    for mem in memories:
        mem.scan()
        engines.append(mem.snap.lexical_engine())
    stats = SharedStatistics(engines)
    for engine in engines:
        engine.share(stats)
    try:
        yield
    finally:
        for engine in engines:
            engine.share(None)


def pooled(parts: list[tuple[int, float, float]]) -> tuple[float, float]:
    """Mean and standard deviation of the union of groups given as (count, mean, deviation)."""
    total = sum(n for n, _, _ in parts)
    if not total:
        return 0.0, 1.0
    mean = sum(n * m for n, m, _ in parts) / total
    var = sum(n * (sd * sd + m * m) for n, m, sd in parts) / total - mean * mean
    return mean, max(math.sqrt(max(var, 0.0)), 1e-9)


def pool(parts: list[Gathered]) -> None:
    """Give every part the union's statistics: the lexical and vector z-scores and the normaliser."""
    lexical = pooled([(len(g.scope.positions), g.lex.mean, g.lex.sd) for g in parts])
    normaliser = max(g.lex.normaliser for g in parts)
    with_vectors = [g for g in parts if g.vec is not None]
    vector = pooled([(len(g.scope.positions) - g.vec.pending, g.vec.mean, g.vec.sd)
                     for g in with_vectors if g.vec is not None])
    for g in parts:
        g.lex.mean, g.lex.sd = lexical
        g.lex.normaliser = normaliser
        if g.vec is not None:
            g.vec.mean, g.vec.sd = vector


def rerank(groups: list[list["Candidate"]]) -> None:
    """Each side's candidate ranks over the union (``rrf``): by ``b'``, and by cosine with context."""
    every = [c for group in groups for c in group]
    lexical = sorted((c for c in every if c.lexical_rank is not None), key=lambda c: -c.lexical_context)
    for i, c in enumerate(lexical):
        c.lexical_rank = i + 1
    vector = sorted((c for c in every if c.vector_rank is not None and c.cosine_context is not None),
                    key=lambda c: -(c.cosine_context or 0.0))
    for i, c in enumerate(vector):
        c.vector_rank = i + 1


def fused_query(memories: Sequence[tuple[str, Searchable, "Request"]],
                syntax: "Parsed | None" = None) -> list[tuple[str, Searchable, "QueryAnswer"]]:
    """Each memory's answer to its request (the same query; a filter such as ``--branch`` may differ), its
    hits scored on the one scale of all of them (see the module docstring); the caller merges them.  The
    first memory's weight and threshold rank every memory."""
    first = memories[0][1]
    got: list[tuple[str, Searchable, Gathered | QueryAnswer]] = []
    with shared_statistics([mem for _, mem, _ in memories]):
        for name, mem, req in memories:
            if got and isinstance(got[0][2], Gathered):
                req = replace(req, alpha=got[0][2].req.alpha, side_weights=False)  # one weight for all
            got.append((name, mem, gather(mem, req, syntax)))
    req = memories[0][2]
    parts = [g for _, _, g in got if isinstance(g, Gathered)]
    if parts:
        pool(parts)
    made = {id(g): candidates(g) for g in parts}
    if parts and req.fusion == "rrf":
        rerank(list(made.values()))
    out: list[tuple[str, Searchable, QueryAnswer]] = []
    for name, mem, g in got:
        if isinstance(g, Gathered):
            g.req = replace(g.req, alpha=parts[0].req.alpha)
            answer = finish(mem, g, made[id(g)], threshold=first.config.threshold)
        else:
            answer = g
        out.append((name, mem, answer))
    return out


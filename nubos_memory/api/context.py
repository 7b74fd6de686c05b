"""Query results as prompt context: token estimates, budgets, a markdown block.

* token estimates (``tokenize.estimate_tokens``): ``ceil(characters / 4)``, the usual rule of thumb for
  English text and code with GPT/Claude-style tokenizers; no tokenizer is
  loaded for it.
* ``fit_budget``: the best hits, in rank order, whose rendered blocks fit the
  budget together.  A hit that does not fit is skipped and the next ones are
  still tried (never "stop at the first overflow").
* ``render_markdown``: the block an agent pastes into its prompt: each hit's
  title, provenance label (``[CACHED:VERIFIED]``; none when the record has no
  provenance), source, and body, in rank order.  It says everything the JSON
  answer says about the answer itself: a degraded (keyword-only) answer, each
  warning, and the hits left out for the token budget.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..tokenize import estimate_tokens
from ..types import Hit, QueryResult, Record
from .anchors import describe


def provenance_label(record: Record) -> str:
    """``[CACHED:VERIFIED]`` for a record with a provenance, nothing for one without."""
    prov = record.get("provenance")
    return f" [CACHED:{prov}]" if prov else ""


# Hits a memory-context block includes for what they are, not for a score (``turn.py``).
UNSCORED = {"hot": "pinned (hot)", "recent": "recent handoff"}


def render_hit(rank: int, hit: Hit) -> str:
    """One hit as a markdown section."""
    rec = hit["record"]
    source = rec.get("source_file")
    if source:
        where = source + (f" § {rec['heading']}" if rec.get("heading") else "")
    else:
        where = f"memory {rec['id']}"
    facts = [f"source: {where}", f"type: {rec['type']}"]
    if rec.get("phase"):
        facts.append(f"phase: {rec['phase']}")
    if rec.get("tags"):
        facts.append("tags: " + ", ".join(rec["tags"]))
    facts.append(UNSCORED.get(hit["retrieval"]) or f"score: {hit['score']:.3f} ({hit['retrieval']})")
    body = (rec.get("body") or "").strip()
    folded = hit.get("collapsed")
    fold = ""
    if folded:  # the memory holds other, older statements like this one: say so, never hide it
        count = folded["count"]
        fold = (f"> {count} older near-duplicate note{'s' if count != 1 else ''} folded into this one (this is the "
                f"newest): {', '.join(folded['ids'][:5])}{' …' if count > 5 else ''}\n")
    stale = "".join(f"> ⚠ {line}\n" for line in describe(hit.get("anchors") or []))  # said in words
    stale += "".join(f"> supersedes an older note that said “{c['said']}” ({c['kind']} differs, "
                     f"{c.get('created_at') or 'undated'})\n" for c in hit.get("conflicts") or [])
    return (f"### {rank}. {rec['title']}{provenance_label(rec)}\n{' · '.join(facts)}\n{fold}{stale}"
            + (f"\n{body}\n" if body else ""))


def fit_budget(hits: list[Hit], max_tokens: int) -> tuple[list[Hit], dict[str, Any]]:
    """Keep the hits that fit ``max_tokens`` (see module docstring); return them and a report."""
    kept: list[Hit] = []
    skipped: list[dict[str, Any]] = []
    used = 0
    for hit in hits:
        cost = estimate_tokens(render_hit(len(kept) + 1, hit))
        if used + cost <= max_tokens:
            kept.append(hit)
            used += cost
        else:
            skipped.append({"id": hit["id"], "tokens": cost})
    return kept, {"max_tokens": max_tokens, "used": used, "skipped": skipped}


def first_ten(items: list[Any], show: "Callable[[Any], str]") -> str:
    """The first ten of ``items`` as ``show`` writes each, and how many more there are."""
    more = f" and {len(items) - 10} more" if len(items) > 10 else ""
    return ", ".join(show(item) for item in items[:10]) + more


def answer_notes(result: Any, degraded_means: str) -> list[str]:
    """What a markdown block says first about the answer itself: a degraded (keyword-only) answer,
    with ``degraded_means`` saying what that left, and each warning."""
    notes = []
    degraded = result.get("degraded")
    if degraded:
        notes.append(f"> degraded ({degraded['code']}): {degraded_means}. {degraded['message']}")
    for warning in result.get("warnings") or []:
        notes.append(f"> warning ({warning.get('code')}): {warning.get('message')}")
    return notes


def render_markdown(result: QueryResult | dict[str, Any]) -> str:
    """A whole ``memory-query`` answer as one markdown context block (a ``memory-context`` answer: its own
    block, ``turn.render_context``)."""
    if "sections" in result:
        from .turn import render_context

        return render_context(dict(result))
    query = result.get("query", {}).get("text", "")
    hits = result.get("hits", [])
    lines = [f"## Prior memory for: {query}", ""]
    notes = answer_notes(result, "keyword matches only")
    budget = result.get("budget") or {}
    skipped = budget.get("skipped") or []
    if skipped:
        shown = first_ten(skipped, lambda s: f"{s['id']} ({s['tokens']} tokens)")
        notes.append(f"> {len(skipped)} matching hit(s) left out to fit max_tokens={budget['max_tokens']}: "
                     f"{shown}. Raise max_tokens or lower k to see them.")
    if notes:
        lines += [*notes, ""]
    if not hits:
        lines.append("_No stored memory matches._" if not skipped else "_No matching hit fits the token budget._")
        return "\n".join(lines) + "\n"
    lines.append("Memory hits are advisory: prior learnings, decisions and research notes, best first.")
    lines.append("")
    for rank, hit in enumerate(hits, start=1):
        lines.append(render_hit(rank, hit))
    return "\n".join(lines).rstrip() + "\n"

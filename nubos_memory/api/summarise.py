"""``memory-summarise``: one current statement in place of many near duplicates (adr/0019).

Groups are the live records whose vectors are near duplicates of a newer one (cosine at least
``--similarity``, by default ``memory.near_duplicate``; the grouping queries use to collapse hits,
``search.dedup.collapse``), of one type; or, with ``--type T``, every live record of that type once it
holds at least ``--min-size`` of them, in groups of :data:`MAX_MEMBERS`, oldest first.  The generator
merges each group into one record (``generate.tasks.merge``); that record supersedes the group's newest
member and the others are retired with the reason ``summarised into <id>``, all in one change through
the write path (``Memory.apply``).  The log is only appended to: every member stays in it, and
``memory-get --history`` shows what the summary replaced.  ``--dry-run`` asks the generator and shows
each group before and after, and writes nothing.  The summary is hot (pinned) when any member was.  A
merge that comes back without a title, or without a body where a member had one, would lose what the
group said: that group is skipped and listed under ``unusable`` with why.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from typing import TYPE_CHECKING, Any

from .. import codes
from ..errors import InputError
from ..limits import MAX_TAGS
from ..records import recency, validate_batch
from ..search.dedup import collapse

if TYPE_CHECKING:
    from ..types import Record
    from .memory import Memory

MAX_MEMBERS = 20  # records merged into one at most (the newest of a larger group)
VERB = "memory-summarise"


def _argument(name: str, value: Any, lo: float, hi: float, integer: bool) -> None:
    ok = not isinstance(value, bool) and isinstance(value, int if integer else (int, float)) and lo <= value <= hi
    if not ok:
        raise InputError(f"{name} must be {'an integer' if integer else 'a number'} in [{lo}, {hi}]",
                         code=codes.SUMMARISE_INVALID_ARGUMENT, details={name: str(value)[:64]})


def groups(mem: "Memory", *, type_: str | None, min_size: int, similarity: float | None
           ) -> tuple[list[list[int]], dict[str, Any] | None]:
    """The groups to merge (positions, oldest first) and why the vector side could not tell, if so."""
    scan = mem.scan()
    alive = mem.snap.alive
    live = [p for p in range(len(scan.records)) if p < len(alive) and alive[p]]
    oldest_first = sorted(live, key=lambda p: recency(scan.records[p]))
    if type_ is not None:
        members = [p for p in oldest_first if scan.records[p]["type"] == type_]
        if len(members) < min_size:
            return [], None
        chunks = [members[i: i + MAX_MEMBERS] for i in range(0, len(members), MAX_MEMBERS)]
        return [c for c in chunks if len(c) >= 2], None  # one record left over is no group: it stays as it is
    threshold = similarity if similarity is not None else mem.config.near_duplicate or 0.9
    state = mem.sync_vectors(None)
    if state.degraded is not None:
        return [], state.degraded
    ranked = oldest_first[::-1]  # newest first: each group forms around its newest statement
    vectors, has = state.vectors_of(ranked)
    found = []
    for group in collapse(ranked, vectors, has, threshold, len(ranked)):
        kind = scan.records[group[0]]["type"]
        same = [p for p in group if scan.records[p]["type"] == kind][:MAX_MEMBERS]
        if len(same) >= 2:
            found.append(sorted(same, key=lambda p: recency(scan.records[p])))
    return found, None


def _common(records: "list[Record]", key: str) -> Any:
    values = {str(r.get(key)) for r in records}
    return records[-1].get(key) if len(values) == 1 else None


def merged_record(members: "list[Record]", title: str, body: str, *, hot: bool = False) -> dict[str, Any]:
    """The record that replaces ``members`` (oldest first): the majority type, every tag, what they share,
    and ``hot`` when any member was hot."""
    ids = sorted(r["id"] for r in members)
    tags = list(dict.fromkeys(t for r in members for t in r.get("tags") or []))[:MAX_TAGS]
    out: dict[str, Any] = {
        "id": "summary:" + hashlib.sha256("\n".join(ids).encode()).hexdigest()[:24],
        "type": Counter(r["type"] for r in members).most_common(1)[0][0], "title": title, "body": body,
        "tags": tags, "supersedes": members[-1]["id"]}
    for key in ("phase", "provenance", "domain"):
        if _common(members, key) is not None:
            out[key] = _common(members, key)
    if hot:
        out["hot"] = True
    return out


def _lost(members: "list[Record]", merged: dict[str, str]) -> str | None:
    """Why a merge cannot replace its group (None: it can)."""
    if not merged or not str(merged.get("title") or "").strip():
        return "the generator gave no merged title"
    if not str(merged.get("body") or "").strip() and any(str(r.get("body") or "").strip() for r in members):
        return "the generator gave an empty body for members that had one"
    return None


def summarise(mem: "Memory", *, type_: str | None = None, min_size: int = 10, similarity: float | None = None,
              max_groups: int = 20, dry_run: bool = False) -> dict[str, Any]:
    """Merge groups of near duplicates (or a large type) into one record each (see module docstring)."""
    from ..generate import make_generator
    from ..generate.tasks import merge

    mem.require_enabled()
    _argument("min_size", min_size, 2, 1_000_000, True)
    _argument("max_groups", max_groups, 1, 1000, True)
    if similarity is not None:
        _argument("similarity", similarity, 0.5, 1.0, False)
    gen = make_generator(mem.config)
    found, degraded = groups(mem, type_=type_, min_size=min_size, similarity=similarity)
    scan = mem.scan()
    hot = set(scan.hot_positions())
    planned, unusable, records, forget, reasons = [], [], [], [], {}
    for group in found[:max_groups]:
        members = [scan.records[p] for p in group]
        merged = merge(gen, [(r["title"], r.get("body") or "") for r in members])
        why = _lost(members, merged)
        if why is not None:
            unusable.append({"ids": [r["id"] for r in members], "why": why})
            continue
        new = merged_record(members, merged["title"], merged["body"], hot=any(p in hot for p in group))
        planned.append({"before": [{k: r.get(k) for k in ("id", "type", "title", "body", "created_at")}
                                   for r in members], "after": new})
        records.append(new)
        for r in members[:-1]:
            forget.append(r["id"])
            reasons[r["id"]] = f"summarised into {new['id']}"
    out: dict[str, Any] = {"dry_run": dry_run, "groups": planned, "more_groups": max(0, len(found) - max_groups),
                           "unusable": unusable, "requests": gen.requests, "degraded": degraded, "written": None}
    if not dry_run and records:
        valid = validate_batch(records, mem.config.record_types)
        # force: a summary may repeat a member's text exactly; it still replaces the whole group
        out["written"] = mem.apply(valid, forget=forget, reasons=reasons, force=True, verb=VERB)
    return out

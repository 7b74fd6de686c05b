"""The block an agent injects into each turn (``memory-context``), and hot records (``memory-pin``).

A ``memory-context`` answer has three sections, in this order, and no record twice:

* **hot**: every live hot record (``log.py``: ``hot: true`` on write or a ``memory-pin``, until a
  ``memory-unpin``; a retired or expired record never is), newest first, within
  :data:`HOT_SHARE` (40 %) of the budget: when they do not all fit, the newest that fit are kept;
* **relevant**: the hybrid query's best ``k`` hits for the task (``Memory.query``), leaving out
  the records already included;
* **recent**: the newest ``recent`` records of type ``handoff`` (what prior sessions left), leaving
  out those already included.  Up to :data:`RECENT_SHARE` (20 %) of the budget is kept for them
  (as much as they need, no more) before the relevant hits are fitted.

Tokens are estimated as ``fit_budget`` does (each hit's markdown block, ``tokenize.estimate_tokens``);
a hit that does not fit is passed over and the next one is still tried.  Every record left out is
named in ``budget.left_out`` with its section, its cost and why: ``hot-share`` (over the hot share)
or ``budget`` (over what the budget had left).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, cast

from .. import codes
from ..errors import InputError, UsageError
from ..limits import MAX_ECHO, MAX_K
from ..log import LogScan, pin_op
from ..records import recency, valid_id
from ..search.timeline import expiry
from .anchors import weigh_freshness
from .context import answer_notes, first_ten, fit_budget, render_hit
from .gitstate import mark_merged
from .writepath import settled_scan

if TYPE_CHECKING:
    from ..types import ContextResult, ContextSection, Hit, QueryResult, Record
    from .memory import Memory

HOT_SHARE = 0.4  # of max_tokens, at most, for the hot records
RECENT_SHARE = 0.2  # of max_tokens, at most, kept for the recent handoffs before the relevant hits
HANDOFF = "handoff"


def set_hot(mem: "Memory", ids: list[str], hot: bool) -> dict[str, Any]:
    """Pin (``hot``) or unpin records by id: one ``pin``/``unpin`` op per live record whose state
    changes, all in one change.  Ids no record has are refused (``record-not-found``, nothing written);
    retired ones are listed in ``retired`` (a retired record is never hot)."""
    verb = "memory-pin" if hot else "memory-unpin"
    mem.require_enabled()
    if not ids:
        raise UsageError(f"give at least one record id to {verb.removeprefix('memory-')}")
    bad = [str(i)[:MAX_ECHO] for i in ids if not valid_id(i)]
    if bad:
        raise InputError(f"not a record id: {bad[0]!r}", code=codes.RECORD_INVALID_ID, details={"ids": bad[:20]})
    wanted = list(dict.fromkeys(ids))
    mem.store.prepare()
    with mem.store.lock(verb):
        scan, _ = settled_scan(mem.snap, mem.store)
        unknown = [rid for rid in wanted if rid not in scan.position]
        if unknown:
            raise InputError(f"no record has the id {unknown[0]!r}; nothing was {verb.removeprefix('memory-')}ned",
                             code=codes.RECORD_NOT_FOUND, details={"ids": unknown[:50], "written": 0})
        retired = [rid for rid in wanted if scan.live(rid) is None]
        changed = [rid for rid in wanted if rid not in retired and (scan.position[rid] in scan.hot) != hot]
        if changed:
            mem.store.append([], [pin_op(rid, hot) for rid in changed])
    scan = mem.scan()
    return {"pinned" if hot else "unpinned": changed,
            "unchanged": [rid for rid in wanted if rid not in changed and rid not in retired],
            "retired": retired, "hot": len(scan.hot_positions()), "warnings": scan.warnings()}


def _newest_first(scan: LogScan, positions: list[int]) -> list[int]:
    """By ``records.recency`` (a tie by id, the same way on every machine, never by where a merge put the
    line), newest first."""
    return sorted(positions, key=lambda pos: (*recency(scan.records[pos]), pos), reverse=True)


def _hit(rec: "Record", retrieval: str) -> "Hit":
    return {"id": rec["id"], "score": 0.0, "retrieval": retrieval, "record": rec}


def hot_hits(scan: LogScan, now: float) -> "list[Hit]":
    """The live hot records that have not expired, newest first."""
    live = [p for p in scan.hot_positions() if expiry(scan.records[p], now) is None]
    return [_hit(scan.records[p], "hot") for p in _newest_first(scan, live)]


class Handoffs:
    """The positions of a log's handoff records, newest first, kept as the log grows: a per-turn read
    looks at the new records only, never at every record."""

    def __init__(self) -> None:
        self.generation = -1
        self.seen = 0
        self.order: list[tuple[float, str, int]] = []  # (created, id, position): ``recency``, newest first

    def newest(self, scan: LogScan) -> list[tuple[float, str, int]]:
        if scan.generation != self.generation or len(scan.records) < self.seen:  # the log was read again
            self.generation, self.seen, self.order = scan.generation, 0, []
        if len(scan.records) > self.seen:
            for pos in range(self.seen, len(scan.records)):
                rec = scan.records[pos]
                if rec["type"] == HANDOFF:
                    self.order.append((*recency(rec), pos))
            self.order.sort(reverse=True)
            self.seen = len(scan.records)
        return self.order

    def hits(self, scan: LogScan, now: float, skip: set[str], count: int) -> "list[Hit]":
        """The ``count`` newest live handoff records whose ids are not in ``skip``."""
        out: list[Hit] = []
        for _, _, pos in self.newest(scan) if count > 0 else ():
            rec = scan.records[pos]
            if pos not in scan.dead and rec["id"] not in skip and expiry(rec, now) is None:
                out.append(_hit(rec, "recent"))
                if len(out) == count:
                    break
        return out


def _cost(hits: "list[Hit]") -> int:
    return int(fit_budget(hits, 1 << 62)[1]["used"])


def _section(hits: "list[Hit]", limit: int, why: str, left_out: list[dict[str, Any]], name: str
             ) -> "ContextSection":
    kept, report = fit_budget(hits, max(limit, 0))
    left_out += [{**s, "section": name, "reason": why} for s in report["skipped"]]
    return {"hits": kept, "used": report["used"], "limit": max(limit, 0)}


def _relevant(mem: "Memory", text: str, k: int, taken: set[str], domain: str | None = None,
              scope: str | None = None) -> "QueryResult":
    """The query's answer with at least ``k`` hits not in ``taken`` where the memory has them: asked
    for ``k``, then for as many more as were taken (a larger k costs more), then for all of them."""
    result = mem.query(text, k=k, track=False, syntax=False, domain=domain, scope=scope)  # words, never operators
    for asked in (k + sum(h["id"] in taken for h in result["hits"]), k + len(taken)):
        hits = result["hits"]
        if len(hits) < result["query"]["k"] or sum(h["id"] not in taken for h in hits) >= k:
            break
        result = mem.query(text, k=min(MAX_K, asked), track=False, syntax=False, domain=domain, scope=scope)
    return result


def _hot(owners: "dict[str, Memory]", stale_factor: float, now: float) -> "list[Hit]":
    """The hot records of the memories read (``owners``): the project's, then the user memory's, each newest first."""
    out: list[Hit] = []
    for name, owner in owners.items():
        hits = hot_hits(owner.scan(), now)
        weigh_freshness(hits, owner.anchors, stale_factor)
        for hit in hits:
            hit["memory"] = name
        out += hits
    return out


def build_context(mem: "Memory", text: str, *, max_tokens: int, k: int, recent: int,
                  track: bool = True, domain: str | None = None, scope: str | None = None) -> "ContextResult":
    """One ``memory-context`` answer (see the module docstring)."""
    from . import usermemory

    now = time.time()
    owners = usermemory.opened(mem, scope)  # (each opened once, before anything is read or recorded)
    owner = next(iter(owners.values()))  # whose handoffs are recent: the project's (the user memory's alone)
    scan = owner.scan()
    hot_all = _hot(owners, mem.config.stale_factor, now)
    left_out: list[dict[str, Any]] = []
    hot = _section(hot_all, int(max_tokens * HOT_SHARE), "hot-share", left_out, "hot")
    taken = {h["id"] for h in hot["hits"]}
    result = _relevant(mem, text, k, taken, domain, scope)
    usermemory.still_read(owners, result)  # (the same memories as the hot records': else nothing is recorded)
    relevant_all = [h for h in result["hits"] if h["id"] not in taken][:k]
    handoffs = owner.handoffs.hits(scan, now, taken, recent)
    reserve = min(int(max_tokens * RECENT_SHARE), _cost(handoffs))
    relevant = _section(relevant_all, max_tokens - hot["used"] - reserve, "budget", left_out, "relevant")
    taken |= {h["id"] for h in relevant["hits"]}
    recent_all = owner.handoffs.hits(scan, now, taken, recent)
    weigh_freshness(recent_all, owner.anchors, mem.config.stale_factor)
    for hit in recent_all:
        hit["memory"] = owner.name
    latest = _section(recent_all, max_tokens - hot["used"] - relevant["used"], "budget", left_out, "recent")
    taken |= {h["id"] for h in latest["hits"]}
    mark_merged(hot["hits"] + latest["hits"], mem.git)
    warnings = result["warnings"]
    shown = hot["hits"] + relevant["hits"] + latest["hits"]
    for name, reader in owners.items():  # each memory counts its own records' retrievals
        ids = sorted({h["id"] for h in shown if h.get("memory", mem.name) == name})
        if track and ids and not reader.store.usage.record(ids):
            warnings.append({"code": codes.USAGE_NOT_RECORDED,
                             "message": "could not record this block's records as retrieved; retrievals are not "
                                        "counted"})
    out: ContextResult = {
        "query": {"text": text, "k": k, "recent": recent, "max_tokens": max_tokens},
        "sections": {"hot": hot, "relevant": relevant, "recent": latest},
        "budget": {"max_tokens": max_tokens, "used": hot["used"] + relevant["used"] + latest["used"],
                   "shares": {"hot": HOT_SHARE, "recent": RECENT_SHARE},
                   "left_out": [s for s in left_out if s["id"] not in taken]},
        "degraded": result["degraded"], "warnings": warnings}
    if "scope" in result:
        out["scope"] = result["scope"]
    return out


SECTION_TITLES = {"hot": "Hot memory (pinned: always included)", "relevant": "Relevant to this task",
                  "recent": "Recent handoffs (prior sessions)"}


def render_context(result: "ContextResult | dict[str, Any]") -> str:
    """A ``memory-context`` answer as one markdown block: each section's hits (``render_hit``), and
    what the JSON answer says about the answer itself (degraded, warnings, records left out)."""
    lines = [f"## Memory for this turn: {result['query']['text']}", ""]
    notes = answer_notes(result, "relevant hits by keyword matches only")
    budget = result["budget"]
    left = budget.get("left_out") or []
    if left:
        shown = first_ten(left, lambda s: f"{s['id']} ({s['section']}, {s['tokens']} tokens)")
        notes.append(f"> {len(left)} record(s) left out to fit max_tokens={budget['max_tokens']} (hot records take "
                     f"at most {round(budget['shares']['hot'] * 100)} %): {shown}.")
    if notes:
        lines += [*notes, ""]
    sections = cast("dict[str, ContextSection]", result["sections"])
    if not any(sections[name]["hits"] for name in SECTION_TITLES):
        lines.append("_No stored memory for this turn._")
        return "\n".join(lines) + "\n"
    lines += ["Memory is advisory: standing facts, then prior learnings and decisions, then what earlier sessions "
              "handed off.", ""]
    for name, title in SECTION_TITLES.items():
        hits = sections[name]["hits"]
        if hits:
            lines += [f"**{title}**", ""]
            lines += [render_hit(rank, hit) for rank, hit in enumerate(hits, start=1)]
    return "\n".join(lines).rstrip() + "\n"

"""``memory-harvest TRANSCRIPT``: what a working session leaves to keep (adr/0019).

The transcript is a JSONL file of turns (``{"role", "content"}``, or ``speaker``/``text``; content may
be a list of ``{"type": "text", "text"}`` parts) or any other text (markdown).  The generator writes one
episodic summary (a ``handoff`` record, domain ``episode``, whose body ends with the transcript's name
and the sha256 of its text) and the durable facts it finds (``learning`` records, domain ``fact``); every
record cites the transcript by the tag ``transcript:<sha256 prefix>`` (not in a fact's text, so a fact
already known is an exact duplicate and not stored twice) and goes through the normal write path (``Memory.index``: the reasoning guardrail, exact duplicates, near
duplicates).  A fact the guardrail refuses (only reasoning) is listed under ``refused``, the rest are
written.  Ids derive from the transcript's text, and the summary's id marks a transcript as harvested:
harvesting the same text again asks the generator nothing and writes nothing.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import codes
from ..errors import InputError
from ..records import validate_batch

if TYPE_CHECKING:
    from .memory import Memory

MAX_TRANSCRIPT_BYTES = 8 << 20
VERB = "memory-harvest"
TAGS = ["harvest"]


def _unreadable(path: str, why: str) -> InputError:
    return InputError(f"cannot read the transcript {path[:200]!r}: {why}", code=codes.HARVEST_TRANSCRIPT_UNREADABLE,
                      details={"path": path[:200]})


def _part_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _turns(text: str) -> str | None:
    """A JSONL transcript as ``role: content`` lines; None when ``text`` is not one."""
    lines = [line for line in text.splitlines() if line.strip()]
    out = []
    for line in lines:
        try:
            turn = json.loads(line)
        except ValueError:
            return None
        if not isinstance(turn, dict):
            return None
        who = turn.get("role") or turn.get("speaker") or turn.get("type") or "turn"
        said = _part_text(turn.get("content", turn.get("text", turn.get("message"))))
        if said.strip():
            out.append(f"{str(who)[:40]}: {said.strip()}")
    return "\n".join(out) if lines else None


def read_transcript(path: str) -> str:
    """The transcript's text (turns as ``role: content`` lines)."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_TRANSCRIPT_BYTES + 1)
    except (OSError, ValueError) as exc:
        raise _unreadable(path, exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)) from None
    if len(data) > MAX_TRANSCRIPT_BYTES:
        raise _unreadable(path, "it is larger than 8 MiB")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise _unreadable(path, "it is not UTF-8 text") from None
    turns = _turns(text)
    text = (turns if turns is not None else text).strip()
    if not text:
        raise InputError(f"the transcript {path[:200]!r} holds no text", code=codes.HARVEST_TRANSCRIPT_EMPTY,
                         details={"path": path[:200]})
    return text


def harvest(mem: "Memory", path: str) -> dict[str, Any]:
    """Write a transcript's summary and facts (see module docstring)."""
    from ..generate import make_generator
    from ..generate.tasks import harvest as ask

    mem.require_enabled()
    gen = make_generator(mem.config)  # generator-off before anything is read
    text = read_transcript(path)
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    summary_id = f"harvest:{digest[:24]}"
    transcript = {"path": path, "sha256": digest}
    scan = mem.scan()
    if summary_id in scan.position or summary_id in scan.redacted:
        ids = [r["id"] for r in scan.records if r["id"] == summary_id or r["id"].startswith(summary_id + ":")]
        return {"harvested": False, "already": True, "transcript": transcript, "ids": list(dict.fromkeys(ids)),
                "refused": [], "requests": 0, "written": None}
    found = ask(gen, text)
    cite = f"Source: transcript {Path(path).name} (sha256 {digest[:16]})"
    tags = [*TAGS, f"transcript:{digest[:16]}"]  # every record cites it; the facts' text stays theirs (dedup)
    raws = [{"id": f"{summary_id}:{i + 1}", "type": "learning", "domain": "fact", **fact} for i, fact in
            enumerate(found["facts"])]
    summary = found["summary"] or {"title": f"Session transcript {Path(path).name}"[:200], "body": ""}
    raws.append({"id": summary_id, "type": "handoff", "domain": "episode", **summary,
                 "body": f"{summary['body']}\n\n{cite}".strip()})
    valid, refused = [], []
    for raw in raws:
        # A fact is the model's reading of the transcript, not checked against a source: ASSUMED.  The summary
        # cites the transcript it summarises (its digest is in its body).
        raw.update(tags=tags, provenance="CITED" if raw["id"] == summary_id else "ASSUMED")
        try:
            valid += validate_batch([raw], mem.config.record_types)
        except InputError as exc:  # e.g. a fact that was only reasoning (record-only-reasoning)
            refused.append({"id": raw["id"], "title": raw["title"], "code": exc.code, "message": exc.message})
            if raw["id"] == summary_id:  # the summary marks the transcript as harvested: it is always written
                valid += validate_batch([{**raw, "title": f"Session transcript {Path(path).name}"[:200],
                                          "body": cite}], mem.config.record_types)
    written = mem.apply(valid, verb=VERB)
    return {"harvested": True, "already": False, "transcript": transcript, "ids": written["ids"],
            "refused": refused, "requests": gen.requests, "written": written}

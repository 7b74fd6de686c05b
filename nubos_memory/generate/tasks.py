"""What nubos-memory asks of the generator, and how each answer is read.

Every prompt asks for one JSON object and names its task on the system message's first line
(``Task: questions``), which costs a real model nothing and lets the tests' deterministic server
(``tests/chatserver.py``) answer without a model.  Answers are read leniently (the first ``{...}`` in
the text; a model may wrap it in prose or a code fence) and bounded; an answer that holds nothing
usable is :data:`UNUSABLE`, never an exception, so one odd answer does not stop a batch.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..limits import MAX_TITLE
from .chat import Generator

MAX_QUESTION = 300  # characters of one question
MAX_FACTS = 20  # durable facts taken from one transcript
MAX_TRANSCRIPT_CHARS = 48_000  # of a transcript sent to the model (its start and end are kept)
MAX_MERGED_BODY = 8_000
UNUSABLE: dict[str, Any] = {}


def _object(text: str) -> dict[str, Any]:
    """The first JSON object in ``text`` (an empty dict when there is none)."""
    start = text.find("{")
    while start != -1:
        try:
            found, _ = json.JSONDecoder().raw_decode(text, start)
        except ValueError:
            start = text.find("{", start + 1)
            continue
        return found if isinstance(found, dict) else UNUSABLE
    return UNUSABLE


def _line(value: Any, limit: int) -> str | None:
    """``value`` as one line of at most ``limit`` characters, or None when it is no text."""
    if not isinstance(value, str):
        return None
    text = " ".join(value.split())
    return text[:limit] if text else None


def _note(title: str, body: str) -> str:
    return f"Title: {title}\n{body}".strip()


QUESTIONS_PROMPT = ("Task: questions\n"
                    "You index the notes of a software project's memory. Write {n} short, different questions a "
                    "developer could ask that the note below answers, each one line. Answer with JSON only: "
                    "{{\"questions\": [\"...\"]}}")


def questions(gen: Generator, title: str, body: str, n: int) -> list[str]:
    """Up to ``n`` questions the note answers (HyPE); an empty list when the answer held none."""
    found = _object(gen.complete(QUESTIONS_PROMPT.format(n=n), _note(title, body), max_tokens=64 * n))
    items = found.get("questions")
    out: list[str] = []
    for item in items if isinstance(items, list) else []:
        line = _line(item, MAX_QUESTION)
        if line is not None and line not in out:
            out.append(line)
    return out[:n]


MERGE_PROMPT = ("Task: merge\n"
                "The notes below say nearly the same thing, some of them later corrections of others (the last "
                "is the newest). Write one note that states what is true now, keeping every detail that still "
                "holds and dropping what a later note corrected. Answer with JSON only: "
                "{\"title\": \"one line\", \"body\": \"the merged note\"}")


def merge(gen: Generator, notes: Sequence[tuple[str, str]]) -> dict[str, str]:
    """One note (``title``, ``body``) from several, oldest first; :data:`UNUSABLE` when the answer has no title."""
    text = "\n\n".join(f"--- note {i + 1}\n{_note(t, b)}" for i, (t, b) in enumerate(notes))
    found = _object(gen.complete(MERGE_PROMPT, text, max_tokens=2048))
    title = _line(found.get("title"), MAX_TITLE)
    body = found.get("body")
    if title is None:
        return UNUSABLE
    return {"title": title, "body": body.strip()[:MAX_MERGED_BODY] if isinstance(body, str) else ""}


HARVEST_PROMPT = ("Task: harvest\n"
                  "Below is the transcript of a working session of a coding agent. Write (1) a short summary of "
                  "the session: what was asked, what was done, what is left; (2) the durable facts worth "
                  "remembering in later sessions (decisions, conventions, pitfalls, commands), each a title and "
                  "a body; leave out anything only true during the session. Answer with JSON only: "
                  "{\"summary\": {\"title\": \"...\", \"body\": \"...\"}, "
                  "\"facts\": [{\"title\": \"...\", \"body\": \"...\"}]}")


def harvest(gen: Generator, transcript: str) -> dict[str, Any]:
    """``{"summary": {title, body} | None, "facts": [{title, body}]}`` from a transcript's text."""
    if len(transcript) > MAX_TRANSCRIPT_CHARS:  # the start (the task) and the end (the outcome) matter most
        half = MAX_TRANSCRIPT_CHARS // 2
        transcript = transcript[:half] + "\n[...]\n" + transcript[-half:]
    found = _object(gen.complete(HARVEST_PROMPT, transcript, max_tokens=4096))
    return {"summary": _titled(found.get("summary")),
            "facts": [f for f in map(_titled, found.get("facts") or [] if isinstance(found.get("facts"), list)
                                     else []) if f is not None][:MAX_FACTS]}


def _titled(value: Any) -> dict[str, str] | None:
    if not isinstance(value, dict):
        return None
    title = _line(value.get("title"), MAX_TITLE)
    body = value.get("body")
    return None if title is None else {"title": title, "body": body.strip() if isinstance(body, str) else ""}

"""Markdown knowledge files → chunks, deterministically.

* YAML frontmatter (between ``---`` lines at the top) is read with
  ``yaml.safe_load``, which builds plain data and never runs code.  Known
  keys: ``category`` (a word), ``importance`` (0–1), ``tags`` (a list or a
  comma-separated string), ``title`` (one line: the document's title, before
  its ``#`` heading); others (``last_updated``, …) are ignored.
* The text is split on ``##`` headings outside fenced code blocks; each chunk
  keeps its heading.  Text before the first ``##`` is a chunk of its own under
  the ``#`` title (or the file name).  A file without ``##`` headings is one
  section.
* A section longer than ``MAX_CHUNK_TOKENS`` (by ``tokenize.estimate_tokens``,
  characters / 4) is cut at paragraph boundaries (a fenced code block is one
  paragraph), then sentences, then words; every piece starts with the heading.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ..embed.chunking import char_estimate_starts, split_for_window
from ..records import valid_importance

MAX_CHUNK_TOKENS = 500

_FENCE = re.compile(r"^\s{0,3}(```|~~~)")
_H1 = re.compile(r"^#\s+(.+?)\s*#*\s*$")
_H2 = re.compile(r"^##\s+(.+?)\s*#*\s*$")


class FrontmatterError(ValueError):
    """The frontmatter is not valid YAML or a known key has a bad value."""


@dataclass
class Chunk:
    heading: str
    text: str  # heading line + content, as indexed
    index: int
    lines: tuple[int, int] | None = None  # the section's first and last non-blank line in the file (1-based)


@dataclass
class Document:
    title: str
    category: str | None = None
    importance: float | None = None
    tags: list[str] = field(default_factory=list)
    chunks: list[Chunk] = field(default_factory=list)


def parse_frontmatter(text: str) -> tuple[dict[str, Any], str]:
    """``(frontmatter, rest)``; no frontmatter gives ``({}, text)``."""
    if not text.startswith("---"):
        return {}, text
    lines = text.split("\n")
    if lines[0].strip() != "---":
        return {}, text
    for i in range(1, len(lines)):
        if lines[i].strip() in ("---", "..."):
            import yaml

            try:
                meta = yaml.safe_load("\n".join(lines[1:i])) or {}
            except yaml.YAMLError as exc:
                raise FrontmatterError(f"frontmatter is not valid YAML: {str(exc).splitlines()[0]}") from None
            if not isinstance(meta, dict):
                raise FrontmatterError("frontmatter must be a mapping of keys to values")
            return meta, "\n".join(lines[i + 1:])
    return {}, text  # an opening line without a closing one: plain text


def _known(meta: dict[str, Any]) -> tuple[str | None, float | None, list[str]]:
    category = meta.get("category")
    if category is not None and (not isinstance(category, str) or not re.fullmatch(r"[\w.-]{1,64}", category)):
        raise FrontmatterError(f"category must be a single word, got {category!r}")
    importance = meta.get("importance")
    if importance is not None:
        if not valid_importance(importance):
            raise FrontmatterError(f"importance must be a number from 0 to 1, got {importance!r}")
        importance = float(importance)
    tags = meta.get("tags") or []
    if isinstance(tags, str):
        tags = [t.strip() for t in tags.split(",")]
    if not isinstance(tags, list) or not all(isinstance(t, (str, int)) for t in tags):
        raise FrontmatterError("tags must be a list of words")
    return category, importance, [str(t).strip() for t in tags if str(t).strip()]


def _sections(body: str) -> tuple[str | None, list[tuple[str | None, list[str]]], list[list[int]]]:
    """The ``#`` title, ``(heading, lines)`` per ``##`` section (heading None: before any), and the
    index in ``body`` of each of a section's lines."""
    title = None
    sections: list[tuple[str | None, list[str]]] = [(None, [])]
    numbers: list[list[int]] = [[]]
    fenced = False
    for number, line in enumerate(body.split("\n")):
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            h2 = _H2.match(line)
            if h2:
                sections.append((h2.group(1), [line]))
                numbers.append([number])
                continue
            h1 = _H1.match(line)
            if h1 and title is None:
                title = h1.group(1)
                continue
        sections[-1][1].append(line)
        numbers[-1].append(number)
    return title, sections, numbers


def _span(lines: list[str], numbers: list[int], offset: int) -> tuple[int, int] | None:
    """The 1-based file lines of a section's non-blank part (``offset``: the lines before the body)."""
    used = [n for n, line in zip(numbers, lines) if line.strip()]
    return (offset + used[0] + 1, offset + used[-1] + 1) if used else None


def _blocks(text: str, start: int) -> list[tuple[int, int]]:
    """Paragraph spans of ``text[start:]``; a fenced code block is one span."""
    spans: list[tuple[int, int]] = []
    pos, begin, fenced = start, None, False
    for line in text[start:].split("\n"):
        end = pos + len(line)
        if _FENCE.match(line):
            fenced = not fenced
        if line.strip() or fenced:
            if begin is None:
                begin = pos
        elif begin is not None:
            spans.append((begin, pos - 1 if pos > begin else pos))
            begin = None
        pos = end + 1
    if begin is not None:
        spans.append((begin, len(text)))
    return [(a, b) for a, b in spans if b > a]


def chunk_markdown(text: str, name: str, max_tokens: int = MAX_CHUNK_TOKENS) -> Document:
    """Parse a markdown file's text (see module docstring); ``name`` titles a file without ``#``."""
    meta, body = parse_frontmatter(text.replace("\r\n", "\n").replace("\r", "\n"))
    category, importance, tags = _known(meta)
    title, sections, numbers = _sections(body)
    offset = text.replace("\r\n", "\n").replace("\r", "\n").count("\n") - body.count("\n")  # frontmatter lines
    given = meta.get("title")
    if isinstance(given, str) and given.strip() and "\n" not in given.strip():
        title = given.strip()
    doc = Document(title=title or name, category=category, importance=importance, tags=tags)
    for (heading, lines), at in zip(sections, numbers):
        span = _span(lines, at, offset)
        content = "\n".join(lines).strip()
        if not content:
            continue
        if heading is None:  # the preamble: give it the document's title as its heading line
            heading = doc.title
            content = f"# {heading}\n{content}"
        first_nl = content.find("\n")
        blocks = _blocks(content, first_nl + 1) if first_nl >= 0 else None
        for piece in split_for_window(content, char_estimate_starts(content), max_tokens, blocks):
            doc.chunks.append(Chunk(heading=heading, text=piece.strip(), index=len(doc.chunks), lines=span))
    return doc

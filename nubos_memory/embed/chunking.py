"""Cutting text into pieces that fit a token budget, deterministically.

Used to embed a record longer than the model's window (``split_for_window``:
every piece is embedded and the record's vector pools them, see
``embedders.py`` and adr/0002).  Pieces end at paragraph breaks, then
sentence ends, then spaces, and only as a last resort inside a run of text
with no spaces (CJK, a long URL), always at a token boundary.

Token counts come from the tokenizer itself as the character offset where
each token starts, so a span's count is exact: the tokens that start
inside it.
"""

from __future__ import annotations

import itertools
import re
from bisect import bisect_left
from collections.abc import Callable, Sequence

# A paragraph break, or the end of a sentence followed by what starts one.
_BREAK = re.compile(r"\n\s*\n|(?<=[.!?])\s+(?=[\"'(\[A-Z0-9])|\n")
_WORD = re.compile(r"\S+")


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """The non-empty sentences and lines of ``text`` as ``(start, end)`` spans, cut where pieces may
    end (paragraph breaks, sentence ends, line breaks: ``_BREAK``)."""
    return _spans(text, 0, len(text), _BREAK, matches_are_units=False)


class _Counter:
    """Tokens starting in a character span, from the sorted token start offsets."""

    def __init__(self, starts: Sequence[int]):
        self.starts = starts

    def __call__(self, a: int, b: int) -> int:
        return bisect_left(self.starts, b) - bisect_left(self.starts, a)


def _spans(text: str, a: int, b: int, pattern: re.Pattern[str], *, matches_are_units: bool) -> list[tuple[int, int]]:
    """Non-empty sub-spans of ``text[a:b]``: the matches, or the text between matches."""
    out: list[tuple[int, int]] = []
    if matches_are_units:
        for m in pattern.finditer(text, a, b):
            out.append((m.start(), m.end()))
        return out
    pos = a
    for m in pattern.finditer(text, a, b):
        if m.start() > pos and text[pos:m.start()].strip():
            out.append((pos, m.start()))
        pos = m.end()
    if pos < b and text[pos:b].strip():
        out.append((pos, b))
    return out


def _units(text: str, a: int, b: int, count: _Counter, room: int,
           blocks: list[tuple[int, int]] | None = None) -> list[tuple[int, int]]:
    """Spans no longer than ``room`` tokens: ``blocks`` (default: paragraphs, lines and
    sentences) that fit, else their words, else runs of tokens."""
    out: list[tuple[int, int]] = []
    for s, e in blocks if blocks is not None else _spans(text, a, b, _BREAK, matches_are_units=False):
        if count(s, e) <= room:
            out.append((s, e))
            continue
        if blocks is not None:  # an oversized block: fall back to its sentences
            out.extend(_units(text, s, e, count, room))
            continue
        for ws, we in _spans(text, s, e, _WORD, matches_are_units=True):
            if count(ws, we) <= room:
                out.append((ws, we))
                continue
            first = bisect_left(count.starts, ws)
            last = bisect_left(count.starts, we)
            for i in range(first, last, room):  # cut at token starts: no token is split
                start = ws if i == first else count.starts[i]
                end = we if i + room >= last else count.starts[i + room]
                out.append((start, end))
    return out


def split_for_window(text: str, token_starts: Sequence[int], limit: int,
                     blocks: list[tuple[int, int]] | None = None) -> list[str]:
    """Pieces of ``text`` that each fit ``limit`` tokens (``text`` itself when it fits).

    ``token_starts`` are the sorted character offsets at which ``text``'s
    tokens start.  The first line (a record's title, a section's heading) is
    repeated at the head of every piece, so each piece says what it is about,
    unless it would take more than half the budget.  Pieces are packed
    greedily from the front, from ``blocks`` (spans after the first line that
    should stay whole when they fit, e.g. markdown paragraphs and code
    blocks) or, by default, from paragraphs, lines and sentences.
    """
    if len(token_starts) <= limit:
        return [text]
    count = _Counter(token_starts)
    prefix, room = _head(text, count, limit)
    if blocks is not None and not prefix:
        blocks = None  # the first line is no prefix: let every line be a unit
    return [prefix + text[s:e] for s, e in _packed(text, len(prefix), count, room, blocks)] or [text]


def overlapping_pieces(text: str, token_starts: Sequence[int], limit: int) -> list[str]:
    """Pieces of ``text`` of at most ``limit`` tokens that overlap by about half (``text`` itself when
    it fits): the body is packed as :func:`split_for_window` packs it, into halves of the room, and
    each piece is two consecutive halves, under the repeated first line.  Best-piece scoring reads a
    long record through these (``pooling.embed_parts_with``; adr/0002): a topic that starts in the
    middle of one piece is whole in the next."""
    if len(token_starts) <= limit:
        return [text]
    count = _Counter(token_starts)
    prefix, room = _head(text, count, limit)
    if room < 2:  # no two halves fit: the window's own pieces
        return split_for_window(text, token_starts, limit)
    halves = _packed(text, len(prefix), count, room // 2, None)
    if len(halves) < 2:
        return [prefix + text[s:e] for s, e in halves] or [text]
    return [prefix + text[a[0]:b[1]] for a, b in itertools.pairwise(halves)]


def _head(text: str, count: _Counter, limit: int) -> tuple[str, int]:
    """The first line to repeat at the head of each piece ("" when it would take more than half of
    ``limit``), and the tokens left for the rest."""
    nl = text.find("\n")
    head = nl + 1 if nl >= 0 else 0
    if count(0, head) > limit // 2:
        head = 0
    return text[:head], limit - count(0, head)


def _packed(text: str, head: int, count: _Counter, room: int, blocks: list[tuple[int, int]] | None
            ) -> list[tuple[int, int]]:
    """The spans of ``text[head:]`` that pieces hold: its units (``_units``) packed greedily from the
    front, each span at most ``room`` tokens."""
    spans: list[tuple[int, int]] = []
    cur: tuple[int, int] | None = None
    for s, e in _units(text, head, len(text), count, room, blocks):
        if cur is not None and count(cur[0], e) <= room:
            cur = (cur[0], e)
            continue
        if cur is not None:
            spans.append(cur)
        cur = (s, e)
    if cur is not None:
        spans.append(cur)
    return spans


def char_estimate_starts(text: str, chars_per_token: int = 4) -> list[int]:
    """Pseudo token starts for the ``characters / 4`` estimate (``tokenize.estimate_tokens``)."""
    return list(range(0, len(text), chars_per_token))


def word_starts(text: str, count_tokens: Callable[[str], Sequence[object]]) -> list[int]:
    """Token start offsets for a tokenizer that cannot report offsets: each
    whitespace-separated word's tokens are all placed at the word's start."""
    starts: list[int] = []
    for m in _WORD.finditer(text):
        starts.extend([m.start()] * len(count_tokens(m.group())))
    return starts

"""Cutting long text into window-sized pieces: every piece fits, nothing is lost or reordered."""

from __future__ import annotations

import itertools
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nubos_memory.embed.chunking import overlapping_pieces, split_for_window, word_starts
from nubos_memory.embed.model import pool_pieces


def char_starts(text: str) -> list[int]:
    """A tokenizer that makes every non-space character a token (like CJK in WordPiece)."""
    return [i for i, ch in enumerate(text) if not ch.isspace()]


def whitespace_starts(text: str) -> list[int]:
    return word_starts(text, lambda w: [w])


def count(text: str, starts_of) -> int:
    return len(starts_of(text))


def test_text_that_fits_is_one_piece_unchanged():
    text = "Title\nshort body."
    assert split_for_window(text, whitespace_starts(text), 10) == [text]


def test_sentences_are_packed_and_the_title_repeated():
    body = " ".join(f"Sentence number {i} ends here." for i in range(12))
    text = "Release pipeline\n" + body
    pieces = split_for_window(text, whitespace_starts(text), 20)
    assert len(pieces) > 1
    for p in pieces:
        assert p.startswith("Release pipeline\n")
        assert count(p, whitespace_starts) <= 20
        assert p.rstrip().endswith(".")  # cut at sentence ends, never mid-sentence here
    assert " ".join(p.split("\n", 1)[1] for p in pieces) == body


def test_text_without_spaces_is_cut_at_token_boundaries():
    text = "标题\n" + "东京是日本的首都" * 30
    pieces = split_for_window(text, char_starts(text), 50)
    assert all(count(p, char_starts) <= 50 for p in pieces)
    assert "".join(p.split("\n", 1)[1] for p in pieces) == text.split("\n", 1)[1]


def test_an_overlong_title_is_not_repeated():
    text = ("word " * 40).strip() + "\n" + "body " * 100
    pieces = split_for_window(text, whitespace_starts(text), 50)
    assert all(count(p, whitespace_starts) <= 50 for p in pieces)
    assert sum(count(p, whitespace_starts) for p in pieces) == count(text, whitespace_starts)


words = st.text(alphabet=st.sampled_from("abcXYZ.!?東京 \n"), min_size=0, max_size=12)


@settings(max_examples=300, deadline=None)
@given(title=st.text(alphabet="abc ", min_size=1, max_size=20), body=st.lists(words, max_size=80),
       limit=st.integers(min_value=4, max_value=40), per_char=st.booleans())
def test_pieces_fit_and_keep_every_token_in_order(title, body, limit, per_char):
    text = title.replace("\n", " ") + "\n" + " ".join(body)
    starts_of = char_starts if per_char else whitespace_starts
    pieces = split_for_window(text, starts_of(text), limit)
    assert pieces == split_for_window(text, starts_of(text), limit)  # deterministic
    if len(pieces) == 1 and pieces[0] == text:
        assert count(text, starts_of) <= limit or not text.strip()
        return
    head = text[: text.index("\n") + 1]
    prefix = head if count(head, starts_of) <= limit // 2 else ""
    for p in pieces:
        assert p.startswith(prefix)
        assert count(p, starts_of) <= limit
    # The bodies of the pieces, in order, hold exactly the body's tokens.
    body_text = text[len(prefix):]
    got = "".join(p[len(prefix):] for p in pieces)
    assert re.sub(r"\s+", "", got) == re.sub(r"\s+", "", body_text)


@settings(max_examples=300, deadline=None)
@given(title=st.integers(min_value=1, max_value=8),
       ends=st.lists(st.sampled_from(["", "", ".", "\n", "!"]), max_size=80),
       limit=st.integers(min_value=4, max_value=40))
def test_overlapping_pieces_fit_overlap_by_half_and_cover_the_text(title, ends, limit):
    # Words that are all different, so where two pieces overlap is plain to see.
    body = " ".join(f"W{i}{end}" for i, end in enumerate(ends))
    text = " ".join(f"T{i}" for i in range(title)) + "\n" + body
    starts = whitespace_starts(text)
    pieces = overlapping_pieces(text, starts, limit)
    assert pieces == overlapping_pieces(text, starts, limit)  # deterministic
    if len(starts) <= limit:
        assert pieces == [text]
        return
    head = text[: text.index("\n") + 1]
    prefix = head if count(head, whitespace_starts) <= limit // 2 else ""
    room = limit - count(prefix, whitespace_starts)
    assert all(p.startswith(prefix) and count(p, whitespace_starts) <= limit for p in pieces)
    words = [p[len(prefix):].split() for p in pieces]
    # Each piece is two halves: the second half of one is the first half of the next, at most half the room.
    for a, b in itertools.pairwise(words):
        shared = [w for w in a if w in set(b)]
        assert shared and shared == b[:len(shared)] == a[len(a) - len(shared):]
        assert len(shared) <= max(1, room // 2)
    # Every word of the body is in some piece, in order.
    seen = [w for i, ws in enumerate(words) for w in ws if i == 0 or w not in set(words[i - 1])]
    assert seen == text[len(prefix):].split()


@pytest.mark.parametrize("limit", [1, 2, 3])
def test_overlapping_pieces_fit_a_tiny_limit(limit):
    for text in ("a\nb c d e f g", "title words\nb c d e f g", "b c d e f g"):
        assert all(count(p, whitespace_starts) <= limit for p in overlapping_pieces(text, whitespace_starts(text), limit))


def test_overlapping_pieces_of_a_long_record():
    body = " ".join(f"Sentence number {i} ends here." for i in range(12))  # 5 words each
    text = "Release pipeline\n" + body
    pieces = overlapping_pieces(text, whitespace_starts(text), 22)  # 20 words of room: halves of 10
    assert [p.split("\n", 1)[1] for p in pieces] == [
        " ".join(f"Sentence number {i} ends here." for i in range(j, j + 4)) for j in range(0, 10, 2)]


def test_pool_weights_the_first_piece_twice_and_normalises():
    v = np.eye(3, dtype=np.float32)
    out = pool_pieces(v, np.array([0, 0, 1]), 2)
    assert out[0] == pytest.approx(np.array([2, 1, 0]) / np.sqrt(5))
    assert out[1] == pytest.approx(np.array([0, 0, 1]))

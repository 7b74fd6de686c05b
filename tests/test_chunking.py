"""Cutting long text into window-sized pieces: every piece fits, nothing is lost or reordered."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nubos_memory.embed.chunking import split_for_window, word_starts
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


def test_pool_weights_the_first_piece_twice_and_normalises():
    v = np.eye(3, dtype=np.float32)
    out = pool_pieces(v, np.array([0, 0, 1]), 2)
    assert out[0] == pytest.approx(np.array([2, 1, 0]) / np.sqrt(5))
    assert out[1] == pytest.approx(np.array([0, 0, 1]))

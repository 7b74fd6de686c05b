"""Pooling: token vectors into a piece's vector, and a text's pieces into the text's vector.

``pool`` is sentence-transformers' Pooling module in numpy (the ONNX runtime's;
torch runs the model's own).  A text longer than the model's window is cut into
pieces that fit (``chunking.py``, at the offsets the runtime's tokenizer
reports), each piece is embedded, and the text's vector is their mean with the
first piece counted twice, normalised (``pool_pieces``; adr/0002 has the
SciFact numbers).  A ``Runtime`` (``torch_runtime.py``, ``onnx_runtime.py``)
only tokenises and encodes pieces; ``embed_with`` does the rest.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from .chunking import split_for_window

FIRST_PIECE_WEIGHT = 2.0


class Runtime(Protocol):
    """What computes a model's vectors: a second runtime implements these and nothing else."""

    name: str
    device: str
    window: int  # tokens per piece (the model's max length minus its special tokens); known after load
    dim: int

    def load(self) -> None:
        """Load the model (raise ``EmbeddingError`` if it cannot be)."""

    def token_starts(self, texts: list[str]) -> list[list[int]]:
        """The character offset where each token of each text starts (no special tokens)."""

    def encode(self, texts: list[str]) -> np.ndarray:
        """Unit vectors, float32, of texts that each fit the window."""


def pool(hidden: np.ndarray, mask: np.ndarray, modes: list[str]) -> np.ndarray:
    """sentence-transformers' Pooling in numpy (float32, as torch computes it)."""
    out = []
    m = mask.astype(hidden.dtype)[:, :, None]
    for mode in modes:
        if mode == "cls":
            out.append(hidden[np.arange(hidden.shape[0]), mask.argmax(axis=1)])
        elif mode == "max":
            out.append(np.where(m > 0, hidden, -np.inf).max(axis=1).astype(hidden.dtype))
        else:  # mean, mean_sqrt_len_tokens
            total = (hidden * m).sum(axis=1)
            count = np.maximum(m.sum(axis=1), 1e-9)
            out.append(total / (count if mode == "mean" else np.sqrt(count)))
    return np.concatenate(out, axis=-1) if len(out) > 1 else out[0]


def pieces_for(runtime: Runtime, texts: list[str]) -> tuple[list[str], list[int]]:
    """Every text cut into pieces that fit the runtime's window (``chunking.split_for_window``, at its
    tokenizer's token offsets), and the text each piece belongs to."""
    pieces: list[str] = []
    owner: list[int] = []
    for i, (text, starts) in enumerate(zip(texts, runtime.token_starts(texts))):
        for piece in split_for_window(text, starts, runtime.window):
            pieces.append(piece)
            owner.append(i)
    return pieces, owner


def embed_with(runtime: Runtime, texts: list[str]) -> np.ndarray:
    """One unit vector per text: texts that fit the window as they are, longer ones in pooled pieces."""
    return embed_parts_with(runtime, texts)[0]


def embed_parts_with(runtime: Runtime, texts: list[str]) -> "tuple[np.ndarray, dict[int, np.ndarray]]":
    """:func:`embed_with`, and the piece vectors of every text longer than the window, by text
    (``(pieces, dim)``, in text order): what best-piece scoring keeps (``index/vectors.py``)."""
    # A query: most fit the window.  A character is at most 4 tokens (UTF-8 bytes, for byte-level
    # tokenizers), so a short text fits for sure; a longer one is counted.
    if len(texts) == 1 and (4 * len(texts[0]) <= runtime.window
                            or len(runtime.token_starts(texts)[0]) <= runtime.window):
        return runtime.encode(texts), {}
    pieces, owner = pieces_for(runtime, texts)
    return pooled_parts(runtime.encode(pieces), owner, len(texts))


def pooled_parts(vecs: np.ndarray, owner: "list[int] | np.ndarray", n: int
                 ) -> "tuple[np.ndarray, dict[int, np.ndarray]]":
    """``n`` texts' vectors from their pieces' (``vecs``, the text each belongs to: ``owner``), and the
    pieces of the texts that have several (what :func:`embed_parts_with` returns)."""
    if len(vecs) == n:  # everything fit the window: nothing to pool
        return vecs, {}
    rows = np.asarray(owner)
    return pool_pieces(vecs, rows, n), several_pieces(vecs, rows)


def several_pieces(vecs: np.ndarray, owner: np.ndarray) -> dict[int, np.ndarray]:
    """The piece vectors of each text that has more than one piece, by text."""
    counts = np.bincount(owner) if len(owner) else np.zeros(0, dtype=np.int64)
    return {int(t): np.ascontiguousarray(vecs[owner == t], dtype=np.float32) for t in np.flatnonzero(counts > 1)}


def pool_pieces(vecs: np.ndarray, owner: np.ndarray, n: int) -> np.ndarray:
    """One unit vector per text: the mean of its pieces' vectors, the first piece weighted
    ``FIRST_PIECE_WEIGHT`` (it holds the title and the opening, usually the point)."""
    weights = np.ones(len(owner), dtype=np.float64)
    weights[np.r_[True, owner[1:] != owner[:-1]]] = FIRST_PIECE_WEIGHT
    pooled = np.zeros((n, vecs.shape[1]), dtype=np.float64)
    np.add.at(pooled, owner, vecs * weights[:, None])
    pooled /= np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
    out = pooled.astype(np.float32)
    single = np.bincount(owner, minlength=n) == 1  # a text of one piece keeps its vector bit for bit
    firsts = np.flatnonzero(np.r_[True, owner[1:] != owner[:-1]])
    rows = firsts[single[owner[firsts]]]
    out[owner[rows]] = vecs[rows]
    return out

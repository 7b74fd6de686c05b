"""Pooling: token vectors into a piece's vector, and a text's pieces into the text's vector.

``pool`` is sentence-transformers' Pooling module in numpy (the ONNX runtime's;
torch runs the model's own).  A text longer than the model's window is cut into
pieces that fit (``chunking.py``, at the offsets the runtime's tokenizer
reports), each piece is embedded, and the text's vector is their mean with the
first piece counted twice, normalised (``pool_pieces``; adr/0002 has the
SciFact numbers).  For best-piece scoring (``index/vectors.py``) a text longer than
half the window is also cut into pieces of half the window that overlap by half
(``best_pieces_for``), whose vectors ``embed_parts_with`` returns beside the pooled
ones.  A ``Runtime`` (``torch_runtime.py``, ``onnx_runtime.py``) only tokenises and
encodes pieces; ``embed_with`` and ``embed_parts_with`` do the rest.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np

from .chunking import overlapping_pieces, split_for_window

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


def pieces_for(runtime: Runtime, texts: list[str], starts: list[list[int]] | None = None
               ) -> tuple[list[str], list[int]]:
    """Every text cut into pieces that fit the runtime's window (``chunking.split_for_window``, at its
    tokenizer's token offsets ``starts``, asked of the runtime when not given), and the text each
    piece belongs to: what the pooled vector is made of."""
    return _cut(texts, runtime.token_starts(texts) if starts is None else starts,
                lambda text, at: split_for_window(text, at, runtime.window))


def best_pieces_for(runtime: Runtime, texts: list[str], starts: list[list[int]] | None = None
                    ) -> tuple[list[str], list[int]]:
    """The pieces best-piece scoring keeps (``PIECE_RULE``, index/vectors.py) of every text longer than
    half the runtime's window: pieces of half the window overlapping by half
    (``chunking.overlapping_pieces``), and the text each belongs to.  A shorter text has none."""
    half = best_piece_window(runtime)
    at = runtime.token_starts(texts) if starts is None else starts
    longer = [i for i, s in enumerate(at) if len(s) > half]
    pieces, owner = _cut([texts[i] for i in longer], [at[i] for i in longer],
                         lambda text, s: overlapping_pieces(text, s, half))
    return pieces, [longer[o] for o in owner]


def best_piece_window(runtime: Runtime) -> int:
    """Tokens per best-piece piece: half the model's window (127 for MiniLM's 254, near the 128 it was
    trained on; adr/0002 measured pieces of the whole window and of half of it)."""
    return max(1, runtime.window // 2)


def _cut(texts: list[str], starts: list[list[int]], cut: "Callable[[str, list[int]], list[str]]"
         ) -> tuple[list[str], list[int]]:
    pieces: list[str] = []
    owner: list[int] = []
    for i, (text, at) in enumerate(zip(texts, starts)):
        for piece in cut(text, at):
            pieces.append(piece)
            owner.append(i)
    return pieces, owner


def embed_with(runtime: Runtime, texts: list[str]) -> np.ndarray:
    """One unit vector per text: texts that fit the window as they are, longer ones in pooled pieces."""
    starts = _starts(runtime, texts, runtime.window)
    if starts is None:
        return runtime.encode(texts)
    pieces, owner = pieces_for(runtime, texts, starts)
    return pooled(runtime.encode(pieces), owner, len(texts))


def embed_parts_with(runtime: Runtime, texts: list[str]) -> "tuple[np.ndarray, dict[int, np.ndarray]]":
    """:func:`embed_with`, and the best-piece vectors (:func:`best_pieces_for`) of every text longer
    than half the window, by text (``(pieces, dim)``, in text order): what best-piece scoring keeps
    (``index/vectors.py``).  The pooled vectors are :func:`embed_with`'s, bit for bit (their pieces are
    encoded as it encodes them: the best pieces in a call of their own)."""
    starts = _starts(runtime, texts, best_piece_window(runtime))
    if starts is None:
        return runtime.encode(texts), {}
    pieces, owner = pieces_for(runtime, texts, starts)
    best, best_owner = best_pieces_for(runtime, texts, starts)
    return pooled(runtime.encode(pieces), owner, len(texts)), kept_pieces(runtime.encode, best, best_owner)


def _starts(runtime: Runtime, texts: list[str], window: int) -> list[list[int]] | None:
    """The texts' token starts, or None for one text (a query, a note) that fits ``window`` tokens: a
    character is at most 4 tokens (UTF-8 bytes, for byte-level tokenizers), so a short one is not even
    tokenised."""
    if len(texts) == 1 and 4 * len(texts[0]) <= window:
        return None
    starts = runtime.token_starts(texts)
    return None if len(texts) == 1 and len(starts[0]) <= window else starts


def pooled(vecs: np.ndarray, owner: "list[int] | np.ndarray", n: int) -> np.ndarray:
    """``n`` texts' vectors from their pieces' (``vecs``; ``owner``: the text each belongs to):
    :func:`pool_pieces`, unless every text is one piece."""
    return vecs if len(vecs) == n else pool_pieces(vecs, np.asarray(owner), n)


def kept_pieces(embed: "Callable[[list[str]], np.ndarray]", pieces: list[str], owner: list[int]
                ) -> dict[int, np.ndarray]:
    """What best-piece scoring keeps of ``pieces`` (``owner``: the text each belongs to): their vectors
    by text, for each text with several (:func:`several_pieces`); nothing is embedded when there are none."""
    return several_pieces(embed(pieces), np.asarray(owner, dtype=np.int64)) if pieces else {}


def pooled_parts(vecs: np.ndarray, owner: "list[int] | np.ndarray", n: int
                 ) -> "tuple[np.ndarray, dict[int, np.ndarray]]":
    """:func:`pooled`, and the pieces of the texts that have several, from the same pieces (the hash
    double's rule: ``hashing.ParagraphHashEmbedder``)."""
    return pooled(vecs, owner, n), ({} if len(vecs) == n else several_pieces(vecs, np.asarray(owner)))


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

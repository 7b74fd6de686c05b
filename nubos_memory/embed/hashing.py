"""The deterministic test double: feature hashing of words and character trigrams (``hash-<dim>``).

Instant and dependency-free, so most tests need no model; also an offline
fallback (``memory.provider: hash``).  Its vectors mean little, but the same
text always gives the same vector, and texts sharing words or spellings are
close.
"""

from __future__ import annotations

import hashlib
from collections import Counter

import numpy as np

from .. import codes
from ..errors import EmbeddingError
from ..tokenize import tokenize
from .base import Embedder


class HashEmbedder(Embedder):
    """Deterministic bag of hashed words and character trigrams (model ``hash-<dim>``)."""

    provider = "hash"

    def __init__(self, model_id: str = "hash-256"):
        super().__init__(model_id)
        try:
            self._dim = int(model_id.rsplit("-", 1)[1]) if model_id.startswith("hash-") else 256
        except ValueError:
            self._dim = 256
        if not 8 <= self._dim <= 4096:
            raise EmbeddingError(f"hash embedder dimension must be 8..4096, got {model_id!r}",
                                 code=codes.EMBEDDING_UNAVAILABLE, details={"model": model_id})

    @property
    def dim(self) -> int:
        return self._dim

    def _features(self, text: str) -> list[str]:
        feats: list[str] = []
        for tok in tokenize(text):
            feats.append("w:" + tok)
            padded = f"#{tok}#"
            feats.extend("c:" + padded[i: i + 3] for i in range(len(padded) - 2))
        return feats

    def embed(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), self._dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for feat in self._features(text):
                h = int.from_bytes(hashlib.blake2b(feat.encode("utf-8"), digest_size=8).digest(), "little")
                weight = 1.0 if feat.startswith("w:") else 0.5
                out[row, h % self._dim] += weight if (h >> 63) & 1 else -weight
            norm = float(np.linalg.norm(out[row]))
            if norm > 0:
                out[row] /= norm
        return out


class ParagraphHashEmbedder(HashEmbedder):
    """The hash double that cuts a text at blank lines into pieces, as a model cuts a long text at its
    window, and pools them as the model does (``pooling.pool_pieces``): the double of best-piece
    scoring (``index/vectors.py``) for tests and benchmarks."""

    def embed_parts(self, texts: list[str]) -> tuple[np.ndarray, dict[int, np.ndarray]]:
        from .pooling import pooled_parts

        pieces, owner = self._paragraphs(texts)
        return pooled_parts(HashEmbedder.embed(self, pieces), owner, len(texts))

    def best_pieces(self, texts: list[str]) -> tuple[list[str], list[int]]:
        pieces, owner = self._paragraphs(texts)
        counts = Counter(owner)
        several = {o for o, n in counts.items() if n > 1}
        return [p for p, o in zip(pieces, owner) if o in several], [o for o in owner if o in several]

    @staticmethod
    def _paragraphs(texts: list[str]) -> tuple[list[str], list[int]]:
        pieces: list[str] = []
        owner: list[int] = []
        for i, text in enumerate(texts):
            parts = [p for p in text.split("\n\n") if p.strip()] or [text]
            pieces += parts
            owner += [i] * len(parts)
        return pieces, owner

    def embed(self, texts: list[str]) -> np.ndarray:
        return self.embed_parts(texts)[0]

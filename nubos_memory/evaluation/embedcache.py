"""An embedding cache around the real embedder, kept between runs.

Vectors are kept in ``$NUBOS_MEMORY_CACHE`` (default ``~/.cache/nubos-memory``), keyed by the
embedder's fingerprint and the text's hash: a derived cache, safe to delete.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..embed.base import Embedder
from ..embed.pooling import kept_pieces, pooled
from ..fsio import JSONDecodeError, atomic_write_bytes, dumps, ensure_dir, loads


class CachedEmbedder(Embedder):
    """Delegates to ``inner``; remembers vectors by text hash under its fingerprint."""

    def __init__(self, inner: Embedder, folder: Path):
        super().__init__(inner.model_id)
        self.inner = inner
        self.provider = inner.provider
        self.version = inner.version
        self.folder = folder / inner.fingerprint
        self._keys: dict[str, int] = {}
        self._vecs: list[np.ndarray] = []
        self.hits = self.misses = 0
        try:
            keys = loads((self.folder / "keys.json").read_bytes())
            vecs = np.load(self.folder / "vectors.npy", allow_pickle=False)
            if len(keys) == len(vecs):
                self._keys = {k: i for i, k in enumerate(keys)}
                self._vecs = list(vecs)
        except (OSError, ValueError, JSONDecodeError):
            pass
        self._saved = len(self._keys)

    def known_dim(self) -> int | None:
        return self.inner.known_dim()

    def spec(self, dim: int | None = None) -> dict[str, Any]:
        return self.inner.spec(dim)

    @property
    def dim(self) -> int:
        return self.inner.dim

    def embed(self, texts: list[str]) -> np.ndarray:
        return self._cached(texts, "", self.inner.embed)

    def embed_query(self, texts: list[str]) -> np.ndarray:
        """Queries, remembered apart from passages (a model may embed them apart: ``embed/prefixed.py``)."""
        return self._cached(texts, "query\0", self.inner.embed_query)

    def embed_search(self, texts: list[str]) -> np.ndarray:
        """Search queries: as queries, or remembered under what makes them (the model's int8 copy:
        ``Embedder.search_key``), so an exact run and an int8 run never read each other's."""
        key = self.inner.search_key()
        if key == "query":
            return self.embed_query(texts)
        return self._cached(texts, f"search:{key}\0", self.inner.embed_search)

    def search_key(self) -> str:
        return self.inner.search_key()

    def _cached(self, texts: list[str], kind: str, make: "Callable[[list[str]], np.ndarray]") -> np.ndarray:
        keys = [hashlib.sha256((kind + t).encode("utf-8")).hexdigest()[:32] for t in texts]
        todo = [i for i, k in enumerate(keys) if k not in self._keys]
        if todo:
            given = [texts[i] for i in todo]
            fresh = make(given)
            for i, vec in zip(todo, fresh):
                if keys[i] not in self._keys:
                    self._keys[keys[i]] = len(self._vecs)
                    self._vecs.append(vec)
        self.misses += len(todo)
        self.hits += len(texts) - len(todo)
        return np.stack([self._vecs[self._keys[k]] for k in keys]).astype(np.float32)

    def embed_parts(self, texts: list[str]) -> tuple[np.ndarray, dict[int, np.ndarray]]:
        """The inner model's pieces, each remembered by its own text (a piece fits the window, so
        its vector is the model's for it alone), pooled as the model pools them."""
        split = getattr(self.inner, "pieces", None)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32), {}
        if split is None:  # a model that never cuts a text
            return self.embed(texts), {}
        pieces, owner = split(texts)  # (a text that fits is its own one piece: remembered by the whole text)
        best, best_owner = self.inner.best_pieces(texts)  # (what best-piece scoring keeps: pooling.py)
        return pooled(self.embed(pieces), owner, len(texts)), kept_pieces(self.embed, best, best_owner)

    def best_pieces(self, texts: list[str]) -> tuple[list[str], list[int]]:
        return self.inner.best_pieces(texts) if getattr(self.inner, "pieces", None) is not None else ([], [])

    def save(self) -> None:
        if len(self._keys) == self._saved:
            return
        ensure_dir(self.folder)
        keys = [""] * len(self._keys)
        for k, i in self._keys.items():
            keys[i] = k
        import io

        buf = io.BytesIO()
        np.save(buf, np.stack(self._vecs).astype(np.float32), allow_pickle=False)
        atomic_write_bytes(self.folder / "vectors.npy", buf.getvalue())
        atomic_write_bytes(self.folder / "keys.json", dumps(keys))
        self._saved = len(keys)


def default_cache_dir() -> Path | None:
    """Where dataset embeddings are kept between runs (None: no safe cache folder; nothing is kept)."""
    from ..userdirs import user_cache_dir

    cache = user_cache_dir()
    return cache / "embeddings" if cache is not None else None

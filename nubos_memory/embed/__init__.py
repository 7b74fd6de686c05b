"""Embedders: what turns text into vectors (``base.py`` is the seam)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import Embedder, fingerprint_of
from .hashing import HashEmbedder

if TYPE_CHECKING:
    from ..config import MemoryConfig


def make_embedder(provider: str, model: str, runtime: str = "auto", device: str = "auto",
                  config: "MemoryConfig | None" = None) -> Embedder:
    """The embedder a config names (the model itself loads on first use; a gateway's settings come
    from ``config``)."""
    from .prefixed import prefixed

    query_prefix, passage_prefix = (config.query_prefix, config.passage_prefix) if config is not None else ("", "")
    if provider == "hash":
        return prefixed(HashEmbedder(model if model.startswith("hash-") else "hash-256"), query_prefix, passage_prefix)
    if provider == "openai":
        from ..config import MemoryConfig
        from .gateway import make_gateway

        gateway = make_gateway(config if config is not None else MemoryConfig(provider=provider, model=model))
        return prefixed(gateway, query_prefix, passage_prefix)
    from .model import ModelEmbedder

    return prefixed(ModelEmbedder(model, runtime=runtime, device=device), query_prefix, passage_prefix)


__all__ = ["Embedder", "HashEmbedder", "fingerprint_of", "make_embedder"]

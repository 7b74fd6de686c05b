"""Embedders: what turns text into vectors (``base.py`` is the seam)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import Embedder, fingerprint_of
from .hashing import HashEmbedder

if TYPE_CHECKING:
    from ..config import MemoryConfig


# The settings make_embedder reads (here or in the gateway): a warm process that sees none of them change
# keeps its loaded model (interfaces/warm.py).
EMBEDDER_SETTINGS = ("provider", "model", "runtime", "device", "queries", "query_prefix", "passage_prefix",
                     "input_type", "base_url", "api_key_env", "embed_timeout_s", "breaker")


def made_alike(a: "MemoryConfig", b: "MemoryConfig") -> bool:
    """Whether two configs make the same embedder (every one of ``EMBEDDER_SETTINGS`` equal)."""
    return all(getattr(a, name) == getattr(b, name) for name in EMBEDDER_SETTINGS)


def make_embedder(provider: str, model: str, runtime: str = "auto", device: str = "auto",
                  config: "MemoryConfig | None" = None, *, queries: str | None = None) -> Embedder:
    """The embedder a config names (the model itself loads on first use; a gateway's settings and
    ``queries`` (default ``memory.queries``) come from ``config``)."""
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

    queries = queries or (config.queries if config is not None else "int8")
    return prefixed(ModelEmbedder(model, runtime=runtime, device=device, queries=queries), query_prefix, passage_prefix)


__all__ = ["EMBEDDER_SETTINGS", "Embedder", "HashEmbedder", "fingerprint_of", "made_alike", "make_embedder"]

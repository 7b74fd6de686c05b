"""Embedders: what turns text into vectors (``base.py`` is the seam)."""

from __future__ import annotations

from .base import Embedder, fingerprint_of
from .hashing import HashEmbedder


def make_embedder(provider: str, model: str, runtime: str = "auto", device: str = "auto") -> Embedder:
    """The embedder a config names (the model itself loads on first use)."""
    if provider == "hash":
        return HashEmbedder(model if model.startswith("hash-") else "hash-256")
    from .model import ModelEmbedder

    return ModelEmbedder(model, runtime=runtime, device=device)


__all__ = ["Embedder", "HashEmbedder", "fingerprint_of", "make_embedder"]

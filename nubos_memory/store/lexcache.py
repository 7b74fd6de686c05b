"""The persisted lexical index: ``lexical.json`` + ``lexical-<gen>.npz`` (derived, no pickle).

It covers the records parsed from the first ``offset`` bytes of the log and is
trusted only if the store's digest of those bytes still matches (the file store:
their sha256, so any edit to the log other than an append invalidates it; the
database store: the namespace's epoch, which only memory-compact changes) and its description is signed with
this user's key (``trust.py``), with the npz's sha256 (checked once per version of the file:
``verified.py``; its arrays are memory-mapped, so the zip's own checks never run).  Records appended after it was
saved are tokenised on load and added in memory; writers save it again.
"""

from __future__ import annotations

import hashlib
import io
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..faults import crash_point
from ..fsio import atomic_write_bytes, dumps, loads, read_regular
from ..index.lexical import PostingsBM25
from ..log import READ_RULES
from ..tokenize import TOKENIZER_VERSION
from ..trust import available, sign, verify
from .verified import Verified

MANIFEST = "lexical.json"
FORMAT = 3  # 3: the npz's sha256 is in the signed description (its arrays are mapped, not read: no zip CRC)


MEMBERS = ("indptr", "docs", "tfs", "df", "doc_len", "removed", "removed_df", "vocab")


def mapped_members(path: Path) -> dict[str, np.ndarray]:
    """The arrays of an ``np.savez`` file, memory-mapped where they are stored uncompressed (as
    ``np.savez`` stores them: a query reads only the postings of its terms), else read."""
    import zipfile

    out: dict[str, np.ndarray] = {}
    with zipfile.ZipFile(path) as z, open(path, "rb") as f:
        for info in z.infolist():
            key = info.filename.removesuffix(".npy")
            if key not in MEMBERS:
                continue
            if info.compress_type != zipfile.ZIP_STORED:
                with z.open(info) as member:
                    out[key] = np.lib.format.read_array(member, allow_pickle=False)
                continue
            f.seek(info.header_offset)
            local = f.read(30)  # the local file header: its name and extra field lengths end it
            if local[:4] != b"PK\x03\x04":
                raise ValueError("zip member header")
            f.seek(info.header_offset + 30 + int.from_bytes(local[26:28], "little") + int.from_bytes(local[28:30], "little"))
            version = np.lib.format.read_magic(f)
            read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, fortran, dtype = read_header(f)
            if fortran or dtype.hasobject:
                raise ValueError("array layout")
            out[key] = np.memmap(path, dtype=dtype, mode="r", offset=f.tell(), shape=shape) if int(np.prod(shape)) \
                else np.zeros(shape, dtype=dtype)
    return out


class LexicalCache:
    def __init__(self, folder: Path, digest: Callable[[int], str], verified: Verified | None = None,
                 matches: Callable[[int, str], bool] | None = None):
        self.folder = folder
        self.digest = digest  # offset -> what identifies the log's first ``offset`` bytes
        self.verified = verified or Verified(folder)  # the npz checked against its sha256 once per version
        # (offset, what identified them when saved) -> whether the log's first bytes are still those
        self.matches = matches or (lambda offset, sha256: digest(offset) == sha256)

    def load(self, max_records: int) -> tuple[PostingsBM25, int] | None:
        """The saved engine and the log offset it covers, if still valid; else None.

        Its removed documents are the records that died within the covered bytes;
        deaths recorded after them are applied by the caller.
        """
        try:
            meta = loads(read_regular(self.folder / MANIFEST))
            if meta.get("format") != FORMAT or meta.get("tokenizer") != TOKENIZER_VERSION \
                    or meta.get("read_rules") != READ_RULES or not verify(meta):
                return None
            count, offset = int(meta["count"]), int(meta["offset"])
            if count > max_records or not self.matches(offset, str(meta["sha256"])):
                return None
            name = Path(str(meta["file"])).name
            path = self.folder / name
            if path.is_symlink() or not self.verified.check(path, meta.get("npz_sha256")):
                return None
            arrays = mapped_members(path)
            vocab = bytes(arrays.pop("vocab")).decode("utf-8")
            terms = vocab.split("\n") if vocab else []
            if len(arrays["doc_len"]) != count or len(terms) != len(arrays["df"]):
                return None
            return PostingsBM25.from_arrays(terms, arrays), offset
        except Exception:  # noqa: BLE001 - a derived cache: anything wrong (a bad zip, garbled arrays) means "rebuild it"
            return None

    def invalidate(self) -> None:
        """Forget the saved index (``memory-rebuild`` re-derives it from scratch)."""
        (self.folder / MANIFEST).unlink(missing_ok=True)

    def save(self, engine: PostingsBM25, offset: int) -> None:
        """Under the write lock: persist ``engine``, which covers the log up to ``offset`` (not without a
        signing key: nobody could trust it)."""
        if not available():
            return
        terms, arrays = engine.arrays()
        buf = io.BytesIO()
        named: dict[str, Any] = {"vocab": np.frombuffer("\n".join(terms).encode("utf-8"), dtype=np.uint8), **arrays}
        np.savez(buf, **named)
        name = f"lexical-{int(time.time() * 1000):x}-{secrets.token_hex(3)}.npz"
        data = buf.getvalue()
        atomic_write_bytes(self.folder / name, data)
        crash_point("lexical-npz-written")
        meta = {"format": FORMAT, "tokenizer": TOKENIZER_VERSION, "read_rules": READ_RULES, "count": engine.size,
                "offset": offset, "sha256": self.digest(offset), "file": name, "npz_sha256": hashlib.sha256(data).hexdigest()}
        atomic_write_bytes(self.folder / MANIFEST, dumps(sign(meta), pretty=True))
        for old in self.folder.glob("lexical-*.npz"):
            if old.name != name:
                old.unlink(missing_ok=True)

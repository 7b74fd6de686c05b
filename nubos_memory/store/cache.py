"""The derived cache: ``manifest.json`` plus one generation of immutable files.

A generation is three files written once and never modified::

    index-<gen>.hnsw      hnswlib graph (label i = row i); none where the store proposes
                          candidates itself (the team database's pgvector index)
    keymap-<gen>.json     label ↔ record id and content hash: a JSON line, then the ids, hashes and
                          piece/question owner labels as flat arrays (``keymap_bytes``; one JSON
                          document {"format", "ids", "hashes", ...} in generations written before)
    vectors-<gen>.npy     float32 (n, dim), the stored unit vectors (loaded without pickle)
    pieces-<gen>.npy      float32 (p, dim), the piece vectors of records embedded in several pieces
                          (their labels: the keymap's "piece_owner"); none when no record has any
    questions-<gen>.npy   float32 (q, dim), HyPE's question vectors (labels: "question_owner", and
                          per label what they were made from: "question_keys"); none without HyPE

A generation may also have **segments** (adr/0021): a write that appends a few rows to a
generation writes only those rows, as one small immutable segment, and commits a manifest that names
the base's files (unchanged) plus the segments so far, instead of copying every row and the graph::

    segment-<id>.keymap.json   a keymap of the segment's rows (their labels follow the base's)
    segment-<id>.vectors.npy   float32 (r, dim)                            the base's and earlier segments'
    segment-<id>.pieces.npy    its records' piece vectors, when any has several

The graph covers the base's rows; a search scans the segments' rows exactly beside it.  When the
segments would pass ``MAX_SEGMENTS``, or ``MAX_TAIL_ROWS`` rows (beside a base of at most
``EXACT_LIMIT`` rows: that many), the write merges them (a full generation, as before segments), as
do ``memory-rebuild`` (the canonical form: never segments), ``memory-compact`` and the servers
(memory-serve, -http, -mcp) when idle (``MERGE_IDLE_SEGMENTS``).

``manifest.json`` names the current generation and is the commit point: a
writer (holding the lock) writes and fsyncs a new generation, swaps the
manifest in with ``os.replace``, then deletes older generations.  The
manifest records each file's size and sha256 and is signed with this user's
key (``trust.py``): files that do not match are reported, never used, and a
manifest this user did not write is ``manifest-untrusted``.  A reader
reads the manifest, then that generation's files; if a file vanished under
it (a writer committed in between) it simply reads the manifest again.  So
index, keymap and vectors always change together or not at all.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import time
from array import array
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
from numpy.lib import format as npformat

from .. import codes
from ..columns import BYTEORDER, Digests, Hex, Lines, Strings, pack_all, unpack_from
from ..errors import StoreError
from ..faults import crash_point
from ..fsio import (
    FILE_MODE,
    JSONDecodeError,
    atomic_write_bytes,
    dumps,
    ensure_dir,
    fsync_dir,
    fsync_path,
    loads,
    loads_bulk,
    read_regular,
)
from ..index import vectors as vectors_module
from ..index.vectors import (
    PIECE_LAMBDA,
    PIECE_RULE,
    QUESTION_RULE,
    HnswParams,
    Pieces,
    Questions,
    VectorIndex,
    build_hnsw,
    kappa,
    load_hnsw,
    order_stats,
)
from ..records import SCHEMA_VERSION, now_iso
from ..trust import available, file_sha256, sign, verify
from ..types import Manifest
from .base import segments_of
from .verified import Verified

MANIFEST = "manifest.json"
CACHE_FORMAT = 1
KEYMAP_FORMAT = 2  # the binary keymap (``keymap_bytes``); a JSON one is still read
_PREFIXES = ("index-", "keymap-", "vectors-", "pieces-", "questions-", "segment-")
MAX_SEGMENTS = 32  # a write that would make more merges them into a new base generation
MAX_TAIL_ROWS = 8_192  # nor may the segments hold more rows (each search scans them exactly)
# A derived file of the wrong size: one code per file kind.
_CORRUPT = {"index": codes.INDEX_CORRUPT, "keymap": codes.KEYMAP_CORRUPT, "vectors": codes.VECTORS_CORRUPT,
            "pieces": codes.VECTORS_CORRUPT, "questions": codes.VECTORS_CORRUPT}


def covers_digest(ids: Sequence[str], hashes: Sequence[str], before: str = "") -> str:
    """A digest of which records (id and content hash, in label order) a generation covers; a
    segment's chains its rows onto the digest ``before`` them."""
    joined = before + "".join(f"{rid}\x00{ch}\n" for rid, ch in zip(ids, hashes))
    return hashlib.sha256(joined.encode("utf-8")).hexdigest()[:32]



def carried_side_weight(side_weight: dict[str, Any] | None, previous: Manifest | None) -> dict[str, Any]:
    """The manifest's ``side_weight`` field: the new estimate, else the previous manifest's (none: no field)."""
    value = side_weight if side_weight is not None else (previous or {}).get("side_weight")
    return {"side_weight": value} if isinstance(value, dict) else {}


def _create(path: Path) -> Any:
    """A new file of a generation, opened for writing: owner-only, never an existing file or a link."""
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, FILE_MODE), "wb")


def pieces_field(pieces: Pieces | None, previous: Manifest | None, rebuilt: bool) -> dict[str, Any]:
    """The manifest's ``pieces`` field: the scoring rule of a generation that keeps pieces (none: before it).
    Any generation but a rebuild's keeps ``previous``'s rule's name (it carries pieces that rule cut;
    ``memory-rebuild`` cuts them again: api/rebuild.py)."""
    if pieces is None:
        return {}
    rule = None if rebuilt else (previous or {}).get("pieces")
    name = rule.get("rule") if isinstance(rule, dict) and isinstance(rule.get("rule"), str) else PIECE_RULE
    return {"pieces": {"rule": name, "lambda": PIECE_LAMBDA, "rows": len(pieces)}}


def questions_field(questions: Questions | None) -> dict[str, Any]:
    """The manifest's ``questions`` field: HyPE's rule and rows, when a record has questions."""
    if questions is None or not len(questions):
        return {}
    return {"questions": {"rule": QUESTION_RULE, "rows": len(questions)}}


def joined_pieces(base: VectorIndex | None, pieces: Pieces | None) -> Pieces | None:
    """A generation's pieces: ``base``'s followed by the appended rows' ``pieces`` (None: the rule is off)."""
    if pieces is None or base is None or not base.has_pieces():
        return pieces
    parts = [p for p in (base.pieces, base.tail_pieces, pieces) if p is not None and len(p)]
    return Pieces(np.concatenate([np.asarray(p.vectors, dtype=np.float32) for p in parts]),
                  np.concatenate([p.owner for p in parts]))



def _write_vectors(path: Path, vectors: np.ndarray, base: VectorIndex | None, source: Path | None = None,
                   source_rows: int | None = None) -> str:
    """Write ``vectors-<gen>.npy``: all rows, or ``base``'s file's rows followed by ``vectors``
    (``source``/``source_rows``: another of base's files, its pieces).

    Appending copies the base file's bytes through the page cache instead of
    loading its rows, so a commit at 100k records holds no second copy of them.
    The header is the one ``np.save`` writes, so both paths give the same bytes.
    Returns the file's sha256.
    """
    digest = hashlib.sha256()

    class Hashing:  # a file object that hashes what passes through it
        def __init__(self, f: Any):
            self.f = f

        def write(self, data: Any) -> int:
            digest.update(data)
            return int(self.f.write(data))

    with _create(path) as raw:
        f = Hashing(raw)
        if base is None:
            np.save(f, vectors, allow_pickle=False)
            return digest.hexdigest()
        source = source or base.vectors_path
        before = base.base_rows if source_rows is None else source_rows
        if source is None:
            raise StoreError("the current vectors have no file to extend; run memory-rebuild", code=codes.VECTORS_CORRUPT)
        shape = (before + len(vectors), base.dim)
        npformat.write_array_header_1_0(f, {"descr": npformat.dtype_to_descr(np.dtype(np.float32)),
                                            "fortran_order": False, "shape": shape})
        with open(source, "rb") as src:
            version = npformat.read_magic(src)
            read_header = npformat.read_array_header_1_0 if version == (1, 0) else npformat.read_array_header_2_0
            src_shape, fortran, dtype = read_header(src)
            if src_shape != (before, base.dim) or fortran or dtype != np.float32:
                raise StoreError("stored vectors changed under the writer; run memory-rebuild",
                                 code=codes.VECTORS_CORRUPT, details={"file": source.name})
            shutil.copyfileobj(src, f, 1 << 20)
        f.write(np.ascontiguousarray(vectors, dtype=np.float32).tobytes())
    return digest.hexdigest()


def _write_pieces(path: Path, pieces: Pieces, base: VectorIndex | None) -> str:
    """Write ``pieces-<gen>.npy`` (``pieces``: every row), extending base's file when it has one."""
    if base is None or base.pieces is None or not len(base.pieces) or base.pieces_path is None:
        return _write_vectors(path, pieces.vectors, None)
    start = len(base.pieces)  # the rows of base's own pieces file (its segments' follow)
    return _write_vectors(path, pieces.vectors[start:], base, base.pieces_path, start)


def _names(gen: str) -> dict[str, str]:
    return {"index": f"index-{gen}.hnsw", "keymap": f"keymap-{gen}.json", "vectors": f"vectors-{gen}.npy",
            "pieces": f"pieces-{gen}.npy", "questions": f"questions-{gen}.npy"}


def _segment_names(seg: str) -> dict[str, str]:
    return {"keymap": f"segment-{seg}.keymap.json", "vectors": f"segment-{seg}.vectors.npy",
            "pieces": f"segment-{seg}.pieces.npy"}


def referenced(manifest: Manifest | None) -> set[str]:
    """Every derived file a manifest names: its base files' and its segments'."""
    names = set()
    for files in [(manifest or {}).get("files") or {}, *(seg.get("files") or {} for seg in segments_of(manifest))]:
        names |= {str(f.get("name")) for f in files.values() if isinstance(f, dict)}
    return names


def _owners(owner: Any, rows: int, count: int) -> np.ndarray:
    """A keymap's owner labels of ``rows`` rows: in ``[0, count)``, non-decreasing (else ValueError)."""
    owners = np.asarray(owner, dtype=np.int64)
    if owners.shape != (rows,) or (rows and (owners.min() < 0 or owners.max() >= count or (np.diff(owners) < 0).any())):
        raise ValueError("owners")
    return owners


def keymap_bytes(ids: Sequence[str], hashes: Sequence[str], pieces: Pieces | None, questions: Questions | None) -> bytes:
    """A keymap file (``KEYMAP_FORMAT``): one JSON line (what follows, the question keys), then the ids, the
    content hashes and the owner labels of the piece and question rows as flat binary arrays
    (``columns.py``): a process reads the ids and hashes in place instead of parsing a JSON list of each
    (at 100k records that parse was the largest part of a one-shot query's growth, issue 27)."""
    items: list[tuple[str, Sequence[Any], str]] = [
        ("ids", ids, "lines"), ("hashes", hashes, "hex"),
        ("piece_owner", array("q", (pieces.owner if pieces is not None else np.zeros(0)).astype(np.int64).tobytes()), "q")]
    head: dict[str, Any] = {"keymap": KEYMAP_FORMAT, "format": CACHE_FORMAT, "byteorder": BYTEORDER}
    if questions is not None and len(questions):
        items.append(("question_owner", array("q", questions.rows.owner.astype(np.int64).tobytes()), "q"))
        head["question_keys"] = {str(label): key for label, key in sorted(questions.keys.items())}
    arrays, section = pack_all(items)
    return dumps({**head, "arrays": arrays}) + b"\n" + section


def keymap_parts(raw: bytes) -> tuple[Any, Any, Any, Any, Any]:
    """A keymap file's ids, hashes, piece owners, question owners and question keys (either form: the
    JSON document of a generation written before ``KEYMAP_FORMAT``, or the binary one)."""
    end = raw.find(b"\n")
    if end < 0:  # (one JSON document)
        km = loads_bulk(raw)
        return km["ids"], km["hashes"], km.get("piece_owner", []), km.get("question_owner", []), \
            km.get("question_keys") or {}
    head = loads(raw[:end])
    if not (isinstance(head, dict) and head.get("keymap") == KEYMAP_FORMAT and head.get("byteorder") == BYTEORDER):
        raise ValueError("not a keymap this version reads")
    section, arrays = memoryview(raw)[end + 1:], head["arrays"]
    asked = unpack_from(arrays, section, "question_owner") if "question_owner" in arrays else []
    return (unpack_from(arrays, section, "ids"), unpack_from(arrays, section, "hashes"),
            unpack_from(arrays, section, "piece_owner"), asked, head.get("question_keys") or {})


def _read_keymap(path: Path, sha256: Any, count: int, pieces: int, questions: int, start: int = 0,
                 verified: Verified | None = None) -> tuple[Strings, Digests, np.ndarray, np.ndarray, dict[int, str]]:
    """The keymap's ids, text hashes, piece owners, question owners and question keys, checked against
    its recorded ``sha256`` (a check ``verified`` remembers by the file's identity, as the other derived
    files'), ``count``, ``pieces`` and ``questions`` (``start``: a segment's first label)."""
    try:
        with open(path, "rb") as f:
            raw_keymap, st = f.read(), os.fstat(f.fileno())

        def digest() -> str:
            return hashlib.sha256(raw_keymap).hexdigest()

        if not (verified.check(path, sha256, digest, st) if verified is not None else digest() == sha256):
            raise ValueError("checksum")
        ids, hashes, piece_owner, question_owner, question_keys = keymap_parts(raw_keymap)
        if not (isinstance(ids, (list, Lines)) and isinstance(hashes, (list, Hex)) and len(ids) == len(hashes) == count):
            raise ValueError("length")
        owners = _owners(piece_owner, pieces, start + count)
        if len(owners) and owners.min() < start:
            raise ValueError("owners")
        asked = _owners(question_owner, questions, count)
        keys = {int(label): str(key) for label, key in question_keys.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError, OverflowError):
        raise StoreError("keymap is corrupt; run memory-rebuild", code=codes.KEYMAP_CORRUPT,
                         details={"file": path.name}) from None
    return ids, hashes, owners, asked, keys


class DerivedCache:
    """Reads and commits the derived files of one memory folder."""

    def __init__(self, folder: Path, graph: bool = True):
        self.folder = folder
        self.graph = graph  # False: no hnswlib graph (the store proposes candidates itself: adr/0014)
        self.written: str | None = None  # the generation this process committed last: checksums computed while writing
        self._last: tuple[bytes, dict[str, Any]] | None = None  # the manifest's bytes and document, verified
        # The last generation loaded, by its base files and segments: the next one that only adds
        # segments to it reuses its parsed keymap, label maps and rows instead of reading them again
        self._loaded: tuple[tuple[Any, ...], list[str], VectorIndex] | None = None
        self._built: tuple[str, Any] | None = None  # the graph this process wrote last (its generation, hnswlib)
        self._appended: tuple[str, Strings, Digests] | None = None  # the lists of the segment it wrote last
        self.verified = Verified(folder)  # derived files checked already (by any process of this user)

    @property
    def manifest_path(self) -> Path:
        return self.folder / MANIFEST

    # -- reading -----------------------------------------------------------------
    def read_manifest(self) -> Manifest | None:
        """The manifest, ``None`` if absent; a corrupt one raises ``manifest-corrupt``, one this
        user's key did not sign ``manifest-untrusted``."""
        try:
            raw = read_regular(self.manifest_path)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StoreError(f"cannot read manifest: {exc.strerror}", code=codes.MANIFEST_CORRUPT,
                             details={"path": str(self.manifest_path)}) from None
        if self._last is not None and self._last[0] == raw:  # the same bytes: parsed and verified already
            return cast(Manifest, dict(self._last[1]))
        try:
            doc = loads(raw)
            ok = (
                isinstance(doc, dict)
                and doc.get("format") == CACHE_FORMAT
                and isinstance(doc.get("embedding"), dict)
                and isinstance(doc["embedding"].get("fingerprint"), str)
                and isinstance(doc.get("covers"), dict)
                and isinstance(doc["covers"].get("count"), int)
                and (doc["covers"]["count"] == 0 or isinstance(doc.get("files"), dict))
            )
        except JSONDecodeError:
            ok = False
        if not ok:
            raise StoreError(
                "manifest.json is corrupt or of an unknown format; it is left untouched. "
                "Run memory-rebuild to replace it.",
                code=codes.MANIFEST_CORRUPT,
                details={"path": str(self.manifest_path), "bytes": len(raw)},
            )
        if not available():  # fail closed: without a key nothing can be told trusted (trust.py)
            raise StoreError("no signing key: derived files cannot be trusted, so they are not used and vectors "
                             "are computed from records.jsonl for this call", code=codes.SIGNING_KEY_UNAVAILABLE,
                             details={"path": str(self.manifest_path)})
        if not verify(doc):
            raise StoreError(
                "manifest.json was not written by this user on this machine (a cloned or copied memory, or "
                "an older version); its derived files are not used. Run memory-rebuild to re-derive them.",
                code=codes.MANIFEST_UNTRUSTED, details={"path": str(self.manifest_path)})
        self._last = (raw, doc)
        return cast(Manifest, dict(doc))

    def _check_files(self, paths: dict[str, Path], files: dict[str, Any]) -> None:
        """Each derived file the manifest names is there, a plain file, of the size it recorded."""
        for key in [k for k in ("index", "keymap", "vectors", "pieces", "questions")
                    if k in files and (self.graph or k != "index")]:
            path = paths.get(key)
            if path is None or path.name != Path(path.name).name or not path.is_file():
                raise StoreError(f"derived {key} file is missing; run memory-rebuild", code=codes.INDEX_MISSING,
                                 details={"file": str(path.name if path else None)})
            if path.is_symlink():
                raise StoreError(f"derived {key} file {path.name} is a symlink; it is not followed",
                                 code=codes.STORE_SYMLINK_REFUSED, details={"file": path.name})
            if path.stat().st_size != files[key].get("bytes"):
                raise StoreError(f"derived {key} file {path.name} has the wrong size; run memory-rebuild",
                                 code=_CORRUPT[key],
                                 details={"file": path.name, "bytes": path.stat().st_size,
                                          "expected": files[key].get("bytes")})

    def load(self, manifest: Manifest) -> VectorIndex:
        """Load the generation a manifest names, checking it against the manifest."""
        count = manifest["covers"]["count"]
        dim = manifest["embedding"].get("dim")
        ef = int(manifest.get("hnsw", {}).get("ef_search", 100))
        if count == 0:
            return VectorIndex([], [], np.zeros((0, dim or 1), dtype=np.float32), None, ef,
                               pieces=Pieces.empty(int(dim or 1)) if isinstance(manifest.get("pieces"), dict) else None)
        files = manifest.get("files") or {}
        paths = {k: self.folder / str(v.get("name", "")) for k, v in files.items() if isinstance(v, dict)}
        segments = segments_of(manifest)
        rule, hype = manifest.get("pieces"), manifest.get("questions")
        n_pieces = int(rule.get("rows") or 0) if isinstance(rule, dict) else 0
        n_questions = int(hype.get("rows") or 0) if isinstance(hype, dict) else 0
        base_count = count - sum(int(seg.get("rows") or 0) for seg in segments)
        base_pieces = n_pieces - sum(int(seg.get("pieces") or 0) for seg in segments)
        if base_count <= 0 or base_pieces < 0:
            raise StoreError("the manifest's segments do not add up; run memory-rebuild", code=codes.MANIFEST_CORRUPT,
                             details={"path": str(self.manifest_path)})
        key = (*((k, (files.get(k) or {}).get("name"), (files.get(k) or {}).get("sha256")) for k in sorted(files)),
               base_count, base_pieces, n_questions, isinstance(rule, dict))
        names = [str(seg.get("id")) for seg in segments]
        last, lists = self._loaded, self._appended
        if last is not None and last[0] == key and names[:len(last[1])] == last[1]:
            given = lists[1:] if lists is not None and lists[0] == manifest.get("generation") \
                and len(lists[1]) == count else None  # the lists this process committed: no copy
            index = self._extend(last[2], segments[len(last[1]):], dim, isinstance(rule, dict), given)
        else:
            index = self._load_base(manifest, files, paths, base_count, base_pieces, n_questions, ef)
            if segments:
                index = self._extend(index, segments, dim, isinstance(rule, dict))
        self._loaded, self._appended = (key, names, index), None
        return index

    def _load_base(self, manifest: Manifest, files: dict[str, Any], paths: dict[str, Path], count: int,
                   n_pieces: int, n_questions: int, ef: int) -> VectorIndex:
        """The generation's base files as an index of their own (segments are added by :meth:`_extend`)."""
        dim = manifest["embedding"].get("dim")
        self._check_files(paths, files)
        # hashed as we wrote them, under the lock (a segment commit keeps its base's files)
        ours = self.written is not None and (files.get("vectors") or {}).get("name") == _names(self.written)["vectors"]
        rule = manifest.get("pieces")
        ids, hashes, owner, asked, keys = _read_keymap(paths["keymap"], files["keymap"].get("sha256"), count,
                                                       n_pieces, n_questions, verified=self.verified)
        vectors = self._rows(paths, files, "vectors", (count, dim), ours)
        pieces = None
        if isinstance(rule, dict):  # a generation that keeps pieces (module docstring)
            pieces = Pieces(self._rows(paths, files, "pieces", (n_pieces, dim), ours), owner) if n_pieces \
                else Pieces.empty(int(dim or 1))
        questions = Questions(Pieces(self._rows(paths, files, "questions", (n_questions, dim), ours), asked), keys) \
            if n_questions else None
        # The graph is fed to hnswlib, which trusts its input: only a verified manifest's, and only
        # after its own checksum matches (checked here when it will be searched, else on first use).
        graph = paths["index"] if self.graph else None
        index = VectorIndex(ids, hashes, vectors, graph, ef, vectors_path=paths["vectors"],
                            hnsw_sha256=(files.get("index") or {}).get("sha256"), pieces=pieces,
                            pieces_path=paths.get("pieces"), questions=questions)
        index.check_file = self._checked
        if ours:
            index.trust_graph()  # (else the graph's sha256 is checked before hnswlib first reads it: hnsw())
            if self._built is not None and self._built[1] is not None and self.graph:
                index.adopt_graph(index, built=self._built[1])  # the graph this process just wrote
        return index

    def _extend(self, index: VectorIndex, segments: list[dict[str, Any]], dim: Any, keeps: bool,
                given: tuple[Strings, Digests] | None = None) -> VectorIndex:
        """``index`` with ``segments``' rows after its own: a new index sharing its base rows and graph.

        The id → label map (and the content-hash map) are ``index``'s, grown in place rather than
        copied (a copy is O(records) per write: 50 ms at a million).  ``index`` is the last generation
        this cache loaded, which its process stops using once it reads the new one
        (``Snapshot.vectors``), so nothing reads it after its maps have grown.  ``given``: the whole id
        and hash lists, as this process committed them (else ``index``'s are copied and extended)."""
        if not segments:
            return index
        n = len(index)
        ids: list[str] = []
        hashes: list[str] = []
        tails = [index.tail] if index.tail is not None else []
        piece_parts = [index.tail_pieces] if index.tail_pieces is not None else []
        for seg in segments:  # every segment read and checked before anything shared is changed
            seg_ids, seg_hashes, rows, pieces = self._segment(seg, n + len(ids), dim)
            ids += seg_ids
            hashes += seg_hashes
            tails.append(rows)
            if pieces is not None and len(pieces):
                piece_parts.append(pieces)
        label_of = index.grown_label_of(ids)
        every: tuple[Strings, Digests] = (index.ids + ids, index.hashes + hashes) \
            if given is None or given[0][n:] != ids or given[1][n:] != hashes \
            else given  # the lists the commit was given end with exactly these rows: no copy
        tail = np.concatenate(tails) if len(tails) > 1 else tails[0]
        tail_pieces = None
        if keeps and piece_parts:
            tail_pieces = Pieces(np.concatenate([p.vectors for p in piece_parts]),
                                 np.concatenate([p.owner for p in piece_parts]))
        out = VectorIndex(*every, index.base, index.hnsw_path, index.ef_search, vectors_path=index.vectors_path,
                          hnsw_sha256=index.hnsw_sha256, pieces=index.pieces, pieces_path=index.pieces_path,
                          questions=index.questions, tail=tail, label_of=label_of, tail_pieces=tail_pieces)
        out.adopt_graph(index)
        out.inherit_hash_labels(index)
        return out

    def _segment(self, seg: dict[str, Any], start: int, dim: Any
                 ) -> tuple[list[str], list[str], np.ndarray, Pieces | None]:
        """One segment's ids, hashes, rows and pieces (labels from ``start``), checked against the manifest."""
        files = seg.get("files") or {}
        paths = {k: self.folder / str(v.get("name", "")) for k, v in files.items() if isinstance(v, dict)}
        self._check_files(paths, files)
        rows, n_pieces = int(seg.get("rows") or 0), int(seg.get("pieces") or 0)
        ids, hashes, owner, _, _ = _read_keymap(paths["keymap"], files["keymap"].get("sha256"), rows, n_pieces, 0,
                                                start, self.verified)
        vectors = np.array(self._rows(paths, files, "vectors", (rows, dim), False))
        pieces = Pieces(np.array(self._rows(paths, files, "pieces", (n_pieces, dim), False)), owner) \
            if n_pieces else None
        return list(ids), list(hashes), vectors, pieces  # (a segment's few rows: plain lists)

    def _checked(self, path: Path, sha256: Any) -> bool:
        """Whether a derived file holds the bytes of this sha256 (known from an earlier check of the
        unchanged file, else hashed: ``verified.py``)."""
        return self.verified.check(path, sha256)

    def _rows(self, paths: dict[str, Path], files: dict[str, Any], key: str, shape: tuple[int, Any],
              ours: bool) -> np.ndarray:
        """One of the generation's arrays, memory-mapped, checked against its sha256 (unless this
        process wrote it) and its shape."""
        path = paths.get(key)
        try:
            if path is None:
                raise ValueError("missing")
            if not ours and not self._checked(path, (files.get(key) or {}).get("sha256")):
                raise ValueError("checksum")
            rows: np.ndarray = np.load(path, mmap_mode="r", allow_pickle=False)
            if rows.dtype != np.float32 or rows.shape != shape:
                raise ValueError("shape")
        except (OSError, ValueError):
            raise StoreError(f"stored {key} are corrupt; run memory-rebuild", code=codes.VECTORS_CORRUPT,
                             details={"file": path.name if path else key}) from None
        return rows.view(np.ndarray)  # (still the mapped pages; indexing a plain array skips np.memmap's wrapping)

    def load_current(self, attempts: int = 5) -> tuple[Manifest | None, VectorIndex | None]:
        """Manifest and its generation, retrying if a writer swapped them mid-read."""
        for _ in range(attempts):
            manifest = self.read_manifest()
            if manifest is None:
                return None, None
            try:
                return manifest, self.load(manifest)
            except (StoreError, FileNotFoundError) as exc:  # (a segment a merge deleted after its commit)
                again = self.read_manifest()
                if again is not None and again.get("generation") != manifest.get("generation"):
                    continue  # a writer committed while we read: read the new generation
                if isinstance(exc, FileNotFoundError):
                    raise StoreError(f"derived file {Path(exc.filename or '').name or '?'} is missing; run "
                                     "memory-rebuild", code=codes.INDEX_MISSING) from None
                raise exc
        raise StoreError("derived files keep changing under the reader", code=codes.INDEX_BUSY)

    # -- writing (caller holds the write lock) -----------------------------------
    def commit(
        self,
        *,
        ids: Strings,
        hashes: Digests,
        vectors: np.ndarray,
        embedding: dict[str, Any],
        params: HnswParams,
        alpha: float,
        previous: Manifest | None,
        base: VectorIndex | None = None,
        rebuilt: bool = False,
        extra: dict[str, Any] | None = None,
        side_weight: dict[str, Any] | None = None,
        pieces: Pieces | None = None,
        questions: Questions | None = None,
    ) -> Manifest:
        """Write a new generation and swap the manifest in; return the new manifest.

        With ``base`` (the current generation), ``vectors`` are only the rows
        appended after base's: a few of them go into one new segment (module docstring), else
        base's rows, keymap entries and graph are kept and extended in a new base generation (a
        merge: none appended asks for one).  Without it, ``vectors`` are every row and a
        fresh graph is built (the deterministic rebuild path).  Without a graph (``self.graph``
        False) only keymap and vectors are written.  ``extra``: more manifest fields of the store's.
        ``side_weight`` (None: ``previous``'s) is signed with the rest (``carried_side_weight``).
        ``pieces``: the several-piece records' piece vectors, of the appended rows with ``base`` (None:
        a generation without them, whose records score by their pooled vectors).  ``questions``: every
        HyPE question vector of the new generation (not only the appended rows'; None: none).
        """
        if not available():
            raise StoreError("no signing key: a derived file written now could never be trusted, so none is "
                             "written; see memory-stats.user_folders", code=codes.SIGNING_KEY_UNAVAILABLE)
        if base is not None and not len(base):
            base = None  # an empty generation: nothing to extend
        if len(ids) != len(hashes) or len(ids) != (len(base) if base is not None else 0) + len(vectors):
            raise StoreError(f"a generation of {len(ids)} ids and {len(hashes)} hashes was given {len(vectors)} new "
                             "vectors", code=codes.VECTORS_CORRUPT, details={"ids": len(ids)})
        if self._fits_segment(base, previous, len(vectors), pieces, questions):
            assert base is not None and previous is not None
            return self._commit_segment(ids, hashes, vectors, embedding, params, alpha, previous, base,
                                        extra, side_weight, pieces)
        gen = f"{int(time.time() * 1000):x}-{secrets.token_hex(3)}"
        base_gen = (previous or {}).get("generation")
        names = _names(gen)
        count = len(ids)
        written: list[Path] = []
        try:
            files: dict[str, Any] | None = None
            graph = None
            pieces = joined_pieces(base, pieces)
            added = np.ascontiguousarray(vectors, dtype=np.float32)
            # (a merge: the segments' rows join the base's)
            vectors = np.concatenate([base.tail, added]) if base is not None and base.tail is not None else added
            if count:
                index_path = self.folder / names["index"]
                graph = self._graph(base, vectors, params, count) if self.graph else None
                if graph is not None:
                    written.append(index_path)
                    graph.save_index(str(index_path))
                digests, paths = self._write_rows(names, written, ids, hashes, vectors, base, pieces, questions)
                if self.graph:
                    digests["index"] = file_sha256(index_path)
                    paths.insert(0, ("index", index_path))
                files = self._durable(paths, digests, "commit-files-written")
            order = self._order_stats(added, base, previous)
            doc = self._document(gen, previous, embedding, params, alpha, files, order, rebuilt=rebuilt,
                                 appended_to=base_gen if base is not None else None,
                                 covers={"count": count, "digest": covers_digest(ids, hashes),
                                         "last_id": ids[-1] if ids else None},
                                 side_weight=side_weight,
                                 fields={**pieces_field(pieces, previous, rebuilt),
                                         **questions_field(questions if count else None),
                                         **(extra or {})})
            manifest = cast(Manifest, sign(doc))
            atomic_write_bytes(self.manifest_path, dumps(manifest, pretty=True))
            self.written = gen
            self._built = (gen, graph) if count else None
        except BaseException:
            for path in written:
                path.unlink(missing_ok=True)
            raise
        self.collect_garbage(manifest)
        return manifest

    def _durable(self, paths: list[tuple[str, Path]], digests: dict[str, str], point: str) -> dict[str, Any]:
        """Make written files owner-only and durable (then the folder); the manifest's entries for them."""
        files = {}
        for key, path in paths:
            os.chmod(path, FILE_MODE)
            fsync_path(path)
            files[key] = {"name": path.name, "bytes": path.stat().st_size, "sha256": digests[key]}
        fsync_dir(self.folder)
        crash_point(point)
        return files

    @staticmethod
    def _graph(base: VectorIndex | None, vectors: np.ndarray, params: HnswParams, count: int) -> Any:
        """The new generation's graph: base's extended by ``vectors`` (the rows after its base files'),
        else one over every row."""
        if base is not None and base.hnsw_path is not None:
            try:
                base.verify_graph()  # hnswlib trusts what it reads: only the graph the manifest names
            except FileNotFoundError:
                raise StoreError(f"the HNSW graph {base.hnsw_path.name} the manifest names is missing; run "
                                 "memory-rebuild", code=codes.INDEX_MISSING,
                                 details={"file": base.hnsw_path.name}) from None
            return build_hnsw(vectors, params, base=load_hnsw(base.hnsw_path, base.dim, capacity=count))
        if base is not None:  # no graph to extend (no signing key): one over every row
            return build_hnsw(np.concatenate([np.asarray(base.base, dtype=np.float32), vectors]), params)
        return build_hnsw(vectors, params)

    @staticmethod
    def _fits_segment(base: VectorIndex | None, previous: Manifest | None, rows: int, pieces: Pieces | None,
                      questions: Questions | None) -> bool:
        """Whether an append of ``rows`` rows goes into one more segment (not a merge): to a generation
        read from its files, with HyPE's questions unchanged, within ``MAX_SEGMENTS`` and at most
        ``MAX_TAIL_ROWS`` rows, or the larger of the base's rows and ``EXACT_LIMIT`` if fewer."""
        if base is None or previous is None or not rows or base.vectors_path is None or not previous.get("files"):
            return False
        if questions is not base.questions or (pieces is None) != (not isinstance(previous.get("pieces"), dict)):
            return False
        segments = segments_of(previous)
        tail = sum(int(seg.get("rows") or 0) for seg in segments) + rows
        # (segments beside a small base are scanned exactly with it: at most twice EXACT_LIMIT rows)
        return len(segments) < MAX_SEGMENTS and tail <= min(MAX_TAIL_ROWS, max(base.base_rows, vectors_module.EXACT_LIMIT))

    def _commit_segment(self, ids: Strings, hashes: Digests, vectors: np.ndarray, embedding: dict[str, Any],
                        params: HnswParams, alpha: float, previous: Manifest, base: VectorIndex,
                        extra: dict[str, Any] | None, side_weight: dict[str, Any] | None,
                        pieces: Pieces | None) -> Manifest:
        """Append ``vectors`` (the rows after base's) as one new segment: its files, then the manifest
        naming base's files, the segments so far and it.  O(rows appended), whatever base's size."""
        gen = f"{int(time.time() * 1000):x}-{secrets.token_hex(3)}"
        names = _segment_names(gen)
        start = len(base)
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if pieces is not None and len(pieces) and (pieces.owner.min() < start or pieces.owner.max() >= len(ids)):
            raise StoreError("pieces of rows that are not appended", code=codes.VECTORS_CORRUPT)
        written: list[Path] = []
        try:  # (written as a generation's own files are: keymap, vectors, pieces)
            digests, paths = self._write_rows(names, written, ids[start:], hashes[start:], vectors, None, pieces, None)
            files = self._durable(paths, digests, "segment-files-written")
            n_pieces = len(pieces) if pieces is not None else 0
            segment = {"id": gen, "rows": len(vectors), "pieces": n_pieces, "files": files}
            rule = previous.get("pieces")
            covers = previous.get("covers") or {}
            doc = self._document(gen, previous, embedding, params, alpha, previous.get("files"),
                                 self._order_stats(vectors, base, previous), rebuilt=False,
                                 appended_to=previous.get("generation"),
                                 covers={"count": len(ids), "last_id": ids[-1],
                                         "digest": covers_digest(ids[start:], hashes[start:],
                                                                 str(covers.get("digest") or ""))},
                                 side_weight=side_weight,
                                 fields={**({"pieces": {**rule, "rows": int(rule.get("rows") or 0) + n_pieces}}
                                            if isinstance(rule, dict) else {}),
                                         **({"questions": previous["questions"]} if "questions" in previous else {}),
                                         **(extra or {}),
                                         "segments": [*segments_of(previous), segment]})
            manifest = cast(Manifest, sign(doc))
            atomic_write_bytes(self.manifest_path, dumps(manifest, pretty=True))
            self._appended = (gen, ids, hashes)  # (the next load of this generation takes these lists)
        except BaseException:
            for path in written:
                path.unlink(missing_ok=True)
            raise
        self.collect_garbage(manifest)  # (what a writer killed mid-commit left: a folder listing, no reads)
        return manifest

    @staticmethod
    def _document(gen: str, previous: Manifest | None, embedding: dict[str, Any], params: HnswParams, alpha: float,
                  files: Any, order: dict[str, Any], *, rebuilt: bool, appended_to: Any, covers: dict[str, Any],
                  side_weight: dict[str, Any] | None, fields: dict[str, Any]) -> dict[str, Any]:
        """A manifest's fields (unsigned)."""
        now = now_iso()
        return {
            "format": CACHE_FORMAT,
            "schema_version": SCHEMA_VERSION,
            "generation": gen,
            # An append keeps every row of this generation: readers keep their label mapping.
            "appended_to": appended_to,
            "embedding": embedding,
            "hnsw": params.to_dict(),
            "alpha": alpha,
            "files": files,
            "covers": covers,
            "order": order,  # running sums for the coherence of log order (search/neighbours.py)
            "kappa": kappa(order),
            "created_at": (previous or {}).get("created_at") or now,
            "rebuilt_at": now if rebuilt else (previous or {}).get("rebuilt_at"),
            "updated_at": now,
            **carried_side_weight(side_weight, previous),
            **fields,
        }

    def _write_rows(self, names: dict[str, str], written: list[Path], ids: Sequence[str], hashes: Sequence[str],
                    vectors: np.ndarray, base: VectorIndex | None, pieces: Pieces | None,
                    questions: Questions | None) -> tuple[dict[str, str], list[tuple[str, Path]]]:
        """Write the keymap, the vectors and the pieces and questions there are (each path into
        ``written`` before it is created); their sha256 digests and paths."""
        keymap_path = self.folder / names["keymap"]
        written.append(keymap_path)
        keymap = keymap_bytes(ids, hashes, pieces, questions)
        with _create(keymap_path) as f:
            f.write(keymap)
        vectors_path = self.folder / names["vectors"]
        written.append(vectors_path)
        digests = {"keymap": hashlib.sha256(keymap).hexdigest(), "vectors": _write_vectors(vectors_path, vectors, base)}
        paths = [("keymap", keymap_path), ("vectors", vectors_path)]
        for key, rows in (("pieces", pieces), ("questions", questions.rows if questions is not None else None)):
            if rows is not None and len(rows):
                path = self.folder / names[key]
                written.append(path)
                digests[key] = _write_pieces(path, rows, base) if key == "pieces" else _write_vectors(path, rows.vectors, None)
                paths.append((key, path))
        return digests, paths

    @staticmethod
    def _order_stats(vectors: np.ndarray, base: VectorIndex | None, previous: Manifest | None) -> dict[str, Any]:
        """The running sums of this generation's rows: extended from the base's when it is an append."""
        if base is None or not len(base):
            return order_stats(vectors)
        before = (previous or {}).get("order")
        if isinstance(before, dict) and before.get("rows") == len(base):
            return order_stats(vectors, before, base.row(len(base) - 1))
        return order_stats(np.concatenate([np.asarray(base.vectors, dtype=np.float32), vectors]))

    def collect_garbage(self, keep: Manifest | None) -> list[str]:
        """Delete the derived files ``keep`` (a manifest) does not name, and stale temp files (under the lock)."""
        removed = []
        keep_names = referenced(keep)
        for path in self.folder.iterdir():
            name = path.name
            stale_tmp = name.startswith(".") and name.endswith(".tmp")
            if (name.startswith(_PREFIXES) and name not in keep_names) or stale_tmp:
                path.unlink(missing_ok=True)
                removed.append(name)
        return removed


class LocalDerivedState:
    """The derived-state part of a store whose vector generation lives in a local folder
    (``self.folder``, through ``self.cache``): the file store's memory folder, or the team
    database store's per-machine cache folder."""

    folder: Path
    cache: DerivedCache

    def read_manifest(self) -> Manifest | None:
        return self.cache.read_manifest()

    def load_current(self) -> tuple[Manifest | None, VectorIndex | None]:
        return self.cache.load_current()

    def commit(self, *, ids: "Strings", hashes: "Digests", vectors: np.ndarray, embedding: dict[str, Any],
               params: HnswParams, alpha: float, previous: Manifest | None, base: VectorIndex | None = None,
               rebuilt: bool = False, side_weight: dict[str, Any] | None = None,
               pieces: Pieces | None = None, questions: Questions | None = None) -> Manifest:
        """Under the lock: publish a new vector generation (``base``: extend the current one)."""
        ensure_dir(self.folder)
        return self.cache.commit(ids=ids, hashes=hashes, vectors=vectors, embedding=embedding, params=params,
                                 alpha=alpha, previous=previous, base=base, rebuilt=rebuilt, side_weight=side_weight,
                                 pieces=pieces, questions=questions)

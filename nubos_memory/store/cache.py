"""The derived cache: ``manifest.json`` plus one generation of immutable files.

A generation is three files written once and never modified::

    index-<gen>.hnsw      hnswlib graph (label i = row i); none where the store proposes
                          candidates itself (the team database's pgvector index)
    keymap-<gen>.json     {"format", "ids": [...], "hashes": [...]}  label ↔ record id
    vectors-<gen>.npy     float32 (n, dim), the stored unit vectors (loaded without pickle)
    pieces-<gen>.npy      float32 (p, dim), the piece vectors of records embedded in several pieces
                          (their labels: the keymap's "piece_owner"); none when no record has any
    questions-<gen>.npy   float32 (q, dim), HyPE's question vectors (labels: "question_owner", and
                          per label what they were made from: "question_keys"); none without HyPE

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
from pathlib import Path
from typing import Any, cast

import numpy as np
from numpy.lib import format as npformat

from .. import codes
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
    read_regular,
)
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

MANIFEST = "manifest.json"
CACHE_FORMAT = 1
_PREFIXES = ("index-", "keymap-", "vectors-", "pieces-", "questions-")
# A derived file of the wrong size: one code per file kind.
_CORRUPT = {"index": codes.INDEX_CORRUPT, "keymap": codes.KEYMAP_CORRUPT, "vectors": codes.VECTORS_CORRUPT,
            "pieces": codes.VECTORS_CORRUPT, "questions": codes.VECTORS_CORRUPT}


def covers_digest(ids: list[str], hashes: list[str]) -> str:
    """A digest of which records (id and content hash, in label order) a generation covers."""
    joined = "".join(f"{rid}\x00{ch}\n" for rid, ch in zip(ids, hashes))
    return hashlib.sha256(joined.encode("utf-8")).hexdigest()[:32]


def carried_side_weight(side_weight: dict[str, Any] | None, previous: Manifest | None) -> dict[str, Any]:
    """The manifest's ``side_weight`` field: the new estimate, else the previous manifest's (none: no field)."""
    value = side_weight if side_weight is not None else (previous or {}).get("side_weight")
    return {"side_weight": value} if isinstance(value, dict) else {}


def _create(path: Path) -> Any:
    """A new file of a generation, opened for writing: owner-only, never an existing file or a link."""
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, FILE_MODE), "wb")


def pieces_field(pieces: Pieces | None) -> dict[str, Any]:
    """The manifest's ``pieces`` field: the scoring rule of a generation that keeps pieces (none: before it)."""
    if pieces is None:
        return {}
    return {"pieces": {"rule": PIECE_RULE, "lambda": PIECE_LAMBDA, "rows": len(pieces)}}


def questions_field(questions: Questions | None) -> dict[str, Any]:
    """The manifest's ``questions`` field: HyPE's rule and rows, when a record has questions."""
    if questions is None or not len(questions):
        return {}
    return {"questions": {"rule": QUESTION_RULE, "rows": len(questions)}}


def joined_pieces(base: VectorIndex | None, pieces: Pieces | None) -> Pieces | None:
    """A generation's pieces: ``base``'s followed by the appended rows' ``pieces`` (None: the rule is off)."""
    if pieces is None or base is None or base.pieces is None or not len(base.pieces):
        return pieces
    return Pieces(np.concatenate([np.asarray(base.pieces.vectors, dtype=np.float32), pieces.vectors]),
                  np.concatenate([base.pieces.owner, pieces.owner]))


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
        before = len(base) if source_rows is None else source_rows
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
    start = len(base.pieces)
    return _write_vectors(path, pieces.vectors[start:], base, base.pieces_path, start)


def _names(gen: str) -> dict[str, str]:
    return {"index": f"index-{gen}.hnsw", "keymap": f"keymap-{gen}.json", "vectors": f"vectors-{gen}.npy",
            "pieces": f"pieces-{gen}.npy", "questions": f"questions-{gen}.npy"}


def _owners(owner: Any, rows: int, count: int) -> np.ndarray:
    """A keymap's owner labels of ``rows`` rows: in ``[0, count)``, non-decreasing (else ValueError)."""
    owners = np.asarray(owner, dtype=np.int64)
    if owners.shape != (rows,) or (rows and (owners.min() < 0 or owners.max() >= count or (np.diff(owners) < 0).any())):
        raise ValueError("owners")
    return owners


def _read_keymap(path: Path, sha256: Any, count: int, pieces: int, questions: int
                 ) -> tuple[list[Any], list[Any], np.ndarray, np.ndarray, dict[int, str]]:
    """The keymap's ids, text hashes, piece owners, question owners and question keys, checked against
    its recorded ``sha256``, ``count``, ``pieces`` and ``questions``."""
    try:
        raw_keymap = path.read_bytes()
        if hashlib.sha256(raw_keymap).hexdigest() != sha256:
            raise ValueError("checksum")
        km = loads(raw_keymap)
        ids, hashes = km["ids"], km["hashes"]
        if not (isinstance(ids, list) and isinstance(hashes, list) and len(ids) == len(hashes) == count):
            raise ValueError("length")
        owners = _owners(km.get("piece_owner", []), pieces, count)
        asked = _owners(km.get("question_owner", []), questions, count)
        keys = {int(label): str(key) for label, key in (km.get("question_keys") or {}).items()}
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
        self._check_files(paths, files)
        ours = manifest.get("generation") == self.written  # hashed as we wrote it, under the lock
        rule, hype = manifest.get("pieces"), manifest.get("questions")
        n_pieces = int(rule.get("rows") or 0) if isinstance(rule, dict) else 0
        n_questions = int(hype.get("rows") or 0) if isinstance(hype, dict) else 0
        ids, hashes, owner, asked, keys = _read_keymap(paths["keymap"], files["keymap"].get("sha256"), count,
                                                       n_pieces, n_questions)
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
        if ours:
            index.trust_graph()  # (else the graph's sha256 is checked before hnswlib first reads it: hnsw())
        return index

    @staticmethod
    def _rows(paths: dict[str, Path], files: dict[str, Any], key: str, shape: tuple[int, Any], ours: bool) -> np.ndarray:
        """One of the generation's arrays, memory-mapped, checked against its sha256 (unless this
        process wrote it) and its shape."""
        path = paths.get(key)
        try:
            if path is None:
                raise ValueError("missing")
            if not ours and file_sha256(path) != (files.get(key) or {}).get("sha256"):
                raise ValueError("checksum")
            rows: np.ndarray = np.load(path, mmap_mode="r", allow_pickle=False)
            if rows.dtype != np.float32 or rows.shape != shape:
                raise ValueError("shape")
        except (OSError, ValueError):
            raise StoreError(f"stored {key} are corrupt; run memory-rebuild", code=codes.VECTORS_CORRUPT,
                             details={"file": path.name if path else key}) from None
        return rows

    def load_current(self, attempts: int = 5) -> tuple[Manifest | None, VectorIndex | None]:
        """Manifest and its generation, retrying if a writer swapped them mid-read."""
        for _ in range(attempts):
            manifest = self.read_manifest()
            if manifest is None:
                return None, None
            try:
                return manifest, self.load(manifest)
            except StoreError as exc:
                again = self.read_manifest()
                if again is not None and again.get("generation") != manifest.get("generation"):
                    continue  # a writer committed while we read: read the new generation
                raise exc
        raise StoreError("derived files keep changing under the reader", code=codes.INDEX_BUSY)

    # -- writing (caller holds the write lock) -----------------------------------
    def commit(
        self,
        *,
        ids: list[str],
        hashes: list[str],
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
        appended after base's, whose rows, keymap entries and graph are kept
        (the graph is extended).  Without it, ``vectors`` are every row and a
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
        gen = f"{int(time.time() * 1000):x}-{secrets.token_hex(3)}"
        base_gen = (previous or {}).get("generation")
        names = _names(gen)
        count = len(ids)
        written: list[Path] = []
        try:
            files: dict[str, Any] | None = None
            if base is not None and not len(base):
                base = None  # an empty generation: nothing to extend
            pieces = joined_pieces(base, pieces)
            if count:
                vectors = np.ascontiguousarray(vectors, dtype=np.float32)
                index_path = self.folder / names["index"]
                if self.graph:
                    if base is not None and base.hnsw_path is not None:
                        base.verify_graph()  # hnswlib trusts what it reads: only the graph the manifest names
                        graph = load_hnsw(base.hnsw_path, base.dim, capacity=count)
                        graph = build_hnsw(vectors, params, base=graph)
                    elif base is not None:  # no graph to extend (no signing key): one over every row
                        graph = build_hnsw(np.concatenate([np.asarray(base.vectors, dtype=np.float32), vectors]),
                                           params)
                    else:
                        graph = build_hnsw(vectors, params)
                    written.append(index_path)
                    graph.save_index(str(index_path))
                digests, paths = self._write_rows(names, written, ids, hashes, vectors, base, pieces, questions)
                if self.graph:
                    digests["index"] = file_sha256(index_path)
                    paths.insert(0, ("index", index_path))
                files = {}
                for key, path in paths:
                    os.chmod(path, FILE_MODE)
                    fsync_path(path)
                    files[key] = {"name": path.name, "bytes": path.stat().st_size, "sha256": digests[key]}
                fsync_dir(self.folder)
                crash_point("commit-files-written")
            order = self._order_stats(vectors, base, previous)
            now = now_iso()
            doc: dict[str, Any] = {
                "format": CACHE_FORMAT,
                "schema_version": SCHEMA_VERSION,
                "generation": gen,
                # An append keeps every row of this generation: readers keep their label mapping.
                "appended_to": base_gen if base is not None else None,
                "embedding": embedding,
                "hnsw": params.to_dict(),
                "alpha": alpha,
                "files": files,
                "covers": {"count": count, "digest": covers_digest(ids, hashes),
                           "last_id": ids[-1] if ids else None},
                "order": order,  # running sums for the coherence of log order (search/neighbours.py)
                "kappa": kappa(order),
                "created_at": (previous or {}).get("created_at") or now,
                "rebuilt_at": now if rebuilt else (previous or {}).get("rebuilt_at"),
                "updated_at": now,
                **carried_side_weight(side_weight, previous),
                **pieces_field(pieces),
                **questions_field(questions if count else None),
                **(extra or {}),
            }
            manifest = cast(Manifest, sign(doc))
            atomic_write_bytes(self.manifest_path, dumps(manifest, pretty=True))
            self.written = gen
        except BaseException:
            for path in written:
                path.unlink(missing_ok=True)
            raise
        self.collect_garbage(keep=gen)
        return manifest

    def _write_rows(self, names: dict[str, str], written: list[Path], ids: list[str], hashes: list[str],
                    vectors: np.ndarray, base: VectorIndex | None, pieces: Pieces | None,
                    questions: Questions | None) -> tuple[dict[str, str], list[tuple[str, Path]]]:
        """Write the keymap, the vectors and the pieces and questions there are (each path into
        ``written`` before it is created); their sha256 digests and paths."""
        keymap_path = self.folder / names["keymap"]
        written.append(keymap_path)
        owner = [] if pieces is None else pieces.owner.tolist()
        asked = {} if questions is None or not len(questions) else {
            "question_owner": questions.rows.owner.tolist(),
            "question_keys": {str(label): key for label, key in sorted(questions.keys.items())}}
        keymap = dumps({"format": CACHE_FORMAT, "ids": ids, "hashes": hashes, "piece_owner": owner, **asked})
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
            return order_stats(vectors, before, np.asarray(base.vectors[-1]))
        return order_stats(np.concatenate([np.asarray(base.vectors, dtype=np.float32), vectors]))

    def collect_garbage(self, keep: str | None) -> list[str]:
        """Delete generations other than ``keep`` and stale temp files (under the lock)."""
        removed = []
        keep_names = set(_names(keep).values()) if keep else set()
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

    def commit(self, *, ids: list[str], hashes: list[str], vectors: np.ndarray, embedding: dict[str, Any],
               params: HnswParams, alpha: float, previous: Manifest | None, base: VectorIndex | None = None,
               rebuilt: bool = False, side_weight: dict[str, Any] | None = None,
               pieces: Pieces | None = None, questions: Questions | None = None) -> Manifest:
        """Under the lock: publish a new vector generation (``base``: extend the current one)."""
        ensure_dir(self.folder)
        return self.cache.commit(ids=ids, hashes=hashes, vectors=vectors, embedding=embedding, params=params,
                                 alpha=alpha, previous=previous, base=base, rebuilt=rebuilt, side_weight=side_weight,
                                 pieces=pieces, questions=questions)

"""The library object: everything a verb does is one method of :class:`Memory`.

Data flows one way: records (``records.jsonl``) → embeddings → derived cache
(index, keymap, vectors, manifest) → query.  Writes append the record lines
under the lock and fsync them *before* the derived files change; embedding
runs outside the lock; the derived files are committed under the lock as one
new generation (see ``cache.py``).
"""

from __future__ import annotations

import functools
import os
import shutil
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable

from ..store.cache import DerivedCache
from ..config import MEMORY_DIR, Project, load_project, read_config_file
from ..embed.model import Embedder, fingerprint_of, make_embedder
from ..faults import crash_point
from ..errors import (
    DisabledError, EmbeddingError, InputError, NubosMemoryError, RebuildRequired, StoreError, UsageError,
)
from ..fsio import DIR_MODE, atomic_write_bytes, dumps, ensure_dir
from ..store.lexcache import LexicalCache
from ..store.lock import WriteLock
from ..store.recordlog import LogScan, RecordLog, forget_op
from ..records import MAX_REASON, SCHEMA_VERSION, embed_text, epoch_to_iso, iso_to_epoch, one_line, valid_id, validate_batch
from ..search.snapshot import Snapshot
from ..store.usage import Usage, parse_duration
from ..index.vectors import HnswParams, VectorIndex

RECORDS = "records.jsonl"
MEMORY_FILES = (RECORDS, RECORDS + ".torn", "manifest.json", "lexical.json", "usage.json", "usage.jsonl",
                ".lock", ".lock.holder.json", ".gitignore", ".gitattributes", "serve.sock")
MAX_K = 1000
SPEC_SHOWN = ("provider", "model", "files", "dim", "template", "pooling")
MAX_QUERY_CHARS = 10_000
EMBED_BATCH = 256

GITIGNORE = """# nubos-memory: everything here but the source of truth is a derived cache,
# rebuilt exactly from records.jsonl by `np-tools memory-rebuild`.
*
!.gitignore
!.gitattributes
!records.jsonl
"""
GITATTRIBUTES = "records.jsonl merge=union\n"

Progress = Callable[[int, int], None]


@dataclass
class VectorState:
    """The vector layer as one operation sees it, by record position in the log."""

    index: VectorIndex | None = None
    manifest: dict[str, Any] | None = None
    labels: Any = None  # np.ndarray: position -> label in ``index``, -1 when it has no vector there
    extra: dict[int, Any] = field(default_factory=dict)  # position -> vector embedded, not persisted
    degraded: dict[str, Any] | None = None
    indexed: int = 0
    embedded: int = 0


def folder_notices(folder: Path) -> list[dict[str, Any]]:
    """Warnings about a memory folder that other users could write to (a clone may carry any mode)."""
    try:
        st = os.stat(folder)
    except OSError:
        return []
    out = []
    if st.st_uid != os.getuid():
        out.append({"code": "memory-folder-not-owned",
                    "message": f"the memory folder belongs to uid {st.st_uid}, not to this user; its owner can "
                               "change every file in it"})
    if st.st_mode & 0o022:
        out.append({"code": "memory-folder-writable",
                    "message": f"the memory folder is writable by group or others (mode {st.st_mode & 0o777:o}): "
                               "another user could replace its files or put a server in it; memory-serve is not "
                               f"used. Fix: chmod 700 {folder}"})
    return out


def _answer(method: Callable[..., Any]) -> Callable[..., Any]:
    """A verb: its answer carries the memory folder's notices in ``warnings``."""
    @functools.wraps(method)
    def verb(self: "Memory", *args: Any, **kwargs: Any) -> Any:
        result = method(self, *args, **kwargs)
        if isinstance(result, dict) and self.notices:
            warnings = result.setdefault("warnings", [])
            have = {w.get("code") for w in warnings}
            warnings.extend(n for n in self.notices if n["code"] not in have)
        return result
    return verb


class Memory:
    """One project's memory.  ``Memory.open()`` finds the project like the CLI does."""

    def __init__(self, project: Project, embedder: Embedder | None = None):
        self.project = project
        self.config = project.config
        self.folder = project.memory_dir
        self.log = RecordLog(self.folder / RECORDS)
        self.cache = DerivedCache(self.folder)
        self.lock = WriteLock(self.folder, self.config.lock_timeout)
        self.snap = Snapshot(self.log, self.cache, LexicalCache(self.folder, self.folder / RECORDS))
        self.usage = Usage(self.folder)
        self._embedder = embedder
        self._settle_tried: tuple[int, int] | None = None
        self.notices: list[dict[str, Any]] = []
        self.params = HnswParams(self.config.hnsw_m, self.config.hnsw_ef_construction, self.config.hnsw_ef_search)
        self._guarded = (project.state_dir, self.folder, project.config_path,
                         *(self.folder / name for name in MEMORY_FILES))  # checked before every verb

    @classmethod
    def open(cls, root: str | os.PathLike[str] | None = None, *, embedder: Embedder | None = None) -> "Memory":
        return cls(load_project(root), embedder)

    # -- plumbing ------------------------------------------------------------------
    @property
    def embedder(self) -> Embedder:
        """The configured embedder (constructed on first use; the model loads on first embed)."""
        if self._embedder is None:
            self._embedder = make_embedder(self.config.provider, self.config.model)
        return self._embedder

    def _require_enabled(self) -> None:
        if not self.config.enabled:
            raise DisabledError(
                "memory is disabled for this project (memory.enabled is false); run memory-init to enable it",
                details={"root": str(self.project.root), "config": str(self.project.config_path)},
            )
        self._check_tree()

    def _check_tree(self) -> None:
        """Refuse a memory folder whose parts are symlinks or lead outside the project.

        A ``.nubos-pilot/`` from an untrusted clone could otherwise make us read
        a file outside the project (and print parts of it as "corrupt lines")
        or append to one (``usage.jsonl`` -> ``~/.bashrc``), or truncate one
        (the lock file).  Every file we open there is checked here, and the
        log and usage files are also opened with ``O_NOFOLLOW``.
        """
        root = self.project.root
        self.notices = folder_notices(self.folder)
        for path in self._guarded:
            if os.path.islink(path):
                raise StoreError(f"{path.relative_to(root)} is a symlink; memory files are never followed "
                                 "through links (an untrusted clone could point them anywhere)",
                                 code="store-symlink-refused", details={"path": str(path)})
        if self.folder.exists():
            try:
                self.folder.resolve().relative_to(root.resolve())
            except ValueError:
                raise StoreError("the memory folder resolves outside the project", code="store-symlink-refused",
                                 details={"path": str(self.folder)}) from None

    def _prepare_folder(self) -> None:
        ensure_dir(self.folder)
        for name, text in ((".gitignore", GITIGNORE), (".gitattributes", GITATTRIBUTES)):
            path = self.folder / name
            if not path.exists():
                atomic_write_bytes(path, text.encode())

    def _mismatch(self, manifest: dict[str, Any], dim: int | None) -> RebuildRequired | None:
        """A RebuildRequired if the manifest's vectors are not comparable with ours."""
        stored = manifest["embedding"]
        ours = self.embedder.spec(dim)
        if dim is None and ours["dim"] is None:
            ours = {**ours, "dim": stored.get("dim")}  # dimension unknown until the model loads
        if fingerprint_of(ours) == stored.get("fingerprint"):
            return None
        return RebuildRequired(
            "the index was built with another embedding model or settings; vectors of the two are never "
            "mixed. Run memory-rebuild.",
            details={"index": {k: stored.get(k) for k in SPEC_SHOWN + ("fingerprint",)},
                     "config": {**{k: ours.get(k) for k in SPEC_SHOWN}, "fingerprint": fingerprint_of(ours)}},
        )

    def _our_embedding(self) -> dict[str, Any]:
        spec = self.embedder.spec(self.embedder.dim)
        return {**spec, "fingerprint": fingerprint_of(spec)}

    def _sync_vectors(self, positions: Any = None, *, must: Iterable[int] = (), cap: int,
                      blocking: bool, verb: str, precomputed: dict[int, Any] | None = None) -> VectorState:
        """Load the vector layer and embed+index the live records (positions; None = all) it lacks.

        ``must`` positions are always embedded (the records a write just
        added); other missing records up to ``cap``.  ``precomputed`` vectors
        (a write embedded them to look for near duplicates) and vectors of the
        same text already in the index are reused, never re-embedded.
        Failures come back as ``degraded``, never as exceptions: the records
        are already safe.
        """
        import numpy as np

        state = VectorState()
        snap = self.snap
        try:
            state.manifest, state.index, state.labels = snap.vectors()
            if state.manifest is not None:
                err = self._mismatch(state.manifest, None)
                if err:
                    raise err
            labels = state.labels
            cand = np.arange(len(labels)) if positions is None else np.asarray(positions, dtype=np.int64)
            missing = cand[(labels[cand] < 0) & snap.alive[cand]].tolist() if len(cand) else []
            must = set(must)
            todo = [p for p in missing if p in must] + [p for p in missing if p not in must][:cap]
            if todo:
                known = dict(precomputed or {})
                if state.index is not None:  # the same text already embedded (another id, an earlier life)
                    for p in todo:
                        label = state.index.label_of_hash(snap.hashes[p])
                        if p not in known and label is not None:
                            known[p] = state.index.vectors[label]
                fresh = [p for p in todo if p not in known]
                if fresh:
                    records = snap.scan.records  # type: ignore[union-attr]
                    known.update(zip(fresh, self._embed([embed_text(records[p]) for p in fresh])))
                    if state.manifest is not None:
                        err = self._mismatch(state.manifest, self.embedder.dim)
                        if err:
                            raise err
                state.embedded = len(fresh)
                state.extra = {p: known[p] for p in todo}
                self._persist(state, todo, blocking=blocking, verb=verb)
        except (StoreError, EmbeddingError, RebuildRequired) as exc:
            state.degraded = exc.to_dict()
        except OSError as exc:  # disk full, permissions: the records are safe, the index is behind
            state.degraded = StoreError(
                f"could not write the derived index: {exc.strerror or exc}; records are saved and will be "
                "indexed by the next write, query or memory-rebuild", code="index-write-failed").to_dict()
        return state

    def _embed(self, texts: list[str], progress: Progress | None = None) -> Any:
        """Embed in chunks (for progress), longest texts first: the model pads each batch to its
        longest text, so chunks of similar lengths waste less than chunks in arrival order."""
        import numpy as np

        out = np.zeros((len(texts), self.embedder.dim), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        for start in range(0, len(texts), EMBED_BATCH):
            chunk = order[start : start + EMBED_BATCH]
            out[chunk] = self.embedder.embed([texts[i] for i in chunk])
            if progress:
                progress(min(start + EMBED_BATCH, len(texts)), len(texts))
        return out

    def _persist(self, state: VectorState, todo: list[int], *, blocking: bool, verb: str) -> None:
        """Commit newly embedded vectors as a new generation (under the lock)."""
        import numpy as np

        snap = self.snap
        hold = self.lock.hold(verb) if blocking else self.lock.try_hold(verb)
        with hold as got:
            if got is False:
                return  # another writer is busy; this query uses its vectors in memory only
            manifest, current, _ = snap.vectors()  # the generation as it is now, under the lock
            if manifest is not None:
                err = self._mismatch(manifest, self.embedder.dim)
                if err:
                    raise err
            records = snap.scan.records  # type: ignore[union-attr]
            ids = list(current.ids) if current else []
            hashes = list(current.hashes) if current else []
            label_of = current.label_of if current else {}
            replaced: dict[int, Any] = {}
            new_ids, new_hashes, new_vecs = [], [], []
            for pos in todo:
                rid, h = records[pos]["id"], snap.hashes[pos]
                label = label_of.get(rid)
                if label is None:
                    new_ids.append(rid)
                    new_hashes.append(h)
                    new_vecs.append(state.extra[pos])
                elif hashes[label] != h:  # the record's text changed (a hand edit): replace its vector
                    hashes[label] = h
                    replaced[label] = state.extra[pos]
            if new_ids or replaced:
                appended = np.stack(new_vecs) if new_vecs else np.zeros((0, self.embedder.dim), dtype=np.float32)
                if replaced:  # rare: every row is written and the graph built afresh
                    rows = np.array(current.vectors, dtype=np.float32)  # type: ignore[union-attr]
                    rows[list(replaced)] = np.stack(list(replaced.values()))
                    vectors, base = np.concatenate([rows, appended]), None
                else:  # the common case: the current generation's rows are kept, the new ones appended
                    vectors, base = appended, current
                self.cache.commit(
                    ids=ids + new_ids, hashes=hashes + new_hashes, vectors=vectors,
                    embedding=self._our_embedding(), params=self.params, alpha=self.config.alpha,
                    previous=manifest, base=base,
                )
                state.indexed = len(new_ids)
            state.manifest, state.index, state.labels = snap.vectors()
            state.extra = {p: v for p, v in state.extra.items() if state.labels[p] < 0}

    # -- verbs -----------------------------------------------------------------------
    @_answer
    def init(self) -> dict[str, Any]:
        """Create the memory folder and enable memory in the project config."""
        self._check_tree()
        state_dir = self.project.state_dir
        created = []
        for folder in (state_dir, self.folder):
            if not folder.exists():
                created.append(str(folder.relative_to(self.project.root)))
        state_dir.mkdir(mode=DIR_MODE, exist_ok=True)
        doc = read_config_file(self.project.config_path) or {}
        section = dict(doc.get("memory") or {})
        section["enabled"] = True
        doc["memory"] = section
        # Validate what we are about to write, so init never leaves a config that later verbs reject.
        from ..config import _validate

        config = _validate(section)
        atomic_write_bytes(self.project.config_path, dumps(doc, pretty=True) + b"\n")
        self.config = config
        self._prepare_folder()
        self.usage.start()
        return {
            "initialized": True,
            "root": str(self.project.root),
            "memory_dir": str(self.folder),
            "config_path": str(self.project.config_path),
            "created": created,
            "config": config.to_dict(),
        }

    @_answer
    def add(self, record: dict[str, Any], *, force: bool = False) -> dict[str, Any]:
        """Add one record (``memory-add``).  ``id`` in the answer is the record that holds it:
        the new one, or the live record whose text it repeats exactly (``duplicate_of``).  A near
        duplicate is stored and named in ``near_duplicate_of`` with its ``similarity``."""
        result = self.index([record], verb="memory-add", force=force)
        near = result["near_duplicates"][0] if result["near_duplicates"] else None
        extra = {"near_duplicate_of": near["near_duplicate_of"] if near else None,
                 "similarity": near["similarity"] if near else None}
        if result["ids"]:
            return {"id": result["ids"][0], "duplicate_of": None, **extra, **result}
        if result["duplicates"]:
            dup = result["duplicates"][0]
            return {"id": dup["duplicate_of"], "duplicate_of": dup["duplicate_of"], **extra, **result}
        return {"id": result["skipped_ids"][0], "duplicate_of": None, **extra, **result}

    @_answer
    def index(self, raws: list[Any], *, verb: str = "memory-index", force: bool = False) -> dict[str, Any]:
        """Validate a batch whole, append the new records durably, then index them (``memory-index``).

        Records whose id is live are skipped; exact duplicates of live records (same type and
        text, adr/0009) are reported as ``duplicates`` and not stored, unless ``force``.  Near
        duplicates are stored and reported as ``near_duplicates``.
        """
        self._require_enabled()
        records = validate_batch(raws, self.config.record_types)
        return self._write(records, verb=verb, force=force)

    @_answer
    def forget(self, ids: list[str], *, reason: str = "forgotten") -> dict[str, Any]:
        """Retire records (``memory-forget``): a tombstone per id is appended; the log keeps the records,
        results never show them again, the next rebuild drops their vectors."""
        self._require_enabled()
        if not ids:
            raise UsageError("give at least one record id to forget")
        bad = [i for i in ids if not valid_id(i)]
        if bad:
            raise InputError(f"not a record id: {bad[0]!r}", code="record-invalid-id", details={"ids": bad[:20]})
        if not one_line(reason, MAX_REASON):
            raise InputError(f"a reason is 1-{MAX_REASON} characters on one line", code="forget-invalid-reason",
                             details={"length": len(reason) if isinstance(reason, str) else None})
        out = self._write([], forget=list(dict.fromkeys(ids)), reason=reason, verb="memory-forget")
        return {k: out[k] for k in ("forgotten", "already_retired", "recovered", "warnings")}

    def _write(self, records: list[dict[str, Any]], *, verb: str, force: bool = False,
               forget: list[str] = (), reason: str = "forgotten",  # type: ignore[assignment]
               reasons: dict[str, str] | None = None) -> dict[str, Any]:
        """The one write path: decide what is new, append records and tombstones as one change, index.

        Cheap decisions (existing id, exact duplicate) are made first, so a
        re-logged record embeds nothing; the rest is embedded outside the lock
        (to be indexed, and to report near duplicates); then, under the lock,
        every decision is re-checked against the log as it is now and the
        change is appended and fsynced before any derived file changes.
        """
        import numpy as np

        from ..search.dedup import find_exact, fingerprint, nearest, within_batch

        self._prepare_folder()
        snap = self.snap
        dupes: dict[int, dict[str, Any]] = {}  # batch index -> the live record whose text it repeats
        near: dict[int, dict[str, Any]] = {}  # batch index -> its most similar live (or earlier) record
        vectors: dict[int, Any] = {}  # batch index -> its vector, when embedded ahead
        degraded = None
        scan = snap.refresh()  # an unfinished tail is settled under the lock below, and reported
        checked = (scan.generation, len(scan.records), len(scan.deaths))  # the log the decisions saw
        if records and not force:
            seen: dict[str, int] = {}
            lexical = snap.lexical_engine() if scan.live_count else None
            for i, r in enumerate(records):
                if scan.live(r["id"]) is not None:
                    continue
                fp = fingerprint(r)
                if fp in seen:
                    dupes[i] = {"duplicate_of": records[seen[fp]]["id"], "kind": "exact"}
                    continue
                seen[fp] = i
                hit = find_exact(r, scan, lexical, snap.alive) if lexical is not None else None
                if hit is not None:
                    dupes[i] = {"duplicate_of": scan.records[hit]["id"], "kind": "exact"}
        todo = [i for i, r in enumerate(records) if i not in dupes and scan.live(r["id"]) is None]
        threshold = self.config.near_duplicate
        if todo and threshold is not None:
            try:
                manifest, index, labels = snap.vectors()
                mismatch = self._mismatch(manifest, None) if manifest is not None else None
                if mismatch:
                    raise mismatch
                embedded = self._embed([embed_text(records[i]) for i in todo])
                vectors = dict(zip(todo, embedded))
                live_labels = labels[(labels >= 0) & snap.alive]
                near_labels, near_sims = nearest(embedded, index, live_labels)
                for i, label, sim in zip(todo, near_labels.tolist(), near_sims.tolist()):
                    if sim >= threshold:
                        pos = int(snap.positions_of(np.array([label]))[0])
                        # A revision resembles what it replaces: that is no near duplicate worth naming.
                        if pos >= 0 and scan.records[pos]["id"] != records[i].get("supersedes"):
                            near[i] = {"near_duplicate_of": scan.records[pos]["id"], "similarity": round(sim, 4)}
                for a, b, sim in within_batch(embedded, threshold):
                    if todo[a] not in near or near[todo[a]]["similarity"] < sim:
                        near[todo[a]] = {"near_duplicate_of": records[todo[b]]["id"], "similarity": round(sim, 4)}
            except (StoreError, EmbeddingError, RebuildRequired) as exc:
                degraded = exc.to_dict()  # no vectors ahead and no near-duplicate report; exact ones still hold

        with self.lock.hold(verb):
            scan, recovered = self._refresh_recovered()
            before = len(scan.records)
            new, new_index, skipped, batch_ids = [], [], [], set()
            moved = (scan.generation, len(scan.records), len(scan.deaths)) != checked
            lexical = snap.lexical_engine() if moved and records and not force and scan.live_count else None
            for i, r in enumerate(records):
                if scan.live(r["id"]) is not None or r["id"] in batch_ids:
                    skipped.append(r["id"])
                    continue
                if i in dupes:
                    continue
                if lexical is not None:  # another writer changed the log meanwhile: it may hold the same text
                    hit = find_exact(r, scan, lexical, snap.alive)
                    if hit is not None:
                        dupes[i] = {"duplicate_of": scan.records[hit]["id"], "kind": "exact"}
                        continue
                old = r.get("supersedes")
                if old is not None and scan.live(old) is None and old not in batch_ids:
                    raise InputError(f"record {i} supersedes {old!r}, which is not a live record; nothing was written",
                                     code="record-supersedes-unknown",
                                     details={"index": i, "id": r["id"], "supersedes": old, "written": 0})
                batch_ids.add(r["id"])
                new.append(r)
                new_index.append(i)
            ops, forgotten, already = [], [], []
            if forget:
                unknown = [rid for rid in forget if rid not in scan.position]
                if unknown:
                    raise InputError(f"no record has the id {unknown[0]!r}; nothing was forgotten",
                                     code="record-not-found", details={"ids": unknown[:50], "written": 0})
                for rid in forget:
                    if scan.live(rid) is None:
                        already.append(rid)
                    else:
                        ops.append(forget_op(rid, (reasons or {}).get(rid, reason)))
                        forgotten.append(rid)
            self.log.append(new, ops)
            crash_point("after-append")
            scan = snap.refresh()
            self._save_lexical()
        positions = range(before, before + len(new))
        precomputed = {p: vectors[i] for p, i in zip(positions, new_index) if i in vectors}
        state = self._sync_vectors(None, must=positions, cap=self.config.max_pending_embed, blocking=True,
                                   verb=verb, precomputed=precomputed)
        pending = (int(((state.labels < 0) & snap.alive).sum()) - len(state.extra)
                   if state.degraded is None and state.labels is not None else None)
        stored = set(new_index)
        return {
            "added": len(new),
            "skipped": len(skipped),
            "ids": [r["id"] for r in new],
            "skipped_ids": skipped,
            "duplicates": [{"index": i, "id": records[i]["id"], **d} for i, d in sorted(dupes.items())],
            "near_duplicates": [{"index": i, "id": records[i]["id"], **d} for i, d in sorted(near.items())
                                if i in stored],
            "forgotten": forgotten,
            "already_retired": already,
            "indexed": state.indexed,
            "embedded": state.embedded + len(vectors),
            "pending": pending,
            "degraded": state.degraded or degraded,
            "recovered": recovered,
            "warnings": scan.warnings(),
        }

    def _refresh_recovered(self) -> tuple[LogScan, dict[str, Any] | None]:
        """Under the lock: the log as it is now, after setting aside what a crashed writer left."""
        scan = self.snap.refresh()
        recovered = self.log.recover_tail(scan)
        return (self.snap.refresh() if recovered else scan), recovered

    def _save_lexical(self, force: bool = False) -> None:
        """Under the lock: persist the lexical index when due; a failure only costs speed."""
        try:
            self.snap.save_lexical(force)
        except OSError:
            pass

    @_answer
    def query(
        self,
        text: str | None,
        *,
        k: int = 8,
        type: str | None = None,
        phase: str | None = None,
        tags: list[str] | None = None,
        alpha: float | None = None,
        fusion: str | None = None,
        explain: bool = False,
        mode: str = "hybrid",
        max_tokens: int | None = None,
        track: bool = True,
        collapse: bool = True,
    ) -> dict[str, Any]:
        """Hybrid search (``memory-query``); see ``fusion.py`` for the scoring.

        ``max_tokens`` keeps the best hits whose markdown blocks fit the budget
        (``context.py``).  ``track`` records the returned hits as retrieved
        (usage, for ``memory-prune``).  ``collapse`` shows near duplicates as one hit (adr/0009).
        """
        from ..search.context import fit_budget
        from ..search.query import MODES, run_query

        self._require_enabled()
        if text is None:
            raise UsageError("query text is required (--text or positional)")
        if not isinstance(text, str) or not text.strip():
            raise InputError("query text is empty", code="memory-empty-query")
        if len(text) > MAX_QUERY_CHARS:
            raise InputError(f"query text is longer than {MAX_QUERY_CHARS} characters", code="query-too-long",
                             details={"length": len(text), "limit": MAX_QUERY_CHARS})
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
            raise InputError(f"k must be an integer in 1..{MAX_K}", code="query-invalid-k", details={"k": k})
        alpha = self.config.alpha if alpha is None else alpha
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0.0 <= alpha <= 1.0:
            raise InputError("alpha must be a number in [0, 1]", code="query-invalid-alpha", details={"alpha": alpha})
        fusion = fusion or self.config.fusion
        if fusion not in ("alpha", "rrf"):
            raise InputError("fusion must be 'alpha' or 'rrf'", code="query-invalid-fusion", details={"fusion": fusion})
        if mode not in MODES:
            raise InputError(f"mode must be one of {list(MODES)}", code="query-invalid-mode", details={"mode": mode})
        if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)
                                       or not 1 <= max_tokens <= 10_000_000):
            raise InputError("max_tokens must be a positive integer", code="query-invalid-max-tokens",
                             details={"max_tokens": max_tokens})
        result = run_query(self, text, k=k, type=type, phase=phase, tags=tags or [], alpha=float(alpha),
                           fusion=fusion, explain=explain, mode=mode, collapse=collapse)
        if max_tokens is not None:
            result["hits"], result["budget"] = fit_budget(result["hits"], max_tokens)
        if track and result["hits"] and not self.usage.record([h["id"] for h in result["hits"]]):
            result["warnings"].append({"code": "usage-not-recorded",
                                       "message": "could not append to usage.jsonl; retrievals are not counted"})
        return result

    @_answer
    def rebuild(self, progress: Progress | None = None, *, reembed: bool = False) -> dict[str, Any]:
        """Rebuild every derived file from ``records.jsonl`` (``memory-rebuild``).

        Vectors of unchanged text under the same fingerprint are reused unless
        ``reembed``; the graph is built fresh, in file order, single-threaded, fixed seed.
        """
        import numpy as np

        self._require_enabled()
        self._prepare_folder()
        scan = self.scan()
        all_hashes = self.snap.ensure_hashes()
        live = [p for p in range(len(scan.records)) if p not in scan.dead]  # the dead are not indexed
        records = [scan.records[p] for p in live]
        hashes = [all_hashes[p] for p in live]
        count = len(records)
        ours = self._our_embedding()
        reuse: dict[str, Any] = {}
        try:
            manifest, current = self.cache.load_current()
        except StoreError:
            manifest, current = None, None  # whatever is broken is replaced, on explicit request
        if not reembed and manifest is not None and current is not None and manifest["embedding"].get("fingerprint") == ours[
            "fingerprint"
        ]:
            reuse = {h: i for i, h in enumerate(current.hashes)}
        todo: dict[str, str] = {}
        for r, h in zip(records, hashes):
            if h not in reuse and h not in todo:
                todo[h] = embed_text(r)
        fresh = self._embed(list(todo.values()), progress)
        fresh_of = {h: i for i, h in enumerate(todo)}
        vectors = np.zeros((count, self.embedder.dim), dtype=np.float32)
        rows_fresh = [(row, fresh_of[h]) for row, h in enumerate(hashes) if h in fresh_of]
        rows_reused = [(row, reuse[h]) for row, h in enumerate(hashes) if h not in fresh_of]
        if rows_fresh:
            dst, src = zip(*rows_fresh)
            vectors[list(dst)] = fresh[list(src)]
        if rows_reused:
            dst, src = zip(*rows_reused)
            vectors[list(dst)] = current.vectors[list(src)]  # type: ignore[union-attr]
        crash_point("rebuild-embedded")
        with self.lock.hold("memory-rebuild"):
            try:
                previous = self.cache.read_manifest()
            except StoreError:
                previous = None
            new_manifest = self.cache.commit(
                ids=[r["id"] for r in records], hashes=hashes, vectors=vectors, embedding=ours,
                params=self.params, alpha=self.config.alpha, previous=previous, base=None, rebuilt=True,
            )
            self.snap.lexical = None  # rebuild the lexical index from scratch too
            self.snap.lexical_saved = 0
            self.snap.lexcache.invalidate()
            self.snap.refresh()
            self._save_lexical(force=True)
        return {
            "rebuilt": True,
            "count": count,
            "embedded": len(todo),
            "reused": len(rows_reused),
            "model": ours["model"],
            "dim": ours["dim"],
            "fingerprint": ours["fingerprint"],
            "rebuilt_at": new_manifest["rebuilt_at"],
            "skipped_lines": len(scan.corrupt) + len(scan.duplicates),
            "warnings": scan.warnings(),
        }

    @_answer
    def compact(self, progress: Progress | None = None) -> dict[str, Any]:
        """Rewrite ``records.jsonl`` with only its live records (``memory-compact``).

        Under the lock: the current file is kept as ``records.jsonl.bak-<time>``
        (a hard link, so not a byte is lost), the live records are written in
        their order to a new file that replaces the old one atomically, and the
        derived files are rebuilt from it (vectors reused, nothing re-embedded
        unless it was missing).
        """
        self._require_enabled()
        self._prepare_folder()
        with self.lock.hold("memory-compact"):
            scan, recovered = self._refresh_recovered()
            live = [scan.records[p] for p in range(len(scan.records)) if p not in scan.dead]
            stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
            backup = self.log.path.with_name(f"{RECORDS}.bak-{stamp}")
            before = self.log.path.stat().st_size if self.log.path.exists() else 0
            if self.log.path.exists():
                try:
                    os.link(self.log.path, backup)
                except OSError:
                    shutil.copy2(self.log.path, backup)
            crash_point("compact-backup-made")
            atomic_write_bytes(self.log.path, b"".join(dumps(r) + b"\n" for r in live))
            self.snap.lexcache.invalidate()
            self.usage.fold(force=True)
        result = self.rebuild(progress)
        return {
            "compacted": True,
            "kept": len(live),
            "dropped": {"retired": len(scan.dead), "duplicate_lines": len(scan.duplicates),
                        "corrupt_lines": len(scan.corrupt), "operations": scan.ops},
            "corrupt_lines": scan.corrupt[:50],
            "backup": backup.name if before else None,
            "bytes": {"before": before, "after": self.log.path.stat().st_size},
            "embedded": result["embedded"],
            "recovered": recovered,
        }

    @_answer
    def prune(self, unused_for: str, *, dry_run: bool = False) -> dict[str, Any]:
        """Retire never-retrieved records older than the window (``memory-prune``).

        A record is retired only if it was created before ``now - window`` and
        has no retrieval on record, and only if usage has been tracked for the
        whole window (otherwise "never retrieved" is not known); records with
        no ``created_at`` are kept.  Retiring appends tombstones (reason
        ``pruned``): the records stay in the log until ``memory-compact``.
        """
        self._require_enabled()
        window = parse_duration(unused_for)
        now = time.time()
        cutoff = now - window
        since, usage = self.usage.summary()
        scan = self.scan()
        out: dict[str, Any] = {"dry_run": dry_run, "unused_for": unused_for, "retired": [],
                               "kept": {"recent": 0, "retrieved": 0, "unknown_age": 0},
                               "tracked_since": epoch_to_iso(since), "warnings": scan.warnings()}
        if since is None or since > cutoff:
            out["warnings"].append({
                "code": "usage-history-too-short",
                "message": "usage has been tracked for less than the window, so no record is known to be unused "
                           "for that long; nothing was retired",
            })
            return out
        doomed = []
        for pos, rec in enumerate(scan.records):
            if pos in scan.dead:
                continue
            created = iso_to_epoch(rec.get("created_at"))
            if created is None:
                out["kept"]["unknown_age"] += 1
            elif rec["id"] in usage:
                out["kept"]["retrieved"] += 1
            elif created >= cutoff:
                out["kept"]["recent"] += 1
            else:
                doomed.append(rec["id"])
        if doomed and not dry_run:
            written = self._write([], forget=doomed, reason="pruned", verb="memory-prune")
            doomed = written["forgotten"]
        out["retired"] = doomed
        out["count"] = len(doomed)
        return out

    @_answer
    def ingest(self, paths: list[str], *, include: list[str] = (), exclude: list[str] = (),  # type: ignore[assignment]
               prune_missing: bool = False, record_type: str | None = None) -> dict[str, Any]:
        """Index markdown files and folders, idempotently (``memory-ingest``; see ``ingest.py``)."""
        from ..ingest.plan import ingest

        self._require_enabled()
        if not paths:
            raise UsageError("give at least one markdown file or folder")
        return ingest(self, paths, include=include, exclude=exclude, prune_missing=prune_missing,
                      record_type=record_type)

    @_answer
    def stats(self) -> dict[str, Any]:
        """Counts, model, timestamps and a consistency report (never loads the model)."""
        from .stats import collect_stats

        self._require_enabled()
        return collect_stats(self)

    def scan(self) -> LogScan:
        """Read ``records.jsonl`` (tolerating damage; see ``recordlog.py``), incrementally.

        If the log ends in an unfinished write and no writer holds the lock right now, that
        write is not in progress: it is settled here as the next writer would (``recordlog``),
        so a crash's or a hand edit's leftovers never hide records until the next write.
        """
        scan = self.snap.refresh()
        tail = scan.partial_tail
        if tail is not None and (scan.inode, scan.size) != self._settle_tried:
            self._settle_tried = (scan.inode, scan.size)
            try:
                with self.lock.try_hold("settle-log") as got:
                    if got:
                        scan, _ = self._refresh_recovered()
            except (OSError, NubosMemoryError):
                pass  # a read-only memory: the tail stays unapplied and reported
        return scan


__all__ = ["Memory", "VectorState", "RECORDS", "MEMORY_DIR", "SCHEMA_VERSION"]

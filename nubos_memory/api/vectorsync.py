"""Keeping the vector layer in step with the log: embed what lacks a vector, commit it.

A record is written to the log first; its vector follows (the write embeds
it, else the next query or write does, else ``memory-rebuild``).  ``sync``
loads the current vector generation, finds the live records that have no
vector for their current text, embeds them (reusing vectors of the same text,
and vectors a caller already computed), and commits them as a new generation
under the write lock.  Failures come back as ``degraded``, never as
exceptions: the records are already safe in the log.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from .. import codes
from ..embed.base import fingerprint_of
from ..errors import EmbeddingError, RebuildRequired, StoreError
from ..index.vectors import HnswParams, Pieces, Questions, question_key, usable
from ..progress import Progress
from ..records import embed_text
from ..search.sideweight import due, estimate
from ..search.snapshot import Snapshot, VectorState

if TYPE_CHECKING:
    from ..columns import Digests, Strings
    from ..config import MemoryConfig
    from ..embed.base import Embedder
    from ..index.vectors import VectorIndex
    from ..log import LogScan
    from ..store.base import Store
    from ..types import Embedding, Manifest

EMBED_BATCH = 256
BUDGET_CHUNK = 32  # texts embedded between two looks at the clock, when a call has a time budget
SPEC_SHOWN = ("provider", "model", "files", "dim", "template", "pooling")


def questions_wanted(scan: "LogScan") -> dict[str, tuple[str, list[str]]]:
    """HyPE: record id -> (``question_key``, questions) of every live record the log gives questions."""
    return {scan.records[pos]["id"]: (question_key(q["questions"]), list(q["questions"]))
            for pos, q in scan.questions.items() if pos not in scan.dead and q["questions"]}


def held_questions(index: "VectorIndex", want: dict[str, tuple[str, list[str]]]) -> dict[int, str]:
    """The labels whose question vectors still match the log (``want``): the latest label of a record whose
    questions in the log are the ones they were made from (label -> key)."""
    if index.questions is None:
        return {}
    return {label: key for label, key in index.questions.keys.items()
            if label < len(index.ids) and index.label_of.get(index.ids[label]) == label
            and want.get(index.ids[label], ("",))[0] == key}


class VectorSync:
    """The vector side of one memory (see module docstring)."""

    def __init__(self, snap: Snapshot, store: "Store", embedder: Callable[[], "Embedder"], config: "MemoryConfig"):
        self.snap = snap
        self.store = store
        self._embedder = embedder
        self.config = config
        self.params = HnswParams(config.hnsw_m, config.hnsw_ef_construction, config.hnsw_ef_search)
        self.shared = 0  # vectors the last embed() took from the store instead of the model
        self.invalid = 0  # vectors the model gave that were not usable (NaN, zero), in the last sync
        # True in memory-serve's writer and a one-shot CLI process: a write never waits for a side-weight
        # estimate; :meth:`idle` makes it (the server when idle, else a background ``memory-settle``)
        self.defer_side_weight = False
        self.estimate_left = False  # a write left an estimate that is due to :meth:`idle`

    @property
    def embedder(self) -> "Embedder":
        return self._embedder()

    def mismatch(self, manifest: "Manifest", dim: int | None) -> RebuildRequired | None:
        """A RebuildRequired if the manifest's vectors are not comparable with ours."""
        stored: dict[str, Any] = dict(manifest.get("embedding") or {})
        ours: dict[str, Any] = dict(self.embedder.spec(dim))
        if dim is None and ours["dim"] is None:
            ours["dim"] = stored.get("dim")  # dimension unknown until the model loads
        if fingerprint_of(ours) == stored.get("fingerprint"):
            return None
        return RebuildRequired(
            "the index was built with another embedding model or settings; vectors of the two are never "
            "mixed. Run memory-rebuild.",
            details={"index": {k: stored.get(k) for k in (*SPEC_SHOWN, "fingerprint")},
                     "config": {**{k: ours.get(k) for k in SPEC_SHOWN}, "fingerprint": fingerprint_of(ours)}},
        )

    def our_embedding(self) -> "Embedding":
        spec: dict[str, Any] = dict(self.embedder.spec(self.embedder.dim))
        spec["fingerprint"] = fingerprint_of(spec)
        return cast("Embedding", spec)

    def embed(self, texts: list[str], progress: Progress | None = None, *, shared: bool = True) -> np.ndarray:
        """:meth:`embed_parts` without the pieces."""
        return self.embed_parts(texts, progress, shared=shared)[0]

    def embed_parts(self, texts: list[str], progress: Progress | None = None, *, shared: bool = True
                    ) -> tuple[np.ndarray, dict[int, np.ndarray]]:
        """Embed in chunks (for progress), longest texts first: the model pads each batch to its
        longest text, so chunks of similar lengths waste less than chunks in arrival order.

        A store that shares vectors between machines (the team database) is asked first for the
        vectors of these exact texts under this model's fingerprint, and is given the ones made
        here (unless not ``shared``: a re-embed on request); ``self.shared`` counts the vectors taken
        from it by the last call.  Also returns the piece vectors of the texts embedded here in
        several pieces, by text (a shared vector comes without its pieces: that record scores by its
        pooled vector, ``index/vectors.py``)."""
        out = np.zeros((len(texts), self.embedder.dim), dtype=np.float32)
        pieces: dict[int, np.ndarray] = {}
        self.shared = 0
        if not texts:
            return out, pieces
        fingerprint = self.our_embedding()["fingerprint"]
        keys = [hashlib.sha256(t.encode("utf-8", "surrogatepass")).hexdigest()[:32] for t in texts]
        known = self.store.shared_vectors(fingerprint, keys) if shared else {}
        todo = []
        for i, key in enumerate(keys):
            vec = known.get(key)
            if vec is not None and vec.shape == (out.shape[1],) and usable(vec[None, :])[0]:
                out[i] = vec
            else:
                todo.append(i)
        self.shared = len(texts) - len(todo)
        order = sorted(todo, key=lambda i: -len(texts[i]))
        for start in range(0, len(order), EMBED_BATCH):
            chunk = order[start: start + EMBED_BATCH]
            out[chunk], parts = self.embedder.embed_parts([texts[i] for i in chunk])
            pieces.update((chunk[j], rows) for j, rows in parts.items())
            if progress:
                progress(self.shared + min(start + EMBED_BATCH, len(order)), len(texts))
        good = usable(out)
        if todo:
            self.store.share_vectors(fingerprint, {keys[i]: out[i] for i in todo if good[i]})
        return out, {i: rows for i, rows in pieces.items() if good[i] and usable(rows).all()}

    def sync(self, positions: np.ndarray | None = None, *, must: Iterable[int] = (), cap: int, blocking: bool,
             verb: str, precomputed: dict[int, np.ndarray] | None = None, budget_s: float | None = None,
             progress: Progress | None = None, precomputed_pieces: dict[int, np.ndarray] | None = None
             ) -> VectorState:
        """Load the vector layer and embed+index the live records (``positions``; None = all) it lacks.

        ``must`` positions are always embedded (the records a write just
        added); other missing records up to ``cap``, and for at most
        ``budget_s`` seconds of embedding (a query must not wait for a
        backlog: what is left is ranked lexically and reported as behind).
        ``precomputed`` vectors and vectors of the same text already in the
        index are reused, never re-embedded.  ``blocking``: wait for the lock
        to commit (a write), or commit only if it is free (a query).
        """
        state = VectorState()
        self.invalid = 0
        try:
            self._load_and_fill(state, positions, must=must, cap=cap, blocking=blocking, verb=verb,
                                precomputed=precomputed, budget_s=budget_s, progress=progress,
                                precomputed_pieces=precomputed_pieces or {})
            if blocking and not self.snap.unsigned:  # a write (never a query): HyPE's questions get vectors
                self._sync_questions(state, verb)
        except (StoreError, EmbeddingError, RebuildRequired) as exc:
            state.degraded = exc.to_dict()
        except OSError as exc:  # disk full, permissions: the records are safe, the index is behind
            state.degraded = StoreError(
                f"could not write the derived index: {exc.strerror or exc}; records are saved and will be "
                "indexed by the next write, query or memory-rebuild", code=codes.INDEX_WRITE_FAILED).to_dict()
        return state

    def _load_and_fill(self, state: VectorState, positions: np.ndarray | None, *, must: Iterable[int], cap: int,
                       blocking: bool, verb: str, precomputed: dict[int, np.ndarray] | None,
                       budget_s: float | None, progress: Progress | None,
                       precomputed_pieces: dict[int, np.ndarray]) -> None:
        """:meth:`sync`'s work, into ``state``: load the vector layer, choose the missing records to
        embed (``todo``), fill them in (:meth:`_fill`), count what is left behind."""
        snap = self.snap
        state.manifest, state.index, state.labels = snap.vectors()
        if state.manifest is not None:
            err = self.mismatch(state.manifest, None)
            if err:
                raise err
        labels = state.labels
        every = positions is None  # (every record: no gathers; at a million records each costs ~2 ms)
        cand = np.zeros(0, dtype=np.int64) if every else np.asarray(positions, dtype=np.int64)
        asked = len(labels) if every else len(cand)

        def unlabelled(found: np.ndarray) -> np.ndarray:
            live = snap.alive[:len(found)] if every else snap.alive[cand]
            return np.flatnonzero((found < 0) & live) if every else cand[(found[cand] < 0) & live]

        missing = unlabelled(labels).tolist() if asked else []
        wanted = set(must)
        # Vectors other machines made are taken for every missing record in one pass (a new machine
        # of a team memory is complete after its first call); only embedding is capped.
        shared = self._shared_for(missing) if missing and self.store.shares_vectors else {}
        todo = [p for p in missing if p in wanted or p in shared] + \
            [p for p in missing if p not in wanted and p not in shared][:cap]
        if todo:
            self._fill(state, todo, wanted, {**shared, **(precomputed or {})}, budget_s, progress,
                       blocking=blocking, verb=verb, pieces=dict(precomputed_pieces))
        if asked:
            still = unlabelled(state.labels).tolist() if todo else missing  # (nothing filled: the same)
            state.behind = sum(1 for p in still if p not in state.extra)
        state.invalid = self.invalid

    def _fill(self, state: VectorState, todo: list[int], wanted: set[int], known: dict[int, np.ndarray],
              budget_s: float | None, progress: Progress | None, *, blocking: bool, verb: str,
              pieces: dict[int, np.ndarray]) -> None:
        """Give the ``todo`` positions vectors: ``known`` ones (shared, precomputed), the index's of the
        same text, else embedded fresh; keep them in ``state`` and write them (when signed)."""
        snap = self.snap
        if state.index is not None:  # the same text already embedded (another id, an earlier life)
            for p in todo:
                label = state.index.label_of_hash(snap.hashes[p])
                if p not in known and label is not None:
                    row = state.index.row(label)
                    if usable(row[None, :])[0]:  # a bad row an older version stored is embedded again
                        known[p] = row
                        if state.index.has_pieces():
                            pieces[p] = state.index.piece_rows(label)
        fresh = [p for p in todo if p not in known]
        if fresh:
            fresh = self._embed_fresh(fresh, wanted, known, pieces, budget_s, progress)
            if state.manifest is not None:
                err = self.mismatch(state.manifest, self.embedder.dim)
                if err:
                    raise err
        state.embedded = len(fresh)
        state.extra = {p: known[p] for p in todo if p in known}
        state.extra_pieces = {p: rows for p, rows in pieces.items() if p in state.extra and len(rows) > 1}
        if not snap.unsigned:  # without a signing key nothing derived is written: vectors stay in memory
            # A write re-estimates the side weight when it is due, before the lock: the estimate
            # embeds up to 200 texts, and no other writer should wait for that.
            side = None
            if blocking and not self.defer_side_weight:
                side = self.side_weight(state.manifest, state.index, state.labels, state.extra)
            elif blocking and self._estimated(state.manifest, state.labels, state.extra) is not None:
                self.estimate_left = True
            self._persist(state, [p for p in todo if p in known], blocking=blocking, verb=verb, side=side)

    def _shared_for(self, positions: list[int]) -> dict[int, np.ndarray]:
        """The usable vectors the store holds for these records' texts under our fingerprint."""
        hashes = self.snap.hashes
        found = self.store.shared_vectors(self.our_embedding()["fingerprint"], [hashes[p] for p in positions])
        dim = self.embedder.dim
        out = {}
        for p in positions:
            vec = found.get(hashes[p])
            if vec is not None and vec.shape == (dim,) and usable(vec[None, :])[0]:
                out[p] = vec
        return out

    def _embed_fresh(self, fresh: list[int], wanted: set[int], known: dict[int, np.ndarray],
                     pieces: dict[int, np.ndarray], budget_s: float | None, progress: Progress | None = None
                     ) -> list[int]:
        """Embed ``fresh`` positions into ``known`` (their pieces into ``pieces``); with a budget, stop when it is spent (those a
        write must index are always embedded).  Returns the positions embedded."""
        records = self.snap.records

        def embed_into(positions: list[int], report: Progress | None = None) -> None:
            vectors, parts = self.embed_parts([embed_text(records[p]) for p in positions], report)
            good = usable(vectors)  # a row that is not is never stored: its record stays pending, by keywords
            known.update((p, v) for p, v, ok in zip(positions, vectors, good.tolist()) if ok)
            pieces.update((positions[i], rows) for i, rows in parts.items())
            self.invalid += int((~good).sum())

        if budget_s is None:
            embed_into(fresh, progress)
            return fresh
        done: list[int] = []
        required = [p for p in fresh if p in wanted]
        optional = [p for p in fresh if p not in wanted]
        if required:
            embed_into(required)
            done += required
        if optional:
            _ = self.embedder.dim  # the model loads (or is exported) before the clock starts, not inside it
        start = time.monotonic()
        for i in range(0, len(optional), BUDGET_CHUNK):
            if time.monotonic() - start >= budget_s:
                break
            chunk = optional[i: i + BUDGET_CHUNK]
            embed_into(chunk)
            done += chunk
        return done

    def side_weight(self, manifest: "Manifest | None", current: "VectorIndex | None", labels: np.ndarray,
                    extra: dict[int, np.ndarray]) -> dict[str, Any] | None:
        """A new estimate of z fusion's per-memory weight (``search/sideweight.py``) for the generation
        about to be committed (the current rows, with ``extra`` new or replaced vectors by position), when
        the live records with a vector grew by 25 % since the last one; else None (the manifest keeps
        it).  A write's cost: below 20 pseudo-queries nothing is embedded; a model that fails keeps
        the old estimate."""
        positions = self._estimated(manifest, labels, extra)
        if positions is None:
            return None
        snap = self.snap
        rows = np.stack([extra[p] if p in extra or current is None else current.row(int(labels[p])) for p in positions]) \
            if positions else np.zeros((0, self.embedder.dim), dtype=np.float32)
        try:
            return estimate([snap.records[p] for p in positions], np.asarray(positions, dtype=np.int64), rows,
                            snap.lexical_engine(), self.embedder.embed, floor=self.config.alpha,
                            embed_query=self.embedder.embed_query)
        except EmbeddingError:
            return None

    def _estimated(self, manifest: "Manifest | None", labels: np.ndarray, extra: dict[int, np.ndarray]
                   ) -> list[int] | None:
        """The live records with a vector a side-weight estimate is made over, when one is due (the
        setting is ``auto`` and they grew by 25 % since the last); else None."""
        if self.config.side_weights != "auto":
            return None
        alive = np.asarray(self.snap.alive, dtype=bool)
        has = np.zeros(len(alive), dtype=bool)
        n = min(len(labels), len(alive))
        has[:n] = labels[:n] >= 0
        has[[p for p in extra if p < len(has)]] = True
        has &= alive
        if not due((manifest or {}).get("side_weight"), int(has.sum())):  # (counted without a Python loop)
            return None
        positions: list[int] = np.flatnonzero(has).tolist()
        return positions

    def _sync_questions(self, state: VectorState, verb: str) -> None:
        """Make the generation's HyPE question vectors (``api/hype.py``) those of the log: embed the
        questions of the indexed live records it lacks (or holds for other questions), drop those of
        records that have none any more (forgotten, or an id revived without them), and commit them
        with the same rows (``Questions``)."""
        scan, index = self.snap.scan, state.index
        if scan is None or index is None or (not scan.questions and index.questions is None):
            return
        want = questions_wanted(scan)
        held = held_questions(index, want)
        todo = {rid: items for rid, (key, items) in want.items()
                if rid in index.label_of and held.get(index.label_of[rid]) != key}
        stale = index.questions is not None and set(index.questions.keys) - set(held)
        if not todo and not stale:
            return
        rows = self.embed_questions(todo)
        with self.store.lock(verb):
            manifest, current, _ = self.snap.vectors()  # as it is now, under the lock
            if manifest is None or current is None or self.mismatch(manifest, self.embedder.dim) is not None:
                return
            dim = current.dim
            keep = held_questions(current, want)
            by_label = {label: block for label, block in current.questions.rows.by_label().items() if label in keep} \
                if current.questions is not None else {}
            for rid, block in rows.items():
                label = current.label_of.get(rid)
                if label is not None:
                    by_label[label], keep[label] = block, want[rid][0]
            keeps = isinstance(manifest.get("pieces"), dict)
            self.store.commit(ids=list(current.ids), hashes=list(current.hashes),
                              vectors=np.zeros((0, dim), dtype=np.float32), embedding=dict(self.our_embedding()),
                              params=self.params, alpha=self.config.alpha, previous=manifest, base=current,
                              pieces=Pieces.empty(dim) if keeps else None,
                              questions=Questions(Pieces.of_labels(by_label, dim), keep))
            state.manifest, state.index, state.labels = self.snap.vectors()

    def idle(self, verb: str, merge_at: int, waiting: Callable[[], bool] = lambda: False, *,
             wait: bool = False) -> bool:
        """What a long-lived process does when no request waits (``memory-serve``), and ``memory-settle``:
        a side-weight estimate that is due (the writes it serves left it to now: ``defer_side_weight``),
        committed with the current rows, which also merges their segments; else a merge once there are
        ``merge_at`` segments.  ``waiting``: whether a request now waits (then nothing more is started).
        ``wait``: for the write lock (a background worker: nobody waits for it), else only if it is free.
        Returns whether it committed."""
        if self.config.side_weights == "auto" and not self.snap.unsigned:
            manifest, current, labels = self.snap.vectors()
            side = self.side_weight(manifest, current, labels, {}) if manifest is not None and current is not None \
                else None
            if side is not None and not waiting():  # (made outside the store's lock: other processes write)
                return self.merge_segments(verb, 0, side_weight=side, seen=(manifest or {}).get("side_weight"),
                                           wait=wait)
        return False if waiting() else self.merge_segments(verb, merge_at, wait=wait)

    def merge_segments(self, verb: str, at_least: int = 1, side_weight: dict[str, Any] | None = None,
                       seen: Any = None, *, wait: bool = False) -> bool:
        """Merge the current generation's segments (at least ``at_least`` of them) into a new base
        generation, if the write lock is free now (``store/cache.py``: what a write does when they pass
        their bound; memory-serve does it when idle), with ``side_weight`` when given (None: the
        manifest's; ``seen``: the manifest's estimate it replaces, else it does not).  Nothing is
        embedded.  Returns whether it committed."""
        from ..store.base import segments_of

        if len(segments_of(self.store.read_manifest())) < at_least:
            return False
        with (self.store.lock(verb) if wait else self.store.try_lock(verb)) as got:
            if got is False:
                return False
            manifest, current, _ = self.snap.vectors()  # as it is now, under the lock
            if manifest is None or current is None or len(segments_of(manifest)) < at_least:
                return False
            if side_weight is not None and manifest.get("side_weight") != seen:
                return False  # another process committed an estimate meanwhile: not done twice
            keeps = isinstance(manifest.get("pieces"), dict)
            self.store.commit(ids=list(current.ids), hashes=list(current.hashes),
                              vectors=np.zeros((0, current.dim), dtype=np.float32),
                              embedding=dict(manifest["embedding"]), params=self.params, alpha=self.config.alpha,
                              previous=manifest, base=current, pieces=Pieces.empty(current.dim) if keeps else None,
                              questions=current.questions, side_weight=side_weight)
            self.snap.vectors()
        return True

    def embed_questions(self, todo: dict[str, list[str]]) -> dict[str, np.ndarray]:
        """The usable vectors of each record's questions, embedded as queries (they are matched against
        queries: a model with a query prefix gets it)."""
        texts = [t for items in todo.values() for t in items]
        rows: dict[str, np.ndarray] = {}
        if not texts:
            return rows
        vecs = self.embedder.embed_query(texts)
        good = usable(vecs)
        at = 0
        for rid, items in todo.items():
            block, ok = vecs[at: at + len(items)], good[at: at + len(items)]
            at += len(items)
            if ok.any():
                rows[rid] = block[ok]
        return rows

    def _persist(self, state: VectorState, todo: list[int], *, blocking: bool, verb: str,
                 side: dict[str, Any] | None) -> None:
        """Commit newly embedded vectors as a new generation (under the lock)."""
        snap = self.snap
        hold = self.store.lock(verb) if blocking else self.store.try_lock(verb)
        with hold as got:
            if got is False:
                return  # another writer is busy; this query uses its vectors in memory only
            manifest, current, _ = snap.vectors()  # the generation as it is now, under the lock
            if manifest is not None:
                err = self.mismatch(manifest, self.embedder.dim)
                if err:
                    raise err
            records = snap.records
            ids: Strings = current.ids if current else []  # (not copied: the commit below makes new ones)
            hashes: Digests = current.hashes if current else []
            label_of = current.label_of if current else {}
            replaced: dict[int, np.ndarray] = {}
            new_ids: list[str] = []
            new_hashes: list[str] = []
            new_vecs: list[np.ndarray] = []
            pieces: dict[int, np.ndarray] = {}  # by label: the several-piece records' pieces
            for pos in todo:
                rid, h = records[pos]["id"], snap.hashes[pos]
                label = label_of.get(rid)
                if label is None:
                    label = len(ids) + len(new_ids)
                    new_ids.append(rid)
                    new_hashes.append(h)
                    new_vecs.append(state.extra[pos])
                elif hashes[label] != h:  # the record's text changed (a hand edit): replace its vector
                    if not replaced:
                        hashes = list(hashes)  # (the current generation's own list stays as it is)
                    hashes[label] = h
                    replaced[label] = state.extra[pos]
                else:
                    continue
                if pos in state.extra_pieces:
                    pieces[label] = state.extra_pieces[pos]
            if new_ids or replaced:
                dim = self.embedder.dim
                appended = np.stack(new_vecs) if new_vecs else np.zeros((0, dim), dtype=np.float32)
                keeps = manifest is None or isinstance(manifest.get("pieces"), dict)  # else one from before them
                if replaced and current is not None:  # rare: every row is written and the graph built afresh
                    rows = np.array(current.vectors, dtype=np.float32)
                    rows[list(replaced)] = np.stack(list(replaced.values()))
                    vectors, base = np.concatenate([rows, appended]), None
                    if keeps and current.pieces is not None:  # every label's pieces, the replaced ones' new
                        stale = np.zeros(len(current), dtype=bool)
                        stale[list(replaced)] = True
                        pieces = {**current.pieces_by_label(~stale), **pieces}
                else:  # the common case: the current generation's rows are kept, the new ones appended
                    vectors, base = appended, current
                self.store.commit(
                    ids=ids + new_ids, hashes=hashes + new_hashes, vectors=vectors,
                    embedding=dict(self.our_embedding()), params=self.params, alpha=self.config.alpha,
                    previous=manifest, base=base, side_weight=side,
                    pieces=Pieces.of_labels(pieces, dim) if keeps else None,
                    questions=current.questions if current is not None else None,  # labels never move
                )
                state.indexed = len(new_ids)
            state.manifest, state.index, state.labels = snap.vectors()
            state.extra = {p: v for p, v in state.extra.items() if state.labels[p] < 0}
            state.extra_pieces = {p: v for p, v in state.extra_pieces.items() if p in state.extra}

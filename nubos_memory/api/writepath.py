"""The one write path: every change to a memory goes through :meth:`WritePath.apply`.

Adding records, forgetting, superseding, pruning and re-ingesting are all one
operation: decide what is new, append records and tombstones as one change,
index.  Cheap decisions (existing id, exact duplicate) are made first, so a
re-logged record embeds nothing; the rest is embedded outside the lock (to be
indexed, and to report near duplicates); then, under the lock, every decision
is re-checked against the log as it is now and the change is appended and
made durable before any derived state changes (adr/0004, adr/0008).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from .. import codes
from ..errors import EmbeddingError, InputError, RebuildRequired, StoreError
from ..faults import crash_point
from ..index.vectors import usable
from ..log import LogScan, copy_of_retired, death_kind, forget_op, hot_record, written_by
from ..records import embed_text, recency
from ..search.dedup import KEPT, find_exact, fingerprint, nearest, within_batch
from .gitstate import stamp_git

NEAR_GROUP = 16  # near duplicates of a record looked at for a newer statement

if TYPE_CHECKING:
    from ..config import MemoryConfig
    from ..progress import Progress
    from ..search.snapshot import Snapshot
    from ..store.base import Store
    from ..types import Record, WriteResult
    from .gitstate import GitState
    from .vectorsync import VectorSync


def settled_scan(snap: "Snapshot", store: "Store") -> tuple[LogScan, dict[str, Any] | None]:
    """Under the lock: the log as it is now, after settling what a crashed writer left."""
    scan = snap.refresh()
    recovered = store.settle(scan)
    return (snap.refresh() if recovered else scan), recovered


def save_lexical(snap: "Snapshot", force: bool = False) -> None:
    """Under the lock: persist the lexical index when due; a failure only costs speed."""
    try:
        snap.save_lexical(force)
    except OSError:
        pass


def history(scan: LogScan) -> list[dict[str, Any]]:
    """A log's history as the lines that replay it, in its order: every record version, every
    retirement that is not a supersede (a superseding record's own line replays that) as a forget line
    with its original time and reason, and HyPE's questions."""
    events: list[tuple[float, dict[str, Any]]] = [(scan.line_of[pos], dict(hot_record(scan, pos)))  # pins kept
                                                  for pos in range(len(scan.records))]
    for pos, why in scan.dead.items():
        if death_kind(why) != "forget":
            continue
        # (right after the version it retired: a merge may have put its line after a later version, which
        # replayed after it would read as a duplicate of a live record)
        events.append((scan.line_of[pos] + 0.5, {"op": "forget", "id": scan.records[pos]["id"], "at": why.get("at"),
                                                 "reason": why.get("reason") or "forgotten"}))
    for pos, asked in scan.questions.items():  # HyPE's questions travel with their record (never re-asked)
        events.append((int(asked["line"]), {"op": "questions", "id": scan.records[pos]["id"],
                                            **{k: asked[k] for k in ("questions", "model", "at")}}))
    events.sort(key=lambda e: e[0])
    return [e for _, e in events]


class WritePath:
    """Writes of one memory (see module docstring)."""

    def __init__(self, snap: "Snapshot", store: "Store", vectors: "VectorSync", config: "MemoryConfig",
                 git: "GitState | None" = None):
        self.snap = snap
        self.store = store
        self.vectors = vectors
        self.config = config
        self.git = git  # stamps new records with where in git they are written (``gitstate.py``)

    def apply(self, records: "Sequence[Record]" = (), *, forget: Sequence[str] = (), reason: str = "forgotten",
              reasons: dict[str, str] | None = None, force: bool = False, verb: str = "memory-index",
              progress: "Progress | None" = None) -> "WriteResult":
        """Append ``records`` (validated) and retire ``forget`` ids in one change, then index.

        Records whose id is live are skipped, and so are copies of a retired version of their id (the
        reader would not bring the id back: ``log.copy_of_retired``; warned of); exact duplicates of live records are
        reported as ``duplicates`` and not stored unless ``force``; near duplicates
        are stored and reported.  ``reasons`` gives a tombstone reason per id.  Inside git, a record
        that brings no ``git`` gets this write's (``gitstate.stamp_git``; never part of its text).
        """
        records = list(records) if self.git is None else stamp_git(list(records), self.git)
        self.store.prepare()
        snap = self.snap
        scan = snap.refresh()  # an unfinished tail is settled under the lock below, and reported
        checked = (scan.generation, len(scan.records), len(scan.deaths))  # the log the decisions saw
        reasserted: dict[int, dict[str, str]] = {}
        retired = {i for i, r in enumerate(records) if scan.live(r["id"]) is None and copy_of_retired(scan, r)}
        dupes = self._exact_duplicates(records, scan, reasserted, retired) if records and not force else {}
        todo = [i for i, r in enumerate(records) if i not in dupes and i not in retired and scan.live(r["id"]) is None]
        (vectors, pieces), near, degraded = self._embed_ahead(records, todo, scan, progress)

        with self.store.lock(verb):
            scan, recovered = settled_scan(snap, self.store)
            before = len(scan.records)
            new: list[Record] = []
            new_index: list[int] = []
            skipped: list[str] = []
            copies: list[str] = []
            batch_ids: set[str] = set()
            moved = (scan.generation, len(scan.records), len(scan.deaths)) != checked
            lexical = snap.lexical_engine() if moved and records and not force and scan.live_count else None
            for i, r in enumerate(records):
                if scan.live(r["id"]) is not None or r["id"] in batch_ids:
                    skipped.append(r["id"])
                    continue
                if copy_of_retired(scan, r):
                    skipped.append(r["id"])
                    copies.append(r["id"])
                    continue
                if i in dupes:
                    continue
                if lexical is not None:  # another writer changed the log meanwhile: it may hold the same text
                    hit = find_exact(r, scan, lexical, snap.alive)
                    if hit is not None:
                        newer = self._newer_near(hit, scan)
                        if newer is None:
                            dupes[i] = {"duplicate_of": scan.records[hit]["id"], "kind": "exact"}
                            continue
                        reasserted[i] = {"repeats": scan.records[hit]["id"], "over": newer}
                old = r.get("supersedes")
                replaced = scan.live(old) if old is not None else None
                if replaced is not None and not written_by(scan.records[replaced], r.get("created_at")):
                    r = {**r, "created_at": scan.records[replaced]["created_at"]}  # (its writer's clock was ahead)
                if old is not None and replaced is None and old not in batch_ids:
                    raise InputError(f"record {i} supersedes {old!r}, which is not a live record; nothing was written",
                                     code=codes.RECORD_SUPERSEDES_UNKNOWN,
                                     details={"index": i, "id": r["id"], "supersedes": old, "written": 0})
                batch_ids.add(r["id"])
                new.append(r)
                new_index.append(i)
            ops, forgotten, already = self._tombstones(scan, forget, reason, reasons or {})
            self.store.append(new, ops)
            crash_point("after-append")
            scan = snap.refresh()
            save_lexical(snap)
        # (each record's position as the log reads it: never assumed from the order they were appended in)
        placed = [(p, i) for r, i in zip(new, new_index) if (p := scan.live(r["id"])) is not None and p >= before]
        positions = [p for p, _ in placed]
        if self.config.near_duplicate is not None:  # (a query collapsing them compares their marks only)
            KEPT.remember([scan.records[p] for p in positions])
        precomputed = {p: vectors[i] for p, i in placed if i in vectors}
        state = self.vectors.sync(None, must=positions, cap=self.config.max_pending_embed, blocking=True,
                                  verb=verb, precomputed=precomputed, progress=progress,
                                  precomputed_pieces={p: pieces[i] for p, i in placed if i in pieces})
        self._upkeep()
        stored = set(new_index)
        return {
            "added": len(new),
            "skipped": len(skipped),
            "ids": [r["id"] for r in new],
            "skipped_ids": skipped,
            "duplicates": [{"index": i, "id": records[i]["id"], **d} for i, d in sorted(dupes.items())],
            "near_duplicates": [{"index": i, "id": records[i]["id"], **d} for i, d in sorted(near.items())
                                if i in stored],
            "reasserted": [{"index": i, "id": records[i]["id"], **d} for i, d in sorted(reasserted.items())
                           if i in stored],
            "forgotten": forgotten,
            "already_retired": already,
            "indexed": state.indexed,
            "embedded": state.embedded + len(vectors),
            "pending": state.behind if state.degraded is None else None,
            "degraded": state.degraded or degraded,
            "recovered": recovered,
            "warnings": scan.warnings() + state.notes() + ([{
                "code": codes.RECORD_RETIRED_COPY, "ids": copies[:50],
                "message": f"{len(copies)} record(s) copy a retired version of their id (the same content, written no "
                           "later than it was retired) and were not stored; give one a new created_at to bring it "
                           "back"}] if copies else []),
        }

    def replay(self, events: list[dict[str, Any]], *, verb: str, progress: "Progress | None" = None
               ) -> "WriteResult":
        """Append another log's history (``history``) as one change, in its order, for the ids this memory
        does not hold (decided under the lock); then index what is live.  No duplicate checks: it is a
        copy of what was decided elsewhere."""
        self.store.prepare()
        snap = self.snap
        with self.store.lock(verb):
            scan, recovered = settled_scan(snap, self.store)
            known = set(scan.position) | set(scan.redacted)
            todo = [e for e in events if e["id"] not in known]
            before = len(scan.records)
            records = [e for e in todo if "op" not in e]
            forgotten = [e["id"] for e in todo if e.get("op") == "forget"]
            # Record and operation lines interleaved, in the source's order (``log.frame`` keeps it).
            self.store.append(cast("list[Record]", todo))
            crash_point("after-append")
            scan = snap.refresh()
            save_lexical(snap)
        positions = [p for p in range(before, len(scan.records)) if scan.live(scan.records[p]["id"]) == p]
        state = self.vectors.sync(None, must=positions, cap=self.config.max_pending_embed, blocking=True,
                                  verb=verb, progress=progress)
        self._upkeep()
        skipped = sorted({e["id"] for e in events if "op" not in e} & known)
        return {"added": len(records), "skipped": len(skipped), "ids": [r["id"] for r in records],
                "skipped_ids": skipped, "duplicates": [], "near_duplicates": [], "reasserted": [],
                "forgotten": forgotten, "already_retired": [], "indexed": state.indexed, "embedded": state.embedded,
                "pending": state.behind if state.degraded is None else None, "degraded": state.degraded,
                "recovered": recovered, "warnings": scan.warnings() + state.notes()}

    def _upkeep(self) -> None:
        """After a write, outside the lock: the store's upkeep (the team database's index build, bounded).
        A failure costs speed only: the write is acknowledged, queries scan exactly meanwhile."""
        try:
            self.store.maintain()
        except StoreError:
            pass

    def _newer_near(self, pos: int, scan: LogScan) -> str | None:
        """The id of a live near duplicate (cosine ≥ ``memory.near_duplicate``) of the record at ``pos``
        that is newer than it (``records.recency``), if any.  Writing ``pos``'s text again then is no
        duplicate: it re-asserts an older statement over a newer one (an agent re-checked the original
        fact after a correction), and is stored so that it becomes the newest.  None when the vector
        layer cannot tell (the write is then an exact duplicate, as it always was)."""
        threshold = self.config.near_duplicate
        snap = self.snap
        if threshold is None:
            return None
        try:
            _, index, labels = snap.vectors()
        except StoreError:
            return None
        if index is None or pos >= len(labels) or labels[pos] < 0:
            return None
        mine = recency(scan.records[pos])
        live = labels[(labels >= 0) & snap.alive]
        found, sims = index.top(index.row(int(labels[pos])), NEAR_GROUP, live)
        for label, sim in zip(found.tolist(), sims.tolist()):
            if sim < threshold:
                break
            other = int(snap.positions_of(np.array([label]))[0])
            if other >= 0 and other != pos and recency(scan.records[other]) > mine:
                return scan.records[other]["id"]
        return None

    def _exact_duplicates(self, records: "list[Record]", scan: LogScan, reasserted: dict[int, dict[str, str]],
                          copies: set[int]) -> dict[int, dict[str, Any]]:
        """Batch index -> the live (or earlier) record whose text it repeats exactly.  A repeat of a
        record that a newer near duplicate has overtaken is a re-assertion instead (``_newer_near``),
        noted in ``reasserted``.  ``copies`` (copies of retired versions, never stored) are left out."""
        snap = self.snap
        dupes: dict[int, dict[str, Any]] = {}
        seen: dict[str, int] = {}
        lexical = snap.lexical_engine() if scan.live_count else None
        for i, r in enumerate(records):
            if scan.live(r["id"]) is not None or i in copies:
                continue
            fp = fingerprint(r)
            if fp in seen:
                dupes[i] = {"duplicate_of": records[seen[fp]]["id"], "kind": "exact"}
                continue
            seen[fp] = i
            hit = find_exact(r, scan, lexical, snap.alive) if lexical is not None else None
            if hit is not None:
                newer = self._newer_near(hit, scan)
                if newer is None:
                    dupes[i] = {"duplicate_of": scan.records[hit]["id"], "kind": "exact"}
                else:
                    reasserted[i] = {"repeats": scan.records[hit]["id"], "over": newer}
        return dupes

    def _embed_ahead(self, records: "list[Record]", todo: list[int], scan: LogScan, progress: "Progress | None"
                     ) -> tuple[tuple[dict[int, np.ndarray], dict[int, np.ndarray]], dict[int, dict[str, Any]],
                                dict[str, Any] | None]:
        """Embed the new records before taking the lock (for their index, and to name near duplicates):
        ``((vectors, pieces of the several-piece ones) by batch index, near duplicates by batch index,
        degraded)``."""
        threshold = self.config.near_duplicate
        if not todo or threshold is None:
            return ({}, {}), {}, None
        snap = self.snap
        near: dict[int, dict[str, Any]] = {}
        try:
            manifest, index, labels = snap.vectors()
            mismatch = self.vectors.mismatch(manifest, None) if manifest is not None else None
            if mismatch:
                raise mismatch
            embedded, parts = self.vectors.embed_parts([embed_text(records[i]) for i in todo], progress)
            good = usable(embedded)
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
            return ({}, {}), {}, exc.to_dict()  # no vectors ahead and no near-duplicate report; exact ones still hold
        return ({i: v for i, v, ok in zip(todo, embedded, good.tolist()) if ok},
                {todo[j]: rows for j, rows in parts.items()}), near, None

    @staticmethod
    def _tombstones(scan: LogScan, forget: Sequence[str], reason: str, reasons: dict[str, str]
                    ) -> tuple[list[dict[str, Any]], list[str], list[str]]:
        """Under the lock: ``(forget lines, ids retired now, ids already retired)``."""
        ops: list[dict[str, Any]] = []
        forgotten: list[str] = []
        already: list[str] = []
        if not forget:
            return ops, forgotten, already
        unknown = [rid for rid in forget if rid not in scan.position]
        if unknown:
            raise InputError(f"no record has the id {unknown[0]!r}; nothing was forgotten",
                             code=codes.RECORD_NOT_FOUND, details={"ids": unknown[:50], "written": 0})
        for rid in forget:
            pos = scan.live(rid)
            if pos is None:
                already.append(rid)
            else:
                ops.append(forget_op(rid, reasons.get(rid, reason), scan.records[pos]))
                forgotten.append(rid)
        return ops, forgotten, already

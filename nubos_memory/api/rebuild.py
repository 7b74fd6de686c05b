"""``memory-rebuild``: every derived file made again from the log, beside :class:`VectorSync`.

Four stages: which vectors can be reused (same text, same model fingerprint, a usable row), embedding
the rest, assembling one row per live record in log order (rows the model gave no usable vector for
are left out: those records stay pending, ranked by their keywords), and publishing the generation
under the write lock with a fresh lexical index.  The team database's HNSW index is built after,
outside the lock (adr/0014).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from ..errors import StoreError
from ..faults import crash_point
from ..index.vectors import PIECE_RULE, Pieces, Questions, question_key, usable
from ..progress import Progress, Reporter, stage
from ..records import embed_text
from ..search.sideweight import estimate
from ..search.snapshot import VectorState
from .vectorsync import held_questions, questions_wanted
from .writepath import save_lexical

if TYPE_CHECKING:
    from ..config import MemoryConfig
    from ..index.vectors import VectorIndex
    from ..log import LogScan
    from ..search.snapshot import Snapshot
    from ..store.base import Store
    from ..types import Embedding, RebuildResult, Record
    from .vectorsync import VectorSync


@dataclass
class Rows:
    """The live records, in log order, and their vectors."""

    records: "list[Record]"
    hashes: list[str]
    vectors: np.ndarray
    reused: int = 0
    invalid: int = 0
    positions: list[int] | None = None  # each row's position in the log
    pieces: dict[int, np.ndarray] = field(default_factory=dict)  # by row: a several-piece record's pieces
    questions: dict[int, tuple[str, np.ndarray]] = field(default_factory=dict)  # by row: HyPE's (key, vectors)


class Rebuild:
    """One rebuild of one memory (see the module docstring)."""

    def __init__(self, snap: "Snapshot", store: "Store", vectors: "VectorSync", config: "MemoryConfig"):
        self.snap, self.store, self.vectors, self.config = snap, store, vectors, config

    def reusable(self, ours: "Embedding", reembed: bool, records: "list[Record]", hashes: list[str]
                 ) -> "tuple[dict[str, int], VectorIndex | None, set[str]]":
        """Rows of the current generation whose vectors can be kept, by text hash (none with ``reembed``, one
        from before pieces (``index/vectors.py``),
        another model, or a broken generation: whatever is broken is replaced, on explicit request).
        Under an older piece rule (``PIECE_RULE``), the records the embedder cuts into pieces now are not
        kept: they are embedded again, with their pieces (the third value: their text hashes)."""
        try:
            manifest, current, _ = self.snap.vectors()  # (the snapshot's: one loader per cache)
        except StoreError:
            return {}, None, set()
        if (reembed or manifest is None or current is None or current.pieces is None
                or (manifest.get("embedding") or {}).get("fingerprint") != ours["fingerprint"]):
            return {}, current, set()  # (a generation from before pieces: its long records' pieces are missing)
        good = current.usable_rows()  # a bad row (NaN, zero) an older version stored is embedded again
        reuse = {h: i for i, h in enumerate(current.hashes) if good[i]}
        rule = manifest.get("pieces")
        cut = self.cut_again(reuse, records, hashes) if isinstance(rule, dict) and rule.get("rule") != PIECE_RULE \
            else set()
        return reuse, current, cut

    def rows(self, scan: "LogScan", ours: "Embedding", reembed: bool, progress: Reporter | None
             ) -> tuple[Rows, int]:
        """The live records' vectors, reused or embedded; and how many texts were embedded."""
        all_hashes = self.snap.ensure_hashes()
        live = [p for p in range(len(scan.records)) if p not in scan.dead]  # the dead are not indexed
        records, hashes = [scan.records[p] for p in live], [all_hashes[p] for p in live]
        reuse, current, cut = self.reusable(ours, reembed, records, hashes)
        todo: dict[str, str] = {}
        for r, h in zip(records, hashes):
            if h not in reuse and h not in todo:
                todo[h] = embed_text(r)
        # (what is cut again is embedded here, never taken from a team's shared vectors: those come without pieces)
        order = [h for h in todo if h not in cut] + [h for h in todo if h in cut]
        report = stage(progress, "embedding")
        first = [todo[h] for h in order if h not in cut]

        def counted(before: int) -> "Progress | None":  # one count over both calls
            return None if report is None else (lambda done, _total: report(before + done, len(order)))

        fresh, parts = self.vectors.embed_parts(first, counted(0), shared=not reembed)
        if cut:
            shared = self.vectors.shared  # (the second call shares nothing: the first call's count stands)
            again, again_parts = self.vectors.embed_parts([todo[h] for h in order if h in cut], counted(len(first)),
                                                          shared=False)
            self.vectors.shared = shared
            parts.update((len(fresh) + i, rows) for i, rows in again_parts.items())
            fresh = np.concatenate([fresh, again])
        fresh_of = {h: i for i, h in enumerate(order)}
        vectors = np.zeros((len(records), self.vectors.embedder.dim), dtype=np.float32)
        rows_fresh = [(row, fresh_of[h]) for row, h in enumerate(hashes) if h in fresh_of]
        rows_reused = [(row, reuse[h]) for row, h in enumerate(hashes) if h not in fresh_of]
        if rows_fresh:
            dst, src = zip(*rows_fresh)
            vectors[list(dst)] = fresh[list(src)]
        if rows_reused and current is not None:
            dst, src = zip(*rows_reused)
            vectors[list(dst)] = current.gather(np.asarray(src))
        pieces = {row: parts[i] for row, i in rows_fresh if i in parts}
        if current is not None and current.has_pieces():
            pieces.update((row, current.piece_rows(label)) for row, label in rows_reused)
        pieces = {row: p for row, p in pieces.items() if len(p) > 1}
        rows = Rows(records, hashes, vectors, reused=len(rows_reused), positions=live, pieces=pieces)
        rows.questions = self.questions(scan, live, current if reuse or cut else None)
        return rows, len(todo)

    def cut_again(self, reuse: dict[str, int], records: "list[Record]", hashes: list[str]) -> set[str]:
        """Drop from ``reuse`` the rows whose record (of the live ``records``, by text hash) the embedder
        cuts into pieces now (the current generation's pieces were cut by an older rule); return their
        text hashes."""
        text_of = {h: embed_text(r) for r, h in zip(records, hashes) if h in reuse}
        kept = list(text_of)
        _, owner = self.vectors.embedder.best_pieces([text_of[h] for h in kept])
        cut = {kept[i] for i in set(owner)}
        for h in cut:
            reuse.pop(h, None)
        return cut

    def questions(self, scan: "LogScan", live: list[int], current: "VectorIndex | None"
                  ) -> dict[int, tuple[str, np.ndarray]]:
        """HyPE: each row's question vectors, from the log's questions (reused from ``current`` when made
        from the same questions, else embedded as ``VectorSync`` embeds them: never a generator call)."""
        want = questions_wanted(scan)
        held = held_questions(current, want) if current is not None else {}
        out: dict[int, tuple[str, np.ndarray]] = {}
        fresh: dict[str, list[str]] = {}
        row_of: dict[str, int] = {}
        for row, p in enumerate(live):
            rid = scan.records[p]["id"]
            if rid not in want:
                continue
            key, items = want[rid]
            label = current.label_of.get(rid) if current is not None else None
            if current is not None and current.questions is not None and label in held:
                out[row] = (key, current.questions.rows.rows_of(label))
            else:
                fresh[rid], row_of[rid] = items, row
        for rid, block in self.vectors.embed_questions(fresh).items():
            out[row_of[rid]] = (question_key(fresh[rid]), block)
        return out

    @staticmethod
    def keep_usable(rows: Rows) -> Rows:
        """Rows without the vectors that are not usable: never stored or indexed, those records stay
        pending, ranked by their keywords."""
        good = usable(rows.vectors)
        invalid = int((~good).sum())
        if not invalid:
            return rows
        keep = np.flatnonzero(good)
        positions = None if rows.positions is None else [rows.positions[i] for i in keep]
        pieces = {new: rows.pieces[old] for new, old in enumerate(keep.tolist()) if old in rows.pieces}
        asked = {new: rows.questions[old] for new, old in enumerate(keep.tolist()) if old in rows.questions}
        return Rows([rows.records[i] for i in keep], [rows.hashes[i] for i in keep], rows.vectors[keep],
                    reused=rows.reused, invalid=invalid, positions=positions, pieces=pieces, questions=asked)

    def side_weight(self, rows: Rows) -> "dict[str, Any] | None":
        """z fusion's per-memory weight estimated on the rebuilt rows (``search/sideweight.py``);
        None with ``memory.side_weights: off`` (the manifest keeps the previous one)."""
        if self.config.side_weights != "auto" or rows.positions is None:
            return None
        return estimate(rows.records, np.asarray(rows.positions, dtype=np.int64), rows.vectors,
                        self.snap.lexical_engine(), self.vectors.embedder.embed, floor=self.config.alpha,
                        embed_query=self.vectors.embedder.embed_query)

    def publish(self, rows: Rows, ours: "Embedding", side_weight: "dict[str, Any] | None" = None) -> "dict[str, Any]":
        """Under the lock: the new generation and a lexical index built from scratch; the new manifest."""
        with self.store.lock("memory-rebuild"):
            try:
                previous = self.store.read_manifest()
            except StoreError:
                previous = None
            manifest = self.store.commit(
                ids=[r["id"] for r in rows.records], hashes=rows.hashes, vectors=rows.vectors, embedding=dict(ours),
                params=self.vectors.params, alpha=self.config.alpha, previous=previous, base=None, rebuilt=True,
                side_weight=side_weight, pieces=Pieces.of_labels(rows.pieces, self.vectors.embedder.dim),
                questions=Questions(Pieces.of_labels({row: v for row, (_, v) in rows.questions.items()},
                                                     self.vectors.embedder.dim),
                                    {row: key for row, (key, _) in rows.questions.items()}),
            )
            self.snap.reset_lexical()  # rebuild the lexical index from scratch too
            self.snap.refresh()
            save_lexical(self.snap, force=True)
        return dict(manifest)

    def run(self, scan: "LogScan", progress: Reporter | None = None, *, reembed: bool = False) -> "RebuildResult":
        ours = self.vectors.our_embedding()
        rows, embedded = self.rows(scan, ours, reembed, progress)
        count = len(rows.records)
        rows = self.keep_usable(rows)
        crash_point("rebuild-embedded")
        indexing = stage(progress, "indexing")
        if indexing:
            indexing(0, count)
        manifest = self.publish(rows, ours, self.side_weight(rows))
        try:  # outside the lock (the team database's HNSW index, adr/0014)
            upkeep = self.store.maintain(wait_s=self.config.postgres.timeout_s)
        except StoreError as exc:
            upkeep = {"built": False, "why": exc.message}
        if indexing:
            indexing(count, count)
        return cast("RebuildResult", {  # a dict display: "index" (the team database's) before "warnings"
            "rebuilt": True,
            "count": count,
            "embedded": embedded - self.vectors.shared,
            "shared": self.vectors.shared,  # vectors another machine made (the team database)
            "reused": rows.reused,
            "model": ours.get("model"),
            "dim": ours.get("dim"),
            "fingerprint": ours.get("fingerprint"),
            "rebuilt_at": manifest.get("rebuilt_at"),
            "skipped_lines": len(scan.corrupt) + len(scan.duplicates),
            "invalid": rows.invalid,
            **({"index": upkeep} if upkeep else {}),
            "warnings": scan.warnings() + VectorState(invalid=rows.invalid).notes(),
        })

"""A memory's state held in memory between calls, refreshed incrementally.

A one-shot CLI process builds it once; a long-lived process (``memory-serve``,
an MCP server, a library user) keeps it warm: each call only stats the log,
parses appended lines, tokenises and hashes new records, and reloads the
vector generation when ``manifest.json`` names a new one.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import codes
from ..columns import Hex, Lines, hex_bytes, line_bytes
from ..errors import StoreError
from ..index.lexical import PostingsBM25
from ..index.vectors import VectorIndex
from ..log import fill_content_hashes
from ..records import iso_to_epoch, lexical_text, phase_matches
from ..tokenize import tokenize
from .dedup import forget_texts
from .facets import Facet
from .neighbours import gate, live_neighbours
from .timeline import Timeline

if TYPE_CHECKING:
    from collections.abc import MutableSequence

    from ..log import LogScan
    from ..recordlist import RecordList
    from ..store.base import Store
    from ..types import Manifest, Problem, Record

LEXICAL_SAVE_MIN = 64
ALIGNED_RUN = 1024  # positions mapped to labels at once where the keymap lists them in order (``_map``)


@dataclass
class VectorState:
    """The vector layer as one operation sees it, by record position in the log."""

    index: VectorIndex | None = None
    manifest: "Manifest | None" = None
    labels: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # position -> label, -1: none
    extra: dict[int, np.ndarray] = field(default_factory=dict)  # position -> vector embedded, not persisted
    extra_pieces: dict[int, np.ndarray] = field(default_factory=dict)  # position -> its pieces' vectors (several)
    degraded: dict[str, Any] | None = None
    indexed: int = 0
    embedded: int = 0
    behind: int = 0  # records that still have no vector after this operation's catching up
    invalid: int = 0  # records whose vector came out non-finite or zero: left pending, never stored

    def notes(self) -> "list[Problem]":
        """Warnings this operation's vector work is worth: vectors the model gave that were refused."""
        if not self.invalid:
            return []
        return [{"code": codes.EMBEDDING_INVALID, "count": self.invalid,
                 "message": f"the model gave {self.invalid} non-finite or zero vector(s); they were not stored, "
                            "and those records are ranked by their keywords until a working model embeds them "
                            "(memory-stats.runtime; memory-rebuild --reembed after fixing it)"}]

    def vectors_of(self, positions: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """The vectors this operation has for these records, in one array, and which of them have one."""
        pos = np.asarray(positions, dtype=np.int64)
        labels = np.where(pos < len(self.labels), self.labels[np.minimum(pos, max(len(self.labels) - 1, 0))], -1) \
            if len(self.labels) else np.full(len(pos), -1, dtype=np.int64)
        has = labels >= 0
        dim = self.index.dim if self.index is not None else (len(next(iter(self.extra.values()))) if self.extra else 1)
        out = np.zeros((len(pos), dim), dtype=np.float32)
        if self.index is not None and has.any():
            out[has] = self.index.gather(labels[has])
        for i, p in enumerate(positions if self.extra else ()):  # (embedded for this answer: usually none)
            if not has[i] and p in self.extra:
                out[i] = self.extra[p]
                has[i] = True
        return out, has

    def vector_of(self, position: int) -> np.ndarray | None:
        """The vector this operation has for a record, if any."""
        label = int(self.labels[position]) if position < len(self.labels) else -1
        if label >= 0 and self.index is not None:
            return self.index.row(label)
        return self.extra.get(position)


class Snapshot:
    """Per-record derived data aligned with ``scan.records`` positions."""

    def __init__(self, store: "Store"):
        self.store = store
        self.scan: LogScan | None = None
        self._reset()
        self._vec_key: Any = None
        self.manifest: Manifest | None = None
        self.index: VectorIndex | None = None
        self.unsigned = False  # no signing key: derived files are neither trusted nor written (trust.py)
        self.graph = True  # False: a one-shot process, which scans instead of loading the graph (cli.open_memory)

    @property
    def records(self) -> "Sequence[Record]":
        """Every record line read so far, by position (dead ones too)."""
        return self.scan.records if self.scan is not None else []

    @property
    def hashes(self) -> "MutableSequence[str]":
        """The content hashes computed so far (``ensure_hashes``), kept on the log's state so that a
        checkpoint carries them to the next process (``store/checkpoint.py``)."""
        return self.scan.content_hashes if self.scan is not None else []

    def _reset(self) -> None:
        self.lexical: PostingsBM25 | None = None
        self.lexical_saved = 0  # records covered by the persisted lexical cache
        self.lexical_saved_deaths = 0  # deaths it had applied
        self._lex_deaths = 0  # deaths applied to ``lexical``
        self.types, self.domains, self.phases, self.tags = Facet(), Facet(), Facet(), Facet()  # (``facets.py``)
        self.alive = np.ones(0, dtype=bool)  # live now: not retired, not expired (``timeline.py``)
        self._alive_deaths = 0
        self.expired: list[int] = []  # positions whose valid_until has come, in the order they expired
        self._expiries: dict[int, float] = {}  # position -> valid_until (epoch) still to come
        self._next_expiry = math.inf
        self.timeline = Timeline()  # each position's times, for as-of queries (filled on first use)
        self.labels = np.zeros(0, dtype=np.int64)
        self._inverse: np.ndarray | None = None
        self._neighbours_key: Any = None
        self._neighbours = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))

    def refresh(self) -> LogScan:
        """Re-read what changed in ``records.jsonl`` and extend per-record data."""
        scan = self.store.refresh(self.scan)
        if scan is not self.scan:
            self._reset()
            self._vec_key = None
            forget_texts()
        self.scan = scan
        start = len(self.types)
        if start < len(scan.records):  # (from the records' columns: a checkpoint's records stay undecoded)
            records = scan.records
            for name, facet in (("type", self.types), ("domain", self.domains), ("phase", self.phases),
                                ("tags", self.tags)):
                _extend(facet, records, name, start)
            until = Facet()  # (each distinct time read once; every record may have its own)
            _extend(until, records, "valid_until", start)
            epochs = np.array([_epoch(v) for v in until.distinct], dtype=np.float64)
            of = epochs[until.codes] if len(epochs) else np.zeros(0)
            timed = np.flatnonzero(~np.isnan(of))
            if len(timed):
                self._expiries.update(zip((timed + start).tolist(), of[timed].tolist()))
                self._next_expiry = min(self._next_expiry, float(of[timed].min()))
        if len(self.alive) < len(scan.records):
            self.alive = np.concatenate([self.alive, np.ones(len(scan.records) - len(self.alive), dtype=bool)])
        if self._alive_deaths < len(scan.deaths):
            self.alive[scan.deaths[self._alive_deaths:]] = False
            self._alive_deaths = len(scan.deaths)
        self._expire()
        return scan

    def _expire(self) -> None:
        """Records whose ``valid_until`` has come leave the live mask (read time: nothing is written)."""
        now = time.time()
        if now < self._next_expiry:
            return
        due = [p for p, t in self._expiries.items() if t <= now]
        for p in due:
            del self._expiries[p]
        self.alive[due] = False
        self.expired += due
        self._next_expiry = min(self._expiries.values(), default=math.inf)

    def expired_live(self) -> list[int]:
        """Positions expired and not retired in the log (``memory-stats``' ``expired``)."""
        dead = self.scan.dead if self.scan is not None else {}
        return [p for p in self.expired if p not in dead]

    def ensure_hashes(self) -> "MutableSequence[str]":
        """Content hashes of every record's embedded text (computed once, only when vectors matter)."""
        return fill_content_hashes(self.scan) if self.scan is not None else []

    # -- lexical -------------------------------------------------------------------
    def lexical_engine(self) -> PostingsBM25:
        """BM25 over every record, from the persisted cache plus whatever was appended since."""
        scan = self.scan
        assert scan is not None
        if self.lexical is None:
            loaded = self.store.load_lexical(len(scan.records))
            self.lexical, self.lexical_saved = (loaded[0], loaded[0].size) if loaded else (PostingsBM25(), 0)
            self.lexical_saved_deaths = len(self.lexical.removed)
            self._lex_deaths = 0
        engine = self.lexical
        if engine.size < len(scan.records):
            engine.add([tokenize(lexical_text(r)) for r in scan.records[engine.size:]])
        if self._lex_deaths < len(scan.deaths):
            for pos in scan.deaths[self._lex_deaths:]:
                if pos not in engine.removed:
                    engine.remove(pos, tokenize(lexical_text(scan.records[pos])))
            self._lex_deaths = len(scan.deaths)
        return engine

    def save_lexical(self, force: bool = False) -> None:
        """Under the write lock: persist the lexical index once enough records are not in the saved one.

        Saving rewrites the whole index (O(records)); a reader tokenises the
        records the saved index lacks (about 20-50 µs each).  So a write saves
        only when at least ``max(64, 1%)`` records are uncovered: cold readers
        pay a few ms at most, and one write in a hundred pays for the save.
        """
        engine = self.lexical_engine()
        scan = self.scan
        n = len(scan.records) if scan is not None else 0
        uncovered = (n - self.lexical_saved) + (len(engine.removed) - self.lexical_saved_deaths)
        if scan is not None and engine.size == n and uncovered > 0 and (
                force or uncovered >= max(LEXICAL_SAVE_MIN, n // 100)):
            self.store.save_lexical(engine, scan.applied)
            self.lexical_saved, self.lexical_saved_deaths = n, len(engine.removed)

    # -- filters -------------------------------------------------------------------
    def allowed(self, type_: str | None, phase: str | None, tags: list[str], *, phase_exact: bool = False,
                alive: np.ndarray | None = None, domain: str | None = None) -> np.ndarray | None:
        """Live positions passing the filters, or None when every record qualifies.  ``phase``
        matches its descendants in the phase hierarchy unless ``phase_exact``
        (``records.phase_matches``).  ``alive``: which records count as live (default: those live now).
        ``domain``: only records of that domain (one without a domain never passes)."""
        live = self.alive if alive is None else alive
        if type_ is None and phase is None and not tags and domain is None:
            return None if alive is None and live.all() else np.flatnonzero(live)
        mask = live.copy()
        if type_ is not None:
            mask &= self.types.where(lambda t: t == type_)
        if domain is not None:
            mask &= self.domains.where(lambda d: d == domain)
        if phase is not None:
            mask &= self.phases.where(lambda p: phase_matches(p, phase, exact=phase_exact))
        if tags:
            mask &= self.tags.where(lambda held: any(t in tags for t in held or ()))
        return np.flatnonzero(mask)

    # -- neighbours ------------------------------------------------------------------
    def neighbours(self) -> tuple[np.ndarray, np.ndarray]:
        """Each position's previous and next live position (-1: none), kept until the log changes."""
        key = (len(self.alive), self._alive_deaths, len(self.expired), self.scan.generation if self.scan else -1)
        if self._neighbours_key != key:
            self._neighbours = live_neighbours(self.alive)
            self._neighbours_key = key
        return self._neighbours

    def context_gate(self, manifest: "Manifest | None" = None) -> float:
        """The memory's coherence gate g (``neighbours.py``), from the κ its manifest records (the
        one given, else the current one); 0 when there is none (no vectors yet, or a manifest that
        cannot be read)."""
        if manifest is None:
            try:
                manifest = self.store.read_manifest()
            except StoreError:
                return 0.0
        value = (manifest or {}).get("kappa")
        return gate(float(value)) if isinstance(value, (int, float)) else 0.0

    # -- vectors -------------------------------------------------------------------
    def vectors(self) -> "tuple[Manifest | None, VectorIndex | None, np.ndarray]":
        """The current vector generation and each record's label in it (-1: no vector).

        Raises the StoreError of a damaged derived file.
        """
        try:
            manifest = self.store.read_manifest()
            self.unsigned = False
        except StoreError as exc:
            if exc.code != codes.SIGNING_KEY_UNAVAILABLE:
                raise
            manifest, self.unsigned = None, True  # fail closed: as if nothing were derived (trust.py)
        key = None if manifest is None else manifest.get("generation")
        if key != self._vec_key or (manifest is not None and self.index is None):
            if manifest is None:
                parent, self.manifest, self.index = self._vec_key, None, None
            else:
                parent, self.manifest, self.index = self._vec_key, *self.store.load_current()
                if self.index is not None:
                    self.index.use_graph = self.graph
            self._vec_key = None if self.manifest is None else self.manifest.get("generation")
            if parent is not None and (self.manifest or {}).get("appended_to") == parent:
                self._map(np.flatnonzero(self.labels < 0))  # an append kept every mapped row
            else:
                self.labels = np.zeros(0, dtype=np.int64)
            self._inverse = None
        n = len(self.ensure_hashes())
        if len(self.labels) < n:
            start = len(self.labels)
            self.labels = np.concatenate([self.labels, np.full(n - start, -1, dtype=np.int64)])
            self._map(range(start, n))
            self._inverse = None
        return self.manifest, self.index, self.labels

    def reset_lexical(self) -> None:
        """Forget the lexical index, here and persisted: the next use rebuilds it from the log."""
        self.lexical = None
        self.lexical_saved = 0
        self.store.invalidate_lexical()

    def positions_of(self, labels: np.ndarray) -> np.ndarray:
        """The record position of each label of the current generation (-1: none)."""
        if self._inverse is None:
            size = len(self.index) if self.index is not None else 0
            inverse = np.full(size, -1, dtype=np.int64)
            mapped = np.flatnonzero(self.labels >= 0)
            inverse[self.labels[mapped]] = mapped  # a revived id's later (live) position wins
            self._inverse = inverse
        return np.asarray(self._inverse[labels])

    def _map(self, positions: Any) -> None:
        """Set each position's label in the current generation (-1: no vector for its text)."""
        index = self.index
        if index is None or self.scan is None:
            return
        records = self.scan.records
        if isinstance(positions, range) and positions.start == 0:
            self._map_runs(records, positions.stop)
        else:  # (a few: appended ones, or those a new generation left without a label)
            self._map_each((pos, records.value(pos, "id")) for pos in positions)

    def _map_each(self, named: "Iterable[tuple[int, str]]") -> None:
        """Map positions one by one (``named``: each one with its record's id)."""
        assert self.index is not None
        label_of, keyed, hashes, labels = self.index.label_of, self.index.hashes, self.hashes, self.labels
        for pos, rid in named:
            label = label_of.get(rid)
            labels[pos] = label if label is not None and keyed[label] == hashes[pos] else -1

    def _map_runs(self, records: "RecordList", stop: int) -> None:
        """Map positions ``0..stop`` a run of ``ALIGNED_RUN`` at once where the generation's keymap lists
        the same records, by id and content, in the same order (what a rebuild and appends write: label i
        is the i-th record with a vector); a run that differs (a record without a vector, a retired one) is
        mapped one by one, and the next run starts after its last row.  A checkpoint's ids and content
        hashes are compared as bytes, not decoded (``_same_ids``, ``_same_hashes``)."""
        assert self.index is not None
        kids, keyed, hashes, labels = self.index.ids, self.index.hashes, self.hashes, self.labels
        column = records.column("id")
        lines = column if isinstance(column, Lines) else None
        pos = label = 0
        while pos < stop:
            end = min(pos + ALIGNED_RUN, stop)
            run = end - pos
            if len(kids) - label >= run and _same_ids(records, lines, pos, end, kids, label) \
                    and _same_hashes(hashes, pos, end, keyed, label):
                labels[pos:end] = np.arange(label, label + run)
                label += run
            else:
                self._map_each((p, records.value(p, "id")) for p in range(pos, end))
                found = labels[pos:end]
                mapped = found[found >= 0]
                if len(mapped):
                    label = int(mapped[-1]) + 1
            pos = end


def _extend(facet: Facet, records: RecordList, name: str, start: int) -> None:
    """Append field ``name`` of the records from ``start`` on to ``facet`` (a checkpoint's column by its codes)."""
    coded = records.coded(name)
    kept = len(coded) if coded is not None else 0
    if coded is not None and start < kept:
        facet.extend_coded(coded, start)
    facet.extend(records.values(name, max(start, kept)))


def _same_ids(records: "RecordList", lines: Lines | None, start: int, stop: int, kids: "Sequence[str]",
              label: int) -> bool:
    """Whether the ids of positions ``start..stop`` are the keymap's from ``label`` on (compared as bytes
    where the checkpoint's are read in place)."""
    run = stop - start
    raw = lines.raw(start, stop) if lines is not None else None
    if raw is None:
        return [records.value(p, "id") for p in range(start, stop)] == list(kids[label:label + run])
    theirs = kids.raw(label, label + run) if isinstance(kids, Lines) else None
    return raw == (theirs if theirs is not None else line_bytes(kids[label:label + run]))


def _same_hashes(hashes: "Sequence[str]", start: int, stop: int, keyed: "Sequence[str]", label: int) -> bool:
    """Whether the content hashes of positions ``start..stop`` are the keymap's from ``label`` on (compared
    as bytes where the checkpoint's are read in place, not decoded one by one)."""
    run = stop - start
    mine = hashes.raw(start, stop) if isinstance(hashes, Hex) else None
    if mine is None or not isinstance(hashes, Hex):
        return list(hashes[start:stop]) == list(keyed[label:label + run])
    theirs = keyed.raw(label, label + run) if isinstance(keyed, Hex) and keyed.width == hashes.width else None
    return mine == (theirs if theirs is not None else hex_bytes(keyed[label:label + run], hashes.width))


def _epoch(value: Any) -> float:
    """A ``valid_until``'s time (NaN: none, or not a time)."""
    found = iso_to_epoch(value) if value is not None else None
    return math.nan if found is None else found

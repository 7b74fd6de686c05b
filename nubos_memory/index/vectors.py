"""The vector side: stored vectors, their keymap, and the HNSW graph.

Label ``i`` of the HNSW index is row ``i`` of the vector matrix and entry
``i`` of the keymap.  Cosine scores for fusion are always computed exactly
from the stored vectors; HNSW only proposes candidates.  Up to
``EXACT_LIMIT`` rows a full numpy scan proposes them instead: there it is as
fast as HNSW and exact; above, HNSW is faster by a margin that grows with the
memory (adr/0006 has the measurements).

A store may propose candidates itself (``VectorIndex.ann``: the team
database's pgvector HNSW index, store/postgres.py) instead of a local graph;
its proposals are checked and scored against the stored vectors like HNSW's,
and when it cannot give enough of them the exact scan answers.

A record longer than the model's window is embedded in pieces and stored as
one pooled vector (``embed/pooling.py``); a record longer than half the window
is also embedded in pieces of half the window that overlap by half, kept beside
(``Pieces``), and its cosine with a query is ``λ·best piece + (1 − λ)·pooled``
(``PIECE_LAMBDA``; adr/0002, issue 24): a several-topic record's pooled vector
matches none of its topics, its best piece matches the one asked about.  A
record without pieces scores by its one vector exactly as before.

Deterministic builds: one thread, a fixed seed, insertion in label order, so
the same vectors give byte-identical index files.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from ..columns import Digests, Strings

# A store's own nearest-neighbour search: (unit query, how many) -> labels, best first, or None
# when it cannot answer (the exact scan answers instead).
Ann = Callable[[np.ndarray, int], "np.ndarray | None"]

EXACT_LIMIT = 5_000
HNSW_SEED = 100
OVERFETCH_MAX = 512  # HNSW still serves a query that excludes at most this many rows
ANN_SLACK = 64  # extra rows asked of a store's own candidate index (rows this machine has not indexed yet)
SCANS_BEFORE_GRAPH = 4  # a one-shot process answers this many searches by exact scan before it loads the graph
KAPPA_MIN_ROWS = 16  # fewer rows than this are too few to tell their order's coherence from chance
USABLE_BLOCK = 4096  # rows checked at once by ``usable``
GATHER_ROWS = 1024  # piece rows copied out at once by ``Pieces.best_of`` (1.5 MB at 384 dimensions: 2.4x faster
#                     than one copy of 24,000 rows on this machine, which reads them from memory twice)
PIECE_RULE = "best piece v2"  # v2: pieces of half the window overlapping by half (v1: the window's, no overlap)
PIECE_LAMBDA = 0.5  # a several-piece record's cosine: λ·best piece + (1 − λ)·pooled (adr/0002: 0.5 measured best)
QUESTION_RULE = "best of record and questions v1"  # HyPE: a record's cosine is the better of its own and its questions'


def usable(vectors: np.ndarray) -> np.ndarray:
    """Which rows are vectors worth storing: a finite squared length above 1e-12 (a broken model or a
    damaged export can give NaN or zero rows, whose cosines are meaningless; so is a row whose square
    overflows float32).  One pass over the rows, a block at a time (``memory-stats`` checks every
    stored row: no copy of a memory-mapped million)."""
    ok = np.empty(len(vectors), dtype=bool)
    for start in range(0, len(vectors), USABLE_BLOCK):
        block = np.asarray(vectors[start:start + USABLE_BLOCK], dtype=np.float32).reshape(
            min(USABLE_BLOCK, len(vectors) - start), -1)
        with np.errstate(over="ignore", invalid="ignore"):
            squared = np.einsum("ij,ij->i", block, block)
        ok[start:start + USABLE_BLOCK] = np.isfinite(squared) & (squared > 1e-12)
    return ok


@dataclass(frozen=True)
class HnswParams:
    m: int = 16
    ef_construction: int = 200
    ef_search: int = 100

    def to_dict(self) -> dict[str, Any]:
        return {"space": "cosine", "M": self.m, "ef_construction": self.ef_construction,
                "ef_search": self.ef_search, "seed": HNSW_SEED}


def build_hnsw(vectors: np.ndarray, params: HnswParams, base: Any = None) -> Any:
    """A new HNSW index over ``vectors`` (labels 0..n-1), or ``base`` extended by them.

    When extending, ``vectors`` are the new rows only and get the next labels.
    """
    import hnswlib

    if base is None:
        index = hnswlib.Index(space="cosine", dim=int(vectors.shape[1]))
        index.init_index(max_elements=max(1, len(vectors)), M=params.m,
                         ef_construction=params.ef_construction, random_seed=HNSW_SEED)
        start = 0
    else:
        index = base
        start = index.get_current_count()
        if index.get_max_elements() < start + len(vectors):
            index.resize_index(start + len(vectors))
    index.set_num_threads(1)
    if len(vectors):
        index.add_items(vectors, np.arange(start, start + len(vectors)), num_threads=1)
    return index


def load_hnsw(path: Path, dim: int, capacity: int = 0) -> Any:
    """Load an index file, with room for ``capacity`` items in all (0: as saved).

    The capacity is given to ``load_index`` itself: resizing afterwards would
    hold two copies of the graph at once.
    """
    import hnswlib

    index = hnswlib.Index(space="cosine", dim=dim)
    index.load_index(str(path), max_elements=capacity)
    return index


def order_stats(vectors: np.ndarray, previous: dict[str, Any] | None = None,
                last_row: np.ndarray | None = None) -> dict[str, Any]:
    """Running sums of the stored vectors in label order, from which ``kappa`` follows: their count,
    their sum, and the sum of the cosines of adjacent rows.  With ``previous`` (the sums of the
    rows before these) and ``last_row`` (the last of them), the sums are extended in O(new rows)."""
    v = np.asarray(vectors, dtype=np.float64)
    count = len(v)
    total = v.sum(axis=0) if count else np.zeros(v.shape[1] if v.ndim == 2 else 0)
    adjacent = float(np.einsum("ij,ij->", v[:-1], v[1:])) if count > 1 else 0.0
    if previous is not None and previous.get("rows"):
        if last_row is not None and count:
            adjacent += float(np.dot(np.asarray(last_row, dtype=np.float64), v[0]))
        count += int(previous["rows"])
        total = total + np.asarray(previous["sum"], dtype=np.float64)
        adjacent += float(previous["adjacent"])
    return {"rows": count, "sum": [float(x) for x in total], "adjacent": adjacent}


def kappa(stats: dict[str, Any] | None) -> float:
    """How much label (log) order carries topic: the mean cosine of adjacent rows minus the mean
    cosine of all pairs, ``(|Σv|² − N) / (N(N − 1))`` for unit vectors (search/neighbours.py)."""
    if not stats:
        return 0.0
    n = int(stats.get("rows") or 0)
    if n < KAPPA_MIN_ROWS:  # too few to tell order from chance: no context
        return 0.0
    total = np.asarray(stats["sum"], dtype=np.float64)
    all_pairs = (float(total @ total) - n) / (n * (n - 1))
    return float(stats["adjacent"]) / (n - 1) - all_pairs


@dataclass(frozen=True)
class Pieces:
    """The piece vectors of the records embedded in several pieces: ``vectors`` (unit, float32) and
    the label each row belongs to (``owner``, non-decreasing: a record's rows are together)."""

    vectors: np.ndarray
    owner: np.ndarray

    @staticmethod
    def empty(dim: int) -> "Pieces":
        return Pieces(np.zeros((0, dim), dtype=np.float32), np.zeros(0, dtype=np.int64))

    @staticmethod
    def of_labels(by_label: "dict[int, np.ndarray]", dim: int) -> "Pieces":
        """Pieces from each label's rows (in label order)."""
        labels = sorted(by_label)
        if not labels:
            return Pieces.empty(dim)
        rows = [np.asarray(by_label[label], dtype=np.float32).reshape(-1, dim) for label in labels]
        owner = np.concatenate([np.full(len(r), label, dtype=np.int64) for label, r in zip(labels, rows)])
        return Pieces(np.ascontiguousarray(np.concatenate(rows)), owner)

    def __len__(self) -> int:
        return len(self.owner)

    def rows_of(self, label: int) -> np.ndarray:
        """One label's piece vectors (none: a record of one piece)."""
        a, b = np.searchsorted(self.owner, [label, label + 1])
        return np.asarray(self.vectors[a:b])

    def by_label(self, keep: "np.ndarray | None" = None) -> "dict[int, np.ndarray]":
        """Every label's rows (only those where ``keep[label]``)."""
        out: dict[int, np.ndarray] = {}
        starts = self.starts
        for a, b in zip(starts.tolist(), [*starts[1:].tolist(), len(self.owner)]):
            label = int(self.owner[a])
            if keep is None or keep[label]:
                out[label] = np.asarray(self.vectors[a:b])
        return out

    @cached_property
    def starts(self) -> np.ndarray:
        """The first row of each label's pieces."""
        found: np.ndarray = np.flatnonzero(np.r_[True, self.owner[1:] != self.owner[:-1]]) if len(self.owner) \
            else np.zeros(0, dtype=np.int64)
        return found

    def best(self, query: np.ndarray, n: int) -> np.ndarray:
        """The best piece's cosine of each of ``n`` labels with ``query`` (NaN: no pieces)."""
        out = np.full(n, np.nan, dtype=np.float32)
        if len(self.owner):
            cos = np.asarray(self.vectors @ query, dtype=np.float32)
            out[self.owner[self.starts]] = np.maximum.reduceat(cos, self.starts)
        return out

    def best_of(self, query: np.ndarray, labels: np.ndarray) -> np.ndarray:
        """The best piece's cosine of each of ``labels`` with ``query`` (NaN: no pieces here), reading
        only their rows."""
        out = np.full(len(labels), np.nan, dtype=np.float32)
        if not len(self.owner) or not len(labels):
            return out
        first, end = np.searchsorted(self.owner, labels), np.searchsorted(self.owner, labels + 1)
        has = np.flatnonzero(end > first)
        if len(has):
            counts = end[has] - first[has]
            starts = np.r_[0, np.cumsum(counts)[:-1]]
            rows = np.repeat(first[has] - starts, counts) + np.arange(int(counts.sum()))
            cos = np.empty(len(rows), dtype=np.float32)
            for a in range(0, len(rows), GATHER_ROWS):  # a block at a time: the copy stays in the cache
                cos[a:a + GATHER_ROWS] = self.vectors[rows[a:a + GATHER_ROWS]] @ query
            out[has] = np.maximum.reduceat(cos, starts)
        return out


def question_key(questions: list[str]) -> str:
    """What a record's question vectors were made from (a generation keeps it per label)."""
    import hashlib

    return hashlib.sha256("\n".join(questions).encode("utf-8", "surrogatepass")).hexdigest()[:16]


@dataclass(frozen=True)
class Questions:
    """HyPE: the vectors of the questions records answer (``rows``, by label) and, per label, the
    ``question_key`` of the questions they were made from."""

    rows: Pieces
    keys: "dict[int, str]"

    def __len__(self) -> int:
        return len(self.rows)


def mix(pooled: np.ndarray, best: np.ndarray) -> np.ndarray:
    """A record's cosine: ``PIECE_LAMBDA``·best piece + the rest·pooled where it has pieces (``best``
    not NaN), the pooled cosine where it has not."""
    mixed: np.ndarray = np.where(np.isnan(best), pooled, PIECE_LAMBDA * best + (1.0 - PIECE_LAMBDA) * pooled)
    return mixed


class VectorIndex:
    """Indexed records' vectors, looked up by record id."""

    def __init__(self, ids: Strings, hashes: Digests, vectors: np.ndarray,
                 hnsw_path: Path | None = None, ef_search: int = 100, vectors_path: Path | None = None,
                 hnsw_sha256: str | None = None, pieces: Pieces | None = None, pieces_path: Path | None = None,
                 questions: Questions | None = None, tail: np.ndarray | None = None,
                 label_of: dict[str, int] | None = None, tail_pieces: Pieces | None = None):
        self.ids = ids
        self.hnsw_sha256 = hnsw_sha256
        self._graph_verified = False
        self.vectors_path = vectors_path
        self.hashes = hashes
        # The rows of the generation's base files (memory-mapped; the graph covers exactly these),
        # then the rows of its segments (``tail``, in memory: store/cache.py, adr/0021)
        self.base = vectors
        self.tail = tail if tail is not None and len(tail) else None
        self._label_of = label_of  # (made on first use: a one-shot query maps records without it)
        self._labels_of_hash: dict[str, list[int]] | None = None
        self.hnsw_path = hnsw_path
        self.ef_search = ef_search
        self._hnsw: Any = None
        self.ann: Ann | None = None  # a store's candidate index, used instead of the graph (module docstring)
        # None: a generation from before best-piece scoring (every record scores by its pooled vector
        # until memory-rebuild); else the several-piece records' pieces (often none)
        self.pieces = pieces  # (the base files' rows; the segments' are ``tail_pieces``)
        self.pieces_path = pieces_path
        self.tail_pieces = tail_pieces if tail_pieces is not None and len(tail_pieces) else None
        self.questions = questions  # HyPE's question vectors (None: no record has any)
        # False in a one-shot process: its first SCANS_BEFORE_GRAPH searches scan the memory-mapped
        # vectors exactly instead of loading a graph they would use once (issue 27)
        self.use_graph = True
        self.scans = 0
        # How the graph file is checked against its sha256 (None: hashed; store/verified.py)
        self.check_file: Callable[[Path, Any], bool] | None = None
        self._kept_rows: tuple[bytes, np.ndarray] | None = None  # (``kept_rows``)

    @property
    def label_of(self) -> dict[str, int]:
        """Record id -> its label (an id at several labels: the last)."""
        if self._label_of is None:
            self._label_of = {rid: i for i, rid in enumerate(self.ids)}
        return self._label_of

    def grown_label_of(self, more: list[str]) -> dict[str, int] | None:
        """This index's id -> label map grown in place by ``more`` ids after its rows, for an index that
        extends this one (None: not made yet; that index makes its own on first use)."""
        if self._label_of is not None:
            n = len(self)
            self._label_of.update((rid, n + i) for i, rid in enumerate(more))
        return self._label_of

    @property
    def base_rows(self) -> int:
        """How many rows the base files hold (the graph's labels); the segments' rows follow."""
        return len(self.base)

    @property
    def vectors(self) -> np.ndarray:
        """Every row in label order: the base's memory-mapped rows, or (with segments) a joined copy
        made for this call; searches and lookups use :meth:`gather`, :meth:`row`, :meth:`scores`."""
        if self.tail is None:
            return self.base
        return np.concatenate([np.asarray(self.base, dtype=np.float32), self.tail])  # (not kept: rare callers)

    def row(self, label: int) -> np.ndarray:
        """One label's stored vector."""
        n0 = len(self.base)
        if label < n0 or self.tail is None:
            return np.asarray(self.base[label])
        return np.asarray(self.tail[label - n0])

    def gather(self, labels: np.ndarray) -> np.ndarray:
        """The stored vectors of ``labels``, in their order."""
        labels = np.asarray(labels, dtype=np.int64)
        if self.tail is None:
            return np.asarray(self.base[labels])
        n0 = len(self.base)
        out = np.empty((len(labels), self.dim), dtype=np.float32)
        inside = labels < n0
        out[inside] = self.base[labels[inside]]
        out[~inside] = self.tail[labels[~inside] - n0]
        return out

    def kept_rows(self, labels: np.ndarray) -> np.ndarray:
        """:meth:`gather`, its copy kept for the last ``labels`` asked: a large query's statistics sample is
        the same rows query after query (``search/vector_side.py``), copied out of the mapped file once."""
        labels = np.asarray(labels, dtype=np.int64)
        key = labels.tobytes()
        kept = self._kept_rows  # (read once: another thread may keep its own meanwhile)
        if kept is None or kept[0] != key:
            kept = self._kept_rows = (key, self.gather(labels))
        return kept[1]

    def usable_rows(self) -> np.ndarray:
        """Which rows are usable vectors (:func:`usable`), checked part by part (no joined copy)."""
        parts = [usable(rows) for rows in (self.base, self.tail) if rows is not None]
        return np.concatenate(parts) if len(parts) > 1 else parts[0]

    def scores(self, query: np.ndarray) -> np.ndarray:
        """Every row's cosine with ``query`` (one pass over the base rows, one over the segments')."""
        base = np.asarray(self.base @ query, dtype=np.float32)
        return base if self.tail is None else np.concatenate([base, np.asarray(self.tail @ query, dtype=np.float32)])

    def __len__(self) -> int:
        return len(self.ids)

    def label_of_hash(self, content_hash: str) -> int | None:
        """A row whose embedded text had this content hash, if any (its vector can be reused)."""
        labels = self.labels_of_hash(content_hash)
        return labels[-1] if labels else None

    def labels_of_hash(self, content_hash: str) -> list[int]:
        """Every row whose embedded text had this content hash, in label order (one text can be
        several records: a forgotten one and its re-added twin)."""
        if self._labels_of_hash is None:
            self._labels_of_hash = {}
            for i, h in enumerate(self.hashes):
                self._labels_of_hash.setdefault(h, []).append(i)
        return self._labels_of_hash.get(content_hash, [])

    @property
    def dim(self) -> int:
        return int(self.base.shape[1])

    def adopt_graph(self, other: "VectorIndex", built: Any = None) -> None:
        """Use ``other``'s graph (the same base files: ``store/cache.py``), or ``built``, the graph this
        process just wrote to ``hnsw_path``, instead of reading the file again."""
        graph, verified = other.loaded_graph()
        self._hnsw = built if built is not None else graph
        self._graph_verified = verified or built is not None
        self.use_graph, self.scans, self.check_file = other.use_graph, other.scans, other.check_file

    def inherit_hash_labels(self, other: "VectorIndex") -> None:
        """Take ``other``'s content-hash map, built already, grown in place by this index's rows after
        its (an index that only appended rows to ``other``'s, which is not used again: store/cache.py)."""
        known = other.hash_labels_built()
        if known is None:
            return
        for label in range(len(other), len(self)):
            known.setdefault(self.hashes[label], []).append(label)
        self._labels_of_hash = known

    def hash_labels_built(self) -> "dict[str, list[int]] | None":
        """The content-hash map, if a lookup built it already."""
        return self._labels_of_hash

    def loaded_graph(self) -> tuple[Any, bool]:
        """The graph this index has read (None: not yet) and whether its file was verified."""
        return self._hnsw, self._graph_verified

    def trust_graph(self) -> None:
        """Mark the graph as verified: this process wrote it and hashed it while writing."""
        self._graph_verified = True

    def verify_graph(self) -> None:
        """Check the graph file against its recorded sha256 before hnswlib ever reads it."""
        from .. import codes
        from ..errors import StoreError
        from ..trust import file_sha256

        if self._graph_verified or self.hnsw_path is None:
            return
        path = self.hnsw_path
        try:
            ok = self.check_file(path, self.hnsw_sha256) if self.check_file is not None \
                else file_sha256(path) == self.hnsw_sha256
        except OSError:
            ok = False
        if not ok and not path.exists():  # a merge replaced this generation meanwhile: not damage
            raise FileNotFoundError(str(path))
        if not ok:
            raise StoreError(f"the HNSW graph {self.hnsw_path.name} does not match the manifest; run memory-rebuild",
                             code=codes.INDEX_CORRUPT, details={"file": self.hnsw_path.name})
        self._graph_verified = True

    def hnsw(self) -> Any:
        if self._hnsw is None and self.hnsw_path is not None:
            if not self.hnsw_path.exists():  # a merge replaced this generation since it was read
                raise FileNotFoundError(str(self.hnsw_path))
            self.verify_graph()
            self._hnsw = load_hnsw(self.hnsw_path, self.dim)
        return self._hnsw

    def _top_graph(self, query: np.ndarray, k: int, allowed: np.ndarray | None, excluded: int
                   ) -> tuple[np.ndarray, np.ndarray]:
        """Top ``k`` by the graph over the base rows, merged with an exact scan of the segments' rows."""
        index, n0 = self.hnsw(), len(self.base)
        want = min(k + excluded, n0)
        index.set_ef(max(self.ef_search, want))
        labels, dists = index.knn_query(query.reshape(1, -1), k=want, num_threads=1)
        labels, sims = labels[0].astype(np.int64), (1.0 - dists[0]).astype(np.float32)
        if self.tail is not None:
            rows = np.arange(n0, len(self), dtype=np.int64)
            if allowed is not None:
                rows = allowed[allowed >= n0]
            labels = np.concatenate([labels, rows])
            sims = np.concatenate([sims, np.asarray(self.tail[rows - n0] @ query, dtype=np.float32)])
        if allowed is not None and excluded:
            keep = np.isin(labels, allowed)
            labels, sims = labels[keep], sims[keep]
        order = np.lexsort((labels, -sims))[:k]
        return labels[order], sims[order]

    def top(self, query: np.ndarray, k: int, allowed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Best ``k`` labels by cosine (optionally only among ``allowed`` labels).

        HNSW (or the store's ``ann``) on a large index when at most
        ``OVERFETCH_MAX`` rows are excluded (forgotten records, records whose
        text changed): it asks for that many more and drops them.  An exact
        scan otherwise (small index, filters, too few proposals).
        """
        n = len(self)
        if n == 0 or k <= 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
        excluded = 0 if allowed is None else n - len(allowed)
        if n > EXACT_LIMIT and self.ann is not None and excluded <= OVERFETCH_MAX:
            found = self.ann(query, min(k + excluded + ANN_SLACK, n))
            if found is not None:
                if allowed is not None and excluded:
                    found = found[np.isin(found, allowed)]
                if len(found) >= min(k, n - excluded):  # enough of them: else the exact scan below
                    sims = np.asarray(self.gather(found) @ query, dtype=np.float32)
                    order = np.lexsort((found, -sims))[:k]  # by exact cosine, ties by label
                    return found[order], sims[order]
        elif self.base_rows > EXACT_LIMIT and self.hnsw_path is not None and excluded <= OVERFETCH_MAX \
                and self._graph_worth_it():
            try:  # the graph covers the base rows only: a small base and a big segment are scanned exactly
                return self._top_graph(query, k, allowed, excluded)
            except (RuntimeError, FileNotFoundError):
                pass  # hnswlib could not give that many, or a merge deleted the file meanwhile: scan
        rows = np.arange(n) if allowed is None else allowed
        if len(rows) == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
        if allowed is None:
            sims = self.scores(query)
        elif len(rows) * 4 > n:  # a broad filter: one pass over all rows beats copying most of them
            sims = self.scores(query)[rows]
        else:
            sims = self.gather(rows) @ query
        k = min(k, len(rows))
        part = np.argpartition(-sims, k - 1)[:k]
        order = part[np.lexsort((part, -sims[part]))]
        return rows[order].astype(np.int64), sims[order].astype(np.float32)

    def _graph_worth_it(self) -> bool:
        """Whether this search should use the graph: always in a long-lived process; in a one-shot one
        only once it has searched ``SCANS_BEFORE_GRAPH`` times (a batch write's near-duplicate checks)."""
        if self.use_graph or self._hnsw is not None:
            return True
        self.scans += 1
        return self.scans > SCANS_BEFORE_GRAPH

    def cosines(self, labels: np.ndarray, query: np.ndarray, best: np.ndarray | None = None,
                asked: np.ndarray | None = None, *, kept: bool = False) -> np.ndarray:
        """Exact cosine of the given labels' stored (unit) vectors with ``query``; with ``best`` (the
        query's :meth:`best_pieces`), a several-piece record's is mixed with its best piece's (:func:`mix`);
        with ``asked`` (:meth:`best_questions`), a record with HyPE questions scores the better of that
        and its closest question's.  ``kept``: the rows are read by :meth:`kept_rows`."""
        if len(labels) == 0:
            return np.zeros(0, dtype=np.float32)
        cos = np.asarray((self.kept_rows(labels) if kept else self.gather(labels)) @ query, dtype=np.float32)
        if best is not None:
            cos = np.asarray(mix(cos, best[labels]), dtype=np.float32)
        if asked is not None:
            cos = np.fmax(cos, asked[labels])  # NaN (no questions) keeps the record's own
        return cos

    def best_questions(self, query: np.ndarray) -> np.ndarray | None:
        """Each label's closest HyPE question's cosine with ``query`` (NaN: none); None when no record has any."""
        if self.questions is None or not len(self.questions):
            return None
        return self.questions.rows.best(query, len(self))

    def has_pieces(self) -> bool:
        """Whether any record of this generation has piece vectors."""
        return self.pieces is not None and (len(self.pieces) > 0 or self.tail_pieces is not None)

    def piece_rows(self, label: int) -> np.ndarray:
        """One label's piece vectors (none: a record of one piece, or a generation without pieces)."""
        if self.tail_pieces is not None and label >= self.base_rows:
            return self.tail_pieces.rows_of(label)
        return self.pieces.rows_of(label) if self.pieces is not None else np.zeros((0, self.dim), dtype=np.float32)

    def pieces_by_label(self, keep: np.ndarray | None = None) -> "dict[int, np.ndarray]":
        """Every label's piece vectors (only those where ``keep[label]``)."""
        out = self.pieces.by_label(keep) if self.pieces is not None else {}
        return {**out, **(self.tail_pieces.by_label(keep) if self.tail_pieces is not None else {})}

    def best_pieces(self, query: np.ndarray) -> np.ndarray | None:
        """Each label's best piece cosine with ``query`` (NaN: one piece); None when no record has pieces."""
        if not self.has_pieces() or self.pieces is None:
            return None
        best = self.pieces.best(query, len(self))
        if self.tail_pieces is not None:  # a label's pieces are all in the base or all in one segment
            best = np.fmax(best, self.tail_pieces.best(query, len(self)))
        return best

    def best_pieces_of(self, query: np.ndarray, labels: np.ndarray) -> np.ndarray:
        """:meth:`best_pieces` of ``labels`` only (the rows of those labels read, not every piece row)."""
        if self.pieces is None:
            return np.full(len(labels), np.nan, dtype=np.float32)
        best = self.pieces.best_of(query, labels)
        if self.tail_pieces is not None:
            best = np.fmax(best, self.tail_pieces.best_of(query, labels))
        return best

    def top_by_pieces(self, best: np.ndarray, k: int, allowed: np.ndarray | None = None) -> np.ndarray:
        """The ``k`` labels (of ``allowed``) whose best piece is closest to the query: the candidates a
        several-topic record gets by the topic asked about, which its pooled vector may miss."""
        rows = np.flatnonzero(~np.isnan(best)) if allowed is None else allowed[~np.isnan(best[allowed])]
        if not len(rows) or k <= 0:
            return np.zeros(0, dtype=np.int64)
        k = min(k, len(rows))
        part = np.argpartition(-best[rows], k - 1)[:k]
        return rows[part[np.lexsort((rows[part], -best[rows[part]]))]].astype(np.int64)

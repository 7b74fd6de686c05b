"""The store seam: where a memory's log, write lock and derived state live.

:class:`Store` is everything the library asks of a place that holds a memory.
``FileStore`` (``files.py``) is today's ``.nubos-pilot/memory/`` folder; a
second implementation (a database) provides the same operations with the same
semantics, and every verb works on it unchanged:

* **the log** — the source of truth, records and operation lines in order
  (``log.py`` says what they mean): ``refresh`` reads what was appended since a
  :class:`LogScan` (from its ``cursor``, which only the store reads), ``append``
  adds records and operations as one all-or-nothing change, ``settle`` deals
  with a crashed writer's leftovers, ``rewrite`` replaces the log by its live
  records for ``memory-compact`` (keeping the old one);
* **the write lock** — one per memory, spanning read → decide → write;
* **derived state** — the vector generation (manifest, vectors, graph,
  keymap), the persisted lexical postings, and usage (retrievals).  All of it
  can be lost and re-derived from the log by ``memory-rebuild``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from pathlib import Path

    import numpy as np

    from ..columns import Digests, Strings
    from ..index.lexical import PostingsBM25
    from ..index.vectors import HnswParams, Pieces, Questions, VectorIndex
    from ..log import LogScan
    from ..types import Manifest, Record


MERGE_IDLE_SEGMENTS = 4  # memory-serve merges a generation's segments when idle once there are this many


def segments_of(manifest: "Manifest | None") -> list[dict[str, Any]]:
    """The segments a manifest names after its base files, in label order (none: a merged generation;
    ``cache.py``).  A zero-row append to the current generation merges them (``Store.commit``)."""
    found = (manifest or {}).get("segments")
    return [dict(seg) for seg in found if isinstance(seg, dict)] if isinstance(found, list) else []


class UsageLog(Protocol):
    """Which records queries returned, and when (``usage.py``)."""

    def start(self) -> None: ...
    def record(self, ids: list[str]) -> bool: ...
    def summary(self) -> tuple[float | None, dict[str, list[float]]]: ...
    def fold(self, force: bool = False) -> None: ...


class Store(Protocol):
    """Where one memory lives (see the module docstring)."""

    kind: str
    shares_vectors: bool  # vectors made by other processes can be asked for (shared_vectors)

    @property
    def usage(self) -> UsageLog:
        """Which records queries returned, and when."""
        ...

    # -- the place -------------------------------------------------------------------------
    def check(self) -> list[dict[str, Any]]:
        """Refuse a store that could lead reads or writes elsewhere; return warnings about it."""
        ...

    def prepare(self) -> None:
        """Create what a first write needs."""
        ...

    def describe(self) -> dict[str, Any]:
        """Where it is, for people (``memory-stats``)."""
        ...

    def status(self) -> dict[str, Any]:
        """What else ``memory-stats`` shows of the place (the team database: its index and models)."""
        ...

    def maintain(self, wait_s: float | None = None) -> dict[str, Any] | None:
        """Outside the write lock, after a write or rebuild: upkeep the place needs (the team database
        builds its HNSW index here, waiting at most ``wait_s`` for other sessions); what was done."""
        ...

    def owns(self, path: "Path") -> bool:
        """Whether writing ``path`` would overwrite the store's own log (``memory-export`` refuses it)."""
        ...

    def discard(self) -> None:
        """Delete everything this memory holds in its place, for good (``memory-eval``'s scratch memories)."""
        ...

    # -- the log -----------------------------------------------------------------------------
    def refresh(self, scan: "LogScan | None") -> "LogScan":
        """``scan`` brought up to date (a fresh scan for None)."""
        ...

    def append(self, records: "Sequence[Record]", ops: Sequence[dict[str, Any]] = ()) -> None:
        """Append one change durably (under the lock); readers see all of it or none."""
        ...

    def settle(self, scan: "LogScan") -> dict[str, Any] | None:
        """Under the lock: settle an unfinished write a crashed writer left; say what was done."""
        ...

    def rewrite(self, records: "Sequence[Record]") -> dict[str, Any]:
        """Under the lock: replace the log by these records and the log's ``redact`` lines (no text; what they
        name stays never read), keeping the old log (``memory-compact``)."""
        ...

    def redact(self, ids: set[str], reason: str, keys: Sequence[str] = ()) -> dict[str, Any]:
        """Under the lock: remove the text of every record line of ``ids`` from the log and every copy the
        store keeps of it (backups), leaving ``redact`` lines; drop the shared vectors of the texts
        ``keys`` name.  Say how many lines, which ids and which files or tables."""
        ...

    def held_in_copies(self, ids: set[str]) -> dict[str, set[str]]:
        """Those of ``ids`` that have a record line in a copy the store keeps of the log (backups, set-aside
        bytes) though maybe no longer in the log itself (forgotten, then compacted away), each with the
        ``log.line_hash`` of its lines there: ``redact`` reaches them, and the log's ``redact`` lines name them."""
        ...

    def export_lines(self) -> Iterator[bytes]:
        """Every line of the log, in order, as ``records.jsonl`` holds them (``memory-export``)."""
        ...

    # -- the lock ------------------------------------------------------------------------------
    def lock(self, verb: str) -> AbstractContextManager[None]:
        """Hold the write lock (waiting up to ``memory.lock_timeout``; ``lock-timeout`` after)."""
        ...

    def try_lock(self, verb: str) -> AbstractContextManager[bool]:
        """Hold the write lock if it is free right now (yields whether it was)."""
        ...

    # -- derived state -------------------------------------------------------------------------
    def read_manifest(self) -> "Manifest | None": ...

    def load_current(self) -> "tuple[Manifest | None, VectorIndex | None]": ...

    def commit(self, *, ids: "Strings", hashes: "Digests", vectors: "np.ndarray", embedding: dict[str, Any],
               params: "HnswParams", alpha: float, previous: "Manifest | None", base: "VectorIndex | None" = None,
               rebuilt: bool = False, side_weight: "dict[str, Any] | None" = None,
               pieces: "Pieces | None" = None, questions: "Questions | None" = None) -> "Manifest":
        """Under the lock: publish a new vector generation (``base``: extend the current one).
        ``side_weight``: z fusion's per-memory weight (``search/sideweight.py``), written into the
        manifest; None keeps ``previous``'s.  ``pieces``: the piece vectors of the several-piece
        records among the rows given (``index/vectors.py``; None: a generation without them).
        ``questions``: every HyPE question vector the new generation keeps (None: none).  ``ids`` and
        ``hashes`` become the store's: it may keep them as the next generation's own (``cache.py``), so the
        caller passes lists it does not change afterwards."""
        ...

    def shared_vectors(self, fingerprint: str, keys: list[str]) -> "dict[str, np.ndarray]":
        """Vectors other processes made for these texts (keyed by a text hash) under this model
        fingerprint; {} for a store that shares none, or when the place cannot answer."""
        ...

    def share_vectors(self, fingerprint: str, vectors: "dict[str, np.ndarray]") -> None:
        """Offer vectors made here to other processes (best effort: they are derived data)."""
        ...

    def load_lexical(self, max_records: int) -> "tuple[PostingsBM25, int] | None":
        """The persisted lexical postings and the bytes of the log they cover (``LogScan.applied``), if still valid."""
        ...

    def save_lexical(self, engine: "PostingsBM25", offset: int) -> None: ...

    def invalidate_lexical(self) -> None: ...

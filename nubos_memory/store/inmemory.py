"""The in-memory store: a whole memory held in this process, gone when the process ends.

For tests and for library users who want a throwaway memory::

    from nubos_memory import Memory
    from nubos_memory.config import load_project
    from nubos_memory.store.inmemory import InMemoryStore

    mem = Memory(load_project("."), store=InMemoryStore())

It is a complete :class:`~nubos_memory.store.base.Store` with the file store's semantics
(``tests/test_store_contract.py`` runs the same scenarios against all three stores):

* **the log** is the bytes a ``records.jsonl`` would hold (``log.py`` reads them, so ``export_lines``
  gives a file the file store reads as is).  A change is framed by ``log.frame`` and added in one
  step under a mutex: readers see all of it or none, and no crash can leave half of it, so
  ``settle`` only removes redacted text that came back (as the file store's does).
  ``rewrite`` keeps the old log as a backup (``backups``); it and ``redact`` start a new *epoch*:
  every reader's cursor names the epoch it read, so it reads the new log from its start;
* **the write lock** is a ``threading`` lock with the file store's waiting and ``lock-timeout``
  semantics (``memory.lock_timeout``), excluding every thread that uses this store object;
* **derived state** (the vector generation, the lexical postings, usage) is held in memory: no
  graph (the exact scan answers at any size), nothing signed (nothing anyone else could forge).

It is not a ``memory.backend``: a memory that ends with its process is chosen in code, never in a
committed config.
"""

from __future__ import annotations

import copy
import secrets
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from .. import codes
from ..errors import LockTimeout, StoreError
from ..fsio import dumps
from ..index.lexical import PostingsBM25
from ..index.vectors import HnswParams, Pieces, Questions, VectorIndex, kappa, order_stats
from ..log import LogScan, copied_lines, feed, frame, redact_lines, redactions_in, restart
from ..records import SCHEMA_VERSION, now_iso
from ..types import Manifest, Record
from .cache import CACHE_FORMAT, carried_side_weight, covers_digest, joined_pieces, pieces_field, questions_field
from .lock import try_enter

if TYPE_CHECKING:
    from pathlib import Path

    from ..columns import Digests, Strings
    from .base import Store

FOLD_EVENTS = 10_000  # retrieval events kept before a writer folds them into the summary


@dataclass(frozen=True)
class MemoryCursor:
    """Where an in-memory log was read to: which store's log (``store``), in which epoch (a new one
    after ``rewrite`` or ``redact`` replaced its lines); the bytes read are ``LogScan.applied``."""

    store: str
    epoch: int


class MemoryUsage:
    """Retrievals, as the file store's ``usage.py`` keeps them: events, folded into a summary by writers."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._since: float | None = None
        self._events: list[tuple[float, list[str]]] = []
        self._summary: dict[str, list[float]] = {}

    def start(self) -> None:
        """Mark the beginning of tracking, unless it already began."""
        with self._mutex:
            if self._since is None and not self._events and not self._summary:
                self._since = time.time()

    def record(self, ids: list[str]) -> bool:
        if ids:
            with self._mutex:
                self._events.append((round(time.time(), 3), list(ids)))
        return True

    def summary(self) -> tuple[float | None, dict[str, list[float]]]:
        """``(tracking since, {id: [retrievals, last retrieved]})``."""
        with self._mutex:
            return self._summed()

    def _summed(self) -> tuple[float | None, dict[str, list[float]]]:
        ids = {rid: list(entry) for rid, entry in self._summary.items()}
        first: float | None = None
        for t, hits in self._events:
            first = t if first is None else min(first, t)
            for rid in hits:
                entry = ids.get(rid)
                ids[rid] = [1, t] if entry is None else [entry[0] + 1, max(entry[1], t)]
        return (self._since if self._since is not None else first), ids

    def fold(self, force: bool = False) -> None:
        """Fold the events into the summary once there are many (or ``force``)."""
        with self._mutex:
            if force or len(self._events) >= FOLD_EVENTS:
                self._since, self._summary = self._summed()
                self._events.clear()

    def clear(self) -> None:
        with self._mutex:
            self._since, self._events, self._summary = None, [], {}


@dataclass
class _Lexical:
    """Saved lexical postings: the arrays that rebuild them, the log bytes they cover, in which epoch."""

    terms: list[str]
    arrays: dict[str, np.ndarray]
    offset: int
    epoch: int
    count: int


class InMemoryStore:
    """The :class:`~nubos_memory.store.base.Store` of a memory held in this process (module docstring)."""

    kind = "memory"
    shares_vectors = False

    def __init__(self, lock_timeout: float = 10.0, *, name: str = "memory"):
        self.lock_timeout = lock_timeout
        self.name = name
        self.usage = MemoryUsage()
        self._token = secrets.token_hex(8)  # tells this store's cursors from another's
        self._mutex = threading.RLock()  # guards everything below; held only for a step, never across calls
        self._log = bytearray()
        self._epoch = 0
        self._backups: list[bytes] = []
        self._manifest: Manifest | None = None
        # ids, hashes, vectors, pieces (None: a generation without them), HyPE questions
        self._generation: tuple[list[str], list[str], np.ndarray, Pieces | None, Questions | None] | None = None
        self._lexical: _Lexical | None = None
        self._write_lock = threading.Lock()
        self._holder: dict[str, Any] | None = None

    # -- the place -------------------------------------------------------------------------
    def check(self) -> list[dict[str, Any]]:
        return []  # nothing on disk could lead reads or writes elsewhere

    def prepare(self) -> None:
        pass

    def describe(self) -> dict[str, Any]:
        with self._mutex:
            return {"backend": self.kind, "name": self.name, "log_bytes": len(self._log), "epoch": self._epoch}

    def status(self) -> dict[str, Any]:
        return {}

    def maintain(self, wait_s: float | None = None) -> dict[str, Any] | None:
        return None

    def owns(self, path: "Path") -> bool:
        return False  # the log is no file

    def discard(self) -> None:
        """Drop everything: the log, its backups and every derived thing."""
        with self._mutex:
            self._log = bytearray()
            self._epoch += 1
            self._backups = []
            self._manifest = self._generation = self._lexical = None
        self.usage.clear()

    @property
    def backups(self) -> list[bytes]:
        """The logs ``rewrite`` replaced, oldest first (what ``records.jsonl.bak-*`` holds for the file store)."""
        with self._mutex:
            return list(self._backups)

    # -- the log -----------------------------------------------------------------------------
    def refresh(self, scan: LogScan | None) -> LogScan:
        """``scan`` extended by what was appended since its cursor (the same object); a fresh parse of the
        whole log when it was replaced (another epoch) or the scan is another store's."""
        cursor = scan.cursor if scan is not None and isinstance(scan.cursor, MemoryCursor) else None
        with self._mutex:
            epoch = self._epoch
            if (scan is not None and cursor is not None and cursor.store == self._token and cursor.epoch == epoch
                    and scan.applied <= len(self._log)):
                if scan.size == len(self._log):
                    return scan  # unchanged
                feed(scan, bytes(self._log[scan.applied:]))
                return scan
            data = bytes(self._log)
        fresh = restart(scan)
        feed(fresh, data)
        fresh.cursor = MemoryCursor(self._token, epoch)
        return fresh

    def append(self, records: "Sequence[Record]", ops: Sequence[dict[str, Any]] = ()) -> None:
        """One change, added in one step (a group when it is more than one line)."""
        lines = frame(records, ops)
        if lines:
            chunk = b"".join(line + b"\n" for line in lines)
            with self._mutex:
                self._log += chunk

    def settle(self, scan: LogScan) -> dict[str, Any] | None:
        """A change is added in one step, so no writer leaves half of one; redacted text that came back
        (an import of an old export) is removed again, as the file store does."""
        if not scan.redacted_present:
            return None
        purged = self.redact(set(scan.redacted), "redacted again: the text came back",
                             only={rid: set(info["hashes"]) for rid, info in scan.redacted.items()})
        return {"redacted_again": purged["lines"]}

    def rewrite(self, records: "Sequence[Record]") -> dict[str, Any]:
        """Under the lock: the current log becomes a backup, ``records`` and the log's ``redact`` lines the
        new log (a new epoch)."""
        with self._mutex:
            before = bytes(self._log)
            kept = redactions_in(before.splitlines(keepends=True))
            data = b"".join(dumps(r) + b"\n" for r in [*records, *kept])
            if before:
                self._backups.append(before)
            self._log = bytearray(data)
            self._epoch += 1
            self._lexical = None
            backup = f"backup {len(self._backups)}" if before else None
        return {"backup": backup, "bytes": {"before": len(before), "after": len(data)}}

    def redact(self, ids: set[str], reason: str, keys: Sequence[str] = (),
               only: dict[str, set[str]] | None = None) -> dict[str, Any]:
        """Under the lock: every record line of ``ids`` (``only``: just those lines) in the log and its
        backups becomes a ``redact`` line (``log.redact_lines``); a changed log starts a new epoch.
        ``keys``: texts' shared vectors (this store shares none)."""
        found: list[str] = []
        places: list[str] = []
        with self._mutex:
            lines, hit = redact_lines(bytes(self._log).splitlines(keepends=True), ids, reason, only)
            if hit:
                self._log = bytearray(b"".join(lines))
                self._epoch += 1
                found += hit
                places.append("log")
            for i, old in enumerate(self._backups):
                lines, hit = redact_lines(old.splitlines(keepends=True), ids, reason, only)
                if hit:
                    self._backups[i] = b"".join(lines)
                    places.append(f"backup {i + 1}")
            self._lexical = None
        return {"lines": len(found), "ids": sorted(set(found)), "files": places}

    def held_in_copies(self, ids: set[str]) -> dict[str, set[str]]:
        with self._mutex:
            return copied_lines([old.splitlines(keepends=True) for old in self._backups], ids)

    def export_lines(self) -> Iterator[bytes]:
        """Every line of the log, in order, as ``records.jsonl`` would hold them."""
        with self._mutex:
            data = bytes(self._log)
        yield from data.splitlines(keepends=True)

    # -- the lock ------------------------------------------------------------------------------
    @contextmanager
    def lock(self, verb: str, timeout: float | None = None) -> Iterator[None]:
        """Hold the write lock, waiting up to ``lock_timeout`` (``timeout``); ``lock-timeout`` after.
        Not re-entrant: a second hold waits, whichever thread asks."""
        wait = self.lock_timeout if timeout is None else timeout
        if not self._write_lock.acquire(timeout=max(wait, 0.0)):
            holder = self._holder
            raise LockTimeout(f"another thread holds the write lock of in-memory store {self.name!r} "
                              f"(waited {wait:g}s)",
                              details={"waited_s": wait, "holder": dict(holder) if holder else None})
        try:
            self._holder = {"thread": threading.current_thread().name, "verb": verb, "since": time.time()}
            yield
        finally:
            self._holder = None
            self._write_lock.release()

    def try_lock(self, verb: str) -> AbstractContextManager[bool]:
        """Hold the write lock if it is free right now (yields whether it was)."""
        return try_enter(self.lock(verb, timeout=0))

    # -- derived state -------------------------------------------------------------------------
    def read_manifest(self) -> Manifest | None:
        with self._mutex:
            return copy.deepcopy(self._manifest)

    def load_current(self) -> tuple[Manifest | None, VectorIndex | None]:
        with self._mutex:
            manifest, generation = copy.deepcopy(self._manifest), self._generation
        if manifest is None or generation is None:
            return None, None
        ids, hashes, vectors, pieces, questions = generation
        ef = int((manifest.get("hnsw") or {}).get("ef_search", 100))
        return manifest, VectorIndex(list(ids), list(hashes), vectors, None, ef, pieces=pieces, questions=questions)

    def commit(self, *, ids: "Strings", hashes: "Digests", vectors: np.ndarray, embedding: dict[str, Any],
               params: HnswParams, alpha: float, previous: Manifest | None, base: VectorIndex | None = None,
               rebuilt: bool = False, side_weight: dict[str, Any] | None = None,
               pieces: Pieces | None = None, questions: Questions | None = None) -> Manifest:
        """Under the lock: a new generation (``base``: the current one, whose rows ``vectors`` extend;
        ``pieces``: those rows' pieces, ``store/cache.py``)."""
        added = np.ascontiguousarray(vectors, dtype=np.float32)
        dim = embedding.get("dim")
        if base is not None and not len(base):
            base = None
        if base is not None:  # a new array: the base's rows, then these
            rows = np.concatenate([np.asarray(base.vectors, dtype=np.float32).reshape(len(base), -1), added])
        elif len(added):  # a copy: the caller's array stays the caller's
            rows = np.array(added.reshape(len(added), -1), dtype=np.float32, copy=True)
        else:
            rows = np.zeros((0, int(dim or 1)), dtype=np.float32)
        if len(rows) != len(ids) or len(hashes) != len(ids) or (len(ids) and dim is not None and rows.shape[1] != dim):
            raise StoreError(f"a generation of {len(ids)} ids and {len(hashes)} hashes was given {rows.shape} vectors",
                             code=codes.VECTORS_CORRUPT, details={"ids": len(ids), "shape": list(rows.shape)})
        rows.flags.writeable = False  # shared by every reader of this generation
        pieces = joined_pieces(base, pieces)
        if pieces is not None:
            pieces = Pieces(np.array(pieces.vectors, dtype=np.float32, copy=True), pieces.owner.copy())
            pieces.vectors.flags.writeable = False
        now = now_iso()
        before = (previous or {}).get("order")
        if base is not None and isinstance(before, dict) and before.get("rows") == len(base):
            order = order_stats(added, before, base.row(len(base) - 1))
        else:
            order = order_stats(rows)
        doc: dict[str, Any] = {
            "format": CACHE_FORMAT,
            "schema_version": SCHEMA_VERSION,
            "generation": f"{int(time.time() * 1000):x}-{secrets.token_hex(3)}",
            "appended_to": (previous or {}).get("generation") if base is not None else None,
            "embedding": dict(embedding),
            "hnsw": params.to_dict(),
            "candidates": {"source": "exact scan"},  # no graph is kept
            "alpha": alpha,
            "files": None,
            "covers": {"count": len(ids), "digest": covers_digest(ids, hashes), "last_id": ids[-1] if ids else None},
            "order": order,
            "kappa": kappa(order),
            "created_at": (previous or {}).get("created_at") or now,
            "rebuilt_at": now if rebuilt else (previous or {}).get("rebuilt_at"),
            "updated_at": now,
            **carried_side_weight(side_weight, previous),
            **pieces_field(pieces, previous, rebuilt),
            **questions_field(questions if ids else None),
        }
        manifest = cast(Manifest, doc)
        with self._mutex:
            self._manifest = copy.deepcopy(manifest)
            self._generation = (list(ids), list(hashes), rows, pieces,
                                questions if questions is not None and len(questions) and ids else None)
        return manifest

    def shared_vectors(self, fingerprint: str, keys: list[str]) -> dict[str, np.ndarray]:
        return {}  # one process: the generation is the only place vectors live

    def share_vectors(self, fingerprint: str, vectors: dict[str, np.ndarray]) -> None:
        pass

    def load_lexical(self, max_records: int) -> tuple[PostingsBM25, int] | None:
        """The saved postings and the log bytes they cover, if saved in this epoch and not past the log."""
        with self._mutex:
            saved = self._lexical
            if saved is None or saved.epoch != self._epoch or saved.offset > len(self._log) \
                    or saved.count > max_records:
                return None
        engine = PostingsBM25.from_arrays(list(saved.terms), {k: v.copy() for k, v in saved.arrays.items()})
        return engine, saved.offset

    def save_lexical(self, engine: PostingsBM25, offset: int) -> None:
        terms, arrays = engine.arrays()
        saved = _Lexical(list(terms), {k: np.array(v, copy=True) for k, v in arrays.items()}, offset, 0, engine.size)
        with self._mutex:
            saved.epoch = self._epoch
            self._lexical = saved

    def invalidate_lexical(self) -> None:
        with self._mutex:
            self._lexical = None


if TYPE_CHECKING:
    _satisfies_the_protocol: Store = InMemoryStore()

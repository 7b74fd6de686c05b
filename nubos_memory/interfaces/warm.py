"""One project's memory kept warm in a long-lived process (``memory-serve``, ``memory-mcp``).

The model, the vectors, the lexical index and the parsed log stay loaded
between requests.  There are two :class:`Memory` objects over the same store,
sharing one embedder (so the model loads once): writes go through one, one at
a time, and reads through the other, so a query is answered while a long
write (an index of hundreds of records) is still embedding.  Each sees the
other's changes the way two processes would: through the store.

``warm_up`` loads everything under both locks: a request that arrives during
warm-up waits for it instead of loading the model a second time.  When the
project config changes, both are reopened with the new settings, keeping the
loaded model if provider and model are unchanged.  ``catch_up`` embeds records
other processes wrote without vectors, a bounded slice at a time.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ..errors import NubosMemoryError

if TYPE_CHECKING:
    from ..api.memory import Memory
    from ..embed.base import Embedder

CATCH_UP_SLICE_S = 1.0
IDLE_QUIET_S = 2.0  # idle work (a side-weight estimate, a merge) waits until no request came for this long


def _query_helper(mem: "Memory") -> None:
    """A warm process embeds its search queries in a helper process beside each query, unless
    ``memory.query_helper`` is off (``embed/helper.py``)."""
    try:
        embedder = mem.embedder
    except NubosMemoryError:
        return  # (an embedder that cannot be made says so where a request uses it, as without the helper)
    embedder.use_query_helper(mem.config.query_helper == "auto")


class WarmMemory:
    def __init__(self, root: str | None, embedder: "Embedder | None" = None):
        from ..api.memory import Memory

        writer = Memory.open(root, embedder=embedder)
        writer.vectors.defer_side_weight = True  # estimated when idle (catch_up), never while a write waits
        _query_helper(writer)
        self.root = writer.project.root
        self._writer = writer
        self._reader = self._twin(writer)
        self._write_lock = threading.Lock()
        self._read_lock = threading.Lock()
        self._stamp = self._config_stamp()
        self.loads = 0  # model loads (a warm process loads its model once)
        self._last_request = time.monotonic()
        self._waiting = 0  # requests waiting for a lock (idle work does not start while one waits)
        self._count = threading.Lock()  # (guards ``_waiting``)
        self._idle_declined: Any = None  # the generation idle work last found nothing to do on (or failed on)

    @staticmethod
    def _twin(mem: "Memory") -> "Memory":
        from ..api.memory import Memory

        twin = Memory(mem.project)
        twin.use_embedder(mem.embedder)
        return twin

    @property
    def memory(self) -> "Memory":
        """The writer (for checks that need no lock)."""
        return self._writer

    def _config_stamp(self) -> Any:
        try:
            st = self._writer.project.config_path.stat()
            return (st.st_ino, st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            return None

    def _reopen_if_changed(self) -> None:
        """Under both locks: reopen with the new settings when the project config changed."""
        stamp = self._config_stamp()
        if stamp == self._stamp:
            return
        from ..api.memory import Memory
        from ..embed import made_alike

        old = self._writer
        fresh = Memory.open(self.root)
        loaded = old.loaded_embedder()
        if loaded is not None and made_alike(fresh.config, old.config):
            fresh.use_embedder(loaded)  # keep the loaded model
        fresh.vectors.defer_side_weight = True
        _query_helper(fresh)
        self._writer, self._reader, self._stamp = fresh, self._twin(fresh), stamp

    @contextmanager
    def use(self, writes: bool) -> Iterator["Memory"]:
        """The memory for one request, held for it alone: the writer for a write, else the reader."""
        self._last_request = time.monotonic()  # (before any lock: idle work sees a request waiting)
        lock = self._write_lock if writes else self._read_lock
        with self._count:
            self._waiting += 1
        try:
            if self._config_stamp() != self._stamp:
                with self._write_lock, self._read_lock:
                    self._reopen_if_changed()
            lock.acquire()
        finally:
            with self._count:
                self._waiting -= 1
        try:
            yield self._writer if writes else self._reader
        finally:
            self._last_request = time.monotonic()
            lock.release()

    def answer(self, verb: str, request: dict[str, Any],
               progress: "Callable[[str, int, int], None] | None" = None) -> tuple[int, str, Any]:
        """``verbs.run`` of ``verb`` on the memory it needs (the writer or the reader): ``(exit code, stream,
        document)``, a failure to take that memory (its config turned invalid since, the project gone) in
        the same envelope as any other error, never an exception an interface would turn into a 500."""
        from ..errors import failure
        from .verbs import VERBS, Context, run

        try:
            with self.use(writes=VERBS[verb].writes) as mem:
                return run(verb, request, Context(open_memory=lambda _root: mem, progress=progress))
        except Exception as exc:  # noqa: BLE001 - taking the memory failed: the answer says why
            code, envelope = failure(exc)
            return code, "stderr", envelope

    def get(self) -> "Memory":
        """The writer, reopened first if the project config changed (single-threaded callers)."""
        with self._write_lock, self._read_lock:
            self._reopen_if_changed()
        return self._writer

    def warm_up(self) -> None:
        """Load the log, the lexical index, the vectors and the model, under both locks: a request
        that arrives meanwhile waits for this one load instead of starting its own."""
        with self._write_lock, self._read_lock:
            self._reopen_if_changed()
            for mem in (self._writer, self._reader):
                if not mem.config.enabled or not mem.scan().records:
                    return
                mem.snap.lexical_engine()
                try:
                    mem.snap.vectors()
                except NubosMemoryError:
                    pass
            try:
                self._writer.embedder.embed(["warm up"])
                self._writer.embedder.embed_search(["warm up"])  # queries' own copy of the model (adr/0022)
                self.loads += 1
            except NubosMemoryError:
                pass  # answered per request as degraded, as in-process

    def catch_up(self, budget_s: float = CATCH_UP_SLICE_S, quiet_s: float = IDLE_QUIET_S) -> int:
        """Embed and commit records that have no vector yet, for at most about ``budget_s`` seconds,
        if no write is running; with nothing to embed and no request for ``quiet_s``, the idle work
        (:meth:`idle`).  Returns how many are still behind (0: nothing to do)."""
        if not self._write_lock.acquire(blocking=False):
            return -1
        try:
            mem = self._writer
            if not mem.config.enabled:
                return 0
            mem.scan()
            self._follow_reader()
            state = mem.vectors.sync(None, cap=mem.config.max_pending_embed, blocking=False, verb="memory-serve",
                                     budget_s=budget_s)
            if state.degraded is not None or not state.indexed:
                if time.monotonic() - self._last_request >= quiet_s:
                    self.idle(mem)
                return 0  # nothing to do, or nothing could be committed now: try again later
            return state.behind
        except (NubosMemoryError, OSError):
            return 0
        finally:
            self._write_lock.release()

    def _follow_reader(self) -> None:
        """The reader reads what the log became when no query holds it, as the writer did: a log rewritten
        by a redaction elsewhere is read again now, so the old state (and a mapped checkpoint file that
        held the redacted text) is let go without waiting for the next query."""
        if self._read_lock.acquire(blocking=False):
            try:
                self._reader.scan()
            finally:
                self._read_lock.release()

    def idle(self, mem: "Memory") -> None:
        """Under the write lock, nothing to embed, no request lately: make a side-weight estimate that
        is due, or merge the segments writes appended (``VectorSync.idle``).  What found nothing to do,
        or failed, is not tried again until the generation changes (an estimate can take seconds)."""
        from ..store.base import MERGE_IDLE_SEGMENTS

        generation = (mem.store.read_manifest() or {}).get("generation")
        if generation is None or generation == self._idle_declined or self._waiting:
            return
        try:
            done = mem.vectors.idle("memory-serve", MERGE_IDLE_SEGMENTS, lambda: self._waiting > 0)
        except Exception:  # noqa: BLE001 - derived work: whatever failed is not tried again on this generation
            done = False
        if not done:
            self._idle_declined = generation

    @property
    def last_request(self) -> float:
        """When the last request came or went (``time.monotonic``)."""
        return self._last_request


def catch_up_forever(warm: WarmMemory, stop: threading.Event, idle: float = 0.5, longest: float = 4.0) -> None:
    """A background loop: whenever there is a backlog, work it off a slice at a time.  While nothing
    comes and nothing is behind it looks less and less often (up to ``longest`` seconds: a team
    database is asked on every look); an unexpected error is written to stderr once, never ends it."""
    wait, seen, told = idle, warm.last_request, False
    while not stop.wait(wait):
        try:
            behind = warm.catch_up()
            while not stop.is_set() and behind > 0:
                time.sleep(0.05)  # let a waiting request take the lock between slices
                behind = warm.catch_up()
        except Exception as exc:  # noqa: BLE001 - the loop outlives any one failure
            behind = 0
            if not told:
                sys.stderr.write(f"nubos-memory: background indexing failed once: {type(exc).__name__}: {exc}\n")
                told = True
        busy = warm.last_request != seen or behind != 0
        seen = warm.last_request
        wait = idle if busy else min(wait * 2, longest)

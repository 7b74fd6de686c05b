"""One project's :class:`Memory` kept warm in a long-lived process.

Used by ``memory-serve`` and ``memory-mcp``: the model, the vectors and the
lexical index stay loaded between requests.  When ``.nubos-pilot/config.json``
changes, the memory is reopened with the new settings, keeping the loaded
model if provider and model are unchanged.
"""

from __future__ import annotations

from typing import Any

from ..errors import NubosMemoryError


class WarmMemory:
    def __init__(self, root: str | None):
        from ..api.memory import Memory

        self.memory = Memory.open(root)
        self.root = self.memory.project.root
        self._stamp = self._config_stamp()

    def _config_stamp(self) -> Any:
        try:
            st = self.memory.project.config_path.stat()
            return (st.st_ino, st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            return None

    def get(self) -> Any:
        """The warm Memory, reopened first if the project config changed."""
        stamp = self._config_stamp()
        if stamp != self._stamp:
            from ..api.memory import Memory

            old = self.memory
            fresh = Memory.open(self.root)
            same_model = (fresh.config.provider, fresh.config.model) == (old.config.provider, old.config.model)
            if old._embedder is not None and same_model:
                fresh._embedder = old._embedder  # keep the loaded model
            self.memory, self._stamp = fresh, stamp
        return self.memory

    def warm_up(self) -> None:
        """Load the log, the lexical index, the vectors and the model ahead of the first request."""
        mem = self.get()
        if not mem.config.enabled or not mem.scan().records:
            return
        mem.snap.lexical_engine()
        try:
            mem.snap.vectors()
            mem.embedder.embed(["warm up"])
        except NubosMemoryError:
            pass  # answered per request as degraded, as in-process

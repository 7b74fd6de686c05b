"""nubos-memory: long-term memory for AI coding agents.

``records.jsonl`` is the source of truth; an HNSW cosine index, its keymap
and a manifest are a derived cache rebuilt from it; queries fuse BM25 with
vector scores.  Start with :class:`Memory`.

``Memory`` is imported on first use, so that ``np-tools`` verbs answered by a
warm ``memory-serve`` start without numpy and the rest of the library.
"""

from typing import TYPE_CHECKING, Any

from .errors import NubosMemoryError

if TYPE_CHECKING:
    from .api.memory import Memory

__version__ = "0.1.0"
__all__ = ["Memory", "NubosMemoryError", "__version__"]


def __getattr__(name: str) -> Any:
    if name == "Memory":
        from .api.memory import Memory

        return Memory
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

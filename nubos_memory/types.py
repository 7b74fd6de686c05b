"""The shapes of the library's data: records, manifests and the answers of the verbs.

These are the JSON documents the CLI prints and the MCP tools return; field
names are a contract (tests pin them).  ``TypedDict`` keeps them plain dicts
(``orjson`` writes them as they are) while the type checker knows their fields.
"""

from __future__ import annotations

from typing import Any, NotRequired, Required, TypedDict


class Record(TypedDict):
    """One record of ``records.jsonl`` (schema v2; ``records.py`` validates it)."""

    id: str
    type: str
    phase: str | None
    title: str
    body: str
    tags: list[str]
    provenance: str | None
    created_at: str | None
    source_file: NotRequired[str]
    chunk_index: NotRequired[int]
    heading: NotRequired[str]
    importance: NotRequired[float]
    supersedes: NotRequired[str]
    anchors: NotRequired[list[dict[str, Any]]]  # code it cites: {path, lines?, sha, head, commit?} (api/anchors.py)
    git: NotRequired[dict[str, str | None]]  # where it was written: {branch, commit, worktree}
    valid_until: NotRequired[str]  # ISO-8601: retired by itself from then on (expired)
    hot: NotRequired[bool]  # pinned on write: in every memory-context block (memory-unpin undoes it; log.py)
    domain: NotRequired[str]  # a bucket a tool sorts records into (fact, conversation, finding ...): a filter


class Embedding(TypedDict, total=False):
    """What makes vectors comparable (``embed/base.py``), as stored in the manifest."""

    provider: str
    model: str
    files: str | None
    dim: int | None
    normalize: bool
    template: str
    pooling: str
    version: int
    fingerprint: str


class Manifest(TypedDict, total=False):
    """``manifest.json``: the current generation of derived vector files (``store/cache.py``)."""

    format: int
    schema_version: int
    generation: str
    appended_to: str | None
    embedding: Embedding
    hnsw: dict[str, Any]
    candidates: dict[str, Any]  # where vector candidates come from, when not the local graph (adr/0014)
    alpha: float
    files: dict[str, dict[str, Any]] | None
    covers: dict[str, Any]
    order: dict[str, Any]
    kappa: float
    side_weight: dict[str, Any]  # z fusion's per-memory lexical weight (search/sideweight.py)
    pieces: dict[str, Any]  # best-piece scoring: rule, lambda, piece rows (index/vectors.py); absent: before it
    questions: dict[str, Any]  # HyPE's question vectors: rule, rows (absent: none)
    segments: list[dict[str, Any]]  # the rows appended after the base files, in label order (store/cache.py)
    created_at: str
    rebuilt_at: str | None
    updated_at: str
    signature: str | None


class Problem(TypedDict, total=False):
    """A warning or a consistency problem: a stable code (``codes.py``; always there) and a message, plus
    where it is: the details each kind carries (``docs/errors.md``)."""

    code: Required[str]
    message: str
    ids: list[str]  # the records it is about
    filters: dict[str, Any]  # a query's filters that matched nothing
    path: str  # a file it is about
    memory: str  # the memory it is about, in an answer over both (project | user; api/usermemory.py)
    line: int  # a line of the log
    lines: list[int]
    count: int
    excerpt: str  # the beginning of a damaged line
    reason: str
    bytes: int
    open_group: dict[str, Any]


class Hit(TypedDict):
    """One result of ``memory-query``."""

    id: str
    score: float
    retrieval: str
    record: Record
    collapsed: NotRequired[dict[str, Any]]
    explain: NotRequired[dict[str, Any]]
    conflicts: NotRequired[list[dict[str, Any]]]  # collapsed older statements that disagree: {id, kind, ...}
    freshness: NotRequired[str]  # verified | moved | drifted | missing | unanchored (api/anchors.py)
    merged: NotRequired[bool]  # its record's git.commit is reachable from HEAD (api/gitstate.py)
    anchors: NotRequired[list[dict[str, Any]]]  # each cited place, checked now
    memory: NotRequired[str]  # which memory holds it: project | user (api/usermemory.py)


class QueryResult(TypedDict):
    hits: list[Hit]
    degraded: dict[str, Any] | None
    query: dict[str, Any]
    counts: dict[str, int]
    warnings: list[Problem]
    budget: NotRequired[dict[str, Any]]
    scope: NotRequired[dict[str, Any]]  # the memory folders read, how each was found, branch and commit


class ContextSection(TypedDict):
    """One part of a ``memory-context`` block: its hits, the tokens they take and the most it may take."""

    hits: list[Hit]
    used: int
    limit: int


class ContextSections(TypedDict):
    hot: ContextSection  # pinned records, newest first (api/turn.py)
    relevant: ContextSection  # the hybrid query's best hits for the task
    recent: ContextSection  # the newest handoff records: what prior sessions left


class ContextResult(TypedDict):
    """The answer of ``memory-context``: one block to inject into an agent's turn (api/turn.py)."""

    query: dict[str, Any]
    sections: ContextSections
    budget: dict[str, Any]  # max_tokens, used, shares, and every record left out (id, section, tokens, why)
    degraded: dict[str, Any] | None
    warnings: list[Problem]
    scope: NotRequired[dict[str, Any]]


class WriteResult(TypedDict):
    """The answer of ``memory-index`` (``memory-add`` adds its own fields)."""

    added: int
    skipped: int
    ids: list[str]
    skipped_ids: list[str]
    duplicates: list[dict[str, Any]]
    near_duplicates: list[dict[str, Any]]
    reasserted: list[dict[str, Any]]  # repeats of a record a newer near duplicate overtook: stored (newest)
    forgotten: list[str]
    already_retired: list[str]
    indexed: int
    embedded: int
    pending: int | None
    degraded: dict[str, Any] | None
    recovered: dict[str, Any] | None
    warnings: list[Problem]


class Consistency(TypedDict):
    """Whether the log, the keymap and the index agree, and every problem found (with its why)."""

    records: int
    keymap: int
    index: int | None
    segments: dict[str, int]  # rows appended since the last merge, in segment files (store/cache.py)
    pending: int
    stale: int
    retired_in_index: int
    corrupt_lines: list[dict[str, Any]]
    corrupt_count: int
    duplicate_ids: list[dict[str, Any]]
    partial_tail: dict[str, Any] | None
    damaged_groups: list[dict[str, Any]]
    rolled_back: list[dict[str, Any]]
    fingerprint_match: bool | None
    consistent: bool
    problems: list[dict[str, Any]]


class Stats(TypedDict, total=False):
    """The answer of ``memory-stats``."""

    count: int
    retired: dict[str, Any]
    dim: int | None
    model: str
    provider: str
    configured_model: str
    runtime: dict[str, Any]
    schema_version: int
    alpha: float
    threshold: float
    fusion: str
    side_weight: dict[str, Any]  # z fusion's per-memory weight: setting, weight used, the estimate (sideweight.py)
    pieces: dict[str, Any] | None  # best-piece scoring of long records: the manifest's rule and rows (vectors.py)
    created_at: str | None
    rebuilt_at: str | None
    updated_at: str | None
    hnsw: dict[str, Any] | None
    candidates: dict[str, Any]  # the team database: where vector candidates come from (adr/0014)
    fingerprint: str | None
    consistency: Consistency
    backend: str
    store: dict[str, Any]
    user_folders: dict[str, Any]  # this user's config and cache folders: where, fallback, what was refused
    memory_dir: str
    bytes: int
    scope: dict[str, Any]  # the memory folders read, how each was found, branch and commit
    user_memory: dict[str, Any]  # the user-level memory: where, whether it exists, its records (api/usermemory.py)
    domains: dict[str, int]  # live records by domain (records.py)
    without_domain: int  # live records with no domain
    generator: dict[str, Any]  # memory.generator: off, or its settings and breaker; HyPE's counts (api/hype.py)
    warnings: list[Problem]


class AddResult(WriteResult):
    """The answer of ``memory-add``: the one record's id (or the stored record it duplicates)."""

    id: str
    duplicate_of: str | None
    near_duplicate_of: str | None
    similarity: float | None


class ForgetResult(TypedDict):
    forgotten: list[str]
    already_retired: list[str]
    recovered: dict[str, Any] | None
    warnings: list[Problem]


class GotRecord(TypedDict):
    """One record of ``memory-get``: ``retired`` says why and when (None while it is live)."""

    id: str
    live: bool
    retired: dict[str, Any] | None
    record: Record | None  # None for a redacted record: its text is gone
    history: NotRequired[list[dict[str, Any]]]  # with ``history``: every version, in log order, with its fate


class GetResult(TypedDict):
    records: list[GotRecord]
    missing: list[str]
    warnings: list[Problem]


class IngestResult(TypedDict):
    files: int
    new: int
    changed: int
    unchanged: int
    removed: int
    kept_retired: int
    added: int
    retired: int
    embedded: int
    skipped: list[dict[str, Any]]
    failed: list[dict[str, Any]]
    degraded: dict[str, Any] | None
    warnings: list[Problem]


class RebuildResult(TypedDict):
    rebuilt: bool
    count: int
    embedded: int
    shared: int
    reused: int
    model: str | None
    dim: int | None
    fingerprint: str | None
    rebuilt_at: str | None
    skipped_lines: int
    invalid: int  # records the model gave no usable vector for (left pending)
    index: NotRequired[dict[str, Any]]  # the team database's index build after the rebuild
    warnings: list[Problem]

"""``memory-mcp``: the memory as Model Context Protocol tools over stdio.

Built on the official ``mcp`` SDK (``mcp.server.mcpserver.MCPServer``).  One
:class:`~nubos_memory.interfaces.warm.WarmMemory` serves every call, so the
embedding model loads once per server process, and a call that arrives while
it warms up waits for that one load.  Each tool is a verb of the one verb
table (``verbs.py``), like a CLI command; its input schema is generated from
the typed signature below, with the bounds from ``limits.py`` that the library
enforces.  An error comes back as an MCP tool error (``is_error``) whose text
is our JSON error envelope, stable code included.  Successful results are the
same JSON documents the CLI prints (``memory_query`` can also answer with the
markdown context block).

stdout belongs to the protocol: nothing else is ever printed there.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field

from ..fsio import dumps
from ..limits import (
    ID_PATTERN,
    MAX_BODY,
    MAX_ID,
    MAX_K,
    MAX_PHASE,
    MAX_QUERY_CHARS,
    MAX_REASON,
    MAX_TAG,
    MAX_TAGS,
    MAX_TITLE,
)
from .verbs import VERBS, Context, run

if TYPE_CHECKING:
    from .warm import WarmMemory

INSTRUCTIONS = """Long-term project memory for coding agents: learnings, decisions, research notes, critic
findings and handoffs written by earlier sessions. Query it before you research, plan or review
(memory_query); write what you learned when you are done (memory_add). Hits are advisory prior art."""

Id = Annotated[str, Field(min_length=1, max_length=MAX_ID, pattern=f"^{ID_PATTERN}$")]
Tag = Annotated[str, Field(min_length=1, max_length=MAX_TAG, pattern=r"^[^,\x00-\x1f\x7f]+$")]
Tags = Annotated[list[Tag], Field(max_length=MAX_TAGS)]


def build_server(root: str | None) -> tuple[Any, "WarmMemory"]:
    """An ``MCPServer`` whose tools operate on the project memory at ``root``, and its warm memory."""
    from mcp.server.mcpserver import MCPServer
    from mcp_types import CallToolResult, TextContent

    from .. import __version__
    from .warm import WarmMemory

    warm = WarmMemory(root)
    server = MCPServer("nubos-memory", version=__version__, instructions=INSTRUCTIONS, log_level="WARNING")

    def call(name: str, request: dict[str, Any]) -> Any:
        """The verb's answer, or our error envelope as an MCP tool error.  Calls wait for the
        warm-up (it holds the same locks), so the model loads once."""
        with warm.use(writes=VERBS[name].writes) as mem:
            code, _, doc = run(name, {**request, "root": str(warm.root)}, Context(open_memory=lambda _root: mem))
        if code != 0:
            return CallToolResult(content=[TextContent(type="text", text=dumps(doc).decode())],
                                  structured_content=doc, is_error=True)
        return doc

    def as_text(doc: Any) -> Any:
        if isinstance(doc, (str, CallToolResult)):
            return doc
        return dumps(doc).decode()

    def memory_add(
        type: Annotated[str, Field(description="learning | handoff | critic | research (or a type the project "
                                               "configured)", min_length=1, max_length=32)],
        title: Annotated[str, Field(min_length=1, max_length=MAX_TITLE, description="one line: the point")],
        body: Annotated[str, Field(max_length=MAX_BODY, description="the details, rationale, evidence")] = "",
        tags: Tags | None = None,
        phase: Annotated[str, Field(max_length=MAX_PHASE, description="e.g. M005-S007-T0002")] | None = None,
        provenance: Literal["VERIFIED", "CITED", "ASSUMED", "CACHED"] | None = None,
        id: Id | None = None,
        supersedes: Id | None = None,
        importance: Annotated[float, Field(ge=0, le=1)] | None = None,
        force: bool = False,
    ) -> Any:
        """Store one memory. Reasoning blocks (<think>, <scratch_pad>) are removed first. If the same
        learning is already stored (same words, or a near duplicate), nothing is stored and the answer's
        `id`/`duplicate_of` name the existing record; `force` stores it anyway. `supersedes` retires the
        record this one replaces."""
        record: dict[str, Any] = {"type": type, "title": title, "body": body, "tags": tags or [], "phase": phase,
                                  "provenance": provenance}
        for key, value in (("id", id), ("supersedes", supersedes), ("importance", importance)):
            if value is not None:
                record[key] = value
        return as_text(call("memory-add", {**record, "force": force}))

    def memory_query(
        text: Annotated[str, Field(min_length=1, max_length=MAX_QUERY_CHARS,
                                   description="what you are about to work on, in your own words")],
        k: Annotated[int, Field(ge=1, le=MAX_K)] = 8,
        type: str | None = None,
        phase: str | None = None,
        tags: Annotated[list[str], Field(description="any overlap")] | None = None,
        max_tokens: Annotated[int, Field(ge=1, le=10_000_000, description="keep the best hits that fit")] | None = None,
        format: Literal["json", "markdown"] = "json",
        mode: Literal["hybrid", "lexical", "vector"] = "hybrid",
        fusion: Literal["alpha", "rrf"] | None = None,
        alpha: Annotated[float, Field(ge=0, le=1)] | None = None,
        explain: bool = False,
    ) -> Any:
        """Recall prior learnings, decisions and research relevant to a task: hybrid keyword + semantic
        search, best first. `format: markdown` returns a context block ready to paste into a prompt
        (title, provenance label such as [CACHED:VERIFIED], source, body). If the vector layer is
        unavailable the answer is keyword-only and says so in `degraded`."""
        return as_text(call("memory-query", {"text": text, "k": k, "type": type, "phase": phase, "tags": tags,
                                             "max_tokens": max_tokens, "mode": mode, "fusion": fusion,
                                             "alpha": alpha, "explain": explain, "format": format}))

    def memory_ingest(
        paths: Annotated[list[Annotated[str, Field(min_length=1, max_length=4096)]],
                         Field(min_length=1, max_length=1000,
                               description="markdown files or folders, relative to the project root")],
        include: list[str] | None = None,
        exclude: list[str] | None = None,
        prune_missing: bool = False,
        type: str | None = None,
    ) -> Any:
        """Index markdown knowledge (CLAUDE.md, docs/, memory category files with frontmatter), split on ##
        headings. Re-running is cheap: unchanged files change nothing; changed files replace exactly
        their old chunks; `prune_missing` retires chunks of deleted files."""
        return as_text(call("memory-ingest", {"paths": paths, "include": include, "exclude": exclude,
                                              "prune_missing": prune_missing, "type": type}))

    def memory_forget(
        ids: Annotated[list[Id], Field(min_length=1, max_length=10_000)],
        reason: Annotated[str, Field(min_length=1, max_length=MAX_REASON, pattern=r"^[^\x00-\x1f\x7f]+$")] = "forgotten",
    ) -> Any:
        """Retire records by id: they never appear in results again (the log keeps them, append-only)."""
        return as_text(call("memory-forget", {"ids": ids, "reason": reason}))

    def memory_stats() -> Any:
        """Counts, model, timestamps and a consistency report of the memory."""
        return as_text(call("memory-stats", {}))

    def memory_rebuild() -> Any:
        """Rebuild every derived file (vector index, keymap, lexical index) from records.jsonl; needed after
        changing the embedding model. Unchanged text is not re-embedded."""
        return as_text(call("memory-rebuild", {}))

    for fn in (memory_add, memory_query, memory_ingest, memory_forget, memory_stats, memory_rebuild):
        server.add_tool(fn, structured_output=False)
    return server, warm


def run_mcp(root: str | None) -> None:
    """Serve over stdio until the client closes the connection; the model warms up meanwhile
    (a first call waits for it rather than loading it again)."""
    server, warm = build_server(root)

    def warm_up() -> None:
        try:
            warm.warm_up()
        except Exception:  # noqa: BLE001 - a failed warm-up is answered per call instead
            pass

    threading.Thread(target=warm_up, name="warm-up", daemon=True).start()
    server.run("stdio")

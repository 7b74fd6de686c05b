"""``memory-mcp``: the memory as Model Context Protocol tools over stdio.

Built on the official ``mcp`` SDK (``mcp.server.mcpserver.MCPServer``).  One
:class:`~nubos_memory.interfaces.warm.WarmMemory` serves every call, so the
embedding model loads once per server process, and a call that arrives while
it warms up waits for that one load.  Each tool is a verb of the one verb
table (``verbs.py``), like a CLI command.

What a model sees is written for a model that has never seen the tools
(adr/0013): every parameter described, with its allowed values and an example
where it helps; annotations (title, read-only, destructive, idempotent); an
output schema per tool (the library's own result types); input schemas with
``additionalProperties: false`` and optional parameters as their plain type.
Every failure is one shape: an MCP tool error (``is_error``) whose text is our
JSON error envelope with a stable code: the
library's own codes, ``tool-unknown``, ``argument-unknown`` (a name the tool
does not take: agents invent ``limit`` or ``filter``) and ``argument-invalid``
(field names and what is wrong; the rejected values are not echoed).

stdout belongs to the protocol: nothing else is ever printed there.
"""

from __future__ import annotations

import inspect
import threading
import types as pytypes
import typing
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field

from ..errors import UsageError
from ..fsio import dumps
from ..limits import (
    BASE_TYPES,
    FUSIONS,
    ID_PATTERN,
    MAX_BODY,
    MAX_ECHO,
    MAX_FORGET,
    MAX_GET,
    MAX_ID,
    MAX_K,
    MAX_PHASE,
    MAX_QUERY_CHARS,
    MAX_REASON,
    MAX_TAG,
    MAX_TAGS,
    MAX_TITLE,
    MAX_TOKENS,
    MAX_TYPE,
    MCP_MAX_TOKENS,
    MODES,
    PROVENANCES,
)
from ..types import (
    AddResult,
    ForgetResult,
    GetResult,
    IngestResult,
    QueryResult,
    RebuildResult,
    Stats,
)
from .verbs import VERBS, Context, run

if TYPE_CHECKING:
    from mcp_types import CallToolResult

    from .warm import WarmMemory

INSTRUCTIONS = """Long-term project memory for coding agents: learnings, decisions, research notes, critic
findings and handoffs written by earlier sessions. Query it before you research, plan or review
(memory_query); open records by id (memory_get); write what you learned when you are done (memory_add).
Hits are advisory prior art. Every error is a JSON envelope {"error": {"code", "message", "details"}}."""

ONE_LINE = r"^[^\x00-\x1f\x7f]*[^\s\x00-\x1f\x7f][^\x00-\x1f\x7f]*$"  # one line with something on it
TYPE_NAMES = " | ".join(BASE_TYPES)

Id = Annotated[str, Field(min_length=1, max_length=MAX_ID, pattern=f"^{ID_PATTERN}$")]
Tag = Annotated[str, Field(min_length=1, max_length=MAX_TAG, pattern=r"^[^,\x00-\x1f\x7f]+$")]
Phase = Annotated[str, Field(min_length=1, max_length=MAX_PHASE, pattern=ONE_LINE)]
RecordType = Annotated[str, Field(min_length=1, max_length=MAX_TYPE, pattern=ONE_LINE)]
Glob = Annotated[str, Field(min_length=1, max_length=4096)]


def described(text: str) -> str:
    """A docstring or description as clients should show it: no source indentation."""
    return inspect.cleandoc(text)


def tool_error(envelope: dict[str, Any]) -> "CallToolResult":
    """Our JSON error envelope as an MCP tool error, in its text.  No structured content: clients
    (the MCP Inspector among them) check structured content against the tool's output schema,
    which describes the answer, even on an error."""
    from mcp_types import CallToolResult, TextContent

    return CallToolResult(content=[TextContent(type="text", text=dumps(envelope).decode())], is_error=True)


def usage_error(message: str, code: str, details: dict[str, Any]) -> "CallToolResult":
    return tool_error({"error": UsageError(message, code=code, details=details).to_dict()})


PATTERNS = {ONE_LINE: "must be one line with at least one visible character",
            f"^{ID_PATTERN}$": "must be a record id: a letter or digit, then letters, digits or ._:@/+-",
            r"^[^,\x00-\x1f\x7f]+$": "must be one line without commas"}


def problem(err: Any) -> str:
    """What is wrong with one argument, in words (a pattern is named by what it allows)."""
    if err.get("type") == "string_pattern_mismatch":
        return PATTERNS.get(str((err.get("ctx") or {}).get("pattern")), "has characters that are not allowed")
    return str(err.get("msg"))


def plain_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """An input schema as a model reads it best: ``additionalProperties: false`` and an optional
    parameter as its own type (``anyOf [X, null]`` becomes ``X``; null is still accepted)."""
    out = dict(schema)
    props: dict[str, Any] = {}
    for name, prop in (schema.get("properties") or {}).items():
        prop = dict(prop)
        arms = prop.get("anyOf")
        if isinstance(arms, list) and len(arms) == 2 and {"type": "null"} in arms:
            (real,) = [a for a in arms if a != {"type": "null"}]
            del prop["anyOf"]
            prop = {**real, **prop}
            if prop.get("default", ...) is None:
                del prop["default"]
        props[name] = prop
    out["properties"] = props
    out["additionalProperties"] = False
    return out


def schema_type(tp: Any) -> Any:
    """``tp`` with every stdlib ``TypedDict`` in it rebuilt as a ``typing_extensions`` one, which is
    what pydantic needs below Python 3.12 to derive output schemas.  ``types.py`` keeps the stdlib
    kind so that light verbs never import typing_extensions."""
    import typing_extensions

    if typing.is_typeddict(tp):
        hints = typing.get_type_hints(tp, include_extras=True)
        fields = {}
        for key, hint in hints.items():
            inner = schema_type(hint)
            if key not in tp.__required_keys__ and typing.get_origin(hint) is not typing.NotRequired:
                inner = typing_extensions.NotRequired[inner]
            fields[key] = inner
        return typing_extensions.TypedDict(tp.__name__, fields)  # type: ignore[operator]
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if not args:
        return tp
    converted = tuple(schema_type(a) for a in args)
    if origin is typing.NotRequired:
        return typing_extensions.NotRequired[converted[0]]
    if origin in (typing.Union, pytypes.UnionType):
        return typing.Union[converted]  # noqa: UP007 - a runtime tuple of arms
    return origin[converted] if len(converted) > 1 else origin[converted[0]]


def returns(result: Any) -> Any:
    """The return annotation that gives a tool an output schema while it builds its own result."""
    from mcp_types import CallToolResult

    return Annotated[CallToolResult, schema_type(result)]


def build_server(root: str | None) -> tuple[Any, "WarmMemory"]:
    """An ``MCPServer`` whose tools operate on the project memory at ``root``, and its warm memory."""
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
    from mcp_types import CallToolResult, TextContent, ToolAnnotations
    from pydantic import ValidationError

    from .. import __version__
    from ..api.context import render_markdown
    from .warm import WarmMemory

    warm = WarmMemory(root)

    class MemoryMCP(MCPServer):
        """The SDK's server, with one error shape and schemas a model reads right the first time."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.schemas: dict[str, dict[str, Any]] = {}  # input schemas by tool, as the SDK made them

        async def list_tools(self) -> Any:
            tools = await super().list_tools()
            for tool in tools:
                tool.input_schema = plain_schema(tool.input_schema)
            return tools

        async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
            if not self.schemas:
                self.schemas.update({t.name: t.input_schema for t in await super().list_tools()})
            schema = self.schemas.get(name)
            if schema is None:
                return usage_error(f"no tool named {name[:MAX_ECHO]!r}", "tool-unknown",
                                   {"tools": sorted(self.schemas)})
            allowed = sorted(schema.get("properties") or {})
            unknown = [str(k)[:MAX_ECHO] for k in arguments if k not in allowed]
            if unknown:
                return usage_error(f"{name} takes no argument {unknown[0]!r}", "argument-unknown",
                                   {"tool": name, "unknown": unknown[:20], "allowed": allowed})
            try:
                return await super().call_tool(name, arguments, context)
            except ToolError as exc:
                cause = exc.__cause__
                if not isinstance(cause, ValidationError):
                    raise
                problems = [{"field": ".".join(str(p) for p in err["loc"]) or name, "problem": problem(err)}
                            for err in cause.errors(include_input=False, include_url=False)]
                first = problems[0]
                return usage_error(f"{name}: {first['field']}: {first['problem']}", "argument-invalid",
                                   {"tool": name, "errors": problems[:20], "allowed": allowed})

    server = MemoryMCP("nubos-memory", version=__version__, instructions=INSTRUCTIONS, log_level="WARNING")

    def call(name: str, request: dict[str, Any], markdown: bool = False) -> CallToolResult:
        """The verb's answer (JSON text and the same document as structured content; a query may
        answer with its markdown context block as text), or our error envelope as a tool error.
        Calls wait for the warm-up (it holds the same locks), so the model loads once."""
        with warm.use(writes=VERBS[name].writes) as mem:
            code, _, doc = run(name, {**request, "root": str(warm.root)}, Context(open_memory=lambda _root: mem))
        if code != 0:
            return tool_error(doc)
        text = render_markdown(doc) if markdown else dumps(doc).decode()
        return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=doc)

    def memory_add(
        type: Annotated[RecordType, Field(description=f"What kind of memory this is: {TYPE_NAMES} (or a type the "
                                                      "project configured). Example: \"learning\".")],
        title: Annotated[str, Field(min_length=1, max_length=MAX_TITLE, pattern=ONE_LINE,
                                    description="One line: the point, findable later. Example: \"Pin pnpm with "
                                                "corepack: CI cache broke on lockfile drift\".")],
        body: Annotated[str, Field(max_length=MAX_BODY, description="The details: rationale, evidence, commands. "
                                                                    "May be empty.")] = "",
        tags: Annotated[list[Tag], Field(max_length=MAX_TAGS, description="Labels for filtering, e.g. "
                                                                          "[\"ci\", \"pnpm\"].")] | None = None,
        phase: Annotated[Phase, Field(description="The plan phase this belongs to, hierarchical, e.g. "
                                                  "\"M005-S007-T0002\".")] | None = None,
        provenance: Annotated[Literal[PROVENANCES], Field(  # type: ignore[valid-type]
            description="How sure this is: VERIFIED (checked), CITED (from a source), ASSUMED (inferred), "
                        "CACHED (copied from an earlier answer). Shown as a label in markdown answers.")] | None = None,
        id: Annotated[Id, Field(description="Your own stable id (letters, digits, ._:@/+-); a new UUID when "
                                            "left out.")] | None = None,
        supersedes: Annotated[Id, Field(description="The id of a record this one replaces (a correction or a "
                                                    "newer decision); that record is retired.")] | None = None,
        importance: Annotated[float, Field(ge=0, le=1, description="0..1; nudges ranking between near-equal "
                                                                   "hits (0.5 is neutral).")] | None = None,
        force: Annotated[bool, Field(description="Store even if the same text is already stored.")] = False,
    ) -> returns(AddResult):  # type: ignore[valid-type]
        """Store one memory: a learning, decision, research note, critic finding or handoff.

        Reasoning blocks (<think>, <scratch_pad>) are removed first. If the same text is already stored,
        nothing is stored and `id`/`duplicate_of` name the existing record (`force` stores it anyway).
        A near duplicate is stored and reported in `near_duplicate_of`. `supersedes` retires the record
        this one replaces."""
        record: dict[str, Any] = {"type": type, "title": title, "body": body, "tags": tags or [], "phase": phase,
                                  "provenance": provenance}
        for key, value in (("id", id), ("supersedes", supersedes), ("importance", importance)):
            if value is not None:
                record[key] = value
        return call("memory-add", {**record, "force": force})

    def memory_query(
        text: Annotated[str, Field(min_length=1, max_length=MAX_QUERY_CHARS, description=(
            "What you are about to work on, in your own words. Example: \"why does the CI cache miss after "
            "a pnpm upgrade?\"."))],
        k: Annotated[int, Field(ge=1, le=MAX_K, description=f"How many hits at most (1-{MAX_K}).")] = 8,
        type: Annotated[RecordType, Field(description=f"Only records of this type: {TYPE_NAMES} (or a type the "
                                                      "project configured). An unknown type is an error that "
                                                      "lists the allowed ones.")] | None = None,
        phase: Annotated[Phase, Field(description="Only records of this phase and the phases under it: "
                                                  "\"M001\" matches \"M001-S002-T0001\".")] | None = None,
        phase_exact: Annotated[bool, Field(description="Match `phase` exactly instead of as a prefix.")] = False,
        tags: Annotated[list[Tag], Field(max_length=MAX_TAGS, description="Only records with at least one of "
                                                                          "these tags.")] | None = None,
        max_tokens: Annotated[int, Field(ge=1, le=MAX_TOKENS, description=(
            f"Keep the best hits that fit this many tokens (about 4 characters each); default {MCP_MAX_TOKENS}. "
            "Hits left out are counted in `budget`."))] = MCP_MAX_TOKENS,
        format: Annotated[Literal["json", "markdown"], Field(description=(
            "json: the hits as data. markdown: a context block ready to paste into a prompt (the data is "
            "still in the structured content)."))] = "json",
        mode: Annotated[Literal[MODES], Field(description=(  # type: ignore[valid-type]
            "hybrid (keywords + meaning, the default), lexical (keywords only, BM25), vector (meaning "
            "only)."))] = "hybrid",
        fusion: Annotated[Literal[FUSIONS], Field(description=(  # type: ignore[valid-type]
            "How hybrid combines its two sides: z (the default: each side standardised over the "
            "candidates), alpha (a weighted sum), rrf (reciprocal rank fusion)."))] | None = None,
        alpha: Annotated[float, Field(ge=0, le=1, description="The vector side's weight for fusion alpha, "
                                                              "0..1 (default 0.3).")] | None = None,
        explain: Annotated[bool, Field(description="Add each hit's per-side scores and ranks.")] = False,
    ) -> returns(QueryResult):  # type: ignore[valid-type]
        """Recall prior learnings, decisions and research relevant to a task, best first.

        Hybrid keyword + semantic search. Filters that cannot match say so in `warnings`. If the vector
        layer is unavailable the answer is keyword-only and says so in `degraded`. Hits carry ids that
        memory_get opens."""
        return call("memory-query", {"text": text, "k": k, "type": type, "phase": phase, "phase_exact": phase_exact,
                                     "tags": tags, "max_tokens": max_tokens, "mode": mode, "fusion": fusion,
                                     "alpha": alpha, "explain": explain}, markdown=format == "markdown")

    def memory_get(
        ids: Annotated[list[Id], Field(min_length=1, max_length=MAX_GET, description=(
            "Record ids, e.g. from a hit's `id` or an add's `duplicate_of`. Example: "
            "[\"md:482d2da39a74bb7425f2087d\"]."))],
    ) -> returns(GetResult):  # type: ignore[valid-type]
        """Open records by id, live or retired: a retired record says why, when and by what.

        Ids no record has are listed in `missing`; when none is found it is an error (record-not-found)."""
        return call("memory-get", {"ids": ids})

    def memory_ingest(
        paths: Annotated[list[Annotated[str, Field(min_length=1, max_length=4096)]], Field(
            min_length=1, max_length=1000, description=(
                "Markdown files or folders, relative to the project root. Example: [\"CLAUDE.md\", \"docs\"]. "
                "A path that does not exist is an error (ingest-path-missing)."))],
        include: Annotated[list[Glob], Field(description="Only files matching these globs, e.g. "
                                                         "[\"docs/**/*.md\"].")] | None = None,
        exclude: Annotated[list[Glob], Field(description="Leave out files matching these globs, e.g. "
                                                         "[\"docs/drafts/**\"].")] | None = None,
        prune_missing: Annotated[bool, Field(description=(
            "Retire the chunks of files that no longer exist under the given paths (and accept a path "
            "that no longer exists when the memory holds chunks under it)."))] = False,
        type: Annotated[RecordType, Field(description="The type of the records made; default research, or a "
                                                      "file's frontmatter category.")] | None = None,
    ) -> returns(IngestResult):  # type: ignore[valid-type]
        """Index markdown knowledge (CLAUDE.md, docs/, ADRs, memory files with frontmatter), split on ## headings.

        Each chunk is titled with its document and heading ("ADR 0004 — Locking › Context"). Re-running is
        cheap: unchanged files change nothing; changed files replace exactly their old chunks. A file that
        cannot be read is reported in `failed` and passed over; the others are ingested."""
        return call("memory-ingest", {"paths": paths, "include": include, "exclude": exclude,
                                      "prune_missing": prune_missing, "type": type})

    def memory_forget(
        ids: Annotated[list[Id], Field(min_length=1, max_length=MAX_FORGET, description=(
            "The ids of the records to retire. Example: [\"3f2c…\"]."))],
        reason: Annotated[str, Field(min_length=1, max_length=MAX_REASON, pattern=ONE_LINE, description=(
            "Why, in one line; shown by memory_get. Example: \"superseded by the Node 20 decision\"."))]
        = "forgotten",
    ) -> returns(ForgetResult):  # type: ignore[valid-type]
        """Retire records by id: they never appear in results again.

        The log keeps them (append-only) and memory_get still opens them, marked retired."""
        return call("memory-forget", {"ids": ids, "reason": reason})

    def memory_stats() -> returns(Stats):  # type: ignore[valid-type]
        """Counts, model, runtime, timestamps and a consistency report (every problem with its why)."""
        return call("memory-stats", {})

    def memory_rebuild() -> returns(RebuildResult):  # type: ignore[valid-type]
        """Rebuild every derived file (vector index, keymap, lexical index) from records.jsonl.

        Needed after changing the embedding model (answers say memory-rebuild-required). Unchanged
        text under the same model is not re-embedded. Nothing written is changed or lost."""
        return call("memory-rebuild", {})

    hints: dict[str, Any] = {"open_world_hint": False}
    tools = (
        (memory_add, "Remember", {"read_only_hint": False, "destructive_hint": False, "idempotent_hint": False}),
        (memory_query, "Recall", {"read_only_hint": True, "idempotent_hint": True}),
        (memory_get, "Open records by id", {"read_only_hint": True, "idempotent_hint": True}),
        (memory_ingest, "Ingest markdown", {"read_only_hint": False, "destructive_hint": True, "idempotent_hint": True}),
        (memory_forget, "Forget", {"read_only_hint": False, "destructive_hint": True, "idempotent_hint": True}),
        (memory_stats, "Memory statistics", {"read_only_hint": True, "idempotent_hint": True}),
        (memory_rebuild, "Rebuild derived files", {"read_only_hint": False, "destructive_hint": False,
                                                   "idempotent_hint": True}),
    )
    for fn, title, hint in tools:
        server.add_tool(fn, title=title, description=described(fn.__doc__ or ""),
                        annotations=ToolAnnotations(title=title, **hints, **hint))
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

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
(field names and what is wrong; the rejected values are not echoed).  Arguments are checked
strictly against the advertised schema: ``k: "2"``, ``k: true`` or ``explain: "yes"`` are
``argument-invalid``, not coerced (an integer is still a number).

The stdio transport is our own (:func:`stdio_streams`): the SDK's drops a line it cannot read
without a word, so the agent's call hangs.  Here every request gets an answer for its id: a line
that is not JSON is ``-32700``, one that is not a request ``-32600``, a ``tools/call`` whose
arguments hold text that is not Unicode (a lone surrogate escape, bytes that are not UTF-8) or
nesting deeper than the JSON reader takes is ``argument-invalid`` like any other argument error,
and a line over :data:`MAX_LINE` bytes is refused without being held in memory.  A notification
nobody could read is dropped: there is nothing to answer.

stdout belongs to the protocol: nothing else is ever printed there.
"""

from __future__ import annotations

import inspect
import itertools
import json
import re
import sys
import threading
import types as pytypes
import typing
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, BinaryIO, Literal

from pydantic import Field

from .. import codes
from ..errors import UsageError
from ..fsio import dumps
from ..limits import MAX_ECHO
from ..params import ID, ONE_LINE, TAG, Param, Text
from ..records import echo
from ..types import (
    AddResult,
    ContextResult,
    ForgetResult,
    GetResult,
    IngestResult,
    QueryResult,
    RebuildResult,
    Stats,
)
from .verbs import VERBS

if TYPE_CHECKING:
    from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
    from mcp.shared.message import SessionMessage
    from mcp_types import CallToolResult, JSONRPCMessage

    from .warm import WarmMemory

INSTRUCTIONS = """Long-term project memory for coding agents: learnings, decisions, research notes, critic
findings and handoffs written by earlier sessions. Query it before you research, plan or review
(memory_query), or get one block for a turn (memory_context: pinned memories, the best hits, recent
handoffs); open records by id (memory_get); write what you learned when you are done (memory_add).
Hits are advisory prior art. Every error is a JSON envelope {"error": {"code", "message", "details"}}."""



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
            ID: "must be a record id: a letter or digit, then letters, digits or ._:@/+-",
            TAG: "must be one line without commas"}


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


@dataclass(frozen=True)
class Tool:
    """One MCP tool: the verb it runs (its arguments are that verb's declared parameters with an MCP
    description, ``params.py``), what a model reads about it, and the type of its answer."""

    name: str
    verb: str
    title: str
    hints: dict[str, bool]
    result: Any
    doc: str
    markdown: str | None = None  # the argument that asks for the answer as a markdown context block


TOOLS = (
    Tool("memory_add", "memory-add", "Remember",
         {"read_only_hint": False, "destructive_hint": False, "idempotent_hint": False}, AddResult,
         """Store one memory: a learning, decision, research note, critic finding or handoff.

        Reasoning blocks (<think>, <scratch_pad>) are removed first. If the same text is already stored,
        nothing is stored and `id`/`duplicate_of` name the existing record (`force` stores it anyway).
        A near duplicate is stored and reported in `near_duplicate_of`. `supersedes` retires the record
        this one replaces."""),
    Tool("memory_query", "memory-query", "Recall", {"read_only_hint": True, "idempotent_hint": True}, QueryResult,
         """Recall prior learnings, decisions and research relevant to a task, best first.

        Hybrid keyword + semantic search. Filters that cannot match say so in `warnings`. If the vector
        layer is unavailable the answer is keyword-only and says so in `degraded`. Hits carry ids that
        memory_get opens.""", markdown="format"),
    Tool("memory_context", "memory-context", "Memory for this turn", {"read_only_hint": True, "idempotent_hint": True},
         ContextResult,
         """Build the memory block for this turn of your work, within a token budget: call it at the start of a turn.

        Three sections, no record twice: `hot` (memories pinned to be always included: standing rules and
        facts, newest first, at most 40 % of `max_tokens`), `relevant` (the best hits for `text`, as
        memory_query finds them) and `recent` (the newest handoff notes earlier sessions left). Records
        that did not fit are listed in `budget.left_out`. format "markdown" gives the block ready to put
        in a prompt.""", markdown="format"),
    Tool("memory_get", "memory-get", "Open records by id", {"read_only_hint": True, "idempotent_hint": True},
         GetResult,
         """Open records by id, live or retired: a retired record says why, when and by what.

        Ids no record has are listed in `missing`; when none is found it is an error (record-not-found)."""),
    Tool("memory_ingest", "memory-ingest", "Ingest markdown",
         {"read_only_hint": False, "destructive_hint": True, "idempotent_hint": True}, IngestResult,
         """Index markdown knowledge (CLAUDE.md, docs/, ADRs, memory files with frontmatter), split on ## headings.

        Each chunk is titled with its document and heading ("ADR 0004 — Locking › Context"). Re-running is
        cheap: unchanged files change nothing; changed files replace exactly their old chunks. A file that
        cannot be read is reported in `failed` and passed over; the others are ingested."""),
    Tool("memory_forget", "memory-forget", "Forget",
         {"read_only_hint": False, "destructive_hint": True, "idempotent_hint": True}, ForgetResult,
         """Retire records by id: they never appear in results again.

        The log keeps them (append-only) and memory_get still opens them, marked retired."""),
    Tool("memory_stats", "memory-stats", "Memory statistics", {"read_only_hint": True, "idempotent_hint": True},
         Stats, """Counts, model, runtime, timestamps and a consistency report (every problem with its why)."""),
    Tool("memory_rebuild", "memory-rebuild", "Rebuild derived files",
         {"read_only_hint": False, "destructive_hint": False, "idempotent_hint": True}, RebuildResult,
         """Rebuild every derived file (vector index, keymap, lexical index) from records.jsonl.

        Needed after changing the embedding model (answers say memory-rebuild-required). Unchanged
        text under the same model is not re-embedded. Nothing written is changed or lost."""),
)


def annotation(param: Param) -> Any:
    """A parameter's declaration as the pydantic type the SDK makes the tool's input schema from."""
    def bounded(text: Text | None) -> Any:
        limits: dict[str, Any] = {} if text is None else {
            k: v for k, v in (("min_length", text.min_length), ("max_length", text.max_length),
                              ("pattern", text.pattern)) if v is not None}
        return Annotated[str, Field(**limits)] if limits else str

    outer: dict[str, Any] = {"description": param.describe}
    choices = param.tool_choices if param.tool_choices is not None else param.choices
    if param.kind is list:
        base: Any = list[bounded(param.text)]  # type: ignore[misc]
        outer.update((k, v) for k, v in (("min_length", param.min_items), ("max_length", param.max_items))
                     if v is not None)
    elif param.kind is str:
        base = Literal[choices] if choices else bounded(param.text)
    else:
        base = param.kind
        outer.update((k, v) for k, v in (("ge", param.ge), ("le", param.le)) if v is not None)
    typed = Annotated[base, Field(**outer)]
    return typed if param.required or param.tool_required or param.for_tool is not None else typed | None


def tool_function(tool: Tool, call: Callable[..., Any]) -> Callable[..., Any]:
    """The function the SDK registers for ``tool``: its signature is the verb's declared parameters (the
    SDK reads the input schema from it, and the output schema from its return annotation)."""
    params = [p for p in VERBS[tool.verb].params if p.describe is not None]

    def run_tool(**arguments: Any) -> Any:
        markdown = tool.markdown is not None and arguments.pop(tool.markdown, None) == "markdown"
        return call(tool.verb, arguments, markdown=markdown)

    run_tool.__name__ = run_tool.__qualname__ = tool.name
    run_tool.__doc__ = tool.doc
    run_tool.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter(p.name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation(p),
                           default=inspect.Parameter.empty if p.required or p.tool_required else p.for_tool)
         for p in params], return_annotation=returns(tool.result))
    return run_tool


def check_call(schemas: dict[str, dict[str, Any]], name: str, arguments: dict[str, Any]) -> tuple[Any, list[str]]:
    """``(a tool error, ...)`` for a tool not served or an argument it does not take, else ``(None,
    the tool's parameters)``."""
    schema = schemas.get(name)
    if schema is None:
        return usage_error(f"no tool named {name[:MAX_ECHO]!r}", codes.TOOL_UNKNOWN, {"tools": sorted(schemas)}), []
    allowed = sorted(schema.get("properties") or {})
    unknown = [str(k)[:MAX_ECHO] for k in arguments if k not in allowed]
    if unknown:
        return usage_error(f"{name} takes no argument {unknown[0]!r}", codes.ARGUMENT_UNKNOWN,
                           {"tool": name, "unknown": unknown[:20], "allowed": allowed}), allowed
    return None, allowed


def invalid_arguments(name: str, cause: Any, allowed: list[str]) -> Any:
    """The tool error for arguments of tool ``name`` its schema refused (``cause``, pydantic's error)."""
    problems = [{"field": ".".join(str(p) for p in err["loc"]) or name, "problem": problem(err)}
                for err in cause.errors(include_input=False, include_url=False)]
    first = problems[0]
    return usage_error(f"{name}: {first['field']}: {first['problem']}", codes.ARGUMENT_INVALID,
                       {"tool": name, "errors": problems[:20], "allowed": allowed})


def memory_mcp_class() -> type:
    """The SDK's server class, with one error shape and schemas a model reads right the first time
    (made on first use: the SDK is imported only when serving MCP)."""
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
    from pydantic import ValidationError

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

        def add_tool(self, fn: Any, name: str | None = None, *args: Any, **kwargs: Any) -> None:
            """The SDK's tool, its arguments validated strictly (:func:`strict_arguments`)."""
            super().add_tool(fn, name, *args, **kwargs)
            strict_arguments(self._tool_manager.get_tool(name or fn.__name__))

        async def run_stdio_async(self) -> None:
            """Serve over stdio through our transport, which answers every request."""
            def allowed(name: str) -> list[str] | None:
                tool = self._tool_manager.get_tool(name)
                return None if tool is None else sorted(tool.parameters.get("properties") or {})

            async with stdio_streams(allowed) as (read_stream, write_stream):
                await self._lowlevel_server.run(read_stream, write_stream,
                                                self._lowlevel_server.create_initialization_options())

        async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
            if not self.schemas:
                self.schemas.update({t.name: t.input_schema for t in await super().list_tools()})
            refused, allowed = check_call(self.schemas, name, arguments)
            if refused is not None:
                return refused
            try:
                return await super().call_tool(name, arguments, context)
            except ToolError as exc:
                cause = exc.__cause__
                if not isinstance(cause, ValidationError):
                    raise
                return invalid_arguments(name, cause, allowed)

    return MemoryMCP


def build_server(root: str | None, warm: "WarmMemory | None" = None) -> tuple[Any, "WarmMemory"]:
    """An ``MCPServer`` whose tools operate on the project memory at ``root``, and its warm memory (``warm``
    when given: ``memory-http`` shares its own with the HTTP routes)."""
    from mcp_types import CallToolResult, TextContent, ToolAnnotations

    from .. import __version__
    from ..api.context import render_markdown
    from .warm import WarmMemory

    warm = warm if warm is not None else WarmMemory(root)

    server = memory_mcp_class()("nubos-memory", version=__version__, instructions=INSTRUCTIONS, log_level="WARNING")

    def call(name: str, request: dict[str, Any], markdown: bool = False) -> CallToolResult:
        """The verb's answer (JSON text and the same document as structured content; a query may
        answer with its markdown context block as text), or our error envelope as a tool error.
        Calls wait for the warm-up (it holds the same locks), so the model loads once."""
        code, _, doc = warm.answer(name, {**request, "root": str(warm.root)})
        if code != 0:
            return tool_error(doc)
        text = render_markdown(doc) if markdown else dumps(doc).decode()
        return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=doc)

    for tool in TOOLS:
        server.add_tool(tool_function(tool, call), title=tool.title, description=described(tool.doc),
                        annotations=ToolAnnotations(title=tool.title, open_world_hint=False, **tool.hints))
    return server, warm


def strict_arguments(tool: Any) -> None:
    """Validate ``tool``'s arguments strictly, as its schema reads: pydantic's lax mode would take
    ``"2"`` or ``true`` for an integer and ``"yes"`` for a boolean, and the SDK would parse a string
    holding JSON into the list asked for.  An integer is still a number (``alpha: 1``).  The
    advertised schema is made once, before this, and stays as it was."""
    from mcp.server.mcpserver.utilities.func_metadata import FuncMetadata
    from pydantic import ConfigDict

    class StrictMetadata(FuncMetadata):
        def pre_parse_json(self, data: dict[str, Any]) -> dict[str, Any]:
            return dict(data)  # a string is a string, even one that holds JSON

    meta = tool.fn_metadata
    model = type(meta.arg_model.__name__, (meta.arg_model,),
                 {"model_config": ConfigDict(strict=True), "__module__": meta.arg_model.__module__})
    tool.fn_metadata = StrictMetadata(arg_model=model, output_schema=meta.output_schema,
                                      output_model=meta.output_model, wrap_output=meta.wrap_output)


# The stdio transport: one JSON-RPC message per line, every request answered.

MAX_LINE = 16 * 1024 * 1024  # bytes a message (one line) may have; a longer one is refused, never held whole
MAX_DEPTH = 200  # nesting the SDK's JSON reader (pydantic-core) takes; a deeper value is refused
PREFIX = 64 * 1024  # bytes of an oversize line kept to find its id
DEEP = "\x00nubos-memory: nested too deep\x00"  # what a container past MAX_DEPTH reads as once cut out
TOO_DEEP = f"is nested deeper than {MAX_DEPTH} levels"
NOT_TEXT = "is not valid Unicode text (a lone surrogate escape or bytes that are not UTF-8)"
# A string token, read once and never backtracked into: one left open runs to the end of the line, so
# that a line of escaped quotes costs one pass, not one pass per quote.  Brackets come in runs.
STRING = r'"(?>[^"\\]*+(?:\\.[^"\\]*+)*+)"?'
NESTING = re.compile(rf"{STRING}|(?P<open>[\[{{]++)|(?P<close>[\]}}]++)", re.DOTALL)
MEMBERS = re.compile(rf"(?P<string>{STRING})(?P<colon>\s*+:)?|(?P<open>[\[{{]++)|(?P<close>[\]}}]++)"
                     r"|-?\d++(?:\.\d++)?(?:[eE][+-]?\d++)?|true|false|null", re.DOTALL)
SURROGATE = re.compile("[\ud800-\udfff]")


def read_line(wire: BinaryIO) -> tuple[bytes, int] | None:
    """The next line from ``wire`` and its size in bytes, or None at the end.  A line over
    :data:`MAX_LINE` is read to its end, but only its first :data:`PREFIX` bytes are kept."""
    line = wire.readline(MAX_LINE + 1)
    if not line:
        return None
    if line.endswith(b"\n") or len(line) <= MAX_LINE:
        return line, len(line.rstrip(b"\r\n"))
    head, size = line[:PREFIX], len(line)
    while True:
        more = wire.readline(1024 * 1024)
        size += len(more.rstrip(b"\r\n"))
        if not more or more.endswith(b"\n"):
            return head, size


def prune(text: str, limit: int = MAX_DEPTH) -> str:
    """``text`` with every array or object nested deeper than ``limit`` replaced by the string
    :data:`DEEP`, so that the standard library reads it (and says where it was cut)."""
    parts: list[str] = []
    depth, start, cut = 0, 0, -1  # cut: where the container being cut out begins
    for match in NESTING.finditer(text):
        if match.group("open"):
            run = len(match.group())
            if depth <= limit < depth + run:
                cut = match.start() + limit - depth
            depth += run
        elif match.group("close"):
            run = len(match.group())
            if cut >= 0 and depth - run <= limit:
                start_next = match.start() + depth - limit  # just past the bracket that closes the cut one
                parts += [text[start:cut], json.dumps(DEEP)]
                start, cut = start_next, -1
            depth = max(depth - run, 0)
    if cut >= 0:
        parts += [text[start:cut], json.dumps(DEEP)]
        start = len(text)
    return "".join([*parts, text[start:]]) if parts else text


def find_id(text: str) -> int | str | None:
    """The id of a message that cannot be read whole (cut short, too deep, not JSON): the first
    ``"id"`` member of its top-level object, if it can be a request id."""
    depth, key, top = 0, None, text.lstrip().startswith("{")
    for match in MEMBERS.finditer(text):
        if match.group("open"):
            depth += len(match.group())
        elif match.group("close"):
            depth = max(depth - len(match.group()), 0)
        elif depth == 1 and top:
            if match.group("colon"):
                key = scalar(match.group("string"))
                continue
            if key == "id":
                return request_id(scalar(match.group()))
        key = None
    return None


def scalar(token: str) -> Any:
    try:
        return json.loads(token)
    except ValueError:
        return None


def request_id(value: Any) -> int | str | None:
    """``value`` if it can be a request id that is written back (an integer or clean text), else None."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and not SURROGATE.search(value):
        return value
    return None


def unreadable(value: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], str]]:
    """Where in ``value`` (read by :func:`prune` and the standard library) is something the SDK's
    reader refuses, and what: text that is not Unicode, nesting too deep."""
    if isinstance(value, str):
        if value == DEEP:
            yield path, TOO_DEEP
        elif SURROGATE.search(value):
            yield path, NOT_TEXT
    elif isinstance(value, dict | list) and len(path) >= MAX_DEPTH:  # the top level is the first level
        yield path, TOO_DEEP
    elif isinstance(value, dict):
        for key, item in value.items():
            if SURROGATE.search(key):
                yield (*path, key), NOT_TEXT
            yield from unreadable(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from unreadable(item, (*path, str(index)))


def field(path: tuple[str, ...]) -> str:
    """A path as a field name that can be written back: its first few steps, a name that is not
    Unicode escaped."""
    shown = ".".join(path[:4]) + (".…" if len(path) > 4 else "")
    return shown.encode("utf-8", "backslashreplace").decode()[:MAX_ECHO]


def reported(found: list[tuple[str, str]]) -> list[dict[str, str]]:
    """Each field's first problem, in the argument-invalid shape (``field``, ``problem``)."""
    first: dict[str, str] = {}
    for name, what in found:
        first.setdefault(name, what)
    return [{"field": name, "problem": what} for name, what in first.items()]


def rpc_error(rid: int | str | None, code: int, message: str, data: Any = None) -> "JSONRPCMessage":
    from mcp_types import ErrorData, JSONRPCError

    error = ErrorData(code=code, message=message) if data is None else ErrorData(code=code, message=message, data=data)
    return JSONRPCError(jsonrpc="2.0", id=rid, error=error)


def judged(line: bytes, size: int, allowed: Callable[[str], list[str] | None]
           ) -> "tuple[JSONRPCMessage | None, JSONRPCMessage | None]":
    """A line read from the wire: ``(the message for the SDK, None)``, or ``(None, our answer)`` to a line it
    would not read or would answer badly (:func:`too_large`, :func:`refuse`, :func:`unknown_method`);
    ``(None, None)`` for a blank line."""
    from mcp_types import jsonrpc_message_adapter

    if size > MAX_LINE:
        return None, too_large(line, size)
    if not line.strip():
        return None, None
    try:
        message = jsonrpc_message_adapter.validate_json(line, by_name=False)
    except Exception:  # noqa: BLE001 - whatever the reader refuses is answered
        return None, refuse(line, allowed)
    answer = unknown_method(message)
    return (None, answer) if answer is not None else (message, None)


def unknown_method(message: Any) -> "JSONRPCMessage | None":
    """The answer to a request whose method name is longer than any method (``MAX_ECHO``), which the SDK
    would repeat in full: "Method not found", the name cut; None for any other message."""
    from mcp_types import METHOD_NOT_FOUND, JSONRPCRequest

    if isinstance(message, JSONRPCRequest) and len(message.method) > MAX_ECHO:
        return rpc_error(message.id, METHOD_NOT_FOUND, "Method not found", echo(message.method))
    return None


def too_large(head: bytes, size: int) -> "JSONRPCMessage":
    """The answer to a line over :data:`MAX_LINE`: for the id its first bytes name, if any."""
    from mcp_types import INVALID_REQUEST

    rid = find_id(head.decode("utf-8", "surrogateescape"))
    return rpc_error(rid, INVALID_REQUEST, f"Invalid Request: a message of {size} bytes; at most {MAX_LINE} are read")


def refuse(line: bytes, allowed: Callable[[str], list[str] | None]) -> "JSONRPCMessage | None":
    """The answer to a line the SDK's reader refused, for the request's id where one can be read;
    None for a notification or a response (nothing to answer).  ``allowed`` names a tool's parameters."""
    from mcp_types import INVALID_REQUEST, PARSE_ERROR, JSONRPCRequest
    from pydantic import ValidationError

    text = line.decode("utf-8", "surrogateescape")  # bytes that are not UTF-8 become lone surrogates

    def constant(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    try:
        try:
            doc = json.loads(text, parse_constant=constant)
        except RecursionError:  # deeper than the standard library reads: cut the deep parts out first
            doc = json.loads(prune(text), parse_constant=constant)
    except (ValueError, RecursionError):
        return rpc_error(find_id(text), PARSE_ERROR, "Parse error: the message is not JSON")
    if not isinstance(doc, dict):
        return rpc_error(None, INVALID_REQUEST, "Invalid Request: a message is one JSON object (batches are not taken)")
    if "method" not in doc and ("result" in doc or "error" in doc):
        return None  # a response to the server: nothing to answer
    if doc.get("id") is None:
        return None if "method" in doc else rpc_error(None, INVALID_REQUEST, "Invalid Request: no method")
    rid = request_id(doc["id"])
    if rid is None:
        return rpc_error(None, INVALID_REQUEST, "Invalid Request: an id is an integer or a string")
    found = list(itertools.islice(unreadable(doc), 20))
    if found:
        return _refuse_unreadable(doc, rid, found, allowed)
    try:
        JSONRPCRequest.model_validate(doc)
    except ValidationError as exc:
        err = exc.errors(include_input=False, include_url=False)[0]
        where = ".".join(str(part) for part in err["loc"]) or "message"
        return rpc_error(rid, INVALID_REQUEST, f"Invalid Request: {field((where,))}: {err['msg']}")
    return rpc_error(rid, INVALID_REQUEST, "Invalid Request: the message could not be read")


def _refuse_unreadable(doc: dict[str, Any], rid: Any, found: list[tuple[tuple[Any, ...], str]],
                       allowed: Callable[[str], list[str] | None]) -> "JSONRPCMessage":
    """:func:`refuse`'s answer to a request holding values the SDK cannot read (``found``: path,
    problem): a tool error for a tool's arguments, else an invalid params or invalid request error."""
    from mcp_types import INVALID_PARAMS, INVALID_REQUEST, JSONRPCResponse

    params = doc.get("params")
    if all(path[:2] == ("params", "arguments") and len(path) > 2 for path, _ in found) \
            and doc.get("method") == "tools/call" and isinstance(params, dict) and isinstance(params.get("name"), str):
        name = field((params["name"],))
        errors = reported([(field(path[2:]), problem) for path, problem in found])
        details: dict[str, Any] = {"tool": name, "errors": errors}
        names = allowed(params["name"])
        if names is not None:
            details["allowed"] = names
        result = usage_error(f"{name}: {errors[0]['field']}: {errors[0]['problem']}", codes.ARGUMENT_INVALID, details)
        return JSONRPCResponse(jsonrpc="2.0", id=rid,
                               result=result.model_dump(by_alias=True, mode="json", exclude_none=True))
    errors = reported([(field(path), problem) for path, problem in found])
    message = f"{errors[0]['field']}: {errors[0]['problem']}"
    if all(path[:1] == ("params",) for path, _ in found):
        envelope = {"error": UsageError(message, code=codes.ARGUMENT_INVALID, details={"errors": errors}).to_dict()}
        return rpc_error(rid, INVALID_PARAMS, f"Invalid params: {message}", envelope)
    return rpc_error(rid, INVALID_REQUEST, f"Invalid Request: {message}")


def claim_stdin() -> tuple[BinaryIO, Callable[[], None] | None]:
    """The wire's input; fd 0 reads as empty meanwhile where the SDK's helpers can arrange it."""
    try:
        from mcp.server.stdio import _claim_fd, _open_stdin_diversion
    except ImportError:  # another SDK version: serve the stream in place
        return sys.stdin.buffer, None
    return _claim_fd(0, sys.stdin, "rb", _open_stdin_diversion)


def claim_stdout() -> tuple[BinaryIO, Callable[[], None] | None]:
    """The wire's output; fd 1 writes to stderr meanwhile, so stray output misses the protocol."""
    try:
        from mcp.server.stdio import _claim_fd, _open_stdout_diversion
    except ImportError:  # another SDK version: serve the stream in place
        return sys.stdout.buffer, None
    return _claim_fd(1, sys.stdout, "wb", _open_stdout_diversion)


def send_line(wire: BinaryIO, data: bytes) -> None:
    wire.write(data)
    wire.flush()


@asynccontextmanager
async def stdio_streams(allowed: Callable[[str], list[str] | None]) -> AsyncIterator[
        tuple["MemoryObjectReceiveStream[SessionMessage | Exception]", "MemoryObjectSendStream[SessionMessage]"]]:
    """The SDK's stdio transport, except that a line it cannot read is answered (:func:`refuse`,
    :func:`too_large`) through the same writer as every answer, so frames never interleave."""
    import anyio
    import anyio.to_thread
    from mcp.shared.message import SessionMessage

    restore: list[Callable[[], None]] = []
    try:
        wire_in, restore_in = claim_stdin()
        restore += [restore_in] if restore_in else []
        wire_out, restore_out = claim_stdout()
        restore += [restore_out] if restore_out else []
        read_send, read_receive = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        write_send, write_receive = anyio.create_memory_object_stream[SessionMessage](0)
        answers = write_send.clone()

        async def reader() -> None:
            try:
                async with read_send, answers:
                    while (got := await anyio.to_thread.run_sync(read_line, wire_in, abandon_on_cancel=True)):
                        message, answer = judged(*got, allowed)
                        if message is not None:
                            await read_send.send(SessionMessage(message))
                        elif answer is not None:
                            await answers.send(SessionMessage(answer))
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass  # the server is gone

        async def writer() -> None:
            async with write_receive:
                async for item in write_receive:
                    data = item.message.model_dump_json(by_alias=True, exclude_unset=True).encode() + b"\n"
                    await anyio.to_thread.run_sync(send_line, wire_out, data)

        async with anyio.create_task_group() as tg:
            tg.start_soon(reader)
            tg.start_soon(writer)
            yield read_receive, write_send
    finally:
        for undo in reversed(restore):
            undo()


def run_mcp(root: str | None) -> None:
    """Serve over stdio until the client closes the connection; the model warms up meanwhile
    (a first call waits for it rather than loading it again)."""
    server, warm = build_server(root)

    from .warm import catch_up_forever

    stop = threading.Event()

    def warm_up() -> None:
        try:
            warm.warm_up()
        except Exception:  # noqa: BLE001 - a failed warm-up is answered per call instead
            pass
        catch_up_forever(warm, stop)  # then the backlog and idle work, as memory-serve does them

    threading.Thread(target=warm_up, name="warm-up", daemon=True).start()
    try:
        server.run("stdio")
    finally:
        stop.set()

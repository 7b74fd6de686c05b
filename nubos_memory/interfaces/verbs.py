"""The verbs, in one table that every interface dispatches through.

A *request* is a verb's arguments by name (the CLI's parsed flags, made
self-contained by :func:`prepare`; an MCP tool's arguments).  :func:`run`
opens the memory with the factory its caller passes in (the CLI opens one per
process, ``memory-serve`` and ``memory-mcp`` pass their warm one), calls the
one library method the verb stands for, and returns ``(exit code, stream,
document)`` with errors already in their envelope (``errors.failure``).  No
verb scores, stores or locks anything itself.  Each verb's arguments are declared once, in
``params.py``; the servers themselves (``memory-serve``, ``memory-mcp``) are not verbs but
launchers (``cli.py``).
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import codes
from .. import params as P
from ..errors import DisabledError, InputError, UsageError, failure
from ..limits import FORMAT_ALIASES, MAX_BODY
from ..params import Param

if TYPE_CHECKING:
    from ..api.memory import Memory
    from ..progress import Reporter

Request = dict[str, Any]
MAX_STDIN = 256 << 20


@dataclass
class Context:
    """What a verb may use besides its request: how to open the memory, and where progress goes."""

    open_memory: Callable[[str | None], "Memory"]
    progress: "Reporter | None" = None  # (stage, done, total) of long work


@dataclass(frozen=True)
class Verb:
    name: str
    help: str
    call: Callable[[Context, Request], Any]
    params: tuple[Param, ...] = ()  # its arguments, declared once (``params.py``)
    served: bool = True  # memory-serve answers it (the others need no memory, or a scratch one)
    writes: bool = False  # it changes the memory (memory-serve runs these one at a time)
    stdin: bool = False  # it may read standard input
    long: bool = False  # it may run for minutes: it reports progress (--progress)


VERBS: dict[str, Verb] = {}


def verb(name: str, help: str, params: tuple[Param, ...] = (), **flags: bool
         ) -> Callable[[Callable[[Context, Request], Any]], Callable[..., Any]]:
    def register(fn: Callable[[Context, Request], Any]) -> Callable[[Context, Request], Any]:
        VERBS[name] = Verb(name, help, fn, params, **flags)
        return fn

    return register


def tags(value: Any) -> list[str]:
    """``--tags a,b`` (a string) or a list, as a list."""
    if isinstance(value, list):
        return value
    return [t.strip() for t in value.split(",") if t.strip()] if value else []


# The code a file the user named gives when it cannot be read, by what the file is.
UNREADABLE = {"body-file": codes.BODY_FILE_UNREADABLE, "records-file": codes.RECORDS_FILE_UNREADABLE}


def read_file(path: str, what: str, limit: int) -> bytes:
    """At most ``limit + 1`` bytes of a file the user named; never reads without end."""
    try:
        with open(path, "rb") as f:
            return f.read(limit + 1)
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise InputError(f"cannot read {what} {path!r}: {why}", code=UNREADABLE[what],
                         details={"path": path}) from None


def read_text_file(path: str, what: str, limit: int) -> str:
    data = read_file(path, what, limit * 4)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{what} {path!r} is not UTF-8 text", code=UNREADABLE[what],
                         details={"path": path}) from None


def read_stdin() -> str | None:
    """Standard input as text, or None for a terminal."""
    if sys.stdin is None or sys.stdin.isatty():
        return None
    raw = sys.stdin.buffer.read(MAX_STDIN + 1)
    if len(raw) > MAX_STDIN:
        raise InputError("standard input is larger than 256 MiB", code=codes.STDIN_TOO_LARGE)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError("standard input is not UTF-8 text", code=codes.STDIN_UNREADABLE) from None


def from_caller(name: str, request: Request) -> bool:
    """Whether this request is completed from the calling process: its standard input, or a file it names
    (``prepare`` reads them there: a server never opens a path a client gave, which could be its own
    ``/dev/stdin``, a FIFO, or a file relative to another working directory)."""
    if name == "memory-add":
        return request.get("body_file") is not None or request.get("body") is None
    return name == "memory-index"


def prepare(name: str, request: Request, cwd: str | None = None) -> None:
    """Make a request self-contained, before it runs here or is sent to ``memory-serve``: standard
    input and the files it names read (unless memory is off: then nothing is read), a transcript's
    path made absolute, and a record id fixed (so a retry cannot store it twice).  ``cwd``: the
    caller's working directory when it is another process's (``memory-serve`` answering a command
    line): a request ``from_caller`` is refused then."""
    if name == "memory-harvest" and isinstance(request.get("transcript"), str):
        request["transcript"] = os.path.abspath(os.path.join(cwd, request["transcript"]) if cwd is not None
                                                else request["transcript"])
    if name not in VERBS or not VERBS[name].stdin:
        return
    from ..config import load_project

    if request.get("scope") != "user" and not load_project(request.get("root")).config.enabled:
        raise DisabledError("memory is disabled for this project (memory.enabled is false); run memory-init "
                            "to enable it")
    if name == "memory-add" and request.get("body") is not None and request.get("body_file") is not None:
        raise UsageError("give --body or --body-file, not both")
    if from_caller(name, request):
        if cwd is not None:
            raise RuntimeError(f"{name} reads its caller's input: it cannot be answered for another process")
        _read_input(name, request)
    if name == "memory-add" and request.get("id") is None:
        request["id"] = str(uuid.uuid4())


def _read_input(name: str, request: Request) -> None:
    """In the caller's process: standard input, or the file named (``-``: standard input), into the request."""
    named = request.get("body_file" if name == "memory-add" else "records_file")
    if named in (None, "-"):
        request["stdin_text"] = read_stdin()
        if name == "memory-add":
            request["body_file"] = None
    elif name == "memory-add":
        request["body"], request["body_file"] = read_text_file(os.path.abspath(named), "body-file", MAX_BODY), None
    else:
        from .batchfile import MAX_BATCH_BYTES, parse_batch

        path = os.path.abspath(named)  # (named in the answer's errors)
        data = read_file(path, "records-file", MAX_BATCH_BYTES)
        try:
            request["stdin_text"] = data.decode("utf-8") if len(data) <= MAX_BATCH_BYTES else None
        except UnicodeDecodeError:
            request["stdin_text"] = None
        if request["stdin_text"] is None:
            parse_batch(data, path)  # (raises the error that names the line, or the size)
        request["records_file"] = path


def run(name: str, request: Request, ctx: Context) -> tuple[int, str, Any]:
    """Run a verb: ``(exit code, "stdout" or "stderr", document)``."""
    def call() -> Any:
        if name not in VERBS:
            raise UsageError(f"unknown verb {name!r}", details={"verbs": sorted(VERBS)})
        return VERBS[name].call(ctx, request)

    return answered(call, request)


def answered(call: Callable[[], Any], request: Request) -> tuple[int, str, Any]:
    """``call``'s answer, or its failure in the one envelope (``errors.failure``); memory switched off
    is a skip when the request says so (``--skip-if-disabled``)."""
    try:
        return 0, "stdout", call()
    except DisabledError as exc:
        if request.get("skip_if_disabled"):
            return 0, "stdout", {"skipped": True, "reason": "memory-disabled"}
        return exc.exit_code, "stderr", {"error": exc.to_dict()}
    except BaseException as exc:
        if isinstance(exc, SystemExit):
            raise
        code, envelope = failure(exc)
        return code, "stderr", envelope


def argument(param: Param, request: Request) -> Any:
    """A declared argument from a request: its default when not given, a flag as a bool, ``--tags a,b``
    as a list."""
    value = request.get(param.name)
    if param.cli_kind is str and param.kind is list:
        return tags(value)
    if value is None or (value == "" and param.default is not None):
        return param.default
    return bool(value) if param.kind is bool else value


NOT_QUERY_OPTIONS = ("positional", "text", "no_collapse", "format")  # the query's text, and its answer's shape
# A request key no parameter declares, so no client (CLI, MCP, HTTP body) can give it: the server's own reads
# that are not use (the store browser's pages) set it, and memory-query and memory-get then record no usage
# (memory-prune --unused-for counts only real use).
UNTRACKED = "untracked"


def _memory(ctx: Context, request: Request) -> "Memory":
    return ctx.open_memory(request.get("root"))


def _scoped(ctx: Context, request: Request, *, create: bool = False) -> "Memory":
    """The memory ``--scope`` names: the project's, or the user-level memory (made by a write: ``create``)."""
    return _memory(ctx, request).for_scope(request.get("scope"), create=create)


# -- the table ------------------------------------------------------------------------------
@verb("memory-init", "create .nubos-pilot/memory/ and enable memory for this project", served=False)
def _init(ctx: Context, request: Request) -> Any:
    from ..api.memory import Memory
    from ..config import Project, find_root

    # init is the one verb that works while memory is disabled: it enables it.
    return Memory(Project(root=find_root(request.get("root")))).init()


@verb("memory-add", "add one record", P.ADD, writes=True, stdin=True)
def _add(ctx: Context, request: Request) -> Any:
    mem = _scoped(ctx, request, create=True)
    mem.require_enabled()
    if request.get("body") is not None:
        body = request["body"]
    elif request.get("body_file") is not None:
        body = read_text_file(request["body_file"], "body-file", MAX_BODY)
    else:
        body = request.get("stdin_text") or ""
        if body.endswith("\n"):  # `echo text | np-tools memory-add`: the newline ends the input, not the body
            body = body[:-2] if body.endswith("\r\n") else body[:-1]
    record = {"type": request.get("type"), "title": request.get("title"), "body": body,
              "tags": tags(request.get("tags")), "phase": request.get("phase"),
              "provenance": request.get("provenance")}
    for key in ("id", "created_at", "supersedes", "importance", "anchors", "valid_until", "hot", "domain"):
        if request.get(key) is not None:
            record[key] = request[key]
    return mem.add(record, force=bool(request.get("force")))


@verb("memory-index", "add a batch of records from a JSON array or JSONL file ('-' for stdin)", P.INDEX, writes=True,
      stdin=True, long=True)
def _index(ctx: Context, request: Request) -> Any:
    from .batchfile import MAX_BATCH_BYTES, parse_batch

    mem = _scoped(ctx, request, create=True)
    mem.require_enabled()
    path = request.get("records_file")
    if path is None:
        raise UsageError("--records-file is required")
    data: bytes | str
    if path == "-" or request.get("stdin_text") is not None:  # (read by the caller: ``prepare``)
        data = request.get("stdin_text") or ""
    else:
        data = read_file(path, "records-file", MAX_BATCH_BYTES)
    return mem.index(parse_batch(data, path), force=bool(request.get("force")), progress=ctx.progress)


def _text(request: Request) -> Any:
    """The query's text, given as ``--text`` or positionally."""
    text, positional = request.get("text"), request.get("positional")
    if text is not None and positional:
        raise UsageError("give the query as --text or positionally, not both")
    return " ".join(positional) if text is None and positional else text


@verb("memory-query", "hybrid BM25 + vector search", P.QUERY)
def _query(ctx: Context, request: Request) -> Any:
    text = _text(request)
    options = {p.name: argument(p, request) for p in P.QUERY if p.name not in NOT_QUERY_OPTIONS}
    result = _memory(ctx, request).query(text, collapse=not request.get("no_collapse"),
                                         track=not request.get(UNTRACKED), **options)
    if FORMAT_ALIASES.get(request.get("format") or "", request.get("format")) == "markdown":
        from ..api.context import render_markdown

        return render_markdown(result)  # printed as text, not JSON
    return result


@verb("memory-get", "records by id, retired ones too (marked with why and when)", P.GET)
def _get(ctx: Context, request: Request) -> Any:
    return _scoped(ctx, request).get(list(request.get("ids") or []), history=bool(request.get("history")),
                                     track=not request.get(UNTRACKED))


@verb("memory-forget", "retire records by id (tombstones; the log stays append-only)", P.FORGET, writes=True)
def _forget(ctx: Context, request: Request) -> Any:
    return _scoped(ctx, request).forget(list(request.get("ids") or []), reason=request.get("reason") or "forgotten")


@verb("memory-pin", "mark records hot: memory-context includes them in every block (an append-only log operation)",
      P.PIN, writes=True)
def _pin(ctx: Context, request: Request) -> Any:
    return _scoped(ctx, request).pin(list(request.get("ids") or []))


@verb("memory-unpin", "records no longer hot (an append-only log operation; the records stay)", P.UNPIN,
      writes=True)
def _unpin(ctx: Context, request: Request) -> Any:
    return _scoped(ctx, request).unpin(list(request.get("ids") or []))


@verb("memory-context", "one block for an agent's turn within --max-tokens: hot records, the task's best hits, the "
      "newest handoffs (--format md: markdown to inject)", P.CONTEXT)
def _context(ctx: Context, request: Request) -> Any:
    options = {p.name: argument(p, request) for p in P.CONTEXT if p.name not in NOT_QUERY_OPTIONS}
    result = _memory(ctx, request).context(_text(request), **options)
    if FORMAT_ALIASES.get(request.get("format") or "", request.get("format")) == "markdown":
        from ..api.turn import render_context

        return render_context(result)  # printed as text, not JSON
    return result


@verb("memory-redact", "remove the text of records from the log and its backups for good (a leaked secret); "
      "says how to purge it from git history", P.REDACT, writes=True, long=True)
def _redact(ctx: Context, request: Request) -> Any:
    return _memory(ctx, request).redact(list(request.get("ids") or []), reason=request.get("reason") or "redacted")


@verb("memory-ingest", "index markdown files and folders (CLAUDE.md, docs/, memory category files)", P.INGEST,
      writes=True, long=True)
def _ingest(ctx: Context, request: Request) -> Any:
    return _memory(ctx, request).ingest(
        list(request.get("paths") or []), include=request.get("include") or [],
        exclude=request.get("exclude") or [], prune_missing=bool(request.get("prune_missing")),
        record_type=request.get("type"), progress=ctx.progress, domain=request.get("domain"))


@verb("memory-export", "write the whole log as a records.jsonl (from any store; the file store reads it as is)",
      P.EXPORT, served=False)
def _export(ctx: Context, request: Request) -> Any:
    return _memory(ctx, request).export(request["file"])


@verb("memory-import", "load a records.jsonl: records whose id is new, then its tombstones (idempotent by id)",
      P.IMPORT, served=False, writes=True, long=True)
def _import(ctx: Context, request: Request) -> Any:
    return _memory(ctx, request).import_log(request["file"], progress=ctx.progress)


@verb("memory-compact", "rewrite records.jsonl without retired records (backup kept), then rebuild", writes=True,
      long=True)
def _compact(ctx: Context, request: Request) -> Any:
    return _memory(ctx, request).compact(ctx.progress)


@verb("memory-prune", "retire never-retrieved records older than a window, e.g. --unused-for 90d", P.PRUNE,
      writes=True)
def _prune(ctx: Context, request: Request) -> Any:
    return _memory(ctx, request).prune(request.get("unused_for"), dry_run=bool(request.get("dry_run")),
                                       anchors_missing=bool(request.get("anchors_missing")))


@verb("memory-verify", "check every anchored record against the code it cites (verified, moved, drifted, "
      "missing); --update records where moved code is now", P.VERIFY, writes=True)
def _verify(ctx: Context, request: Request) -> Any:
    return _memory(ctx, request).verify(update=bool(request.get("update")))


@verb("memory-rebuild", "rebuild the index, keymap and manifest from records.jsonl", P.REBUILD, writes=True,
      long=True)
def _rebuild(ctx: Context, request: Request) -> Any:
    return _memory(ctx, request).rebuild(ctx.progress, reembed=bool(request.get("reembed")))


@verb("memory-settle", "make what writes left to later: the side-weight estimate when it is due, and a merge of "
      "segments (a one-shot write starts this in the background; memory-serve does it when idle)", P.SETTLE,
      served=False, writes=True)
def _settle(ctx: Context, request: Request) -> Any:
    return _scoped(ctx, request).settle()


@verb("memory-hype", "generator: write the questions each record answers (HyPE) for the records still waiting; "
      "a write starts this in the background when memory.generator is on", P.HYPE, served=False, writes=True)
def _hype(ctx: Context, request: Request) -> Any:
    return _memory(ctx, request).hype(limit=request.get("limit"))


@verb("memory-summarise", "generator: merge each group of near duplicates (or a large type) into one record that "
      "supersedes them; append-only (--dry-run: before and after)", P.SUMMARISE, served=False, writes=True)
def _summarise(ctx: Context, request: Request) -> Any:
    return _memory(ctx, request).summarise(**{p.name: argument(p, request) for p in P.SUMMARISE})


@verb("memory-harvest", "generator: write a transcript's episodic summary and the durable facts it holds, each "
      "citing it (idempotent by its text)", P.HARVEST, served=False, writes=True)
def _harvest(ctx: Context, request: Request) -> Any:
    return _memory(ctx, request).harvest(request["transcript"])


@verb("memory-stats", "counts, model, timestamps and consistency of the memory")
def _stats(ctx: Context, request: Request) -> Any:
    return _memory(ctx, request).stats()


@verb("memory-doctor", "one report: where this memory is and why, git, index, runtime, anchors, damage, and the "
      "command that fixes each problem (--format json: as data)", P.DOCTOR, served=False)
def _doctor(ctx: Context, request: Request) -> Any:
    from ..api.doctor import render

    report = _memory(ctx, request).doctor(root_flag=request.get("root"))
    return report if request.get("format") == "json" else render(report)  # text is printed as it is


@verb("memory-namespaces", "team memory: the namespaces of the database, with their counts and last write")
def _namespaces(ctx: Context, request: Request) -> Any:
    return _memory(ctx, request).namespaces()


@verb("memory-drop-namespace", "team memory: delete a namespace and everything in it (needs --yes)",
      P.DROP_NAMESPACE, writes=True)
def _drop_namespace(ctx: Context, request: Request) -> Any:
    return _memory(ctx, request).drop_namespace(request.get("namespace") or "", yes=bool(request.get("yes")))


@verb("memory-eval", "measure retrieval quality and latency on a BEIR dataset (scratch memory)", P.EVAL,
      served=False, long=True)
def _eval(ctx: Context, request: Request) -> Any:
    from pathlib import Path

    from ..config import load_project
    from ..evaluation import MODES, evaluate, markdown_report

    mode = request.get("mode") or "all"
    modes = MODES if mode == "all" else (mode,)
    settings = load_project(request.get("root")).config
    config = settings.to_dict()
    beir = request.get("beir") or []
    folders = [Path(p) for p in ([beir] if isinstance(beir, str) else beir)]
    gateway = None
    if settings.provider == "openai":  # its URL and key as this project resolved them (user settings, env)
        from ..embed import make_embedder

        gateway = make_embedder(settings.provider, settings.model, config=settings)
    result = evaluate(config, folders, split=request.get("split") or "test", modes=modes, embedder=gateway,
                      k=request.get("k", 10), alpha=request.get("alpha"), max_queries=request.get("max_queries"),
                      cache=not request.get("no_cache"), ignore_identical_ids=not request.get("keep_identical_ids"),
                      progress=ctx.progress)
    if request.get("report"):
        try:
            Path(request["report"]).write_text(markdown_report(result, request.get("k", 10)))
        except OSError as exc:
            raise InputError(f"cannot write the report {request['report']!r}: {exc.strerror}",
                             code=codes.REPORT_UNWRITABLE, details={"path": request["report"]}) from None
        result["report"] = request["report"]
    return result


SERVED = tuple(name for name, v in VERBS.items() if v.served)

"""``np-tools``: JSON verbs over :class:`nubos_memory.Memory`.

Each verb parses its arguments, calls one method of ``Memory`` and prints one
JSON document on stdout.  Errors become ``{"error": {...}}`` on stderr with the
exit code of their class (see ``errors.py``), here and nowhere else.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

from ..errors import DisabledError, InputError, NubosMemoryError, UsageError
from ..fsio import dumps, printable

VERBS: dict[str, Callable[[argparse.Namespace], Any]] = {}
MAX_STDIN = 256 << 20


class _Parser(argparse.ArgumentParser):
    """argparse that raises :class:`UsageError` instead of printing and exiting."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message}", details={"usage": self.format_usage().strip()})


def _verb(name: str, help_text: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        fn.verb_name, fn.verb_help = name, help_text  # type: ignore[attr-defined]
        VERBS[name] = fn
        return fn

    return register


def _open_memory(root: str | None):
    from ..api.memory import Memory

    return Memory.open(root)


# memory-serve swaps this for a factory that returns its warm Memory.
MEMORY_FACTORY: Callable[[str | None], Any] = _open_memory


def _memory(args: argparse.Namespace):
    return MEMORY_FACTORY(args.root)


def _tags(value: str | None) -> list[str]:
    return [t.strip() for t in value.split(",") if t.strip()] if value else []


def read_stdin(args: argparse.Namespace) -> str | None:
    """Standard input as text, read once (the server gets it in the request), or None for a terminal."""
    if getattr(args, "stdin_text", None) is None:
        if sys.stdin is None or sys.stdin.isatty():
            return None
        raw = sys.stdin.buffer.read(MAX_STDIN + 1)
        if len(raw) > MAX_STDIN:
            raise InputError("standard input is larger than 256 MiB", code="stdin-too-large")
        try:
            args.stdin_text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise InputError("standard input is not UTF-8 text", code="stdin-unreadable") from None
    return args.stdin_text


def _read_file(path: str, what: str, limit: int) -> bytes:
    """At most ``limit + 1`` bytes of a file the user named (``-``: stdin); never reads without end."""
    try:
        if path == "-":
            return sys.stdin.buffer.read(limit + 1)
        with open(path, "rb") as f:
            return f.read(limit + 1)
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise InputError(f"cannot read {what} {path!r}: {why}", code=f"{what}-unreadable",
                         details={"path": path}) from None


def _read_text_file(path: str, what: str, limit: int) -> str:
    data = _read_file(path, what, limit * 4)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{what} {path!r} is not UTF-8 text", code=f"{what}-unreadable",
                         details={"path": path}) from None


@_verb("memory-init", "create .nubos-pilot/memory/ and enable memory for this project")
def _init(args: argparse.Namespace) -> Any:
    from ..config import find_root
    from ..api.memory import Memory
    from ..config import Project

    # init is the one verb that works while memory is disabled: it enables it.
    return Memory(Project(root=find_root(args.root))).init()


@_verb("memory-add", "add one record")
def _add(args: argparse.Namespace) -> Any:
    from ..records import MAX_BODY

    mem = _memory(args)
    mem._require_enabled()  # before reading stdin: a disabled memory reads nothing
    if args.body is not None and args.body_file is not None:
        raise UsageError("give --body or --body-file, not both")
    if args.body is not None:
        body = args.body
    elif args.body_file is not None:
        body = _read_text_file(args.body_file, "body-file", MAX_BODY)
    else:
        body = read_stdin(args) or ""
    record = {"type": args.type, "title": args.title, "body": body, "tags": _tags(args.tags),
              "phase": args.phase, "provenance": args.provenance}
    for key in ("id", "created_at", "supersedes", "importance"):
        if getattr(args, key) is not None:
            record[key] = getattr(args, key)
    return mem.add(record, force=args.force)


@_verb("memory-index", "add a batch of records from a JSON array or JSONL file ('-' for stdin)")
def _index(args: argparse.Namespace) -> Any:
    from .batchfile import MAX_BATCH_BYTES, parse_batch

    mem = _memory(args)
    mem._require_enabled()
    path = args.records_file
    if path == "-":
        data = (read_stdin(args) or "").encode("utf-8", "surrogateescape")[: MAX_BATCH_BYTES + 1]
    else:
        data = _read_file(path, "records-file", MAX_BATCH_BYTES)
    return mem.index(parse_batch(data, path), force=args.force)


@_verb("memory-query", "hybrid BM25 + vector search")
def _query(args: argparse.Namespace) -> Any:
    if args.text is not None and args.positional:
        raise UsageError("give the query as --text or positionally, not both")
    text = args.text if args.text is not None else (" ".join(args.positional) if args.positional else None)
    result = _memory(args).query(text, k=args.k, type=args.type, phase=args.phase, tags=_tags(args.tags),
                                 alpha=args.alpha, fusion=args.fusion, explain=args.explain, mode=args.mode,
                                 max_tokens=args.max_tokens, collapse=not args.no_collapse)
    if args.format == "md":
        from ..search.context import render_markdown

        return render_markdown(result)  # printed as text, not JSON
    return result


@_verb("memory-forget", "retire records by id (tombstones; the log stays append-only)")
def _forget(args: argparse.Namespace) -> Any:
    return _memory(args).forget(args.ids, reason=args.reason)


@_verb("memory-ingest", "index markdown files and folders (CLAUDE.md, docs/, memory category files)")
def _ingest(args: argparse.Namespace) -> Any:
    return _memory(args).ingest(args.paths, include=args.include or [], exclude=args.exclude or [],
                                prune_missing=args.prune_missing, record_type=args.type)


@_verb("memory-compact", "rewrite records.jsonl without retired records (backup kept), then rebuild")
def _compact(args: argparse.Namespace) -> Any:
    return _memory(args).compact()


@_verb("memory-prune", "retire never-retrieved records older than a window, e.g. --unused-for 90d")
def _prune(args: argparse.Namespace) -> Any:
    return _memory(args).prune(args.unused_for, dry_run=args.dry_run)


@_verb("memory-rebuild", "rebuild the index, keymap and manifest from records.jsonl")
def _rebuild(args: argparse.Namespace) -> Any:
    mem = _memory(args)
    progress = None
    if sys.stderr.isatty():
        def progress(done: int, total: int) -> None:
            width = 30
            filled = int(width * done / max(total, 1))
            sys.stderr.write(f"\rembedding [{'#' * filled}{'.' * (width - filled)}] {done}/{total}")
            if done >= total:
                sys.stderr.write("\n")
            sys.stderr.flush()
    return mem.rebuild(progress, reembed=args.reembed)


@_verb("memory-eval", "measure retrieval quality and latency on a BEIR dataset (scratch memory)")
def _eval(args: argparse.Namespace) -> Any:
    from ..config import load_project
    from ..api.evaluate import MODES, evaluate

    progress = None
    if sys.stderr.isatty():
        def progress(stage: str, done: int, total: int) -> None:
            sys.stderr.write(f"\r{stage:8s} {done}/{total}")
            if done >= total:
                sys.stderr.write("\n")
            sys.stderr.flush()
    modes = MODES if args.mode == "all" else (args.mode,)
    config = load_project(args.root).config.to_dict()
    return evaluate(config, Path(args.beir), split=args.split, modes=modes, k=args.k, alpha=args.alpha,
                    max_queries=args.max_queries, cache=not args.no_cache, progress=progress)


@_verb("memory-serve", "keep this memory warm and answer the other verbs over a Unix socket")
def _serve(args: argparse.Namespace) -> Any:
    from .server import run

    return run(args.root, args.idle_timeout)


@_verb("memory-mcp", "serve this memory's tools to an agent over the Model Context Protocol (stdio)")
def _mcp(args: argparse.Namespace) -> Any:
    from .mcp_server import run

    run(args.root)
    return None  # stdout belonged to the protocol: nothing more is printed


@_verb("memory-stats", "counts, model, timestamps and consistency of the memory")
def _stats(args: argparse.Namespace) -> Any:
    return _memory(args).stats()


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="np-tools", description="nubos-memory: long-term memory for AI coding agents. "
                     "Every verb prints one JSON document on stdout; errors are JSON on stderr.")
    sub = parser.add_subparsers(dest="verb", metavar="VERB", parser_class=_Parser)
    for name, fn in VERBS.items():
        p = sub.add_parser(name, help=fn.verb_help, description=fn.verb_help)  # type: ignore[attr-defined]
        p.add_argument("--root", help="project root (default: $NUBOS_PILOT_ROOT or nearest folder with .nubos-pilot/)")
        p.add_argument("--skip-if-disabled", action="store_true",
                       help='answer {"skipped": true, "reason": "memory-disabled"} (exit 0) when memory is off')
        if name == "memory-add":
            p.add_argument("--type", required=True, help="learning|handoff|critic|research (or a configured type)")
            p.add_argument("--title", required=True)
            p.add_argument("--body", help="body text (else --body-file, else stdin)")
            p.add_argument("--body-file", help="read the body from this file ('-' for stdin)")
            p.add_argument("--tags", help="comma-separated tags")
            p.add_argument("--phase")
            p.add_argument("--provenance", help="VERIFIED|CITED|ASSUMED|CACHED")
            p.add_argument("--id", help="record id (default: a new UUIDv4)")
            p.add_argument("--created-at", help="ISO-8601 timestamp (default: now)")
            p.add_argument("--supersedes", help="id of the live record this one replaces (it leaves all results)")
            p.add_argument("--importance", type=float, help="0..1; reorders near-ties in results (default: unset)")
            p.add_argument("--force", action="store_true", help="store it even if it duplicates a live record")
        elif name == "memory-index":
            p.add_argument("--records-file", required=True, help="JSON array or JSONL file, '-' for stdin")
            p.add_argument("--force", action="store_true", help="store duplicates of live records too")
        elif name == "memory-forget":
            p.add_argument("ids", nargs="+", metavar="ID", help="record ids to retire")
            p.add_argument("--reason", default="forgotten", help="why (kept in the tombstone; default: forgotten)")
        elif name == "memory-ingest":
            p.add_argument("paths", nargs="+", metavar="PATH", help="markdown files or folders inside the project")
            p.add_argument("--include", action="append", metavar="GLOB",
                           help="only files matching (repeatable; default *.md, *.markdown)")
            p.add_argument("--exclude", action="append", metavar="GLOB", help="skip files matching (repeatable)")
            p.add_argument("--prune-missing", action="store_true",
                           help="retire chunks of files under these paths that no longer exist")
            p.add_argument("--type", help="record type (default: learning for files with a frontmatter "
                                          "category, else research)")
        elif name == "memory-prune":
            p.add_argument("--unused-for", required=True, help="window such as 90d, 12h or 2w")
            p.add_argument("--dry-run", action="store_true", help="report what would be retired, retire nothing")
        elif name == "memory-query":
            p.add_argument("positional", nargs="*", metavar="TEXT", help="query text (or --text)")
            p.add_argument("--text")
            p.add_argument("--k", type=int, default=8, help="number of hits (default 8)")
            p.add_argument("--type")
            p.add_argument("--phase")
            p.add_argument("--tags", help="comma-separated; a hit needs at least one")
            p.add_argument("--alpha", type=float, help="lexical weight in [0, 1] (default from config)")
            p.add_argument("--fusion", choices=("alpha", "rrf"))
            p.add_argument("--explain", action="store_true", help="show each hit's score parts")
            p.add_argument("--no-collapse", action="store_true",
                           help="list near duplicates as separate hits (default: the newest of them, counted)")
            p.add_argument("--mode", choices=("hybrid", "lexical", "vector"), default="hybrid",
                           help="rank by both signals (default) or by one only; lexical never loads the model")
            p.add_argument("--max-tokens", type=int, help="keep the best hits that fit this many tokens (chars/4)")
            p.add_argument("--format", choices=("json", "md"), default="json",
                           help="json (default) or md: a markdown context block ready to inject")
        elif name == "memory-rebuild":
            p.add_argument("--reembed", action="store_true",
                           help="embed every record again instead of reusing vectors of unchanged text")
        elif name == "memory-serve":
            p.add_argument("--idle-timeout", type=float, default=0.0,
                           help="stop after this many seconds without a request (default: never)")
        elif name == "memory-eval":
            p.add_argument("--beir", required=True, help="BEIR folder: corpus.jsonl, queries.jsonl, qrels/<split>.tsv")
            p.add_argument("--split", default="test")
            p.add_argument("--mode", choices=("lexical", "vector", "hybrid", "rrf", "all"), default="all")
            p.add_argument("--k", type=int, default=10)
            p.add_argument("--alpha", type=float)
            p.add_argument("--max-queries", type=int, help="evaluate only the first N judged queries")
            p.add_argument("--no-cache", action="store_true", help="do not reuse or store dataset embeddings")
    return parser


def _emit(stream: Any, doc: Any) -> None:
    """One JSON document, or a verb's text answer as it is (``memory-query --format md``);
    nothing for a verb whose output was a protocol (``memory-mcp``)."""
    if doc is None:
        return
    stream.write(doc if isinstance(doc, str) else dumps(doc).decode("utf-8") + "\n")
    stream.flush()


def execute(args: argparse.Namespace) -> tuple[int, str, Any]:
    """Run a parsed verb: ``(exit code, "stdout" or "stderr", JSON document)``."""
    try:
        if not args.verb:
            raise UsageError("a verb is required", details={"verbs": sorted(VERBS)})
        return 0, "stdout", VERBS[args.verb](args)
    except DisabledError as exc:
        if getattr(args, "skip_if_disabled", False):
            return 0, "stdout", {"skipped": True, "reason": "memory-disabled"}
        return exc.exit_code, "stderr", {"error": exc.to_dict()}
    except NubosMemoryError as exc:
        return exc.exit_code, "stderr", {"error": exc.to_dict()}
    except OSError as exc:  # an I/O failure outside the library's own handling
        return 74, "stderr", {"error": {"code": "io-error", "message": str(exc), "details": {}}}
    except KeyboardInterrupt:
        return 130, "stderr", {"error": {"code": "interrupted", "message": "interrupted", "details": {}}}
    except Exception as exc:  # a bug: still one JSON error, never a bare traceback
        if os.environ.get("NUBOS_MEMORY_DEBUG"):
            raise
        return 70, "stderr", {"error": {"code": "internal-error", "message": f"{type(exc).__name__}: {exc}",
                                        "details": {"hint": "set NUBOS_MEMORY_DEBUG=1 for a traceback"}}}


def check_arguments(argv: Sequence[str]) -> None:
    """Refuse arguments that are not UTF-8 text (the OS hands Python undecodable bytes as lone
    surrogates, which would fail later, far from their cause)."""
    for number, arg in enumerate(argv, start=1):
        if printable(arg) != arg:
            raise UsageError(f"argument {number} is not valid UTF-8 text", code="argument-invalid-utf8",
                             details={"argument": number, "text": printable(arg)[:200]})


def main(argv: Sequence[str] | None = None) -> int:
    """Run one verb, through a running memory-serve when there is one; return the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        check_arguments(argv)
        args = build_parser().parse_args(argv)
    except UsageError as exc:
        _emit(sys.stderr, {"error": exc.to_dict()})
        return exc.exit_code
    if args.verb in FORWARDED and not os.environ.get("NUBOS_MEMORY_NO_SERVER"):
        from .client import forward

        code, stream, doc = execute_prepared(args, forward)
    else:
        code, stream, doc = execute(args)
    _emit(sys.stdout if stream == "stdout" else sys.stderr, doc)
    return code


FORWARDED = ("memory-add", "memory-index", "memory-query", "memory-rebuild", "memory-stats", "memory-forget",
             "memory-compact", "memory-prune", "memory-ingest")


def execute_prepared(args: argparse.Namespace, forward: Callable[[argparse.Namespace], Any]) -> tuple[int, str, Any]:
    """Ask a running server first (same answer, warm); run in-process when there is none."""
    try:
        prepare_for_server(args)
    except NubosMemoryError as exc:
        return exc.exit_code, "stderr", {"error": exc.to_dict()}
    answer, warning = forward(args)
    if answer is not None:
        return answer
    code, stream, doc = execute(args)
    if warning is not None and isinstance(doc, dict) and code == 0:
        doc.setdefault("warnings", []).append(warning)
    elif warning is not None and isinstance(doc, str):  # a markdown answer: say it above the block
        doc = f"> warning ({warning['code']}): {warning['message']}\n\n" + doc
    return code, stream, doc


def prepare_for_server(args: argparse.Namespace) -> None:
    """Make a request self-contained: read stdin now, make file paths absolute."""
    if args.verb == "memory-add":
        if args.body is None and args.body_file is None:
            read_stdin(args)
        if args.id is None:  # fixed before sending, so a retry in-process cannot add it twice
            import uuid

            args.id = str(uuid.uuid4())
    if args.verb == "memory-index" and args.records_file == "-":
        read_stdin(args)
    for name in ("body_file", "records_file"):
        value = getattr(args, name, None)
        if value not in (None, "-"):
            setattr(args, name, os.path.abspath(value))


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())

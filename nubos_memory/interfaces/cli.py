"""``np-tools``: the verbs on the command line.

This module only parses arguments (choices and bounds come from
``limits.py``), hands the request to the verb table (``verbs.py``) — through a
running ``memory-serve`` when there is one of ours (``client.py``) — and
prints one JSON document on stdout, or the error envelope on stderr with the
exit code of its class (``errors.py``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..errors import DisabledError, UsageError, failure
from ..fsio import dumps, printable
from ..limits import EVAL_MODES, FORMAT_ALIASES, FORMATS, FUSIONS, MODES, PROGRESS_MODES, PROVENANCES
from .verbs import VERBS, Context, Request, prepare, run

if TYPE_CHECKING:
    from ..api.memory import Memory


class _Parser(argparse.ArgumentParser):
    """argparse that raises :class:`UsageError` instead of printing and exiting."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message}", details={"usage": self.format_usage().strip()})


def open_memory(root: str | None) -> "Memory":
    """The CLI's memory factory: one Memory per process."""
    from ..api.memory import Memory

    return Memory.open(root)


def _arguments(name: str, p: argparse.ArgumentParser) -> None:
    """The flags of one verb (their names are the request's keys)."""
    if name == "memory-add":
        p.add_argument("--type", required=True, help="learning|handoff|critic|research (or a configured type)")
        p.add_argument("--title", required=True)
        p.add_argument("--body", help="body text (else --body-file, else stdin)")
        p.add_argument("--body-file", help="read the body from this file ('-' for stdin)")
        p.add_argument("--tags", help="comma-separated tags")
        p.add_argument("--phase")
        p.add_argument("--provenance", help="|".join(PROVENANCES))
        p.add_argument("--id", help="record id (default: a new UUIDv4)")
        p.add_argument("--created-at", help="ISO-8601 timestamp (default: now)")
        p.add_argument("--supersedes", help="id of the live record this one replaces (it leaves all results)")
        p.add_argument("--importance", type=float, help="0..1; reorders near-ties in results (default: unset)")
        p.add_argument("--force", action="store_true", help="store it even if it repeats a live record's text")
    elif name == "memory-index":
        p.add_argument("--records-file", required=True, help="JSON array or JSONL file, '-' for stdin")
        p.add_argument("--force", action="store_true", help="store exact duplicates of live records too")
    elif name == "memory-get":
        p.add_argument("ids", nargs="+", metavar="ID", help="record ids (from hits, duplicate_of, supersedes)")
    elif name == "memory-forget":
        p.add_argument("ids", nargs="+", metavar="ID", help="record ids to retire")
        p.add_argument("--reason", default="forgotten", help="why (kept in the tombstone; default: forgotten)")
    elif name == "memory-redact":
        p.add_argument("ids", nargs="+", metavar="ID", help="record ids whose text must leave the memory")
        p.add_argument("--reason", default="redacted", help="why (kept in the content-free redact line)")
    elif name == "memory-drop-namespace":
        p.add_argument("namespace", metavar="NAMESPACE", help="the namespace to delete (memory-namespaces lists them)")
        p.add_argument("--yes", action="store_true", help="really delete it, for every machine")
    elif name == "memory-ingest":
        p.add_argument("paths", nargs="+", metavar="PATH",
                       help="markdown files or folders, relative to the project root")
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
        p.add_argument("--type", help="only records of this type (an unknown type is an error listing the types)")
        p.add_argument("--phase", help="only this phase and the phases under it (M001 finds M001-S002-T0001)")
        p.add_argument("--phase-exact", action="store_true", help="--phase matches that phase only")
        p.add_argument("--tags", help="comma-separated; a hit needs at least one")
        p.add_argument("--alpha", type=float, help="lexical weight in [0, 1] (default from config)")
        p.add_argument("--fusion", choices=FUSIONS)
        p.add_argument("--explain", action="store_true", help="show each hit's score parts")
        p.add_argument("--no-collapse", action="store_true",
                       help="list near duplicates as separate hits (default: the newest of them, counted)")
        p.add_argument("--mode", choices=MODES, default="hybrid",
                       help="rank by both signals (default) or by one only; lexical never loads the model")
        p.add_argument("--max-tokens", type=int, help="keep the best hits that fit this many tokens (chars/4)")
        p.add_argument("--format", choices=FORMATS + tuple(FORMAT_ALIASES), default="json",
                       help="json (default), or markdown (md): a context block ready to inject")
    elif name == "memory-export":
        p.add_argument("file", metavar="FILE", help="where to write the records.jsonl (replaced atomically)")
    elif name == "memory-import":
        p.add_argument("file", metavar="FILE", help="a records.jsonl (of this or another store)")
    elif name == "memory-rebuild":
        p.add_argument("--reembed", action="store_true",
                       help="embed every record again instead of reusing vectors of unchanged text")
    elif name == "memory-serve":
        p.add_argument("--idle-timeout", type=float, default=0.0,
                       help="stop after this many seconds without a request (default: never)")
    elif name == "memory-eval":
        p.add_argument("--beir", required=True, nargs="+", metavar="DIR",
                       help="BEIR folder(s): corpus.jsonl, queries.jsonl, qrels/<split>.tsv; several are scored "
                            "one memory each and averaged over their questions")
        p.add_argument("--split", default="test")
        p.add_argument("--mode", choices=(*EVAL_MODES, "all"), default="all",
                       help="hybrid: the configured fusion; alpha, rrf: the other fusions; or one side")
        p.add_argument("--keep-identical-ids", action="store_true",
                       help="count a hit whose id equals the query's id (BEIR's protocol drops it)")
        p.add_argument("--report", metavar="FILE", help="also write the results as a markdown table")
        p.add_argument("--k", type=int, default=10)
        p.add_argument("--alpha", type=float)
        p.add_argument("--max-queries", type=int, help="evaluate only the first N judged queries")
        p.add_argument("--no-cache", action="store_true", help="do not reuse or store dataset embeddings")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="np-tools", description="nubos-memory: long-term memory for AI coding agents. "
                     "Every verb prints one JSON document on stdout; errors are JSON on stderr.")
    sub = parser.add_subparsers(dest="verb", metavar="VERB", parser_class=_Parser)
    for name, v in VERBS.items():
        p = sub.add_parser(name, help=v.help, description=v.help)
        p.add_argument("--root", help="project root (default: $NUBOS_PILOT_ROOT or nearest folder with .nubos-pilot/)")
        p.add_argument("--skip-if-disabled", action="store_true",
                       help='answer {"skipped": true, "reason": "memory-disabled"} (exit 0) when memory is off')
        _arguments(name, p)
        if v.long:
            p.add_argument("--progress", choices=PROGRESS_MODES, default="auto",
                           help="progress on stderr: a bar, JSON lines (for agents), or none "
                                "(default auto: a bar on a terminal)")
    return parser


def check_arguments(argv: Sequence[str]) -> None:
    """Refuse arguments that are not UTF-8 text (the OS hands Python undecodable bytes as lone
    surrogates, which would fail later, far from their cause)."""
    for number, arg in enumerate(argv, start=1):
        if printable(arg) != arg:
            raise UsageError(f"argument {number} is not valid UTF-8 text", code="argument-invalid-utf8",
                             details={"argument": number, "text": printable(arg)[:200]})


class ProgressPrinter:
    """Progress reports of a long verb on stderr (stdout carries only the answer): a bar for a
    person at a terminal, or one JSON document per line for an agent
    (``{"progress": {"verb", "stage", "done", "total", "elapsed_s"}}``).  At most four updates a
    second, plus the end of every stage."""

    def __init__(self, verb: str, mode: str, stream: Any = None, interval: float = 0.25):
        self.verb, self.mode, self.interval = verb, mode, interval
        self.stream = stream if stream is not None else sys.stderr
        self.started = time.monotonic()
        self.stage: str | None = None
        self.last = 0.0
        self.open_bar = False

    def __call__(self, stage: str, done: int, total: int) -> None:
        now = time.monotonic()
        final = done >= total
        if stage == self.stage and not final and now - self.last < self.interval:
            return
        if self.mode == "json":
            self.stream.write(dumps({"progress": {"verb": self.verb, "stage": stage, "done": done, "total": total,
                                                  "elapsed_s": round(now - self.started, 3)}}).decode() + "\n")
        else:
            if self.open_bar and stage != self.stage:
                self.stream.write("\n")
            width = 30
            filled = int(width * done / max(total, 1))
            self.stream.write(f"\r{stage:10s} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}")
            self.open_bar = not final
            if final:
                self.stream.write("\n")
        self.stream.flush()
        self.stage, self.last = stage, now


def progress_mode(requested: str | None) -> str:
    """``auto`` made concrete: a bar when stderr is a terminal, else nothing."""
    if requested in (None, "auto"):
        return "bar" if sys.stderr.isatty() else "none"
    return requested


def _emit(stream: Any, doc: Any) -> None:
    """One JSON document, or a verb's text answer as it is (``memory-query --format md``);
    nothing for a verb whose output was a protocol (``memory-mcp``)."""
    if doc is None:
        return
    stream.write(doc if isinstance(doc, str) else dumps(doc).decode("utf-8") + "\n")
    stream.flush()


def execute(name: str, request: Request) -> tuple[int, str, Any]:
    """Run a verb here or, when one of ours is running, in ``memory-serve``."""
    try:
        prepare(name, request)
    except DisabledError as exc:
        if request.get("skip_if_disabled"):
            return 0, "stdout", {"skipped": True, "reason": "memory-disabled"}
        return exc.exit_code, "stderr", {"error": exc.to_dict()}
    except BaseException as exc:  # noqa: BLE001 - every failure becomes the envelope
        code, envelope = failure(exc)
        return code, "stderr", envelope
    warning = None
    report = None
    if VERBS[name].long:
        request["progress"] = progress_mode(request.get("progress"))
        report = None if request["progress"] == "none" else ProgressPrinter(name, request["progress"])
    if VERBS[name].served and not os.environ.get("NUBOS_MEMORY_NO_SERVER"):
        from .client import forward

        answer, warning = forward(name, request, report)
        if answer is not None:
            return answer
    ctx = Context(open_memory=open_memory, progress=report)
    code, stream, doc = run(name, request, ctx)
    if warning is not None and isinstance(doc, dict) and code == 0:
        doc.setdefault("warnings", []).append(warning)
    elif warning is not None and isinstance(doc, str):  # a markdown answer: say it above the block
        doc = f"> warning ({warning['code']}): {warning['message']}\n\n" + doc
    return code, stream, doc


def main(argv: Sequence[str] | None = None) -> int:
    """Run one verb; return the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        check_arguments(argv)
        args = build_parser().parse_args(argv)
        if not args.verb:
            raise UsageError("a verb is required", details={"verbs": sorted(VERBS)})
    except UsageError as exc:
        _emit(sys.stderr, {"error": exc.to_dict()})
        return exc.exit_code
    request = {k: v for k, v in vars(args).items() if k != "verb"}
    code, stream, doc = execute(args.verb, request)
    _emit(sys.stdout if stream == "stdout" else sys.stderr, doc)
    return code


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())

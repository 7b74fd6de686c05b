"""``np-tools``: the verbs on the command line.

This module only parses arguments (the flags are made from each verb's declaration in
``params.py``), hands the request to the verb table (``verbs.py``) — through a
running ``memory-serve`` when there is one of ours (``client.py``) — and
prints one JSON document on stdout, or the error envelope on stderr with the
exit code of its class (``errors.py``).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import codes
from ..errors import DisabledError, UsageError, failure
from ..fsio import dumps, printable
from ..limits import PROGRESS_MODES
from ..params import HTTP, SERVE
from ..records import echo
from .entry import emit
from .verbs import VERBS, Context, Request, Verb, answered, prepare, run

if TYPE_CHECKING:
    from ..api.memory import Memory
    from ..params import Param


class _Parser(argparse.ArgumentParser):
    """argparse that raises :class:`UsageError` instead of printing and exiting."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message}", details={"usage": self.format_usage().strip()})

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:  # type: ignore[override]
        """argparse's, saying of arguments it does not know only the flags (``_unknown``)."""
        parsed, extra = self.parse_known_args(args, namespace)
        if extra:
            self.error("unrecognized arguments: " + " ".join(_unknown(extra)))
        return parsed


UNKNOWN_SHOWN = 20  # unknown arguments an error lists (then how many more)


def _unknown(words: Sequence[str]) -> list[str]:
    """Unknown arguments as an error lists them: a flag without its value (``--key=…``, ``-k…``; a word after
    a flag may be its value: "…"), any other word as a caller's string is repeated (``records.echo``): a
    value given to the wrong flag may be a secret."""
    shown = []
    for i, word in enumerate(words[:UNKNOWN_SHOWN]):
        flag, eq, _ = word.partition("=")
        if word.startswith("--"):
            shown.append(flag + "=…" if eq else echo(word))
        elif word.startswith("-") and len(word) > 2:
            shown.append(word[:2] + "…")  # a short flag with its value attached
        elif i and words[i - 1].startswith("-") and "=" not in words[i - 1]:
            shown.append("…")
        else:
            shown.append(echo(word))
    if len(words) > UNKNOWN_SHOWN:
        shown.append(f"(and {len(words) - UNKNOWN_SHOWN} more)")
    return shown


class _Printing(Exception):
    """What a quiet parser raises where argparse would print (``--help``): the caller's CLI prints it."""


class _QuietParser(_Parser):
    """A parser for another process's command line (``memory-serve``): it never writes to this
    process's streams."""

    def _print_message(self, message: str, file: Any = None) -> None:
        raise _Printing()


# "1": a one-shot write that makes a side-weight estimate due makes it itself, as the library does, instead of
# leaving it to a background memory-settle (the test suite sets it: no stray workers).
SETTLE_INLINE = "NUBOS_MEMORY_SETTLE_INLINE"


def open_memory(root: str | None) -> "Memory":
    """The CLI's memory factory: one Memory per process (a one-shot one: ``index/vectors.py`` scans
    instead of loading the HNSW graph for an answer or two; its writes leave a due side-weight estimate
    to a background ``memory-settle``: ``Memory.leave_to_background``)."""
    from ..api.memory import Memory

    mem = Memory.open(root)
    mem.snap.graph = False
    if os.environ.get(SETTLE_INLINE) != "1":
        mem.leave_to_background()  # a side-weight estimate a write makes due: a background memory-settle
    return mem


def add_arguments(p: argparse.ArgumentParser, params: "Sequence[Param]") -> None:
    """The flags of one verb, made from its declaration (``params.py``; their names are the request's keys)."""
    for param in params:
        if param.cli != "none":
            _add_argument(p, param)


def _add_argument(p: argparse.ArgumentParser, param: "Param") -> None:
    """One parameter's positional argument or flag."""
    kw: dict[str, Any] = {} if param.help is None else {"help": param.help}
    if param.metavar is not None:
        kw["metavar"] = param.metavar
    if param.cli == "positional":
        if param.nargs is not None:
            kw["nargs"] = param.nargs
        p.add_argument(param.name, **kw)
        return
    if param.cli_flag is not None:
        kw["dest"] = param.name  # the request's key stays the declared name
    kind = param.cli_kind or param.kind
    if kind is bool:
        p.add_argument(param.flag, action="store_true", **kw)
        return
    if param.append:
        p.add_argument(param.flag, action="append", **kw)
        return
    p.add_argument(param.flag, **_value_keywords(param, kind, kw))


def _value_keywords(param: "Param", kind: Any, kw: dict[str, Any]) -> dict[str, Any]:
    """``kw`` with what a flag that takes a value adds: required, nargs, type, choices, default."""
    if param.required:
        kw["required"] = True
    if param.nargs is not None:
        kw["nargs"] = param.nargs
    if kind in (int, float):
        kw["type"] = kind
    if param.choices:
        kw["choices"] = param.choices
    if param.default is not None:
        kw["default"] = param.default
    return kw


@dataclass(frozen=True)
class Launcher:
    """A command that serves the verbs instead of being one (it holds the process)."""

    name: str
    help: str
    params: "tuple[Param, ...]" = ()


def _serve(request: Request) -> Any:
    from .server import run_server

    return run_server(request.get("root"), float(request.get("idle_timeout") or 0.0))


def _http(request: Request) -> Any:
    from .http import run_http

    return run_http(request.get("root"), request.get("host") or "127.0.0.1", int(request.get("port") or 0),
                    list(request.get("allow_host") or []))


def _mcp(request: Request) -> Any:
    from .mcp_server import run_mcp

    run_mcp(request.get("root"))
    return None  # stdout belonged to the protocol: nothing more is printed


LAUNCHERS = {
    "memory-serve": (Launcher("memory-serve", "keep this memory warm and answer the other verbs over a Unix socket",
                              SERVE), _serve),
    "memory-mcp": (Launcher("memory-mcp", "serve this memory's tools to an agent over the Model Context Protocol "
                            "(stdio)"), _mcp),
    "memory-http": (Launcher("memory-http", "serve the verbs over HTTP/JSON (/v1/<verb>, the Knowledge Hive's "
                             "/api/knowledge routes), MCP over streamable HTTP (/mcp) and a store browser (/)",
                             HTTP), _http),
}
COMMANDS: "dict[str, Verb | Launcher]" = {**VERBS, **{name: spec for name, (spec, _) in LAUNCHERS.items()}}


def launch(name: str, request: Request) -> tuple[int, str, Any]:
    """Run a launcher: ``(exit code, stream, document)`` like a verb."""
    return answered(lambda: LAUNCHERS[name][1](request), request)


def build_parser(quiet: bool = False) -> argparse.ArgumentParser:
    """The CLI's parser (``quiet``: one that raises instead of printing help: ``_QuietParser``)."""
    kind = _QuietParser if quiet else _Parser
    parser = kind(prog="np-tools", description="nubos-memory: long-term memory for AI coding agents. "
                  "Every verb prints one JSON document on stdout; errors are JSON on stderr.")
    sub = parser.add_subparsers(dest="verb", metavar="VERB", parser_class=kind)
    for name, v in COMMANDS.items():
        p = sub.add_parser(name, help=v.help, description=v.help)
        p.add_argument("--root", help="project root (default: $NUBOS_PILOT_ROOT or nearest folder with .nubos-pilot/)")
        p.add_argument("--skip-if-disabled", action="store_true",
                       help='answer {"skipped": true, "reason": "memory-disabled"} (exit 0) when memory is off')
        add_arguments(p, v.params)
        if isinstance(v, Verb) and v.long:
            p.add_argument("--progress", choices=PROGRESS_MODES, default="auto",
                           help="progress on stderr: a bar, JSON lines (for agents), or none "
                                "(default auto: a bar on a terminal)")
    return parser


def check_arguments(argv: Sequence[str]) -> None:
    """Refuse arguments that are not UTF-8 text (the OS hands Python undecodable bytes as lone
    surrogates, which would fail later, far from their cause)."""
    for number, arg in enumerate(argv, start=1):
        if printable(arg) != arg:
            raise UsageError(f"argument {number} is not valid UTF-8 text", code=codes.ARGUMENT_INVALID_UTF8,
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


def render(doc: Any) -> str | None:
    """What the CLI prints for an answer: one JSON document, or a verb's text answer as it is
    (``memory-query --format md``); nothing for a verb whose output was a protocol (``memory-mcp``)."""
    if doc is None:
        return None
    return doc if isinstance(doc, str) else dumps(doc).decode("utf-8") + "\n"


def _emit(to_stdout: bool, doc: Any) -> int | None:
    """Print an answer (``entry.emit``: the exit code of ``io-error`` when it cannot be written)."""
    return emit(to_stdout, render(doc))


def prepared(name: str, request: Request, cwd: str | None = None) -> tuple[int, str, Any] | None:
    """Make the request self-contained (``verbs.prepare``; ``cwd``: the caller's working directory when
    it is another process's); the answer when that fails, None when the request is ready."""
    try:
        prepare(name, request, cwd)
    except DisabledError as exc:
        if request.get("skip_if_disabled"):
            return 0, "stdout", {"skipped": True, "reason": "memory-disabled"}
        return exc.exit_code, "stderr", {"error": exc.to_dict()}
    except BaseException as exc:  # noqa: BLE001 - every failure becomes the envelope
        code, envelope = failure(exc)
        return code, "stderr", envelope
    return None


def execute(name: str, request: Request, untrusted: dict[str, str] | None = None) -> tuple[int, str, Any]:
    """Run a verb here or, when one of ours is running, in ``memory-serve``; ``untrusted``: the warning
    about a server found not to be ours already (``client.quick``), which is not tried again."""
    if name in LAUNCHERS:
        return launch(name, request)
    refused = prepared(name, request)
    if refused is not None:
        return refused
    warning = None
    report = None
    if VERBS[name].long:
        request["progress"] = progress_mode(request.get("progress"))
        report = None if request["progress"] == "none" else ProgressPrinter(name, request["progress"])
    if untrusted is not None and VERBS[name].served:
        warning = untrusted
    elif VERBS[name].served and not os.environ.get("NUBOS_MEMORY_NO_SERVER"):
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


@functools.cache
def _parser(quiet: bool) -> argparse.ArgumentParser:
    """The parser, built once per process (~4 ms: a served call paid it on every command line)."""
    return build_parser(quiet)


def parse(argv: Sequence[str], quiet: bool = False) -> tuple[str, Request]:
    """A command line's verb and request (UsageError: not a valid one; ``quiet``: another process's, so
    what argparse would print raises instead)."""
    check_arguments(argv)
    if argv and argv[0].startswith("-") and argv[0] not in ("-h", "--help"):
        raise UsageError("the verb comes first: np-tools VERB [flags] (np-tools --help lists the verbs)",
                         details={"verbs": sorted(COMMANDS)})
    try:
        args = _parser(quiet).parse_args(argv)
    except UsageError as exc:
        exc.message = _unechoed(exc.message, argv)
        exc.args = (exc.message,)
        raise
    if not args.verb:
        raise UsageError("a verb is required", details={"verbs": sorted(COMMANDS)})
    return args.verb, {k: v for k, v in vars(args).items() if k != "verb"}


def _unechoed(message: str, argv: Sequence[str]) -> str:
    """argparse's ``message`` with each argument it repeats shown as an answer repeats a caller's string
    (``records.echo``: at most ``MAX_ECHO`` characters), and an unknown or ambiguous ``--flag=value`` as its
    flag alone: the value may be a secret given to the wrong flag, and a refused value is never repeated in full."""
    shown: dict[str, str] = {}
    for arg in argv:
        flag, eq, value = arg.partition("=")
        if eq and flag.startswith("-"):
            shown[arg] = flag + "=…"
            shown.setdefault(value, echo(value))  # (the value of a known flag, refused: its beginning)
        else:
            shown[arg] = echo(arg)
    for said, as_shown in sorted(shown.items(), key=lambda kv: len(kv[0]), reverse=True):
        if as_shown != said and said:
            message = message.replace(repr(said), repr(as_shown)).replace(said, as_shown)
    return message


def main(argv: Sequence[str] | None = None, untrusted: dict[str, str] | None = None) -> int:
    """Run one verb; return the exit code (``untrusted``: see :func:`execute`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        name, request = parse(argv)
    except UsageError as exc:
        return _emit(False, {"error": exc.to_dict()}) or exc.exit_code
    code, stream, doc = execute(name, request, untrusted)
    return _emit(stream == "stdout", doc) or code


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())

"""Every verb's parameters, declared once.

A :class:`Param` carries what every interface needs to know about one argument: its type, its
bounds (from ``limits.py``), the command line's help text and the MCP tool's description.  From
these declarations ``interfaces/cli.py`` generates the argparse flags, ``interfaces/mcp_server.py``
the tool schemas, and :func:`check` validates a value the same way for every caller (the library's
``Memory.query`` uses it).  Adding an option to a verb is one ``Param`` here and the code that uses
it.  Stdlib only: the light CLI path imports this (adr/0007).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from . import codes
from .errors import InputError
from .limits import (
    BASE_TYPES,
    DOMAIN_PATTERN,
    EVAL_MODES,
    FORMAT_ALIASES,
    FORMATS,
    FUSIONS,
    HTTP_PORT,
    ID_PATTERN,
    MAX_BODY,
    MAX_DOMAIN,
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
from .records import iso_to_epoch

BRANCHES = ("current",)  # memory-query --branch (api/gitstate.py)

ONE_LINE = r"^[^\x00-\x1f\x7f]*[^\s\x00-\x1f\x7f][^\x00-\x1f\x7f]*$"  # one line with something on it
ID = f"^{ID_PATTERN}$"
TAG = r"^[^,\x00-\x1f\x7f]+$"
TYPE_NAMES = " | ".join(BASE_TYPES)
UNSET: Any = object()  # a tool default that is the same as the command line's


@dataclass(frozen=True)
class Text:
    """What a string (or each string of a list) may be."""

    min_length: int | None = None
    max_length: int | None = None
    pattern: str | None = None


RECORD_TYPE = Text(1, MAX_TYPE, ONE_LINE)
PHASE = Text(1, MAX_PHASE, ONE_LINE)
RECORD_ID = Text(1, MAX_ID, ID)
TAG_TEXT = Text(1, MAX_TAG, TAG)
GLOB = Text(1, 4096)
DOMAIN = Text(1, MAX_DOMAIN, f"^{DOMAIN_PATTERN}$")


@dataclass(frozen=True)
class Param:
    """One argument of a verb (see the module docstring)."""

    name: str  # the request's key, the tool's argument, the flag (``--`` + dashes)
    kind: type  # str, int, float, bool, or list (of strings)
    help: str | None = None  # the command line's help text (None: no help line)
    describe: str | None = None  # the MCP tool's description (None: not a tool argument)
    required: bool = False
    tool_required: bool = False  # required of a tool though not on the command line (a query's text)
    default: Any = None
    tool_default: Any = UNSET  # the tool's default where it differs from the command line's
    choices: tuple[str, ...] = ()
    tool_choices: tuple[str, ...] | None = None  # the tool's where they differ (no aliases)
    ge: float | None = None
    le: float | None = None
    text: Text | None = None  # a string's bounds, or each list item's
    min_items: int | None = None
    max_items: int | None = None
    cli: str = "flag"  # "flag", "positional" or "none" (a tool argument only)
    cli_kind: type | None = None  # where the command line reads another type (tags: "a,b")
    nargs: str | None = None
    metavar: str | None = None
    append: bool = False  # a repeatable flag (--include A --include B)
    time: bool = False  # a string that must be an ISO-8601 time with a zone (``records.iso_to_epoch``)
    cli_flag: str | None = None  # the command line's flag where it is not ``--`` + the name (``--anchor``)
    invalid: tuple[str, str] | None = None  # (code, message) when :func:`check` refuses a value

    @property
    def flag(self) -> str:
        return self.cli_flag or "--" + self.name.replace("_", "-")

    @property
    def for_tool(self) -> Any:
        return self.default if self.tool_default is UNSET else self.tool_default


def _echo(value: Any) -> Any:
    return value if isinstance(value, (int, float)) or value is None else str(value)[:MAX_ECHO]


def _fits(text: Text, value: str) -> bool:
    return ((text.min_length is None or len(value) >= text.min_length)
            and (text.max_length is None or len(value) <= text.max_length)
            and (text.pattern is None or re.search(text.pattern, value) is not None))


def check(param: Param, value: Any) -> None:
    """Refuse ``value`` for ``param`` with the declared code and message (None passes where the
    parameter has no default: not given)."""
    if param.invalid is None or (value is None and param.default is None):
        return
    code, message = param.invalid
    kind = param.kind
    ok = not isinstance(value, bool) if kind in (int, float) else True
    if kind is int:
        ok = ok and isinstance(value, int)
    elif kind is float:
        ok = ok and isinstance(value, (int, float))
    elif kind is list:
        ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
    elif param.time:
        ok = iso_to_epoch(value) is not None
    elif kind is str and param.text is not None:
        ok = isinstance(value, str) and _fits(param.text, value)
    if ok and param.choices:
        ok = value in param.choices
    if ok and kind in (int, float):
        ok = (param.ge is None or value >= param.ge) and (param.le is None or value <= param.le)
    if not ok:
        raise InputError(message, code=code, details={} if kind is list else {param.name: _echo(value)})


# -- the declarations ---------------------------------------------------------------------------
FORCE_ADD = Param("force", bool, "store it even if it repeats a live record's text",
                  "Store even if the same text is already stored.", default=False)
TAGS_FILTER = Param("tags", list, "comma-separated; a hit needs at least one",
                    "Only records with at least one of these tags.", cli_kind=str, text=TAG_TEXT,
                    max_items=MAX_TAGS, invalid=(codes.QUERY_INVALID_TAGS, "tags must be a list of strings"))

SCOPES = ("project", "user", "all")  # which memory a verb reads: this project's, the user-level one, or both
WRITE_SCOPE = Param("scope", str, "project (default): this project's memory; user: the user-level memory in your data "
                    "folder (knowledge that is not about one project)", "Which memory: \"project\" (the default: "
                    "this project's) or \"user\" (your user-level memory, for what is not about one project: "
                    "preferences, habits, tool knowledge).", choices=SCOPES[:2],
                    invalid=(codes.QUERY_INVALID_SCOPE, "scope must be project or user"))
READ_SCOPE = Param("scope", str, "project, user, or all: both memories in one ranking (default: all once a "
                   "user-level memory exists, else project)", "Which memory to search: \"project\", \"user\" (your "
                   "user-level memory) or \"all\" (both, in one ranking; each hit's `memory` says which). Default: "
                   "all once a user-level memory exists.", choices=SCOPES,
                   invalid=(codes.QUERY_INVALID_SCOPE, "scope must be one of project, user, all"))

ADD = (
    Param("type", str, "learning|handoff|critic|research (or a configured type)",
          f"What kind of memory this is: {TYPE_NAMES} (or a type the project configured). Example: \"learning\".",
          required=True, text=RECORD_TYPE),
    Param("title", str, None, "One line: the point, findable later. Example: \"Pin pnpm with corepack: CI cache "
          "broke on lockfile drift\".", required=True, text=Text(1, MAX_TITLE, ONE_LINE)),
    Param("body", str, "body text (else --body-file, else stdin)",
          "The details: rationale, evidence, commands. May be empty.", tool_default="", text=Text(None, MAX_BODY)),
    Param("body_file", str, "read the body from this file ('-' for stdin)"),
    Param("tags", list, "comma-separated tags", "Labels for filtering, e.g. [\"ci\", \"pnpm\"].", cli_kind=str,
          text=TAG_TEXT, max_items=MAX_TAGS),
    Param("phase", str, None, "The plan phase this belongs to, hierarchical, e.g. \"M005-S007-T0002\".", text=PHASE),
    Param("provenance", str, "|".join(PROVENANCES),
          "How sure this is: VERIFIED (checked), CITED (from a source), ASSUMED (inferred), CACHED (copied from an "
          "earlier answer). Shown as a label in markdown answers.", tool_choices=PROVENANCES),
    Param("id", str, "record id (default: a new UUIDv4)",
          "Your own stable id (letters, digits, ._:@/+-); a new UUID when left out.", text=RECORD_ID),
    Param("created_at", str, "ISO-8601 timestamp (default: now)"),
    Param("supersedes", str, "id of the live record this one replaces (it leaves all results)",
          "The id of a record this one replaces (a correction or a newer decision); that record is retired.",
          text=RECORD_ID),
    Param("importance", float, "0..1; reorders near-ties in results (default: unset)",
          "0..1; nudges ranking between near-equal hits (0.5 is neutral).", ge=0, le=1),
    Param("valid_until", str, "ISO-8601 time with a zone from which the record retires by itself (expired)",
          "When this stops being true (ISO-8601 with a zone), e.g. \"2026-12-31T00:00:00Z\": from then on it "
          "leaves all results by itself (memory_get shows it as expired).", time=True),
    Param("anchors", list, "code this record cites, PATH or PATH:START-END relative to the project root "
          "(repeatable); checked on every read", "Code this memory is about, each \"PATH\" or \"PATH:START-END\" "
          "relative to the project root, e.g. [\"src/net/retry.py:40-58\"]. Every recall says whether that code is "
          "still there (verified, moved, drifted, missing).", append=True, cli_flag="--anchor", metavar="PATH[:A-B]",
          text=Text(1, 1100), max_items=32),
    Param("hot", bool, "include it in every memory-context block (pinned; memory-unpin undoes it)",
          "Pin it: every memory_context block includes it, whatever the task (a standing rule, preference or fact "
          "of this project). Keep hot memories few and short: together they take at most 40 % of the block.",
          default=False),
    Param("domain", str, "a bucket for this record, one word (fact, conversation, finding, ...); read verbs filter "
          "by it with --domain", "A bucket for this memory, one word a tool or agent chooses, e.g. \"fact\", "
          "\"conversation\", \"finding\"; queries can then be limited to it. Optional.", text=DOMAIN),
    FORCE_ADD,
    WRITE_SCOPE,
)

QUERY_DOMAIN = Param("domain", str, "only records of this domain (records without one are left out)",
                     "Only memories of this domain (set on write, e.g. \"fact\"); memories without a domain are left "
                     "out. Leave it out to search every memory.", text=DOMAIN,
                     invalid=(codes.QUERY_INVALID_DOMAIN, "domain must be one word of letters, digits, _ . -"))

QUERY = (
    Param("positional", list, "query text (or --text)", cli="positional", nargs="*", metavar="TEXT"),
    Param("text", str, None, "What you are about to work on, in your own words. Example: \"why does the CI cache "
          "miss after a pnpm upgrade?\".", tool_required=True, text=Text(1, MAX_QUERY_CHARS)),
    Param("k", int, "number of hits (default 8)", f"How many hits at most (1-{MAX_K}).", default=8, ge=1, le=MAX_K,
          invalid=(codes.QUERY_INVALID_K, f"k must be an integer in 1..{MAX_K}")),
    Param("type", str, "only records of this type (an unknown type is an error listing the types)",
          f"Only records of this type: {TYPE_NAMES} (or a type the project configured). An unknown type is an error "
          "that lists the allowed ones.", text=RECORD_TYPE),
    Param("phase", str, "only this phase and the phases under it (M001 finds M001-S002-T0001)",
          "Only records of this phase and the phases under it: \"M001\" matches \"M001-S002-T0001\".", text=PHASE),
    Param("phase_exact", bool, "--phase matches that phase only", "Match `phase` exactly instead of as a prefix.",
          default=False),
    TAGS_FILTER,
    QUERY_DOMAIN,
    Param("alpha", float, "lexical weight in [0, 1] (default from config)",
          "The vector side's weight for fusion alpha, 0..1 (default 0.3).", ge=0, le=1,
          invalid=(codes.QUERY_INVALID_ALPHA, "alpha must be a number in [0, 1]")),
    Param("fusion", str, None, "How hybrid combines its two sides: z (the default: each side standardised over the "
          "candidates), alpha (a weighted sum), rrf (reciprocal rank fusion).", choices=FUSIONS,
          invalid=(codes.QUERY_INVALID_FUSION, f"fusion must be one of {list(FUSIONS)}")),
    Param("since", str, "only records created at or after this ISO-8601 time, e.g. 2026-11-01T00:00:00Z",
          "Only records created at or after this time (ISO-8601 with a zone), e.g. \"2026-11-01T00:00:00Z\".",
          time=True, invalid=(codes.QUERY_INVALID_SINCE, "since must be an ISO-8601 time with a zone, e.g. "
                              "2026-11-01T00:00:00Z")),
    Param("as_of", str, "answer from the memory as it stood at this ISO-8601 time (records created by then, "
          "not yet retired or expired)", "Answer from the memory as it stood at this time (ISO-8601 with a zone), "
          "e.g. \"2026-11-01T00:00:00Z\": records created by then and not yet retired or expired then.",
          time=True, invalid=(codes.QUERY_INVALID_AS_OF, "as_of must be an ISO-8601 time with a zone, e.g. "
                              "2026-11-01T00:00:00Z")),
    Param("branch", str, "current: only records merged into the checked-out line of work (their commit is an "
          "ancestor of HEAD) or written outside git", "\"current\": only records whose commit is merged into the "
          "checked-out HEAD, or written outside git (drops notes from unmerged branches).", choices=BRANCHES,
          invalid=(codes.QUERY_INVALID_BRANCH, f"branch must be one of {list(BRANCHES)}")),
    Param("explain", bool, "show each hit's score parts", "Add each hit's per-side scores and ranks.", default=False),
    Param("no_collapse", bool, "list near duplicates as separate hits (default: the newest of them, counted)",
          default=False),
    Param("mode", str, "rank by both signals (default) or by one only; lexical never loads the model",
          "hybrid (keywords + meaning, the default), lexical (keywords only, BM25), vector (meaning only).",
          default="hybrid", choices=MODES, invalid=(codes.QUERY_INVALID_MODE, f"mode must be one of {list(MODES)}")),
    Param("max_tokens", int, "keep the best hits that fit this many tokens (chars/4)",
          f"Keep the best hits that fit this many tokens (about 4 characters each); default {MCP_MAX_TOKENS}. Hits "
          "left out are counted in `budget`.", tool_default=MCP_MAX_TOKENS, ge=1, le=MAX_TOKENS,
          invalid=(codes.QUERY_INVALID_MAX_TOKENS, "max_tokens must be a positive integer")),
    Param("format", str, "json (default), or markdown (md): a context block ready to inject",
          "json: the hits as data. markdown: a context block ready to paste into a prompt (the data is still in the "
          "structured content).", default="json", choices=FORMATS + tuple(FORMAT_ALIASES), tool_choices=FORMATS),
    READ_SCOPE,
)

GET = (
    Param("ids", list, "record ids (from hits, duplicate_of, supersedes)", "Record ids, e.g. from a hit's `id` or an "
          "add's `duplicate_of`. Example: [\"md:482d2da39a74bb7425f2087d\"].", required=True, cli="positional",
          nargs="+", metavar="ID", text=RECORD_ID, min_items=1, max_items=MAX_GET),
    Param("history", bool, "every version of each id in log order, with what replaced or retired it and when",
          "Add each id's versions in log order (live or not), each with what replaced or retired it and when.",
          default=False),
    WRITE_SCOPE,
)

FORGET = (
    Param("ids", list, "record ids to retire", "The ids of the records to retire. Example: [\"3f2c…\"].",
          required=True, cli="positional", nargs="+", metavar="ID", text=RECORD_ID, min_items=1,
          max_items=MAX_FORGET),
    Param("reason", str, "why (kept in the tombstone; default: forgotten)", "Why, in one line; shown by memory_get. "
          "Example: \"superseded by the Node 20 decision\".", default="forgotten",
          text=Text(1, MAX_REASON, ONE_LINE)),
    WRITE_SCOPE,
)

REDACT = (
    Param("ids", list, "record ids whose text must leave the memory", required=True, cli="positional", nargs="+",
          metavar="ID"),
    Param("reason", str, "why (kept in the content-free redact line)", default="redacted"),
)

INGEST = (
    Param("paths", list, "markdown files or folders, relative to the project root",
          "Markdown files or folders, relative to the project root. Example: [\"CLAUDE.md\", \"docs\"]. A path that "
          "does not exist is an error (ingest-path-missing).", required=True, cli="positional", nargs="+",
          metavar="PATH", text=GLOB, min_items=1, max_items=1000),
    Param("include", list, "only files matching (repeatable; default *.md, *.markdown)",
          "Only files matching these globs, e.g. [\"docs/**/*.md\"].", append=True, metavar="GLOB", text=GLOB),
    Param("exclude", list, "skip files matching (repeatable)", "Leave out files matching these globs, e.g. "
          "[\"docs/drafts/**\"].", append=True, metavar="GLOB", text=GLOB),
    Param("prune_missing", bool, "retire chunks of files under these paths that no longer exist",
          "Retire the chunks of files that no longer exist under the given paths (and accept a path that no longer "
          "exists when the memory holds chunks under it).", default=False),
    Param("type", str, "record type (default: learning for files with a frontmatter category, else research)",
          "The type of the records made; default research, or a file's frontmatter category.", text=RECORD_TYPE),
    Param("domain", str, "the domain of every chunk written (one word; chunks already stored keep theirs)",
          "The domain of every chunk written, e.g. \"docs\" (chunks whose text is already stored keep theirs).",
          text=DOMAIN),
)

INDEX = (
    Param("records_file", str, "JSON array or JSONL file, '-' for stdin", required=True),
    Param("force", bool, "store exact duplicates of live records too", default=False),
    WRITE_SCOPE,
)
PRUNE = (
    Param("unused_for", str, "window such as 90d, 12h or 2w"),
    Param("anchors_missing", bool, "instead: retire records all of whose cited files are gone (memory-verify "
          "lists them)", default=False),
    Param("dry_run", bool, "report what would be retired, retire nothing", default=False),
)
VERIFY = (Param("update", bool, "record where moved code is now (an append-only log operation per record)",
                default=False),)
DROP_NAMESPACE = (
    Param("namespace", str, "the namespace to delete (memory-namespaces lists them)", required=True,
          cli="positional", metavar="NAMESPACE"),
    Param("yes", bool, "really delete it, for every machine", default=False),
)
EXPORT = (Param("file", str, "where to write the records.jsonl (replaced atomically)", required=True,
                cli="positional", metavar="FILE"),)
IMPORT = (Param("file", str, "a records.jsonl (of this or another store)", required=True, cli="positional",
                metavar="FILE"),)
REBUILD = (Param("reembed", bool, "embed every record again instead of reusing vectors of unchanged text",
                 default=False),)
EVAL = (
    Param("beir", list, "BEIR folder(s): corpus.jsonl, queries.jsonl, qrels/<split>.tsv; several are scored one "
          "memory each and averaged over their questions", required=True, nargs="+", metavar="DIR"),
    Param("split", str, None, default="test"),
    Param("mode", str, "hybrid: the configured fusion; alpha, rrf: the other fusions; or one side", default="all",
          choices=(*EVAL_MODES, "all")),
    Param("keep_identical_ids", bool, "count a hit whose id equals the query's id (BEIR's protocol drops it)",
          default=False),
    Param("report", str, "also write the results as a markdown table", metavar="FILE"),
    Param("k", int, None, default=10),
    Param("alpha", float, None),
    Param("max_queries", int, "evaluate only the first N judged queries"),
    Param("no_cache", bool, "do not reuse or store dataset embeddings", default=False),
)
SERVE = (Param("idle_timeout", float, "stop after this many seconds without a request (default: never)",
               default=0.0),)
HTTP = (
    Param("host", str, "address to bind (default 127.0.0.1; any other needs the bearer token in "
          "~/.config/nubos-memory/http-token, created on first use)", default="127.0.0.1", metavar="ADDR"),
    Param("port", int, f"TCP port (default {HTTP_PORT}; 0: any free port, printed at start)", default=HTTP_PORT,
          ge=0, le=65535),
    Param("allow_host", list, "another name clients reach this server by (a Host header to accept; repeatable)",
          append=True, metavar="NAME"),
)

DOCTOR = (
    Param("format", str, "text (default): the report for a person; json: the same report as data",
          default="text", choices=("text", "json")),
)

HYPE = (Param("limit", int, "at most this many records (default: every record waiting)", ge=1),)
SUMMARISE = (
    Param("type", str, "instead of near duplicates: every live record of this type, once it holds --min-size of "
          "them (merged in groups of 20, oldest first)", text=RECORD_TYPE),
    Param("min_size", int, "with --type: the fewest records of the type worth summarising (default 10)", default=10,
          ge=2),
    Param("similarity", float, "cosine at which records are near duplicates (default memory.near_duplicate)",
          ge=0.5, le=1),
    Param("max_groups", int, "merge at most this many groups in one run (default 20)", default=20, ge=1, le=1000),
    Param("dry_run", bool, "ask the generator and show each group before and after; write nothing", default=False),
)
HARVEST = (Param("transcript", str, "a JSONL file of turns ({role, content}) or a markdown/text transcript",
                 required=True, cli="positional", metavar="TRANSCRIPT"),)

QUERY_PARAMS = {p.name: p for p in QUERY}

SETTLE = (WRITE_SCOPE,)
PIN = (Param("ids", list, "record ids to pin: memory-context includes them in every block", required=True,
             cli="positional", nargs="+", metavar="ID", text=RECORD_ID, min_items=1, max_items=MAX_FORGET),
       WRITE_SCOPE)
UNPIN = (Param("ids", list, "record ids to unpin (the records stay; they are no longer hot)", required=True,
               cli="positional", nargs="+", metavar="ID", text=RECORD_ID, min_items=1, max_items=MAX_FORGET),
         WRITE_SCOPE)
MAX_RECENT = 20
CONTEXT = (
    QUERY_PARAMS["positional"],
    Param("text", str, None, "What this turn is about: the user's message or the task, in your own words. Example: "
          "\"add retry with backoff to the upload client\".", tool_required=True, text=Text(1, MAX_QUERY_CHARS)),
    Param("max_tokens", int, f"the block's budget in tokens (chars/4; default {MCP_MAX_TOKENS}); hot records take "
          "at most two fifths", f"The whole block's budget in tokens (about 4 characters each); default {MCP_MAX_TOKENS}. "
          "Hot memories take at most 40 % of it; what is left out is listed in `budget.left_out`.",
          default=MCP_MAX_TOKENS, ge=1, le=MAX_TOKENS,
          invalid=(codes.QUERY_INVALID_MAX_TOKENS, "max_tokens must be a positive integer")),
    QUERY_PARAMS["k"],
    QUERY_DOMAIN,
    Param("recent", int, "newest handoff records to include (default 3)", f"How many of the newest handoff records "
          f"(what earlier sessions left for the next one) to include, 0-{MAX_RECENT}.", default=3, ge=0,
          le=MAX_RECENT, invalid=(codes.CONTEXT_INVALID_RECENT, f"recent must be an integer in 0..{MAX_RECENT}")),
    QUERY_PARAMS["format"],
    READ_SCOPE,
)
CONTEXT_PARAMS = {p.name: p for p in CONTEXT}

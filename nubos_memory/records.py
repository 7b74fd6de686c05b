"""Record schema: validation of single records and whole batches.

A record is one line of ``records.jsonl``.  Schema v1's fields are always
written; v2 added optional ones, written only when set, so every v1 record is
still a valid v2 record::

    {"id", "type", "phase", "title", "body", "tags", "provenance", "created_at",
     "source_file"?, "chunk_index"?, "heading"?, "importance"?, "supersedes"?,
     "anchors"?, "git"?, "valid_until"?, "hot"?, "domain"?}

``anchors`` cite code (``api/anchors.py`` stamps and checks them); ``git`` is where a record was
written (branch, commit, worktree); ``valid_until`` retires a record by itself from that time on; ``hot``
(written only when true) puts a record in every ``memory-context`` block until ``memory-unpin``;
``domain`` is a bucket a tool or agent sorts records into (``fact``, ``conversation``, ``finding``, ...:
one word, a filter on every read verb, never required; not the Postgres store's namespace, which names
a whole memory).

Every field error has its own stable code (``record-invalid-type``,
``record-missing-title``, ...) and names the record by its position in the
batch and its id.  A batch is validated whole before anything is written.

Before a record is stored, reasoning blocks (``<think>…</think>``,
``<scratch_pad>…</scratch_pad>``, unclosed ones too) are cut from its title
and body: a model's private reasoning must never come back in a prompt.  A
record that was only reasoning is refused (``record-only-reasoning``).
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any, cast

from . import codes
from .errors import InputError
from .limits import (
    DOMAIN_PATTERN,
    ID_PATTERN,
    MAX_BATCH,
    MAX_BODY,
    MAX_CHUNK_INDEX,
    MAX_DOMAIN,
    MAX_ECHO,
    MAX_ID,
    MAX_PHASE,
    MAX_REASON,
    MAX_SOURCE,
    MAX_TAG,
    MAX_TAGS,
    MAX_TITLE,
    PHASE_SEPARATORS,
    PROVENANCES,
)
from .types import Record

__all__ = ["EMBED_TEMPLATE", "FIELDS", "ID_PATTERN", "MAX_BODY", "MAX_REASON", "MAX_TITLE", "OPTIONAL_FIELDS",
           "PROVENANCES", "SCHEMA_VERSION", "Record", "check_record", "content_hash", "embed_text", "lexical_text",
           "normalise_record", "read_record", "validate_batch"]

SCHEMA_VERSION = 2
FIELDS = ("id", "type", "phase", "title", "body", "tags", "provenance", "created_at")
OPTIONAL_FIELDS = ("source_file", "chunk_index", "heading", "importance", "supersedes", "anchors", "git",
                   "valid_until", "hot", "domain")
MAX_ANCHORS = 32
ANCHOR_KEYS = ("path", "lines", "sha", "head", "commit")
GIT_KEYS = ("branch", "commit", "worktree")

# The text embedded for a record; the manifest records this description, so a change of the rule
# is a change of fingerprint (adr/0002 has the data that chose it).
EMBED_TEMPLATE = "{title}:\n{body} (no colon after a title ending in .:!?; and the title alone without a body)"
_TITLE_ENDS = (".", ":", "!", "?", ";")

_ID = re.compile(ID_PATTERN + r"\Z")
_DOMAIN = re.compile(DOMAIN_PATTERN + r"\Z")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

_REASONING = r"(?:think|thinking|scratch_pad|scratchpad)"
# A block, closed or not (an unclosed one runs to the end of the text) ...
_REASONING_BLOCK = re.compile(rf"<({_REASONING})\b[^>]*>.*?(?:</\1\s*>|\Z)", re.I | re.S)
# ... and a closing tag whose opening was cut off: everything before it was reasoning.
_REASONING_TAIL = re.compile(rf"\A.*?</{_REASONING}\s*>", re.I | re.S)


def strip_reasoning(text: str) -> str:
    """``text`` without reasoning blocks (see module docstring)."""
    if "<" not in text:
        return text
    out = _REASONING_TAIL.sub("", _REASONING_BLOCK.sub("", text))
    return out.strip() if out != text else text


def now_iso() -> str:
    """The current UTC time as ``YYYY-MM-DDTHH:MM:SS.ffffffZ``."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def iso_to_epoch(value: Any) -> float | None:
    """Seconds since the epoch of an ISO-8601 timestamp with a zone, else None."""
    return _epoch(value) if isinstance(value, str) else None


@lru_cache(maxsize=1 << 14)  # (a query orders each hit's near duplicates by time: records written together share one)
def _epoch(value: str) -> float | None:
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed.timestamp() if parsed.tzinfo is not None else None


def recency(record: Record) -> tuple[float, str]:
    """How new a statement is, by its own time, never by where its line sits in the log (a git merge
    or rebase orders lines by who pulled): ``created_at``, then the id to break a tie the same way on
    every machine.  A record without a time counts as the oldest."""
    epoch = iso_to_epoch(record.get("created_at"))
    return (float("-inf") if epoch is None else epoch, record["id"])


def epoch_to_iso(t: float | None) -> str | None:
    return None if t is None else datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def one_line(value: Any, limit: int) -> bool:
    """Whether ``value`` is 1-``limit`` characters of text without control characters."""
    return isinstance(value, str) and len(value.strip()) > 0 and len(value) <= limit and not _CONTROL.search(value)


def phase_matches(phase: str | None, wanted: str, *, exact: bool = False) -> bool:
    """Whether a record's ``phase`` is ``wanted`` or, unless ``exact``, lies under it in the phase
    hierarchy: ``M001`` matches ``M001`` and ``M001-S002-T0001``, not ``M0012``."""
    if phase is None:
        return False
    if phase == wanted or exact or not phase.startswith(wanted):
        return phase == wanted
    return wanted[-1] in PHASE_SEPARATORS or phase[len(wanted)] in PHASE_SEPARATORS


def valid_importance(value: Any) -> bool:
    """Whether ``value`` is an importance: a number from 0 to 1 (not a bool)."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and 0 <= value <= 1


def valid_id(value: Any) -> bool:
    """Whether ``value`` is a well-formed record id."""
    return isinstance(value, str) and 0 < len(value) <= MAX_ID and bool(_ID.match(value))


def derived_id(record: dict[str, Any]) -> str:
    """A stable id for a log line written without one: a hash of its content (adr/0008)."""
    body = {k: v for k, v in record.items() if k != "id"}
    digest = hashlib.sha256(json.dumps(body, sort_keys=True, ensure_ascii=False).encode("utf-8")).hexdigest()
    return f"line-{digest[:24]}"


def embed_text(record: Record) -> str:
    """The text that is embedded for a record (``EMBED_TEMPLATE``): the title, a colon, and the body
    on the next line.  The colon tells the model the title is a label for what follows (a speaker,
    a heading, a learning's point): on LoCoMo it lifted vector recall@10 from 0.457 to 0.508, on
    SciFact it changed nothing."""
    title, body = record["title"], record.get("body") or ""
    if not body:
        return title
    return f"{title}{chr(10) if title.endswith(_TITLE_ENDS) else ':' + chr(10)}{body}"


def content_hash(text: str) -> str:
    """A stable hash of embedded text; unchanged text is never re-embedded."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def lexical_text(record: Record) -> str:
    """The text BM25 indexes: title, body and tags."""
    return "\n".join((record["title"], record.get("body") or "", " ".join(record.get("tags") or ())))


# The codes of the fields _single_line and _utf8 check: one code per field (codes.py).
_INVALID = {"title": codes.RECORD_INVALID_TITLE, "body": codes.RECORD_INVALID_BODY, "tags": codes.RECORD_INVALID_TAGS,
            "phase": codes.RECORD_INVALID_PHASE, "heading": codes.RECORD_INVALID_HEADING}
_MISSING = {"title": codes.RECORD_MISSING_TITLE}


class _Fail(Exception):
    def __init__(self, code: str, message: str, field: str):
        self.code, self.message, self.field = code, message, field


def _utf8(value: str, field: str) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise _Fail(_INVALID[field], f"{field} is not valid Unicode text", field) from None


def _single_line(value: Any, field: str, limit: int, *, required: bool) -> str | None:
    if value is None:
        if required:
            raise _Fail(_MISSING[field], f"{field} is required", field)
        return None
    if not isinstance(value, str):
        raise _Fail(_INVALID[field], f"{field} must be a string", field)
    _utf8(value, field)
    value = value.strip()
    if not value and required:
        raise _Fail(_MISSING[field], f"{field} must not be empty", field)
    if len(value) > limit:
        raise _Fail(codes.RECORD_TOO_LARGE, f"{field} is longer than {limit} characters", field)
    if _CONTROL.search(value):
        raise _Fail(_INVALID[field], f"{field} must not contain control characters", field)
    return value or None


def echo(text: str) -> str:
    """A caller's string as an answer or an error repeats it: at most ``MAX_ECHO`` characters."""
    return text if len(text) <= MAX_ECHO else text[: MAX_ECHO - 1] + "…"


def _shown(value: Any) -> str:
    """A refused value as an error repeats it: a string's ``echo``, else its type."""
    return repr(echo(value)) if isinstance(value, str) else f"a non-string ({type(value).__name__})"


def _tags(value: Any) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise _Fail(codes.RECORD_INVALID_TAGS, "tags must be a list of strings", "tags")
    if len(value) > MAX_TAGS:
        raise _Fail(codes.RECORD_INVALID_TAGS, f"at most {MAX_TAGS} tags", "tags")
    out: list[str] = []
    for tag in value:
        if not isinstance(tag, str):
            raise _Fail(codes.RECORD_INVALID_TAGS, "every tag must be a string", "tags")
        _utf8(tag, "tags")
        tag = tag.strip()
        if not tag or len(tag) > MAX_TAG or "," in tag or _CONTROL.search(tag):
            raise _Fail(
                codes.RECORD_INVALID_TAGS,
                f"tag {_shown(tag)} must be 1-{MAX_TAG} characters without commas or control characters",
                "tags",
            )
        if tag not in out:
            out.append(tag)
    return out


def _optional(raw: dict[str, Any], out: dict[str, Any]) -> None:
    """Validate the v2 optional fields present in ``raw`` into ``out``."""
    source = raw.get("source_file")
    if source is not None:
        if not isinstance(source, str) or not source.strip() or len(source) > MAX_SOURCE or _CONTROL.search(source):
            raise _Fail(codes.RECORD_INVALID_SOURCE_FILE, f"source_file must be a path of 1-{MAX_SOURCE} characters",
                        "source_file")
        out["source_file"] = source
    index = raw.get("chunk_index")
    if index is not None:
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index <= MAX_CHUNK_INDEX:
            raise _Fail(codes.RECORD_INVALID_CHUNK_INDEX, "chunk_index must be a non-negative integer", "chunk_index")
        out["chunk_index"] = index
    heading = _single_line(raw.get("heading"), "heading", MAX_TITLE, required=False)
    if heading is not None:
        out["heading"] = heading
    importance = raw.get("importance")
    if importance is not None:
        if not valid_importance(importance):
            raise _Fail(codes.RECORD_INVALID_IMPORTANCE, "importance must be a number from 0 to 1", "importance")
        out["importance"] = float(importance)
    replaces = raw.get("supersedes")
    if replaces is not None:
        if not valid_id(replaces):
            raise _Fail(codes.RECORD_INVALID_SUPERSEDES, "supersedes must be the id of the record this one replaces",
                        "supersedes")
        out["supersedes"] = replaces
    _about_the_code(raw, out)


def _about_the_code(raw: dict[str, Any], out: dict[str, Any]) -> None:
    """The fields that tie a record to the code and to time: anchors, git, valid_until; and hot, domain."""
    if raw.get("anchors") is not None:
        out["anchors"] = _anchors(raw["anchors"])
    if raw.get("git") is not None:
        out["git"] = _git(raw["git"])
    if raw.get("valid_until") is not None:
        out["valid_until"] = _time(raw["valid_until"], codes.RECORD_INVALID_VALID_UNTIL, "valid_until")
    hot = raw.get("hot")
    if hot is not None and type(hot) is not bool:
        raise _Fail(codes.RECORD_INVALID_HOT, "hot must be true or false", "hot")
    if hot:  # pinned on write (memory-context); false is the default and is not written
        out["hot"] = True
    if raw.get("domain") is not None:
        if not is_domain(raw["domain"]):
            raise _Fail(codes.RECORD_INVALID_DOMAIN, f"domain is one word of letters, digits, _ . - (at most "
                        f"{MAX_DOMAIN} characters), e.g. \"fact\"", "domain")
        out["domain"] = raw["domain"]


def is_domain(value: object) -> bool:
    """Whether ``value`` is a domain: one identifier-like word (``fact``, ``hot``, ``tool.search``)."""
    return isinstance(value, str) and len(value) <= MAX_DOMAIN and _DOMAIN.match(value) is not None


def _anchor(value: Any) -> dict[str, Any]:
    """One anchor: ``PATH`` / ``PATH:START-END`` (a write's shorthand) or ``{path, lines?, ...}``."""
    if isinstance(value, str):
        m = re.fullmatch(r"(.+?)(?::(\d+)(?:-(\d+))?)?", value.strip())
        value = {"path": m.group(1)} if m else {}
        if m and m.group(2):
            value["lines"] = [int(m.group(2)), int(m.group(3) or m.group(2))]
    if not isinstance(value, dict) or set(value) - set(ANCHOR_KEYS):
        raise _Fail(codes.RECORD_INVALID_ANCHORS, f"an anchor is PATH, PATH:START-END or an object of "
                    f"{list(ANCHOR_KEYS)}", "anchors")
    path = value.get("path")
    if (not isinstance(path, str) or not path.strip() or len(path) > MAX_SOURCE or _CONTROL.search(path)
            or path.startswith(("/", "\\")) or ".." in path.replace("\\", "/").split("/")):
        raise _Fail(codes.RECORD_INVALID_ANCHORS, "an anchor's path is relative to the project root and stays inside "
                    "it (no '..', not absolute)", "anchors")
    out: dict[str, Any] = {"path": path}
    lines = value.get("lines")
    if lines is not None:
        if (not isinstance(lines, list) or len(lines) != 2 or any(isinstance(n, bool) or not isinstance(n, int)
                                                                   for n in lines) or not 1 <= lines[0] <= lines[1]):
            raise _Fail(codes.RECORD_INVALID_ANCHORS, "an anchor's lines are [START, END], 1 <= START <= END",
                        "anchors")
        out["lines"] = list(lines)
    for key in ("sha", "head", "commit"):
        got = value.get(key)
        if got is not None:
            if not isinstance(got, str) or not re.fullmatch(r"[0-9a-f]{1,64}", got):
                raise _Fail(codes.RECORD_INVALID_ANCHORS, f"an anchor's {key} is a hex digest", "anchors")
            out[key] = got
    return out


def valid_anchors(value: Any) -> list[dict[str, Any]] | None:
    """``value`` as stored anchors, or None when it is not a list of valid ones (the log's ``anchor`` op)."""
    try:
        return _anchors(value)
    except _Fail:
        return None


def _anchors(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list) or len(value) > MAX_ANCHORS:
        raise _Fail(codes.RECORD_INVALID_ANCHORS, f"anchors are a list of at most {MAX_ANCHORS}", "anchors")
    return [_anchor(a) for a in value]


def _git(value: Any) -> dict[str, str | None]:
    if (not isinstance(value, dict) or set(value) - set(GIT_KEYS)
            or any(v is not None and (not isinstance(v, str) or len(v) > MAX_SOURCE or _CONTROL.search(v))
                   for v in value.values())):
        raise _Fail(codes.RECORD_INVALID_GIT, f"git is an object of {list(GIT_KEYS)} (strings or null)", "git")
    return {k: value.get(k) for k in GIT_KEYS}


def _time(value: Any, code: str, field: str) -> str:
    if not isinstance(value, str) or len(value) > 64:
        raise _Fail(code, f"{field} must be an ISO-8601 string", field)
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise _Fail(code, f"{field} {value!r} is not ISO-8601", field) from None
    if parsed.tzinfo is None:
        raise _Fail(code, f"{field} must carry a time zone (e.g. Z)", field)
    return value


def _created_at(value: Any, stored: bool) -> str | None:
    if value is None:
        return None if stored else now_iso()
    if not isinstance(value, str) or len(value) > 64:
        raise _Fail(codes.RECORD_INVALID_CREATED_AT, "created_at must be an ISO-8601 string", "created_at")
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise _Fail(codes.RECORD_INVALID_CREATED_AT, f"created_at {value!r} is not ISO-8601", "created_at") from None
    if parsed.tzinfo is None:
        raise _Fail(codes.RECORD_INVALID_CREATED_AT, "created_at must carry a time zone (e.g. Z)", "created_at")
    return value


def _title_and_body(title: Any, body: Any, *, write: bool) -> tuple[str, str]:
    """A record's checked title and body; a ``write`` drops reasoning blocks from both."""
    if body is None:
        body = ""
    if not isinstance(body, str):
        raise _Fail(codes.RECORD_INVALID_BODY, "body must be a string", "body")
    _utf8(body, "body")
    if write and isinstance(title, str):  # a write: reasoning never reaches the store
        _utf8(title, "title")
        clean_title, clean_body = strip_reasoning(title), strip_reasoning(body)
        if (clean_title, clean_body) != (title, body) and not clean_title.strip() and not clean_body.strip():
            raise _Fail(codes.RECORD_ONLY_REASONING, "the record holds only reasoning blocks (<think>, <scratch_pad>); "
                        "nothing is stored", "record")
        title, body = clean_title, clean_body
    title = _single_line(title, "title", MAX_TITLE, required=True)
    if len(body) > MAX_BODY:
        raise _Fail(codes.RECORD_TOO_LARGE, f"body is longer than {MAX_BODY} characters", "body")
    return cast(str, title), body


def _provenance(prov: Any) -> str | None:
    """A record's provenance in upper case, or None."""
    if prov is None:
        return None
    if not isinstance(prov, str) or prov.upper() not in PROVENANCES:
        raise _Fail(
            codes.RECORD_INVALID_PROVENANCE, f"provenance must be one of {list(PROVENANCES)} or null", "provenance"
        )
    return prov.upper()


def normalise_record(raw: Any, types: Iterable[str] | None) -> Record:
    """Validate one record and return it in canonical form (field order of the spec).

    ``types=None`` means the record is being *read* from the log: any type
    word is accepted (a project that removes a custom type still sees its old
    records) and nothing is invented (a missing ``created_at`` stays null, so
    reading the same line twice gives the same record).
    """
    if not isinstance(raw, dict):
        raise _Fail(codes.RECORD_NOT_OBJECT, "a record must be a JSON object", "record")
    unknown = sorted(set(raw) - set(FIELDS) - set(OPTIONAL_FIELDS))
    if unknown:
        named = ", ".join(echo(str(k)) for k in unknown[:10]) + (f" (and {len(unknown) - 10} more)" if len(unknown) > 10
                                                                else "")
        raise _Fail(codes.RECORD_UNKNOWN_FIELD, f"unknown field(s): {named}", echo(str(unknown[0])))
    rid = raw.get("id")
    if rid is None:
        rid = str(uuid.uuid4()) if types is not None else ""  # read from the log: derived below
    elif not valid_id(rid):
        raise _Fail(
            codes.RECORD_INVALID_ID,
            f"id must be 1-{MAX_ID} characters of letters, digits and ._:@/+- starting with a letter or digit",
            "id",
        )
    rtype = raw.get("type")
    if rtype is None:
        raise _Fail(codes.RECORD_MISSING_TYPE, "type is required", "type")
    allowed = tuple(types) if types is not None else None
    if not isinstance(rtype, str) or (allowed is not None and rtype not in allowed) or not rtype.isidentifier():
        expected = f"one of {list(allowed)}" if allowed is not None else "a word"
        raise _Fail(codes.RECORD_INVALID_TYPE, f"type must be {expected}, got {_shown(rtype)}", "type")
    title, body = _title_and_body(raw.get("title"), raw.get("body"), write=types is not None)
    phase = _single_line(raw.get("phase"), "phase", MAX_PHASE, required=False)
    prov = _provenance(raw.get("provenance"))
    out: dict[str, Any] = {
        "id": rid,
        "type": rtype,
        "phase": phase,
        "title": title,
        "body": body,
        "tags": _tags(raw.get("tags")),
        "provenance": prov,
        "created_at": _created_at(raw.get("created_at"), stored=types is None),
    }
    _optional(raw, out)
    if not rid:  # a hand-written line without an id: the same line always gets the same id
        out["id"] = rid = derived_id(out)
    if out.get("supersedes") == rid:
        raise _Fail(codes.RECORD_INVALID_SUPERSEDES, "a record cannot supersede itself", "supersedes")
    return cast(Record, out)


def check_record(raw: Any, types: Iterable[str] | None) -> tuple[Record | None, dict[str, str] | None]:
    """``(record, None)`` when valid, else ``(None, {"code", "message", "field"})``."""
    try:
        return normalise_record(raw, types), None
    except _Fail as f:
        return None, {"code": f.code, "message": f.message, "field": f.field}


def read_record(raw: Any) -> tuple[Record | None, dict[str, str] | None]:
    """A record line of the log: ``(record, None)`` or ``(None, the error)``.  The same validator
    as a write's (``normalise_record``), reading: any type word, nothing invented."""
    return check_record(raw, None)


def validate_batch(raws: list[Any], types: Iterable[str]) -> list[Record]:
    """Validate every record; raise one :class:`InputError` naming all failures.

    The error's code is the first failure's code; ``details.errors`` lists each
    failing record's index (0-based), id and field.
    """
    types = tuple(types)
    if len(raws) > MAX_BATCH:
        raise InputError(f"a batch holds at most {MAX_BATCH} records", code=codes.BATCH_TOO_LARGE,
                         details={"count": len(raws), "limit": MAX_BATCH})
    out: list[Record] = []
    errors: list[dict[str, Any]] = []
    for i, raw in enumerate(raws):
        rec, err = check_record(raw, types)
        if rec is not None:
            out.append(rec)
            continue
        assert err is not None
        rid = raw.get("id") if isinstance(raw, dict) and isinstance(raw.get("id"), str) else None
        errors.append({"index": i, "id": None if rid is None else echo(rid), **err})  # (a refused id may be long)
    if errors:
        first = errors[0]
        where = f"record {first['index']}" + (f" (id {first['id']!r})" if first["id"] else "")
        raise InputError(
            f"{where}: {first['message']}" + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""),
            code=first["code"],
            details={"errors": errors[:100], "error_count": len(errors), "written": 0},
        )
    return out

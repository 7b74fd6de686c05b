"""The log's meaning: what its lines are, and the state they amount to, read in order.

Pure: no file, no database.  Each store (``store/``) carries the lines — a file, a table — keeps its
own cursor, and hands what follows it to :func:`feed`; so every store reads the log the same way.
The log's format, one JSON document per line (adr/0008)::

    {"id": ..., "type": ..., ...}                              a record (``records.py``)
    {"op": "forget", "id": "X", "at": "...", "reason": "..."}  X no longer appears anywhere
    {"op": "group", "lines": K, "gid": G}                      the next K lines are one change ...
    {"op": "commit", "gid": G}                                 ... which ends here
    {"op": "rollback", "gid": G}                               ... or was abandoned by a crashed writer
    {"op": "redact", "id": "X", "line_sha256": H, "at", "reason"}  in place of a record line whose text was
                                                               removed (``memory-redact``); with "copy": true,
                                                               for a line only a copy held (a backup, another
                                                               worktree's log): it retires no record by its
                                                               id, only lines with that hash
    {"op": "anchor", "id": "X", "anchors": [...], "at": "..."}  where X's cited code is now (``memory-verify``)
    {"op": "pin", "id": "X", "at": "..."}                      X is hot (``memory-pin``) ...
    {"op": "unpin", "id": "X", "at": "..."}                    ... or no longer (``memory-unpin``)
    {"op": "questions", "id": "X", "questions": [...], "model": M, "at": "..."}  questions X answers,
                                                               generated once (HyPE, ``api/hype.py``)

**HyPE questions** are derived from a record by the generator, once, and kept in the log so that
reading it again (``memory-rebuild``, another machine) gives the same questions without asking a
model: ``LogScan.questions`` maps a live record's position to the last ``questions`` op that named it
while it was live (an empty list: the model's answer held none; it is not asked again).  A record
that brings a retired id back starts without questions; a retired record's questions are never
returned (``question_map``).

**Hot records** are the ones every ``memory-context`` block includes (``api/turn.py``).  A record is
hot when its line says ``"hot": true`` (set on write) or a ``pin`` op named it while it was live,
and no later ``unpin`` did; ``LogScan.hot`` keeps the positions, so the state is the log's, rebuilt
by reading it again.  A pin or unpin applies to the live record of that id (a later record that
brings a retired id back starts from its own line), and a retired record is never hot.

A record may name the id it replaces (``"supersedes": "X"``): X is then dead
like a forgotten one.  Dead records keep their position (so every derived
array stays aligned) but never appear in results; a later record with a dead
id brings that id back, at a new position, unless it is a copy of the retired
version (the same content, ``same_content``, written no later than it was
retired): a git merge orders two branches' lines by who merged, and a
cherry-pick or a teammate's ingest of the same note brings an old line after
the retirement, which must not undo it whichever way the lines fell.  A version
retired twice (two forgets, a forget and a supersede, two supersedes) is retired
by the earlier of them, whichever line came first (``_retire_earlier``), and a
retirement never retires a version written after it (``written_by``).  A record
line without an ``id`` (written by hand) gets a stable id derived from its
content (``records.py``).

**Groups** make a change of several lines all-or-nothing for readers: a
writer appends header, lines and commit in one ``write``.  A reader applies
the group's lines when it reaches the commit line.  Hand edits, merge
conflict resolutions and reverts must never hide what is in the file, so a
damaged group is applied line by line and reported, never held back:

* a commit after fewer or more lines than the header declared: applied,
  reported (``records-group-damaged``);
* no commit after the declared lines, or another group header first: the
  lines are applied where the group should have ended, reported;
* a commit, rollback or group line that belongs to no open group: ignored,
  reported (``records-stray-op``);
* groups written before the commit line existed (no ``gid``) end after
  their K lines, as they always did.

Only two things count as *a write in progress* and are held back: bytes
after the last newline (a torn line), and a group still open at the very end
of the file.  Once no writer is running (whoever holds the write lock knows
that), the store (``RecordLog.recover_tail`` for the file) settles them by *appending*: a group
whose lines are all present gets its commit line (it is applied), one that
ends in a torn line was cut by a crash and gets a rollback line (its
complete lines stay in the file, unapplied: nobody was told they were
saved); a torn line that is a complete record only lost its newline, which
is added; any other torn bytes are copied to ``records.jsonl.torn`` and cut.
That cut is the only way bytes leave the log outside ``memory-compact``,
and those bytes were never acknowledged to anyone.

**Redaction** is the one rewrite of lines outside ``memory-compact``: ``memory-redact``
replaces each line of a record by a ``redact`` line that holds no content, only the
sha256 of the line it replaced (:func:`redact_lines`).  A line with that id and that
hash found anywhere in the log (a git merge or a cherry-pick can bring it back) is
never read as a record (nor as a record's HyPE questions): it is counted in ``redacted_present``,
and the next writer removes it again (the store's ``settle``).  ``memory-compact`` keeps the
``redact`` lines (they hold no text), so a line brought back after a compaction is still caught.

Reading tolerates damage: a line that is not valid UTF-8, JSON, a valid
record or a known operation is skipped and reported with its 1-based line
number; a repeated id of a live record keeps its first occurrence (and is reported, in
``memory-stats`` only, when the repeat's content differs: the same line twice is no problem).
"""

from __future__ import annotations

import hashlib
import math
import secrets
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, MutableMapping, MutableSequence, Sequence
from dataclasses import dataclass, field, fields
from itertools import compress
from typing import Any, cast

from . import codes
from .fsio import JSONDecodeError, dumps, loads
from .limits import MAX_QUESTIONS, MAX_REASON
from .recordlist import RecordList
from .records import content_hash, embed_text, iso_to_epoch, now_iso, read_record, valid_anchors
from .types import Problem, Record

MAX_LINE = 1 << 20  # bytes; a longer line is reported, never parsed
MAX_GROUP = 1_000_000
EXCERPT = 80
MAX_REPORTED = 1000  # problems of one kind kept in a scan (their total is always counted)

GROUP_OPS = ("group", "commit", "rollback")
# How lines become the state; derived state saved with the positions it gave (a checkpoint, the lexical
# cache) is of other rules when this changes (2: a copy of a retired version no longer brings its id back;
# 3: a record retired twice is retired by the earlier retirement; 4: a copy of any retired version, and a
# supersede's time by its record's position; 5: a redaction's death says so by its kind, ties in time;
# 6: a forget or supersede never retires a version written after it)
READ_RULES = 6
MAX_VERSIONS_CHECKED = 64  # the newest earlier versions of an id a line is compared with (``copy_of_retired``)
MAX_QUESTION_CHARS = 1000  # of one HyPE question in a questions op


@dataclass
class LogScan:
    """The state of a log: what its lines, applied in order, amount to.  :func:`feed` extends it with
    the lines that follow; each store keeps its own note of where it read (``cursor``)."""

    records: RecordList = field(default_factory=RecordList)  # every accepted record line, dead ones too
    corrupt: list[dict[str, Any]] = field(default_factory=list)
    duplicates: list[dict[str, Any]] = field(default_factory=list)
    damaged_groups: list[dict[str, Any]] = field(default_factory=list)  # applied line by line, see docstring
    stray_ops: list[dict[str, Any]] = field(default_factory=list)
    rolled_back: list[dict[str, Any]] = field(default_factory=list)  # groups a crashed writer left, never applied
    partial_tail: dict[str, Any] | None = None  # a write in progress, or a crash's leftovers
    size: int = 0  # bytes read: those applied and the unfinished tail
    lines: int = 0  # lines applied
    applied: int = 0  # bytes applied: every line before them is in this state
    cursor: Any = None  # where the store that reads this log stopped (its own, opaque here)
    generation: int = 0  # bumped on a full re-parse: positions of records may have changed
    _position: MutableMapping[str, int] | None = None  # (``position``: made from the ids on first use, or a
    # checkpoint's index of them: ``columns.Positions``)
    line_of: MutableSequence[int] = field(default_factory=list)  # index in ``records`` -> 1-based line number
    dead: dict[int, dict[str, Any]] = field(default_factory=dict)  # index -> why it is dead
    deaths: list[int] = field(default_factory=list)  # dead indexes in the order they died
    ops: int = 0  # operation lines applied (forget, anchor, pin, unpin, group, commit, rollback)
    repeats: int = 0  # lines that repeat a live record exactly (its id and content): nothing to report
    redacted: dict[str, dict[str, Any]] = field(default_factory=dict)  # id -> {at, reason, hashes} of redactions
    redacted_present: list[int] = field(default_factory=list)  # lines of redacted content found again
    redaction_checked: set[int] = field(default_factory=set)  # positions of a redacted id found not to match
    hot: set[int] = field(default_factory=set)  # positions pinned (by field or pin op); dead ones are not hot
    earlier: dict[str, list[int]] = field(default_factory=dict)  # id -> positions of its versions before the latest
    forgets: list[dict[str, Any]] | None = None  # each forget op applied, in order, while a caller collects them
    # (``applied_forgets``; None: not collected, and never kept)
    questions: dict[int, dict[str, Any]] = field(default_factory=dict)  # position -> {questions, model, at, line}
    # the content hash of each record's embedded text, by position (what its vector was made from): made on
    # first need (``fill_content_hashes``: a vector search, a checkpoint) and kept with the state in a
    # checkpoint (store/checkpoint.py), so a new process need not make them again; records never change
    content_hashes: MutableSequence[str] = field(default_factory=list)

    @property
    def position(self) -> MutableMapping[str, int]:
        """Record id -> its latest index in ``records`` (a record line is applied only when its id is new
        or retired, so the last record with an id is its latest; a restored state makes it when first
        asked: a one-shot query at a million records never does)."""
        if self._position is None:
            self._position = dict(zip(self.records.values("id"), range(len(self.records))))
        return self._position

    def question_map(self) -> dict[str, list[str]]:
        """HyPE: record id -> the questions generated for it, for every live record that has them."""
        return {self.records[p]["id"]: q["questions"] for p, q in self.questions.items()
                if p not in self.dead and q["questions"]}

    def questions_of(self, rid: str) -> list[str] | None:
        """HyPE: the questions of the live record ``rid`` (None: none generated yet, or no such record)."""
        pos = self.live(rid)
        found = self.questions.get(pos) if pos is not None else None
        return list(found["questions"]) if found is not None else None

    def hot_positions(self) -> list[int]:
        """Positions of the live hot records, in log order."""
        return sorted(p for p in self.hot if p not in self.dead)

    def ids(self) -> set[str]:
        """Ids of live records (one live record per id at most: its retired versions add nothing)."""
        if isinstance(self._position, dict):
            return {rid for rid, pos in self._position.items() if pos not in self.dead}
        live = [True] * len(self.records)
        for pos in self.dead:
            live[pos] = False
        return set(compress(self.records.values("id"), live))

    def live(self, rid: str) -> int | None:
        """The position of the live record with this id, if any."""
        pos = self.position.get(rid)
        return pos if pos is not None and pos not in self.dead else None

    @property
    def live_count(self) -> int:
        return len(self.records) - len(self.dead)

    def warnings(self, limit: int = 20) -> list[Problem]:
        """Damage worth telling every caller about, ``limit`` of each kind (``problems`` has all counts)."""
        out: list[Any] = [{"code": codes.RECORDS_CORRUPT_LINE, **c} for c in self.corrupt[:limit]]
        # (an id repeated with other content is said once, in memory-stats: problems(); not on every answer)
        out += [{"code": codes.RECORDS_GROUP_DAMAGED, **g} for g in self.damaged_groups[:limit]]
        out += [{"code": codes.RECORDS_STRAY_OP, **s} for s in self.stray_ops[:limit]]
        if self.partial_tail is not None:
            out.append({"code": codes.RECORDS_UNFINISHED_WRITE, **self.partial_tail,
                        "message": "the end of records.jsonl is a write in progress or a crashed writer's "
                                   "leftovers; it is not applied yet and is settled by the next write "
                                   "(nothing complete is ever dropped)"})
        return out

    def problems(self) -> list[dict[str, Any]]:
        """Every kind of damage, with its count and where it is (``memory-stats``)."""
        out = []
        for code, items, what in (
            (codes.RECORDS_CORRUPT_LINE, self.corrupt, "line(s) that are not valid records or operations were skipped"),
            (codes.RECORDS_DUPLICATE_ID, self.duplicates, "line(s) repeat the id of a live record with other content "
                                                      "(no forget between them); the first is kept. To keep the "
                                                      "first, run memory-compact (it drops the later lines); to "
                                                      "keep a later one, memory-forget the id and memory-add that "
                                                      "version again"),
            (codes.RECORDS_GROUP_DAMAGED, self.damaged_groups, "change(s) of several lines are damaged (a hand edit?); "
                                                           "their lines were applied one by one"),
            (codes.RECORDS_STRAY_OP, self.stray_ops, "group/commit/rollback line(s) belong to no change; ignored"),
        ):
            if items:
                out.append({"code": code, "message": f"{len(items)} {what}", "count": len(items),
                            "lines": [i["line"] for i in items[:50]]})
        if self.partial_tail is not None:
            out.append({"code": codes.RECORDS_UNFINISHED_WRITE, "message": "records.jsonl ends in an unfinished write "
                        f"from line {self.partial_tail['line']}; the next write settles it", **self.partial_tail})
        return out


def line_hash(raw: bytes) -> str:
    """What a ``redact`` line records of the line it replaced: enough to know that line again, nothing
    of its content."""
    return hashlib.sha256(raw.rstrip(b"\r\n")).hexdigest()[:32]


def _note_redaction(scan: "LogScan", op: dict[str, Any]) -> None:
    info = scan.redacted.setdefault(op["id"], {"at": op.get("at"), "reason": op.get("reason"), "hashes": set()})
    info["hashes"].add(op["line_sha256"])


def redact_op(rid: str, line_sha256: str, at: str, reason: str, *, copy: bool = False) -> dict[str, Any]:
    """The ``redact`` line that stands for a line of record ``rid`` (its ``line_hash``); ``copy``: a line only
    a copy of the log held, which retires no record by its id (the same id may be a new record elsewhere)."""
    op = {"op": "redact", "id": rid, "line_sha256": line_sha256, "at": at, "reason": reason}
    return {**op, "copy": True} if copy else op


def redactions_in(lines: Iterable[bytes]) -> list[dict[str, Any]]:
    """The ``redact`` lines among ``lines``, as they are: a store's ``rewrite`` keeps them (they hold no
    text, and a line they name that comes back later is still never read)."""
    kept = []
    for raw in lines:
        if b'"redact"' in raw:
            kind, obj, _ = classify(raw.rstrip(b"\r\n"))
            if kind == "redact":
                kept.append(obj)
    return kept


def _record_lines(lines: Sequence[bytes], ids: set[str]) -> Iterator[tuple[int, str]]:
    """The index and id of each record line of ``ids`` among ``lines`` (a HyPE questions line quotes the
    text: one too)."""
    needles = [rid.encode() for rid in ids]
    for i, raw in enumerate(lines):
        if any(n in raw for n in needles):
            kind, obj, _ = classify(raw.rstrip(b"\r\n"))
            if kind in ("record", "questions") and obj["id"] in ids:
                yield i, obj["id"]


def redact_lines(lines: list[bytes], ids: set[str], reason: str,
                 only: dict[str, set[str]] | None = None) -> tuple[list[bytes], list[str]]:
    """``lines`` (each with its newline) with every record line of ``ids`` replaced by a ``redact``
    line, and the ids whose lines were found.  With ``only`` (id -> line hashes), just the lines an
    earlier redaction named: a later record with the same id and other content is a new record."""
    at = now_iso()
    out, found = list(lines), []
    for i, rid in _record_lines(lines, ids):
        if only is None or line_hash(lines[i]) in only.get(rid, ()):
            out[i] = dumps(redact_op(rid, line_hash(lines[i]), at, reason)) + b"\n"
            found.append(rid)
    return out, found


def copied_lines(copies: Iterable[Sequence[bytes]], ids: set[str]) -> dict[str, set[str]]:
    """The ``line_hash`` of each record line of ``ids`` in these copies of the log (each a list of
    lines), by id: what ``Store.held_in_copies`` answers."""
    held: dict[str, set[str]] = {}
    for lines in copies:
        for i, rid in _record_lines(lines, ids):
            held.setdefault(rid, set()).add(line_hash(lines[i]))
    return held


def same_content(a: Record, b: Record) -> bool:
    """Whether two lines hold the same record, when written at different times (``created_at``), at
    different places in git (``git``: one note ingested by two teammates on two commits) or with their
    anchors since updated (``memory-verify --update``)."""
    return ({k: v for k, v in a.items() if k not in ("created_at", "git", "anchors", "hot")}
            == {k: v for k, v in b.items() if k not in ("created_at", "git", "anchors", "hot")})


def pin_op(rid: str, hot: bool) -> dict[str, Any]:
    """The log line that makes a record hot, or no longer (``memory-pin``, ``memory-unpin``)."""
    return {"op": "pin" if hot else "unpin", "id": rid, "at": now_iso()}


def questions_op(rid: str, questions: list[str], model: str) -> dict[str, Any]:
    """The log line that keeps the questions the generator wrote for a record (HyPE)."""
    return {"op": "questions", "id": rid, "questions": questions, "model": model, "at": now_iso()}


def _questions(scan: LogScan, op: dict[str, Any], number: int) -> None:
    """A live record's HyPE questions (the record line is unchanged)."""
    target = scan.live(op["id"])
    if target is not None:
        scan.questions[target] = {"questions": op["questions"], "model": op.get("model"), "at": op.get("at"),
                                  "line": number}


def _pin(scan: LogScan, op: dict[str, Any], number: int) -> None:
    """A live record pinned or unpinned (the record line is unchanged)."""
    target = scan.live(op["id"])
    if target is not None:
        (scan.hot.add if op["op"] == "pin" else scan.hot.discard)(target)


def hot_record(scan: LogScan, pos: int) -> Record:
    """The record at ``pos`` with ``hot`` as the log's state says (what ``memory-compact`` writes)."""
    rec = {k: v for k, v in scan.records[pos].items() if k != "hot"}
    if pos in scan.hot:
        rec["hot"] = True
    return cast(Record, rec)


def anchor_op(rid: str, anchors: list[dict[str, Any]]) -> dict[str, Any]:
    """The log line that records where a record's cited code is now (``memory-verify --update``)."""
    return {"op": "anchor", "id": rid, "anchors": anchors, "at": now_iso()}


def _reanchor(scan: LogScan, op: dict[str, Any], number: int) -> None:
    """A live record's anchors as ``memory-verify --update`` found them (the record line is unchanged)."""
    target = scan.live(op["id"])
    if target is not None:
        scan.records[target] = cast(Record, {**scan.records[target], "anchors": op["anchors"]})


def _excerpt(raw: bytes) -> str:
    return raw[:EXCERPT].decode("utf-8", "replace")


def forget_op(rid: str, reason: str = "forgotten", version: Record | None = None) -> dict[str, Any]:
    """The log line that retires a record: now, or ``version``'s ``created_at`` (the version it retires) where
    that is later (another machine's clock ahead), so that it retires that version (``written_by``)."""
    at = now_iso()
    made = version.get("created_at") if version is not None else None
    if isinstance(made, str) and (t := iso_to_epoch(made)) is not None and t > (iso_to_epoch(at) or 0.0):
        at = made
    return {"op": "forget", "id": rid, "at": at, "reason": reason}


def _gid(obj: dict[str, Any]) -> str | None:
    gid = obj.get("gid")
    return gid if isinstance(gid, str) else None


def _has_id(obj: dict[str, Any]) -> bool:
    return type(obj.get("id")) is str and bool(obj["id"])


def _group_op(obj: dict[str, Any]) -> tuple[str, Any, str | None]:
    count = obj.get("lines")
    if type(count) is int and 0 < count <= MAX_GROUP:
        return "group", obj, None
    return "corrupt", None, "group: lines must be a positive integer"


def _forget_op(obj: dict[str, Any]) -> tuple[str, Any, str | None]:
    return ("forget", obj, None) if _has_id(obj) else ("corrupt", None, "forget: id must be a non-empty string")


def _redact_op(obj: dict[str, Any]) -> tuple[str, Any, str | None]:
    if _has_id(obj) and type(obj.get("line_sha256")) is str:
        return "redact", obj, None
    return "corrupt", None, "redact: id and line_sha256 must be strings"


def _anchor_op(obj: dict[str, Any]) -> tuple[str, Any, str | None]:
    anchors = valid_anchors(obj.get("anchors"))
    if _has_id(obj) and anchors is not None:
        return "anchor", {**obj, "anchors": anchors}, None
    return "corrupt", None, "anchor: id must be a string and anchors a list of anchors"


def _pin_op(obj: dict[str, Any]) -> tuple[str, Any, str | None]:
    return (obj["op"], obj, None) if _has_id(obj) else ("corrupt", None, f"{obj['op']}: id must be a non-empty string")


def _questions_op(obj: dict[str, Any]) -> tuple[str, Any, str | None]:
    items = obj.get("questions")
    if _has_id(obj) and isinstance(items, list) and len(items) <= MAX_QUESTIONS \
            and all(type(q) is str and 0 < len(q) <= MAX_QUESTION_CHARS for q in items):
        return "questions", obj, None
    return "corrupt", None, f"questions: id must be a string and questions a list of at most {MAX_QUESTIONS} strings"


def _end_op(obj: dict[str, Any]) -> tuple[str, Any, str | None]:
    return obj["op"], obj, None  # commit or rollback


_OPS: dict[str, Callable[[dict[str, Any]], tuple[str, Any, str | None]]] = {
    "group": _group_op, "forget": _forget_op, "redact": _redact_op, "anchor": _anchor_op, "pin": _pin_op,
    "unpin": _pin_op, "questions": _questions_op, "commit": _end_op, "rollback": _end_op}


def _classify_op(obj: dict[str, Any]) -> tuple[str, Any, str | None]:
    """An operation line: its kind, by the table of known operations."""
    op = obj.get("op")
    read = _OPS.get(op) if isinstance(op, str) else None
    return read(obj) if read is not None else ("corrupt", None, f"unknown op {str(op)[:40]!r}")


def classify(raw: bytes) -> tuple[str, Any, str | None]:
    """``(kind, parsed, reason)``: kind is record, forget, redact, anchor, pin, unpin, questions, group, commit, rollback
    or corrupt."""
    if len(raw) > MAX_LINE:
        return "corrupt", None, f"line longer than {MAX_LINE} bytes"
    try:
        obj = loads(raw)
    except JSONDecodeError as exc:
        return "corrupt", None, "invalid UTF-8" if "utf-8" in str(exc).lower() else "invalid JSON"
    if type(obj) is dict and "op" in obj:
        return _classify_op(obj)
    rec, err = read_record(obj)
    if err is not None:
        return "corrupt", None, f"{err['code']}: {err['message']}"
    return "record", rec, None


@dataclass
class _Group:
    """A group being read: its lines are applied at its end (or never, if rolled back)."""

    line: int  # of the header
    declared: int
    gid: str | None
    start: int  # byte offset (in the parsed buffer) of the header
    members: list[tuple[str, Any, int, bytes]] = field(default_factory=list)  # (kind, obj, line, raw)
    notes: list[dict[str, Any]] = field(default_factory=list)  # stray ops met inside, reported on close

    @property
    def awaiting_commit(self) -> bool:
        return self.gid is not None and len(self.members) >= self.declared


def feed(scan: LogScan, data: bytes) -> int:
    """Apply the whole lines of ``data``, the log's bytes that follow ``scan.applied``; hold back a
    write in progress (a torn last line, a group still open at the end: ``partial_tail``).  Returns the
    bytes applied; the store reads again from there next time."""
    base = scan.applied
    end = data.rfind(b"\n") + 1
    _note_redactions(scan, data, end)
    scan.size = base + len(data)
    number = scan.lines
    pos = 0
    reader = _Reader(scan, number)
    while pos < end:
        nl = data.index(b"\n", pos)
        raw = data[pos:nl]
        line_start, pos = pos, nl + 1
        number += 1
        if not raw or raw.isspace():
            if reader.group is None:
                reader.settled, reader.settled_lines = pos, number
            continue
        kind, obj, reason = classify(raw)
        if reader.group is not None and reader.inside(kind, obj, reason, number, raw, pos):
            continue
        reader.outside(kind, obj, reason, number, raw, line_start, pos)
    return reader.finish(data, base)


def note_redactions(scan: LogScan, data: bytes) -> None:
    """Know the redactions of the whole lines of ``data`` (another log's, read with this one: a line they
    name is never read, whichever log holds it)."""
    _note_redactions(scan, data, len(data))


def _note_redactions(scan: LogScan, data: bytes, end: int) -> None:
    """Know every redaction in ``data[:end]`` first: a line it names may come before it."""
    if data.find(b'"redact"', 0, end) != -1:
        for raw in data[:end].split(b"\n"):
            if b'"redact"' in raw:
                kind, obj, _ = classify(raw)
                if kind == "redact":
                    _note_redaction(scan, obj)


class _Reader:
    """``feed``'s state while it reads one buffer: where the applied bytes end (``settled``, after
    ``settled_lines`` lines) and the group open at the line read, if any."""

    __slots__ = ("group", "scan", "settled", "settled_lines")

    def __init__(self, scan: LogScan, number: int):
        self.scan = scan
        self.settled, self.settled_lines = 0, number
        self.group: _Group | None = None

    def inside(self, kind: str, obj: Any, reason: str | None, number: int, raw: bytes, pos: int) -> bool:
        """A line while a group is open (ending at ``pos``); False when the group was closed without it
        and the line is to be read as if no group were open."""
        group = self.group
        assert group is not None
        scan = self.scan
        if group.awaiting_commit and not (kind == "commit" and _gid(obj) == group.gid):
            _close(scan, group, "no commit line after its lines")
            self.group = None  # and this line is read as if no group were open
            return False
        if kind == "commit" or kind == "rollback":
            if _gid(obj) == group.gid:
                if kind == "commit":
                    _close(scan, group, None)
                else:
                    _close(scan, group, None, apply=False, end_line=number)
                scan.ops += 1
                self.group = None
                self.settled, self.settled_lines = pos, number
            else:
                group.notes.append({"line": number, "op": kind})
            return True
        if kind == "group":
            _close(scan, group, "a new change began before its commit line")
            self.group = None
            return False
        group.members.append((kind, obj if kind != "corrupt" else reason, number, raw))
        if group.gid is None and len(group.members) >= group.declared:  # a group of the old format
            _close(scan, group, None)
            self.group = None
            self.settled, self.settled_lines = pos, number
        return True

    def outside(self, kind: str, obj: Any, reason: str | None, number: int, raw: bytes, line_start: int,
                pos: int) -> None:
        """A line (from ``line_start`` to ``pos``) read while no group is open."""
        if kind == "group":
            self.group = _Group(line=number, declared=obj["lines"], gid=_gid(obj), start=line_start)
            return
        _apply(self.scan, kind, obj, reason, number, raw)
        self.settled, self.settled_lines = pos, number

    def finish(self, data: bytes, base: int) -> int:
        """Hold back what follows the applied bytes (a write in progress); the bytes applied."""
        scan, group = self.scan, self.group
        if group is not None:  # open at the end of the file: a write in progress
            self.settled, self.settled_lines = group.start, group.line - 1
        settled = self.settled
        scan.lines = self.settled_lines
        tail = data[settled:]
        if tail:
            scan.partial_tail = {"line": self.settled_lines + 1, "bytes": len(tail), "excerpt": _excerpt(tail)}
            if group is not None:
                scan.partial_tail["open_group"] = {"line": group.line, "lines": group.declared, "gid": group.gid,
                                                   "present": len(group.members)}
        else:
            scan.partial_tail = None
        scan.applied = base + settled
        return settled


def _apply(scan: LogScan, kind: str, obj: Any, reason: str | None, number: int, raw: bytes) -> None:
    redactions = scan.redacted.get(obj["id"]) if kind in ("record", "questions") else None
    if redactions is not None and line_hash(raw) in redactions["hashes"]:
        scan.redacted_present.append(number)  # redacted text came back (a merge): never read
        return
    if kind == "record":
        _record(scan, obj, number)
        if redactions is not None and scan.position.get(obj["id"]) == len(scan.records) - 1:
            scan.redaction_checked.add(len(scan.records) - 1)  # redacted before, other content: a new record
    elif kind in _STATE_OPS:
        _STATE_OPS[kind](scan, obj, number)
        scan.ops += 1
    elif kind == "redact":
        _note_redaction(scan, obj)
        target = scan.live(obj["id"]) if obj.get("copy") is not True else None  # (a copy's: by its hash alone)
        if target is not None and target not in scan.redaction_checked:  # read before its redaction was known
            scan.dead[target] = {"line": number, "reason": "redacted", "at": obj.get("at"), "kind": "redact"}
            scan.deaths.append(target)
            scan.redacted_present.append(scan.line_of[target])
        scan.ops += 1
    elif kind in GROUP_OPS:
        _note(scan.stray_ops, {"line": number, "op": kind})
    else:
        _note(scan.corrupt, {"line": number, "reason": reason, "excerpt": _excerpt(raw)})


def _close(scan: LogScan, group: _Group, damage: str | None, *, apply: bool = True,
           end_line: int | None = None) -> None:
    """End a group: apply its lines (or, rolled back, record that they were never applied)."""
    scan.ops += 1  # its header (a commit or rollback line is counted by the caller)
    if not apply:
        last = group.members[-1][2] if group.members else group.line
        _note(scan.rolled_back, {"line": group.line, "lines": len(group.members), "through": last,
                                 "rollback_line": end_line})
        return
    if damage is None and group.gid is not None and len(group.members) != group.declared:
        damage = f"{len(group.members)} line(s) where the header declared {group.declared}"
    if damage is not None:
        _note(scan.damaged_groups, {"line": group.line, "declared": group.declared,
                                    "found": len(group.members), "problem": damage})
    for note in group.notes:
        _note(scan.stray_ops, note)
    for kind, obj, number, raw in group.members:
        _apply(scan, kind, obj if kind != "corrupt" else None, obj if kind == "corrupt" else None,
                    number, raw)


def _record(scan: LogScan, rec: Record, number: int) -> None:
    rid = rec["id"]
    first = scan.position.get(rid)
    if first is not None and first not in scan.dead:
        if not same_content(scan.records[first], rec):  # the same line twice (two teammates ingested one
            _note(scan.duplicates, {"line": number, "id": rid, "first_line": scan.line_of[first]})  # file)
        else:  # is no problem worth a word
            scan.repeats += 1
        return
    if first is not None and copy_of_retired(scan, rec):
        scan.repeats += 1  # (an old line a merge or a cherry-pick brought after the retirement)
        return
    at = len(scan.records)
    if first is not None:
        scan.earlier.setdefault(rid, []).append(first)
    scan.position[rid] = at
    scan.records.append(rec)
    scan.line_of.append(number)
    if rec.get("hot") is True:
        scan.hot.add(at)
    old = rec.get("supersedes")
    if old is not None:
        replaced = scan.live(old)
        why = {"line": number, "reason": "superseded", "by": rid, "position": at}
        if replaced is not None and replaced != at and written_by(scan.records[replaced], rec.get("created_at")):
            scan.dead[replaced] = why
            scan.deaths.append(replaced)
        elif old != rid:
            _retire_earlier(scan, _retired_version(scan, old, replaced), why, rec.get("created_at"))


def copy_of_retired(scan: LogScan, rec: Record) -> bool:
    """Whether ``rec`` is a copy of a retired version of its id (any, while that id is not live): the same
    content, written (``created_at``; none: the oldest) no later than that version was retired (the forget's
    ``at``, the superseding record's time; neither known: the retired version's own time)."""
    rid = rec["id"]
    latest = scan.position.get(rid)
    if latest is None or latest not in scan.dead:
        return False
    written = iso_to_epoch(rec.get("created_at"))
    for pos in (latest, *scan.earlier.get(rid, ())[-MAX_VERSIONS_CHECKED:]):
        old = scan.records[pos]
        if pos in scan.dead and same_content(old, rec):
            retired = iso_to_epoch(retired_at(scan, pos))
            if retired is None:
                retired = iso_to_epoch(old.get("created_at"))
            if written is None or (retired is not None and written <= retired):
                return True
    return False


def _forget(scan: LogScan, op: dict[str, Any], number: int) -> None:
    if scan.forgets is not None:
        scan.forgets.append(op)
    target = scan.live(op["id"])
    why = {"line": number, "reason": forget_reason(op), "at": op.get("at")}
    if target is not None and written_by(scan.records[target], op.get("at")):
        scan.dead[target] = why
        scan.deaths.append(target)
    else:
        _retire_earlier(scan, _retired_version(scan, op["id"], target), why, op.get("at"))


def _retired_version(scan: LogScan, rid: str, live: int | None) -> int | None:
    """The newest retired version of ``rid``: its latest (none is live), or the one before the live one."""
    if live is None:
        return scan.position.get(rid)
    before = scan.earlier.get(rid)
    return before[-1] if before else None


def written_by(rec: Record, when: Any) -> bool:
    """Whether ``rec`` was written no later than ``when`` (a retirement's time; none: always; a record without
    a time counts as the oldest): a retirement never retires a version written after it (a merge can put its
    line after a re-add made on another branch)."""
    then, created = iso_to_epoch(when), iso_to_epoch(rec.get("created_at"))
    return then is None or created is None or created <= then


def _retire_earlier(scan: LogScan, pos: int | None, why: dict[str, Any], when: Any) -> None:
    """A forget or supersede (``why``, at ``when``) read after the version at ``pos`` was retired: the
    earlier of the two retires it, whichever line a merge put first (one without a time counts from always;
    a retirement older than that version was of one before it; a redaction stands)."""
    if pos is None or pos not in scan.dead or death_kind(scan.dead[pos]) == "redact":
        return
    if not written_by(scan.records[pos], when):
        return  # (older than this version: it retired one before it)
    new, then = iso_to_epoch(when), iso_to_epoch(retired_at(scan, pos))
    # (no time counts from always; a tie goes to the smaller of the two, the same whichever line came first)
    first = (-math.inf if new is None else new, why.get("by") or "", why["reason"])
    standing = (-math.inf if then is None else then, scan.dead[pos].get("by") or "", scan.dead[pos]["reason"])
    if first < standing:
        scan.dead[pos] = why
        scan.deaths.append(pos)  # (readers of the deaths take its time again: search/timeline.py)


def death_kind(info: dict[str, Any]) -> str:
    """What retired a record (its ``dead`` entry): ``supersede`` (it names the record that replaced it),
    ``redact``, else ``forget`` (a forget's reason is any text: "superseded" or "redacted" too)."""
    return "supersede" if "by" in info else "redact" if info.get("kind") == "redact" else "forget"


def forget_reason(op: dict[str, Any]) -> str:
    """The reason a forget op gives (its own, cut to ``MAX_REASON``; "forgotten" when it has none)."""
    reason = op.get("reason")
    return reason[:MAX_REASON] if isinstance(reason, str) else "forgotten"


# The operations that change the state of a record that is there (``_apply``).
_STATE_OPS: dict[str, Callable[[LogScan, dict[str, Any], int], None]] = {
    "forget": _forget, "anchor": _reanchor, "pin": _pin, "unpin": _pin, "questions": _questions}


def retired_at(scan: LogScan, pos: int) -> str | None:
    """When the record at ``pos`` was retired (ISO-8601), None while it is live or when the log does
    not say: a tombstone's ``at``; for a supersede, the superseding record's ``created_at``."""
    info = scan.dead.get(pos)
    if info is None:
        return None
    if death_kind(info) == "supersede":
        by = info.get("position")  # the record that replaced it (a worktree's lines are numbered per log)
        if not isinstance(by, int):
            by = bisect_left(scan.line_of, info["line"])
        found = by < len(scan.records) and scan.line_of[by] == info["line"]
        at = scan.records[by].get("created_at") if found else None
    else:
        at = info.get("at")
    return at if isinstance(at, str) else None


def frame(records: Sequence[Record], ops: Sequence[dict[str, Any]] = ()) -> list[bytes]:
    """The lines of one change: more than one line is a group (header, lines, commit line)."""
    lines = [dumps(r) for r in records] + [dumps(o) for o in ops]
    if len(lines) > 1:
        gid = secrets.token_hex(6)
        lines.insert(0, dumps({"op": "group", "lines": len(lines), "gid": gid}))
        lines.append(dumps({"op": "commit", "gid": gid}))
    return lines


def read(data: bytes) -> LogScan:
    """The state of a whole log held in ``data`` (a ``records.jsonl`` to import)."""
    scan = LogScan()
    feed(scan, data)
    return scan


def applied_forgets(scan: LogScan, data: bytes) -> list[dict[str, Any]]:
    """:func:`feed` ``data`` to ``scan``, and the forget ops it applied, in order: not one of a change rolled
    back, nor of one still open at the end (a write in progress), whether or not it found its record."""
    scan.forgets = []
    try:
        feed(scan, data)
        return scan.forgets
    finally:
        scan.forgets = None


# What a reader holds of a log's state at ``applied`` (``state_doc``): every field of ``LogScan`` but the
# store's cursor, the process's generation, the unfinished tail (read again from ``applied``) and the
# forgets a caller collects.
_NOT_KEPT = ("cursor", "generation", "partial_tail", "forgets")
_INT_KEYS = ("dead", "questions")  # dicts keyed by record position: kept as [position, value] pairs
_INT_SETS = ("hot", "redaction_checked")
_BESIDE = ("records", "_position", "line_of", "content_hashes")  # a list per record: kept beside the document


def state_doc(scan: LogScan) -> dict[str, Any]:
    """The state the applied lines amount to, as one JSON document (what two states are compared by)."""
    doc, beside = kept_state(scan)
    doc.update({name: list(values) for name, values in beside.items()})
    doc["records"], doc["position"] = list(scan.records), dict(scan.position)
    return doc


def kept_state(scan: LogScan) -> tuple[dict[str, Any], dict[str, Sequence[Any]]]:
    """The state the applied lines amount to, as a store may keep it so that a new process need not read
    the whole log again (``store/checkpoint.py``): a JSON document of everything but what it holds for
    every record, and those lists (``line_of``, ``content_hashes``; the records themselves, and their ids'
    positions, are the store's to keep: ``RecordList.encode``).  :func:`from_kept_state` inverts it."""
    doc: dict[str, Any] = {}
    for f in fields(LogScan):
        if f.name in _NOT_KEPT or f.name in _BESIDE:
            continue
        value = getattr(scan, f.name)
        if f.name in _INT_KEYS:
            value = [[k, v] for k, v in value.items()]
        elif f.name in _INT_SETS:
            value = sorted(value)
        elif f.name == "redacted":
            value = {rid: {**info, "hashes": sorted(info["hashes"])} for rid, info in value.items()}
        doc[f.name] = value
    doc["size"] = scan.applied  # what follows is read again
    return doc, {"line_of": scan.line_of, "content_hashes": scan.content_hashes}


def from_kept_state(doc: dict[str, Any], records: RecordList, line_of: MutableSequence[int],
                    content_hashes: MutableSequence[str],
                    position: MutableMapping[str, int] | None = None) -> LogScan:
    """The state :func:`kept_state` wrote, its records in ``records`` and the lists it kept beside
    (``position``: an index of the records' ids, made from them when first asked if None).
    KeyError/TypeError/ValueError: not one."""
    kept: dict[str, Any] = {}
    for f in fields(LogScan):
        if f.name in _NOT_KEPT or f.name in _BESIDE:
            continue
        value = doc[f.name]
        if f.name in _INT_KEYS:
            value = {int(k): v for k, v in value}
        elif f.name in _INT_SETS:
            value = {int(p) for p in value}
        elif f.name == "redacted":
            value = {rid: {**info, "hashes": set(info["hashes"])} for rid, info in value.items()}
        kept[f.name] = value
    scan = LogScan(records=records, line_of=line_of, content_hashes=content_hashes, _position=position, **kept)
    if not (isinstance(scan.applied, int) and len(scan.line_of) == len(scan.records)
            and len(scan.content_hashes) <= len(scan.records)):
        raise ValueError("not a log state")
    return scan


def fill_content_hashes(scan: LogScan) -> MutableSequence[str]:
    """``scan.content_hashes`` for every record, the missing ones made now (in position order)."""
    hashes, records = scan.content_hashes, scan.records
    for pos in range(len(hashes), len(records)):
        hashes.append(content_hash(embed_text(records[pos])))
    return hashes


def restart(previous: LogScan | None) -> LogScan:
    """An empty state to read a log again from its start (it was replaced or edited): positions of
    records may differ from ``previous``'s, which ``generation`` tells."""
    return LogScan(generation=(previous.generation + 1) if previous is not None else 0)


def _note(items: list[dict[str, Any]], item: dict[str, Any]) -> None:
    """Keep a problem (the first ``MAX_REPORTED`` of a kind in full; later ones only counted)."""
    if len(items) < MAX_REPORTED:
        items.append(item)
    else:
        items.append({"line": item["line"]})

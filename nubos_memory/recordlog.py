"""``records.jsonl``: the append-only source of truth.

Each line is a record, or an operation on records (adr/0008)::

    {"id": ..., "type": ..., ...}                           a record (``records.py``)
    {"op": "forget", "id": "X", "at": "...", "reason": "..."}  X no longer appears anywhere
    {"op": "group", "lines": K}                             the next K lines are one change

A record may name the id it replaces (``"supersedes": "X"``): X is then dead
like a forgotten one.  Dead records keep their position (so every derived
array stays aligned) but never appear in results; a later record with a dead
id brings that id back, at a new position.

A *group* makes a change of several lines all-or-nothing for readers: its
lines are applied only once all K are present.  A crash in the middle of a
group leaves it incomplete; readers never apply it, and the next writer sets
it aside like a torn line (:meth:`RecordLog.recover_tail`).

Reading tolerates damage: a line that is not valid UTF-8, JSON, a valid
record or a known operation is skipped and reported with its 1-based line
number; a repeated id of a live record keeps its first occurrence.  A last
line without its newline is, for a reader, a write in progress and is
ignored; for a writer (who holds the lock, so no write can be in progress)
it is a torn write left by a crash.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import StoreError
from .faults import armed, crash_point
from .fsio import FILE_MODE, JSONDecodeError, dumps, fsync_dir, loads
from .records import MAX_REASON, OPTIONAL_FIELDS, PROVENANCES, check_record, now_iso, valid_importance

MAX_LINE = 1 << 20  # bytes; a longer line is reported, never parsed
MAX_GROUP = 1_000_000
EXCERPT = 80
GUARD = 4096


@dataclass
class LogScan:
    """What reading ``records.jsonl`` found; :meth:`RecordLog.refresh` extends it as the file grows."""

    records: list[dict[str, Any]] = field(default_factory=list)  # every accepted record line, dead ones too
    corrupt: list[dict[str, Any]] = field(default_factory=list)
    duplicates: list[dict[str, Any]] = field(default_factory=list)
    partial_tail: dict[str, Any] | None = None
    size: int = 0
    lines: int = 0
    # Where parsing stopped (just after the last applied line) and how to tell that the
    # bytes before it are still the ones parsed (inode + the last block).
    offset: int = 0
    inode: int = -1
    guard: bytes = b""
    generation: int = 0  # bumped on a full re-parse: positions of records may have changed
    position: dict[str, int] = field(default_factory=dict)  # record id -> its latest index in ``records``
    line_of: list[int] = field(default_factory=list)  # index in ``records`` -> 1-based line number
    dead: dict[int, dict[str, Any]] = field(default_factory=dict)  # index -> why it is dead
    deaths: list[int] = field(default_factory=list)  # dead indexes in the order they died
    ops: int = 0  # operation lines applied (forget, group)

    def ids(self) -> set[str]:
        """Ids of live records."""
        return {rid for rid, pos in self.position.items() if pos not in self.dead}

    def live(self, rid: str) -> int | None:
        """The position of the live record with this id, if any."""
        pos = self.position.get(rid)
        return pos if pos is not None and pos not in self.dead else None

    @property
    def live_count(self) -> int:
        return len(self.records) - len(self.dead)

    def warnings(self) -> list[dict[str, Any]]:
        """Problems worth telling the caller about, capped for output size."""
        out = [{"code": "records-corrupt-line", **c} for c in self.corrupt[:20]]
        out += [{"code": "records-duplicate-id", **d} for d in self.duplicates[:20]]
        return out


_BASE = frozenset(("id", "type", "phase", "title", "body", "tags", "provenance", "created_at"))
_ALL = _BASE | frozenset(OPTIONAL_FIELDS)
_PROVENANCES = frozenset((None, *PROVENANCES))


def _trusted(obj: Any) -> bool:
    """Cheap check that a line is a record as this package writes it (the common case)."""
    if type(obj) is not dict:
        return False
    keys = obj.keys()
    if keys != _BASE and not (_BASE <= keys <= _ALL):
        return False
    ok = (
        type(obj["id"]) is str and obj["id"] != ""
        and type(obj["type"]) is str
        and type(obj["title"]) is str and obj["title"] != ""
        and type(obj["body"]) is str
        and type(obj["tags"]) is list and all(type(t) is str for t in obj["tags"])
        and (obj["phase"] is None or type(obj["phase"]) is str)
        and obj["provenance"] in _PROVENANCES
        and (obj["created_at"] is None or type(obj["created_at"]) is str)
    )
    if ok and len(obj) > len(_BASE):
        for key in keys - _BASE:
            value = obj[key]
            if value is None:
                continue
            if key == "chunk_index":
                ok = type(value) is int and value >= 0
            elif key == "importance":
                ok = valid_importance(value)
            else:  # source_file, heading, supersedes
                ok = type(value) is str and value != ""
            if not ok:
                return False
    return ok


def _excerpt(raw: bytes) -> str:
    return raw[:EXCERPT].decode("utf-8", "replace")


def forget_op(rid: str, reason: str = "forgotten") -> dict[str, Any]:
    """The log line that retires a record."""
    return {"op": "forget", "id": rid, "at": now_iso(), "reason": reason}


class RecordLog:
    """Reads and appends ``records.jsonl``; appends must happen under the write lock."""

    def __init__(self, path: Path):
        self.path = path

    def scan(self) -> LogScan:
        """Parse the whole file (see module docstring for how damage is handled)."""
        return self.refresh(None)

    def refresh(self, scan: LogScan | None) -> LogScan:
        """Bring ``scan`` up to date, parsing only what was appended since.

        If the file was replaced, shrank, or its already-parsed bytes changed
        (a hand edit), it is parsed again from the start.
        """
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            return LogScan(generation=(scan.generation + 1) if scan and scan.records else 0)
        except OSError as exc:
            raise StoreError(f"cannot read {self.path.name}: {exc.strerror}", code="records-unreadable",
                             details={"path": str(self.path)})
        try:
            st = os.fstat(fd)
            with os.fdopen(fd, "rb", closefd=False) as f:
                if scan is not None and scan.inode == st.st_ino and scan.offset <= st.st_size:
                    back = min(GUARD, scan.offset)
                    f.seek(scan.offset - back)
                    data = f.read()
                    if data[:back] == scan.guard:
                        if len(data) - back == scan.size - scan.offset and scan.size == st.st_size:
                            return scan  # unchanged
                        self._parse(scan, data, back)
                        return scan
                    f.seek(0)
                    data = f.read()
                else:
                    data = f.read()
        finally:
            os.close(fd)
        fresh = LogScan(inode=st.st_ino, generation=(scan.generation + 1) if scan is not None else 0)
        self._parse(fresh, data, 0)
        return fresh

    def _parse(self, scan: LogScan, data: bytes, start: int) -> None:
        """Parse ``data[start:]``, which begins at ``scan.offset`` in the file."""
        base = scan.offset - start
        end = data.rfind(b"\n") + 1
        scan.size = base + len(data)
        number = scan.lines
        pos = start
        stop = end  # where applied lines end; earlier than ``end`` if a group is incomplete
        pending = None
        while pos < end:
            nl = data.index(b"\n", pos)
            raw = data[pos:nl]
            line_start, pos = pos, nl + 1
            number += 1
            if not raw or raw.isspace():
                continue
            reason, obj = None, None
            if len(raw) > MAX_LINE:
                reason = f"line longer than {MAX_LINE} bytes"
            else:
                try:
                    obj = loads(raw)
                except JSONDecodeError as exc:
                    reason = "invalid UTF-8" if "utf-8" in str(exc).lower() else "invalid JSON"
            if reason is None and type(obj) is dict and "op" in obj:
                op = obj.get("op")
                if op == "group":
                    count = obj.get("lines")
                    if type(count) is int and 0 < count <= MAX_GROUP:
                        if not _has_lines(data, pos, end, count):
                            pending = {"line": number, "lines": count}
                            number -= 1
                            stop = line_start
                            break
                        scan.ops += 1
                        continue
                    reason = "group: lines must be a positive integer"
                elif op == "forget":
                    if type(obj.get("id")) is str and obj["id"]:
                        self._forget(scan, obj, number)
                        scan.ops += 1
                        continue
                    reason = "forget: id must be a non-empty string"
                else:
                    reason = f"unknown op {str(op)[:40]!r}"
            if reason is None:
                if _trusted(obj):
                    rec = obj
                else:
                    rec, err = check_record(obj, None)
                    if err is not None:
                        reason = f"{err['code']}: {err['message']}"
                if reason is None:
                    self._record(scan, rec, number)  # type: ignore[arg-type]
                    continue
            scan.corrupt.append({"line": number, "reason": reason, "excerpt": _excerpt(raw)})
        scan.lines = number
        tail = data[max(stop, start):]
        if pending is not None:
            scan.partial_tail = {"line": number + 1, "bytes": len(tail), "excerpt": _excerpt(tail),
                                 "incomplete_group": pending}
        else:
            scan.partial_tail = ({"line": number + 1, "bytes": len(tail), "excerpt": _excerpt(tail)}
                                 if tail else None)
        if stop > start:
            scan.offset = base + stop
            scan.guard = data[max(0, stop - GUARD):stop]

    @staticmethod
    def _record(scan: LogScan, rec: dict[str, Any], number: int) -> None:
        rid = rec["id"]
        first = scan.position.get(rid)
        if first is not None and first not in scan.dead:
            scan.duplicates.append({"line": number, "id": rid, "first_line": scan.line_of[first]})
            return
        at = len(scan.records)
        scan.position[rid] = at
        scan.records.append(rec)
        scan.line_of.append(number)
        old = rec.get("supersedes")
        if old is not None:
            replaced = scan.live(old)
            if replaced is not None and replaced != at:
                scan.dead[replaced] = {"line": number, "reason": "superseded", "by": rid}
                scan.deaths.append(replaced)

    @staticmethod
    def _forget(scan: LogScan, op: dict[str, Any], number: int) -> None:
        target = scan.live(op["id"])
        if target is not None:
            reason = op.get("reason") if isinstance(op.get("reason"), str) else "forgotten"
            scan.dead[target] = {"line": number, "reason": reason[:MAX_REASON], "at": op.get("at")}
            scan.deaths.append(target)

    def recover_tail(self, scan: LogScan) -> dict[str, Any] | None:
        """Under the lock, with ``scan`` just refreshed: deal with bytes a crashed writer left.

        Everything after ``scan.offset`` was never acknowledged to its writer
        (no writer is running: we hold the lock).  A single line that is a
        complete valid record or operation only lost its newline: the newline
        is added.  Anything else (a torn line, an incomplete group) is copied
        to ``records.jsonl.torn``, so no byte is lost, and cut from the log,
        so the next append starts on a clean line.
        """
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return None
        if size <= scan.offset:
            return None
        with open(self.path, "rb") as f:
            f.seek(scan.offset)
            fragment = f.read(size - scan.offset)
        line = scan.lines + 1
        if b"\n" not in fragment:
            try:
                obj = loads(fragment)
            except JSONDecodeError:
                obj = None
            complete = (type(obj) is dict and obj.get("op") == "forget" and type(obj.get("id")) is str) or (
                obj is not None and check_record(obj, None)[1] is None)
            if complete:
                self._append_bytes(b"\n")
                return {"line": line, "action": "completed",
                        "id": obj.get("id") if isinstance(obj, dict) else None}  # type: ignore[union-attr]
        torn = self.path.with_name(self.path.name + ".torn")
        fd = os.open(torn, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, FILE_MODE)
        try:
            os.write(fd, fragment + (b"" if fragment.endswith(b"\n") else b"\n"))
            os.fsync(fd)
        finally:
            os.close(fd)
        with open(self.path, "r+b") as f:
            f.truncate(scan.offset)
            f.flush()
            os.fsync(f.fileno())
        return {"line": line, "action": "set-aside", "bytes": len(fragment), "saved_to": torn.name,
                "incomplete_group": (scan.partial_tail or {}).get("incomplete_group")}

    def append(self, records: list[dict[str, Any]], ops: list[dict[str, Any]] = ()) -> None:  # type: ignore[assignment]
        """Append records and operations as one durable change (fsynced before returning).

        More than one line is written as a group, so readers see all of it or none.
        """
        lines = [dumps(r) for r in records] + [dumps(o) for o in ops]
        if not lines:
            return
        if len(lines) > 1:
            lines.insert(0, dumps({"op": "group", "lines": len(lines)}))
        self._append_bytes(b"\n".join(lines) + b"\n")

    def _append_bytes(self, data: bytes) -> None:
        created = not self.path.exists()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, FILE_MODE)
        try:
            if armed("append-torn") and len(data) > 1:
                os.write(fd, data[: len(data) // 2])
                os.fsync(fd)
                crash_point("append-torn")
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fsync(fd)
        finally:
            os.close(fd)
        if created:
            fsync_dir(self.path.parent)


def _has_lines(data: bytes, pos: int, end: int, count: int) -> bool:
    """Whether ``data[pos:end]`` holds at least ``count`` complete lines."""
    for _ in range(count):
        nl = data.find(b"\n", pos, end)
        if nl == -1:
            return False
        pos = nl + 1
    return True

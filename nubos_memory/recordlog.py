"""``records.jsonl``: the append-only source of truth.

Reading tolerates damage: a line that is not valid UTF-8, JSON or a valid
record is skipped and reported with its 1-based line number; a repeated id
keeps its first occurrence.  A last line without its newline is, for a
reader, a write in progress and is ignored; for a writer (who holds the
lock, so no write can be in progress) it is a torn write left by a crash and
is recovered before the next append (see :meth:`RecordLog.recover_tail`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import StoreError
from .fsio import FILE_MODE, JSONDecodeError, dumps, fsync_dir, loads
from .records import check_record

MAX_LINE = 1 << 20  # bytes; a longer line is reported, never parsed
EXCERPT = 80


@dataclass
class LogScan:
    """What reading ``records.jsonl`` found; :meth:`RecordLog.refresh` extends it as the file grows."""

    records: list[dict[str, Any]] = field(default_factory=list)
    corrupt: list[dict[str, Any]] = field(default_factory=list)
    duplicates: list[dict[str, Any]] = field(default_factory=list)
    partial_tail: dict[str, Any] | None = None
    size: int = 0
    lines: int = 0
    # Where parsing stopped (just after the last newline) and how to tell that the
    # bytes before it are still the ones parsed (inode + a digest of the last block).
    offset: int = 0
    inode: int = -1
    guard: bytes = b""
    generation: int = 0  # bumped on a full re-parse: positions of records may have changed
    position: dict[str, int] = field(default_factory=dict)  # record id -> index in ``records``
    line_of: list[int] = field(default_factory=list)  # index in ``records`` -> 1-based line number

    def ids(self) -> set[str]:
        return set(self.position)

    def warnings(self) -> list[dict[str, Any]]:
        """Problems worth telling the caller about, capped for output size."""
        out = [{"code": "records-corrupt-line", **c} for c in self.corrupt[:20]]
        out += [{"code": "records-duplicate-id", **d} for d in self.duplicates[:20]]
        return out


_CANONICAL = frozenset(("id", "type", "phase", "title", "body", "tags", "provenance", "created_at"))
_PROVENANCES = frozenset((None, "VERIFIED", "CITED", "ASSUMED", "CACHED"))
GUARD = 4096


def _trusted(obj: Any) -> bool:
    """Cheap check that a line is a record as this package writes it (the common case)."""
    return (
        type(obj) is dict
        and obj.keys() == _CANONICAL
        and type(obj["id"]) is str and obj["id"] != ""
        and type(obj["type"]) is str
        and type(obj["title"]) is str and obj["title"] != ""
        and type(obj["body"]) is str
        and type(obj["tags"]) is list and all(type(t) is str for t in obj["tags"])
        and (obj["phase"] is None or type(obj["phase"]) is str)
        and obj["provenance"] in _PROVENANCES
        and (obj["created_at"] is None or type(obj["created_at"]) is str)
    )


def _excerpt(raw: bytes) -> str:
    return raw[:EXCERPT].decode("utf-8", "replace")


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
            fd = os.open(self.path, os.O_RDONLY)
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
        tail = data[max(end, start):]
        body = data[start:end] if end > start else b""
        lines = body.split(b"\n")[:-1] if body else []
        number = scan.lines
        records, position, line_of = scan.records, scan.position, scan.line_of
        for raw in lines:
            number += 1
            if not raw or raw.isspace():
                continue
            reason = None
            obj = None
            if len(raw) > MAX_LINE:
                reason = f"line longer than {MAX_LINE} bytes"
            else:
                try:
                    obj = loads(raw)
                except JSONDecodeError as exc:
                    reason = "invalid UTF-8" if "utf-8" in str(exc).lower() else "invalid JSON"
            if reason is None:
                if _trusted(obj):
                    rec = obj
                else:
                    rec, err = check_record(obj, None)
                    if err is not None:
                        reason = f"{err['code']}: {err['message']}"
                if reason is None:
                    rid = rec["id"]
                    first = position.get(rid)
                    if first is not None:
                        scan.duplicates.append({"line": number, "id": rid, "first_line": line_of[first]})
                    else:
                        position[rid] = len(records)
                        records.append(rec)
                        line_of.append(number)
                    continue
            scan.corrupt.append({"line": number, "reason": reason, "excerpt": _excerpt(raw)})
        scan.lines = number
        scan.partial_tail = ({"line": number + 1, "bytes": len(tail), "excerpt": _excerpt(tail)} if tail else None)
        if end > start:
            scan.offset = base + end
            scan.guard = data[max(0, end - GUARD):end]

    def recover_tail(self) -> dict[str, Any] | None:
        """Under the lock: finish or set aside a torn last line left by a crash.

        A fragment that is a complete valid record only lost its newline: the
        newline is added.  Anything else was never acknowledged to its writer;
        it is copied to ``records.jsonl.torn`` (so no byte is lost) and cut
        from the log, so the next append starts on a clean line.
        """
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return None
        if size == 0:
            return None
        with open(self.path, "rb") as f:
            f.seek(size - 1)
            if f.read(1) == b"\n":
                return None
            # Find the start of the last line without reading a huge file whole.
            pos, chunk = size, 1 << 16
            start = 0
            while pos > 0:
                step = min(chunk, pos)
                pos -= step
                f.seek(pos)
                block = f.read(step)
                nl = block.rfind(b"\n")
                if nl != -1:
                    start = pos + nl + 1
                    break
            f.seek(start)
            fragment = f.read()
        line = 1 + self._count_newlines(start)
        obj = None
        try:
            obj = loads(fragment)
        except JSONDecodeError:
            pass
        rec, err = check_record(obj, None) if obj is not None else (None, {"code": "invalid"})
        if err is None:
            self._append_bytes(b"\n")
            return {"line": line, "action": "completed", "id": rec["id"]}
        torn = self.path.with_name(self.path.name + ".torn")
        fd = os.open(torn, os.O_WRONLY | os.O_APPEND | os.O_CREAT, FILE_MODE)
        try:
            os.write(fd, fragment + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        with open(self.path, "r+b") as f:
            f.truncate(start)
            f.flush()
            os.fsync(f.fileno())
        return {"line": line, "action": "set-aside", "bytes": len(fragment), "saved_to": torn.name}

    def _count_newlines(self, end: int) -> int:
        count = 0
        with open(self.path, "rb") as f:
            remaining = end
            while remaining > 0:
                block = f.read(min(1 << 20, remaining))
                if not block:
                    break
                count += block.count(b"\n")
                remaining -= len(block)
        return count

    def append(self, records: list[dict[str, Any]]) -> None:
        """Append records as one write and fsync before returning (durable)."""
        if records:
            self._append_bytes(b"".join(dumps(r) + b"\n" for r in records))

    def _append_bytes(self, data: bytes) -> None:
        created = not self.path.exists()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, FILE_MODE)
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fsync(fd)
        finally:
            os.close(fd)
        if created:
            fsync_dir(self.path.parent)

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
    """What one read of ``records.jsonl`` found."""

    records: list[dict[str, Any]] = field(default_factory=list)
    corrupt: list[dict[str, Any]] = field(default_factory=list)
    duplicates: list[dict[str, Any]] = field(default_factory=list)
    partial_tail: dict[str, Any] | None = None
    size: int = 0
    lines: int = 0

    def ids(self) -> set[str]:
        return {r["id"] for r in self.records}

    def warnings(self) -> list[dict[str, Any]]:
        """Problems worth telling the caller about, capped for output size."""
        out = [{"code": "records-corrupt-line", **c} for c in self.corrupt[:20]]
        out += [{"code": "records-duplicate-id", **d} for d in self.duplicates[:20]]
        return out


def _excerpt(raw: bytes) -> str:
    return raw[:EXCERPT].decode("utf-8", "replace")


class RecordLog:
    """Reads and appends ``records.jsonl``; appends must happen under the write lock."""

    def __init__(self, path: Path):
        self.path = path

    def scan(self) -> LogScan:
        """Parse the whole file (see module docstring for how damage is handled)."""
        scan = LogScan()
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return scan
        except OSError as exc:
            raise StoreError(f"cannot read {self.path.name}: {exc.strerror}", code="records-unreadable",
                             details={"path": str(self.path)})
        scan.size = len(data)
        lines = data.split(b"\n")
        tail = lines.pop()  # b"" when the file ends with a newline
        if tail:
            scan.partial_tail = {"line": len(lines) + 1, "bytes": len(tail), "excerpt": _excerpt(tail)}
        scan.lines = len(lines)
        first_line: dict[str, int] = {}
        for number, raw in enumerate(lines, start=1):
            if not raw.strip():
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
                rec, err = check_record(obj, None)
                if err is not None:
                    reason = f"{err['code']}: {err['message']}"
                elif rec["id"] in first_line:
                    scan.duplicates.append({"line": number, "id": rec["id"], "first_line": first_line[rec["id"]]})
                    continue
                else:
                    first_line[rec["id"]] = number
                    scan.records.append(rec)
                    continue
            scan.corrupt.append({"line": number, "reason": reason, "excerpt": _excerpt(raw)})
        return scan

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

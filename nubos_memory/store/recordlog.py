"""The file store's log: ``records.jsonl``, the append-only source of truth, read and appended.

What the lines mean, and the state they amount to, is ``nubos_memory/log.py``; this module only
carries them: reading what was appended since a :class:`FileCursor` (or all of it again, when the
file was replaced or hand-edited), appending a change durably, and settling a crashed writer's
leftovers by appending (the log's module docstring says how).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import codes
from ..errors import StoreError
from ..faults import armed, crash_point
from ..fsio import FILE_MODE, JSONDecodeError, dumps, fsync_dir, loads, open_regular
from ..log import LogScan, classify, feed, frame, restart
from ..records import now_iso
from ..types import Record
from . import checkpoint as checkpoints
from .verified import Verified

GUARD = 4096  # bytes before the read point kept to tell that they are still the ones read


@dataclass(frozen=True)
class FileCursor:
    """Where ``records.jsonl`` was read to (``LogScan.applied``) and how to tell that the bytes before
    that point are still the ones read: the file's inode and its last block before it."""

    inode: int
    guard: bytes


class RecordLog:
    """Reads and appends ``records.jsonl``; appends must happen under the write lock."""

    def __init__(self, path: Path, *, checkpoint: bool = False, verified: Verified | None = None):
        self.path = path
        # the state kept beside the log for new processes (``checkpoint.py``; the store's own log only)
        self.checkpoint = path.with_name(checkpoints.NAME) if checkpoint else None
        # where the checkpoint payload's check is remembered (the folder's record of checked files)
        self.verified = (verified or Verified(path.parent)) if checkpoint else None
        self.save_due: LogScan | None = None  # a state worth a new checkpoint (the store saves it under the lock)

    def scan(self) -> LogScan:
        """Parse the whole file (see module docstring for how damage is handled)."""
        return self.refresh(None)

    def refresh(self, scan: LogScan | None) -> LogScan:
        """Bring ``scan`` up to date, parsing only what was appended since.

        If the file was replaced, shrank, or its already-parsed bytes changed
        (a hand edit), it is parsed again from the start.
        """
        try:
            fd = open_regular(self.path, os.O_RDONLY)  # a FIFO there must not hang every verb
        except FileNotFoundError:
            return LogScan(generation=(scan.generation + 1) if scan and scan.records else 0)
        except OSError as exc:
            raise StoreError(f"cannot read {self.path.name}: {exc.strerror}", code=codes.RECORDS_UNREADABLE,
                             details={"path": str(self.path)}) from None
        cursor = scan.cursor if scan is not None and isinstance(scan.cursor, FileCursor) else None
        held = -1  # the applied bytes of the checkpoint this read started from (-1: none)
        try:
            st = os.fstat(fd)
            if scan is None and self.checkpoint is not None:
                got = checkpoints.load(self.checkpoint, self.path, st.st_ino, self.verified)
                if got is not None:
                    scan, guard = got
                    cursor = scan.cursor = FileCursor(st.st_ino, guard)
                    held = scan.applied
            with os.fdopen(fd, "rb", closefd=False) as f:
                if scan is not None and cursor is not None and cursor.inode == st.st_ino \
                        and scan.applied <= st.st_size:
                    back = min(GUARD, scan.applied)
                    f.seek(scan.applied - back)
                    data = f.read()
                    # (a tail holding a redaction is read whole: it applies to lines before it)
                    if data[:back] == cursor.guard and not (held >= 0 and b'"redact"' in data[back:]):
                        if len(data) - back == scan.size - scan.applied and scan.size == st.st_size:
                            return scan  # unchanged
                        self._feed(scan, data, back, st.st_ino)
                        self._keep(scan, held if held >= 0 else None)
                        return scan
                    f.seek(0)
                    data = f.read()
                else:
                    data = f.read()
        finally:
            os.close(fd)
        fresh = restart(scan if held < 0 else None)
        self._feed(fresh, data, 0, st.st_ino)
        self._keep(fresh, 0)
        return fresh

    def _keep(self, scan: LogScan, held: int | None) -> None:
        """After a read that started from a checkpoint of ``held`` applied bytes (0: the whole log was
        read; None: an in-process state, not a new process), note a new checkpoint as due."""
        self.save_due = scan if self.checkpoint is not None and held is not None and checkpoints.due(scan, held) \
            and isinstance(scan.cursor, FileCursor) else None

    def save_checkpoint(self, scan: LogScan) -> None:
        """Under the write lock: the checkpoint :meth:`refresh` found due for ``scan``."""
        if self.checkpoint is not None and isinstance(scan.cursor, FileCursor):
            checkpoints.save(self.checkpoint, self.path, scan, scan.cursor.inode, scan.cursor.guard)

    def drop_checkpoint(self) -> None:
        """Before the log is rewritten (compaction, redaction): the checkpoint holds its text."""
        if self.checkpoint is not None:
            checkpoints.drop(self.checkpoint)

    @staticmethod
    def _feed(scan: LogScan, data: bytes, back: int, inode: int) -> None:
        """Apply ``data[back:]`` (``data[:back]``: the guard, the bytes before ``scan.applied``) and note
        where this file was read to: its inode and the last block before that point."""
        settled = back + feed(scan, data[back:])
        cursor = scan.cursor if isinstance(scan.cursor, FileCursor) and settled == back else None
        scan.cursor = cursor or FileCursor(inode, data[max(0, settled - GUARD):settled])

    def recover_tail(self, scan: LogScan) -> dict[str, Any] | None:
        """Under the lock, with ``scan`` just refreshed: settle what a crashed writer left.

        Everything after ``scan.applied`` was never acknowledged to its writer
        (no writer is running: we hold the lock).  See the module docstring
        for what is done; nothing complete is ever removed.  Returns what was
        done, or None when there was nothing to settle.
        """
        tail = scan.partial_tail
        if tail is None:
            return None
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return None
        if size <= scan.applied:
            return None
        with open(self.path, "rb") as f:
            f.seek(scan.applied)
            fragment = f.read(size - scan.applied)
        complete = fragment.rfind(b"\n") + 1
        torn = fragment[complete:]
        out: dict[str, Any] = {"line": tail["line"]}
        cut = False
        if torn:
            obj: Any = None
            try:
                obj = loads(torn)
            except JSONDecodeError:
                pass
            kind = classify(torn)[0] if obj is not None else "corrupt"
            if kind in ("record", "forget", "redact", "anchor", "commit", "rollback"):
                self._append_bytes(b"\n")  # only the newline was lost
                out.update(action="completed", id=obj.get("id") if kind == "record" else None)
            else:
                self._set_aside(scan.applied + complete, torn)
                out.update(action="set-aside", bytes=len(torn), saved_to=self.path.name + ".torn")
                cut = True
        group = tail.get("open_group")
        if group is not None:
            # A group cut by a torn line was a crash mid-write: roll it back. One whose lines are all
            # there lost at most its commit line (a crash at a line boundary, or a hand edit): commit it.
            op = "rollback" if cut else "commit"
            self._append_bytes(dumps({"op": op, "gid": group["gid"], "at": now_iso()}) + b"\n")
            out.update(action=f"group-{'rolled-back' if cut else 'committed'}", open_group=group)
        return out

    def _set_aside(self, at: int, torn: bytes) -> None:
        """Copy torn bytes to ``records.jsonl.torn`` (kept, fsynced) and cut them from the log."""
        path = self.path.with_name(self.path.name + ".torn")
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, FILE_MODE)
        try:
            os.write(fd, torn + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        with open(self.path, "r+b") as f:
            f.truncate(at)
            f.flush()
            os.fsync(f.fileno())

    def append(self, records: Sequence[Record], ops: Sequence[dict[str, Any]] = ()) -> None:
        """Append records and operations as one durable change (fsynced before returning).

        More than one line is written as a group (header, lines, commit), so
        readers see all of it or none.
        """
        lines = frame(records, ops)
        if lines:
            self._append_bytes(b"\n".join(lines) + b"\n")

    def _append_bytes(self, data: bytes) -> None:
        created = not self.path.exists()
        fd = open_regular(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
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

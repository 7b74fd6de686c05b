"""Usage tracking: how often, and when last, each record was retrieved.

A derived side file, never the source of truth (adr/0010)::

    usage.jsonl   one line per answered query: {"t": epoch seconds, "ids": [hit ids]}
    usage.json    {"format": 1, "since": epoch, "ids": {id: [count, last]}}  the folded summary

Queries append a short line (``O_APPEND``, one ``write``) while holding an
``flock`` on ``usage.jsonl`` for that write only: they never take the
memory's write lock.  A writer folds the lines into ``usage.json`` under the
same ``flock``, so no retrieval is lost between reading and truncating the
line log.  ``since`` is when tracking began: pruning trusts "never
retrieved" only for a window that tracking fully covers, so a fresh usage
history makes pruning retire less, never more.
"""

from __future__ import annotations

import fcntl
import os
import re
import time
from pathlib import Path

from .. import codes
from ..errors import InputError
from ..fsio import JSONDecodeError, atomic_write_bytes, dumps, loads, open_regular, read_regular

USAGE_LOG = "usage.jsonl"
USAGE_SUMMARY = "usage.json"
FORMAT = 1
FOLD_BYTES = 1 << 20  # a writer folds the line log once it is this big

_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])\Z")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str) -> float:
    """``90d``, ``12h``, ``2w``, ``30m``, ``45s`` → seconds."""
    m = _DURATION.match(str(text).strip().lower())
    if not m or float(m.group(1)) <= 0:
        raise InputError(f"not a duration: {text!r} (use e.g. 90d, 12h, 2w)", code=codes.DURATION_INVALID,
                         details={"value": text})
    return float(m.group(1)) * _UNIT[m.group(2)]


class Usage:
    """Reads and writes one memory's usage files."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.log_path = folder / USAGE_LOG
        self.summary_path = folder / USAGE_SUMMARY

    def start(self) -> None:
        """Mark the beginning of tracking (``memory-init``), unless it already began."""
        if not self.summary_path.exists() and not self.log_path.exists():
            atomic_write_bytes(self.summary_path, dumps({"format": FORMAT, "since": time.time(), "ids": {}}))

    def record(self, ids: list[str]) -> bool:
        """Append one retrieval event; False if it could not be written (it is derived data)."""
        if not ids:
            return True
        line = dumps({"t": round(time.time(), 3), "ids": ids}) + b"\n"
        try:
            fd = open_regular(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)  # held for one write: a fold never loses this line
                os.write(fd, line)
            finally:
                os.close(fd)  # closing releases the flock
        except OSError:
            return False
        return True

    def _read_summary(self) -> tuple[float | None, dict[str, list[float]]]:
        try:
            doc = loads(read_regular(self.summary_path))
            if isinstance(doc, dict) and doc.get("format") == FORMAT and isinstance(doc.get("ids"), dict):
                since = doc.get("since")
                return (float(since) if isinstance(since, (int, float)) else None), dict(doc["ids"])
        except (OSError, JSONDecodeError, ValueError):
            pass
        return None, {}

    def summary(self) -> tuple[float | None, dict[str, list[float]]]:
        """``(tracking since, {id: [retrievals, last retrieved]})`` from both files."""
        since, ids = self._read_summary()
        first = None
        try:
            fd = open_regular(self.log_path, os.O_RDONLY)
            with os.fdopen(fd, "rb") as f:
                for raw in f:
                    try:
                        event = loads(raw)
                        t, hits = float(event["t"]), event["ids"]
                    except (JSONDecodeError, KeyError, TypeError, ValueError):
                        continue  # a damaged line costs one event, nothing else
                    first = t if first is None else min(first, t)
                    for rid in hits if isinstance(hits, list) else ():
                        entry = ids.get(rid)
                        ids[rid] = [1, t] if entry is None else [entry[0] + 1, max(entry[1], t)]
        except FileNotFoundError:
            pass
        if since is None:
            since = first
        return since, ids

    def fold(self, force: bool = False) -> None:
        """Under the write lock: fold the line log into the summary once it is big (or ``force``).

        The line log is read, summarised and emptied under its ``flock``, so an
        append waits instead of landing in a file that is being folded.
        """
        try:
            fd = open_regular(self.log_path, os.O_RDWR)
        except FileNotFoundError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if not force and os.fstat(fd).st_size < FOLD_BYTES:
                return
            since, ids = self.summary()
            atomic_write_bytes(self.summary_path, dumps({"format": FORMAT, "since": since, "ids": ids}))
            os.ftruncate(fd, 0)
            os.fsync(fd)
        finally:
            os.close(fd)


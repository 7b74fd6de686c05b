"""A checkpoint of the file store's log state, so that a new process need not read the whole log.

A one-shot call at 100k records spent most of its time parsing and checking every line of
``records.jsonl`` (issue 27).  ``log-checkpoint.json`` keeps the state those lines amount to
(``log.state_doc``) at ``applied`` bytes, with the log's inode, the sha256 of those bytes and the
block before that point (the guard an incremental read checks: ``recordlog.FileCursor``).  A process
that opens the memory hashes the log's first ``applied`` bytes (a read, no parse: ~0.04 s at 100k
records; not again while the log's stat identity is unchanged: ``verified.py``), restores the state
when they are the ones checkpointed and reads only what was appended since; a log replaced or edited
anywhere before that point is read whole, as without a checkpoint.

It is derived data like the manifest: one header line, signed with this user's key
(``trust.py``), naming the rules that parsed the log (``RULES``: a version that reads lines otherwise
never restores another's state) and the sha256 and length of the payload that follows: one JSON line of
the state but what it holds for every record (``log.kept_state``), then those lists as flat binary
arrays (``columns.py``: where each record starts, its line, content hash, id, the fields filters read,
and an index of the ids; the line says where each array is), then the records, one JSON line each.  A
process memory-maps the file, copies the int arrays, reads the others in place and decodes a record
when first read (``recordlist.py``: a one-shot query decodes its hits, not the memory); a checkpoint this user did not write, or whose payload does not match, is never used, and a tail that
holds a redaction is read whole (a redaction applies to lines before it).  It is written aside and
swapped in atomically, owner-only, by a reader that found a tail at least ``MIN_TAIL`` bytes long and
a quarter of what the checkpoint holds (so a year of writes rewrites it O(log n) times) and could take
the write lock without waiting (``FileStore.refresh``), so no save overlaps a redaction or a
compaction, which delete it (and any temporary copy) before and after they rewrite the log: it holds
the records' text.
"""

from __future__ import annotations

import base64
import hashlib
import mmap
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import __version__
from ..columns import BYTEORDER, Positions, pack_all, unpack_from
from ..fsio import JSONDecodeError, atomic_write_bytes, dumps, loads, loads_bulk, open_regular
from ..log import READ_RULES, LogScan, fill_content_hashes, from_kept_state, kept_state
from ..recordlist import COLUMNS, RecordList
from ..records import EMBED_TEMPLATE, SCHEMA_VERSION
from ..trust import available, file_sha256, sign, verify

if TYPE_CHECKING:
    from .verified import Verified

NAME = "log-checkpoint.json"
FORMAT = 6  # (6: the importance column)
RULES = f"{__version__} schema {SCHEMA_VERSION} read {READ_RULES} {EMBED_TEMPLATE}"  # what turned the lines into the state
MAX_HEADER = 64 * 1024
MIN_TAIL = 1 << 20  # bytes read past the checkpoint before a reader writes a new one
SHARE_GROWN = 4  # ... and at least 1/SHARE_GROWN of what it holds


def load(path: Path, log: Path, inode: int, verified: "Verified | None" = None) -> "tuple[LogScan, bytes] | None":
    """The state a checkpoint of ``log`` (whose inode is ``inode``) holds, and its guard; None when there is
    no usable one (missing, of another log or other bytes, not signed by this user, damaged).  ``verified``:
    where a check of the payload's sha256 against the signed header is remembered (``verified.py``).  The
    file is memory-mapped: its records are decoded when first read (``recordlist.py``)."""
    try:
        fd = open_regular(path, os.O_RDONLY)  # never a FIFO, a device or a link
        with os.fdopen(fd, "rb") as f:
            header_line = f.readline(MAX_HEADER)
            header = loads(header_line)
            st = os.fstat(f.fileno())  # (what the payload's check is remembered by: the file read)
            start = len(header_line)
            if not (isinstance(header, dict) and header.get("format") == FORMAT and header.get("rules") == RULES
                    and header.get("byteorder") == BYTEORDER and header.get("inode") == inode and verify(header)
                    and header.get("bytes") == st.st_size - start and header["bytes"] > 0):
                return None
            mapped = memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
        payload = mapped[start:]

        def digest() -> str:
            return hashlib.sha256(payload).hexdigest()

        if not (verified.check(path, header.get("sha256"), digest, st) if verified is not None
                else header.get("sha256") == digest()):
            return None
        doc_end = int(header["doc_bytes"])
        records_at = doc_end + 1 + int(header["binary_bytes"])
        doc = loads_bulk(payload[:doc_end])
        arrays, binary = doc.pop("arrays"), payload[doc_end + 1:records_at]

        def column(name: str) -> Any:
            return unpack_from(arrays, binary, name)

        offsets = column("offsets")
        if not (len(offsets) and offsets[0] == 0 and offsets[-1] == len(payload) - records_at):
            return None
        records = RecordList(payload[records_at:], offsets, {name: column(name) for name in COLUMNS})
        keys, at = column("position_keys"), column("position_at")
        if len(keys) != len(at) or len(at) > len(records):
            return None
        scan = from_kept_state(doc, records, column("line_of"), column("content_hashes"),
                               Positions(keys, at, records.column("id") or records.values("id")))
        guard = base64.b64decode(header["guard"])
        if scan.applied != header.get("applied") or not _prefix_matches(log, scan.applied, header.get("prefix"),
                                                                         verified):
            return None
    except (OSError, JSONDecodeError, KeyError, TypeError, ValueError):
        return None
    return scan, guard


def _prefix_matches(log: Path, applied: int, sha256: Any, verified: "Verified | None") -> bool:
    """Whether the log's first ``applied`` bytes are those checkpointed (their sha256; a check remembered
    by the log's identity: ``Verified.check_prefix``)."""
    if verified is None:
        return bool(file_sha256(log, applied) == sha256)
    return verified.check_prefix(log, applied, sha256)


def due(scan: LogScan, held: int) -> bool:
    """Whether a reader that brought ``scan`` up to date from a checkpoint of ``held`` applied bytes
    (0: none) should write a new one."""
    tail = scan.applied - held
    return scan.partial_tail is None and tail >= MIN_TAIL and tail * SHARE_GROWN >= held


def save(path: Path, log: Path, scan: LogScan, inode: int, guard: bytes) -> bool:
    """Under the write lock (no rewrite of the log can be under way): write the checkpoint of ``scan``, the
    state of ``log`` whose inode is ``inode`` (best effort: it is derived data); whether it was written."""
    if not available():
        return False
    try:
        if os.stat(log).st_ino != inode:  # the log was replaced since it was read: its state is not this
            return False
        prefix = file_sha256(log, scan.applied)
    except OSError:
        return False
    fill_content_hashes(scan)  # made once here, so that no later process makes them again
    doc, beside = kept_state(scan)
    blob, offsets, columns = scan.records.encode()
    keys, at = Positions.index(scan.position)
    arrays, binary = pack_all([("offsets", offsets, "q"), ("line_of", beside["line_of"], "q"),
                               ("content_hashes", beside["content_hashes"], "hex"),
                               ("position_keys", keys, "I"), ("position_at", at, "q"),
                               *((name, columns[name], "lines" if name == "id" else "coded") for name in COLUMNS)])
    head = dumps({**doc, "arrays": arrays})
    payload = b"".join([head, b"\n", binary, blob])
    header: dict[str, Any] = sign({"format": FORMAT, "rules": RULES, "byteorder": BYTEORDER, "inode": inode,
                                   "applied": scan.applied, "prefix": prefix,
                                   "guard": base64.b64encode(guard).decode(), "bytes": len(payload),
                                   "doc_bytes": len(head), "binary_bytes": len(binary),
                                   "sha256": hashlib.sha256(payload).hexdigest()})
    try:
        atomic_write_bytes(path, dumps(header) + b"\n" + payload)
    except OSError:
        return False
    return True


def drop(path: Path) -> None:
    """Delete the checkpoint and any temporary copy a killed reader left (the log is being rewritten: the
    text they hold may be going away).  Whatever is there goes, a folder a clone planted included; a
    failure never stops the rewrite (derived data)."""
    for found in [path, *path.parent.glob(f".{path.name}.*.tmp")]:
        try:
            if found.is_dir() and not found.is_symlink():
                shutil.rmtree(found, ignore_errors=True)
            else:
                found.unlink(missing_ok=True)
        except OSError:
            pass

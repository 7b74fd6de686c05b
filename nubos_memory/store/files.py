"""The file store: one project's ``.nubos-pilot/memory/`` folder (the default ``memory.backend``).

::

    records.jsonl             the log (``recordlog.py`` carries it); committed, merged with merge=union
    .lock, .lock.holder.json  the write lock (``lock.py``)
    manifest.json + index-/keymap-/vectors-<gen>   the vector generation (``cache.py``)
    lexical.json + lexical-<gen>.npz                the lexical postings (``lexcache.py``)
    usage.jsonl, usage.json   retrievals (``usage.py``)
    records.jsonl.torn        torn bytes a crashed writer left, set aside
    records.jsonl.bak-<time>  the log before a memory-compact
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import codes
from ..errors import StoreError
from ..faults import crash_point
from ..fsio import atomic_write_bytes, dumps, ensure_dir, read_regular
from ..log import LogScan, copied_lines, line_hash, redact_lines, redactions_in
from ..trust import file_sha256
from .cache import DerivedCache, LocalDerivedState
from .lexcache import LexicalCache
from .lock import WriteLock
from .recordlog import RecordLog
from .usage import Usage

if TYPE_CHECKING:
    import numpy as np

    from ..config import Project
    from ..index.lexical import PostingsBM25
    from ..types import Record

RECORDS = "records.jsonl"
MEMORY_FILES = (RECORDS, RECORDS + ".torn", "manifest.json", "lexical.json", "usage.json", "usage.jsonl",
                ".lock", ".lock.holder.json", ".gitignore", ".gitattributes", "serve.sock", "serve.lock",
                "log-checkpoint.json", "verified.json")
GITIGNORE = """# nubos-memory: everything here but the source of truth is a derived cache,
# rebuilt exactly from records.jsonl by `np-tools memory-rebuild`.
*
!.gitignore
!.gitattributes
!records.jsonl
"""
GITATTRIBUTES = "records.jsonl merge=union\n"


def folder_notices(folder: Path) -> list[dict[str, Any]]:
    """Warnings about a memory folder that other users could write to (a clone may carry any mode)."""
    try:
        st = os.stat(folder)
    except OSError:
        return []
    out = []
    if st.st_uid != os.getuid():
        out.append({"code": codes.MEMORY_FOLDER_NOT_OWNED,
                    "message": f"the memory folder belongs to uid {st.st_uid}, not to this user; its owner can "
                               "change every file in it"})
    if st.st_mode & 0o022:
        out.append({"code": codes.MEMORY_FOLDER_WRITABLE,
                    "message": f"the memory folder is writable by group or others (mode {st.st_mode & 0o777:o}): "
                               "another user could replace its files or put a server in it; memory-serve is not "
                               f"used. Fix: chmod 700 {folder}"})
    return out


class FileStore(LocalDerivedState):
    """The :class:`~nubos_memory.store.base.Store` of a project's memory folder."""

    kind = "files"
    shares_vectors = False

    def __init__(self, project: "Project", lock_timeout: float):
        self.project = project
        self.folder = project.memory_dir
        self.cache = DerivedCache(self.folder)  # (its record of checked files serves the folder's readers)
        self.log = RecordLog(self.folder / RECORDS, checkpoint=True, verified=self.cache.verified)
        log, verified = self.folder / RECORDS, self.cache.verified
        self.lexcache = LexicalCache(self.folder, lambda offset: file_sha256(log, offset), verified,
                                     lambda offset, sha256: verified.check_prefix(log, offset, sha256))
        self.usage = Usage(self.folder)
        self.write_lock = WriteLock(self.folder, lock_timeout)
        self._guarded = (project.state_dir, self.folder, project.config_path,
                         *(self.folder / name for name in MEMORY_FILES))
        self._checked: tuple[Any, ...] | None = None  # what the last check saw (inode, device, mode, owner)
        self._notices: list[dict[str, Any]] = []

    # -- the place -------------------------------------------------------------------------
    def check(self) -> list[dict[str, Any]]:
        """Refuse a memory folder whose parts are symlinks or lead outside the project.

        A ``.nubos-pilot/`` from an untrusted clone could otherwise make us read
        a file outside the project (and print parts of it as "corrupt lines")
        or append to one (``usage.jsonl`` -> ``~/.bashrc``), or truncate one
        (the lock file).  Every file we open there is checked here, and the
        log and usage files are also opened with ``O_NOFOLLOW``.
        """
        root = self.project.root
        seen: list[tuple[int, int, int, int] | None] = []
        for path in self._guarded:
            try:
                st = os.lstat(path)
            except OSError:
                seen.append(None)
                continue
            if stat.S_ISLNK(st.st_mode):
                raise StoreError(f"{path.relative_to(root)} is a symlink; memory files are never followed "
                                 "through links (an untrusted clone could point them anywhere)",
                                 code=codes.STORE_SYMLINK_REFUSED, details={"path": str(path)})
            seen.append((st.st_ino, st.st_dev, st.st_mode, st.st_uid))
        signature = tuple(seen)
        if signature == self._checked:  # nothing on the way changed since the last check
            return self._notices
        if self.folder.exists():
            try:
                self.folder.resolve().relative_to(root.resolve())
            except ValueError:
                raise StoreError("the memory folder resolves outside the project", code=codes.STORE_SYMLINK_REFUSED,
                                 details={"path": str(self.folder)}) from None
        self._notices = folder_notices(self.folder)
        self._checked = signature
        return self._notices

    def prepare(self) -> None:
        ensure_dir(self.folder)
        for name, text in ((".gitignore", GITIGNORE), (".gitattributes", GITATTRIBUTES)):
            path = self.folder / name
            if not path.exists():
                atomic_write_bytes(path, text.encode())

    def describe(self) -> dict[str, Any]:
        return {"backend": self.kind, "memory_dir": str(self.folder)}

    def status(self) -> dict[str, Any]:
        return {}

    def maintain(self, wait_s: float | None = None) -> dict[str, Any] | None:
        return None  # the local graph is extended by every commit

    def owns(self, path: Path) -> bool:
        return path.resolve() == self.log.path.resolve()

    def discard(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)

    # -- the log -----------------------------------------------------------------------------
    def refresh(self, scan: LogScan | None) -> LogScan:
        fresh = self.log.refresh(scan)
        if self.log.save_due is fresh:  # a checkpoint, only while no writer can be rewriting the log
            self.log.save_due = None
            try:
                with self.try_lock("memory-checkpoint") as got:
                    if got:
                        self.log.save_checkpoint(fresh)
            except (StoreError, OSError):
                pass  # derived data: the next reader tries again
        return fresh

    def append(self, records: "Sequence[Record]", ops: Sequence[dict[str, Any]] = ()) -> None:
        self.log.append(records, ops)

    def settle(self, scan: LogScan) -> dict[str, Any] | None:
        done = self.log.recover_tail(scan)
        if scan.redacted_present:  # redacted text a merge brought back: removed again, under the lock
            purged = self.redact(set(scan.redacted), "redacted again: the text came back (a git merge?)",
                                 only={rid: set(info["hashes"]) for rid, info in scan.redacted.items()})
            done = {**(done or {}), "redacted_again": purged["lines"]}
        return done

    def redact(self, ids: set[str], reason: str, keys: Sequence[str] = (),
               only: dict[str, set[str]] | None = None) -> dict[str, Any]:
        """Under the lock: remove every record line of ``ids`` (``only``: just those lines) from the log and from every copy of it in
        the folder (``records.jsonl.bak-*`` backups, torn bytes set aside), leaving ``redact`` lines
        (``log.redact_lines``); each file is replaced atomically.  The derived files still hold
        the text (lexical vocabulary) until the caller rebuilds them.  ``keys``: texts' vector keys
        (shared vectors; this store shares none)."""
        found: list[str] = []
        files: list[str] = []
        self.log.drop_checkpoint()
        for path in [self.log.path, *self._backups()]:
            try:
                data = read_regular(path)
            except FileNotFoundError:
                continue
            lines, hit = redact_lines(data.splitlines(keepends=True), ids, reason, only)
            if hit:
                atomic_write_bytes(path, b"".join(lines))
                found += hit if path == self.log.path else []
                files.append(path.name)
        torn = self.folder / (RECORDS + ".torn")
        if torn.exists():  # set-aside fragments are line beginnings: drop any that names a redacted id
            kept = [f for f in read_regular(torn).splitlines(keepends=True)
                    if not any(rid.encode() in f for rid in ids)]
            if b"".join(kept) != read_regular(torn):
                atomic_write_bytes(torn, b"".join(kept))
                files.append(torn.name)
        self.lexcache.invalidate()
        self.log.drop_checkpoint()  # and after: nothing may have kept the text meanwhile
        return {"lines": len(found), "ids": sorted(set(found)), "files": files}

    def _backups(self) -> list[Path]:
        """The logs ``rewrite`` replaced (``records.jsonl.bak-<time>``), oldest first."""
        return sorted(self.folder.glob(f"{RECORDS}.bak-*"))

    def held_in_copies(self, ids: set[str]) -> dict[str, set[str]]:
        copies: list[list[bytes]] = []
        for path in self._backups():
            try:
                copies.append(read_regular(path).splitlines(keepends=True))
            except OSError:  # (gone meanwhile, or not a plain file: redact passes it over too)
                continue
        try:  # set-aside fragments (line beginnings): those that name the id as a record's
            torn = read_regular(self.folder / (RECORDS + ".torn")).splitlines(keepends=True)
        except OSError:
            torn = []
        held = copied_lines(copies, ids)
        for fragment in torn:
            for rid in ids:
                if b'"id":' + dumps(rid) in fragment:
                    held.setdefault(rid, set()).add(line_hash(fragment))
        return held

    def rewrite(self, records: "Sequence[Record]") -> dict[str, Any]:
        """Under the lock: the current log is kept as ``records.jsonl.bak-<time>`` (a hard link, so not a
        byte is lost), and a new file with ``records`` and the log's ``redact`` lines replaces it atomically."""
        return self._rewrite(records)

    def _rewrite(self, records: "Sequence[Record]", head: Sequence[dict[str, Any]] = (),
                 tail: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
        """:meth:`rewrite`, with ``head``'s operation lines before the records and ``tail``'s after them."""
        path = self.log.path
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
        backup = path.with_name(f"{RECORDS}.bak-{stamp}")
        before = path.stat().st_size if path.exists() else 0
        kept = redactions_in(self.export_lines())  # (no text: what they name stays never read)
        if path.exists():
            try:
                os.link(path, backup)
            except OSError:
                shutil.copy2(path, backup)
        crash_point("compact-backup-made")
        self.log.drop_checkpoint()
        atomic_write_bytes(path, b"".join(dumps(r) + b"\n" for r in [*head, *records, *kept, *tail]))
        self.log.drop_checkpoint()
        self.lexcache.invalidate()
        return {"backup": backup.name if before else None, "bytes": {"before": before, "after": path.stat().st_size}}

    def export_lines(self) -> "Iterator[bytes]":
        """Every line of ``records.jsonl``, as it is (a last line without its newline gets one)."""
        try:
            data = read_regular(self.log.path)
        except FileNotFoundError:
            return
        for line in data.splitlines(keepends=True):
            yield line if line.endswith(b"\n") else line + b"\n"

    # -- the lock ------------------------------------------------------------------------------
    def lock(self, verb: str) -> AbstractContextManager[None]:
        return self.write_lock.hold(verb)

    def try_lock(self, verb: str) -> AbstractContextManager[bool]:
        return self.write_lock.try_hold(verb)

    # -- derived state -------------------------------------------------------------------------
    def shared_vectors(self, fingerprint: str, keys: list[str]) -> "dict[str, np.ndarray]":
        return {}  # one machine: the vector generation is the only place vectors live

    def share_vectors(self, fingerprint: str, vectors: "dict[str, np.ndarray]") -> None:
        pass

    def load_lexical(self, max_records: int) -> "tuple[PostingsBM25, int] | None":
        return self.lexcache.load(max_records)

    def save_lexical(self, engine: "PostingsBM25", offset: int) -> None:
        self.lexcache.save(engine, offset)

    def invalidate_lexical(self) -> None:
        self.lexcache.invalidate()

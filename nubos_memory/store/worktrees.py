"""Git worktrees: every agent of a repository reads the others' memory at once (``memory.worktrees``).

Each worktree keeps writing to its own ``records.jsonl``, so a memory written on a branch is committed
and merged with that branch.  With ``memory.worktrees: "shared"`` (the default) every read also sees
the live records of the repository's other worktrees, found through git (``git worktree list
--porcelain``): an agent in any worktree recalls what agents in the others wrote a second ago.

* :func:`resolve_scope` is the one place that says which memory folders a project reads, how each was
  found (flag, environment, current folder, worktree), and the current branch and commit; ``open_store``
  picks the store with it, the store reads what it names, the answers carry it (``scope``).
* :class:`WorktreeStore` is this worktree's :class:`~nubos_memory.store.files.FileStore` (every write,
  the lock, settle, rewrite, redact, derived state and usage stay its own: nothing is ever written into
  another worktree, and no other worktree's lock is taken) whose log reads as ONE log: the other
  worktrees' lines first (by path), then this worktree's, so this worktree's appends extend the state
  incrementally.  When another worktree's log changed (inode, size, mtime) everything is read again
  (a new ``generation``: positions may move; the snapshot re-maps vectors by id and text hash).  While
  this store holds the write lock the others are not looked at, so a write's positions stay put.
  A record present in two worktrees (after a merge) is the same id and content: a quiet repeat.
  The logs have no order between them, so a forget (or redact) in one worktree's log retires that id's
  records in every other log, whichever is read first (a record forgotten in worktree B is gone in A
  too, though A's log, read last in A, holds the record after B's forget).
* Another worktree's memory folder is read only through plain folders and a regular file
  (``O_NOFOLLOW``): a symlink anywhere on the way, or a log that is not a regular file, is skipped with a
  ``worktree-memory-skipped`` warning.  A worktree whose folder is gone (removed, not yet pruned) is
  skipped silently.

Git is asked again only when what it would answer may have changed (this worktree's ``HEAD``, its
branch's ref, ``packed-refs``, the repository's ``worktrees`` folder), so a read costs a few ``stat``
calls, plus reading the other logs' new bytes when they changed.
"""

from __future__ import annotations

import hashlib
import os
import stat
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import codes
from ..config import MEMORY_DIR, STATE_DIR
from ..fsio import open_regular, read_regular
from ..gitcmd import run_git
from ..log import (
    LogScan,
    applied_forgets,
    copied_lines,
    forget_reason,
    line_hash,
    note_redactions,
    pin_op,
    read,
    restart,
    written_by,
)
from ..trust import file_sha256
from .files import RECORDS, FileStore
from .lexcache import LexicalCache
from .recordlog import FileCursor

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ..config import Project
    from ..types import Record

NOT_GIT_RETRY_S = 5.0  # a folder that is not in git is asked again after this long
ZERO = "0" * 40
_PROBLEM_LISTS = ("corrupt", "duplicates", "damaged_groups", "stray_ops", "rolled_back")


@dataclass(frozen=True)
class Folder:
    """One memory folder a project reads."""

    path: str
    found: str  # flag, environment, current folder, given (a Project made in code), worktree
    own: bool  # this worktree's: every write goes here
    branch: str | None = None
    commit: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "found": self.found, "own": self.own, "branch": self.branch,
                "commit": self.commit}


@dataclass(frozen=True)
class Scope:
    """What a project reads: its folders, how each was found, and where in git it is."""

    folders: tuple[Folder, ...]
    worktrees: str  # memory.worktrees as it applies here: shared, own, or none (not a git repository)
    branch: str | None = None
    commit: str | None = None
    shared: bool = False  # other worktrees exist and are read (the WorktreeStore is used)
    skipped: tuple[dict[str, Any], ...] = ()  # warnings: other worktrees' memory not read, and why

    @property
    def others(self) -> tuple[Folder, ...]:
        return tuple(f for f in self.folders if not f.own)

    def as_dict(self) -> dict[str, Any]:
        return {"folders": [f.as_dict() for f in self.folders], "worktrees": self.worktrees,
                "branch": self.branch, "commit": self.commit}


@dataclass(frozen=True)
class _Tree:
    path: Path
    branch: str | None
    commit: str | None


@dataclass
class _Git:
    """What git said about one project root, and what to watch to know it may say otherwise."""

    top: Path
    git_dir: Path
    common_dir: Path
    trees: list[_Tree] = field(default_factory=list)
    watched: tuple[Any, ...] = ()


_GIT: dict[Path, "_Git | float"] = {}  # root -> what git said, or when it said "not a repository"


def _stat_key(path: Path) -> tuple[int, int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _watched(info: _Git) -> tuple[Any, ...]:
    """What changes when git's answer may: this worktree's HEAD, its branch's ref, packed refs, the
    repository's worktrees (each one's HEAD too)."""
    keys: list[Any] = [_stat_key(info.git_dir / "HEAD"), _stat_key(info.common_dir / "packed-refs"),
                       _stat_key(info.common_dir / "worktrees")]
    own = next((t for t in info.trees if t.path == info.top), None)
    if own is not None and own.branch is not None:
        keys.append(_stat_key(info.common_dir / "refs" / "heads" / own.branch))
    try:
        with os.scandir(info.common_dir / "worktrees") as entries:
            keys += sorted((e.name, _stat_key(Path(e.path) / "HEAD")) for e in entries)
    except OSError:
        pass
    return tuple(keys)


def _porcelain(text: str) -> list[_Tree]:
    trees: list[_Tree] = []
    for block in text.strip().split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            key, _, value = line.partition(" ")
            fields[key] = value
        if "worktree" not in fields or "bare" in fields:
            continue
        branch = fields.get("branch")
        commit = fields.get("HEAD")
        trees.append(_Tree(Path(fields["worktree"]), branch.removeprefix("refs/heads/") if branch else None,
                           None if not commit or commit == ZERO else commit))
    return trees


def _git_info(root: Path) -> _Git | None:
    """What git says about ``root`` (cached until something it depends on changes), or None outside git."""
    cached = _GIT.get(root)
    if isinstance(cached, float):
        if time.monotonic() - cached < NOT_GIT_RETRY_S:
            return None
        cached = None
    if cached is not None and _watched(cached) == cached.watched:
        return cached
    if cached is None:
        out = run_git(root, "rev-parse", "--show-toplevel", "--absolute-git-dir", "--git-common-dir")
        lines = out.splitlines() if out else []
        if len(lines) < 3:
            _GIT[root] = time.monotonic()
            return None
        top = Path(lines[0]).resolve()
        cached = _Git(top, Path(lines[1]), (root / lines[2]).resolve())  # a relative one is from -C root
    watched = _watched(cached)
    listing = run_git(root, "worktree", "list", "--porcelain")
    cached.trees = [replace(t, path=t.path.resolve()) if t.path.exists() else t for t in _porcelain(listing or "")]
    cached.watched = watched
    _GIT[root] = cached
    return cached


def worktree_exists(root: Path, stamp: str) -> bool:
    """Whether ``stamp`` (a record's ``git.worktree``: that worktree's path from the main one, ``gitstate.py``)
    names a worktree of ``root``'s repository now."""
    info = _git_info(root)
    if info is None:
        return False
    main = info.common_dir.parent if info.common_dir.name == ".git" else info.common_dir
    try:
        target = (main / stamp).resolve()
    except (OSError, RuntimeError):
        return False
    return any(t.path == target for t in info.trees)


def _other_folder(tree: _Tree, rel: Path) -> tuple[Folder | None, dict[str, Any] | None]:
    """The memory folder of another worktree, if it has a log to read; or the warning why it is not read."""
    path = tree.path
    for part in (*rel.parts, STATE_DIR, MEMORY_DIR, RECORDS):
        path = path / part
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return None, None  # no memory there (or the worktree is gone): nothing to read
        except OSError as exc:
            return None, _skipped(tree, path, exc.strerror or "unreadable")
        if stat.S_ISLNK(st.st_mode):
            return None, _skipped(tree, path, "a symlink (never followed: it could lead anywhere)")
        if part == RECORDS and not stat.S_ISREG(st.st_mode):
            return None, _skipped(tree, path, "not a regular file")
    return Folder(str(path.parent), "worktree", False, tree.branch, tree.commit), None


def _skipped(tree: _Tree, path: Path, why: str) -> dict[str, Any]:
    return {"code": codes.WORKTREE_MEMORY_SKIPPED, "path": str(path), "worktree": str(tree.path),
            "message": f"the memory of worktree {tree.path} is not read: {path} is {why}"}


def resolve_scope(project: "Project") -> Scope:
    """Which memory folders ``project`` reads and how each was found, with the current branch and commit."""
    config = project.config
    if config.backend != "files":
        info = _git_info(project.root)
        return _own_only(project, info, "none", folders=False)
    info = _git_info(project.root)
    mode = config.worktrees if info is not None else "none"
    if info is None or mode != "shared":
        return _own_only(project, info, mode)
    try:
        rel = project.root.resolve().relative_to(info.top)
    except ValueError:
        return _own_only(project, info, mode)
    others = sorted((t for t in info.trees if t.path != info.top), key=lambda t: str(t.path))
    folders: list[Folder] = []
    skipped: list[dict[str, Any]] = []
    for tree in others:
        folder, problem = _other_folder(tree, rel)
        if folder is not None:
            folders.append(folder)
        if problem is not None:
            skipped.append(problem)
    own = _own_only(project, info, mode)
    return replace(own, folders=(*own.folders, *folders), shared=bool(others), skipped=tuple(skipped))


def _own_only(project: "Project", info: _Git | None, mode: str, *, folders: bool = True) -> Scope:
    tree = None if info is None else next((t for t in info.trees if t.path == info.top), None)
    branch, commit = (tree.branch, tree.commit) if tree is not None else (None, None)
    own = (Folder(str(project.memory_dir), project.found, True, branch, commit),) if folders else ()
    return Scope(own, mode, branch, commit)


@dataclass(frozen=True)
class WorktreeCursor:
    """Where the one log was read to: this worktree's file (its own cursor; None: no file yet), the
    other worktrees' logs as they were read (path, device, inode, size, mtime), and where this
    worktree's records begin."""

    own: FileCursor | None
    others: tuple[tuple[str, int, int, int, int], ...]
    own_start: int


def _signature(path: Path, st: os.stat_result) -> tuple[str, int, int, int, int]:
    return (str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _redactions(scan: LogScan) -> int:
    """How many lines the redactions a state knows name."""
    return sum(len(info["hashes"]) for info in scan.redacted.values())


class WorktreeStore(FileStore):
    """This worktree's memory folder, reading the other worktrees' logs too (see the module docstring)."""

    def __init__(self, project: "Project", lock_timeout: float):
        super().__init__(project, lock_timeout)
        self.lexcache = LexicalCache(self.folder, self._digest, self.cache.verified)
        self._others_digest = ""  # identifies the other logs' bytes in the last full read
        self._held = 0  # the write lock is held: the other logs are not looked at
        self._retired: dict[str, dict[str, dict[str, Any]]] = {}  # id -> folder -> its forget, in other logs

    def _digest(self, offset: int) -> str:
        """The persisted lexical postings are valid for this log's first ``offset`` bytes after the other
        logs' bytes as last read."""
        own = file_sha256(self.folder / RECORDS, offset)
        return hashlib.sha256(f"{self._others_digest}:{own}".encode()).hexdigest()

    # -- the place -------------------------------------------------------------------------
    def check(self) -> list[dict[str, Any]]:
        return [*super().check(), *resolve_scope(self.project).skipped]

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "worktrees": [f.path for f in resolve_scope(self.project).others]}

    def owns(self, path: Path) -> bool:
        target = path.resolve()
        return super().owns(path) or any(target == (Path(f.path) / RECORDS).resolve()
                                         for f in resolve_scope(self.project).others)

    # -- the log -----------------------------------------------------------------------------
    def _other_logs(self) -> list[Path]:
        return [Path(f.path) / RECORDS for f in resolve_scope(self.project).others]

    @staticmethod
    def _signatures(logs: list[Path]) -> tuple[tuple[str, int, int, int, int], ...]:
        out = []
        for path in logs:
            try:
                out.append(_signature(path, os.lstat(path)))
            except OSError:
                continue
        return tuple(out)

    def refresh(self, scan: LogScan | None) -> LogScan:
        cursor = scan.cursor if scan is not None and isinstance(scan.cursor, WorktreeCursor) else None
        if scan is None or cursor is None:
            return self._read_all(scan)
        if not self._held and self._signatures(self._other_logs()) != cursor.others:
            return self._read_all(scan)
        if cursor.own is None:
            try:
                st = os.lstat(self.log.path)
            except FileNotFoundError:
                return scan
            scan.cursor = FileCursor(st.st_ino, b"")  # nothing of it read yet: scan.applied is 0
        else:
            scan.cursor = cursor.own
        start = len(scan.records)
        named = _redactions(scan)
        result = self.log.refresh(scan)
        if result is scan:
            self._retire_across(scan, start, None)
        # replaced (memory-compact, memory-redact), or new redactions: a line they name in a log read before
        # (another worktree's) was read as live: read all, every log's redactions first
        if result is not scan or _redactions(scan) != named:
            scan.cursor = cursor
            return self._read_all(scan)
        own = scan.cursor if isinstance(scan.cursor, FileCursor) else None
        scan.cursor = replace(cursor, own=own)
        return scan

    def _read_all(self, previous: LogScan | None) -> LogScan:
        """Read every log again: the other worktrees' (by path), then this worktree's."""
        while True:
            fresh = restart(previous)
            digest = hashlib.sha256()
            signatures = []
            logs = []
            self._retired = {}
            for path in self._other_logs():
                got = self._read_other(path)
                if got is None:
                    continue
                data, st = got
                signatures.append(_signature(path, st))
                digest.update(f"{path}\0{len(data)}\0".encode())
                digest.update(data)
                logs.append((str(path.parent), data))
                note_redactions(fresh, data)
            own_log = self._read_other(self.log.path)
            if own_log is not None:  # every log's redactions before any line: a line they name is read nowhere
                note_redactions(fresh, own_log[0])
            for folder, data in logs:
                start = len(fresh.records)
                self._feed_other(fresh, data, folder)
                self._retire_across(fresh, start, folder)
            fresh.applied = fresh.size = fresh.lines = 0  # from here on, the bytes and lines of this log
            fresh.partial_tail = None
            own_start = len(fresh.records)
            try:
                st_own = os.lstat(self.log.path)
            except FileNotFoundError:
                fresh.cursor = WorktreeCursor(None, tuple(signatures), own_start)
                break
            fresh.cursor = FileCursor(st_own.st_ino, b"")
            if self.log.refresh(fresh) is fresh:
                self._retire_across(fresh, own_start, None)
                own = fresh.cursor if isinstance(fresh.cursor, FileCursor) else None
                fresh.cursor = WorktreeCursor(own, tuple(signatures), own_start)
                break
            # replaced between the lstat and the read: read everything again
        self._others_digest = digest.hexdigest()
        return fresh

    def _others(self) -> list[bytes]:
        """The other worktrees' logs that can be read now (their whole lines)."""
        return [got[0] for path in self._other_logs() if (got := self._read_other(path)) is not None]

    def held_in_copies(self, ids: set[str]) -> dict[str, set[str]]:
        """The file store's copies (backups, torn bytes) and the other worktrees' logs: this worktree cannot
        rewrite those, so ``memory-redact`` names their lines in its own log and they are read nowhere."""
        held = super().held_in_copies(ids)
        others = [data.splitlines(keepends=True) for data in self._others()]
        for rid, hashes in copied_lines(others, ids).items():
            held.setdefault(rid, set()).update(hashes)
        return held

    def _retire_across(self, scan: LogScan, start: int, folder: str | None) -> None:
        """Records read from ``folder``'s log (None: this worktree's) from ``start`` on that another
        worktree's log forgets: retired, wherever that forget was read (the logs have no order between them),
        unless written after it (``created_at`` later than its ``at``: a new statement of that id, live as it
        is when one log forgets and adds again; a forget without a time retires every version)."""
        if not self._retired:
            return
        for pos in range(start, len(scan.records)):
            rec = scan.records[pos]
            forgets = self._retired.get(rec["id"], {})
            # (a log that forgets an id and adds it again after is still retired by another log's forget)
            found = next((f for f, why in forgets.items() if f != folder and written_by(rec, why.get("at"))), None)
            if found is not None and scan.live(rec["id"]) == pos:
                rid = rec["id"]
                scan.dead[pos] = {"line": scan.line_of[pos], **self._retired[rid][found], "worktree": found}
                scan.deaths.append(pos)

    @staticmethod
    def _read_other(path: Path) -> tuple[bytes, os.stat_result] | None:
        """Another worktree's whole lines (a torn last line is a write in progress there), never
        through a symlink; None when it cannot be read now."""
        try:
            fd = open_regular(path, os.O_RDONLY)
        except OSError:
            return None
        try:
            with os.fdopen(fd, "rb", closefd=False) as f:
                data = f.read()
            st = os.fstat(fd)
        finally:
            os.close(fd)
        return data[: data.rfind(b"\n") + 1], st

    def _feed_other(self, scan: LogScan, data: bytes, folder: str) -> None:
        """Apply another worktree's lines; its problems name its folder (their line numbers are its own).  The
        ids its forgets name (those it applies: not a rolled-back change's) are retired in every log read after
        it too (``_retire_across``: a forget of a record that lives in a log read later finds nothing here).
        Not its redactions: they name lines, and every log's are known before any line is read
        (``_read_all``), so a new record of the same id stays live."""
        before = {name: len(getattr(scan, name)) for name in _PROBLEM_LISTS}
        present = len(scan.redacted_present)
        scan.applied = scan.size = scan.lines = 0
        scan.partial_tail = None
        # (a group still open at its end is a write in progress there: held back)
        for op in applied_forgets(scan, data):
            self._retired.setdefault(op["id"], {})[folder] = {"reason": forget_reason(op), "at": op.get("at")}
        for name in _PROBLEM_LISTS:
            for item in getattr(scan, name)[before[name]:]:
                item["worktree"] = folder
        del scan.redacted_present[present:]  # (its lines are never read here; its own writer removes them)

    def rewrite(self, records: "Sequence[Record]") -> dict[str, Any]:
        """``memory-compact`` compacts this worktree's log alone: its own live records (``records``, the
        caller's view of every worktree, is not written here) but those whose line another worktree's
        redaction names (under the write lock this worktree does not read the others: a record written
        anew, its keys reordered, would be a line that redaction no longer names), its redact lines (as
        every store's rewrite), first its forget lines of records another worktree's log holds (they stay
        retired there; a record of that id re-added here, after them, stays live), a pin or unpin where
        its own changed a line's ``hot``; then, read again with every log, a pin or unpin line for each
        record whose pin state is not what every log said before the rewrite (a record another log holds
        too starts from that log's line and pin lines, which no line of this log's could be copied to
        reproduce)."""
        was = self._read_all(None)  # every log now (under the lock the caller's view skipped the others)
        own = self.log.scan()
        try:
            data = read_regular(self.log.path)
        except FileNotFoundError:
            data = b""
        lines = data.split(b"\n")  # (numbered as the log's reader numbers them)
        theirs = [read(data) for data in self._others()]
        elsewhere = {rid for other in theirs for rid in other.position}
        named = {(rid, h) for other in theirs for rid, info in other.redacted.items() for h in info["hashes"]}
        live = [p for p in range(len(own.records)) if p not in own.dead
                and (own.records[p]["id"], line_hash(lines[own.line_of[p] - 1])) not in named]
        head = [op for op in applied_forgets(LogScan(), data) if op["id"] in elsewhere]  # (not a rolled-back one)
        pins = [pin_op(own.records[p]["id"], p in own.hot) for p in live
                if (p in own.hot) != (own.records[p].get("hot") is True)]
        done = self._rewrite([own.records[p] for p in live], head=head, tail=pins)
        after = self._read_all(None)
        hot = {was.records[p]["id"] for p in was.hot_positions()}
        fix = [pin_op(rid, rid in hot) for rid in sorted({was.records[p]["id"] for p in range(len(was.records))
                                                          if p not in was.dead})
               if (pos := after.live(rid)) is not None and (pos in after.hot) != (rid in hot)]
        if fix:
            self.append([], fix)
            done["bytes"]["after"] = self.log.path.stat().st_size
        return done

    # -- the lock ------------------------------------------------------------------------------
    @contextmanager
    def _holding(self, inner: AbstractContextManager[Any]) -> Iterator[Any]:
        with inner as got:
            self._held += 1
            try:
                yield got
            finally:
                self._held -= 1

    def lock(self, verb: str) -> AbstractContextManager[None]:
        return self._holding(super().lock(verb))

    def try_lock(self, verb: str) -> AbstractContextManager[bool]:
        return self._holding(super().try_lock(verb))

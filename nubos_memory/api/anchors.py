"""Anchors: what a record says about the code it cites, stamped on write and checked on every read.

A record may cite code: ``anchors: [{"path": "src/net/retry.py", "lines": [40, 58]}]`` (no
``lines``: the whole file).  On write (:func:`stamp`) each anchor gets ``sha`` (a hash of the cited
text, normalised for whitespace: every line stripped and its inner runs of blanks made one space),
``head`` (the hash of its first normalised line, to find it again) and, inside git, ``commit`` (the
HEAD it was written at).  On read (:class:`AnchorCheck`) each anchor of each hit is one of:

* ``verified``: the cited text is where it was (same lines, same normalised text; for a whole-file
  anchor: the same normalised file);
* ``moved``: the same normalised lines are elsewhere in the same file, or in the file git says the
  cited one was renamed to since ``commit`` (the new ``path`` and ``lines`` are given);
* ``drifted``: the file is there, the cited text is not (found nowhere in it), or it cannot be checked
  (larger than ``MAX_ANCHOR_FILE``, unreadable);
* ``missing``: the file is gone (and git knows no rename of it).

A hit's ``freshness`` is the worst of its anchors' (verified < moved < drifted < missing), or
``unanchored``.  Paths are relative to the project root and stay inside it: a path that leads out of
it (``..``, an absolute path, a symlink pointing outside) is refused on write and reads as
``missing``; a path is stored as written less its ``.`` parts (``./src/a.py`` is ``src/a.py``, as git
names it).  Lines are counted as git and editors count them (a ``\n`` ends one).  Renames are what
``git diff -M`` says since the anchor's commit, asked once per commit (and again when HEAD or the
index changed), for the project's own folder even when it is a subfolder of the repository.  Files are
read once per identity (size, mtime): a warm process checks a hit whose files did not change without
reading them again.  Nothing a check finds is ever written to the log.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from .. import codes
from ..errors import InputError
from ..gitcmd import run_git
from .gitstate import GitState

if TYPE_CHECKING:
    from ..log import LogScan
    from ..types import Hit, Record

FRESHNESS = ("verified", "moved", "drifted", "missing")  # best to worst
MAX_ANCHORS = 32
MAX_RENAME_MAPS = 64  # the renames since a commit kept at once (one git diff each)
MAX_ANCHOR_FILE = 8 << 20  # bytes of a cited file read (a larger one reads as drifted: not checked line by line)
_SPACES = re.compile(r"\s+")
_SPEC = re.compile(r"^(?P<path>.+?)(?::(?P<start>\d+)(?:-(?P<end>\d+))?)?$")


def normalise(line: str) -> str:
    return _SPACES.sub(" ", line.strip())


def digest(lines: list[str]) -> str:
    return hashlib.sha256("\n".join(lines).encode("utf-8", "surrogatepass")).hexdigest()[:32]


def parse_spec(text: str) -> dict[str, Any]:
    """``PATH``, ``PATH:LINE`` or ``PATH:START-END`` (``--anchor``) as an anchor object."""
    m = _SPEC.match(text.strip())
    if not m or not m.group("path"):
        raise InputError(f"an anchor is PATH or PATH:START-END, not {text[:200]!r}", code=codes.RECORD_INVALID_ANCHORS,
                         details={"anchor": text[:200]})
    out: dict[str, Any] = {"path": m.group("path")}
    if m.group("start"):
        start = int(m.group("start"))
        out["lines"] = [start, int(m.group("end") or start)]
    return out


def inside(root: Path, rel: str) -> Path | None:
    """``root/rel`` if it stays inside ``root`` once links are followed; None otherwise."""
    if not rel or rel.startswith(("/", "\\")) or "\x00" in rel:
        return None
    base = root.resolve()
    try:
        target = (base / rel).resolve()
        target.relative_to(base)
    except (OSError, ValueError, RuntimeError):
        return None
    return target


@dataclass
class _File:
    """A cited file as last read: its identity and its normalised lines."""

    key: tuple[int, int, int]  # size, mtime, st_ino (the cited file's identity)
    lines: list[str]
    heads: dict[str, list[int]]  # hash of a normalised line -> the 1-based numbers it is on
    checked: dict[tuple[Any, ...], dict[str, Any]] = field(default_factory=dict)  # anchor -> its check


class AnchorCheck:
    """Stamps anchors on write and checks them on read, for one project (see the module docstring)."""

    def __init__(self, root: Path, git: GitState | None = None):
        self.root = root
        self.git = git if git is not None else GitState(root)  # HEAD, asked of git at most once a second
        self._files: dict[str, _File | None] = {}
        self._renames: dict[tuple[Any, ...], dict[str, str]] = {}  # (commit, HEAD, index) -> old path -> new
        self._index: Path | None = None  # git's index file (``renamed``)

    # -- files --------------------------------------------------------------------------------
    def read(self, rel: str) -> _File | None:
        """The file's normalised lines, read again only when its identity (size, mtime, st_ino) changed;
        a file seen before and unchanged costs one ``stat`` (its path was checked to stay inside the
        project when it was read)."""
        known = self._files.get(rel)
        if known is not None:
            try:
                st = os.stat(self.root / rel)
            except OSError:
                st = None
            if st is not None and known.key == (st.st_size, st.st_mtime_ns, st.st_ino):
                return known
        path = inside(self.root, rel)
        if path is None:
            return None
        try:
            st = path.stat()
        except OSError:
            self._files.pop(rel, None)
            return None
        key = (st.st_size, st.st_mtime_ns, st.st_ino)
        if not path.is_file() or st.st_size > MAX_ANCHOR_FILE:
            return None
        try:
            text = path.read_bytes().decode("utf-8", "replace")
        except OSError:
            return None
        lines = [normalise(x) for x in _lines(text)]
        heads: dict[str, list[int]] = {}
        for number, line in enumerate(lines, start=1):
            heads.setdefault(digest([line]), []).append(number)
        found = _File(key, lines, heads)
        self._files[rel] = found
        return found

    def commit(self) -> str | None:
        """The current HEAD (``gitstate.GitState``: the one look at git a memory keeps)."""
        return self.git.head()

    # -- write ----------------------------------------------------------------------------------
    def stamp(self, anchors: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Anchors as stored: each with the hash of what it cites now (``record-invalid-anchors`` for
        a path outside the project, a file that is not there, or lines past its end)."""
        commit = self.commit()
        out = []
        for anchor in anchors:
            rel = str(PurePosixPath(anchor["path"])) if anchor["path"] else anchor["path"]  # (git's name for it)
            found = self.read(rel)
            if found is None:
                raise InputError(f"anchor {rel!r} is not a readable file inside the project",
                                 code=codes.RECORD_INVALID_ANCHORS, details={"path": rel[:200]})
            lines = anchor.get("lines")
            cited = found.lines if lines is None else found.lines[lines[0] - 1:lines[1]]
            if lines is not None and lines[1] > len(found.lines):
                raise InputError(f"anchor {rel}:{lines[0]}-{lines[1]} runs past the end of the file "
                                 f"({len(found.lines)} lines)", code=codes.RECORD_INVALID_ANCHORS,
                                 details={"path": rel[:200], "lines": lines, "file_lines": len(found.lines)})
            stamped: dict[str, Any] = {"path": rel}
            if lines is not None:
                stamped["lines"] = list(lines)
            stamped["sha"] = digest(cited)
            stamped["head"] = digest(cited[:1])
            if commit is not None:
                stamped["commit"] = commit
            out.append(stamped)
        return out

    # -- read -----------------------------------------------------------------------------------
    def check(self, anchor: dict[str, Any]) -> dict[str, Any]:
        """One stored anchor's status now (see the module docstring)."""
        rel, lines = anchor["path"], anchor.get("lines")
        out: dict[str, Any] = {"path": rel, **({"lines": lines} if lines is not None else {})}
        found = self.read(rel)
        if found is None and self._there(rel):  # too large or unreadable to check: never "missing"
            return {**out, "status": "drifted"}
        if found is None:
            renamed = self.renamed(rel, anchor.get("commit"))
            moved = self.locate(renamed, anchor) if renamed is not None else None
            if moved is not None:
                return {**out, "status": "moved", "now": {"path": renamed, **moved}}
            return {**out, "status": "drifted" if renamed is not None else "missing",
                    **({"now": {"path": renamed}} if renamed is not None else {})}
        memo = (tuple(lines) if lines else None, anchor.get("sha"), anchor.get("head"))
        if memo not in found.checked:  # the same anchor against the same file: the same answer
            found.checked[memo] = self.within(found, rel, anchor)
        return {**out, **found.checked[memo]}

    def within(self, found: _File, rel: str, anchor: dict[str, Any]) -> dict[str, Any]:
        """The status of an anchor whose file is there."""
        lines = anchor.get("lines")
        if lines is None:
            return {"status": "verified" if digest(found.lines) == anchor.get("sha") else "drifted"}
        if digest(found.lines[lines[0] - 1:lines[1]]) == anchor.get("sha"):
            return {"status": "verified"}
        moved = self.locate(rel, anchor)
        if moved is not None:
            return {"status": "moved", "now": {"path": rel, **moved}}
        return {"status": "drifted"}

    def locate(self, rel: str, anchor: dict[str, Any]) -> dict[str, Any] | None:
        """Where the anchor's cited lines are in ``rel`` now (``{"lines": [a, b]}``), if anywhere."""
        lines = anchor.get("lines")
        found = self.read(rel)
        if found is None:
            return None
        if lines is None:
            return {} if digest(found.lines) == anchor.get("sha") else None
        size = lines[1] - lines[0] + 1
        for start in found.heads.get(anchor.get("head") or "", []):
            if digest(found.lines[start - 1:start - 1 + size]) == anchor.get("sha"):
                return {"lines": [start, start + size - 1]}
        return None

    def _there(self, rel: str) -> bool:
        """Whether ``rel`` is a file inside the project (whatever can be read of it)."""
        path = inside(self.root, rel)
        return path is not None and path.is_file()

    def renamed(self, rel: str, commit: Any) -> str | None:
        """The path git says ``rel`` was renamed to since ``commit`` (None: no rename known): one ``git diff``
        per commit, HEAD and state of the index, paths relative to the project root, any file name."""
        head = self.commit()
        if not isinstance(commit, str) or head is None:
            return None
        key = (commit, head, self._index_identity())
        if key not in self._renames:
            if len(self._renames) >= MAX_RENAME_MAPS:  # (a long-lived process whose index keeps changing)
                self._renames.clear()
            out = run_git(self.root, "diff", "--name-status", "-M", "-z", "--relative", commit, "--", ".")
            fields = (out or "").split("\0")
            renames: dict[str, str] = {}
            at = 0
            while at < len(fields) - 1:
                status = fields[at]
                width = 2 if status[:1] in ("R", "C") else 1
                if status.startswith("R") and at + 2 < len(fields):
                    renames[fields[at + 1]] = fields[at + 2]
                at += 1 + width
            self._renames[key] = renames
        return self._renames[key].get(rel)

    def _index_identity(self) -> tuple[int, int] | None:
        """What tells git's index apart from before (a rename staged since), None when it is not found."""
        if self._index is None:
            found = run_git(self.root, "rev-parse", "--path-format=absolute", "--git-path", "index")
            if not found:
                return None
            self._index = Path(found.strip())
        try:
            st = os.stat(self._index)
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size

    def freshness(self, anchors: list[dict[str, Any]] | None) -> tuple[str, list[dict[str, Any]]]:
        """A record's freshness (the worst of its anchors) and each anchor's check."""
        if not anchors:
            return "unanchored", []
        checked = [self.check(a) for a in anchors]
        return max((c["status"] for c in checked), key=FRESHNESS.index), checked


def _lines(text: str) -> list[str]:
    """The file's lines as git and editors count them: a ``\n`` ends one (``str.splitlines`` also breaks at
    form feeds, vertical tabs and other characters a file's lines hold)."""
    lines = text.split("\n")
    return lines[:-1] if lines[-1] == "" else lines


def stamp_anchors(records: "list[Record]", check: AnchorCheck) -> "list[Record]":
    """Records as written: each anchor a write brings without a hash is stamped with what it cites now
    (anchors an import or a replay brings keep their stamps)."""
    for rec in records:
        anchors = rec.get("anchors")
        if anchors and any("sha" not in a for a in anchors):
            fresh = check.stamp([a for a in anchors if "sha" not in a])
            stamped = iter(fresh)
            rec["anchors"] = [a if "sha" in a else next(stamped) for a in anchors]
    return records


def weigh_freshness(hits: "list[Hit]", check: AnchorCheck, factor: float, *, explain: bool = False) -> None:
    """Each hit's ``freshness`` and its anchors' checks; a hit whose cited code drifted or is missing
    keeps ``factor`` of its score (its rank follows); ``explain`` shows the factor."""
    weighed = False
    for hit in hits:
        fresh, checked = check.freshness(hit["record"].get("anchors"))
        hit["freshness"] = fresh
        if checked:
            hit["anchors"] = checked
        stale = fresh in ("drifted", "missing")
        if stale:
            hit["score"] = round(hit["score"] * factor, 6)
            weighed = True
        if explain and "explain" in hit:
            hit["explain"]["freshness_factor"] = factor if stale else 1.0
    if weighed:
        hits.sort(key=lambda h: -h["score"])


def verify_anchors(scan: "LogScan", check: AnchorCheck, listed: int = 500) -> dict[str, Any]:
    """Every live anchored record checked: counts by freshness, the drifted and missing ones (at most
    ``listed``), and for the moved ones their anchors where the code is now (``memory-verify``)."""
    counts = dict.fromkeys(FRESHNESS, 0)
    stale: list[dict[str, Any]] = []
    moved: dict[str, list[dict[str, Any]]] = {}
    anchored = 0
    for pos, rec in enumerate(scan.records):
        if pos in scan.dead or not rec.get("anchors"):
            continue
        anchored += 1
        fresh, checked = check.freshness(rec.get("anchors"))
        counts[fresh] += 1
        if fresh in ("drifted", "missing"):
            stale.append({"id": rec["id"], "title": rec["title"], "freshness": fresh, "anchors": checked})
        if any(c["status"] == "moved" for c in checked):
            moved[rec["id"]] = relocated(rec.get("anchors") or [], checked, check.commit())
    stale.sort(key=lambda s: (FRESHNESS.index(s["freshness"]), s["id"]), reverse=True)
    return {"records": scan.live_count, "anchored": anchored, "freshness": counts, "stale_count": len(stale),
            "stale": stale[:listed], "moved": moved}


def relocated(stored: list[dict[str, Any]], checked: list[dict[str, Any]], commit: str | None
              ) -> list[dict[str, Any]]:
    """Stored anchors with each moved one at its new place (same text: same hashes; the commit now)."""
    out = []
    for anchor, seen in zip(stored, checked):
        if seen["status"] == "moved":
            now = seen.get("now") or {}
            anchor = {**anchor, "path": now.get("path", anchor["path"]), **({"lines": now["lines"]} if "lines" in now
                                                                             else {})}
            if commit is not None:
                anchor["commit"] = commit
        out.append(anchor)
    return out


def uncommitted_moves(moved: dict[str, list[dict[str, Any]]], stored: dict[str, Any], check: AnchorCheck
                      ) -> set[str]:
    """Of the records ``verify_anchors`` found moved (their anchors where the code is now; ``stored``: their
    anchors as the log holds them), those whose code moved into a file git holds changes of (staged, unstaged
    or untracked): a change not committed may be abandoned, and an anchor recorded there would cite nothing.
    Outside git: none."""
    targets: dict[str, set[str]] = {}
    for rid, anchors in moved.items():
        for old, new in zip(stored.get(rid) or [], anchors):
            if old != new:
                targets.setdefault(new["path"], set()).add(rid)
    if not targets or check.commit() is None:
        return set()
    out = run_git(check.root, "status", "--porcelain=v1", "-z", "--untracked-files=all", "--", *sorted(targets))
    prefix = run_git(check.root, "rev-parse", "--show-prefix")  # (porcelain paths are the repository's)
    if out is None or prefix is None:
        return set().union(*targets.values())  # (git cannot say: nothing is taken as committed)
    prefix = prefix.strip()
    dirty = set()
    fields = out.split("\0")
    at = 0
    while at < len(fields) and fields[at]:
        entry = fields[at]
        dirty.add(entry[3:].removeprefix(prefix))
        at += 2 if entry[:1] in ("R", "C") else 1  # (a rename's or copy's source follows)
    return {rid for path, rids in targets.items() if path in dirty for rid in rids}


def describe(hit_anchors: list[dict[str, Any]]) -> list[str]:
    """What changed, in words, for the markdown block (one line per anchor that is not verified)."""
    out = []
    for a in hit_anchors:
        where = a["path"] + (f":{a['lines'][0]}-{a['lines'][1]}" if a.get("lines") else "")
        if a["status"] == "moved":
            now = a.get("now") or {}
            to = now.get("path", a["path"]) + (f":{now['lines'][0]}-{now['lines'][1]}" if now.get("lines") else "")
            out.append(f"cites {where}, which moved to {to}")
        elif a["status"] == "drifted":
            out.append(f"cites {where}, which changed since this was written")
        elif a["status"] == "missing":
            out.append(f"cites {where}, which no longer exists")
    return out

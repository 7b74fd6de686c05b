"""Where in git a record is written, and whether that work is merged into the current line of work.

A record written inside a git repository carries ``git: {branch, commit, worktree}`` of its write
(:meth:`GitState.stamp`; the write path adds it to records that bring none, an import keeps what the
file says):

* ``branch``: ``git symbolic-ref --short -q HEAD`` (null on a detached HEAD);
* ``commit``: the HEAD commit's sha (null in a repository without a commit yet);
* ``worktree``: the worktree's top-level folder relative to the main worktree's (``"."`` for the
  main worktree, e.g. ``"../proj-feature"`` for one made by ``git worktree add``): the same on every
  clone laid out alike, and no home directory in a log that teammates share.

Outside git there is no stamp.  On read, :meth:`GitState.merged` says for each commit whether it is
reachable from the current HEAD (one ``git cat-file --batch-check`` and one ``git rev-list`` for any
number of commits; cached per HEAD, so it costs nothing while HEAD has not moved).  Git is asked
about the state of the worktree at most once a second per process.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ..gitcmd import run_git

REFRESH_S = 1.0  # how long a look at HEAD, branch and worktree is trusted


class GitState:
    """The git state of one project root, cached (see the module docstring)."""

    def __init__(self, root: Path):
        self.root = root
        self._seen: tuple[float, dict[str, Any] | None] | None = None
        self._merged_head: str | None = None
        self._merged: dict[str, bool] = {}

    def stamp(self) -> dict[str, Any] | None:
        """``{branch, commit, worktree}`` now, or None outside git (asked at most once a second)."""
        now = time.monotonic()
        if self._seen is None or now - self._seen[0] > REFRESH_S:
            self._seen = (now, self._look())
        return None if self._seen[1] is None else dict(self._seen[1])

    def head(self) -> str | None:
        found = self.stamp()
        return None if found is None else found["commit"]

    def _look(self) -> dict[str, Any] | None:
        out = run_git(self.root, "rev-parse", "--show-toplevel", "--path-format=absolute", "--git-common-dir")
        if out is None:
            return None
        lines = out.splitlines()
        if len(lines) < 2:
            return None
        top, common = Path(lines[0]), Path(lines[1])
        main = common.parent if common.name == ".git" else common  # a bare repository: its own folder
        try:
            worktree = os.path.relpath(top, main)
        except ValueError:  # another drive (Windows)
            worktree = str(top)
        branch = run_git(self.root, "symbolic-ref", "--short", "-q", "HEAD")
        commit = run_git(self.root, "rev-parse", "-q", "--verify", "HEAD^{commit}")
        return {"branch": branch.strip() or None if branch else None,
                "commit": commit.strip() or None if commit else None,
                "worktree": worktree.replace(os.sep, "/")}

    def merged(self, commits: Iterable[str]) -> dict[str, bool]:
        """For each commit, whether it is reachable from the current HEAD (false without a HEAD, and
        for a commit this repository does not hold: work not fetched, or rebased away)."""
        wanted = set(commits)
        head = self.head()
        if head is None:
            return dict.fromkeys(wanted, False)
        if head != self._merged_head:
            self._merged_head, self._merged = head, {}
        todo = sorted(wanted - set(self._merged))
        if todo:
            self._merged.update(self._ask(head, todo))
        return {c: self._merged[c] for c in wanted}

    def _ask(self, head: str, commits: list[str]) -> dict[str, bool]:
        known = run_git(self.root, "cat-file", "--batch-check=%(objectname) %(objecttype)",
                        stdin="".join(f"{c}\n" for c in commits))
        present = []
        for line, commit in zip((known or "").splitlines(), commits):
            parts = line.split()
            if len(parts) == 2 and parts[1] == "commit":
                present.append((commit, parts[0]))
        out = dict.fromkeys(commits, False)
        if not present:
            return out
        # The commits reachable from any of them but not from HEAD: the unmerged ones among them.
        unmerged = run_git(self.root, "rev-list", "--stdin",
                           stdin="".join(f"{full}\n" for _, full in present) + f"^{head}\n")
        if unmerged is None:
            return out  # git failed: nothing is known to be merged
        outside = set(unmerged.split())
        for commit, full in present:
            out[commit] = full not in outside
        return out


def mark_merged(hits: list[Any], state: GitState) -> None:
    """Each hit whose record has ``git.commit``: ``merged`` (is that commit reachable from HEAD)."""
    commits = {c for c in (commit_of(h["record"]) for h in hits) if c is not None}
    if not commits:
        return
    merged = state.merged(commits)
    for hit in hits:
        commit = commit_of(hit["record"])
        if commit is not None:
            hit["merged"] = merged[commit]


def commit_of(record: Any) -> str | None:
    found = record.get("git")
    commit = found.get("commit") if isinstance(found, dict) else None
    return commit if isinstance(commit, str) and commit else None


def stamp_git(records: list[Any], state: GitState) -> list[Any]:
    """Records as written: those that bring no ``git`` get where this write happens (outside git:
    none).  A record that brings its own (an import, a batch written elsewhere) keeps it."""
    if all(r.get("git") is not None for r in records):
        return records
    found = state.stamp()
    if found is None:
        return records
    return [r if r.get("git") is not None else {**r, "git": dict(found)} for r in records]


class BranchFilter:
    """``--branch current``: the records (live or not: an as-of query looks at the past) written outside
    git or at a commit reachable from HEAD, by position; kept while neither HEAD nor the log changed."""

    def __init__(self, state: GitState):
        self.state = state
        self._kept: tuple[tuple[Any, ...], Any] | None = None

    def positions(self, records: Sequence[Any]) -> Any:
        import numpy as np

        key = (self.state.head(), len(records), id(records))
        if self._kept is not None and self._kept[0] == key:
            return self._kept[1]
        commits = [commit_of(r) for r in records]
        merged = self.state.merged(c for c in commits if c is not None)
        keep = np.fromiter((c is None or merged[c] for c in commits), dtype=bool, count=len(commits))
        kept = np.flatnonzero(keep)
        self._kept = (key, kept)
        return kept

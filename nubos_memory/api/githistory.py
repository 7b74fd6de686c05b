"""What ``memory-redact`` tells a user about git: the text is gone from the memory, not from history.

``records.jsonl`` is committed (that is how a memory travels with its branch), so a redacted line
still sits in every commit that carried it, and ``git revert`` cannot take it out: the
``merge=union`` attribute the memory folder installs applies to revert and cherry-pick too, and a
union "revert" of a line that later commits surround keeps both sides, i.e. the line.  The only
way out of history is a rewrite, which this tool does not do for you (it changes every later
commit id and needs a force-push and fresh clones).  :func:`purge_advice` says which commits carry
the redacted records and writes, beside the log (ignored by git), the expressions file for
``git filter-repo --replace-text`` that replaces those lines in every commit.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..fsio import atomic_write_bytes, dumps
from ..gitcmd import run_git

if TYPE_CHECKING:
    from ..store.base import Store

GIT_TIMEOUT_S = 10.0
MAX_IDS = 50


def _git(root: Path, *args: str) -> str | None:
    return run_git(root, *args, timeout=GIT_TIMEOUT_S)


def expressions(ids: list[str]) -> bytes:
    """``git filter-repo --replace-text`` lines that replace each line naming one of ``ids`` as its
    record id (compact or hand-spaced JSON) by a content-free marker, in every blob of history."""
    out = []
    for rid in ids:
        marker = dumps({"op": "redact", "id": rid, "line_sha256": "purged-from-history", "at": None,
                        "reason": "purged from git history"}).decode()
        # (?m): line by line; lines that are operations (forget, redact, ...) are left as they are
        out.append(f'regex:(?m)^(?![^\\n]*"op" ?:)[^\\n]*"id": ?"{re.escape(rid)}"[^\\n]*$==>{marker}\n')
    return "".join(out).encode()


def purge_advice(root: Path, store: "Store", ids: list[str]) -> dict[str, Any]:
    """Where the redacted records still are in git history and how to purge them (see module docstring)."""
    if store.kind != "files" or not ids:
        return {"repository": None, "note": "this store keeps no git history" if ids else "nothing was redacted"}
    top = _git(root, "rev-parse", "--show-toplevel")
    if top is None:
        return {"repository": None, "note": "the project is not a git repository: nothing else holds the text"}
    folder = getattr(store, "folder", None)
    log = Path(str(folder)) / "records.jsonl" if folder is not None else root / ".nubos-pilot/memory/records.jsonl"
    try:
        rel = log.resolve().relative_to(Path(top.strip()).resolve()).as_posix()
    except ValueError:
        return {"repository": top.strip(), "tracked": False, "note": "records.jsonl lies outside the repository"}
    commits: list[str] = []
    for rid in ids[:MAX_IDS]:
        found = _git(root, "log", "--all", "--format=%h", f'-S"id":"{rid}"', "--", rel) or ""
        commits += [c for c in found.split() if c not in commits]
    advice: dict[str, Any] = {"repository": top.strip(), "path": rel, "commits": commits[:200]}
    if not commits:
        advice["note"] = "no commit carries these records: nothing to purge from history"
        return advice
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    target = log.parent / f"redact-{stamp}.filter-repo.txt"  # git ignores everything here but records.jsonl
    atomic_write_bytes(target, expressions(ids[:MAX_IDS]))
    advice.update(expressions_file=str(target), purge=[
        "pip install git-filter-repo",
        f"git filter-repo --force --replace-text {target}",
        "git push --force --all && git push --force --tags",
    ], note=(f"{len(commits)} commit(s) still carry these records: `git revert` cannot remove them (records.jsonl "
             "merges with merge=union, which applies to revert and cherry-pick too). Rewriting history changes "
             "every later commit id; every teammate must re-clone, and a hosting service may keep old refs "
             "(pull requests) until asked to purge them."))
    return advice

"""The user-level memory: knowledge that is not about one project, in this user's data folder.

It is a memory like a project's (its own ``records.jsonl``, write lock, index and derived files),
rooted at ``$XDG_DATA_HOME/nubos-memory/user/`` (``~/.local/share`` by default; ``userdirs.py``
checks the folder as it checks the config and cache folders: this user's, nobody else's to write).
Its settings are its own ``.nubos-pilot/config.json`` there (the model, α, ...), written only by the
user; it is always enabled and reads no git worktrees.

* ``--scope user`` on a write (``memory-add``, ``memory-index``) or on ``memory-get``,
  ``memory-forget``, ``memory-pin``/``unpin`` works on it (``Memory.for_scope``); a write creates it.
* ``memory-query``/``memory-context`` read ``project``, ``user`` or ``all`` (default ``all`` once a
  user memory exists): both memories fused into one ranking over one scope statistic
  (``search/fused.py``), each hit saying which memory holds it (``memory``: project | user), the
  answer's ``scope`` naming the folders read (``memories``: which were read).
* **Hostile repositories** (adr/0010): nothing in a project names or moves the user memory.  Its
  place comes from the environment only (``XDG_DATA_HOME``, ``HOME``), never from a project's config
  (which has no such key), and nothing about it is written into a project's folder: its vectors,
  postings and usage stay in its own folder, and a fused query records each hit's retrieval in the
  memory that holds it.  What a project can do is ask (``--scope user`` in an agent's command): the
  answer then shows user records, which is what the user memory is for.
* ``memory-eval`` and the benchmarks drive scratch memories that never read it (``Memory(user=False)``).
"""

from __future__ import annotations

import os
import stat
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import codes, userdirs
from ..config import MEMORY_DIR, STATE_DIR, MemoryConfig, Project, read_config_file, validate_section
from ..errors import InputError, StoreError

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..search.syntax import Parsed
    from ..types import Hit, Problem, QueryResult
    from .memory import Memory

USER = "user"  # the user memory's folder inside the data folder, and its name in answers
PROJECT = "project"
ALL = "all"
FOUND = "user data folder"  # how the user memory's folder was found (scope.folders[].found)
RECORDS = "records.jsonl"  # the log's name in a memory folder (the file store's)


def user_root(*, write: bool = False, strict: bool = False) -> Path | None:
    """Where the user memory lives (created owner-only when ``write``), or None when no safe data folder
    exists; a folder there that others could change is refused (``user-memory-unavailable`` on a write,
    and with ``strict``: a read that names the user memory, which must not answer "missing")."""
    found = userdirs.folder("data", write=write)  # (what ``user_data_dir`` reads: looked up once, a query asks thrice)
    base = found.path
    if base is None:
        refused = [r for r in found.refused or [] if r["why"] != "does not exist"]
        if write or (strict and refused):
            raise StoreError("no safe user data folder can hold the user-level memory (memory-stats.user_folders "
                             "says what was refused)", code=codes.USER_MEMORY_UNAVAILABLE,
                             details={"folders": userdirs.describe()})
        return None
    root = base / USER
    why = userdirs.prepare(root, write=write)
    if why is None:
        return root
    if write or (strict and why != "does not exist"):
        raise StoreError(f"the user-level memory's folder {root} {why}", code=codes.USER_MEMORY_UNAVAILABLE,
                         details={"path": str(root), "why": why})
    return None


def user_log(root: Path) -> Path:
    return root / STATE_DIR / MEMORY_DIR / RECORDS


def exists() -> bool:
    """Whether this user has a user-level memory: its log is a regular file (never through a symlink)."""
    root = user_root()
    if root is None:
        return False
    try:
        return stat.S_ISREG(os.lstat(user_log(root)).st_mode)
    except OSError:
        return False


def user_project(root: Path) -> Project:
    """The user memory as a project: its own settings (``.nubos-pilot/config.json`` in its folder, the
    user's to write), always enabled, reading no git worktrees."""
    path = root / STATE_DIR / "config.json"
    doc = read_config_file(path)
    section = (doc or {}).get("memory") or {}
    config = validate_section(section, root) if isinstance(section, dict) and section else MemoryConfig()
    return Project(root=root, config=replace(config, enabled=True, worktrees="own"), config_found=doc is not None,
                   found=FOUND)


def open_user(mem: "Memory", *, create: bool = False) -> "Memory":
    """The user memory, next to ``mem`` (a project's).  ``create``: make it when it does not exist yet
    (a write); otherwise a missing one is ``user-memory-missing``."""
    from .memory import Memory

    if not mem.user_enabled:
        raise not_served(USER)
    root = user_root(write=create, strict=True)
    if root is None or not (create or exists()):
        raise InputError("there is no user-level memory yet; memory-add --scope user creates it",
                         code=codes.USER_MEMORY_MISSING,
                         details={"path": None if root is None else str(user_log(root).parent)})
    user = Memory(user_project(root), user=False)
    user.name = USER
    if create:
        user.store.prepare()
    return user


def reads(mem: "Memory", scope: str | None) -> list[str]:
    """Which memories a read with ``scope`` covers (None: both once a user memory exists).  A memory
    opened without the user memory serves only ``project`` (``user``/``all``: ``query-invalid-scope``),
    and a project that *is* the user memory's folder is read once."""
    if scope in (USER, ALL) and not mem.user_enabled:
        raise not_served(scope)
    if not mem.user_enabled or scope == PROJECT or is_user_memory(mem):
        return [PROJECT]
    if scope == USER:
        return [USER]
    return [PROJECT, USER] if exists() else [PROJECT]


def turned_unsafe(mem: "Memory", scope: str | None, exc: StoreError) -> bool:
    """Whether ``exc`` is the user memory's folder refused during a read that covered both memories (made
    writable by others since ``reads`` decided) and the read may go on with the project's alone: it did not
    name the user memory, and ``reads`` now covers the project only (the refusal is then warned of as in any
    project-only answer: ``project_only``)."""
    return exc.code == codes.USER_MEMORY_UNAVAILABLE and scope != USER and reads(mem, scope) == [PROJECT]


def opened(mem: "Memory", scope: str | None) -> "dict[str, Memory]":
    """The memories a multi-step read with ``scope`` covers (``reads``), each opened once, before the read
    does anything: a user memory whose folder is refused in between is left out as ``turned_unsafe`` says."""
    try:
        return {name: mem.for_scope(name) for name in reads(mem, scope)}
    except StoreError as exc:
        if not turned_unsafe(mem, scope, exc):
            raise
        return {PROJECT: mem}


def still_read(owners: "dict[str, Memory]", result: "QueryResult") -> None:
    """Refuse a multi-step answer whose query read other memories than its first step opened (the user
    memory's folder was refused, or accepted again, in between): ``user-memory-unavailable``, before
    anything is recorded (``Memory.context`` tries once more when ``turned_unsafe`` says it may)."""
    read = set((result.get("scope") or {}).get("memories") or [PROJECT])
    # (one memory on each side is the same one: a project that is the user memory's own folder is read as
    # ``project`` and queried as ``user``)
    if read != set(owners) and len(read) + len(owners) > 2:
        raise StoreError("the user-level memory's folder changed during this call (memory-stats.user_folders says "
                         "how it stands now)", code=codes.USER_MEMORY_UNAVAILABLE,
                         details={"opened": list(owners), "queried": sorted(read)})


def project_only(mem: "Memory", scope: str | None) -> "Callable[[QueryResult], None]":
    """What a project-only answer of a memory that may read the user memory says: which memories it read,
    and when the user memory was left out because its folder is refused (``refused_notes``); looked up now
    (while the query's vector is embedded: ``embed/helper.py``), written into the answer by the function."""
    notes = refused_notes() if mem.user_enabled and scope != PROJECT else []

    def note(result: "QueryResult") -> None:
        if mem.user_enabled:
            result["scope"]["memories"] = [PROJECT]
            result["warnings"] += notes
    return note


def refused_notes() -> "list[Problem]":
    """A warning when the user data folder (or the user memory's folder in it) is refused as unsafe, so a
    read over all memories covers the project only (none when it is simply not there)."""
    try:
        user_root(strict=True)
    except StoreError as exc:
        return [{"code": exc.code, "message": exc.message + "; this answer covers the project's memory only"}]
    return []


def not_served(scope: str) -> InputError:
    """``--scope user``/``all`` asked of a memory opened without the user memory (``Memory(user=False)``)."""
    return InputError("this memory was opened without the user-level memory (Memory(user=False): memory-eval, "
                      "benchmarks); --scope user and all are not served by it", code=codes.QUERY_INVALID_SCOPE,
                      details={"scope": scope})


def is_user_memory(mem: "Memory") -> bool:
    """Whether ``mem``'s folder is the user memory's own (a project opened there with --root)."""
    root = user_root()
    try:
        return root is not None and mem.project.memory_dir.resolve() == user_log(root).parent.resolve()
    except OSError:
        return False


def folders_read(mem: "Memory") -> dict[str, Any]:
    """The project's ``scope`` (``store/worktrees.py``): its memory folders, how each was found, branch, commit."""
    from ..store import scope

    return scope(mem.project).as_dict()


def scope_answer(mem: "Memory", names: list[str], base: dict[str, Any] | None) -> dict[str, Any]:
    """The answer's ``scope``: the project's (its folders, branch, commit) and, when the user memory was
    read, its folder, with ``memories`` saying which memories were read."""
    out = dict(base) if base is not None else folders_read(mem)
    folders = list(out.get("folders") or []) if PROJECT in names else []
    if USER in names:
        user = mem.for_scope(USER)
        folders.append({"path": str(user.project.memory_dir), "found": FOUND, "own": False, "branch": None,
                        "commit": None, "memory": USER})
    out["folders"] = folders
    out["memories"] = names
    return out


def share_embedder(mem: "Memory", user: "Memory") -> None:
    """The user memory embeds queries with the project's embedder when both are configured alike (one model
    loaded, one query vector)."""
    from ..embed import made_alike

    if user.loaded_embedder() is None and made_alike(mem.config, user.config):
        user.use_embedder(mem.embedder)


def fused(mem: "Memory", text: str, parsed: "Parsed | None", options: dict[str, Any], *, scope: str | None,
          branch: str | None, max_tokens: int | None, track: bool) -> "QueryResult | None":
    """``memory-query --scope all``: both memories in one ranking over one scope statistic (``search/fused.py``),
    each hit saying which memory holds it; None when the user memory's folder was refused since ``reads``
    decided (``turned_unsafe``: the caller answers from the project alone, nothing recorded yet)."""
    try:
        return _fused(mem, text, parsed, options, branch=branch, max_tokens=max_tokens, track=track)
    except StoreError as exc:
        if not turned_unsafe(mem, scope, exc):
            raise
        return None


def _fused(mem: "Memory", text: str, parsed: "Parsed | None", options: dict[str, Any], *, branch: str | None,
           max_tokens: int | None, track: bool) -> "QueryResult":
    from ..search.fused import fused_query
    from ..search.plan import Request
    from .anchors import weigh_freshness
    from .context import fit_budget
    from .gitstate import mark_merged

    user = mem.for_scope(USER)
    share_embedder(mem, user)
    req = Request(text, positions=mem.branch_positions(branch), **options)
    answers = fused_query([(PROJECT, mem, req), (USER, user, replace(req, positions=None))], parsed)
    hits: list[Hit] = []
    out: QueryResult | None = None
    for name, _, answer in answers:
        owner = mem if name == PROJECT else user
        mark_merged(answer["hits"], owner.git)
        weigh_freshness(answer["hits"], owner.anchors, mem.config.stale_factor, explain=options["explain"])
        for hit in answer["hits"]:
            hit["memory"] = name
        hits += answer["hits"]
        if out is None:
            out = answer
            continue
        for key, value in answer["counts"].items():
            out["counts"][key] = out["counts"].get(key, 0) + value
        out["warnings"] += [{**w, "memory": name} for w in answer["warnings"] if w["code"] != codes.FILTERS_MATCH_NOTHING]
        if out["degraded"] is None and answer["degraded"] is not None:
            out["degraded"] = {**answer["degraded"], "memory": name}
    assert out is not None
    if hits and any(w["code"] == codes.FILTERS_MATCH_NOTHING for w in out["warnings"]):
        out["warnings"] = [w for w in out["warnings"] if w["code"] != codes.FILTERS_MATCH_NOTHING]
    hits.sort(key=lambda h: -h["score"])  # stable: the project's first on a tie
    out["hits"] = hits[:options["k"]]
    out["scope"] = scope_answer(mem, [PROJECT, USER], None)
    if branch is not None:
        out["query"]["filters"]["branch"] = branch
    if max_tokens is not None:
        out["hits"], out["budget"] = fit_budget(out["hits"], max_tokens)
    if track and options["as_of"] is None:
        for name, owner in ((PROJECT, mem), (USER, user)):
            ids = [h["id"] for h in out["hits"] if h.get("memory") == name]
            if ids and not owner.store.usage.record(ids):
                out["warnings"].append({"code": codes.USAGE_NOT_RECORDED, "memory": name,
                                        "message": "could not record this query's hits as retrieved; retrievals "
                                                   "are not counted"})
    return out


def describe(mem: "Memory") -> dict[str, Any]:
    """``memory-stats``' ``user_memory``: where it is, whether it exists, its records (never loads a model)."""
    root = user_root()
    out: dict[str, Any] = {"path": None if root is None else str(root / STATE_DIR / MEMORY_DIR), "exists": False}
    if root is None or not mem.user_enabled or not exists():
        return out
    scan = mem.for_scope(USER).scan()
    out.update(exists=True, records=len(scan.records), live=scan.live_count,
               read_by_default=True)
    return out

"""This user's folders and settings: config (``~/.config/nubos-memory``), cache (``~/.cache/nubos-memory``) and
data (``~/.local/share/nubos-memory``: the user-level memory).

Nothing in a project can change these: they hold what only the user decides
(the key that signs derived files, whether models may be downloaded) and
caches that must not come from a clone (model file hashes, exported models).

Every folder is checked before use, as the memory folder is (adr/0010): it
must be an absolute path, belong to this user, and not be writable by group or
others (nor sit in a folder others can write to without the sticky bit).  A
folder that fails is refused and named in a warning (``user-folder-unsafe``).
When the usual place cannot be used (``HOME`` unset or relative, a uid with no
passwd entry, a read-only home) the documented fallback is
``$XDG_RUNTIME_DIR/nubos-memory``, else ``$TMPDIR`` (absolute) or ``/tmp``,
in ``nubos-memory-<uid>/`` — never a path relative to the working directory,
which could be inside a project and end up committed.  Where no folder at all
can be used, the memory works without one and says so in every answer
(``user-folder-missing``).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import codes
from .fsio import JSONDecodeError, loads, read_regular

DOWNLOADS_ENV = "NUBOS_MEMORY_ALLOW_DOWNLOADS"
CACHE_ENV = "NUBOS_MEMORY_CACHE"
SETTINGS_FILE = "settings.json"
APP = "nubos-memory"
ENV_KEYS = ("HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME", "XDG_RUNTIME_DIR", "TMPDIR", CACHE_ENV)


def _absolute(value: str | None) -> Path | None:
    """``value`` as a path when it is absolute (the XDG rule: a relative value is ignored)."""
    if not value:
        return None
    path = Path(value)
    return path if path.is_absolute() else None


def home() -> Path | None:
    """``$HOME`` when absolute, else the passwd entry's home; None when neither exists (a uid
    without a passwd entry and no ``HOME``: ``~`` would stay a literal, relative ``~``)."""
    given = _absolute(os.environ.get("HOME"))
    if given is not None:
        return given
    try:
        import pwd

        return _absolute(pwd.getpwuid(os.getuid()).pw_dir)
    except (KeyError, ImportError, OSError):
        return None


def fallback_base() -> Path:
    """Where a user's folders go when the usual ones cannot be used (see module docstring)."""
    base = _absolute(os.environ.get("XDG_RUNTIME_DIR")) or _absolute(os.environ.get("TMPDIR")) or Path("/tmp")
    return base / f"{APP}-{os.getuid()}"


def unsafe(path: Path, *, write: bool) -> str | None:
    """Why ``path`` (an existing folder) must not be used, or None: not ours, writable by others,
    in a folder others can rename it out of, or (``write``) not writable by us."""
    try:
        st = os.stat(path)
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a folder"
    if st.st_uid != os.getuid():
        return f"belongs to uid {st.st_uid}, not to this user"
    if st.st_mode & 0o022:
        return f"is writable by group or others (mode {st.st_mode & 0o777:o})"
    try:
        parent = os.stat(path.parent)
    except OSError:
        parent = None
    if parent is not None and parent.st_mode & 0o002 and not parent.st_mode & stat.S_ISVTX \
            and parent.st_uid != os.getuid():
        return "sits in a folder anyone can write to (no sticky bit)"
    if write and not os.access(path, os.W_OK):
        return "is not writable (a read-only home?)"
    return None


def prepare(path: Path, *, write: bool) -> str | None:
    """Create ``path`` owner-only when missing (``write``), then check it: None when usable, else why not."""
    if write and not os.path.lexists(path):
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            path.mkdir(mode=0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            return f"cannot be created ({exc.strerror})"
    try:
        os.stat(path)
    except FileNotFoundError:
        return "does not exist"
    except OSError as exc:
        return f"cannot be reached ({exc.strerror})"
    return unsafe(path, write=write)


@dataclass
class Folder:
    """One of this user's folders as resolved for this process: where, and what was refused on the way."""

    path: Path | None
    fallback: bool = False
    refused: list[dict[str, str]] | None = None

    def describe(self) -> dict[str, Any]:
        return {"path": None if self.path is None else str(self.path), "fallback": self.fallback,
                "refused": self.refused or []}


def _resolve(kind: str, candidates: list[Path | None], *, write: bool) -> Folder:
    """The first usable folder of ``candidates``, then the fallback (created when ``write``); none for ``data``:
    a memory kept in a temporary folder would vanish with it."""
    refused: list[dict[str, str]] = []
    fallback = fallback_base() / kind
    for path in [*candidates, *(() if kind == "data" else (fallback,))]:
        if path is None:
            continue
        why = _checked(path, fallback=path == fallback, write=write)
        if why is None:
            return Folder(path, fallback=path == fallback, refused=refused)
        refused.append({"path": str(path), "why": why})
    return Folder(None, refused=refused)


def _checked(path: Path, *, fallback: bool, write: bool) -> str | None:
    """Why ``path`` cannot be this user's folder (``prepare``: made when ``write``), None when it can; the
    fallback's own folder first (another user may have made it, and put a link in it)."""
    why = prepare(path.parent, write=write) if fallback else None
    return why or prepare(path, write=write)


_resolved: dict[tuple[str, bool], tuple[tuple[str | None, ...], Folder]] = {}
_resolved_uid: dict[tuple[str, bool], int] = {}  # (the uid each was resolved as: the fallback is named by it)


def folder(kind: str, *, write: bool = True) -> Folder:
    """This user's ``config``, ``cache`` or ``data`` folder (resolved once per process and environment)."""
    env = tuple(os.environ.get(k) for k in ENV_KEYS)
    known = _resolved.get((kind, write))
    if known is not None and known[0] == env and (_still_safe((kind, write), known[1]) if known[1].path is not None
                                                  else not write and _still_missing((kind, write), known[1])):
        return known[1]  # (a folder not found is looked for again, if only by a stat: it may be made meanwhile)
    base = home()
    if kind == "config":
        xdg = _absolute(os.environ.get("XDG_CONFIG_HOME")) or (base / ".config" if base else None)
        candidates = [xdg / APP if xdg else None]
    elif kind == "data":
        xdg = _absolute(os.environ.get("XDG_DATA_HOME")) or (base / ".local" / "share" if base else None)
        candidates = [xdg / APP if xdg else None]
    else:
        xdg = _absolute(os.environ.get("XDG_CACHE_HOME")) or (base / ".cache" if base else None)
        candidates = [_absolute(os.environ.get(CACHE_ENV)), xdg / APP if xdg else None]
    found = _resolve(kind, candidates, write=write)
    _resolved[(kind, write)] = (env, found)
    _resolved_uid[(kind, write)] = os.getuid()
    return found


def _still_safe(key: tuple[str, bool], found: Folder) -> bool:
    """Whether a folder found earlier may still be used as it is: this process's uid is the one it was
    found as, and it passes the checks that found it (``_checked``: a folder made writable by others since,
    or replaced by another user's, is resolved again, and so refused)."""
    assert found.path is not None
    return _resolved_uid.get(key) == os.getuid() and _checked(found.path, fallback=found.fallback, write=key[1]) is None


def _still_missing(key: tuple[str, bool], found: Folder) -> bool:
    """Whether a read's resolution that found no folder, every place refused only as missing, would find
    the same now: the places are the same (from an absolute ``$HOME``, not the passwd entry, and the same
    uid) and none of them exists yet (one ``stat`` each; a query asks twice per call)."""
    refused = found.refused or []
    if not refused or any(r["why"] != "does not exist" for r in refused) \
            or _absolute(os.environ.get("HOME")) is None or _resolved_uid.get(key) != os.getuid():
        return False
    for r in refused:
        try:
            os.stat(r["path"])
        except FileNotFoundError:
            continue
        except OSError:
            return False
        return False
    return True


def user_config_dir(*, write: bool = False) -> Path | None:
    """This user's settings and key folder (``$XDG_CONFIG_HOME/nubos-memory``, ``~/.config`` by default),
    or the fallback; None when no safe folder exists."""
    return folder("config", write=write).path


def user_data_dir(*, write: bool = False) -> Path | None:
    """This user's data folder (``$XDG_DATA_HOME/nubos-memory``, ``~/.local/share`` by default; on macOS too,
    as for the other folders); None when it is not safe to use (no fallback: a memory must not vanish).  It holds the user-level
    memory (``api/usermemory.py``); nothing in a project can name another place."""
    return folder("data", write=write).path


def user_cache_dir() -> Path | None:
    """``$NUBOS_MEMORY_CACHE``, else ``$XDG_CACHE_HOME/nubos-memory`` (``~/.cache`` by default), else the
    fallback; None when no safe, writable folder exists."""
    return folder("cache").path


def notices() -> list[dict[str, Any]]:
    """Warnings about this user's folders met so far in this process: a folder refused because
    others could change what is in it, or no usable folder at all."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    env = tuple(os.environ.get(k) for k in ENV_KEYS)
    for (kind, write), (seen, found) in list(_resolved.items()):
        if seen != env:
            continue  # resolved in another environment (a test, a library user who changed it)
        for refusal in found.refused or []:
            why = refusal["why"]
            if why == "does not exist" or "read-only" in why or why.startswith("cannot be created"):
                continue  # the usual place is not there or not writable: the documented fallback serves
            out[(codes.USER_FOLDER_UNSAFE, refusal["path"])] = {
                "code": codes.USER_FOLDER_UNSAFE, "folder": kind, "path": refusal["path"],
                "message": f"the {kind} folder {refusal['path']} {why}; it is not used"
                           + ("" if found.path is None else f" ({found.path} is used instead)")}
        if found.path is None and write:
            out[(codes.USER_FOLDER_MISSING, kind)] = {
                "code": codes.USER_FOLDER_MISSING, "folder": kind,
                "message": f"no safe, writable {kind} folder could be used (memory-stats.user_folders says what "
                           "was refused): " + ("derived files cannot be signed, so they are not trusted and "
                                               "vectors are computed for each call" if kind == "config" else
                                               "the user-level memory cannot be kept" if kind == "data" else
                                               "exported models and file hashes are not kept between calls")}
    return list(out.values())


def describe() -> dict[str, Any]:
    """Where this user's folders are (``memory-stats``)."""
    out: dict[str, Any] = {}
    env = tuple(os.environ.get(k) for k in ENV_KEYS)
    for (kind, write), (seen, found) in sorted(_resolved.items()):
        if seen == env and (write or kind not in out):
            out[kind] = found.describe()
    return out


def user_settings() -> dict[str, Any]:
    """``settings.json`` in the user's config folder ({} when absent, unreadable or unsafe)."""
    where = user_config_dir()
    if where is None:
        return {}
    try:
        doc = loads(read_regular(where / SETTINGS_FILE))
    except (OSError, JSONDecodeError):
        return {}
    return doc if isinstance(doc, dict) else {}


def allow_downloads() -> bool:
    """Whether this user allows models to be fetched from a hub: ``NUBOS_MEMORY_ALLOW_DOWNLOADS=1``, or
    ``"allow_downloads": true`` in ``settings.json``; never a project's config."""
    env = os.environ.get(DOWNLOADS_ENV)
    if env is not None:
        return env.strip().lower() in ("1", "true", "yes", "on")
    return user_settings().get("allow_downloads") is True

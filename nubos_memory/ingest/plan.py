"""``memory-ingest``: markdown files and folders become records, idempotently.

Each chunk (``markdown.py``) becomes a record titled by its document and
heading ("ADR 0004 — Locking and atomic commit › Context": ten sections called
"Context" are told apart, by the ranking and by the agent reading the hit),
carrying ``source_file`` (the path from the project root), ``chunk_index``,
``heading``, ``importance`` and ``tags`` (frontmatter tags plus its category).
Its id is derived from the source path, the chunk index, the title and the
chunk's text, so:

* an unchanged file produces the ids already live: nothing is written or
  embedded;
* a changed file's new chunks are added and exactly its old chunks that are
  gone are retired (tombstones, reason ``re-ingested``), in one change that
  readers see whole (no duplicates, no stale chunks in results); a chunk
  whose text did not move keeps its id and vector;
* with ``--prune-missing``, chunks of files under the given paths that no
  longer exist are retired (reason ``source-removed``).

Only files inside the project root are read (after resolving symlinks);
``.git``, ``.nubos-pilot``, ``node_modules`` and ``.venv`` are skipped.  A
path that does not exist is an error (a typo must not look like "nothing to
do"), unless ``--prune-missing`` is given and the memory holds chunks from it.
A file that cannot be ingested is reported in ``failed`` and passed over; the
other files are ingested.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import codes
from ..errors import InputError
from ..limits import MAX_ECHO, MAX_TITLE
from ..records import is_domain, validate_batch
from .markdown import FrontmatterError, chunk_markdown

if TYPE_CHECKING:
    from ..log import LogScan
    from ..types import Record

DEFAULT_INCLUDE = ("*.md", "*.markdown")
SKIP_DIRS = frozenset((".git", ".nubos-pilot", "node_modules", ".venv", "__pycache__"))
MAX_FILE_BYTES = 5 << 20
INGEST_REASONS = ("re-ingested", "source-removed")  # the tombstone reasons ingest writes itself
Progress = Callable[[int, int], None]


def _rel(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix()


def _inside(path: Path, root: Path) -> bool:
    try:
        path.relative_to(root)
    except ValueError:
        return False
    return True


OUTSIDE = "resolves outside the project (symlink)"


def _passed_over(path: Path, root: Path) -> str | None:
    """Why a file found under the paths given is not read: it leads outside the project (``OUTSIDE``), or
    it is no regular file (a pipe or a device named like markdown: reading it could wait forever)."""
    if not _inside(path.resolve(), root):
        return OUTSIDE
    return "not a regular file" if path.exists() and not path.is_file() else None  # (a broken link: read, and failed)


def select_files(paths: list[str], root: Path, include: list[str], exclude: list[str]
                 ) -> tuple[list[Path], list[dict[str, str]], list[str], list[str]]:
    """``(files, skipped, prefixes, missing)``: the markdown files to ingest, those passed over and
    why, the project-relative paths the arguments name (the scope of ``--prune-missing``), and the
    project-relative paths of arguments that do not exist (the caller decides: an error, or the
    scope of chunks to prune)."""
    include = include or list(DEFAULT_INCLUDE)
    files: dict[str, Path] = {}
    skipped: list[dict[str, str]] = []
    prefixes: list[str] = []
    missing: list[str] = []

    def wanted(rel: str) -> bool:
        name = rel.rsplit("/", 1)[-1]
        ok = any(fnmatch.fnmatch(rel, g) or fnmatch.fnmatch(name, g) for g in include)
        return ok and not any(fnmatch.fnmatch(rel, g) or fnmatch.fnmatch(name, g) for g in exclude)

    def consider(path: Path) -> None:
        rel = _rel(path, root) if _inside(path, root) else str(path)
        why = _passed_over(path, root)
        if why is not None and (why == OUTSIDE or wanted(rel)):
            skipped.append({"path": rel, "reason": why})
        elif why is None and wanted(rel):
            files[rel] = path

    for arg in paths:
        if not isinstance(arg, str) or not arg or "\x00" in arg or len(arg) > 4096:
            raise InputError(f"{str(arg)[:200]!r} is not a path (empty, too long, or with a NUL byte)",
                             code=codes.INGEST_PATH_INVALID, details={"path": str(arg)[:200]})
        given = Path(arg)
        path = given if given.is_absolute() else root / given  # relative to the project, never the cwd
        path = Path(os.path.normpath(path))
        if not _inside(path, root) or not _inside(path.resolve(), root):
            raise InputError(f"{arg!r} is outside the project {str(root)!r}; only project files are ingested",
                             code=codes.INGEST_PATH_OUTSIDE_PROJECT, details={"path": arg, "root": str(root)})
        if not path.exists():
            missing.append(_rel(path, root))
            continue
        prefixes.append(_rel(path, root) if path != root else "")
        if path.is_file():
            consider(path)
            continue
        for folder, dirs, names in os.walk(path):  # symlinked folders are not followed
            dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
            for name in sorted(names):
                consider(Path(folder) / name)
    return [files[k] for k in sorted(files)], skipped, prefixes, missing


def chunk_id(source: str, index: int, text: str, title: str | None = None) -> str:
    """A chunk's id: a hash of where it is and what it says (its title included; ids from before
    titles carried their document were made without one: ``legacy_ids``)."""
    key = f"{source}\x00{index}\x00{text}" + ("" if title is None else f"\x00{title}")
    return f"md:{hashlib.sha256(key.encode()).hexdigest()[:24]}"


def chunk_title(document: str, heading: str) -> str:
    """"ADR 0004 — Locking › Context": the section's heading under its document's title (the
    document's opening section is titled by the document alone)."""
    title = document if heading == document else f"{document} › {heading}"
    return title if len(title) <= MAX_TITLE else title[: MAX_TITLE - 1] + "…"


def file_records(path: Path, rel: str, record_type: str | None, domain: str | None = None) -> list[dict[str, Any]]:
    """The records a markdown file should be represented by (each with its ``legacy_id``, which
    the caller removes before storing)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # (never waits on a pipe put there since it was found)
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise InputError(f"{rel} is not a regular file", code=codes.INGEST_FILE_UNREADABLE,
                                 details={"path": rel})
            if st.st_size > MAX_FILE_BYTES:
                raise InputError(f"{rel} is larger than {MAX_FILE_BYTES >> 20} MiB",
                                 code=codes.INGEST_FILE_TOO_LARGE, details={"path": rel, "bytes": st.st_size})
            text = f.read().decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{rel} is not UTF-8 text", code=codes.INGEST_FILE_UNREADABLE, details={"path": rel}) from None
    except OSError as exc:
        raise InputError(f"cannot read {rel}: {exc.strerror}", code=codes.INGEST_FILE_UNREADABLE,
                         details={"path": rel}) from None
    try:
        doc = chunk_markdown(text, path.stem)
    except FrontmatterError as exc:
        raise InputError(f"{rel}: {exc}", code=codes.INGEST_FRONTMATTER_INVALID, details={"path": rel}) from None
    tags = list(dict.fromkeys(doc.tags + ([doc.category] if doc.category else [])))
    rtype = record_type or ("learning" if doc.category else "research")
    out = []
    for chunk in doc.chunks:
        first, _, rest = chunk.text.partition("\n")
        title = chunk_title(doc.title, chunk.heading)
        out.append({
            "id": chunk_id(rel, chunk.index, chunk.text, title),
            "legacy_id": chunk_id(rel, chunk.index, chunk.text),
            "type": rtype,
            "title": title,
            "body": rest.strip() if first.lstrip("#").strip() == chunk.heading else chunk.text,
            "tags": tags,
            "source_file": rel,
            "chunk_index": chunk.index,
            "heading": chunk.heading[:1000],
            "importance": doc.importance,
            **({"anchors": [{"path": rel, "lines": list(chunk.lines)}]} if chunk.lines else {}),
            **({"domain": domain} if domain is not None else {}),
        })
    return out


@dataclass
class Documents:
    """What the named paths hold: the records each readable file should be represented by, and
    what was passed over."""

    desired: dict[str, list[Record]] = field(default_factory=dict)
    legacy: dict[str, str] = field(default_factory=dict)  # chunk id -> its id before titles had documents
    skipped: list[dict[str, str]] = field(default_factory=list)  # not markdown, outside via a symlink
    failed: list[dict[str, str]] = field(default_factory=list)  # unreadable, bad frontmatter: not ingested
    prefixes: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)


def read_documents(paths: Sequence[str], root: Path, *, include: Sequence[str], exclude: Sequence[str],
                   record_type: str | None, types: Sequence[str], progress: Progress | None = None,
                   domain: str | None = None) -> Documents:
    """Read and chunk every file the paths name.  A file that cannot be ingested (not UTF-8, too
    large, bad frontmatter, a record it would make is invalid) is reported in ``failed`` and passed
    over; the others are read."""
    if record_type is not None and record_type not in types:
        raise InputError(f"type must be one of {list(types)}", code=codes.RECORD_INVALID_TYPE,
                         details={"type": str(record_type)[:MAX_ECHO], "allowed": list(types)})
    if domain is not None and not is_domain(domain):
        raise InputError("domain is one word of letters, digits, _ . -", code=codes.RECORD_INVALID_DOMAIN,
                         details={"domain": str(domain)[:MAX_ECHO]})
    files, skipped, prefixes, missing = select_files(list(paths), root, list(include), list(exclude))
    docs = Documents(skipped=skipped, prefixes=prefixes, missing=missing)
    for done, path in enumerate(files, start=1):
        rel = _rel(path, root)
        try:
            records = file_records(path, rel, record_type, domain)
            for r in records:
                docs.legacy[r["id"]] = r.pop("legacy_id")
            docs.desired[rel] = validate_batch(records, types)
        except InputError as exc:
            docs.failed.append({"path": rel, "code": exc.code, "message": exc.message})
        if progress is not None:
            progress(done, len(files))
    return docs


def live_sources(scan: "LogScan") -> dict[str, set[str]]:
    """Source file -> the ids of its live chunks."""
    live_by_source: dict[str, set[str]] = {}
    for pos, rec in enumerate(scan.records):
        source = rec.get("source_file")
        if source is not None and pos not in scan.dead:
            live_by_source.setdefault(source, set()).add(rec["id"])
    return live_by_source


def under(source: str, prefix: str) -> bool:
    """Whether the project-relative ``source`` is ``prefix`` or lies in the folder ``prefix``."""
    return prefix == "" or source == prefix or source.startswith(prefix.rstrip("/") + "/")


def plan(scan: "LogScan", docs: Documents, root: Path, *, prune_missing: bool
         ) -> tuple[list[Record], dict[str, str], dict[str, int]]:
    """What bringing the memory up to date with ``docs`` takes: ``(records to add, ids to retire
    with their reason, a report of files new, changed, unchanged and removed)``."""
    desired, prefixes = docs.desired, docs.prefixes
    live_by_source = live_sources(scan)
    # Chunks a user forgot, pruned or superseded stay retired while their text is unchanged (a
    # chunk's id is a hash of its text): only ingest's own retirements are undone by ingesting.
    user_retired = {rid for rid, pos in scan.position.items()
                    if pos in scan.dead and scan.dead[pos].get("reason") not in INGEST_REASONS}
    user_retired |= {new for new, old in docs.legacy.items() if old in user_retired}  # retired before titles changed
    add: list[Record] = []
    retire: dict[str, str] = {}
    report = {"files": len(desired), "new": 0, "changed": 0, "unchanged": 0, "removed": 0, "kept_retired": 0}
    for rel, records in desired.items():
        have = live_by_source.get(rel, set())
        want = {r["id"] for r in records}
        kept_retired = want & user_retired
        report["kept_retired"] += len(kept_retired)
        if want - kept_retired == have:
            report["unchanged"] += 1
            continue
        report["new" if not have else "changed"] += 1
        add += [r for r in records if r["id"] not in have and r["id"] not in kept_retired]
        retire.update(dict.fromkeys(sorted(have - want), "re-ingested"))
    if prune_missing:
        for source, ids in sorted(live_by_source.items()):
            in_scope = any(under(source, p) for p in prefixes)
            if in_scope and source not in desired and not (root / source).exists():
                report["removed"] += 1
                retire.update(dict.fromkeys(sorted(ids), "source-removed"))
    return add, retire, report

"""``memory-ingest``: markdown files and folders become records, idempotently.

Each chunk (``markdown.py``) becomes a record carrying ``source_file`` (the
path from the project root), ``chunk_index``, ``heading``, ``importance`` and
``tags`` (frontmatter tags plus its category).  Its id is derived from the
source path, the chunk index and the chunk's text, so:

* an unchanged file produces the ids already live: nothing is written or
  embedded;
* a changed file's new chunks are added and exactly its old chunks that are
  gone are retired (tombstones, reason ``re-ingested``), in one change that
  readers see whole (no duplicates, no stale chunks in results); a chunk
  whose text did not move keeps its id and vector;
* with ``--prune-missing``, chunks of files under the given paths that no
  longer exist are retired (reason ``source-removed``).

Only files inside the project root are read (after resolving symlinks);
``.git``, ``.nubos-pilot``, ``node_modules`` and ``.venv`` are skipped.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import InputError
from ..records import validate_batch
from .markdown import FrontmatterError, chunk_markdown

if TYPE_CHECKING:
    from ..store.recordlog import LogScan
    from ..types import Record

DEFAULT_INCLUDE = ("*.md", "*.markdown")
SKIP_DIRS = frozenset((".git", ".nubos-pilot", "node_modules", ".venv", "__pycache__"))
MAX_FILE_BYTES = 5 << 20
INGEST_REASONS = ("re-ingested", "source-removed")  # the tombstone reasons ingest writes itself


def _rel(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix()


def _inside(path: Path, root: Path) -> bool:
    try:
        path.relative_to(root)
    except ValueError:
        return False
    return True


def select_files(paths: list[str], root: Path, include: list[str], exclude: list[str]
                 ) -> tuple[list[Path], list[dict[str, str]], list[str]]:
    """``(files, skipped, prefixes)``: the markdown files to ingest, those passed over and why, and
    the project-relative paths the arguments name (the scope of ``--prune-missing``)."""
    include = include or list(DEFAULT_INCLUDE)
    files: dict[str, Path] = {}
    skipped: list[dict[str, str]] = []
    prefixes: list[str] = []

    def wanted(rel: str) -> bool:
        name = rel.rsplit("/", 1)[-1]
        ok = any(fnmatch.fnmatch(rel, g) or fnmatch.fnmatch(name, g) for g in include)
        return ok and not any(fnmatch.fnmatch(rel, g) or fnmatch.fnmatch(name, g) for g in exclude)

    def consider(path: Path) -> None:
        real = path.resolve()
        rel = _rel(path, root) if _inside(path, root) else str(path)
        if not _inside(real, root):
            skipped.append({"path": rel, "reason": "resolves outside the project (symlink)"})
        elif wanted(rel):
            files[rel] = path

    for arg in paths:
        if not isinstance(arg, str) or not arg or "\x00" in arg or len(arg) > 4096:
            raise InputError(f"{str(arg)[:200]!r} is not a path (empty, too long, or with a NUL byte)",
                             code="ingest-path-invalid", details={"path": str(arg)[:200]})
        given = Path(arg)
        path = given if given.is_absolute() else root / given  # relative to the project, never the cwd
        path = Path(os.path.normpath(path))
        if not _inside(path, root) or not _inside(path.resolve(), root):
            raise InputError(f"{arg!r} is outside the project {str(root)!r}; only project files are ingested",
                             code="ingest-path-outside-project", details={"path": arg, "root": str(root)})
        if not path.exists():
            if path.suffix in (".md", ".markdown"):  # a removed file: its chunks can be pruned
                prefixes.append(_rel(path, root))
                continue
            raise InputError(f"{arg!r} does not exist", code="ingest-path-missing", details={"path": arg})
        prefixes.append(_rel(path, root) if path != root else "")
        if path.is_file():
            consider(path)
            continue
        for folder, dirs, names in os.walk(path):  # symlinked folders are not followed
            dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
            for name in sorted(names):
                consider(Path(folder) / name)
    return [files[k] for k in sorted(files)], skipped, prefixes


def chunk_id(source: str, index: int, text: str) -> str:
    digest = hashlib.sha256(f"{source}\x00{index}\x00{text}".encode()).hexdigest()[:24]
    return f"md:{digest}"


def file_records(path: Path, rel: str, record_type: str | None) -> list[dict[str, Any]]:
    """The records a markdown file should be represented by."""
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise InputError(f"{rel} is larger than {MAX_FILE_BYTES >> 20} MiB", code="ingest-file-too-large",
                             details={"path": rel, "bytes": size})
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{rel} is not UTF-8 text", code="ingest-file-unreadable", details={"path": rel}) from None
    except OSError as exc:
        raise InputError(f"cannot read {rel}: {exc.strerror}", code="ingest-file-unreadable",
                         details={"path": rel}) from None
    try:
        doc = chunk_markdown(text, path.stem)
    except FrontmatterError as exc:
        raise InputError(f"{rel}: {exc}", code="ingest-frontmatter-invalid", details={"path": rel}) from None
    tags = list(dict.fromkeys(doc.tags + ([doc.category] if doc.category else [])))
    rtype = record_type or ("learning" if doc.category else "research")
    out = []
    for chunk in doc.chunks:
        first, _, rest = chunk.text.partition("\n")
        out.append({
            "id": chunk_id(rel, chunk.index, chunk.text),
            "type": rtype,
            "title": chunk.heading[:1000],
            "body": rest.strip() if first.lstrip("#").strip() == chunk.heading else chunk.text,
            "tags": tags,
            "source_file": rel,
            "chunk_index": chunk.index,
            "heading": chunk.heading[:1000],
            "importance": doc.importance,
        })
    return out


def read_documents(paths: Sequence[str], root: Path, *, include: Sequence[str], exclude: Sequence[str],
                   record_type: str | None, types: Sequence[str]
                   ) -> tuple[dict[str, list[Record]], list[dict[str, str]], list[str]]:
    """``(records by file, files passed over and why, project-relative path prefixes given)``."""
    files, skipped, prefixes = select_files(list(paths), root, list(include), list(exclude))
    if record_type is not None and record_type not in types:
        raise InputError(f"type must be one of {list(types)}", code="record-invalid-type",
                         details={"type": record_type})
    desired: dict[str, list[Record]] = {}
    for path in files:
        rel = _rel(path, root)
        records = file_records(path, rel, record_type)
        try:
            desired[rel] = validate_batch(records, types)
        except InputError as exc:
            exc.details["path"] = rel
            raise
    return desired, skipped, prefixes


def plan(scan: "LogScan", desired: dict[str, list[Record]], prefixes: Sequence[str], root: Path, *,
         prune_missing: bool) -> tuple[list[Record], dict[str, str], dict[str, int]]:
    """What bringing the memory up to date with ``desired`` takes: ``(records to add, ids to retire
    with their reason, a report of files new, changed, unchanged and removed)``."""
    live_by_source: dict[str, set[str]] = {}
    for pos, rec in enumerate(scan.records):
        source = rec.get("source_file")
        if source is not None and pos not in scan.dead:
            live_by_source.setdefault(source, set()).add(rec["id"])
    # Chunks a user forgot, pruned or superseded stay retired while their text is unchanged (a
    # chunk's id is a hash of its text): only ingest's own retirements are undone by ingesting.
    user_retired = {rid for rid, pos in scan.position.items()
                    if pos in scan.dead and scan.dead[pos].get("reason") not in INGEST_REASONS}
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
            in_scope = any(p == "" or source == p or source.startswith(p.rstrip("/") + "/") for p in prefixes)
            if in_scope and source not in desired and not (root / source).exists():
                report["removed"] += 1
                retire.update(dict.fromkeys(sorted(ids), "source-removed"))
    return add, retire, report

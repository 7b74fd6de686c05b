"""Where a memory lives: the :class:`~nubos_memory.store.base.Store` seam and the stores behind it.

Layers above ``store/`` reach a store only through :func:`open_store` and the Protocol
(``tests/test_architecture.py`` holds them to it); each store's module is imported only when named.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .usage import parse_duration

if TYPE_CHECKING:
    from pathlib import Path

    from ..config import Project
    from .base import Store
    from .worktrees import Scope


def open_store(project: "Project") -> "Store":
    """The store ``memory.backend`` names (the database driver is imported only for postgres)."""
    if project.config.backend == "postgres":
        from .postgres import PgStore

        return PgStore(project, project.config.lock_timeout)
    from .files import FileStore

    if project.config.worktrees == "shared" and scope(project).shared:  # other git worktrees: read them too
        from .worktrees import WorktreeStore

        return WorktreeStore(project, project.config.lock_timeout)
    return FileStore(project, project.config.lock_timeout)


def scope(project: "Project") -> "Scope":
    """The one answer to what ``project`` reads: its memory folders, how each was found (flag, environment,
    current folder, worktree), and the current branch and commit (``worktrees.resolve_scope``)."""
    from .worktrees import resolve_scope

    return resolve_scope(project)


def worktree_exists(root: "Path", stamp: str) -> bool:
    """Whether a record's ``git.worktree`` stamp names a worktree of ``root``'s repository now
    (``worktrees.worktree_exists``)."""
    from .worktrees import worktree_exists as exists

    return exists(root, stamp)


__all__ = ["open_store", "parse_duration", "scope", "worktree_exists"]

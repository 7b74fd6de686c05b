"""Where a memory lives: the :class:`~nubos_memory.store.base.Store` seam and the stores behind it.

Layers above ``store/`` reach a store only through :func:`open_store` and the Protocol
(``tests/test_architecture.py`` holds them to it); each store's module is imported only when named.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .usage import parse_duration

if TYPE_CHECKING:
    from ..config import Project
    from .base import Store


def open_store(project: "Project") -> "Store":
    """The store ``memory.backend`` names (the database driver is imported only for postgres)."""
    if project.config.backend == "postgres":
        from .postgres import PgStore

        return PgStore(project, project.config.lock_timeout)
    from .files import FileStore

    return FileStore(project, project.config.lock_timeout)


__all__ = ["open_store", "parse_duration"]

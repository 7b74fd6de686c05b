"""Where a project's memory is: the root folder and the names under it.

The project root is ``--root``, else ``$NUBOS_PILOT_ROOT``, else the nearest folder upward from the
working directory that contains ``.nubos-pilot/``, else the working directory itself (where memory is
then simply disabled).  Kept apart from ``config.py`` (which re-exports it) and light: a CLI call that
a running ``memory-serve`` answers finds its socket with this before importing anything heavy
(``interfaces/client.py``).
"""

from __future__ import annotations

import os
from pathlib import Path

from . import codes
from .errors import ConfigError

STATE_DIR = ".nubos-pilot"
MEMORY_DIR = "memory"
ROOT_ENV = "NUBOS_PILOT_ROOT"


def find_root(explicit: str | os.PathLike[str] | None = None, cwd: Path | None = None) -> Path:
    """Resolve the project root (see module docstring); ``cwd``: the working directory a relative
    ``explicit`` and the upward search start from (default: this process's)."""
    given = explicit if explicit is not None else os.environ.get(ROOT_ENV) or None
    if given is not None:
        root = Path(given).expanduser()
        if cwd is not None:
            root = cwd / root
        try:
            found = root.is_dir()
        except OSError:  # a name too long, a loop: not a folder we can use
            found = False
        if not found:
            raise ConfigError(
                f"project root {str(root)[:200]!r} is not a folder",
                code=codes.PROJECT_NOT_FOUND,
                details={"root": str(root)},
            )
        return root.resolve()
    start = (cwd or Path.cwd()).resolve()
    for folder in (start, *start.parents):
        if (folder / STATE_DIR).is_dir():
            return folder
    return start

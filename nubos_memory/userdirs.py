"""This user's folders and settings: config (``~/.config/nubos-memory``) and cache (``~/.cache/nubos-memory``).

Nothing in a project can change these: they hold what only the user decides
(the key that signs derived files, whether models may be downloaded) and
caches that must not come from a clone (model file hashes, exported models).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .fsio import JSONDecodeError, loads, read_regular

DOWNLOADS_ENV = "NUBOS_MEMORY_ALLOW_DOWNLOADS"
SETTINGS_FILE = "settings.json"


def user_config_dir() -> Path:
    """``$XDG_CONFIG_HOME/nubos-memory`` (``~/.config`` by default): this user's settings and key."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "nubos-memory"


def user_cache_dir() -> Path:
    """``$NUBOS_MEMORY_CACHE``, else ``$XDG_CACHE_HOME/nubos-memory`` (``~/.cache`` by default)."""
    explicit = os.environ.get("NUBOS_MEMORY_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "nubos-memory"


def user_settings() -> dict[str, Any]:
    """``settings.json`` in the user's config folder ({} when absent or unreadable)."""
    try:
        doc = loads(read_regular(user_config_dir() / SETTINGS_FILE))
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

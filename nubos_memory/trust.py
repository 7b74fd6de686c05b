"""Derived files are trusted only if this user wrote them (adr/0010).

A cloned repository can ship its own ``.nubos-pilot/memory/``.  Everything
in it is parsed as data (JSON, numpy without pickle) except the HNSW graph,
which hnswlib reads without any validation, so a crafted file could corrupt
memory.  Therefore every manifest (and lexical cache description) we write
carries an HMAC-SHA256 made with a key that never leaves this user's config
folder, and the manifest records the sha256 of the graph file.  A manifest
that does not verify is ``manifest-untrusted``: queries answer lexically and
``memory-rebuild`` re-derives everything from ``records.jsonl``.

The key: ``$NUBOS_MEMORY_KEY_FILE``, else ``$XDG_CONFIG_HOME/nubos-memory/
derived-files.key`` (``~/.config`` by default), 32 random bytes created 0600
on first use.  Without a usable key nothing is signed and the graph is never
loaded: vector search falls back to the exact scan.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path
from typing import Any

import orjson

from .userdirs import user_config_dir

KEY_ENV = "NUBOS_MEMORY_KEY_FILE"
SIGNATURE = "signature"
_key: bytes | None = None
_loaded = False


def key_path() -> Path:
    explicit = os.environ.get(KEY_ENV)
    if explicit:
        return Path(explicit)
    return user_config_dir() / "derived-files.key"


def key() -> bytes | None:
    """This user's signing key, created on first use; None if it cannot be read or made."""
    global _key, _loaded
    if _loaded:
        return _key
    _loaded = True
    path = key_path()
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:
            pass
        else:
            try:
                os.write(fd, secrets.token_bytes(32))
                os.fsync(fd)
            finally:
                os.close(fd)
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            data = os.read(fd, 64)
        finally:
            os.close(fd)
        _key = data if len(data) == 32 else None
    except OSError:
        _key = None
    return _key


def _mac(doc: dict[str, Any], secret: bytes) -> str:
    body = {k: v for k, v in doc.items() if k != SIGNATURE}
    return hmac.new(secret, orjson.dumps(body, option=orjson.OPT_SORT_KEYS), hashlib.sha256).hexdigest()


def sign(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with its signature (None when there is no key)."""
    secret = key()
    return {**doc, SIGNATURE: _mac(doc, secret) if secret is not None else None}


def verify(doc: dict[str, Any]) -> bool | None:
    """True: signed by this user; False: not; None: there is no key to tell."""
    secret = key()
    if secret is None:
        return None
    claimed = doc.get(SIGNATURE)
    return isinstance(claimed, str) and hmac.compare_digest(claimed, _mac(doc, secret))


def file_sha256(path: Path, limit: int | None = None) -> str:
    """The sha256 of the file's bytes, or of its first ``limit`` bytes."""
    h = hashlib.sha256()
    remaining = limit
    with open(path, "rb") as f:
        while remaining is None or remaining > 0:
            block = f.read(1 << 22 if remaining is None else min(1 << 22, remaining))
            if not block:
                break
            h.update(block)
            if remaining is not None:
                remaining -= len(block)
    return h.hexdigest()

"""Derived files are trusted only if this user wrote them (adr/0010).

A cloned repository can ship its own ``.nubos-pilot/memory/``.  Everything
in it is parsed as data (JSON, numpy without pickle) except the HNSW graph,
which hnswlib reads without any validation, so a crafted file could corrupt
memory, and vectors, which decide what a query answers.  Therefore every
manifest (and lexical cache description, and the model caches' records) we
write carries an HMAC-SHA256 made with a key that never leaves this user's
config folder, and the manifest records the sha256 of every file.  A manifest
that does not verify is ``manifest-untrusted``: queries answer lexically and
``memory-rebuild`` re-derives everything from ``records.jsonl``.

It fails closed: without a usable key nothing is trusted (:func:`verify` is
False), nothing is signed, and the vector layer is computed from the log for
each call instead (``search/snapshot.py``), with a warning.

The key: ``$NUBOS_MEMORY_KEY_FILE`` (an absolute path), else
``derived-files.key`` in this user's config folder (``userdirs.py``: checked
for owner and mode; the documented fallback when it cannot be used), 32 random
bytes created 0600 on first use.  A key file others can read or that is not
ours is refused (anyone who reads it can sign).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
from pathlib import Path
from typing import Any

import orjson

from . import codes, userdirs

KEY_ENV = "NUBOS_MEMORY_KEY_FILE"
KEY_NAME = "derived-files.key"
SIGNATURE = "signature"
_cache: dict[tuple[str | None, ...], tuple[bytes | None, list[dict[str, Any]]]] = {}


def _read_key(path: Path) -> tuple[bytes | None, str | None]:
    """The key in ``path`` (``None, None`` when there is none), or why it is refused."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, f"cannot be read ({exc.strerror})"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None, "is not a regular file"
        if st.st_uid != os.getuid():
            return None, f"belongs to uid {st.st_uid}, not to this user"
        if st.st_mode & 0o077:
            return None, f"can be read or written by others (mode {st.st_mode & 0o777:o})"
        data = os.read(fd, 64)
    finally:
        os.close(fd)
    return (data, None) if len(data) == 32 else (None, "is not a 32-byte key")


def _create_key(path: Path) -> bytes | None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return _read_key(path)[0]  # another process made it first
    except OSError:
        return None
    try:
        os.write(fd, secrets.token_bytes(32))
        os.fsync(fd)
    finally:
        os.close(fd)
    return _read_key(path)[0]


def _find_key() -> tuple[bytes | None, list[dict[str, Any]]]:
    notes: list[dict[str, Any]] = []
    explicit = os.environ.get(KEY_ENV)
    if explicit:
        path = Path(explicit)
        if not path.is_absolute():
            notes.append({"code": codes.SIGNING_KEY_REFUSED, "path": explicit[:200],
                          "message": f"${KEY_ENV} must be an absolute path; it is not used"})
        else:
            data, why = _read_key(path)
            if data is None and why is None and userdirs.unsafe(path.parent, write=True) is None:
                data = _create_key(path)
            if data is not None:
                return data, notes
            notes.append({"code": codes.SIGNING_KEY_REFUSED, "path": str(path)[:200],
                          "message": f"the signing key {path} {why or 'cannot be created'}; it is not used"})
    readable = userdirs.user_config_dir(write=False)
    for where in (readable, userdirs.user_config_dir(write=True)):
        if where is None:
            continue
        data, why = _read_key(where / KEY_NAME)
        if data is not None:
            return data, notes
        if why is not None:
            notes.append({"code": codes.SIGNING_KEY_REFUSED, "path": str(where / KEY_NAME),
                          "message": f"the signing key {where / KEY_NAME} {why}; it is not used"})
            continue
    writable = userdirs.user_config_dir(write=True)
    if writable is not None and not (writable / KEY_NAME).exists():
        data = _create_key(writable / KEY_NAME)
        if data is not None:
            return data, notes
    notes.append({"code": codes.SIGNING_KEY_UNAVAILABLE,
                  "message": "no signing key could be read or created (see memory-stats.user_folders), so no "
                             "derived file is trusted: vectors are computed from records.jsonl for each call and "
                             f"nothing derived is written. Fix: set ${KEY_ENV} to a file in a folder only you can "
                             "write, or make ~/.config writable"})
    return None, notes


def _env() -> tuple[str | None, ...]:
    return (os.environ.get(KEY_ENV), *(os.environ.get(k) for k in userdirs.ENV_KEYS))


def key() -> bytes | None:
    """This user's signing key, created on first use; None if none can be read or made."""
    found = _cache.get(_env())
    if found is None:
        found = _cache[_env()] = _find_key()
    return found[0]


def notices() -> list[dict[str, Any]]:
    """Warnings about the signing key (in this environment), once it was looked for."""
    found = _cache.get(_env())
    return list(found[1]) if found is not None else []


def available() -> bool:
    """Whether derived files can be signed and verified here."""
    return key() is not None


def _mac(doc: dict[str, Any], secret: bytes) -> str:
    body = {k: v for k, v in doc.items() if k != SIGNATURE}
    return hmac.new(secret, orjson.dumps(body, option=orjson.OPT_SORT_KEYS), hashlib.sha256).hexdigest()


def sign(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with its signature (None when there is no key: nobody will trust it)."""
    secret = key()
    return {**doc, SIGNATURE: _mac(doc, secret) if secret is not None else None}


def verify(doc: dict[str, Any]) -> bool:
    """Whether ``doc`` was signed with this user's key.  Without a key nothing verifies (fail closed)."""
    secret = key()
    if secret is None:
        return False
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

"""Durable file primitives: JSON encoding, fsync, atomic replace.

Derived files are always written to a temporary name in the same folder,
fsynced, and swapped in with ``os.replace`` so that a reader sees the old
file or the new one, never half of either.  Files are created 0600.
"""

from __future__ import annotations

import errno
import gc
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

import orjson

from .faults import crash_point

FILE_MODE = 0o600
DIR_MODE = 0o700


def loads_bulk(data: bytes | memoryview) -> Any:
    """Parse a large JSON document (a log checkpoint, a keymap: a million objects) with the cyclic
    garbage collector paused: it would otherwise walk the objects being built again and again
    (a third of the parse at 100k records).  Nothing made here forms a cycle."""
    was = gc.isenabled()
    gc.disable()
    try:
        return orjson.loads(data)
    finally:
        if was:
            gc.enable()


def dumps(obj: Any, *, pretty: bool = False) -> bytes:
    """Encode ``obj`` as UTF-8 JSON bytes (no trailing newline).

    An integer beyond 64 bits (a user can type one: ``--k 99999999999999999999``)
    is written as its decimal string, and a string that is not valid Unicode (a path
    or an environment value of undecodable bytes) with ``\\x..`` escapes for those
    bytes, rather than failing the whole document.
    """
    option = orjson.OPT_SERIALIZE_NUMPY
    if pretty:
        option |= orjson.OPT_INDENT_2
    try:
        return orjson.dumps(obj, option=option)
    except TypeError:
        return orjson.dumps(_json_safe(obj), option=option)


def _json_safe(obj: Any) -> Any:
    if isinstance(obj, bool) or obj is None:
        return obj
    if isinstance(obj, int):
        return obj if -(1 << 63) <= obj < (1 << 64) else str(obj)
    if isinstance(obj, str):
        return printable(obj)
    if isinstance(obj, dict):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    return obj


def printable(text: str) -> str:
    """``text`` with any undecodable bytes (lone surrogates from ``surrogateescape``) as ``\\x..``."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


loads = orjson.loads
JSONDecodeError = orjson.JSONDecodeError


def fsync_path(path: Path) -> None:
    """fsync a file written by a library that does not (hnswlib, numpy), or a
    directory, so a rename or a new file inside it is durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


fsync_dir = fsync_path


def ensure_dir(path: Path) -> None:
    """Create ``path`` (and parents) owner-only if it does not exist."""
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)


def temp_path(target: Path) -> Path:
    """A fresh temporary path beside ``target`` (same filesystem, so rename is atomic)."""
    fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    return Path(name)


def atomic_write_bytes(target: Path, data: bytes) -> None:
    """Write ``data`` to ``target`` atomically and durably."""
    tmp = temp_path(target)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, FILE_MODE)
        crash_point("before-replace")
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(target.parent)



class NotRegularFile(OSError):
    """A path that should be a plain file is something else (a FIFO would block every reader)."""


def open_regular(path: Path, flags: int, mode: int = FILE_MODE) -> int:
    """``os.open`` of a plain file: never through a symlink, never blocking on a FIFO or a device
    (``O_NONBLOCK`` has no effect on a regular file), and :class:`NotRegularFile` for anything that
    is not a regular file."""
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK, mode)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(errno.EINVAL, "not a regular file", str(path))
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(path: Path) -> bytes:
    """The bytes of ``path``, refusing to follow a symlink (a memory folder from an untrusted
    clone must not make us read outside it) or to wait on a FIFO."""
    fd = open_regular(path, os.O_RDONLY)
    try:
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read()
    finally:
        os.close(fd)

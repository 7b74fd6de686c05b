"""Work a write leaves to a detached process of this user, so that the write answers at once.

Two kinds: HyPE's questions (``memory-hype``, ``hype.py``: asks a generator) and what a one-shot
write leaves to later (``memory-settle``: the side-weight estimate that came due, and a merge of
segments; what ``memory-serve`` does in its idle time).  :func:`start` runs the verb as a detached
process; :func:`only_worker` lets one worker of a kind run per project at a time (a lock file in this
user's cache; without one, always: a second worker only repeats work, it never writes twice, each
verb checks under the write lock).

The project is not trusted: ``python -m`` would put the working directory (often the project) first on
``sys.path``, so a repository's ``orjson.py`` would run.  A worker starts with ``-P`` (no unsafe path is
prepended; ``PYTHONPATH`` and the user's site-packages, both the user's own, still serve) in a folder of
this user (the cache folder, else ``/``), and a daemon thread reaps it.
"""

from __future__ import annotations

import errno
import hashlib
import os
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

_children: set["subprocess.Popen[bytes]"] = set()  # started here and not yet reaped
_children_lock = threading.Lock()


def running() -> "list[subprocess.Popen[bytes]]":
    """The workers this process started that have not exited yet (the tests wait for them)."""
    with _children_lock:
        return list(_children)


def _reap(proc: "subprocess.Popen[bytes]") -> None:
    """Wait for a started worker so that a long-running server (memory-http, MCP) keeps no zombie."""
    try:
        proc.wait()
    finally:
        with _children_lock:
            _children.discard(proc)


def start(verb: str, root: Path, extra: Sequence[str] = ()) -> bool:
    """Start ``np-tools <verb> --root <root> <extra...>`` detached; whether it started (a failure costs
    nothing but the work waiting for the next one)."""
    from ..userdirs import user_cache_dir

    cache = user_cache_dir()
    try:
        argv = [sys.executable, "-P", "-m", "nubos_memory", verb, "--root", os.path.abspath(root), *extra]
        proc = subprocess.Popen(argv, cwd=str(cache) if cache is not None else "/", stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                                close_fds=True)
    except OSError:
        return False
    with _children_lock:
        _children.add(proc)
    threading.Thread(target=_reap, args=(proc,), name=f"{verb}-reaper", daemon=True).start()
    return True


@contextmanager
def only_worker(kind: str, root: Path) -> Iterator[bool]:
    """Whether this process is the project's only ``kind`` worker right now (held while inside)."""
    from ..userdirs import user_cache_dir

    cache = user_cache_dir()
    if cache is None:
        yield True
        return
    import fcntl

    folder = cache / "generator"  # (where the first kind's locks were, kept for every kind)
    digest = hashlib.sha256(str(root).encode()).hexdigest()[:16]
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(folder / f"{kind}-{digest}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:  # no lock file to be had (a full disk, a file in the way): as without a cache
        yield True
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                yield False  # another holds it
                return
            yield True  # a file system without locks: as without a cache
            return
        yield True
    finally:
        os.close(fd)


def busy(kind: str, root: Path) -> bool:
    """Whether a ``kind`` worker of the project runs now (so another need not be started)."""
    with only_worker(kind, root) as alone:
        return not alone

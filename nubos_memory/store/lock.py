"""The memory's single cross-process write lock.

``filelock`` takes an ``flock`` on ``.lock``; the kernel drops it when its
holder dies, so a lock left by a dead process is reclaimed by the next
writer.  Who holds it (pid, host, verb, since) is written to
``.lock.holder.json`` after acquiring, so a ``lock-timeout`` can say who is
in the way.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from pathlib import Path
from typing import Any

from ..errors import LockTimeout
from ..fsio import FILE_MODE, atomic_write_bytes, dumps, loads, read_regular

LOCK_FILE = ".lock"
HOLDER_FILE = ".lock.holder.json"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class WriteLock:
    """``with lock.hold("memory-add"):`` spans read → decide → write."""

    def __init__(self, folder: Path, timeout: float):
        self.folder = folder
        self.timeout = timeout
        self._lock: Any = None  # a filelock.FileLock, made on first use: readers never need it

    def holder(self) -> dict[str, Any] | None:
        """The last recorded holder, with whether that process is still alive."""
        try:
            info = loads(read_regular(self.folder / HOLDER_FILE))
        except (OSError, ValueError):
            return None
        if isinstance(info, dict) and isinstance(info.get("pid"), int):
            info["alive"] = info.get("host") != socket.gethostname() or _alive(info["pid"])
            return info
        return None

    @contextmanager
    def hold(self, verb: str, timeout: float | None = None) -> Iterator[None]:
        from filelock import FileLock, Timeout

        wait = self.timeout if timeout is None else timeout
        if self._lock is None:
            self._lock = FileLock(str(self.folder / LOCK_FILE), mode=FILE_MODE, thread_local=False)
        try:
            self._lock.acquire(timeout=wait)
        except Timeout:
            raise LockTimeout(
                f"another process holds the memory write lock (waited {wait:g}s)",
                details={"waited_s": wait, "holder": self.holder(), "lock": str(self.folder / LOCK_FILE)},
            ) from None
        try:
            atomic_write_bytes(
                self.folder / HOLDER_FILE,
                dumps({"pid": os.getpid(), "host": socket.gethostname(), "verb": verb, "since": time.time()}),
            )
            yield
        finally:
            self._lock.release()

    def try_hold(self, verb: str) -> AbstractContextManager[bool]:
        """A context manager that yields True when the lock was free, False otherwise."""
        return try_enter(self.hold(verb, timeout=0))


@contextmanager
def try_enter(hold: AbstractContextManager[None], refused: tuple[type[Exception], ...] = (LockTimeout,)
              ) -> Iterator[bool]:
    """Every store's ``try_lock``: enter ``hold`` (a lock taken without waiting) and yield True, or
    yield False when it raises one of ``refused``; a lock entered is released however the block ends."""
    with ExitStack() as stack:
        try:
            stack.enter_context(hold)
        except refused:
            yield False
            return
        yield True

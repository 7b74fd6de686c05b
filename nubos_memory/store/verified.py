"""Which derived files this user's processes already checked, so that a new process need not hash them again.

A one-shot call checked the sha256 of every derived file it read against the signed manifest: at
100k records the vectors alone are 150 MB (0.1 s), at a million 1.5 GB (about a second), on every
call (issue 27).  ``verified.json`` remembers, per file name, the sha256 a process found and the
file's identity when it found it: size, inode, device, mtime and ctime in nanoseconds.  A later
process that finds the same identity and is asked for the same sha256 trusts the file without
reading it.  Any write to the file, a ``touch``, a ``chmod`` or a replacement changes its ctime or
inode, which no one but the kernel sets, so it is hashed again, as git's index trusts a file whose
stat data did not change.  Like git, it does not remember a file whose ctime is so recent that a
change within the same clock tick could keep it (``SETTLE_S``): a file written in the last seconds
is hashed by every reader until it has settled.

The log is not derived, but what is derived from it names the sha256 of the bytes it was made from
(the checkpoint of its state, the lexical index): such a check of its first N bytes is remembered the
same way, by the log's identity then (``check_prefix``), so repeated calls on an unchanged log do not
hash it again; any append changes the identity.

It is derived data: signed with this user's key (``trust.py``) like the manifest, never trusted
otherwise, written aside and swapped in atomically by whichever process learned something new
(readers too: losing an entry to a concurrent writer of it costs one more hash, never a wrong
answer), and forgetting entries of files that are gone.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..fsio import JSONDecodeError, atomic_write_bytes, dumps, loads, read_regular
from ..trust import available, file_sha256, sign, verify

NAME = "verified.json"
FORMAT = 1
SETTLE_S = 2.0  # a file changed less than this long ago is not remembered (a change in the same tick)
PREFIX = "[:"  # an entry "records.jsonl[:N]": the first N bytes of the log were checked (``check_prefix``)


def _identity(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_ino, st.st_dev, st.st_mtime_ns, st.st_ctime_ns]


class Verified:
    """The checked files of one folder (module docstring)."""

    def __init__(self, folder: Path):
        self.folder = folder
        self._entries: dict[str, list[Any]] | None = None

    def _read(self) -> dict[str, list[Any]]:
        """The entries on disk (none when missing, damaged or not signed by this user)."""
        try:
            doc = loads(read_regular(self.folder / NAME))
            if isinstance(doc, dict) and doc.get("format") == FORMAT and verify(doc) and isinstance(doc.get("files"), dict):
                return {str(k): v for k, v in doc["files"].items() if isinstance(v, list)}
        except (OSError, JSONDecodeError):
            pass
        return {}

    def _load(self) -> dict[str, list[Any]]:
        if self._entries is None:
            self._entries = self._read()
        return self._entries

    def check_prefix(self, path: Path, length: int, sha256: Any) -> bool:
        """Whether the first ``length`` bytes of ``path`` (the log, which grows) are those whose sha256 is
        ``sha256``: remembered like :meth:`check`, by the file's identity (an append changes it too)."""
        return self.check(path, sha256, lambda: file_sha256(path, length), key=f"{path.name}{PREFIX}{length}")

    def check(self, path: Path, sha256: Any, digest: Callable[[], str] | None = None,
              st: os.stat_result | None = None, key: str | None = None) -> bool:
        """Whether ``path`` holds the bytes whose sha256 is ``sha256``: known from an earlier check of
        the same file, else ``digest()`` (the sha256 of what the caller read; None: the file's, hashed
        here) is compared and remembered.  ``st``: the file's stat taken through the descriptor
        ``digest`` reads (else the path's, now).  ``key``: what the check is remembered as (default: the
        file's name)."""
        key = key or path.name
        if digest is None:
            def digest() -> str:
                return file_sha256(path)

        if not isinstance(sha256, str) or not available():
            return isinstance(sha256, str) and digest() == sha256
        try:
            before = st if st is not None else os.stat(path)
        except OSError:
            return False
        entries = self._load()
        if entries.get(key) == [*_identity(before), sha256]:
            return True
        if digest() != sha256:
            return False
        if time.time_ns() - before.st_ctime_ns > SETTLE_S * 1e9:
            entries[key] = [*_identity(before), sha256]
            self._save(key, entries[key])
        return True

    def _save(self, key: str, entry: list[Any]) -> None:
        """Add one entry to what is on disk now (another process may have added others), keeping only
        files still there, and of a file's prefixes only those checked in its present identity (best
        effort: derived data)."""
        merged = {**self._read(), **(self._entries or {}), key: entry}
        name = key.split(PREFIX)[0]
        kept = {k: e for k, e in merged.items() if (self.folder / k.split(PREFIX)[0]).is_file()
                and not (PREFIX in k and k.split(PREFIX)[0] == name and e[:5] != entry[:5])}
        self._entries = kept
        try:
            atomic_write_bytes(self.folder / NAME, dumps(sign({"format": FORMAT, "files": kept})))
        except OSError:
            pass

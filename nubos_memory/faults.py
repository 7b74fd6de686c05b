"""Crash points for the reliability suite (``tests/test_reliability_crash.py``).

``NUBOS_MEMORY_CRASH_AT=<name>[@<n>]`` makes the process kill itself with
SIGKILL the n-th time (default: the first) it reaches ``crash_point(name)``:
exactly what a power cut or ``kill -9`` at that instant leaves behind.  Unset,
as always outside that suite, ``crash_point`` is a no-op.  The points sit
between the steps whose order the durability guarantees depend on
(adr/0004, adr/0008).
"""

from __future__ import annotations

import os
import signal

_target = os.environ.get("NUBOS_MEMORY_CRASH_AT", "")
_name, _, _nth = _target.partition("@")
_remaining = int(_nth) if _nth.isdigit() else 1

POINTS = (
    "append-torn",           # half of an append written (a torn line or group), then death
    "after-append",          # the change is durable, nothing derived is written, the caller has no answer
    "commit-files-written",  # a new generation's files exist, the manifest does not name them yet (a merge too)
    "segment-files-written",  # an appended segment's files exist, the manifest does not name them yet
    "before-replace",        # a temporary file is written and fsynced, not yet renamed over its target
    "compact-backup-made",   # compaction linked the backup, the new log is not in place
    "rebuild-embedded",      # a rebuild computed its vectors, nothing is committed
    "lexical-npz-written",   # a lexical cache array file is written, its description is not
)


def crash_point(name: str) -> None:
    """Die here if the environment asks for it (see module docstring)."""
    global _remaining
    if _name == name:
        _remaining -= 1
        if _remaining <= 0:
            os.kill(os.getpid(), signal.SIGKILL)


def armed(name: str) -> bool:
    """Whether the next ``crash_point(name)`` will kill (for points that first do half the work)."""
    return _name == name and _remaining <= 1

"""Progress of long work (embedding, reading files, evaluating): who reports it and how.

The library reports ``(stage, done, total)`` to a :data:`Reporter` its caller
passes in; it never prints.  The CLI turns reports into a bar on a terminal's
stderr, or into JSON lines on stderr for an agent (``--progress json``);
stdout carries only the answer.
"""

from __future__ import annotations

from collections.abc import Callable

Reporter = Callable[[str, int, int], None]  # (stage, done, total)
Progress = Callable[[int, int], None]  # one stage's (done, total)


def stage(report: Reporter | None, name: str) -> Progress | None:
    """``report`` for the one stage ``name`` (None when nobody listens)."""
    if report is None:
        return None
    return lambda done, total: report(name, done, total)

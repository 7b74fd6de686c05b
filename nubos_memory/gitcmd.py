"""Asking git: the one way every part of nubos-memory runs it (anchors, branches, worktrees, history).

Stdin is never inherited (``memory-mcp``'s stdin is the protocol), git takes no optional locks (a
read must not block an agent's commit), and any failure — no git, not a repository, too slow — is
None, never an exception: git is advice here, the log is the truth.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

TIMEOUT_S = 10.0


def run_git(root: Path, *args: str, stdin: str | None = None, timeout: float = TIMEOUT_S) -> str | None:
    """``git -C root args``'s stdout, or None (no git, not a repository, an error, too slow)."""
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0"}
    argv = ["git", "-C", str(root), *args]
    try:
        if stdin is None:
            done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout,
                                  env=env)
        else:
            done = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout, env=env)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None

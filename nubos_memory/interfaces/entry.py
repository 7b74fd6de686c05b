"""``np-tools`` and ``python -m nubos_memory``: a command line a running ``memory-serve`` of ours answers
is handed to it before anything heavy is imported (``client.quick``: a call then costs little more
than starting Python); any other runs through the CLI (``cli.main``)."""

from __future__ import annotations

import errno
import json
import os
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command line; return the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    from .client import quick

    served = quick(args)
    if isinstance(served, tuple):
        code, stream, text = served
        return emit(stream == "stdout", text) or code
    from .cli import main as run_here

    return run_here(args, untrusted=served)  # (a server that may not be ours: said, and not tried again)


def emit(to_stdout: bool, text: str | None) -> int | None:
    """Write an answer (``text``; None: nothing) to stdout or stderr.  When stdout cannot take it (closed, a
    pipe whose reader is gone, a full disk), say so on stderr in the error envelope and give the exit code of
    ``io-error`` (74); None otherwise.  (What the verb did is done: a record added stays.)"""
    if text is None:
        return None
    stream = sys.stdout if to_stdout else sys.stderr
    try:
        if stream is None:
            raise OSError(errno.EBADF, "the stream is closed")
        stream.write(text)
        stream.flush()
        return None
    except (OSError, ValueError) as exc:
        if not to_stdout:
            return None  # (nowhere left to say it: the verb's own exit code stands)
        from ..errors import IOFailure

        failed = IOFailure(f"cannot write the answer to stdout: {getattr(exc, 'strerror', None) or exc}",
                           details={"errno": getattr(exc, "errno", None)})
        try:  # (nothing more goes to it, not even Python's own flush at exit)
            os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
        except OSError:
            pass
        try:
            if sys.stderr is not None:
                envelope = json.dumps({"error": failed.to_dict()}, ensure_ascii=False, separators=(",", ":"))
                sys.stderr.write(envelope + "\n")
                sys.stderr.flush()
        except (OSError, ValueError):
            pass
        return failed.exit_code

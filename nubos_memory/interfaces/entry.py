"""``np-tools`` and ``python -m nubos_memory``: a command line a running ``memory-serve`` of ours answers
is handed to it before anything heavy is imported (``client.quick``: a call then costs little more
than starting Python); any other runs through the CLI (``cli.main``)."""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command line; return the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    from .client import quick

    served = quick(args)
    if isinstance(served, tuple):
        code, stream, text = served
        if text is not None:
            out = sys.stdout if stream == "stdout" else sys.stderr
            out.write(text)
            out.flush()
        return code
    from .cli import main as run_here

    return run_here(args, untrusted=served)  # (a server that may not be ours: said, and not tried again)

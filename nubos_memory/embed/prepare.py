"""``python -m nubos_memory.embed.prepare``: get the default model ready before its first real use.

``bin/setup`` and ``bin/demo`` run it, so an agent's first one-shot call is already fast: it
exports the packaged model to ONNX and checks its parity once (adr/0012), makes the int8 copy that
embeds queries (adr/0022), or says why torch will run it instead.  Prints the runtime's description as JSON on stdout.
"""

from __future__ import annotations

import sys

from ..fsio import dumps
from ..limits import DEFAULT_MODEL


def main() -> int:
    from ..errors import NubosMemoryError
    from .model import ModelEmbedder

    embedder = ModelEmbedder(sys.argv[1] if len(sys.argv) > 1 else DEFAULT_MODEL)
    try:
        embedder.runtime()
        embedder.query_runtime()  # and the int8 copy that embeds queries (adr/0022)
    except NubosMemoryError as exc:
        sys.stdout.write(dumps({"error": exc.to_dict()}).decode() + "\n")
        return exc.exit_code
    sys.stdout.write(dumps({"model": embedder.model_id, **embedder.runtime_info()}).decode() + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Light verbs never import torch or sentence-transformers (checked in a fresh process)."""

from __future__ import annotations

import json
import subprocess
import sys

from .conftest import REPO

PROBE = """
import io, json, sys, contextlib
from nubos_memory.interfaces import cli
out = io.StringIO()
with contextlib.redirect_stdout(out):
    codes = [cli.main(argv) for argv in json.loads(sys.argv[1])]
heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'sentence_transformers', 'transformers'))
print(json.dumps({"codes": codes, "heavy": heavy}))
"""


def _probe(argvs):
    proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argvs)], capture_output=True, text=True,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_init_stats_and_empty_query_stay_light(tmp_path):
    root = str(tmp_path / "p")
    (tmp_path / "p").mkdir()
    # Default config: the real sentence-transformers provider.
    res = _probe([["memory-init", "--root", root], ["memory-stats", "--root", root],
                  ["memory-query", "--root", root, "anything"], ["memory-query", "--root", root, "the of"]])
    assert res["codes"] == [0, 0, 0, 0]
    assert res["heavy"] == []


def test_probe_detects_heavy_imports(tmp_path):
    """The probe itself can fail: a write over the torch runtime does load sentence-transformers."""
    from .conftest import write_config

    root = tmp_path / "p"
    root.mkdir()
    assert _probe([["memory-init", "--root", str(root)]])["codes"] == [0]
    write_config(root, runtime="torch")
    res = _probe([["memory-add", "--root", str(root), "--type", "learning", "--title", "t", "--body", "b"]])
    assert res["codes"] == [0]
    assert "sentence_transformers" in res["heavy"]


def test_verbs_that_embed_nothing_never_import_torch(tmp_path):
    """Over a store indexed for the default model, forget, prune, compact, stats and a lexical
    query run in a fresh process without importing torch or sentence-transformers."""
    from nubos_memory import Memory
    from nubos_memory.config import DEFAULT_MODEL
    from nubos_memory.embed import HashEmbedder
    from nubos_memory.embed.model import ModelEmbedder

    class StandIn(HashEmbedder):  # vectors under the packaged model's fingerprint, without the model
        provider = "local"
        pooling = ModelEmbedder.pooling

        def __init__(self):
            super().__init__("hash-384")
            self.model_id = DEFAULT_MODEL

        def files_digest(self):
            return ModelEmbedder(DEFAULT_MODEL).files_digest()

    root = tmp_path / "p"
    root.mkdir()
    assert _probe([["memory-init", "--root", str(root)]])["codes"] == [0]
    mem = Memory.open(root, embedder=StandIn())
    mem.index([{"id": f"n{i}", "type": "learning", "title": f"note {w}", "body": f"about {w}"}
               for i, w in enumerate(["kafka", "redis", "postgres", "pnpm"])])
    assert mem.stats()["consistency"]["consistent"]
    res = _probe([["memory-stats", "--root", str(root)],
                  ["memory-query", "--root", str(root), "--mode", "lexical", "kafka"],
                  ["memory-forget", "--root", str(root), "n0"],
                  ["memory-prune", "--root", str(root), "--unused-for", "30d"],
                  ["memory-compact", "--root", str(root)]])
    assert res["codes"] == [0, 0, 0, 0, 0]
    assert res["heavy"] == []

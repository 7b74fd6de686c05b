"""``memory-index`` throughput against the bare model, each in a process of its own (issue 27).

Two record shapes of real text (SciFact), as in ``bench_runtime.py``: agent-note sized (one piece a
record) and long abstracts (several pieces, pooled).  Per round and shape, two fresh processes, one
after the other:

* the product: ``Memory.open`` of an empty memory with its default embedder (the packaged model on
  ONNX), one warm-up embed, then ``Memory.index`` of the sample, timed, twice: as a one-shot
  ``np-tools memory-index`` runs it (the side-weight estimate the first write makes due is left to a
  background ``memory-settle``, which is not started here: it runs after the write answered), and as a
  library caller runs it (the estimate made on the write, included);
* the baseline: sentence-transformers on torch, one warm-up encode, then ``encode`` of exactly the
  pieces the product embeds, at the same batch size (32).

So torch and ONNX never share a process (or its thread pools).  The faster of ``--rounds`` passes
counts on each side.  Prints a table; writes bench/results/index-<date>.json.

Run: .venv/bin/python bench/bench_index.py [--rounds 3] [--datasets FOLDER]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import benchdata  # noqa: E402
from bench_scale import real_texts  # noqa: E402

ENV = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "NUBOS_MEMORY_NO_SERVER": "1"}

PRODUCT = r"""
import json, sys, tempfile, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from nubos_memory import Memory
from nubos_memory.api import background
sample, how = json.loads(Path(sys.argv[2]).read_text()), sys.argv[3]
with tempfile.TemporaryDirectory() as d:
    (Path(d) / ".nubos-pilot").mkdir()
    (Path(d) / ".nubos-pilot/config.json").write_text(json.dumps({"memory": {"enabled": True}}))
    mem = Memory.open(d, user=False)
    if how == "cli":  # as cli.open_memory: the estimate left to a memory-settle (not started: not measured)
        mem.leave_to_background()
        background.start = lambda *args: False
    mem.embedder.embed(["warm up the model"])
    t = time.perf_counter()
    mem.index(sample, force=True)
    took = time.perf_counter() - t
print(json.dumps({"seconds": took, "runtime": mem.embedder.runtime_info().get("runtime")}))
"""

BARE = r"""
import json, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from nubos_memory.embed.model import ModelEmbedder, pieces_for
from nubos_memory.embed.pooling import best_pieces_for
from nubos_memory.embed.torch_runtime import TorchRuntime
from nubos_memory.limits import DEFAULT_MODEL
from nubos_memory.records import embed_text
sample = json.loads(Path(sys.argv[2]).read_text())
folder = ModelEmbedder(DEFAULT_MODEL).folder()
reference = TorchRuntime(str(folder))
reference.load()
st = reference.model
texts = [embed_text({"tags": [], **r}) for r in sample]
pieces = pieces_for(reference, texts)[0] + best_pieces_for(reference, texts)[0]  # what the product embeds
st.encode(["warm up the model"], batch_size=32)
t = time.perf_counter()
st.encode(pieces, batch_size=32, normalize_embeddings=True, show_progress_bar=False)
print(json.dumps({"seconds": time.perf_counter() - t, "pieces": len(pieces)}))
"""


def run(code: str, *args: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", code, str(REPO), *args], env=ENV, capture_output=True, text=True,
                         check=False)
    if out.returncode != 0:
        raise SystemExit(out.stderr[-2000:])
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    benchdata.add_flag(ap)
    args = ap.parse_args()
    base = real_texts(6000, benchdata.scifact(args.datasets))  # the abstracts, then single sentences of them
    shapes = {"short": [r for r in base if " (finding " in r["title"]][:384], "long": base[:192]}
    results: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                               "machine": f"{platform.machine()} {os.cpu_count()} cpu", "shapes": {}}
    scratch = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-index-{os.getpid()}.json"
    try:
        for shape, recs in shapes.items():
            sample = [{"type": "research", "title": r["title"] + " (throughput)", "body": r["body"]} for r in recs]
            scratch.write_text(json.dumps(sample))
            cli, library, bare = [], [], []
            pieces, runtime = 0, None
            for _ in range(args.rounds):  # interleaved: a noisy moment penalises no side alone
                got = run(PRODUCT, str(scratch), "cli")
                cli.append(got["seconds"])
                runtime = got["runtime"]
                library.append(run(PRODUCT, str(scratch), "library")["seconds"])
                raw = run(BARE, str(scratch))
                bare.append(raw["seconds"])
                pieces = raw["pieces"]
            row = {"records": len(sample), "pieces": pieces, "runtime": runtime,
                   "memory_index_cli_s": min(cli), "memory_index_library_s": min(library),
                   "bare_encode_s": min(bare), "ratio_cli": min(bare) / min(cli),
                   "ratio_library": min(bare) / min(library)}
            results["shapes"][shape] = row
            print(f"# {shape}: " + json.dumps(row), flush=True)
    finally:
        scratch.unlink(missing_ok=True)
    print("| shape | records | pieces | bare encode (s) | memory-index, one-shot CLI (s) | ratio | "
          "library, estimate on the write (s) | ratio |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for shape, r in results["shapes"].items():
        print(f"| {shape} | {r['records']} | {r['pieces']} | {r['bare_encode_s']:.2f} | {r['memory_index_cli_s']:.2f} "
              f"| {r['ratio_cli']:.2f}× | {r['memory_index_library_s']:.2f} | {r['ratio_library']:.2f}× |")
    out = REPO / "bench" / "results"
    out.mkdir(exist_ok=True)
    (out / f"index-{time.strftime('%Y-%m-%d')}.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

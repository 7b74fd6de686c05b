"""What agents and people see (issue 14): filters that say when they cannot match, answers that
bound what they echo, markdown that tells the truth, records opened by id, progress, the small
surprises (a BOM, a long query, a stdin newline), and memory-stats that says why."""

from __future__ import annotations

import json
import os

import pytest

from nubos_memory import Memory
from nubos_memory.limits import MAX_ECHO, MAX_QUERY_CHARS
from nubos_memory.records import phase_matches

from .conftest import index_records, memory_dir, query, rec, run_cli, write_config

PLAN = [
    rec("webhook retries use exponential backoff", "capped at 5 attempts", id="m1", phase="M001-S002-T0001"),
    rec("webhook signatures are checked first", "reject unsigned calls", id="m2", phase="M001"),
    rec("webhook payloads are versioned", "v2 since March", id="m3", phase="M0012-S001"),
    rec("webhook critic: missing idempotency key", "", id="c1", type="critic", phase="M002-S001"),
]


@pytest.fixture
def plan(project):
    assert index_records(project, PLAN).code == 0
    return project


def ids(result):
    return sorted(h["id"] for h in result.json["hits"])


def test_phase_filter_matches_the_hierarchy_below_it(plan):
    assert ids(query(plan, "webhook", "--phase", "M001")) == ["m1", "m2"]  # not M0012-S001
    assert ids(query(plan, "webhook", "--phase", "M001-S002")) == ["m1"]
    assert ids(query(plan, "webhook", "--phase", "M001", "--phase-exact")) == ["m2"]
    assert ids(query(plan, "webhook", "--phase", "M0012")) == ["m3"]
    assert phase_matches("M001-S002", "M001-") and not phase_matches("M0011", "M001")
    assert phase_matches("a.b", "a") and phase_matches("a/b", "a") and phase_matches("a:b", "a")
    assert not phase_matches(None, "M001")


def test_an_unknown_type_is_an_error_with_the_allowed_list(plan):
    r = query(plan, "webhook", "--type", "learnings")
    assert r.code == 5 and r.error["code"] == "query-invalid-type"
    assert r.error["details"]["allowed"] == ["learning", "handoff", "critic", "research"]
    assert ids(query(plan, "webhook", "--type", "critic")) == ["c1"]


def test_a_type_the_config_dropped_still_filters_the_records_that_have_it(plan):
    write_config(plan, types=["decision"])
    assert ids(query(plan, "webhook", "--type", "critic")) == ["c1"]
    r = query(plan, "webhook", "--type", "nonsense")
    assert r.code == 5 and "decision" in r.error["details"]["allowed"] and "critic" in r.error["details"]["allowed"]


def test_filters_that_match_nothing_say_so(plan):
    r = query(plan, "webhook", "--phase", "M009")
    assert r.code == 0 and r.json["hits"] == []
    warning = next(w for w in r.json["warnings"] if w["code"] == "filters-match-nothing")
    assert warning["filters"]["phase"] == "M009"
    assert "filters-match-nothing" not in {w["code"] for w in query(plan, "webhook").json["warnings"]}
    bad = query(plan, "webhook", "--phase", "M001\nrm -rf")
    assert bad.code == 5 and bad.error["code"] == "query-invalid-phase"


def test_a_long_query_is_answered_and_echoed_bounded(plan):
    text = ("webhook retries " * (MAX_QUERY_CHARS // 16))[:MAX_QUERY_CHARS]
    assert len(text) == 100_000
    r = query(plan, "--text", text, "--phase", "M" * 128)
    assert r.code == 0, r.err
    echoed = r.json["query"]
    assert len(echoed["text"]) == MAX_ECHO and echoed["text_chars"] == 100_000
    assert len(echoed["filters"]["phase"]) == MAX_ECHO or len(echoed["filters"]["phase"]) == 128
    r = query(plan, "webhook", "--phase", "M" * 129)  # longer than any stored phase can be
    assert r.code == 5 and len(json.dumps(r.error)) < 1000
    long = query(plan, "--text", "x" * (MAX_QUERY_CHARS + 1))
    assert long.code == 5 and long.error["code"] == "query-too-long"
    assert long.error["details"] == {"length": MAX_QUERY_CHARS + 1, "limit": MAX_QUERY_CHARS}
    assert ids(query(plan, "--text", text)) == ["c1", "m1", "m2", "m3"]


def test_errors_never_echo_a_whole_argument(plan):
    huge = "z" * 5000
    for argv in (["memory-query", "--root", str(plan), "x", "--type", huge],
                 ["memory-query", "--root", str(plan), "x", "--phase", huge + "\n"],
                 ["memory-get", "--root", str(plan), huge],
                 ["memory-forget", "--root", str(plan), huge]):
        r = run_cli(argv)
        assert r.code == 5 and len(r.err) < 2 * MAX_ECHO + 500, (argv[0], len(r.err))


def test_a_config_with_a_byte_order_mark_is_read(project):
    cfg = project / ".nubos-pilot/config.json"
    cfg.write_bytes(b"\xef\xbb\xbf" + cfg.read_bytes())
    r = run_cli(["memory-stats", "--root", str(project)])
    assert r.code == 0, r.err
    assert r.json["provider"] == "hash"


def test_a_stdin_body_loses_only_its_final_newline(project):
    for given, stored in (("line one\n", "line one"), ("two\n\n", "two\n"), ("crlf\r\n", "crlf"), ("none", "none")):
        r = run_cli(["memory-add", "--root", str(project), "--type", "learning", "--title", f"t {given!r}"],
                    stdin=given)
        assert r.code == 0, r.err
        got = run_cli(["memory-get", "--root", str(project), r.json["id"]]).json["records"][0]["record"]["body"]
        assert got == stored


# -- memory-get ----------------------------------------------------------------------------
def test_get_returns_records_by_id_with_retired_ones_marked(plan):
    run_cli(["memory-forget", "--root", str(plan), "m3", "--reason", "wrong"])
    new = run_cli(["memory-add", "--root", str(plan), "--type", "learning", "--title", "signatures v2",
                   "--body", "HMAC-SHA256", "--supersedes", "m2"]).json["id"]
    r = run_cli(["memory-get", "--root", str(plan), "m1", "m2", "m3", "ghost", new])
    assert r.code == 0, r.err
    got = {x["id"]: x for x in r.json["records"]}
    assert got["m1"]["live"] and got["m1"]["retired"] is None and got["m1"]["record"]["title"].startswith("webhook")
    assert got["m2"]["retired"]["reason"] == "superseded" and got["m2"]["retired"]["by"] == new
    assert got["m3"]["retired"]["reason"] == "wrong" and got["m3"]["retired"]["at"]
    assert r.json["missing"] == ["ghost"] and "record-not-found" in {w["code"] for w in r.json["warnings"]}
    none = run_cli(["memory-get", "--root", str(plan), "ghost"])
    assert none.code == 5 and none.error["code"] == "record-not-found"
    bad = run_cli(["memory-get", "--root", str(plan), "no spaces"])
    assert bad.code == 5 and bad.error["code"] == "record-invalid-id"


def test_get_needs_no_model(plan):
    import subprocess
    import sys

    from .conftest import REPO

    write_config(plan, provider="local", model="sentence-transformers/all-MiniLM-L6-v2")
    probe = ("import sys, json; from nubos_memory.interfaces import cli; import io, contextlib\n"
             "out = io.StringIO()\n"
             "with contextlib.redirect_stdout(out): code = cli.main(['memory-get', '--root', sys.argv[1], 'm1'])\n"
             "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'onnxruntime', "
             "'sentence_transformers', 'transformers'))\n"
             "print(json.dumps({'code': code, 'heavy': heavy}))")
    res = subprocess.run([sys.executable, "-c", probe, str(plan)], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO), "NUBOS_MEMORY_NO_SERVER": "1"}, timeout=120)
    assert json.loads(res.stdout.splitlines()[-1]) == {"code": 0, "heavy": []}, res.stderr


# -- markdown ------------------------------------------------------------------------------
def test_markdown_says_what_the_budget_left_out(plan):
    r = query(plan, "webhook", "--format", "md", "--max-tokens", "5")
    assert r.code == 0
    assert "_No stored memory matches._" not in r.out
    assert "No matching hit fits the token budget" in r.out
    assert "4 matching hit(s) left out to fit max_tokens=5" in r.out and "m1 (" in r.out
    some = query(plan, "webhook", "--format", "md", "--max-tokens", "60")
    assert "### 1." in some.out and "left out to fit max_tokens=60" in some.out


def test_markdown_shows_warnings_and_degraded_state(plan):
    r = query(plan, "webhook", "--format", "md", "--phase", "M009")
    assert "> warning (filters-match-nothing)" in r.out
    write_config(plan, model="hash-128")  # another model: vectors not comparable, keyword-only answers
    d = query(plan, "webhook", "--format", "md")
    assert "> degraded (memory-rebuild-required): keyword matches only." in d.out
    assert "### 1." in d.out


def test_markdown_labels_provenance_only_when_there_is_one(project):
    index_records(project, [rec("cites the RFC", "see RFC 9110", provenance="CITED"), rec("plain note", "no source")])
    out = query(project, "RFC note plain cites", "--format", "md").out
    assert "cites the RFC [CACHED:CITED]" in out
    assert "plain note\n" in out and "[CACHED]" not in out


# -- progress --------------------------------------------------------------------------------
@pytest.mark.parametrize("verb, stages", [
    (["memory-index", "--records-file", "-"], {"embedding"}),
    (["memory-rebuild", "--reembed"], {"embedding", "indexing"}),
    (["memory-rebuild"], {"indexing"}),  # vectors reused: only the index is built
    (["memory-compact"], {"indexing"}),
])
def test_long_verbs_report_progress_on_stderr_and_only_the_answer_on_stdout(project, verb, stages):
    many = [rec(f"note {i}", f"body {i}") for i in range(600)]
    stdin = "\n".join(json.dumps(r) for r in many)
    if verb[0] != "memory-index":
        index_records(project, many)
    r = run_cli([verb[0], "--root", str(project), *verb[1:], "--progress", "json"], stdin=stdin)
    assert r.code == 0, r.err
    json.loads(r.out)  # one JSON document
    reports = [json.loads(line)["progress"] for line in r.err.splitlines()]
    assert reports and reports[-1]["done"] == reports[-1]["total"] == 600
    assert {p["stage"] for p in reports} == stages
    for name in stages:
        done = [p["done"] for p in reports if p["stage"] == name]
        assert done == sorted(done) and done[-1] == 600


def test_the_bar_is_drawn_on_a_terminal_only(project, monkeypatch):
    import io

    from nubos_memory.interfaces.cli import ProgressPrinter, progress_mode

    monkeypatch.setattr("sys.stderr", io.StringIO())
    assert progress_mode("auto") == "none" and progress_mode("json") == "json"
    out = io.StringIO()
    bar = ProgressPrinter("memory-rebuild", "bar", out, interval=0)
    for done in (0, 256, 512, 600):
        bar("embedding", done, 600)
    text = out.getvalue()
    assert text.endswith("600/600\n") and text.count("\r") == 4


# -- stats -----------------------------------------------------------------------------------
def test_stats_never_says_inconsistent_without_saying_why(plan):
    def check():
        c = run_cli(["memory-stats", "--root", str(plan)]).json["consistency"]
        assert c["consistent"] == (not c["problems"]), c
        return c

    assert check()["consistent"]
    log = memory_dir(plan) / "records.jsonl"
    with open(log, "a") as f:  # a hand-appended record without a vector: behind
        f.write(json.dumps({**rec("hand written", id="h1"), "created_at": None}) + "\n")
    assert not check()["consistent"]
    Memory.open(plan).rebuild()
    assert check()["consistent"]
    with open(log, "a") as f:
        f.write("{not json\n")
    assert {p["code"] for p in check()["problems"]} >= {"log-corrupt-lines"} or not check()["consistent"]

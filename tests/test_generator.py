"""The generator seam (``memory.generator``, adr/0019): HyPE, memory-summarise, memory-harvest.

No language model runs here: every test talks to ``tests/chatserver.py``, a real HTTP server on a
loopback socket that answers ``/v1/chat/completions`` deterministically and can be made slow or failing
(or stopped) to trip the circuit breaker.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import time
from pathlib import Path

import pytest

from nubos_memory import Memory
from nubos_memory.api import background
from nubos_memory.generate.chat import RateLimit
from nubos_memory.log import read

from .chatserver import ChatServer
from .conftest import memory_dir, run_cli, write_config

SECRET = "sk-generator-test-9c1e77d0"  # must never appear in any output


@pytest.fixture(autouse=True)
def no_worker_left():
    """A background ``memory-hype`` a test started is waited for (killed after a while), never left running."""
    yield
    for proc in background.running():
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture
def chat():
    server = ChatServer().start()
    yield server
    server.stop()


@pytest.fixture
def gen_project(project: Path, chat: ChatServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project whose generator is the test server (HyPE by hand: no background process), its own breaker file."""
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    monkeypatch.setenv("NUBOS_MEMORY_CACHE", str(cache))
    monkeypatch.delenv("NUBOS_MEMORY_GENERATOR_BASE_URL", raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    write_config(project, generator={"enabled": True, "model": "tiny", "base_url": chat.url, "background": False,
                                     "requests_per_minute": 6000, "timeout_s": 2,
                                     "breaker": {"failures": 2, "cooldown_s": 1}})
    return project


def cli(*argv: str):
    r = run_cli(list(argv))
    assert SECRET not in r.out + r.err
    return r


def add(root: Path, title: str, body: str = "", type: str = "learning", **flags: str) -> str:
    extra = [x for k, v in flags.items() for x in (f"--{k.replace('_', '-')}", v)]
    r = cli("memory-add", "--root", str(root), "--type", type, "--title", title, "--body", body, *extra)
    assert r.code == 0, r.err
    return r.json["id"]


def log_bytes(root: Path) -> bytes:
    return (memory_dir(root) / "records.jsonl").read_bytes()


def stats(root: Path) -> dict:
    r = cli("memory-stats", "--root", str(root))
    assert r.code == 0, r.err
    return r.json["generator"]


# -- settings ---------------------------------------------------------------------------------------
def test_the_generator_is_off_by_default_and_says_so(project: Path):
    add(project, "a note", "nothing asks a model")
    assert stats(project) == {"enabled": False, "hype": {"on": False, "questions_per_record": 3, "background": True,
                                                         "with_questions": 0, "without_questions": 0, "waiting": 0}}
    for verb in (["memory-hype"], ["memory-summarise", "--dry-run"], ["memory-harvest", str(project / "x.md")]):
        r = cli(*verb, "--root", str(project))
        assert (r.code, r.error["code"]) == (3, "generator-off"), verb


def test_a_project_config_may_not_name_a_remote_generator(gen_project: Path, monkeypatch: pytest.MonkeyPatch):
    write_config(gen_project, generator={"enabled": True, "model": "m", "base_url": "https://llm.example.com/v1"})
    r = cli("memory-stats", "--root", str(gen_project))
    assert (r.code, r.error["code"]) == (3, "config-untrusted-url")
    assert "NUBOS_MEMORY_GENERATOR_BASE_URL" in r.error["message"]
    write_config(gen_project, generator={"enabled": True, "model": "m", "api_key_env": "GITHUB_TOKEN"})
    assert cli("memory-stats", "--root", str(gen_project)).error["code"] == "config-invalid-value"
    # The user's own environment may name any host, over the project's loopback URL (never contacted here).
    write_config(gen_project, generator={"enabled": True, "model": "m", "base_url": "http://127.0.0.1:9/v1"})
    monkeypatch.setenv("NUBOS_MEMORY_GENERATOR_BASE_URL", "https://llm.example.com/v1/")
    got = stats(gen_project)
    assert (got["base_url"], got["base_url_from"]) == ("https://llm.example.com/v1", "environment")
    assert got["key"] == {"env": "OPENAI_API_KEY", "set": True}


# -- HyPE -------------------------------------------------------------------------------------------
def test_hype_writes_questions_to_the_log_and_rebuild_never_asks_again(gen_project: Path, chat: ChatServer):
    ids = [add(gen_project, f"note {w}", f"about {w}") for w in ("kafka", "redis", "pnpm")]
    assert stats(gen_project)["hype"]["waiting"] == 3
    r = cli("memory-hype", "--root", str(gen_project))
    assert r.code == 0, r.err
    assert sorted(r.json["generated"]) == sorted(ids) and r.json["questions"] == 9 and r.json["waiting"] == 0
    assert len(chat.requests) == 3 and all(q["body"]["temperature"] == 0 for q in chat.requests)
    before = Memory.open(gen_project).scan().question_map()
    assert before[ids[0]] == [f"q{i}: what about note kafka?" for i in (1, 2, 3)]
    ops = [json.loads(line) for line in log_bytes(gen_project).splitlines() if b'"questions"' in line]
    assert {op["id"] for op in ops} == set(ids) and {op["model"] for op in ops} == {"tiny-served"}

    chat.stop()  # no model from here on: rebuild reads the questions from the log
    for flags in ([], ["--reembed"]):
        for derived in memory_dir(gen_project).iterdir():
            if derived.name != "records.jsonl" and derived.is_file() and not derived.name.startswith("."):
                derived.unlink()
        r = cli("memory-rebuild", "--root", str(gen_project), *flags)
        assert r.code == 0, r.err
        assert Memory.open(gen_project).scan().question_map() == before
    got = stats(gen_project)
    assert got["hype"] == {"on": True, "questions_per_record": 3, "background": False, "with_questions": 3,
                           "without_questions": 0, "waiting": 0}
    assert got["breaker"]["failures_total"] == 0 and len(chat.requests) == 3  # nothing was asked again
    assert cli("memory-hype", "--root", str(gen_project)).json["generated"] == []  # nothing waits


def test_questions_follow_their_record_through_forget_compact_and_redact(gen_project: Path):
    keep, gone, secret = add(gen_project, "keep me", "a"), add(gen_project, "forget me", "b"), add(gen_project,
                                                                                               "token abc", "c")
    assert cli("memory-hype", "--root", str(gen_project)).json["waiting"] == 0
    assert cli("memory-forget", "--root", str(gen_project), gone).code == 0
    mem = Memory.open(gen_project)
    assert set(mem.scan().question_map()) == {keep, secret} and mem.scan().questions_of(gone) is None
    assert cli("memory-compact", "--root", str(gen_project)).code == 0
    assert set(Memory.open(gen_project).scan().question_map()) == {keep, secret}  # kept, not asked again
    assert cli("memory-redact", "--root", str(gen_project), secret, "--reason", "leak").code == 0
    assert b"token abc" not in log_bytes(gen_project)  # the questions quoted the title: redacted too
    assert set(Memory.open(gen_project).scan().question_map()) == {keep}
    # An id brought back by a new record starts without questions.
    assert cli("memory-forget", "--root", str(gen_project), keep).code == 0
    add(gen_project, "keep me again", "new text", id=keep)
    assert Memory.open(gen_project).scan().questions_of(keep) is None
    assert stats(gen_project)["hype"]["waiting"] == 1


def test_a_hand_written_questions_line_that_is_not_one_is_reported():
    scan = read(b'{"id": "a", "type": "learning", "title": "t", "body": ""}\n'
                b'{"op": "questions", "id": "a", "questions": "not a list"}\n'
                b'{"op": "questions", "id": "a", "questions": ["why?"]}\n')
    assert [c["line"] for c in scan.corrupt] == [2]
    assert scan.question_map() == {"a": ["why?"]}


def test_the_breaker_opens_after_failures_and_closes_after_the_cooldown(gen_project: Path, chat: ChatServer):
    add(gen_project, "breaker note", "body")
    chat.fail_status = 500
    r = cli("memory-hype", "--root", str(gen_project))
    assert r.code == 0 and r.json["degraded"]["code"] == "generator-unavailable"
    assert r.json["generated"] == [] and r.json["waiting"] == 1
    assert len(chat.requests) == 2  # a 5xx is retried once within the call
    b = stats(gen_project)["breaker"]
    assert (b["state"], b["failures"], b["failures_total"], b["opens"]) == ("closed", 1, 1, 0)
    cli("memory-hype", "--root", str(gen_project))  # the second failure in a row opens it
    b = stats(gen_project)["breaker"]
    assert (b["state"], b["failures"], b["failures_total"], b["opens"]) == ("open", 2, 2, 1)
    sent = len(chat.requests)
    r = cli("memory-hype", "--root", str(gen_project))  # open: nothing is sent
    assert "circuit breaker is open" in r.json["degraded"]["message"] and len(chat.requests) == sent
    chat.fail_status = None
    time.sleep(1.1)  # the cool-down: half-open, the next call tries and closes it
    r = cli("memory-hype", "--root", str(gen_project))
    assert r.json["degraded"] is None and r.json["waiting"] == 0
    b = stats(gen_project)["breaker"]
    assert (b["state"], b["failures_total"], b["opens"], b["half_open_probes"], b["closes"]) == ("closed", 2, 1, 1, 1)


def test_a_slow_generator_costs_one_timeout_and_the_key_is_never_echoed(gen_project: Path, chat: ChatServer):
    add(gen_project, "slow note", "body")
    write_config(gen_project, generator={"enabled": True, "model": "tiny", "base_url": chat.url, "background": False,
                                         "timeout_s": 0.3, "breaker": {"failures": 1, "cooldown_s": 60}})
    chat.delay_s = 1.0
    started = time.monotonic()
    r = cli("memory-hype", "--root", str(gen_project))
    assert time.monotonic() - started < 3.0 and len(chat.requests) == 1  # a timeout is not retried
    assert "no answer within 0.3 s" in r.json["degraded"]["message"]
    assert chat.requests[0]["key"]  # the key went as a bearer token ...
    chat.delay_s, chat.fail_status, chat.echo_key = 0.0, 401, True
    # (another model: another breaker, the first one stays open for its minute)
    write_config(gen_project, generator={"enabled": True, "model": "tiny-2", "base_url": chat.url, "background": False})
    r = cli("memory-hype", "--root", str(gen_project))  # ... and a server that quotes it back is scrubbed (cli())
    assert "HTTP 401" in r.json["degraded"]["message"] and "***" in r.json["degraded"]["message"]


def test_a_key_with_a_newline_or_control_character_never_leaks(gen_project: Path, chat: ChatServer,
                                                                monkeypatch: pytest.MonkeyPatch):
    # A trailing newline (a key read from a file) is stripped: the key is sent and works ...
    add(gen_project, "key note", "body")
    monkeypatch.setenv("OPENAI_API_KEY", SECRET + "\n")
    r = cli("memory-hype", "--root", str(gen_project))
    assert r.json["waiting"] == 0 and r.json["degraded"] is None and chat.requests[-1]["key"]
    # ... and the server quoting it back is scrubbed in every form (cli() checks SECRET is in no output).
    chat.fail_status, chat.echo_key = 500, True
    add(gen_project, "key note 2", "body")
    assert "***" in cli("memory-hype", "--root", str(gen_project)).json["degraded"]["message"]
    # A key with a character a header cannot carry is refused before anything is sent, never quoted.
    sent = len(chat.requests)
    for bad in (SECRET + "\nX-Injected: 1", SECRET + "\x01", "\t" + SECRET + "\u00e9\n"):
        monkeypatch.setenv("OPENAI_API_KEY", bad)
        r = cli("memory-hype", "--root", str(gen_project))
        assert (r.code, r.error["code"]) == (3, "api-key-invalid") and "$OPENAI_API_KEY" in r.error["message"]
        assert stats(gen_project)["error"]["code"] == "api-key-invalid"
    assert len(chat.requests) == sent


def test_the_gateway_shares_the_key_rules(chat: ChatServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from nubos_memory.config import MemoryConfig
    from nubos_memory.embed.gateway import make_gateway
    from nubos_memory.errors import ConfigError, NubosMemoryError
    from nubos_memory.remote import JsonClient

    monkeypatch.setenv("NUBOS_MEMORY_CACHE", str(tmp_path))
    monkeypatch.delenv("NUBOS_MEMORY_EMBED_BASE_URL", raising=False)
    config = MemoryConfig(provider="openai", model="e5", base_url=chat.url)
    monkeypatch.setenv("OPENAI_API_KEY", SECRET + "\n")
    gateway = make_gateway(config)  # (the chat server has no /embeddings: 404, quoting the key)
    chat.fail_status, chat.echo_key = 500, True
    with pytest.raises(NubosMemoryError) as got:
        gateway.embed(["a text"])
    assert got.value.code == "embedder-unavailable" and chat.requests[-1]["key"]
    assert SECRET not in str(got.value.to_dict())
    monkeypatch.setenv("OPENAI_API_KEY", SECRET + "\r\n2")
    with pytest.raises(ConfigError) as refused:
        make_gateway(config)
    assert refused.value.code == "api-key-invalid" and SECRET not in str(refused.value.to_dict())
    client = JsonClient(chat.url, key=" " + SECRET + "\n", timeout_s=1, budget_s=2)  # every form is scrubbed
    said = f"{SECRET!r} {(SECRET + chr(10))!r} {(' ' + SECRET + chr(10))!r} {SECRET.encode()!r}"
    assert SECRET not in client.scrub(said)


def test_the_rate_limit_spaces_requests(gen_project: Path, chat: ChatServer):
    for i in range(4):
        add(gen_project, f"rate note {i}", "body")
    write_config(gen_project, generator={"enabled": True, "model": "tiny", "base_url": chat.url, "background": False,
                                         "requests_per_minute": 600})
    assert cli("memory-hype", "--root", str(gen_project)).json["waiting"] == 0
    times = [q["at"] for q in chat.requests]
    assert len(times) == 4 and min(b - a for a, b in itertools.pairwise(times)) >= 0.09
    clock = [0.0]
    slept: list[float] = []
    limit = RateLimit(60, clock=lambda: clock[0], sleep=slept.append)
    for _ in range(3):
        limit.wait()
    assert slept == [1.0, 2.0] and limit.waited_s == 3.0  # the first never waits; then one a second


def test_a_write_starts_hype_in_the_background(gen_project: Path, chat: ChatServer):
    write_config(gen_project, generator={"enabled": True, "model": "tiny", "base_url": chat.url})
    rid = add(gen_project, "background note", "the write answers before its questions exist")
    deadline = time.monotonic() + 60
    while Memory.open(gen_project).scan().questions_of(rid) is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert Memory.open(gen_project).scan().questions_of(rid) == [f"q{i}: what about background note?"
                                                                 for i in (1, 2, 3)]


def test_the_background_worker_never_runs_code_from_the_project(gen_project: Path, chat: ChatServer, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch):
    # A hostile repository shadows a module the worker imports; the write runs in that repository.
    marker = tmp_path / "ran-from-the-project"
    (gen_project / "orjson.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\nraise SystemExit(0)\n")
    write_config(gen_project, generator={"enabled": True, "model": "tiny", "base_url": chat.url})
    monkeypatch.chdir(gen_project)
    rid = add(gen_project, "hostile note", "the project is not trusted")
    for proc in background.running():
        assert proc.wait(timeout=60) == 0
    assert not marker.exists()
    assert Memory.open(gen_project).scan().questions_of(rid)  # the worker ran, from the installed package
    deadline = time.monotonic() + 5
    while background.running() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert background.running() == []  # and was reaped


# -- memory-summarise -------------------------------------------------------------------------------
def test_summarise_dry_run_shows_before_and_after_and_apply_only_appends(gen_project: Path, chat: ChatServer):
    old = add(gen_project, "billing api rate limit", "the billing api allows 100 requests per minute per tenant",
              created_at="2026-01-01T00:00:00Z")
    new = add(gen_project, "billing api rate limit", "the billing api allows 1000 requests per minute per tenant",
              created_at="2026-02-01T00:00:00Z")
    other = add(gen_project, "pnpm lockfile drift", "pin pnpm with corepack in ci")
    before = log_bytes(gen_project)
    r = cli("memory-summarise", "--root", str(gen_project), "--similarity", "0.8", "--dry-run")
    assert r.code == 0, r.err
    assert log_bytes(gen_project) == before  # a dry run writes nothing
    (group,) = r.json["groups"]
    assert [m["id"] for m in group["before"]] == [old, new]  # oldest first
    after = group["after"]
    assert after["title"] == "Merged: billing api rate limit" and after["supersedes"] == new
    assert after["body"] == ("the billing api allows 100 requests per minute per tenant\n"
                             "the billing api allows 1000 requests per minute per tenant")
    assert r.json["written"] is None

    r = cli("memory-summarise", "--root", str(gen_project), "--similarity", "0.8")
    assert r.code == 0, r.err
    assert log_bytes(gen_project).startswith(before)  # only appended: every member stays in the log
    assert r.json["written"]["ids"] == [after["id"]] and r.json["written"]["forgotten"] == [old]
    hits = cli("memory-query", "--root", str(gen_project), "billing rate limit", "--mode", "lexical").json["hits"]
    assert [h["id"] for h in hits if "billing" in h["record"]["title"].lower()] == [after["id"]]
    got = {g["id"]: g for g in cli("memory-get", "--root", str(gen_project), old, new, other).json["records"]}
    assert got[old]["retired"]["reason"] == f"summarised into {after['id']}"
    assert got[new]["retired"]["reason"] == "superseded" and got[other].get("retired") is None
    # Nothing left to merge: no group, no request.
    sent = len(chat.requests)
    assert cli("memory-summarise", "--root", str(gen_project), "--similarity", "0.8").json["groups"] == []
    assert len(chat.requests) == sent


def test_summarise_a_type_over_its_threshold(gen_project: Path):
    ids = [add(gen_project, f"critic note {i}", f"point {i}", type="critic") for i in range(3)]
    add(gen_project, "a learning", "stays")
    r = cli("memory-summarise", "--root", str(gen_project), "--type", "critic", "--min-size", "4", "--dry-run")
    assert r.json["groups"] == []  # 3 records are under the threshold
    r = cli("memory-summarise", "--root", str(gen_project), "--type", "critic", "--min-size", "3")
    (group,) = r.json["groups"]
    assert sorted(m["id"] for m in group["before"]) == sorted(ids) and group["after"]["type"] == "critic"
    assert r.json["written"]["added"] == 1 and len(r.json["written"]["forgotten"]) == 2
    r = cli("memory-summarise", "--root", str(gen_project), "--min-size", "1")
    assert (r.code, r.error["code"]) == (5, "summarise-invalid-argument")


def test_summarise_keeps_a_pin_and_skips_what_it_cannot_use(gen_project: Path, chat: ChatServer,
                                                             monkeypatch: pytest.MonkeyPatch):
    from nubos_memory.api import summarise

    monkeypatch.setattr(summarise, "MAX_MEMBERS", 2)  # 3 records: a group of 2 and one left over
    ids = [add(gen_project, f"critic note {i}", f"point {i}", type="critic", created_at=f"2026-01-0{i + 1}T00:00:00Z")
           for i in range(3)]
    assert cli("memory-pin", "--root", str(gen_project), ids[0]).code == 0
    # An empty body for members that had one would lose what they said: the group is skipped, and says why.
    chat.empty_merge = True
    before = log_bytes(gen_project)
    r = cli("memory-summarise", "--root", str(gen_project), "--type", "critic", "--min-size", "2")
    assert r.code == 0 and r.json["groups"] == [] and r.json["written"] is None
    assert r.json["unusable"] == [{"ids": ids[:2], "why": "the generator gave an empty body for members that had one"}]
    assert log_bytes(gen_project) == before
    # One record left over is no group (never "merged" alone); the summary of a pinned member stays pinned.
    chat.empty_merge = False
    r = cli("memory-summarise", "--root", str(gen_project), "--type", "critic", "--min-size", "2")
    (group,) = r.json["groups"]
    assert [m["id"] for m in group["before"]] == ids[:2] and group["after"]["hot"] is True
    got = cli("memory-get", "--root", str(gen_project), group["after"]["id"], ids[2]).json["records"]
    assert got[0]["record"]["hot"] is True and got[1]["live"] and got[1].get("retired") is None


# -- memory-harvest ---------------------------------------------------------------------------------
TRANSCRIPT = [
    {"role": "user", "content": "Add retries to the upload client"},
    {"role": "assistant", "content": [{"type": "text", "text": "FACT: uploads retry 3 times with backoff"}]},
    {"role": "assistant", "content": "THINK: should it be 5?"},
    {"role": "assistant", "content": "FACT: the upload client lives in src/net/upload.py"},
]


def test_harvest_writes_a_summary_and_facts_once(gen_project: Path, chat: ChatServer, tmp_path: Path):
    path = tmp_path / "session.jsonl"
    path.write_text("\n".join(json.dumps(t) for t in TRANSCRIPT) + "\n")
    r = cli("memory-harvest", "--root", str(gen_project), str(path))
    assert r.code == 0, r.err
    assert r.json["harvested"] and len(r.json["ids"]) == 3  # two facts and the summary
    assert [x["code"] for x in r.json["refused"]] == ["record-only-reasoning"]  # the guardrail of the write path
    got = {g["id"]: g["record"] for g in cli("memory-get", "--root", str(gen_project), *r.json["ids"]).json["records"]}
    summary = got[r.json["ids"][-1]]
    digest = r.json["transcript"]["sha256"]
    assert summary["type"] == "handoff" and summary["title"] == "Session: user: Add retries to the upload client"
    assert f"session.jsonl (sha256 {digest[:16]})" in summary["body"]
    assert all(f"transcript:{digest[:16]}" in rec["tags"] for rec in got.values())
    assert sorted(rec["title"] for rec in got.values() if rec["type"] == "learning") == [
        "the upload client lives in src/net/upload.py", "uploads retry 3 times with backoff"]
    # The facts are the model's reading of the transcript (ASSUMED); the summary cites the transcript.
    assert {rec["type"]: rec["provenance"] for rec in got.values()} == {"learning": "ASSUMED", "handoff": "CITED"}

    before, sent = log_bytes(gen_project), len(chat.requests)
    again = cli("memory-harvest", "--root", str(gen_project), str(path))
    assert again.json["already"] and again.json["requests"] == 0 and sorted(again.json["ids"]) == sorted(r.json["ids"])
    assert log_bytes(gen_project) == before and len(chat.requests) == sent  # idempotent: no model, no write

    md = tmp_path / "notes.md"  # markdown: another text, another harvest; a fact already known is not stored twice
    md.write_text("# Session 2\n\nFACT: uploads retry 3 times with backoff\nFACT: CI caches pnpm\n")
    r = cli("memory-harvest", "--root", str(gen_project), str(md))
    assert r.json["harvested"] and len(r.json["written"]["duplicates"]) == 1 and len(r.json["ids"]) == 2


def test_harvest_refuses_what_is_no_transcript(gen_project: Path, tmp_path: Path):
    r = cli("memory-harvest", "--root", str(gen_project), str(tmp_path / "missing.jsonl"))
    assert (r.code, r.error["code"]) == (5, "harvest-transcript-unreadable")
    (tmp_path / "empty.md").write_text("  \n")
    r = cli("memory-harvest", "--root", str(gen_project), str(tmp_path / "empty.md"))
    assert (r.code, r.error["code"]) == (5, "harvest-transcript-empty")


def test_generator_settings_are_checked(project: Path):
    for bad, code in (({"enabled": "yes"}, "config-invalid-value"), ({"questions": 11}, "config-invalid-value"),
                      ({"requests_per_minute": 0}, "config-invalid-value"), ({"temperature": 1}, "config-invalid-value"),
                      ({"timeout_s": 121}, "config-invalid-value")):
        write_config(project, generator=bad)
        r = cli("memory-stats", "--root", str(project))
        assert (r.code, r.error["code"]) == (3, code), bad
    write_config(project, generator={"enabled": True, "model": "m"})  # no URL anywhere: off, and stats says why
    r = cli("memory-hype", "--root", str(project))
    assert (r.code, r.error["code"]) == (3, "generator-off") and "no URL" in r.error["message"]
    assert stats(project)["error"]["code"] == "generator-off"


def test_questions_travel_with_export_and_import(gen_project: Path, tmp_path: Path):
    ids = [add(gen_project, f"exported {w}", w) for w in ("one", "two")]
    cli("memory-hype", "--root", str(gen_project))
    assert cli("memory-export", "--root", str(gen_project), str(tmp_path / "log.jsonl")).code == 0
    other = tmp_path / "other"
    other.mkdir()
    assert cli("memory-init", "--root", str(other)).code == 0
    write_config(other, provider="hash", model="hash-256", near_duplicate=None)
    assert cli("memory-import", "--root", str(other), str(tmp_path / "log.jsonl")).code == 0
    assert Memory.open(other).scan().question_map() == Memory.open(gen_project).scan().question_map()
    assert set(Memory.open(other).scan().question_map()) == set(ids)

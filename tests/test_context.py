"""Hot memory (``hot: true``, memory-pin, memory-unpin: log.py) and memory-context (api/turn.py)."""

from __future__ import annotations

import json

from nubos_memory.api.memory import Memory
from nubos_memory.api.turn import HOT_SHARE
from nubos_memory.log import read

from .conftest import index_records, memory_dir, rec, run_cli
from .test_mcp import body, list_tools, run, session


def add(root, title, body="", **kw):
    argv = ["memory-add", "--root", str(root), "--type", kw.pop("type", "learning"), "--title", title, "--body", body]
    for key, value in kw.items():
        argv += [f"--{key.replace('_', '-')}"] + ([] if value is True else [str(value)])
    code, out, err = run_cli(argv)
    assert code == 0, err
    return out["id"]


def context(root, text="anything", *args):
    code, out, err = run_cli(["memory-context", "--root", str(root), text, *args])
    assert code == 0, err
    return out


def ids(section):
    return [h["id"] for h in section["hits"]]


def hot_ids(root):
    scan = read((memory_dir(root) / "records.jsonl").read_bytes())
    return {scan.records[p]["id"] for p in scan.hot_positions()}


def test_hot_on_write_and_pin_unpin_are_log_operations_replayed_after_a_rebuild(project):
    by_field = add(project, "Always use pnpm, never npm", "the lockfile is pnpm's", hot=True)
    plain = add(project, "The upload client retries three times")
    other = add(project, "Deploys go out on Tuesdays")
    line = json.loads((memory_dir(project) / "records.jsonl").read_text().splitlines()[0])
    assert line["hot"] is True and "hot" not in json.loads((memory_dir(project) / "records.jsonl").read_text()
                                                           .splitlines()[1])
    code, out, err = run_cli(["memory-pin", "--root", str(project), plain, by_field])
    assert code == 0, err
    assert out["pinned"] == [plain] and out["unchanged"] == [by_field] and out["hot"] == 2
    code, out, _ = run_cli(["memory-unpin", "--root", str(project), by_field])  # hot by its field: unpinned by op
    assert out["unpinned"] == [by_field] and out["hot"] == 1
    ops = [json.loads(x) for x in (memory_dir(project) / "records.jsonl").read_text().splitlines() if '"op"' in x]
    assert [(o["op"], o["id"]) for o in ops] == [("pin", plain), ("unpin", by_field)] and all(o["at"] for o in ops)
    assert hot_ids(project) == {plain}
    assert ids(context(project)["sections"]["hot"]) == [plain]
    assert run_cli(["memory-rebuild", "--root", str(project)]).code == 0  # the state is the log's
    assert ids(context(project)["sections"]["hot"]) == [plain]
    assert other not in hot_ids(project)


def test_retired_records_are_never_hot_and_unknown_ids_are_record_not_found(project):
    a = add(project, "Never commit generated protobuf code", hot=True)
    b = add(project, "Use the staging bucket for fixtures")
    assert run_cli(["memory-forget", "--root", str(project), a]).code == 0
    assert hot_ids(project) == set() and context(project)["sections"]["hot"]["hits"] == []
    code, out, _ = run_cli(["memory-pin", "--root", str(project), a, b])
    assert out["retired"] == [a] and out["pinned"] == [b]
    code, out, error = run_cli(["memory-pin", "--root", str(project), b, "no-such-id"])
    assert code == 5 and error["code"] == "record-not-found" and error["details"]["ids"] == ["no-such-id"]
    code, out, error = run_cli(["memory-unpin", "--root", str(project), "no-such-id"])
    assert error["code"] == "record-not-found"
    assert hot_ids(project) == {b}  # nothing was written by the refused calls
    # a record that supersedes a hot one starts from its own line
    c = add(project, "Use the fixtures bucket in staging", supersedes=b)
    assert hot_ids(project) == set() and c not in hot_ids(project)
    code, _, error = run_cli(["memory-index", "--root", str(project), "--records-file", "-"],
                             stdin=json.dumps(rec("x", hot="yes")))
    assert error["code"] == "record-invalid-hot"


def test_compact_and_import_keep_what_is_hot(project, tmp_path):
    a = add(project, "Prefer httpx over requests")
    b = add(project, "Tabs are banned in YAML", hot=True)
    run_cli(["memory-pin", "--root", str(project), a])
    run_cli(["memory-unpin", "--root", str(project), b])
    export = tmp_path / "out.jsonl"
    assert run_cli(["memory-export", "--root", str(project), str(export)]).code == 0
    assert run_cli(["memory-compact", "--root", str(project)]).code == 0
    assert hot_ids(project) == {a}
    other = tmp_path / "other"
    other.mkdir()
    assert run_cli(["memory-init", "--root", str(other)]).code == 0
    from .conftest import write_config

    write_config(other, provider="hash", model="hash-256", near_duplicate=None)
    assert run_cli(["memory-import", "--root", str(other), str(export)]).code == 0
    assert hot_ids(other) == {a}


def test_hot_records_take_at_most_their_share_newest_first_and_the_answer_says_what_was_left_out(project):
    hot = [add(project, f"Standing rule number {i}", "word " * 60, hot=True, created_at=f"2026-01-{i + 1:02d}T00:00:00Z")
           for i in range(6)]
    out = context(project, "standing rule", "--max-tokens", "300")
    section, budget = out["sections"]["hot"], out["budget"]
    assert section["limit"] == int(300 * HOT_SHARE) and section["used"] <= section["limit"]
    kept = ids(section)
    assert kept and kept == list(reversed(hot))[:len(kept)]  # newest first
    left = [s for s in budget["left_out"] if s["section"] == "hot"]
    assert {s["id"] for s in left} | set(kept) | set(ids(out["sections"]["relevant"])) == set(hot)
    assert all(s["reason"] == "hot-share" and s["tokens"] > 0 for s in left)
    assert budget["used"] <= 300 and budget["used"] == sum(out["sections"][n]["used"] for n in ("hot", "relevant",
                                                                                                 "recent"))
    md = run_cli(["memory-context", "--root", str(project), "standing rule", "--max-tokens", "300", "--format", "md"]).out
    assert "left out to fit max_tokens=300" in md and "hot records take at most 40 %" in md
    big = context(project, "standing rule", "--max-tokens", "100000")
    assert ids(big["sections"]["hot"]) == list(reversed(hot)) and big["budget"]["left_out"] == []


def test_sections_hold_no_record_twice_and_the_recent_handoffs(project):
    pinned = add(project, "Retry policy: exponential backoff with jitter", "applies to every HTTP client", hot=True)
    index_records(project, [rec("Retry the upload client with backoff", "uploads fail on 503"),
                            rec("Backoff jitter avoids thundering herds", "randomise the delay")])
    handoffs = [add(project, f"Session {i} handoff", f"left step {i} of the migration", type="handoff",
                    created_at=f"2026-02-{i + 1:02d}T00:00:00Z") for i in range(5)]
    relevant_handoff = add(project, "Session handoff: retry backoff half done", "finish the backoff retry",
                           type="handoff", created_at="2026-01-01T00:00:00Z")
    out = context(project, "retry backoff", "--recent", "3")
    sections = out["sections"]
    everywhere = ids(sections["hot"]) + ids(sections["relevant"]) + ids(sections["recent"])
    assert len(everywhere) == len(set(everywhere))
    assert ids(sections["hot"]) == [pinned] and pinned not in ids(sections["relevant"])
    assert relevant_handoff in ids(sections["relevant"])
    assert ids(sections["recent"]) == [handoffs[4], handoffs[3], handoffs[2]]  # the newest, none twice
    assert all(h["retrieval"] == "recent" for h in sections["recent"]["hits"])
    assert ids(context(project, "retry backoff", "--recent", "0")["sections"]["recent"]) == []
    code, _, error = run_cli(["memory-context", "--root", str(project), "x", "--recent", "99"])
    assert code == 5 and error["code"] == "context-invalid-recent"
    code, _, error = run_cli(["memory-context", "--root", str(project), "x", "--max-tokens", "0"])
    assert error["code"] == "query-invalid-max-tokens"


def test_markdown_block_has_each_section(project):
    add(project, "Always run ruff before committing", hot=True)
    add(project, "The cache key includes the lockfile hash", "pnpm-lock.yaml", provenance="VERIFIED")
    add(project, "Session 9 handoff", "the docs were reorganised", type="handoff")
    md = run_cli(["memory-context", "--root", str(project), "cache key lockfile", "--format", "md"]).out
    assert md.startswith("## Memory for this turn: cache key lockfile\n")
    hot, relevant, recent = (md.index("**Hot memory"), md.index("**Relevant to this task**"),
                             md.index("**Recent handoffs"))
    assert hot < relevant < recent
    assert "pinned (hot)" in md and "recent handoff" in md and "[CACHED:VERIFIED]" in md
    empty = Memory.open(project).context("nothing", max_tokens=1)
    assert empty["budget"]["used"] == 0


def test_memory_context_over_mcp(project):
    add(project, "Always use pnpm, never npm", hot=True)
    tool = list_tools(project)["memory_context"]
    schema = tool.input_schema
    assert schema["required"] == ["text"] and schema["additionalProperties"] is False
    assert set(schema["properties"]) == {"text", "max_tokens", "k", "recent", "format", "domain", "scope"}
    assert tool.annotations.read_only_hint and {"sections", "budget"} <= set(tool.output_schema["properties"])

    async def go():
        async with session(project) as client:
            data = await client.call_tool("memory_context", {"text": "package manager", "max_tokens": 800})
            md = await client.call_tool("memory_context", {"text": "package manager", "format": "markdown"})
            bad = await client.call_tool("memory_context", {"text": "x", "recent": "3"})  # strict: not coerced
            return json.loads(body(data)), body(md), bad.is_error, json.loads(body(bad))

    data, md, bad, envelope = run(go())
    assert data["sections"]["hot"]["hits"][0]["record"]["title"] == "Always use pnpm, never npm"
    assert md.startswith("## Memory for this turn: package manager") and "pinned (hot)" in md
    assert bad and envelope["error"]["code"] == "argument-invalid"


def test_one_warm_memory_sees_new_and_retired_handoffs(project):
    mem = Memory.open(project)
    first = mem.add({"type": "handoff", "title": "Session 1 handoff", "created_at": "2026-03-01T00:00:00Z"})["id"]
    assert ids(mem.context("anything")["sections"]["recent"]) == [first]
    second = mem.add({"type": "handoff", "title": "Session 2 handoff", "created_at": "2026-03-02T00:00:00Z"})["id"]
    assert ids(mem.context("anything", recent=1)["sections"]["recent"]) == [second]
    mem.forget([second])
    assert ids(mem.context("anything")["sections"]["recent"]) == [first]
    mem.compact()
    assert ids(mem.context("anything")["sections"]["recent"]) == [first]
    mem.pin([first])
    out = mem.context("anything")
    assert ids(out["sections"]["hot"]) == [first] and out["sections"]["recent"]["hits"] == []


def test_relevant_still_has_k_hits_when_hot_records_are_the_best_matches(project):
    index_records(project, [rec(f"Retry rule {i}", "retry backoff jitter", id=f"r{i}", hot=i < 3) for i in range(12)])
    out = context(project, "retry backoff jitter", "--k", "5", "--recent", "0")
    assert set(ids(out["sections"]["hot"])) == {"r0", "r1", "r2"}
    relevant = ids(out["sections"]["relevant"])
    assert len(relevant) == 5 and not set(relevant) & {"r0", "r1", "r2"}


def test_a_task_is_words_never_query_syntax(project):
    """memory-context reads an agent's task as words: an upper-case NOT or a quoted title filters nothing
    (memory-query with the same text would read them as syntax)."""
    assert index_records(project, [rec("retry the payment webhook", "stripe sends it again", id="a"),
                                   rec("do NOT retry the import job", "it is not idempotent", id="b")]).code == 0
    task = 'retry NOT webhook "payment"'
    query = run_cli(["memory-query", "--root", str(project), task, "--mode", "lexical"]).json
    assert "a" not in [h["id"] for h in query["hits"]]  # syntax: NOT webhook excludes it
    ctx = run_cli(["memory-context", "--root", str(project), task, "--max-tokens", "4000"]).json
    assert {"a", "b"} <= {h["id"] for h in ctx["sections"]["relevant"]["hits"]}


def test_hot_and_recent_records_tied_in_time_come_in_the_same_order_whichever_way_a_merge_put_their_lines():
    from nubos_memory.api.turn import Handoffs, hot_hits

    def line(rid: str, type_: str, **extra) -> bytes:
        return json.dumps({"id": rid, "type": type_, "title": rid, "body": "b",
                            "created_at": "2026-11-01T00:00:00Z", **extra}).encode() + b"\n"

    lines = [line("h1", "learning", hot=True), line("h2", "learning", hot=True), line("o1", "handoff"),
             line("o2", "handoff")]
    seen = set()
    for order in (lines, lines[::-1]):
        scan = read(b"".join(order))
        hot = [h["id"] for h in hot_hits(scan, 0.0)]
        recent = [h["id"] for h in Handoffs().hits(scan, 0.0, set(), 1)]
        seen.add((tuple(hot), tuple(recent)))
    assert seen == {(("h2", "h1"), ("o2",))}  # (by id: the tie broken as records.recency breaks it)

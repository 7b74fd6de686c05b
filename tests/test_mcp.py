"""memory-mcp: a real server subprocess, driven by the official SDK client over stdio."""

from __future__ import annotations

import asyncio
import json
import os
import sys

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from nubos_memory.limits import FUSIONS, MAX_TAGS, MAX_TITLE, MCP_MAX_TOKENS, MODES, PROVENANCES

from .conftest import REPO

TOOLS = {"memory_add", "memory_query", "memory_context", "memory_get", "memory_ingest", "memory_forget", "memory_stats",
         "memory_rebuild"}


def session(root):
    params = StdioServerParameters(command=sys.executable, args=["-m", "nubos_memory", "memory-mcp", "--root", str(root)],
                                   env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=str(root))
    return Client(params)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=120))


def body(result):
    assert result.content and result.content[0].type == "text"
    return result.content[0].text


def list_tools(project):
    async def go():
        async with session(project) as client:
            return {t.name: t for t in (await client.list_tools()).tools}

    return run(go())


def test_tools_and_their_schemas_match_the_handlers(project):
    tools = list_tools(project)
    assert set(tools) == TOOLS
    schemas = {name: t.input_schema for name, t in tools.items()}
    add = schemas["memory_add"]
    assert set(add["required"]) == {"type", "title"}
    assert set(add["properties"]) == {"type", "title", "body", "tags", "phase", "provenance", "id", "supersedes",
                                      "importance", "anchors", "valid_until", "hot", "domain", "force", "scope"}
    assert add["properties"]["title"]["maxLength"] == MAX_TITLE
    assert add["properties"]["provenance"]["enum"] == list(PROVENANCES)  # plain, not anyOf [X, null]
    assert add["properties"]["tags"]["maxItems"] == MAX_TAGS
    query = schemas["memory_query"]
    assert query["required"] == ["text"]
    assert (query["properties"]["k"]["minimum"], query["properties"]["k"]["maximum"]) == (1, 1000)
    assert query["properties"]["format"]["enum"] == ["json", "markdown"]
    assert query["properties"]["mode"]["enum"] == list(MODES) and query["properties"]["fusion"]["enum"] == list(FUSIONS)
    assert query["properties"]["max_tokens"]["default"] == MCP_MAX_TOKENS
    assert query["properties"]["scope"]["enum"] == ["project", "user", "all"]  # the user-level memory too
    assert add["properties"]["scope"]["enum"] == ["project", "user"]
    assert schemas["memory_forget"]["required"] == ["ids"] and schemas["memory_ingest"]["required"] == ["paths"]
    assert schemas["memory_get"]["required"] == ["ids"]
    assert schemas["memory_stats"]["properties"] == {} and schemas["memory_rebuild"]["properties"] == {}


def test_every_tool_is_described_for_a_model_that_has_never_seen_it(project):
    tools = list_tools(project)
    for name, tool in tools.items():
        schema = tool.input_schema
        assert schema["additionalProperties"] is False, name
        for param, prop in schema["properties"].items():
            assert len(prop.get("description", "")) >= 20, (name, param)
            assert "anyOf" not in prop, (name, param)
        assert tool.description and "\n    " not in tool.description and tool.description == tool.description.strip()
        a = tool.annotations
        assert a is not None and a.title and tool.title == a.title, name
        assert a.read_only_hint is not None and a.idempotent_hint is not None and a.open_world_hint is False, name
        if not a.read_only_hint:
            assert a.destructive_hint is not None, name
        assert tool.output_schema and tool.output_schema["type"] == "object", name
    assert tools["memory_query"].annotations.read_only_hint and tools["memory_get"].annotations.read_only_hint
    assert tools["memory_forget"].annotations.destructive_hint
    assert {"hits", "degraded", "warnings"} <= set(tools["memory_query"].output_schema["properties"])
    assert {"records", "missing"} <= set(tools["memory_get"].output_schema["properties"])


def test_every_argument_error_is_our_envelope_with_a_code(project):
    calls = [
        ("memory_query", {"text": "jwt", "limit": 5, "filter": {"type": "critic"}}, "argument-unknown"),
        ("memory_query", {}, "argument-invalid"),
        ("memory_query", {"text": "x", "k": 0}, "argument-invalid"),
        ("memory_query", {"text": "x", "k": "abc"}, "argument-invalid"),
        ("memory_query", {"text": "x", "mode": "fuzzy"}, "argument-invalid"),
        ("memory_query", {"text": "x", "type": "learnings"}, "query-invalid-type"),
        ("memory_forget", {"ids": []}, "argument-invalid"),
        ("memory_add", {"type": "learning", "title": "   "}, "argument-invalid"),
        ("memory_add", {"type": "learning", "title": "ok", "phase": "M001\nM002"}, "argument-invalid"),
        ("memory_get", {"ids": ["no-such-id"]}, "record-not-found"),
        ("memory_remember", {"text": "x"}, "tool-unknown"),
    ]

    async def go():
        async with session(project) as client:
            return [await client.call_tool(name, args) for name, args, _ in calls]

    results = run(go())
    for (name, args, code), result in zip(calls, results):
        assert result.is_error, (name, args)
        envelope = json.loads(body(result))
        assert envelope["error"]["code"] == code, (name, args, envelope)
        assert result.structured_content is None  # clients check it against the answer's output schema
    unknown = json.loads(body(results[0]))["error"]["details"]
    assert unknown["unknown"] == ["limit", "filter"] and "k" in unknown["allowed"]


def test_get_opens_hits_and_retired_records_and_answers_are_bounded(project):
    async def go():
        async with session(project) as client:
            for i in range(60):
                await client.call_tool("memory_add", {"type": "learning", "title": f"webhook retry rule {i}",
                                                      "body": "retry webhooks with backoff " * 40})
            q = json.loads(body(await client.call_tool("memory_query", {"text": "webhook retry", "k": 1000})))
            first = q["hits"][0]["id"]
            await client.call_tool("memory_forget", {"ids": [first], "reason": "wrong"})
            got = await client.call_tool("memory_get", {"ids": [first, q["hits"][1]["id"]]})
            return q, got

    q, got = run(go())
    assert q["budget"]["max_tokens"] == MCP_MAX_TOKENS and len(q["budget"]["skipped"]) > 0
    assert len(json.dumps(q)) < 8 * MCP_MAX_TOKENS
    assert got.is_error is False
    records = got.structured_content["records"]
    assert records[0]["live"] is False and records[0]["retired"]["reason"] == "wrong"
    assert records[1]["live"] is True and records[1]["retired"] is None


def test_add_query_forget_and_errors_over_stdio(project):
    (project / "docs").mkdir()
    (project / "docs/release.md").write_text("# Ops\n\n## Release\n\nRun the release workflow by hand "
                                             "(workflow_dispatch).\n")

    async def go():
        async with session(project) as client:
            out = {}
            add = await client.call_tool("memory_add", {
                "type": "learning", "title": "Pin pnpm with corepack", "body": "the CI cache broke on lockfile drift",
                "tags": ["ci", "pnpm"], "provenance": "VERIFIED", "importance": 0.8, "phase": "M001"})
            out["add"] = (add.is_error, json.loads(body(add)))
            ing = await client.call_tool("memory_ingest", {"paths": ["docs"]})
            out["ingest"] = (ing.is_error, json.loads(body(ing)))
            q = await client.call_tool("memory_query", {"text": "pnpm lockfile cache", "k": 3, "tags": ["ci"],
                                                        "type": "learning", "explain": True, "max_tokens": 500,
                                                        "mode": "hybrid", "fusion": "alpha", "alpha": 0.3})
            out["query"] = (q.is_error, json.loads(body(q)))
            md = await client.call_tool("memory_query", {"text": "how do I run the release workflow?", "format": "markdown"})
            out["md"] = (md.is_error, body(md))
            empty = await client.call_tool("memory_query", {"text": " "})
            out["empty"] = (empty.is_error, body(empty))
            schema = await client.call_tool("memory_query", {"text": "x", "k": 0})
            out["schema"] = schema.is_error
            forget = await client.call_tool("memory_forget", {"ids": [out["add"][1]["id"]]})
            out["forget"] = json.loads(body(forget))
            unknown = await client.call_tool("memory_forget", {"ids": ["no-such-id"]})
            out["unknown"] = (unknown.is_error, json.loads(body(unknown)), unknown.structured_content)
            stats = await client.call_tool("memory_stats", {})
            out["stats"] = json.loads(body(stats))
            rebuild = await client.call_tool("memory_rebuild", {})
            out["rebuild"] = json.loads(body(rebuild))
            return out

    out = run(go())
    assert out["add"][0] is False and out["add"][1]["added"] == 1
    assert out["ingest"][0] is False and out["ingest"][1]["added"] == 1
    qerr, q = out["query"]
    assert qerr is False and q["hits"][0]["id"] == out["add"][1]["id"] and q["degraded"] is None
    assert q["hits"][0]["explain"]["importance"] == 0.8 and "budget" in q
    assert out["md"][0] is False and "### 1. Ops › Release\n" in out["md"][1] and "[CACHED" not in out["md"][1] and "docs/release.md" in out["md"][1]
    assert out["empty"][0] is True and json.loads(out["empty"][1])["error"]["code"] == "memory-empty-query"
    assert out["schema"] is True
    assert out["forget"]["forgotten"] == [out["add"][1]["id"]]
    is_error, envelope, structured = out["unknown"]
    assert is_error and envelope["error"]["code"] == "record-not-found" and structured is None
    assert out["stats"]["count"] == 1 and out["stats"]["retired"]["total"] == 1
    assert out["rebuild"]["rebuilt"] is True and out["rebuild"]["count"] == 1


def test_a_broken_vector_layer_gives_a_degraded_lexical_answer(project):
    async def go(call):
        async with session(project) as client:
            return await call(client)

    async def fill(client):
        for title in ("Stripe webhooks arrive out of order", "Invoice numbers are gapless"):
            assert not (await client.call_tool("memory_add", {"type": "learning", "title": title})).is_error

    run(go(fill))
    folder = project / ".nubos-pilot/memory"
    manifest = json.loads((folder / "manifest.json").read_text())
    (folder / manifest["files"]["keymap"]["name"]).write_text("{ not a keymap")

    async def ask(client):
        return await client.call_tool("memory_query", {"text": "stripe webhooks order"})

    result = run(go(ask))
    doc = json.loads(body(result))
    assert result.is_error is False
    assert doc["degraded"]["code"] == "keymap-corrupt"
    assert doc["hits"][0]["record"]["title"] == "Stripe webhooks arrive out of order"
    assert {h["retrieval"] for h in doc["hits"]} == {"bm25"}


@pytest.mark.parametrize("argv", [["memory-mcp", "--root", "/nonexistent/place"]])
def test_startup_errors_are_json_on_stderr(argv):
    from .conftest import run_sub

    r = run_sub(argv)
    assert r.code == 3 and r.error["code"] == "project-not-found" and r.out == ""

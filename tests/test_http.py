"""``memory-http``: every route's envelope, the Knowledge Hive's aliases, MCP over HTTP, and the
security model of adr/0018 (token, Host, Origin, limits), against the real server (uvicorn on a
free port, in a thread) or, for start-up, the real command in a subprocess."""

from __future__ import annotations

import contextlib
import hmac
import http.client
import json
import os
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nubos_memory import Memory, codes
from nubos_memory.interfaces import http as H
from nubos_memory.interfaces.verbs import VERBS

from .conftest import REPO, rec, run_cli

TOKEN = "t" * 40


class Served:
    """A running memory-http: where it is, and a client for it."""

    def __init__(self, port: int, service: H.Service, guard: H.Guard):
        self.port, self.service, self.guard = port, service, guard

    def request(self, method: str, path: str, body: Any = None, *, headers: dict[str, str] | None = None,
                raw: bytes | None = None, timeout: float = 30) -> tuple[int, dict[str, str], Any]:
        """``(status, headers, JSON document or text)``; the Host header is the server's own unless given."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        sent = {"Host": f"127.0.0.1:{self.port}", "Content-Type": "application/json", **(headers or {})}
        if self.guard.token is not None and "Authorization" not in sent:
            sent["Authorization"] = f"Bearer {self.guard.token}"
        sent = {k: v for k, v in sent.items() if v is not None}
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        for key, value in sent.items():
            conn.putheader(key, value)
        conn.putheader("Content-Length", str(len(data or b"")))
        conn.endheaders(data)
        resp = conn.getresponse()
        payload = resp.read()
        conn.close()
        kind = resp.getheader("content-type") or ""
        doc = json.loads(payload) if kind.startswith("application/json") else payload.decode()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, doc

    def post(self, path: str, body: Any = None, **kw: Any) -> tuple[int, dict[str, str], Any]:
        return self.request("POST", path, {} if body is None else body, **kw)


@contextlib.contextmanager
def serve(root: Path, host: str = "127.0.0.1", **app: Any) -> Iterator[Served]:
    """memory-http on a free port, in this process (uvicorn on a thread, as run_http configures it), stopped
    afterwards."""
    service, guard, sock, _ = H.prepare_server(str(root), host, 0, [])
    for key in ("read_timeout", "workers"):
        if key in app:
            setattr(service, key, app.pop(key))
    header_timeout = app.pop("header_timeout", H.HTTP_HEADER_TIMEOUT_S)
    server = H.make_server(H.build_app(service, guard, **app), header_timeout=header_timeout)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started
    try:
        yield Served(guard.port, service, guard)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


@pytest.fixture
def served(project: Path) -> Iterator[Served]:
    with serve(project) as running:
        yield running


def seed(root: Path) -> dict[str, str]:
    mem = Memory.open(root)
    ids = {}
    for key, record in {"jwt": rec("use jose for jwt", "jsonwebtoken lacks EdDSA", tags=["auth"]),
                        "pnpm": rec("pin pnpm with corepack", "the CI cache broke on lockfile drift", tags=["ci"]),
                        "scim": rec("SCIM deprovisioning for Okta", "suspend users per tenant", type="research")
                        }.items():
        ids[key] = mem.add(record)["id"]
    return ids


# -- every route's envelope ----------------------------------------------------------------------------
@pytest.mark.parametrize("verb", H.HTTP_VERBS)
def test_every_verb_route_refuses_an_unknown_field_with_the_allowed_ones(served, verb):
    """Every ``/v1/<verb>`` takes exactly its declared fields (``params.py``): an invented one is
    ``argument-unknown``, HTTP 400, listing the declared names (the same names the MCP tool takes)."""
    status, headers, doc = served.post(H.route(verb), {"limit": 5})
    assert status == 400, doc
    assert headers[H.EXIT_HEADER.lower()] == "2"
    assert doc["error"]["code"] == codes.ARGUMENT_UNKNOWN
    declared = sorted([p.name for p in VERBS[verb].params if p.name not in H.SERVER_SIDE]
                      + (["records"] if verb == "memory-index" else []))
    assert doc["error"]["details"]["allowed"] == declared
    assert doc["error"]["details"]["unknown"] == ["limit"]


def test_the_verb_routes_answer_as_the_cli_does(served, project):
    ids = seed(project)
    status, headers, added = served.post("/v1/add", {"type": "learning", "title": "retry uploads with backoff",
                                                     "body": "jittered, at most 5 tries", "tags": ["net"]})
    assert status == 200 and headers[H.EXIT_HEADER.lower()] == "0"
    assert added["added"] == 1 and added["id"]
    status, _, hits = served.post("/v1/query", {"text": "jwt EdDSA", "k": 2, "mode": "lexical"})
    assert status == 200
    assert set(hits) >= {"hits", "degraded", "query", "counts", "warnings"}
    assert hits["hits"][0]["id"] == ids["jwt"] and hits["hits"][0]["retrieval"] == "bm25"
    cli = run_cli(["memory-query", "--root", str(project), "jwt EdDSA", "--k", "2", "--mode", "lexical",
                   "--max-tokens", "4000"]).json
    assert [h["id"] for h in cli["hits"]] == [h["id"] for h in hits["hits"]]
    status, headers, text = served.post("/v1/query", {"text": "jwt", "format": "markdown", "mode": "lexical"})
    assert status == 200 and headers["content-type"].startswith("text/markdown") and "use jose for jwt" in text
    status, _, got = served.post("/v1/get", {"ids": [ids["pnpm"]], "history": True})
    assert status == 200 and got["records"][0]["record"]["title"] == "pin pnpm with corepack"
    assert "history" in got["records"][0]
    status, _, pinned = served.post("/v1/pin", {"ids": [ids["pnpm"]]})
    assert status == 200 and pinned["pinned"] == [ids["pnpm"]]
    status, _, context = served.post("/v1/context", {"text": "ship a build"})
    assert status == 200 and [h["id"] for h in context["sections"]["hot"]["hits"]] == [ids["pnpm"]]
    assert served.post("/v1/unpin", {"ids": [ids["pnpm"]]})[0] == 200
    status, _, gone = served.post("/v1/forget", {"ids": [ids["scim"]], "reason": "moved to the wiki"})
    assert status == 200 and gone["forgotten"] == [ids["scim"]]
    retired = Memory.open(project).get([ids["scim"]])["records"][0]
    assert not retired["live"] and retired["retired"]["reason"] == "moved to the wiki"
    status, _, indexed = served.post("/v1/index", {"records": [rec("a batch record", "from HTTP")]})
    assert status == 200 and indexed["added"] == 1
    for path in ("/v1/stats",):
        status, _, stats = served.request("GET", path)
        assert status == 200 and stats["count"] == 4  # 3 seeded, 2 added, 1 forgotten
    assert served.post("/v1/stats")[2]["count"] == 4
    status, _, report = served.post("/v1/doctor", {"format": "json"})
    assert status == 200 and report["root"] == str(project)
    status, headers, text = served.post("/v1/doctor")
    assert status == 200 and headers["content-type"].startswith("text/plain") and "nubos-memory doctor" in text
    assert served.post("/v1/verify")[0] == 200
    assert served.post("/v1/prune", {"unused_for": "90d", "dry_run": True})[0] == 200
    assert served.post("/v1/rebuild")[2]["rebuilt"] is True
    (project / "notes.md").write_text("# Notes\n\n## Deploys\n\nDeploy with the blue-green script.\n")
    status, _, ingested = served.post("/v1/ingest", {"paths": ["notes.md"]})
    assert status == 200 and ingested["files"] == 1
    assert served.post("/v1/compact")[0] == 200
    status, _, listing = served.request("GET", "/v1")
    assert [v["route"] for v in listing["verbs"]] == [H.route(v) for v in H.HTTP_VERBS]


def test_errors_keep_their_codes_and_map_to_http_statuses(served, project):
    seed(project)
    status, headers, doc = served.post("/v1/get", {"ids": ["no-such-id"]})
    assert (status, headers[H.EXIT_HEADER.lower()], doc["error"]["code"]) == (422, "5", codes.RECORD_NOT_FOUND)
    status, _, doc = served.post("/v1/query", {"text": "x", "k": "2"})
    assert status == 400 and doc["error"]["code"] == codes.ARGUMENT_INVALID
    assert doc["error"]["details"]["errors"][0]["field"] == "k"
    status, _, doc = served.post("/v1/query", {"text": "x", "k": 0})
    assert status == 400 and doc["error"]["code"] == codes.ARGUMENT_INVALID
    status, _, doc = served.post("/v1/query", {"k": 3})  # the text is required, as of the MCP tool
    assert status == 400 and doc["error"]["details"]["errors"][0]["field"] == "text"
    status, _, doc = served.post("/v1/query", {"text": "x", "type": "learnings"})
    assert status == 422 and doc["error"]["code"] == codes.QUERY_INVALID_TYPE
    status, _, doc = served.post("/v1/add", {"type": "learning", "title": "a\nb"})
    assert status == 400 and doc["error"]["code"] == codes.ARGUMENT_INVALID
    status, _, doc = served.post("/v1/index", {"records": "not a list"})
    assert status == 400 and doc["error"]["code"] == codes.ARGUMENT_INVALID
    status, _, doc = served.post("/v1/namespaces")
    assert status == 422 and doc["error"]["code"] == codes.STORE_NOT_TEAM
    for raw in (b"{not json", b"[1, 2]", b"\xff\xfe"):
        status, _, doc = served.request("POST", "/v1/query", raw=raw)
        assert status == 400 and doc["error"]["code"] == codes.HTTP_INVALID_JSON
    status, _, doc = served.post("/v1/no-such-verb")
    assert status == 404 and doc["error"]["code"] == codes.HTTP_NOT_FOUND
    status, _, doc = served.request("GET", "/v1/query")
    assert status == 405 and doc["error"]["code"] == codes.HTTP_NOT_FOUND
    assert served.post("/v1/init")[0] == 404  # not served: it needs no memory, and the server has one
    assert served.post("/v1/export", {"file": "/tmp/x"})[0] == 404  # files of the server's machine: not served


def test_server_side_files_are_not_taken_over_http(served, project):
    """A field naming a file of the server's machine is no field over HTTP (``body_file``)."""
    status, _, doc = served.post("/v1/add", {"type": "learning", "title": "t", "body_file": "/etc/passwd"})
    assert status == 400 and doc["error"]["code"] == codes.ARGUMENT_UNKNOWN


# -- the Knowledge Hive's routes -------------------------------------------------------------------------
def test_knowledge_hive_search_stats_and_rebuild(served, project):
    ids = seed(project)
    status, _, doc = served.post("/api/knowledge/search", {"query": "okta tenant users", "maxResults": 2,
                                                           "maxTokens": 2000})
    assert status == 200, doc
    assert set(doc) >= {"results", "totalTokens"}
    first = doc["results"][0]
    assert set(first) == {"chunk", "score", "retrieval_mode"}
    assert first["chunk"]["id"] == ids["scim"] and first["chunk"]["content"] == "suspend users per tenant"
    assert first["retrieval_mode"] in ("bm25", "vector", "hybrid")
    assert 0 < doc["totalTokens"] <= 2000 and len(doc["results"]) <= 2
    status, _, doc = served.post("/api/knowledge/search", {"query": "pnpm jwt okta", "sourceTypes": ["research"]})
    assert status == 200 and {r["chunk"]["sourceType"] for r in doc["results"]} == {"research"}
    status, _, doc = served.post("/api/knowledge/search", {"query": "pnpm", "limit": 3})
    assert status == 400 and doc["error"]["code"] == codes.ARGUMENT_UNKNOWN
    assert "maxResults" in doc["error"]["details"]["allowed"] and "k" not in doc["error"]["details"]["allowed"]
    status, _, doc = served.post("/api/knowledge/search", {"query": "pnpm", "maxResults": "3"})
    assert status == 400 and doc["error"]["details"]["errors"][0]["field"] == "maxResults"
    status, _, doc = served.post("/api/knowledge/search", {"query": "pnpm", "sourceTypes": ["a b"]})
    assert status == 400 and doc["error"]["code"] == codes.ARGUMENT_INVALID
    status, _, stats = served.request("GET", "/api/knowledge/stats")
    assert status == 200 and stats["totalChunks"] == 3 == stats["count"]
    status, _, rebuilt = served.post("/api/knowledge/rebuild")
    assert status == 200 and rebuilt["success"] is True and rebuilt["count"] == 3


# -- MCP over streamable HTTP --------------------------------------------------------------------------
def mcp(served: Served, method: str, params: dict[str, Any], rid: int = 1, **kw: Any) -> tuple[int, Any]:
    status, _, doc = served.post("/mcp", {"jsonrpc": "2.0", "id": rid, "method": method, "params": params},
                                 headers={"Accept": "application/json, text/event-stream", **kw.pop("headers", {})})
    return status, doc


def test_mcp_over_streamable_http_serves_the_same_tools(served, project):
    ids = seed(project)
    status, doc = mcp(served, "initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                             "clientInfo": {"name": "test", "version": "1"}})
    assert status == 200 and doc["result"]["serverInfo"]["name"] == "nubos-memory"
    status, doc = mcp(served, "tools/list", {}, 2)
    assert "memory_query" in {t["name"] for t in doc["result"]["tools"]}
    status, doc = mcp(served, "tools/call", {"name": "memory_query", "arguments": {"text": "jwt", "mode": "lexical"}},
                      3)
    assert status == 200 and doc["result"]["structuredContent"]["hits"][0]["id"] == ids["jwt"]
    status, doc = mcp(served, "tools/call", {"name": "memory_query", "arguments": {"text": "jwt", "limit": 1}}, 4)
    assert json.loads(doc["result"]["content"][0]["text"])["error"]["code"] == codes.ARGUMENT_UNKNOWN
    status, doc = mcp(served, "tools/list", {}, 5, headers={"Origin": "http://evil.example"})
    assert status == 403 and doc["error"]["code"] == codes.HTTP_FORBIDDEN_ORIGIN


# -- security: Host, Origin, token ----------------------------------------------------------------------
def test_foreign_host_and_origin_are_refused(served, project):
    """DNS rebinding sends the attacker's name as Host; a page of another site sends its Origin."""
    seed(project)
    port = served.port
    for host in ("evil.example", f"evil.example:{port}", f"127.0.0.1:{port + 1}", "127.0.0.1", ""):
        status, _, doc = served.request("GET", "/v1/stats", headers={"Host": host})
        assert status == 421 and doc["error"]["code"] == codes.HTTP_FORBIDDEN_HOST, host
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}"):
        assert served.request("GET", "/v1/stats", headers={"Host": host})[0] == 200, host
    for origin in ("http://evil.example", f"http://localhost:{port}", "null", f"https://evil.example:{port}"):
        status, _, doc = served.post("/v1/forget", {"ids": ["x"]}, headers={"Origin": origin})
        assert status == 403 and doc["error"]["code"] == codes.HTTP_FORBIDDEN_ORIGIN, origin
    status, _, doc = served.post("/v1/query", {"text": "jwt"}, headers={"Sec-Fetch-Site": "cross-site"})
    assert status == 403
    same = served.post("/v1/query", {"text": "jwt", "mode": "lexical"}, headers={"Origin": f"http://127.0.0.1:{port}"})
    assert same[0] == 200
    # a form posted from another site never reaches the verb
    status, _, _ = served.request("POST", "/record/forget", raw=b"id=x&reason=r",
                                  headers={"Origin": "http://evil.example",
                                           "Content-Type": "application/x-www-form-urlencoded"})
    assert status == 403


def test_non_loopback_bind_needs_the_token_on_every_request(project, monkeypatch):
    monkeypatch.setenv(H.TOKEN_ENV, TOKEN)
    seed(project)
    with serve(project, host="0.0.0.0") as running:
        assert running.guard.token == TOKEN
        status, headers, doc = running.request("GET", "/v1/stats", headers={"Authorization": None})
        assert status == 401 and doc["error"]["code"] == codes.HTTP_UNAUTHORIZED
        assert headers["www-authenticate"].startswith("Bearer")
        for wrong in ("Bearer " + "u" * 40, "Bearer " + TOKEN[:-1], "Basic " + TOKEN, TOKEN, "Bearer "):
            assert running.request("GET", "/v1/stats", headers={"Authorization": wrong})[0] == 401, wrong
        assert running.request("GET", "/v1/stats")[0] == 200
        assert running.request("GET", "/", headers={"Authorization": None})[0] == 401
        assert running.post("/mcp", {"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                            headers={"Authorization": None})[0] == 401
        # the browser's token form is the one open path; a right token there gives the cookie
        assert running.request("GET", "/login", headers={"Authorization": None})[0] == 200
        status, headers, _ = running.request("POST", "/login", raw=f"token={TOKEN}".encode(),
                                             headers={"Authorization": None,
                                                      "Content-Type": "application/x-www-form-urlencoded"})
        assert status == 303 and "httponly" in headers["set-cookie"].lower()
        cookie = headers["set-cookie"].split(";")[0]
        assert running.request("GET", "/health", headers={"Authorization": None, "Cookie": cookie})[0] == 200
        assert running.request("GET", "/health", headers={"Authorization": None,
                                                          "Cookie": f"{running.guard.cookie_name}=wrong"})[0] == 401


def test_the_browser_cookie_is_not_the_token_and_opens_the_pages_only(project, monkeypatch):
    """The cookie holds HMAC-SHA256(token, "browser"), is named with the port (a browser sends a host's cookies
    to all its ports), and is taken on the browser's pages only: never by /v1, /api or /mcp."""
    monkeypatch.setenv(H.TOKEN_ENV, TOKEN)
    with serve(project, host="0.0.0.0") as running:
        status, headers, _ = running.request("POST", "/login", raw=f"token={TOKEN}".encode(),
                                             headers={"Authorization": None,
                                                      "Content-Type": "application/x-www-form-urlencoded"})
        assert status == 303
        name, _, value = headers["set-cookie"].split(";")[0].partition("=")
        assert name == f"{H.COOKIE}_{running.port}" and TOKEN not in value
        assert value == hmac.new(TOKEN.encode(), b"browser", "sha256").hexdigest()
        only_cookie = {"Authorization": None, "Cookie": f"{name}={value}"}
        for path in ("/", "/health"):
            assert running.request("GET", path, headers=only_cookie)[0] == 200, path
        for method, path in (("GET", "/v1/stats"), ("GET", "/v1"), ("GET", "/api/knowledge/stats"),
                             ("POST", "/v1/query"), ("POST", "/mcp")):
            assert running.request(method, path, {}, headers=only_cookie)[0] == 401, path
        # the token itself in the cookie, or the cookie of another port, is nothing
        assert running.request("GET", "/", headers={"Authorization": None, "Cookie": f"{name}={TOKEN}"})[0] == 401
        other = f"{H.COOKIE}_{running.port + 1}={value}"
        assert running.request("GET", "/", headers={"Authorization": None, "Cookie": other})[0] == 401
        # a wrong token at /login sets nothing
        status, headers, _ = running.request("POST", "/login", raw=b"token=" + b"u" * 40,
                                             headers={"Authorization": None,
                                                      "Content-Type": "application/x-www-form-urlencoded"})
        assert status == 401 and "set-cookie" not in headers
        # the login page's style sheet and script need no token
        status, headers, css = running.request("GET", "/static/style.css", headers={"Authorization": None})
        assert status == 200 and headers["x-content-type-options"] == "nosniff" and css
        assert running.request("GET", "/static/nope.js", headers={"Authorization": None})[0] == 404
    from nubos_memory.interfaces import browser

    pages = {r.path for r in browser.routes(None, None)} - {"/static/{name}"}  # type: ignore[arg-type]
    assert pages == browser.PAGES


def test_browsing_is_not_use(served, project):
    """The store browser's search and record pages record no usage (memory-prune --unused-for counts use);
    the API's query does."""
    ids = seed(project)
    assert served.request("GET", "/?q=jwt")[0] == 200
    assert served.request("GET", f"/record?id={ids['jwt']}")[0] == 200
    used = Memory.open(project).store.usage.summary()[1]
    assert ids["jwt"] not in used
    assert served.post("/v1/query", {"text": "jwt", "mode": "lexical"})[0] == 200
    assert ids["jwt"] in Memory.open(project).store.usage.summary()[1]


def test_answers_are_nosniff_and_the_flash_is_a_fixed_message(served, project):
    ids = seed(project)
    for path, body in (("/v1/query", {"text": "jwt"}), ("/v1/query", {"text": "jwt", "format": "markdown"}),
                       ("/v1/nope", {})):
        assert served.post(path, body)[1]["x-content-type-options"] == "nosniff", path
    refused = served.request("GET", "/v1/stats", headers={"Host": "evil.example"})
    assert refused[0] == 421 and refused[1]["x-content-type-options"] == "nosniff"
    _, _, html = served.request("GET", f"/record?id={ids['jwt']}&done=pinned")
    assert "Done: pinned." in html
    _, _, html = served.request("GET", f"/record?id={ids['jwt']}&done=the+record+was+rewritten+by+admin")
    assert "Done:" not in html and "rewritten" not in html


def test_the_guard_refuses_websockets():
    """The server takes no WebSocket (uvicorn is run with ws="none"); a scope that is not HTTP never reaches
    the app, whatever its path."""
    import asyncio

    reached: list[Any] = []
    sent: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        reached.append(scope["type"])

    async def receive() -> Any:
        return {"type": "websocket.connect"}

    async def send(message: Any) -> None:
        sent.append(message)

    shield = H.Shield(app, H.Guard(port=1, hosts=frozenset({"127.0.0.1"})))
    asyncio.run(shield({"type": "websocket", "path": "/mcp", "headers": [(b"host", b"127.0.0.1:1")]}, receive, send))
    assert reached == [] and sent == [{"type": "websocket.close", "code": 1008}]
    asyncio.run(shield({"type": "lifespan"}, receive, send))
    assert reached == ["lifespan"]


def test_the_token_is_compared_in_constant_time(monkeypatch):
    seen = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        seen.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    guard = H.Guard(port=1, hosts=frozenset({"127.0.0.1"}), token=TOKEN)
    assert guard.token_ok(f"Bearer {TOKEN}", None) and not guard.token_ok("Bearer nope", None)
    assert seen == [(TOKEN.encode(), TOKEN.encode()), (b"nope", TOKEN.encode())]


def test_a_non_loopback_server_creates_its_token_file_and_never_prints_the_token(project, tmp_path):
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    env = {**os.environ, "PYTHONPATH": str(REPO), "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config")}
    env.pop(H.TOKEN_ENV, None)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "nubos_memory", "memory-http", "--root", str(project), "--host",
                             "0.0.0.0", "--port", str(port)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()
        started = json.loads(line)
        path = home / ".config" / "nubos-memory" / H.TOKEN_FILE
        token = path.read_text().strip()
        assert len(token) == 64 and stat.S_IMODE(path.stat().st_mode) == 0o600
        assert token not in line and started["token"] == f"required: {path}"
        served = Served(port, None, H.Guard(port=port, hosts=frozenset(), token=token))  # type: ignore[arg-type]
        assert served.request("GET", "/v1/stats")[0] == 200
        assert served.request("GET", "/v1/stats", headers={"Authorization": None})[0] == 401
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=30)
    assert token not in out + err
    assert json.loads(out)["stopped"] is True


def test_without_a_token_a_non_loopback_server_refuses_to_start(project, monkeypatch):
    monkeypatch.setenv(H.TOKEN_ENV, "too-short")
    result = run_cli(["memory-http", "--root", str(project), "--host", "0.0.0.0", "--port", "0"])
    assert result.code == 3 and result.error["code"] == codes.HTTP_TOKEN_REQUIRED
    assert "too-short" not in result.err
    with pytest.raises(Exception) as exc:
        H.prepare_server(str(project), "192.0.2.1", 0, [])
    assert getattr(exc.value, "code", None) == codes.HTTP_TOKEN_REQUIRED


def test_loopback_needs_no_token_and_binds_loopback_by_default(project):
    from nubos_memory.interfaces.cli import build_parser

    args = build_parser().parse_args(["memory-http"])
    assert args.host == "127.0.0.1"
    assert H.is_loopback("127.0.0.1") and H.is_loopback("::1") and H.is_loopback("localhost")
    assert not H.is_loopback("0.0.0.0") and not H.is_loopback("192.168.1.4") and not H.is_loopback("::")


def test_host_header_parsing():
    guard = H.Guard(port=8765, hosts=H.allowed_hosts("127.0.0.1", ["memory.internal"]))
    assert guard.host_ok("127.0.0.1:8765") and guard.host_ok("LOCALHOST:8765") and guard.host_ok("[::1]:8765")
    assert guard.host_ok("memory.internal:8765")
    for bad in ("127.0.0.1", "[::1]", "127.0.0.1:80", "evil:8765", "127.0.0.1.evil:8765", None, "", ":8765"):
        assert not guard.host_ok(bad), bad


# -- limits ----------------------------------------------------------------------------------------------
def test_bodies_are_bounded_in_size_and_time(project):
    with serve(project, max_body=1000, body_timeout=0.5) as running:
        status, _, doc = running.post("/v1/query", {"text": "x" * 2000})
        assert status == 413 and doc["error"]["code"] == codes.HTTP_REQUEST_TOO_LARGE
        # chunked, without a length: counted as it arrives
        conn = http.client.HTTPConnection("127.0.0.1", running.port, timeout=10)
        conn.putrequest("POST", "/v1/query", skip_host=True)
        conn.putheader("Host", f"127.0.0.1:{running.port}")
        conn.putheader("Transfer-Encoding", "chunked")
        conn.endheaders()
        for _ in range(3):
            conn.send(b"200\r\n" + b"x" * 512 + b"\r\n")
        conn.send(b"0\r\n\r\n")
        resp = conn.getresponse()
        assert resp.status == 413 and json.loads(resp.read())["error"]["code"] == codes.HTTP_REQUEST_TOO_LARGE
        conn.close()
        # a body that never finishes arriving
        with socket.create_connection(("127.0.0.1", running.port), timeout=10) as raw:
            raw.sendall(f"POST /v1/query HTTP/1.1\r\nHost: 127.0.0.1:{running.port}\r\nContent-Length: 100\r\n"
                        "Content-Type: application/json\r\n\r\n{\"te".encode())
            started = time.monotonic()
            answer = ""
            while codes.HTTP_TIMEOUT not in answer and time.monotonic() - started < 5:
                more = raw.recv(65536).decode()
                if not more:
                    break
                answer += more
            assert answer.startswith("HTTP/1.1 408") and codes.HTTP_TIMEOUT in answer
            assert time.monotonic() - started < 5


def test_connections_that_never_finish_their_headers_are_closed(project):
    """Slowloris: more connections than the server keeps, each sending part of its headers and then nothing,
    are closed once the header deadline passes, and a normal request is answered (not 503) afterwards."""
    deadline = 1.0
    with serve(project, header_timeout=deadline) as running:
        idle = []
        for _ in range(H.HTTP_MAX_CONNECTIONS + 6):
            conn = socket.create_connection(("127.0.0.1", running.port), timeout=10)
            conn.sendall(f"GET /v1/stats HTTP/1.1\r\nHost: 127.0.0.1:{running.port}\r\n".encode())
            idle.append(conn)
        started = time.monotonic()
        try:
            for conn in idle:
                conn.settimeout(max(0.1, deadline + 5 - (time.monotonic() - started)))
                with contextlib.suppress(ConnectionResetError):
                    while conn.recv(65536):  # nothing comes: the server closes it (recv gives b"")
                        pass
            assert time.monotonic() - started < deadline + 5  # every one closed (a timeout would raise)
        finally:
            for conn in idle:
                conn.close()
        assert running.request("GET", "/v1/stats")[0] == 200
        # A request that completes its headers in time is answered, on a connection open a while.
        with socket.create_connection(("127.0.0.1", running.port), timeout=10) as raw:
            raw.sendall(f"GET /v1/stats HTTP/1.1\r\nHost: 127.0.0.1:{running.port}\r\n".encode())
            time.sleep(deadline / 2)
            raw.sendall(b"Connection: close\r\n\r\n")
            assert raw.recv(12) == b"HTTP/1.1 200"


def test_a_read_verb_that_takes_too_long_is_answered_with_a_timeout(project):
    """A read verb past its time is ``http-timeout`` (504): here the memory's reader is held elsewhere."""
    seed(project)
    with serve(project, read_timeout=0.5) as running:
        with running.service.warm.use(writes=False):
            started = time.monotonic()
            status, _, doc = running.post("/v1/query", {"text": "jwt", "mode": "lexical"})
        assert status == 504 and doc["error"]["code"] == codes.HTTP_TIMEOUT
        assert time.monotonic() - started < 5
        assert running.post("/v1/query", {"text": "jwt", "mode": "lexical"})[0] == 200  # and it goes on


def test_concurrent_writes_are_all_kept(served, project):
    """Writes from many clients at once go through the library's one write path: none is lost."""
    errors: list[Any] = []
    acknowledged: list[str] = []

    def client(n: int) -> None:
        for i in range(5):
            status, _, doc = served.post("/v1/add", {"type": "learning", "title": f"note {n}-{i}",
                                                     "body": f"client {n} write {i}"})
            if status != 200:
                errors.append(doc)
            else:
                acknowledged.append(doc["id"])

    threads = [threading.Thread(target=client, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(acknowledged) == 30
    got = Memory.open(project).get(acknowledged)
    assert got["missing"] == [] and all(r["live"] for r in got["records"])


def test_the_limits_come_from_limits_py():
    from nubos_memory import limits

    assert H.Service.workers == limits.HTTP_WORKERS and H.Service.read_timeout == limits.HTTP_READ_TIMEOUT_S
    assert H.Shield.__init__.__defaults__ == (limits.HTTP_MAX_BODY, limits.HTTP_BODY_TIMEOUT_S)
    assert H.make_server.__kwdefaults__ == {"header_timeout": limits.HTTP_HEADER_TIMEOUT_S}


def test_a_token_in_the_environment_is_asked_on_loopback_too(project, monkeypatch):
    """Other users of the machine can reach a loopback port: with the variable set, loopback asks too."""
    with serve(project) as running:
        assert running.guard.token is None and running.request("GET", "/v1/stats")[0] == 200
    monkeypatch.setenv(H.TOKEN_ENV, TOKEN)
    with serve(project) as running:
        assert running.request("GET", "/v1/stats", headers={"Authorization": None})[0] == 401
        assert running.request("GET", "/v1/stats")[0] == 200


# -- red-team, third pass: a held stream, deep records, a broken config, long names, plain-text refusals --
def test_get_mcp_opens_no_stream_that_would_hold_a_connection_for_ever(served):
    status, _headers, doc = served.request("GET", "/mcp", headers={"Accept": "text/event-stream"}, timeout=10)
    assert status == 405 and doc["error"]["code"] == "http-not-found"


def test_mcp_refusals_are_the_envelope_not_plain_text(served):
    hello = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    status, _, doc = served.request("POST", "/mcp", raw=json.dumps(hello).encode(),
                                    headers={"Content-Type": "text/plain", "Accept": "application/json"})
    assert status == 400 and doc["error"]["code"] == "http-invalid-json"
    status, _, doc = served.request("POST", "/mcp", hello, headers={  # a Host in capitals is the same host
        "Host": f"LOCALHOST:{served.port}", "Accept": "application/json, text/event-stream"})
    assert status == 200 and doc["result"]["tools"], doc
    long_name = {**hello, "method": "tools/list" + "A" * 100_000}
    status, _, doc = served.request("POST", "/mcp", long_name, headers={"Accept": "application/json"})
    assert status == 400 and doc["error"]["code"] == "http-invalid-json" and len(json.dumps(doc)) < 1000


def test_a_record_nested_deeper_than_a_log_line_may_be_is_refused_not_a_500(served):
    for depth in (254, 600):
        nested = json.loads("[" * depth + "]" * depth)
        status, _, doc = served.post("/v1/index", {"records": [{"type": "learning", "title": "t", "zzz": nested}]})
        assert status == 400 and doc["error"]["code"] == "http-invalid-json", (depth, doc)


def test_unknown_record_fields_are_named_at_most_max_echo_characters(served):
    record = {"type": "learning", "title": "t", "A" * 100_000: 1, **{f"k{i}": 1 for i in range(50)}}
    status, _, doc = served.post("/v1/index", {"records": [record]})
    assert status == 422 and doc["error"]["code"] == "record-unknown-field" and len(json.dumps(doc)) < 2000


def test_a_config_turned_invalid_is_every_routes_answer_in_the_envelope(served, project):
    config = project / ".nubos-pilot/config.json"
    good = config.read_text()
    config.write_text(good[:-3])
    try:
        for method, path, body in (("POST", "/v1/query", {"text": "x"}), ("POST", "/api/knowledge/search",
                                   {"query": "x"}), ("GET", "/v1/stats", None)):
            _, headers, doc = served.request(method, path, body)  # (the server's own state: a 500)
            assert doc["error"]["code"] == "config-invalid-json" and headers[H.EXIT_HEADER.lower()] == "3", doc
        _, _, page = served.request("GET", "/health")
        assert "config-invalid-json" in page, page
        tool = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "memory_query",
                                                                              "arguments": {"text": "x"}}}
        _, _, doc = served.request("POST", "/mcp", tool, headers={"Accept": "application/json"})
        result = doc["result"]
        assert result["isError"] and json.loads(result["content"][0]["text"])["error"]["code"] == "config-invalid-json"
    finally:
        config.write_text(good)

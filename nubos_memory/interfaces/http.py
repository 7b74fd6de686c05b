"""``memory-http``: the verbs over HTTP/JSON, MCP over streamable HTTP, and the store browser.

One process, one :class:`~nubos_memory.interfaces.warm.WarmMemory` (as ``memory-serve`` and
``memory-mcp`` keep), three faces on the HTTP stack the ``mcp`` SDK already brings (Starlette on
uvicorn):

* ``POST /v1/<verb>`` (the verb's name without ``memory-``: ``/v1/query``) takes the verb's
  declared parameters (``params.py``) as a JSON object, the fields the MCP tool takes, checked the
  same strict way (``argument-unknown``, ``argument-invalid``), and answers the verb's JSON document
  or its error envelope; ``GET /v1/stats``; ``GET /v1`` lists the verbs and their fields.  The HTTP
  status follows the envelope's exit code (:data:`STATUS`), which ``X-Nubos-Exit-Code`` carries.
* The Knowledge Hive's routes and field names, so that a client written for it works:
  ``POST /api/knowledge/search`` (``query``, ``maxResults``, ``maxTokens``, ``sourceTypes`` →
  ``results[].chunk``, ``score``, ``retrieval_mode``, ``totalTokens``), ``GET /api/knowledge/stats``,
  ``POST /api/knowledge/rebuild``.
* ``/mcp``: the MCP tools of ``memory-mcp`` over streamable HTTP; ``/``: the store browser
  (``browser.py``).

Security (adr/0018): it binds 127.0.0.1 unless told otherwise.  Bound to any other address, every
request, from loopback too, needs the bearer token (``$NUBOS_MEMORY_HTTP_TOKEN``, else
``http-token`` in this user's config folder, 32 random bytes hex-encoded, created 0600 on first use
and never printed), compared in constant time; without one the server does not start
(``http-token-required``).  Whatever the address, a request whose ``Host`` names no address of this
server (DNS rebinding) or that comes from a page of another origin or site is refused.  A request's
headers are bounded in the time they take to arrive (:func:`make_server`), bodies in size and in
time, read verbs in the time they take to answer,
and verbs run on at most ``HTTP_WORKERS`` threads (``limits.py``); writes keep the library's write
path and lock, one at a time.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import secrets
import signal
import socket
import stat
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import codes
from ..errors import ConfigError, NubosMemoryError, UsageError, failure
from ..fsio import dumps, loads
from ..limits import (
    HTTP_BODY_TIMEOUT_S,
    HTTP_HEADER_TIMEOUT_S,
    HTTP_KEEP_ALIVE_S,
    HTTP_MAX_BODY,
    HTTP_MAX_CONNECTIONS,
    HTTP_READ_TIMEOUT_S,
    HTTP_WORKERS,
    MAX_ECHO,
    MAX_TYPE,
)
from ..params import Param
from .verbs import VERBS, Request

if TYPE_CHECKING:
    import uvicorn
    from starlette.requests import Request as HttpRequest
    from starlette.responses import Response
    from starlette.types import Message, Receive, Scope, Send

    from .warm import WarmMemory

TOKEN_ENV = "NUBOS_MEMORY_HTTP_TOKEN"
TOKEN_FILE = "http-token"
COOKIE = "nubos_memory_browser"  # + "_<port>": the store browser's cookie (a value derived from the token)
COOKIE_KEY = b"browser"  # the cookie's value is HMAC-SHA256(token, COOKIE_KEY), never the token
EXIT_HEADER = "X-Nubos-Exit-Code"

# The HTTP status of an envelope, by its exit code (errors.EXIT_CODES).
STATUS = {0: 200, 2: 400, 3: 500, 4: 409, 5: 422, 6: 503, 7: 503, 8: 503, 9: 409, 70: 500, 74: 500, 130: 503}
# What the guard answers itself: code -> HTTP status.
REFUSALS = {codes.HTTP_UNAUTHORIZED: 401, codes.HTTP_FORBIDDEN_ORIGIN: 403, codes.HTTP_FORBIDDEN_HOST: 421,
            codes.HTTP_REQUEST_TOO_LARGE: 413, codes.HTTP_NOT_FOUND: 404, codes.HTTP_INVALID_JSON: 400}

# Served over HTTP: the verbs memory-serve answers, and the doctor's report (the store browser's health page).
HTTP_VERBS = (*(name for name, v in VERBS.items() if v.served), "memory-doctor")
# Parameters that name a file or stream of the server's machine: not taken over HTTP (the query's text comes
# as ``text``; memory-index takes its records in the body, as ``records``).
SERVER_SIDE = frozenset({"positional", "body_file", "records_file"})
RECORDS = "records"  # memory-index over HTTP: the records themselves, a JSON array of objects


def route(verb: str) -> str:
    """``memory-query`` → ``/v1/query``."""
    return "/v1/" + verb.removeprefix("memory-")


def fields(verb: str) -> list[Param]:
    """The parameters ``verb`` takes over HTTP: its declaration (``params.py``) less :data:`SERVER_SIDE`."""
    return [p for p in VERBS[verb].params if p.name not in SERVER_SIDE]


# -- the token --------------------------------------------------------------------------------------
def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address to bind) is a loopback address."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def token_path() -> Path | None:
    """Where this user's token file lives (None: no safe config folder)."""
    from ..userdirs import user_config_dir

    where = user_config_dir(write=True)
    return None if where is None else where / TOKEN_FILE


def _read_token(path: Path) -> str | None:
    """The token in ``path``: a regular file of this user's that nobody else may read; else None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
            return None
        text = os.read(fd, 256).decode("ascii", "replace").strip()
    finally:
        os.close(fd)
    return text if len(text) >= 32 else None


def load_token(create: bool) -> tuple[str | None, str]:
    """``(the bearer token, where it is)``: ``$NUBOS_MEMORY_HTTP_TOKEN``, else the token file (created,
    when ``create``, with 32 random bytes as hex, 0600).  ``(None, why)`` when there is none."""
    given = os.environ.get(TOKEN_ENV)
    if given is not None:
        if len(given.strip()) < 32:
            return None, f"${TOKEN_ENV} is shorter than 32 characters"
        return given.strip(), f"${TOKEN_ENV}"
    path = token_path()
    if path is None:
        return None, "no safe user config folder (memory-stats.user_folders says why)"
    found = _read_token(path)
    if found is not None or not create:
        return found, str(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        found = _read_token(path)  # another process made it first, or it is refused (mode, owner)
        return found, str(path) if found is not None else f"{path} is not a 0600 file of this user's"
    except OSError as exc:
        return None, f"{path} cannot be created ({exc.strerror})"
    try:
        os.write(fd, (secrets.token_hex(32) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    return _read_token(path), str(path)


# -- who may ask: token, Host, Origin --------------------------------------------------------------
@dataclass
class Guard:
    """What every request must satisfy before anything runs (adr/0018)."""

    port: int
    hosts: frozenset[str]  # host names (lower case, IPv6 in brackets) a Host header may name
    token: str | None = None  # required of every request when set
    open_paths: frozenset[str] = frozenset({"/login"})  # the store browser's token form
    open_prefixes: tuple[str, ...] = ("/static/",)  # the browser's own style sheet and script (the login page's)

    def is_open(self, path: str) -> bool:
        """Whether ``path`` is served without the token."""
        return path in self.open_paths or path.startswith(self.open_prefixes)

    @property
    def cookie_name(self) -> str:
        """The browser cookie's name: with the port, since a browser sends a host's cookies to all its ports."""
        return f"{COOKIE}_{self.port}"

    @property
    def cookie_value(self) -> str | None:
        """What the browser keeps: HMAC-SHA256(token, "browser"), which opens the browser's pages only."""
        if self.token is None:
            return None
        return hmac.new(self.token.encode(), COOKIE_KEY, hashlib.sha256).hexdigest()

    def host_ok(self, value: str | None) -> bool:
        """``value`` (a Host header) names this server: one of its names, and its port (or none for 80)."""
        if not value:
            return False
        value = value.strip().lower()
        name, _, port = value.rpartition(":") if not value.endswith("]") else (value, "", "")
        if not name:  # no port given
            name, port = value, ""
        if port and port != str(self.port):
            return False
        if not port and self.port != 80:
            return False
        return name in self.hosts

    def origin_ok(self, origin: str | None, host: str | None, fetch_site: str | None) -> bool:
        """A request from a page may come only from this server's own pages: its ``Origin`` (when a
        browser sends one) is ``http://`` + the Host it asked, and it is not marked cross-site."""
        if fetch_site is not None and fetch_site.lower() == "cross-site":
            return False
        if origin is None:
            return True  # not from a page (curl, an SDK), or a same-origin GET
        return origin.strip().lower() in (f"http://{(host or '').strip().lower()}",
                                          f"https://{(host or '').strip().lower()}")

    def token_ok(self, authorization: str | None, cookie: str | None = None, *, page: bool = False) -> bool:
        """The bearer token in ``authorization``, or (only for the store browser's ``page``s) the browser
        cookie's derived value, each compared in constant time."""
        if self.token is None:
            return True
        if authorization and authorization[:7].lower() == "bearer ":
            return self.bearer_ok(authorization[7:].strip())
        if page and cookie and self.cookie_value is not None:
            return hmac.compare_digest(cookie.encode("utf-8", "replace"), self.cookie_value.encode())
        return hmac.compare_digest(b"", self.token.encode())

    def bearer_ok(self, given: str) -> bool:
        """``given`` is the token (the login form's field), compared in constant time."""
        return self.token is None or hmac.compare_digest(given.encode("utf-8", "replace"), self.token.encode())


def allowed_hosts(bind: str, extra: list[str]) -> frozenset[str]:
    """The names a Host header may give: loopback names, the bound address, and for a non-loopback
    bind this machine's names and addresses, plus ``--allow-host`` names."""
    names = {"127.0.0.1", "localhost", "[::1]"}

    def add(name: str) -> None:
        name = name.strip().lower()
        if not name:
            return
        try:
            names.add(f"[{name.strip('[]')}]" if ipaddress.ip_address(name.strip("[]")).version == 6 else name)
        except ValueError:
            names.add(name)

    wildcard = bind.strip("[]") in ("0.0.0.0", "::", "")
    if not wildcard:
        add(bind)
    if not is_loopback(bind):
        for name in {socket.gethostname(), socket.getfqdn()}:
            add(name)
            try:
                for info in socket.getaddrinfo(name, None):
                    add(str(info[4][0]))
            except OSError:
                pass
    for name in extra:
        add(name)
    return frozenset(names)


def envelope(code: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    """An error of the server itself, in the one envelope."""
    return {"error": UsageError(message, code=code, details=details or {}).to_dict()}


async def respond(send: "Send", status: int, doc: Any, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    """A JSON answer, straight on the ASGI wire."""
    body = dumps(doc)
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"cache-control", b"no-store"), (b"x-content-type-options", b"nosniff"),
                            *(headers or [])]})
    await send({"type": "http.response.body", "body": body})


class Shield:
    """ASGI middleware in front of every route: the :class:`Guard`'s checks, then the body read whole
    within :data:`HTTP_MAX_BODY` bytes and :data:`HTTP_BODY_TIMEOUT_S` seconds, then the app."""

    def __init__(self, app: Callable[..., Awaitable[None]], guard: Guard, max_body: int = HTTP_MAX_BODY,
                 body_timeout: float = HTTP_BODY_TIMEOUT_S, *, mcp: bool = False):
        self.app, self.guard, self.max_body, self.body_timeout = app, guard, max_body, body_timeout
        self.mcp = mcp  # (the MCP tools are served at MCP_PATH: ``mcp_refusal`` applies there)

    async def __call__(self, scope: "Scope", receive: "Receive", send: "Send") -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":  # a WebSocket (the server takes none, adr/0018), or a kind unknown today
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
            return
        from starlette.datastructures import Headers

        headers = Headers(scope=scope)
        refused = self.refusal(scope, headers)
        if refused is not None:
            code, message = refused
            extra = [(b"www-authenticate", b'Bearer realm="nubos-memory"')] if code == codes.HTTP_UNAUTHORIZED else []
            await respond(send, REFUSALS[code], envelope(code, message), extra)
            return
        got = await self.read_body(headers, receive, send)
        if got is None:
            return
        replay, body = got
        if self.mcp and scope.get("path") == MCP_PATH:
            mcp_refused = mcp_refusal(scope.get("method", ""), headers, body)
            if mcp_refused is not None:
                await respond(send, *mcp_refused)
                return
        await self.app(scope, replay, send)

    def refusal(self, scope: "Scope", headers: Any) -> tuple[str, str] | None:
        """``(code, message)`` for a request the guard refuses, else None."""
        host = headers.get("host")
        if not self.guard.host_ok(host):
            return codes.HTTP_FORBIDDEN_HOST, "the Host header names no address of this server"
        if not self.guard.origin_ok(headers.get("origin"), host, headers.get("sec-fetch-site")):
            return codes.HTTP_FORBIDDEN_ORIGIN, "requests from pages of another origin are refused"
        path = scope.get("path", "")
        if not self.guard.is_open(path):
            from .browser import is_page

            cookie = _cookie(headers.get("cookie"), self.guard.cookie_name)
            if not self.guard.token_ok(headers.get("authorization"), cookie, page=is_page(path)):
                return codes.HTTP_UNAUTHORIZED, "this server needs its bearer token (Authorization: Bearer TOKEN)"
        return None

    async def read_body(self, headers: Any, receive: "Receive", send: "Send") -> "tuple[Receive, bytes] | None":
        """The body read whole within the limits: a ``receive`` that replays it, and the body; None when
        refused."""
        import anyio

        declared = headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body:
            await respond(send, 413, envelope(codes.HTTP_REQUEST_TOO_LARGE, f"a request body is at most {self.max_body} "
                                              "bytes", {"limit": self.max_body}))
            return None
        chunks: list[bytes] = []
        size = 0
        trailing: list[Message] = []
        try:
            with anyio.fail_after(self.body_timeout):
                while True:
                    message = await receive()
                    if message["type"] != "http.request":
                        trailing.append(message)
                        break
                    chunks.append(message.get("body", b""))
                    size += len(chunks[-1])
                    if size > self.max_body:
                        await respond(send, 413, envelope(codes.HTTP_REQUEST_TOO_LARGE, "a request body is at most "
                                                          f"{self.max_body} bytes", {"limit": self.max_body}))
                        return None
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            await respond(send, 408, envelope(codes.HTTP_TIMEOUT, f"the request body did not arrive within "
                                              f"{self.body_timeout:g} s"))
            return None
        body = b"".join(chunks)
        queue: list[Message] = [{"type": "http.request", "body": body, "more_body": False}, *trailing]

        async def replay() -> "Message":
            return queue.pop(0) if queue else await receive()

        return replay, body


MCP_PATH = "/mcp"


def mcp_refusal(method: str, headers: Any, body: bytes) -> tuple[int, dict[str, Any]] | None:
    """``(status, envelope)`` for an MCP request the SDK would hold open or answer in plain text, else None:
    a GET (stateless MCP sends nothing unasked, and its event stream held a connection for ever: enough of
    them shut the server out), a POST that is not JSON, a method name longer than ``MAX_ECHO`` (the SDK
    repeats it in full)."""
    if method in ("GET", "HEAD"):
        return 405, envelope(codes.HTTP_NOT_FOUND, f"{method} is not taken at {MCP_PATH}: this server sends nothing "
                             "unasked (stateless MCP); POST JSON-RPC requests", {"path": MCP_PATH})
    if method != "POST":
        return None
    if not (headers.get("content-type") or "").lower().startswith("application/json"):  # (as the SDK reads it)
        return 400, envelope(codes.HTTP_INVALID_JSON, "an MCP request is JSON (Content-Type: application/json)")
    try:
        doc = loads(body) if body else None
    except Exception:  # noqa: BLE001 - the SDK answers a body it cannot read with a JSON-RPC error
        return None
    messages = doc if isinstance(doc, list) else [doc]
    if any(isinstance(m, dict) and isinstance(m.get("method"), str) and len(m["method"]) > MAX_ECHO for m in messages):
        return 400, envelope(codes.HTTP_INVALID_JSON, f"a JSON-RPC method name is at most {MAX_ECHO} characters")
    return None


def _cookie(header: str | None, wanted: str) -> str | None:
    """The value of the cookie named ``wanted`` from a Cookie header."""
    for part in (header or "").split(";"):
        name, _, value = part.strip().partition("=")
        if name == wanted:
            return value
    return None


# -- the verbs ---------------------------------------------------------------------------------------
def argument_model(verb: str) -> Any:
    """The pydantic model that checks a verb's HTTP fields as strictly as its MCP tool's (its
    parameters' declarations, through ``mcp_server.annotation``)."""
    from pydantic import ConfigDict, create_model

    from .mcp_server import annotation

    spec: dict[str, Any] = {}
    for p in fields(verb):
        spec[p.name] = (annotation(p), ... if p.required or p.tool_required else p.for_tool)
    return create_model(f"http_{verb.replace('-', '_')}", __config__=ConfigDict(strict=True, extra="forbid"),
                        **spec)


@dataclass
class Service:
    """The memory behind every route, and how a verb is run for a request."""

    warm: "WarmMemory"
    workers: int = HTTP_WORKERS
    read_timeout: float = HTTP_READ_TIMEOUT_S
    served: int = 0
    models: dict[str, Any] = field(default_factory=dict)
    _limiter: Any = None
    _count: threading.Lock = field(default_factory=threading.Lock)

    def model(self, verb: str) -> Any:
        if verb not in self.models:
            self.models[verb] = argument_model(verb)
        return self.models[verb]

    def check(self, verb: str, body: dict[str, Any], names: dict[str, str] | None = None) -> Request:
        """``body`` as a request for ``verb``, checked against its declaration: an unknown field is
        ``argument-unknown``, a wrong value ``argument-invalid`` (``names``: the client's names for our
        fields, for the errors)."""
        from pydantic import ValidationError

        shown = names or {}
        allowed = sorted([shown.get(p.name, p.name) for p in fields(verb)] + ([RECORDS] if verb == "memory-index"
                                                                              else []))
        unknown = [str(k)[:MAX_ECHO] for k in body if k not in {p.name for p in fields(verb)}]
        if unknown:
            back = {v: k for k, v in shown.items()}
            unknown = [back.get(k, k) for k in unknown]
            raise UsageError(f"{route(verb)} takes no field {unknown[0]!r}", code=codes.ARGUMENT_UNKNOWN,
                             details={"unknown": unknown[:20], "allowed": allowed})
        try:
            checked = self.model(verb).model_validate(body)
        except ValidationError as exc:
            from .mcp_server import problem

            problems = [{"field": ".".join(shown.get(str(p), str(p)) for p in err["loc"]) or verb,
                         "problem": problem(err)} for err in exc.errors(include_input=False, include_url=False)]
            raise UsageError(f"{route(verb)}: {problems[0]['field']}: {problems[0]['problem']}",
                             code=codes.ARGUMENT_INVALID, details={"errors": problems[:20], "allowed": allowed}
                             ) from None
        return {k: v for k, v in checked.model_dump().items() if v is not None}

    async def pinned(self, rid: str) -> bool:
        """Whether record ``rid`` is hot now (pinned by its line or a pin op; the log's state)."""
        import anyio.to_thread

        def look() -> bool:
            try:
                with self.warm.use(writes=False) as mem:
                    scan = mem.scan()
                    pos = scan.position.get(rid)
                    return pos is not None and pos in scan.hot_positions()
            except NubosMemoryError:  # (the memory cannot be taken now: the page's answers say why)
                return False

        return await anyio.to_thread.run_sync(look)

    async def call(self, verb: str, request: Request) -> tuple[int, str, Any]:
        """Run ``verb`` on a worker thread against the warm memory: ``(exit code, stream, document)``.
        A read verb that takes longer than :attr:`read_timeout` is answered ``http-timeout`` (it runs
        to its end meanwhile); a write is never cut: its lock and write path bound it."""
        import anyio
        import anyio.to_thread

        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self.workers)
        spec = VERBS[verb]
        request = {**request, "root": str(self.warm.root)}

        def work() -> tuple[int, str, Any]:
            return self.warm.answer(verb, request)

        try:
            if spec.writes or spec.long:
                return await anyio.to_thread.run_sync(work, limiter=self._limiter)
            with anyio.fail_after(self.read_timeout):
                return await anyio.to_thread.run_sync(work, limiter=self._limiter, abandon_on_cancel=True)
        except TimeoutError:
            doc = envelope(codes.HTTP_TIMEOUT, f"{verb} did not answer within {self.read_timeout:g} s")
            return UsageError.exit_code, "stderr", doc
        finally:
            with self._count:
                self.served += 1


TEXT_ANSWERS = {"memory-doctor": "text/plain"}  # a verb's text answer that is not markdown (the doctor's report)


def answer(code: int, doc: Any, status: int | None = None, verb: str | None = None) -> "Response":
    """A verb's answer as an HTTP response: its JSON document (a text answer as text: markdown, or the
    doctor's report), the status its exit code maps to, the exit code in a header."""
    from starlette.responses import Response

    if isinstance(doc, dict) and isinstance(doc.get("error"), dict) and doc["error"].get("code") == codes.HTTP_TIMEOUT:
        status = status or 504
    headers = {EXIT_HEADER: str(code), "Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}
    if isinstance(doc, str):
        kind = TEXT_ANSWERS.get(verb or "", "text/markdown")
        return Response(doc, status_code=status or STATUS.get(code, 500), headers=headers,
                        media_type=f"{kind}; charset=utf-8")
    return Response(dumps(doc), status_code=status or STATUS.get(code, 500), headers=headers,
                    media_type="application/json")


def failed(exc: BaseException) -> "Response":
    code, doc = failure(exc)
    return answer(code, doc)


async def json_body(request: "HttpRequest") -> dict[str, Any]:
    """The request's body as a JSON object (an empty body is ``{}``)."""
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        doc = loads(raw)
    except Exception:  # noqa: BLE001 - orjson's and the UTF-8 decoder's errors alike
        raise UsageError("the request body is not JSON", code=codes.HTTP_INVALID_JSON) from None
    if not isinstance(doc, dict):
        raise UsageError("the request body is one JSON object of the verb's fields", code=codes.HTTP_INVALID_JSON)
    return doc


def verb_endpoint(service: Service, verb: str) -> Callable[["HttpRequest"], Awaitable["Response"]]:
    """``POST /v1/<verb>`` (and ``GET`` for memory-stats)."""
    async def endpoint(request: "HttpRequest") -> "Response":
        try:
            body = {} if request.method == "GET" else await json_body(request)
            extra: Request = {}
            records = body.pop(RECORDS, None) if verb == "memory-index" else None
            checked = service.check(verb, body)
            if verb == "memory-index":
                if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
                    raise UsageError(f"{route(verb)}: {RECORDS}: must be a JSON array of record objects",
                                     code=codes.ARGUMENT_INVALID,
                                     details={"errors": [{"field": RECORDS, "problem": "must be a JSON array of "
                                                          "record objects"}]})
                try:
                    extra = {"records_file": "-", "stdin_text": dumps(records).decode()}
                except (TypeError, ValueError, RecursionError):  # (nested deeper than a log line may be)
                    raise UsageError(f"{route(verb)}: {RECORDS}: nested too deep to be a record",
                                     code=codes.HTTP_INVALID_JSON) from None
        except UsageError as exc:
            return failed(exc)
        code, _, doc = await service.call(verb, {**checked, **extra})
        return answer(code, doc, verb=verb)

    return endpoint


async def verb_list(request: "HttpRequest") -> "Response":
    """``GET /v1``: the verbs served, their routes and fields (from the declarations)."""
    return answer(0, {"verbs": [{"verb": name, "route": route(name), "help": VERBS[name].help,
                                 "writes": VERBS[name].writes,
                                 "fields": [p.name for p in fields(name)] + ([RECORDS] if name == "memory-index"
                                                                            else [])}
                                for name in HTTP_VERBS]})


# -- the Knowledge Hive's routes -----------------------------------------------------------------------
HIVE_NAMES = {"text": "query", "k": "maxResults", "max_tokens": "maxTokens"}  # our field -> the Hive's
SOURCE_TYPES = "sourceTypes"


def hive_request(service: Service, body: dict[str, Any]) -> Request:
    """A Hive search body as a memory-query request, checked by the query's declaration; ``sourceTypes``
    (record types, any of them) become ``type:`` field filters of the query's syntax."""
    body = dict(body)
    kinds = body.pop(SOURCE_TYPES, None)
    ours = {v: k for k, v in HIVE_NAMES.items()}
    unknown = [k for k in body if k not in ours]
    if unknown:
        raise UsageError(f"/api/knowledge/search takes no field {str(unknown[0])[:MAX_ECHO]!r}",
                         code=codes.ARGUMENT_UNKNOWN, details={"unknown": [str(k)[:MAX_ECHO] for k in unknown[:20]],
                                                               "allowed": [*HIVE_NAMES.values(), SOURCE_TYPES]})
    request = service.check("memory-query", {ours[k]: v for k, v in body.items()}, HIVE_NAMES)
    if kinds is not None:
        if not isinstance(kinds, list) or not kinds or not all(
                isinstance(t, str) and t.isidentifier() and len(t) <= MAX_TYPE for t in kinds) or len(kinds) > 64:
            problem = "must be a list of 1-64 record types (identifiers, e.g. \"learning\")"
            raise UsageError(f"/api/knowledge/search: {SOURCE_TYPES}: {problem}", code=codes.ARGUMENT_INVALID,
                             details={"errors": [{"field": SOURCE_TYPES, "problem": problem}]})
        request["text"] = f"{request['text']} " + " ".join(f"type:{t}" for t in kinds)
    return request


def hive_results(doc: dict[str, Any]) -> dict[str, Any]:
    """A memory-query answer in the Hive's shape (our own fields kept beside it)."""
    from ..api.context import render_hit
    from ..tokenize import estimate_tokens

    results: list[dict[str, Any]] = []
    for hit in doc.get("hits", []):
        rec = hit["record"]
        chunk = {"id": hit["id"], "title": rec.get("title"), "content": rec.get("body", ""),
                 "source": rec.get("source_file"), "sourceType": rec.get("type"), "heading": rec.get("heading"),
                 "chunkIndex": rec.get("chunk_index"), "tags": rec.get("tags") or [], "createdAt": rec.get("created_at"),
                 "tokens": estimate_tokens(render_hit(len(results) + 1, hit))}
        results.append({"chunk": chunk, "score": hit["score"], "retrieval_mode": hit["retrieval"]})
    budget = doc.get("budget") or {}
    total = budget.get("used", sum(r["chunk"]["tokens"] for r in results))
    return {"results": results, "totalTokens": total, "degraded": doc.get("degraded"),
            "warnings": doc.get("warnings", []), "query": doc.get("query")}


def hive_endpoints(service: Service) -> list[Any]:
    from starlette.routing import Route

    async def search(request: "HttpRequest") -> "Response":
        try:
            checked = hive_request(service, await json_body(request))
        except UsageError as exc:
            return failed(exc)
        code, _, doc = await service.call("memory-query", checked)
        return answer(code, hive_results(doc) if code == 0 else doc)

    async def stats(request: "HttpRequest") -> "Response":
        code, _, doc = await service.call("memory-stats", {})
        if code == 0:
            doc = {**doc, "totalChunks": doc.get("count", 0), "lastUpdated": doc.get("updated_at")}
        return answer(code, doc)

    async def rebuild(request: "HttpRequest") -> "Response":
        code, _, doc = await service.call("memory-rebuild", {})
        return answer(code, {**doc, "success": True} if code == 0 else doc)

    return [Route("/api/knowledge/search", search, methods=["POST"]),
            Route("/api/knowledge/stats", stats, methods=["GET"]),
            Route("/api/knowledge/rebuild", rebuild, methods=["POST"])]


# -- the application -----------------------------------------------------------------------------------
async def not_found(request: "HttpRequest", exc: Exception) -> "Response":
    from starlette.exceptions import HTTPException

    status = exc.status_code if isinstance(exc, HTTPException) else 404
    what = "no route at this path" if status == 404 else f"{request.method} is not taken at this path"
    return answer(2, envelope(codes.HTTP_NOT_FOUND, what, {"path": request.url.path[:MAX_ECHO]}), status)


def build_app(service: Service, guard: Guard, *, mcp: bool = True, max_body: int = HTTP_MAX_BODY,
              body_timeout: float = HTTP_BODY_TIMEOUT_S) -> Any:
    """The whole server as one ASGI app: the guard in front of the verbs, the Hive's routes, the store
    browser and (``mcp``) the MCP tools at ``/mcp``."""
    from starlette.applications import Starlette
    from starlette.routing import Route

    from .browser import routes as browser_routes

    routes: list[Any] = [Route("/v1", verb_list, methods=["GET"]), Route("/v1/", verb_list, methods=["GET"])]
    for name in HTTP_VERBS:
        methods = ["POST", "GET"] if name == "memory-stats" else ["POST"]
        routes.append(Route(route(name), verb_endpoint(service, name), methods=methods))
    routes += hive_endpoints(service)
    routes += browser_routes(service, guard)
    lifespan = None
    if mcp:
        from mcp.server.transport_security import TransportSecuritySettings

        from .mcp_server import build_server

        server, _ = build_server(str(service.warm.root), service.warm)
        # (the guard in front checks Host and Origin for every path, /mcp too, in the one envelope; the SDK's own
        # check compared Host case-sensitively and answered in plain text)
        security = TransportSecuritySettings(enable_dns_rebinding_protection=False)
        mcp_app = server.streamable_http_app(streamable_http_path=MCP_PATH, stateless_http=True, json_response=True,
                                             max_request_body_size=HTTP_MAX_BODY, transport_security=security)
        routes += list(mcp_app.routes)
        manager = server.session_manager

        def lifespan(app: Any) -> Any:
            return manager.run()

    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={404: not_found, 405: not_found})
    return Shield(app, guard, max_body, body_timeout, mcp=mcp)


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (IPv6 for an IPv6 address)."""
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror}", details={"host": host, "port": port}
                         ) from None
    sock.listen(128)
    sock.setblocking(False)
    return sock


def prepare_server(root: str | None, host: str, port: int, allow_host: list[str]
                   ) -> tuple[Service, Guard, socket.socket, str]:
    """Everything but serving: the warm memory, the guard (with the token a non-loopback bind needs),
    the bound socket, and where the token is (never the token)."""
    from .warm import WarmMemory

    token: str | None = None
    where = "not required (loopback)"
    if not is_loopback(host) or os.environ.get(TOKEN_ENV) is not None:  # a token in the environment: always
        token, where = load_token(create=True)
        if token is None:
            raise ConfigError(f"memory-http on {host} needs a bearer token, and none could be read or created: "
                              f"{where}. Set ${TOKEN_ENV} (32+ characters) or make ~/.config/nubos-memory writable, "
                              "or bind 127.0.0.1", code=codes.HTTP_TOKEN_REQUIRED, details={"host": host})
    warm = WarmMemory(root)
    warm.memory.require_enabled()
    sock = bind_socket(host, port)
    guard = Guard(port=sock.getsockname()[1], hosts=allowed_hosts(host, allow_host), token=token)
    return Service(warm), guard, sock, where


_BUSY = object()  # a protocol without request cycles (not HTTP/1.1): not judged here


def stalled(connections: Any, seen: dict[Any, tuple[Any, float]], deadline: float, now: float) -> list[Any]:
    """The connections (uvicorn protocols) that have been waiting for a request's headers longer than
    ``deadline`` seconds: no request in progress (``cycle`` None, or its response sent) and the same one
    since ``seen`` first saw it so.  ``seen`` keeps, per connection, the cycle and when it was first seen
    waiting; it is updated in place."""
    for proto in [p for p in seen if p not in connections]:
        del seen[proto]
    out = []
    for proto in list(connections):
        cycle = getattr(proto, "cycle", _BUSY)
        if cycle is _BUSY or (cycle is not None and not getattr(cycle, "response_complete", False)):
            seen.pop(proto, None)  # a request in progress: its body and its verb have their own limits
            continue
        mark = seen.get(proto)
        if mark is None or mark[0] is not cycle:
            seen[proto] = (cycle, now)
        elif now - mark[1] > deadline:
            out.append(proto)
    return out


def make_server(app: Any, *, header_timeout: float = HTTP_HEADER_TIMEOUT_S) -> "uvicorn.Server":
    """The uvicorn server memory-http runs (adr/0018): at most :data:`HTTP_MAX_CONNECTIONS` connections and
    requests in flight, idle keep-alive connections closed after :data:`HTTP_KEEP_ALIVE_S`, no WebSocket,
    and a connection that has not sent a request's headers within ``header_timeout`` seconds of opening
    (or of its last answer) closed, so that connections that never finish their headers (slowloris) cannot
    hold every slot.  uvicorn has no such timeout; the server's tick (every 0.1 s) looks for them."""
    import uvicorn

    seen: dict[Any, tuple[Any, float]] = {}

    class DeadlineServer(uvicorn.Server):
        async def on_tick(self, counter: int) -> bool:
            for proto in stalled(self.server_state.connections, seen, header_timeout, time.monotonic()):
                transport = getattr(proto, "transport", None)
                if transport is not None and not transport.is_closing():
                    transport.close()
            return await super().on_tick(counter)

    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on", ws="none",
                            limit_concurrency=HTTP_MAX_CONNECTIONS, timeout_keep_alive=HTTP_KEEP_ALIVE_S,
                            h11_max_incomplete_event_size=64 * 1024)
    return DeadlineServer(config)


def run_http(root: str | None, host: str, port: int, allow_host: list[str]) -> dict[str, Any]:
    """Serve until SIGINT/SIGTERM; return a summary.  Prints ``{"serving": URL, ...}`` on stderr once
    listening (the token's location when one is required, never the token)."""
    from .warm import catch_up_forever

    service, guard, sock, where = prepare_server(root, host, port, allow_host)
    app = build_app(service, guard)
    shown = f"[{host.strip('[]')}]" if ":" in host.strip("[]") else host
    url = f"http://{shown}:{guard.port}"
    stop = threading.Event()

    def warm_up() -> None:
        try:
            service.warm.warm_up()
        except Exception:  # noqa: BLE001 - a failed warm-up is answered per request instead
            pass
        catch_up_forever(service.warm, stop)

    threading.Thread(target=warm_up, name="warm-up", daemon=True).start()
    server = make_server(app)
    sys.stderr.write(dumps({"serving": url, "mcp": f"{url}/mcp", "browser": f"{url}/",
                            "token": None if guard.token is None else f"required: {where}",
                            "warnings": service.warm.memory.notices}).decode() + "\n")
    sys.stderr.flush()
    started = time.monotonic()
    # uvicorn raises the signal that stopped it again once it has shut down; with the default handler that
    # would kill the process before the summary is printed, so the handlers in place then do nothing.
    main = threading.current_thread() is threading.main_thread()
    previous = {s: signal.signal(s, lambda *_: None) for s in (signal.SIGTERM, signal.SIGINT)} if main else {}
    try:
        server.run(sockets=[sock])
    finally:
        stop.set()
        sock.close()
        for s, handler in previous.items():
            signal.signal(s, handler)
    return {"stopped": True, "served": service.served, "uptime_s": round(time.monotonic() - started, 3), "url": url}

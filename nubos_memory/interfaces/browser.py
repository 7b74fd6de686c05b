"""The store browser of ``memory-http``: plain server-rendered HTML forms, served at ``/``.

No build step, no CDN and no JavaScript framework: the pages are HTML made here, a stylesheet and a
few lines of vanilla JavaScript (``static/``: ``/`` focuses the search box), all in the package.
Every page works without JavaScript and with the keyboard alone (real links, buttons and labelled
form fields).  Each action is a verb of the one verb table, run like ``POST /v1/<verb>``:

* ``/``: search with the filters and the query syntax of ``memory-query`` (the same declaration
  checks the fields);
* ``/record?id=ID``: a record's fields, its history of versions and retirements (``memory-get
  --history``), its anchors and their freshness, and its near duplicates and conflicts (from the
  query path's collapsing); forms to forget it (with a reason) and to pin or unpin it;
* ``/health``: the doctor's report and the statistics;
* ``/login``: where the token goes when the server needs one.  The browser keeps a value derived from
  it (HMAC-SHA256(token, "browser")), never the token, in an HttpOnly, SameSite=Strict cookie named
  with the server's port; the guard takes that cookie on these pages only (:data:`PAGES`), never on
  ``/v1``, ``/api`` or ``/mcp``.

Browsing is not use: the pages read with ``memory-query`` and ``memory-get`` untracked
(``verbs.UNTRACKED``), so ``memory-prune --unused-for`` never counts a page view.

A form can only be posted from the browser's own pages: the guard refuses a foreign ``Origin`` or
a cross-site request (``http.py``).
"""

from __future__ import annotations

from html import escape
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

from .. import codes
from ..errors import UsageError
from ..fsio import dumps
from ..limits import HTTP_MAX_FORM, MODES
from .verbs import UNTRACKED

if TYPE_CHECKING:
    from starlette.requests import Request as HttpRequest
    from starlette.responses import Response

    from .http import Guard, Service

STATIC = Path(__file__).parent / "static"
# The browser's pages: the one place the guard takes the browser's cookie (``/static/`` is open to all).
PAGES = frozenset({"/", "/record", "/health", "/record/forget", "/record/pin", "/record/unpin", "/login"})
# What a page says after an action (``done=`` in its URL names one; anything else says nothing).
DONE = {"forgotten": "forgotten", "pinned": "pinned", "unpinned": "unpinned"}
ASSETS = {"style.css": "text/css", "app.js": "text/javascript"}
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self'; "
                               "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff", "Referrer-Policy": "same-origin", "Cache-Control": "no-store",
}
# The search form's fields: the query's declared parameters a person sets (name, label, input kind).
SEARCH_FIELDS = (("type", "Type", "text"), ("phase", "Phase", "text"), ("tags", "Tags (a,b)", "text"),
                 ("domain", "Domain", "text"), ("since", "Since", "text"), ("as_of", "As of", "text"),
                 ("k", "Hits", "number"))
CHECKS = (("phase_exact", "this phase only (not the phases under it)"), ("no_collapse", "show near duplicates apart"))


def is_page(path: str) -> bool:
    """Whether ``path`` is one of the browser's pages or files (where its cookie is taken)."""
    return path in PAGES or path.startswith("/static/")


def page(title: str, body: str, status: int = 200) -> "Response":
    """One page of the browser: the layout around ``body``."""
    from starlette.responses import HTMLResponse

    html = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(title)} · nubos-memory</title><link rel="stylesheet" href="/static/style.css">
<script src="/static/app.js" defer></script></head>
<body><a class="skip" href="#main">Skip to content</a>
<header><nav aria-label="main"><a class="brand" href="/">nubos-memory</a>
<a href="/">Search</a><a href="/health">Health</a></nav></header>
<main id="main">{body}</main></body></html>"""
    return HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)


def error_box(doc: Any) -> str:
    """An error envelope, shown as a person reads it (and its code, for an agent that reads the page)."""
    err = doc.get("error", {}) if isinstance(doc, dict) else {}
    details = err.get("details") or {}
    more = f"<pre>{escape(dumps(details, pretty=True).decode())}</pre>" if details else ""
    return (f'<div class="error" role="alert"><strong>{escape(str(err.get("message", "error")))}</strong> '
            f'<code class="code">{escape(str(err.get("code", "")))}</code>{more}</div>')


def notes(doc: dict[str, Any]) -> str:
    """An answer's ``degraded`` and ``warnings``."""
    out = []
    if doc.get("degraded"):
        out.append(f'<p class="warn">degraded ({escape(str(doc["degraded"].get("code")))}): '
                   f'{escape(str(doc["degraded"].get("message", "")))}</p>')
    for w in doc.get("warnings") or []:
        out.append(f'<p class="warn">{escape(str(w.get("code")))}: {escape(str(w.get("message", "")))}</p>')
    return "".join(out)


def record_link(rid: str, text: str | None = None) -> str:
    return f'<a href="/record?id={quote(rid, safe="")}">{escape(text or rid)}</a>'


def tag_list(tags: list[str] | None) -> str:
    return " ".join(f'<span class="tag">{escape(t)}</span>' for t in tags or [])


# -- search --------------------------------------------------------------------------------------------
def search_request(form: dict[str, str]) -> dict[str, Any]:
    """The search form's values as a memory-query body (types as the query's declaration has them)."""
    body: dict[str, Any] = {"text": form.get("q", "")}
    for name, _, _ in SEARCH_FIELDS:
        value = (form.get(name) or "").strip()
        if not value:
            continue
        if name == "k":
            try:
                body["k"] = int(value)
            except ValueError:
                body["k"] = value  # refused by the declaration, with its message
        elif name == "tags":
            body["tags"] = [t.strip() for t in value.split(",") if t.strip()]
        else:
            body[name] = value
    if form.get("mode") in MODES:
        body["mode"] = form["mode"]
    for name, _ in CHECKS:
        if form.get(name):
            body[name] = True
    if form.get("branch"):
        body["branch"] = form["branch"]
    return body


def search_form(form: dict[str, str]) -> str:
    q = escape(form.get("q", ""), quote=True)
    inputs = "".join(
        f'<label>{escape(label)}<input name="{name}" type="{kind}" value="{escape(form.get(name, ""), quote=True)}"'
        + (' min="1" max="1000"' if kind == "number" else "") + "></label>" for name, label, kind in SEARCH_FIELDS)
    modes = "".join(f'<option value="{m}"{" selected" if form.get("mode", "hybrid") == m else ""}>{m}</option>'
                    for m in MODES)
    checks = "".join(f'<label class="check"><input type="checkbox" name="{name}" value="1"'
                     f'{" checked" if form.get(name) else ""}> {escape(label)}</label>' for name, label in CHECKS)
    branch = ('<label>Branch<select name="branch"><option value="">any</option><option value="current"'
              f'{" selected" if form.get("branch") == "current" else ""}>merged into HEAD</option></select></label>')
    return f"""<form class="search" method="get" action="/" role="search">
<label class="q">Search <span class="hint">(press / to focus; syntax: "phrase", AND, OR, NOT, -word, pre*,
type:, tag:, phase:, id:, domain:)</span>
<input id="q" name="q" type="search" value="{q}" autofocus autocomplete="off"></label>
<details{" open" if any(form.get(n) for n in (*(f[0] for f in SEARCH_FIELDS), *(c[0] for c in CHECKS), "branch"))
else ""}><summary>Filters</summary>
<div class="filters">{inputs}<label>Mode<select name="mode">{modes}</select></label>{branch}{checks}</div>
</details>
<button type="submit">Search</button></form>"""


def hit_item(hit: dict[str, Any]) -> str:
    rec = hit["record"]
    body = str(rec.get("body") or "")
    snippet = escape(body[:280] + ("…" if len(body) > 280 else ""))
    extra = []
    if hit.get("collapsed"):
        extra.append(f'<span class="badge">+{hit["collapsed"]["count"]} near duplicate(s)</span>')
    if hit.get("conflicts"):
        extra.append(f'<span class="badge conflict">{len(hit["conflicts"])} conflict(s)</span>')
    if hit.get("freshness") and hit["freshness"] != "unanchored":
        extra.append(f'<span class="badge fresh-{escape(hit["freshness"])}">{escape(hit["freshness"])}</span>')
    if rec.get("hot"):
        extra.append('<span class="badge">pinned</span>')
    return (f'<li class="hit"><h3>{record_link(hit["id"], str(rec.get("title")))}</h3>'
            f'<p class="meta"><span class="type">{escape(str(rec.get("type")))}</span> · score '
            f'{hit["score"]:.3f} · {escape(hit["retrieval"])} · {escape(str(rec.get("created_at", "")))} '
            f'{tag_list(rec.get("tags"))} {" ".join(extra)}</p><p class="snippet">{snippet}</p></li>')


async def search(service: "Service", request: "HttpRequest") -> "Response":
    form = dict(request.query_params.items())
    body = search_form(form)
    if form.get("q", "").strip():
        try:
            checked = service.check("memory-query", search_request(form))
            code, _, doc = await service.call("memory-query", {**checked, UNTRACKED: True})
        except UsageError as exc:
            code, doc = exc.exit_code, {"error": exc.to_dict()}
        if code != 0:
            body += error_box(doc)
        else:
            hits = doc.get("hits", [])
            body += notes(doc)
            body += (f'<section aria-label="results"><h2>{len(hits)} hit(s)</h2><ol class="hits">'
                     + "".join(hit_item(h) for h in hits) + "</ol></section>")
    return page("Search", "<h1>Search the memory</h1>" + body)


# -- a record ----------------------------------------------------------------------------------------
FIELD_ORDER = ("id", "type", "title", "body", "tags", "phase", "domain", "provenance", "importance", "hot",
               "created_at", "valid_until", "supersedes", "source_file", "heading", "chunk_index", "git", "anchors")


def fields_table(rec: dict[str, Any]) -> str:
    rows = []
    for key in (*FIELD_ORDER, *sorted(k for k in rec if k not in FIELD_ORDER)):
        if key not in rec or rec[key] in (None, [], ""):
            continue
        value = rec[key]
        shown = (f'<pre class="body">{escape(value)}</pre>' if key == "body" else
                 tag_list(value) if key == "tags" else
                 record_link(value) if key == "supersedes" else
                 escape(value if isinstance(value, str) else dumps(value).decode()))
        rows.append(f"<tr><th scope=\"row\">{escape(key)}</th><td>{shown}</td></tr>")
    return f'<table class="fields">{"".join(rows)}</table>'


def fate(retired: dict[str, Any] | None) -> str:
    """What became of a version: live, or retired (why, when, by what)."""
    if not retired:
        return '<span class="badge fresh-verified">live</span>'
    parts = [f'<span class="badge conflict">{escape(str(retired.get("reason", "retired")))}</span>']
    if retired.get("why"):
        parts.append(escape(str(retired["why"])))
    if retired.get("at"):
        parts.append(f"at {escape(str(retired['at']))}")
    if retired.get("by"):
        parts.append(f"by {record_link(str(retired['by']))}")
    return " ".join(parts)


def history_list(history: list[dict[str, Any]]) -> str:
    """Every version of the record in log order (``memory-get --history``), with its fate."""
    if not history:
        return "<p>No other version.</p>"
    items = []
    for version in history:
        rec = version.get("record") or {}
        where = f"line {version['line']}" if version.get("line") is not None else "redaction"
        items.append(f"<li><strong>{escape(str(rec.get('title', '(text removed)')))}</strong> "
                     f'<span class="meta">{escape(where)} · {escape(str(rec.get("created_at", "")))}</span> '
                     f"{fate(version.get('retired'))}</li>")
    return f'<ol class="history">{"".join(items)}</ol>'


def anchors_list(hit: dict[str, Any] | None, rec: dict[str, Any]) -> str:
    anchors = (hit or {}).get("anchors") or rec.get("anchors") or []
    if not anchors:
        return "<p>This record cites no code.</p>"
    fresh = (hit or {}).get("freshness")
    head = f'<p>Freshness: <span class="badge fresh-{escape(fresh)}">{escape(fresh)}</span></p>' if fresh else \
        "<p>Freshness is checked when the record is found by a query (a retired record is not).</p>"
    items = "".join(f"<li><code>{escape(dumps(a).decode())}</code></li>" for a in anchors)
    return head + f'<ul class="anchors">{items}</ul>'


def relations(hit: dict[str, Any] | None, rid: str) -> str:
    if hit is None:
        return "<p>None found (the record is not live, or no query for its title finds it).</p>"
    out = []
    collapsed = hit.get("collapsed") or {}
    others = [i for i in collapsed.get("ids", []) if i != rid]
    if hit["id"] != rid:
        out.append(f"<p>Shown under the newer near duplicate {record_link(hit['id'])}.</p>")
    if others:
        out.append("<p>Near duplicates folded into it:</p><ul>"
                   + "".join(f"<li>{record_link(i)}</li>" for i in others) + "</ul>")
    for c in hit.get("conflicts") or []:
        cid = str(c.get("id", ""))
        other = hit["id"] if cid == rid else cid  # on the older record's page: the newer one it disagrees with
        said = escape(str(c.get("said", "")))
        out.append(f'<p class="conflict">Conflict ({escape(str(c.get("kind", "")))}) with {record_link(other)}'
                   f"{f': the older one said “{said}”' if said else ''}</p>")
    return "".join(out) or "<p>None.</p>"


def actions(rid: str, live: bool, hot: bool) -> str:
    if not live:
        return "<p>This record is retired: nothing to do here.</p>"
    pin = "unpin" if hot else "pin"
    return f"""<form method="post" action="/record/forget" class="action">
<input type="hidden" name="id" value="{escape(rid, quote=True)}">
<label>Reason <input name="reason" required maxlength="200" placeholder="why it is no longer true"></label>
<button type="submit" class="danger">Forget</button></form>
<form method="post" action="/record/{pin}" class="action"><input type="hidden" name="id" value="{escape(rid, quote=True)}">
<button type="submit">{pin.capitalize()}</button>
<span class="hint">{"pinned: in every memory-context block" if hot else "pin: include it in every memory-context block"}
</span></form>"""


async def record(service: "Service", request: "HttpRequest") -> "Response":
    rid = request.query_params.get("id", "")
    done = request.query_params.get("done")
    try:
        checked = service.check("memory-get", {"ids": [rid], "history": True})
    except UsageError as exc:
        return page("Record", error_box({"error": exc.to_dict()}), 400)
    code, _, doc = await service.call("memory-get", {**checked, UNTRACKED: True})
    if code != 0:
        return page("Record", error_box(doc), 404 if doc["error"].get("code") == codes.RECORD_NOT_FOUND else 400)
    got = doc["records"][0]
    rec = got.get("record") or {}
    hit = None
    if got["live"] and rec.get("title"):
        qcode, _, found = await service.call("memory-query", {"text": str(rec["title"]), "k": 20, UNTRACKED: True})
        if qcode == 0:
            hit = next((h for h in found["hits"] if h["id"] == rid or rid in (h.get("collapsed") or {}).get("ids", [])),
                       None)
    status = "live" if got["live"] else f"retired: {dumps(got['retired']).decode()}"
    flash = f'<p class="done" role="status">Done: {DONE[done]}.</p>' if done in DONE else ""
    body = (f"{flash}<h1>{escape(str(rec.get('title', '(redacted)')))}</h1>"
            f'<p class="status">{escape(status)}</p>{notes(doc)}'
            f"<section><h2>Fields</h2>{fields_table(rec)}</section>"
            f"<section><h2>Actions</h2>{actions(rid, got['live'], await service.pinned(rid))}</section>"
            f"<section><h2>Anchors</h2>{anchors_list(hit, rec)}</section>"
            f"<section><h2>Near duplicates and conflicts</h2>{relations(hit, rid)}</section>"
            f"<section><h2>History</h2>{history_list(got.get('history') or [])}</section>")
    return page(str(rec.get("title", rid)), body)


async def form_of(request: "HttpRequest") -> dict[str, str]:
    """A posted form's fields (bounded: the guard already bounded the body)."""
    from urllib.parse import parse_qsl

    raw = await request.body()
    if len(raw) > HTTP_MAX_FORM:
        raise UsageError(f"a form is at most {HTTP_MAX_FORM} bytes")
    return dict(parse_qsl(raw.decode("utf-8", "replace"), keep_blank_values=True))


async def act(service: "Service", request: "HttpRequest", verb: str, done: str) -> "Response":
    """Forget, pin or unpin one record from its page, then back to it (or the error on a page)."""
    from starlette.responses import RedirectResponse

    try:
        form = await form_of(request)
        body: dict[str, Any] = {"ids": [form.get("id", "")]}
        if verb == "memory-forget":
            body["reason"] = form.get("reason", "")
        code, _, doc = await service.call(verb, service.check(verb, body))
    except UsageError as exc:
        code, doc = exc.exit_code, {"error": exc.to_dict()}
    if code != 0:
        return page("Not done", "<h1>Not done</h1>" + error_box(doc), 400)
    target = "/record?" + urlencode({"id": form.get("id", ""), "done": done})
    return RedirectResponse(target, status_code=303, headers=SECURITY_HEADERS)


# -- health --------------------------------------------------------------------------------------------
STAT_KEYS = ("count", "model", "provider", "backend", "fusion", "alpha", "updated_at", "rebuilt_at", "memory_dir")


async def health(service: "Service", request: "HttpRequest") -> "Response":
    from ..api.doctor import render

    body = "<h1>Health</h1>"
    code, _, report = await service.call("memory-doctor", {"format": "json"})
    body += f"<section><h2>Doctor</h2><pre class=\"doctor\">{escape(render(report))}</pre></section>" if code == 0 \
        else error_box(report)
    code, _, stats = await service.call("memory-stats", {})
    if code == 0:
        rows = "".join(f'<tr><th scope="row">{k}</th><td>{escape(str(stats.get(k)))}</td></tr>'
                       for k in STAT_KEYS if k in stats)
        consistency = stats.get("consistency") or {}
        problems = "".join(f"<li><code>{escape(str(p.get('code')))}</code> {escape(str(p.get('message', '')))}</li>"
                           for p in consistency.get("problems") or [])
        body += (f'<section><h2>Statistics</h2><table class="fields">{rows}<tr><th scope="row">retired</th><td>'
                 f'{escape(dumps(stats.get("retired")).decode())}</td></tr><tr><th scope="row">consistent</th><td>'
                 f'{escape(str(consistency.get("consistent")))}</td></tr></table>'
                 + (f"<h3>Problems</h3><ul>{problems}</ul>" if problems else "") + "</section>")
    else:
        body += error_box(stats)
    return page("Health", body)


# -- the token form, static files, routes ----------------------------------------------------------------
async def login(guard: "Guard", request: "HttpRequest") -> "Response":
    from starlette.responses import RedirectResponse

    if guard.token is None:
        return RedirectResponse("/", status_code=303)
    form = """<h1>Token</h1><p>This server needs its bearer token (in <code>~/.config/nubos-memory/http-token</code>
on the machine it runs on, or <code>$NUBOS_MEMORY_HTTP_TOKEN</code>).</p>
<form method="post" action="/login"><label>Token <input name="token" type="password" required autofocus
autocomplete="off"></label><button type="submit">Open</button></form>"""
    if request.method == "GET":
        return page("Token", form)
    try:
        given = (await form_of(request)).get("token", "")
    except UsageError:
        given = ""
    if not given or not guard.bearer_ok(given) or guard.cookie_value is None:
        return page("Token", '<p class="error" role="alert">That is not the token.</p>' + form, 401)
    response = RedirectResponse("/", status_code=303)
    response.set_cookie(guard.cookie_name, guard.cookie_value, httponly=True, samesite="strict", path="/")
    return response


async def asset(request: "HttpRequest") -> "Response":
    from starlette.responses import Response

    name = request.path_params["name"]
    if name not in ASSETS:
        return page("Not found", "<h1>Not found</h1>", 404)
    return Response((STATIC / name).read_bytes(), media_type=ASSETS[name],
                    headers={"X-Content-Type-Options": "nosniff", "Cache-Control": "max-age=300"})


def routes(service: "Service", guard: "Guard") -> list[Any]:
    """The browser's routes."""
    from starlette.routing import Route

    async def search_page(request: "HttpRequest") -> "Response":
        return await search(service, request)

    async def record_page(request: "HttpRequest") -> "Response":
        return await record(service, request)

    async def health_page(request: "HttpRequest") -> "Response":
        return await health(service, request)

    async def forget(request: "HttpRequest") -> "Response":
        return await act(service, request, "memory-forget", "forgotten")

    async def pin(request: "HttpRequest") -> "Response":
        return await act(service, request, "memory-pin", "pinned")

    async def unpin(request: "HttpRequest") -> "Response":
        return await act(service, request, "memory-unpin", "unpinned")

    async def login_page(request: "HttpRequest") -> "Response":
        return await login(guard, request)

    return [Route("/", search_page, methods=["GET"]), Route("/record", record_page, methods=["GET"]),
            Route("/health", health_page, methods=["GET"]), Route("/record/forget", forget, methods=["POST"]),
            Route("/record/pin", pin, methods=["POST"]), Route("/record/unpin", unpin, methods=["POST"]),
            Route("/login", login_page, methods=["GET", "POST"]), Route("/static/{name}", asset, methods=["GET"])]

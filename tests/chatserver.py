"""A deterministic OpenAI-compatible chat-completions server for the generator's tests (no model).

A real HTTP server on a loopback socket, in a thread: ``POST /v1/chat/completions`` reads the task on
the system message's first line (``Task: questions|merge|harvest``, as ``generate/tasks.py`` writes it)
and answers with the JSON a model would, computed from the user message alone, so the same request
always gets the same answer.  It can be made slow (``delay_s``), failing (``fail_status``), or to
answer without a completion (``garbage``), to quote the key it was sent in an error (``echo_key``), stopped and started again on the same port; it records
every request (``requests``: time, path, body, whether a bearer key came).

* questions: ``q<i>: what about <the note's title, lower case>?``, as many as the prompt asks for;
* merge: title ``Merged: <the newest note's title>``, body the notes' distinct bodies, oldest first;
* harvest: summary ``Session: <the first line>`` (``<n> lines``), and a fact per line holding
  ``FACT: <title>`` (a line holding ``THINK:`` gives a fact that is only reasoning).
"""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def _questions(system: str, user: str) -> dict[str, Any]:
    n = int(re.search(r"Write (\d+)", system).group(1))  # type: ignore[union-attr]
    title = user.split("\n", 1)[0].removeprefix("Title: ").strip().lower()
    return {"questions": [f"q{i + 1}: what about {title}?" for i in range(n)]}


def _merge(user: str) -> dict[str, Any]:
    notes = [part.split("\n", 2) for part in user.split("--- note ")[1:]]
    titles = [n[1].removeprefix("Title: ") for n in notes]
    bodies = list(dict.fromkeys(n[2].strip() for n in notes if len(n) > 2 and n[2].strip()))
    return {"title": f"Merged: {titles[-1]}", "body": "\n".join(bodies)}


def _harvest(user: str) -> dict[str, Any]:
    lines = [line for line in user.splitlines() if line.strip()]
    facts = []
    for line in lines:
        if "FACT:" in line:
            facts.append({"title": line.split("FACT:", 1)[1].strip(), "body": "learned in the session"})
        elif "THINK:" in line:
            facts.append({"title": "<think>maybe this, maybe that</think>", "body": ""})
    return {"summary": {"title": f"Session: {lines[0][:60]}", "body": f"{len(lines)} lines"}, "facts": facts}


class ChatServer:
    """See module docstring."""

    def __init__(self) -> None:
        self.delay_s = 0.0
        self.fail_status: int | None = None
        self.garbage = False
        self.echo_key = False  # a failure's body quotes the Authorization header (the key must never reach output)
        self.empty_merge = False  # a merge answers its title with an empty body (a summary that lost the text)
        self.requests: list[dict[str, Any]] = []
        self.port = 0
        self._httpd: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def answer(self, payload: dict[str, Any]) -> dict[str, Any]:
        system, user = payload["messages"][0]["content"], payload["messages"][1]["content"]
        task = system.split("\n", 1)[0].removeprefix("Task: ").strip()
        content = (_questions(system, user) if task == "questions" else _merge(user) if task == "merge"
                   else _harvest(user))
        if task == "merge" and self.empty_merge:
            content["body"] = ""
        return {"id": "chatcmpl-test", "object": "chat.completion", "model": f"{payload['model']}-served",
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": "```json\n" + json.dumps(content) + "\n```"}}]}

    def start(self) -> "ChatServer":
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                server.requests.append({"at": time.monotonic(), "path": self.path, "body": json.loads(body),
                                        "key": self.headers.get("Authorization", "").startswith("Bearer ")})
                if server.delay_s:
                    time.sleep(server.delay_s)
                if self.path != "/v1/chat/completions":
                    self._send(404, {"error": {"message": "no such route"}})
                elif server.fail_status is not None:
                    said = self.headers.get("Authorization", "") if server.echo_key else ""
                    self._send(server.fail_status, {"error": {"message": f"failing on purpose {said}"}})
                else:
                    self._send(200, {"choices": []} if server.garbage else server.answer(json.loads(body)))

            def _send(self, status: int, doc: dict[str, Any]) -> None:
                data = json.dumps(doc).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass  # the client gave up (a timeout test)

        ThreadingHTTPServer.allow_reuse_address = True
        self._httpd = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

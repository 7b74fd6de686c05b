"""memory-mcp driven by a raw stdio client: bytes in, lines out, every read bounded.

What an SDK client never sends but real clients do (a JavaScript client that cut an emoji in
half sends a lone surrogate escape; a broken one sends a line that is not JSON, a runaway one a
deeply nested or huge argument) must still be answered for its id, or the agent's call hangs.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading

import pytest

from .conftest import REPO

WAIT = 20.0  # seconds any one answer may take; a server that never answers fails instead of hanging


class Raw:
    """The server as a subprocess; lines of bytes written to its stdin, its stdout read by a thread."""

    def __init__(self, root):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "nubos_memory", "memory-mcp", "--root", str(root)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=str(root),
            env={**os.environ, "PYTHONPATH": str(REPO)})
        self.lines: queue.Queue[bytes] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        self.next_id = 1000

    def _pump(self):
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(b"")

    def send(self, data: bytes) -> None:
        self.proc.stdin.write(data + b"\n")
        self.proc.stdin.flush()

    def receive(self) -> dict:
        try:
            line = self.lines.get(timeout=WAIT)
        except queue.Empty:
            pytest.fail(f"no answer in {WAIT:.0f} s")
        assert line, "the server closed its stdout"
        return json.loads(line)

    def answer(self, rid) -> dict:
        """The next answer, which must be for ``rid`` (log notifications are passed over)."""
        while True:
            message = self.receive()
            if "id" in message or "method" not in message:
                assert message.get("id") == rid, message
                return message

    def request(self, method: str, params: dict | None = None) -> dict:
        self.next_id += 1
        doc = {"jsonrpc": "2.0", "id": self.next_id, "method": method, **({"params": params} if params else {})}
        self.send(json.dumps(doc).encode())
        return self.answer(self.next_id)

    def call(self, tool: str, arguments: dict) -> dict:
        return self.request("tools/call", {"name": tool, "arguments": arguments})["result"]

    def alive(self) -> None:
        """A good request after a bad line is still answered."""
        tools = self.request("tools/list")["result"]["tools"]
        assert "memory_query" in {t["name"] for t in tools}
        result = self.call("memory_query", {"text": "webhook retries"})
        assert result["isError"] is False, result

    def close(self) -> None:
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=WAIT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=WAIT)


@pytest.fixture
def raw(project):
    client = Raw(project)
    try:
        init = client.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                             "clientInfo": {"name": "raw-test", "version": "0"}})
        assert "result" in init, init
        client.send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}')
        yield client
    finally:
        client.close()


def envelope(result: dict) -> dict:
    assert result["isError"] is True, result
    assert result.get("structuredContent") is None
    return json.loads(result["content"][0]["text"])["error"]


def tool_call(rid: int, arguments: bytes, tool: bytes = b"memory_query") -> bytes:
    return (b'{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"%s","arguments":%s}}'
            % (rid, tool, arguments))


def test_a_line_that_is_not_json_is_a_parse_error_with_id_null(raw):
    raw.send(b"not json")
    answer = raw.receive()
    assert answer["id"] is None and answer["error"]["code"] == -32700
    raw.alive()
    raw.send(b'{"jsonrpc":"2.0","id":7,"method":"tools/list"')  # cut short: the id is still read
    answer = raw.answer(7)
    assert answer["error"]["code"] == -32700
    raw.alive()
    raw.send(b'{"jsonrpc":"2.0","id":9,"method":"tools/list","x":"' + b'\\"' * 4_000_000)  # a string never closed
    assert raw.answer(9)["error"]["code"] == -32700
    raw.send(b"[1, 2]")  # a batch: not a request
    answer = raw.receive()
    assert answer["id"] is None and answer["error"]["code"] == -32600
    raw.send(b'{"id":8,"method":"tools/list"}')  # no "jsonrpc": "2.0"
    assert raw.answer(8)["error"]["code"] == -32600
    raw.alive()


@pytest.mark.parametrize("text", [rb'"qzx\ud83d"', rb'"\ude00qzx"', b'"qzx\xff\xfe"'],
                         ids=["lone-high-surrogate", "lone-low-surrogate", "not-utf8"])
def test_text_that_is_not_unicode_is_argument_invalid_for_that_id(raw, text):
    raw.send(tool_call(41, b'{"text": %s, "k": 3}' % text))
    result = raw.answer(41)["result"]
    error = envelope(result)
    assert error["code"] == "argument-invalid"
    assert error["details"]["tool"] == "memory_query" and error["details"]["errors"][0]["field"] == "text"
    assert "k" in error["details"]["allowed"]
    assert "qzx" not in json.dumps(error)  # the value is not echoed
    raw.alive()


def test_a_bad_notification_is_dropped_and_a_bad_request_of_another_method_answered(raw):
    raw.send(rb'{"jsonrpc":"2.0","method":"notifications/roots/list_changed","params":{"x":"\ud83d"}}')
    raw.send(rb'{"jsonrpc":"2.0","id":42,"method":"resources/read","params":{"uri":"file:///\ud83d"}}')
    answer = raw.answer(42)  # the first line read after the notification: nothing was said about it
    assert answer["error"]["code"] == -32602
    assert answer["error"]["data"]["error"]["code"] == "argument-invalid"
    raw.alive()


def test_a_5000_deep_argument_is_refused_for_that_id(raw):
    deep = b"[" * 5000 + b"]" * 5000
    raw.send(tool_call(51, b'{"text": "x", "tags": %s}' % deep))
    error = envelope(raw.answer(51)["result"])
    assert error["code"] == "argument-invalid"
    assert error["details"]["errors"][0]["field"].startswith("tags")
    assert "deeper" in error["details"]["errors"][0]["problem"]
    raw.alive()
    raw.send(tool_call(52, b'{"text": "x", "tags": %s}' % (b"[" * 300 + b"]" * 300)))  # the stdlib reads this depth
    assert "deeper" in envelope(raw.answer(52)["result"])["details"]["errors"][0]["problem"]
    obj = b'{"a":' * 5000 + b"1" + b"}" * 5000  # an object, with the id last
    raw.send(b'{"jsonrpc":"2.0","method":"tools/call","params":{"name":"memory_add","arguments":'
             b'{"type":"learning","title":"t","body":%s}},"id":"deep-1"}' % obj)
    assert envelope(raw.answer("deep-1")["result"])["details"]["errors"][0]["field"].startswith("body")
    raw.alive()


def test_an_oversize_line_is_refused_and_the_server_goes_on(raw):
    big = b"x" * (20 * 1024 * 1024)
    raw.send(b'{"jsonrpc":"2.0","id":61,"method":"tools/call","params":{"name":"memory_add","arguments":'
             b'{"type":"learning","title":"t","body":"%s"}}}' % big)
    answer = raw.answer(61)
    assert answer["error"]["code"] == -32600 and "bytes" in answer["error"]["message"]
    raw.alive()
    raw.send(b"[" + big + b"]")  # no id to be read: id null
    answer = raw.receive()
    assert answer["id"] is None and answer["error"]["code"] == -32600
    raw.alive()


@pytest.mark.parametrize("arguments", [
    {"text": "x", "k": "2"}, {"text": "x", "k": True}, {"text": "x", "k": 2.5}, {"text": "x", "k": "abc"},
    {"text": "x", "explain": "yes"}, {"text": "x", "explain": 1}, {"text": "x", "phase_exact": "true"},
    {"text": "x", "alpha": "0.5", "fusion": "alpha"}, {"text": "x", "alpha": True, "fusion": "alpha"},
    {"text": "x", "max_tokens": "500"}, {"text": "x", "tags": '["ci"]'}, {"text": 5},
], ids=["k-str", "k-true", "k-float", "k-abc", "explain-str", "explain-1", "phase_exact-str", "alpha-str",
        "alpha-true", "max_tokens-str", "tags-json-str", "text-int"])
def test_argument_types_are_strict(raw, arguments):
    error = envelope(raw.call("memory_query", arguments))
    assert error["code"] == "argument-invalid", error
    (bad,) = set(arguments) - {"text", "fusion"} or {"text"}
    assert error["details"]["errors"][0]["field"] == bad


def test_strict_types_still_take_what_the_schema_allows(raw):
    assert raw.call("memory_query", {"text": "x", "k": 2, "explain": True, "alpha": 1, "fusion": "alpha",
                                     "tags": ["ci"], "phase_exact": False})["isError"] is False
    added = raw.call("memory_add", {"type": "learning", "title": "Pin pnpm", "importance": 1, "force": True,
                                    "tags": ["ci"]})
    assert added["isError"] is False, added
    error = envelope(raw.call("memory_add", {"type": "learning", "title": "Pin pnpm", "force": "true"}))
    assert error["code"] == "argument-invalid" and error["details"]["errors"][0]["field"] == "force"


def test_a_long_method_name_is_not_repeated_in_full(raw):
    raw.send(b'{"jsonrpc":"2.0","id":77,"method":"tools/list' + b"A" * 100_000 + b'"}')
    answer = raw.answer(77)
    assert answer["error"]["code"] == -32601 and len(json.dumps(answer)) < 1000
    raw.alive()

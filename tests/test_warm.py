"""The warm memory shared by memory-serve and memory-mcp: one model load, reads beside writes."""

from __future__ import annotations

import threading
import time

from nubos_memory.embed import HashEmbedder
from nubos_memory.interfaces.warm import WarmMemory

from .conftest import index_records, rec


class SlowToLoad(HashEmbedder):
    """Stands in for a model that takes a while to load on its first use, counting its loads."""

    def __init__(self):
        super().__init__("hash-256")
        self.loaded = False
        self.loads = 0
        self.busy = threading.Lock()

    def embed(self, texts):
        if not self.loaded:
            self.loads += 1
            time.sleep(0.5)  # loading: a second caller now would load it again
            self.loaded = True
        return super().embed(texts)


def test_a_call_during_warm_up_waits_for_it_and_the_model_loads_once(project):
    """memory-mcp warms up in a thread while the first tool call may already arrive (issue 13)."""
    index_records(project, [rec(f"note {i}", f"about topic {i}", id=f"n{i}") for i in range(5)])
    emb = SlowToLoad()
    warm = WarmMemory(str(project), embedder=emb)
    warming = threading.Thread(target=warm.warm_up)
    warming.start()
    time.sleep(0.05)  # the warm-up is loading the model now
    with warm.use(writes=False) as mem:
        hits = mem.query("topic 3")["hits"]
    warming.join()
    assert hits and emb.loads == 1


def test_a_query_is_answered_while_a_long_write_runs(project):
    """Reads and writes use two memories: a query does not wait for a write (issue 11)."""
    index_records(project, [rec(f"note {i}", f"about topic {i}", id=f"n{i}") for i in range(5)])
    warm = WarmMemory(str(project))
    warm.warm_up()
    writing = threading.Event()
    release = threading.Event()

    def long_write():
        with warm.use(writes=True):
            writing.set()
            release.wait(10)

    writer = threading.Thread(target=long_write)
    writer.start()
    writing.wait(5)
    started = time.monotonic()
    with warm.use(writes=False) as mem:
        assert mem.query("topic 2")["hits"][0]["id"] == "n2"
    assert time.monotonic() - started < 5
    release.set()
    writer.join()


def test_the_background_loop_outlives_an_unexpected_error_and_slows_down_when_nothing_comes(capsys):
    from nubos_memory.interfaces.warm import catch_up_forever

    class Flaky:
        last_request = 0.0

        def __init__(self):
            self.calls = 0

        def catch_up(self):
            self.calls += 1
            if self.calls == 1:
                raise ValueError("a bug in derived work")
            return 0

    warm, stop = Flaky(), threading.Event()
    loop = threading.Thread(target=catch_up_forever, args=(warm, stop, 0.01, 0.08))
    loop.start()
    time.sleep(0.6)
    stop.set()
    loop.join(timeout=5)
    assert not loop.is_alive() and warm.calls >= 3  # it went on after the error
    assert warm.calls < 0.6 / 0.01 / 2  # and looked less often while nothing came
    assert "background indexing failed once: ValueError" in capsys.readouterr().err

"""Search queries embedded by the model's int8 copy (issue 27, adr/0022): made once beside the export,
parity checked against it, signed; never used for anything stored; refused or exact when it must be."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from nubos_memory import Memory
from nubos_memory.embed import HashEmbedder, onnx_int8
from nubos_memory.embed.model import ModelEmbedder
from nubos_memory.embed.prefixed import prefixed
from nubos_memory.evaluation.embedcache import CachedEmbedder
from nubos_memory.limits import DEFAULT_MODEL

from .conftest import rec, run_cli, write_config
from .test_runtimes import copy_export, packaged  # noqa: F401 - the module's fixture

QUERIES = ["how do I ship a build?", "why does the CI cache miss after a pnpm upgrade?", "jwt",
           "Wie deploye ich das Release?", "x = foo(bar[0]) if a != b else None"]


@pytest.fixture
def cache(packaged, tmp_path, monkeypatch):  # noqa: F811
    """A user cache of its own holding the packaged model's export (no int8 copy yet)."""
    monkeypatch.setenv("NUBOS_MEMORY_CACHE", str(tmp_path / "cache"))
    copy_export(packaged, tmp_path / "cache")
    return packaged[1]


@pytest.mark.model
def test_queries_use_the_int8_copy_made_once_and_only_it_loads(cache, monkeypatch):
    emb = ModelEmbedder(DEFAULT_MODEL)
    assert emb.plan()["queries"]["runtime"] == "onnx-int8" and emb.plan()["queries"]["status"] == "missing"
    got = emb.embed_search(QUERIES)
    assert emb._runtime is None  # a one-shot query loads the int8 copy, not the exact model too
    status, _, path = onnx_int8.state(cache)
    assert status == "ready" and path is not None and path.parent.name == f"{cache}.int8"
    meta = json.loads((path.parent / "export.json").read_text())
    assert meta["signature"] and meta["parity"]["mean_cos"] >= onnx_int8.PARITY_MEAN_MIN
    exact = emb.embed(QUERIES)
    cos = np.einsum("ij,ij->i", got.astype(np.float64), exact.astype(np.float64))
    assert cos.min() >= 0.98 and not np.array_equal(got, exact)  # close to the exact vectors, and not them
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    info = emb.runtime_info()["queries"]
    assert info["runtime"] == "onnx-int8" and "cosine to the exact model" in info["why"]

    def no_quantizing(*args, **kwargs):
        raise AssertionError("made again")

    monkeypatch.setattr(onnx_int8, "quantize", no_quantizing)
    again = ModelEmbedder(DEFAULT_MODEL).embed_search(QUERIES)  # another process: the copy is there
    assert np.array_equal(again, got)  # and deterministic


@pytest.mark.model
def test_exact_setting_and_torch_embed_queries_exactly(cache):
    exact = ModelEmbedder(DEFAULT_MODEL, queries="exact")
    assert np.array_equal(exact.embed_search(QUERIES), exact.embed_query(QUERIES))
    assert exact.runtime_info()["queries"] == {"runtime": "exact", "why": "memory.queries is exact"}
    torch = ModelEmbedder(DEFAULT_MODEL, runtime="torch")
    assert torch.plan()["queries"]["runtime"] == "exact"
    assert np.array_equal(torch.embed_search(QUERIES[:1]), torch.embed(QUERIES[:1]))
    assert "torch" in torch.runtime_info()["queries"]["why"]
    assert onnx_int8.state(cache)[0] == "missing"  # neither made a copy


@pytest.mark.model
def test_an_int8_copy_far_from_the_model_is_refused_and_queries_stay_exact(cache, monkeypatch):
    monkeypatch.setattr(onnx_int8, "PARITY_MEAN_MIN", 0.9999)  # a copy this model's cannot reach
    emb = ModelEmbedder(DEFAULT_MODEL)
    assert np.array_equal(emb.embed_search(QUERIES), emb.embed(QUERIES))
    status, why, _ = onnx_int8.state(cache)
    assert status == "refused" and "too far" in why
    assert emb.runtime_info()["queries"]["runtime"] == "exact" and "too far" in emb.runtime_info()["queries"]["why"]
    later = ModelEmbedder(DEFAULT_MODEL)  # recorded: no process tries again
    assert later.plan()["queries"]["runtime"] == "exact"
    monkeypatch.setattr(onnx_int8, "quantize", lambda *a, **k: pytest.fail("tried again"))
    later.embed_search(QUERIES[:1])


@pytest.mark.model
def test_a_damaged_int8_copy_is_made_again(cache):
    ModelEmbedder(DEFAULT_MODEL).embed_search(QUERIES[:1])
    path = onnx_int8.state(cache)[2]
    assert path is not None
    with open(path.parent / "query-int8.onnx.data", "r+b") as f:  # same size, other bytes
        f.seek(1 << 20)
        f.write(b"\x00" * 64)
    status, why, _ = onnx_int8.state(cache)
    assert status == "damaged" and "sha256" in why
    emb = ModelEmbedder(DEFAULT_MODEL)
    emb.embed_search(QUERIES[:1])
    assert onnx_int8.state(cache)[0] == "ready" and emb.runtime_info()["queries"]["runtime"] == "onnx-int8"


@pytest.mark.model
def test_a_failing_quantizer_leaves_queries_exact(cache, monkeypatch):
    def broken(exact, out):
        raise RuntimeError("quantizer blew up")

    monkeypatch.setattr(onnx_int8, "_quantized", broken)
    emb = ModelEmbedder(DEFAULT_MODEL)
    assert np.array_equal(emb.embed_search(QUERIES[:2]), emb.embed(QUERIES[:2]))
    assert "quantizer blew up" in emb.runtime_info()["queries"]["why"]
    assert onnx_int8.state(cache)[0] == "refused"  # recorded: not tried in every process

    def full_disk(exact, out):
        raise OSError(28, "No space left on device")

    made = onnx_int8.folder_for(cache)
    assert made is not None
    shutil.rmtree(made)
    monkeypatch.setattr(onnx_int8, "_quantized", full_disk)
    emb = ModelEmbedder(DEFAULT_MODEL)
    assert np.array_equal(emb.embed_search(QUERIES[:1]), emb.embed(QUERIES[:1]))
    assert "No space left" in emb.runtime_info()["queries"]["why"]
    assert onnx_int8.state(cache)[0] == "missing"  # a passing trouble is not recorded: the next process tries


class Apart(HashEmbedder):
    """Queries for search come out other than anything else, and say so when asked for."""

    def __init__(self) -> None:
        super().__init__("hash-256")
        self.searched: list[str] = []

    def embed_search(self, texts: list[str]) -> np.ndarray:
        self.searched.extend(texts)
        return -self.embed_query(texts)

    def search_key(self) -> str:
        return "apart"


def test_only_a_search_uses_the_search_vectors(project):
    """Nothing stored comes from a query's copy of the model: writes, the side-weight estimate and a
    rebuild embed with ``embed``/``embed_query``; a query ranks by ``embed_search``."""
    write_config(project, side_weights="auto")
    emb = Apart()
    mem = Memory.open(project, embedder=emb)
    mem.index([rec(f"note {i} about kafka partitions and redis {i}", f"body {i} " * 5) for i in range(30)])
    assert mem.store.read_manifest()["side_weight"]["records"] == 30  # estimated: pseudo-queries were embedded
    mem.rebuild()
    assert emb.searched == []
    mem.query("kafka partitions")
    assert emb.searched == ["kafka partitions"]


def test_the_evaluation_cache_keeps_search_vectors_apart(tmp_path):
    emb = CachedEmbedder(Apart(), tmp_path)
    query, search = emb.embed_query(["kafka partitions"]), emb.embed_search(["kafka partitions"])
    assert np.abs(query).sum() > 0 and np.array_equal(search, -query)
    assert np.array_equal(emb.embed_search(["kafka partitions"]), search) and emb.hits == 1


def test_a_query_prefix_reaches_the_search_vectors():
    inner = Apart()
    wrapped = prefixed(inner, "query: ", "passage: ")
    wrapped.embed_search(["jwt"])
    assert inner.searched == ["query: jwt"]


def test_the_queries_setting_is_checked(project):
    write_config(project, queries="fp16")
    r = run_cli(["memory-stats", "--root", str(project)])
    assert r.code == 3 and r.error["code"] == "config-invalid-value" and r.error["details"]["key"] == "memory.queries"
    write_config(project, queries="exact")
    assert run_cli(["memory-stats", "--root", str(project)]).code == 0


def test_a_warm_process_takes_a_new_queries_setting(project):
    """memory-serve keeps its loaded model across config changes that do not touch the embedder, and
    makes it again when one does (``memory.queries`` among them)."""
    import time

    from nubos_memory.interfaces.warm import WarmMemory

    warm = WarmMemory(str(project))
    first = warm.get().embedder
    for key, value, kept in (("alpha", 0.4, True), ("queries", "exact", False), ("query_prefix", "q: ", False)):
        time.sleep(0.01)  # a new mtime for the config file
        write_config(project, **{key: value})
        now = warm.get().embedder
        assert (now is first) == kept, key
        first = now


@pytest.mark.model
def test_a_ready_copy_that_cannot_load_now_is_kept(cache, monkeypatch):
    """A passing failure to load a ready copy (memory, a file replaced meanwhile) leaves this process's
    queries exact and records nothing: the copy stays, and the next process uses it."""
    from nubos_memory.embed import onnx_runtime

    ModelEmbedder(DEFAULT_MODEL).embed_search(QUERIES[:1])
    assert onnx_int8.state(cache)[0] == "ready"
    real_load = onnx_runtime.OnnxRuntime.load

    def no_memory(self):
        if "int8" in str(self.onnx_path):
            raise RuntimeError("Failed to allocate memory")
        return real_load(self)

    monkeypatch.setattr(onnx_runtime.OnnxRuntime, "load", no_memory)
    emb = ModelEmbedder(DEFAULT_MODEL)
    assert np.array_equal(emb.embed_search(QUERIES[:1]), emb.embed(QUERIES[:1]))
    assert "could not be loaded" in emb.runtime_info()["queries"]["why"]
    assert onnx_int8.state(cache)[0] == "ready"
    monkeypatch.setattr(onnx_runtime.OnnxRuntime, "load", real_load)
    later = ModelEmbedder(DEFAULT_MODEL)
    later.embed_search(QUERIES[:1])
    assert later.runtime_info()["queries"]["runtime"] == "onnx-int8"


@pytest.mark.model
def test_a_refusal_never_replaces_a_ready_copy(cache):
    ModelEmbedder(DEFAULT_MODEL).embed_search(QUERIES[:1])
    onnx_int8.refuse(cache, "another process's quantizer failed")
    assert onnx_int8.state(cache)[0] == "ready"


@pytest.mark.model
def test_a_copy_from_another_onnxruntime_or_export_is_made_again(cache, monkeypatch):
    ModelEmbedder(DEFAULT_MODEL).embed_search(QUERIES[:1])
    monkeypatch.setattr(onnx_int8, "_onnxruntime", lambda: "0.0-upgraded")
    status, why, _ = onnx_int8.state(cache)
    assert status == "missing" and "another export or onnxruntime" in why
    emb = ModelEmbedder(DEFAULT_MODEL)
    emb.embed_search(QUERIES[:1])
    assert onnx_int8.state(cache)[0] == "ready" and emb.runtime_info()["queries"]["runtime"] == "onnx-int8"
    meta = json.loads((onnx_int8.folder_for(cache) / "export.json").read_text())
    assert meta["onnxruntime"] == "0.0-upgraded" and meta["export"] == onnx_int8._source(cache)["export"]
    onnx_int8.refuse(cache, "the quantizer failed")  # a refusal is bound the same way
    assert onnx_int8.state(cache)[0] == "ready"  # (a ready copy is never replaced)
    shutil.rmtree(onnx_int8.folder_for(cache))
    onnx_int8.refuse(cache, "the quantizer failed")
    assert onnx_int8.state(cache)[0] == "refused"
    monkeypatch.setattr(onnx_int8, "_onnxruntime", lambda: "0.0-next")
    assert onnx_int8.state(cache)[0] == "missing"  # an upgrade tries again


@pytest.mark.model
def test_the_evaluation_cache_never_mixes_int8_and_exact_search_vectors(cache, tmp_path):
    fast = CachedEmbedder(ModelEmbedder(DEFAULT_MODEL), tmp_path / "vectors")
    exact = CachedEmbedder(ModelEmbedder(DEFAULT_MODEL, queries="exact"), tmp_path / "vectors")
    assert fast.folder == exact.folder  # one fingerprint: the stored vectors are the same model's
    got = fast.embed_search(QUERIES[:2])
    assert not np.array_equal(exact.embed_search(QUERIES[:2]), got)
    assert np.array_equal(exact.embed_search(QUERIES[:2]), exact.embed_query(QUERIES[:2])) and exact.hits == 4


def test_the_user_memory_shares_the_embedder_only_when_it_is_made_alike():
    from types import SimpleNamespace

    from nubos_memory.api.usermemory import share_embedder
    from nubos_memory.config import MemoryConfig

    class Fake:
        def __init__(self, **settings):
            self.config = MemoryConfig(**settings)
            self.embedder = object()
            self.got = None

        def loaded_embedder(self):
            return self.got

        def use_embedder(self, embedder):
            self.got = embedder

    mem = Fake()
    for settings, shared in (({}, True), ({"queries": "exact"}, False), ({"embed_timeout_s": 9.0}, False)):
        user = Fake(**settings)
        share_embedder(SimpleNamespace(config=mem.config, embedder=mem.embedder), user)  # type: ignore[arg-type]
        assert (user.got is mem.embedder) == shared, settings


def test_threads_asking_at_once_load_the_query_copy_once(monkeypatch):
    """memory-serve's reader and writer share one embedder: the first query on each makes one copy."""
    import threading
    import time

    made = []

    def slow(self):
        made.append(1)
        time.sleep(0.2)
        return "test", None

    monkeypatch.setattr(ModelEmbedder, "_make_query_runtime", slow)
    emb = ModelEmbedder(DEFAULT_MODEL)
    threads = [threading.Thread(target=emb.query_runtime) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert made == [1] and emb._query_why == "test"


@pytest.mark.model
def test_a_process_that_waited_too_long_for_the_export_runs_torch_and_says_queries_are_exact(
        packaged, tmp_path, monkeypatch, capsys):  # noqa: F811
    """Another process holds the export's lock past ``LOCK_WAIT_S`` (stopped, not dead): this one runs the
    model on torch, embeds queries exactly, says so in ``memory-stats``' plan, and records nothing."""
    import subprocess
    import sys

    from nubos_memory.embed import onnx_export

    monkeypatch.setenv("NUBOS_MEMORY_CACHE", str(tmp_path / "cache"))  # no export here yet
    monkeypatch.setattr(onnx_export, "LOCK_WAIT_S", 0.3)
    base = onnx_export.root()
    base.mkdir(parents=True, mode=0o700)
    digest = packaged[1]
    holder = subprocess.Popen([sys.executable, "-c", "import time; from filelock import FileLock; "
                               f"lock = FileLock({str(base / f'.{digest}.lock')!r}); lock.acquire(); "
                               "print('held', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        emb = ModelEmbedder(DEFAULT_MODEL)
        stored = emb.embed(QUERIES[:1])  # (a write: the model loads, on torch)
        info = emb.runtime_info()  # (before any query: the plan says what the first one will do)
        assert info["runtime"] == "torch" and "still exporting the embedding model" in info["why"]
        assert info["queries"]["runtime"] == "exact" and "torch in this process" in info["queries"]["why"]
        assert np.array_equal(emb.embed_search(QUERIES[:1]), stored)
        assert emb.runtime_info()["queries"]["runtime"] == "exact"
        assert onnx_export.state(digest)[0] == "missing" and onnx_int8.state(digest)[0] == "missing"
        assert "waiting for it" in capsys.readouterr().err
    finally:
        holder.kill()
        holder.wait(timeout=30)
        if holder.stdout is not None:
            holder.stdout.close()

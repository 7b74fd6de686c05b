"""Embedding runtimes (issue 11, adr/0012): ONNX without torch, parity checked, torch as the fallback."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from nubos_memory.embed import onnx_export
from nubos_memory.embed.model import ModelEmbedder, embed_with
from nubos_memory.embed.modelfiles import digest, locate
from nubos_memory.embed.onnx_runtime import OnnxRuntime, Unsupported, describe_folder
from nubos_memory.limits import DEFAULT_MODEL

from .conftest import REPO, index_records, rec, run_cli, write_config


@pytest.fixture(scope="module")
def packaged():
    """The packaged model's folder, its digest, and its ONNX export in this user's cache (made if missing)."""
    folder = locate(DEFAULT_MODEL)
    model_digest = digest(folder)
    status, _, path = onnx_export.state(model_digest)
    if status != "ready":
        path = onnx_export.export(folder, model_digest, quiet=True)
    return folder, model_digest, path


def copy_export(packaged, cache):
    """The packaged model's export, copied into another (temporary) user cache."""
    _, model_digest, path = packaged
    target = cache / "onnx" / model_digest
    target.parent.mkdir(parents=True, mode=0o700)
    shutil.copytree(path.parent, target)
    return target


@pytest.mark.model
def test_onnx_vectors_equal_sentence_transformers_on_the_probes(packaged):
    folder, _, path = packaged
    from nubos_memory.embed.torch_runtime import TorchRuntime

    texts = [*onnx_export.PROBES, "one more: " + "word " * 600]
    onnx, torch = embed_with(OnnxRuntime(folder, path), texts), embed_with(TorchRuntime(str(folder)), texts)
    cos = np.einsum("ij,ij->i", onnx.astype(np.float64), torch.astype(np.float64))
    assert cos.min() >= 0.99999 and np.abs(onnx - torch).max() < 1e-5
    one = OnnxRuntime(folder, path)
    one.load()
    assert one.window == 254 and one.dim == 384
    assert one.token_starts(["how do I ship a build?"]) == TorchRuntime(str(folder)).token_starts(
        ["how do I ship a build?"])


@pytest.mark.model
def test_the_runtime_does_not_change_the_fingerprint(packaged):
    onnx = ModelEmbedder(DEFAULT_MODEL, runtime="onnx")
    torch = ModelEmbedder(DEFAULT_MODEL, runtime="torch")
    assert onnx.fingerprint == torch.fingerprint
    onnx.embed(["a query"])
    assert onnx.runtime_info()["runtime"] == "onnx" and "parity" in onnx.runtime_info()["why"]


@pytest.mark.model
def test_an_export_that_gives_other_vectors_is_refused_and_torch_is_used(packaged, tmp_path, monkeypatch):
    """Parity is checked, not assumed: an exported file whose weights were changed gives other
    vectors, so it is refused (and recorded as refused), and torch embeds instead."""
    folder, model_digest, good = packaged
    monkeypatch.setenv("NUBOS_MEMORY_CACHE", str(tmp_path / "cache"))

    def tampered_export(src, out):
        shutil.copy(good, out / "model.onnx")
        data = bytearray((good.parent / "model.onnx.data").read_bytes())
        weights = np.frombuffer(data, dtype=np.float32)  # the whole file is float32 tensors
        noisy = weights * np.float32(1.05)  # every weight 5% off: still a model, other vectors
        (out / "model.onnx.data").write_bytes(noisy.tobytes())
        return {"exporter": "test", "opset": 20}

    monkeypatch.setattr(onnx_export, "_export_files", tampered_export)
    with pytest.raises(Unsupported, match="other vectors"):
        onnx_export.export(folder, model_digest, quiet=True)
    status, why, _ = onnx_export.state(model_digest)
    assert status == "refused" and "other vectors" in why
    emb = ModelEmbedder(DEFAULT_MODEL)
    assert emb.plan()["runtime"] == "torch" and "other vectors" in emb.plan()["why"]
    assert emb.runtime().name == "torch" and "other vectors" in emb.runtime_info()["why"]


@pytest.mark.model
def test_a_cache_file_of_the_wrong_hash_is_refused(packaged, tmp_path, monkeypatch):
    _, model_digest, _ = packaged
    monkeypatch.setenv("NUBOS_MEMORY_CACHE", str(tmp_path / "cache"))
    copy = copy_export(packaged, tmp_path / "cache")
    assert onnx_export.state(model_digest)[0] == "ready"
    with open(copy / "model.onnx.data", "r+b") as f:  # same size, other bytes
        f.seek(1 << 20)
        f.write(b"\x00" * 64)
    status, why, path = onnx_export.state(model_digest)
    assert status == "damaged" and path is None and "sha256" in why
    meta = json.loads((copy / "export.json").read_text())
    meta["files"]["model.onnx.data"] = "0" * 64
    (copy / "export.json").write_text(json.dumps(meta))  # a record that vouches for it, with a bad signature
    assert onnx_export.state(model_digest)[:2] == ("damaged", "export.json is not signed by this user's key")
    calls = []

    def no_export(*args, **kwargs):
        calls.append(1)
        raise RuntimeError("no exporter here")

    monkeypatch.setattr(onnx_export, "export", no_export)
    emb = ModelEmbedder(DEFAULT_MODEL)
    assert emb.runtime().name == "torch" and calls == [1]  # exported again (here: failing), never loaded
    assert "export failed" in emb.runtime_info()["why"]


def test_models_onnx_cannot_express_fall_back_to_torch(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    for name in ("modules.json", "config.json", "sentence_bert_config.json", "tokenizer.json",
                 "tokenizer_config.json", "config_sentence_transformers.json"):
        shutil.copy(locate(DEFAULT_MODEL) / name, model / name)
    (model / "1_Pooling").mkdir()
    shutil.copy(locate(DEFAULT_MODEL) / "1_Pooling" / "config.json", model / "1_Pooling" / "config.json")
    assert describe_folder(model)["modes"] == ["mean"]
    modules = json.loads((model / "modules.json").read_text())
    dense = [*modules, {"idx": len(modules), "name": "3", "path": "3_Dense", "type": "sentence_transformers.models.Dense"}]
    (model / "modules.json").write_text(json.dumps(dense))
    with pytest.raises(Unsupported, match="Dense"):
        describe_folder(model)
    plan = ModelEmbedder(str(model)).plan()
    assert plan["runtime"] == "torch" and "Dense" in plan["why"]
    (model / "modules.json").write_text(json.dumps(modules))
    pooling = json.loads((model / "1_Pooling/config.json").read_text())
    (model / "1_Pooling/config.json").write_text(json.dumps({**pooling, "pooling_mode_mean_tokens": False,
                                                             "pooling_mode_lasttoken": True}))
    with pytest.raises(Unsupported, match="lasttoken"):
        describe_folder(model)
    assert ModelEmbedder(str(model), runtime="torch").plan()["why"] == "memory.runtime is torch"


PROBE = """
import io, json, sys, contextlib
from nubos_memory.interfaces import cli
out = io.StringIO()
with contextlib.redirect_stdout(out):
    codes = [cli.main(argv) for argv in json.loads(sys.argv[1])]
heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'sentence_transformers', 'transformers'))
print(json.dumps({"codes": codes, "heavy": heavy, "onnx": 'onnxruntime' in sys.modules}))
"""


@pytest.mark.model
def test_query_add_and_index_on_onnx_never_import_torch(packaged, tmp_path):
    root = tmp_path / "p"
    root.mkdir()
    assert run_cli(["memory-init", "--root", str(root)]).code == 0
    batch = tmp_path / "batch.jsonl"
    batch.write_text("\n".join(json.dumps(rec(f"note {i} on {w}", f"about {w}")) for i, w in
                               enumerate(["kafka", "redis", "pnpm"])))
    argvs = [["memory-index", "--root", str(root), "--records-file", str(batch)],
             ["memory-add", "--root", str(root), "--type", "learning", "--title", "jose for jwt", "--body", "EdDSA"],
             ["memory-query", "--root", str(root), "why does the cache miss?"]]
    proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argvs)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO), "NUBOS_MEMORY_NO_SERVER": "1"}, timeout=120)
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    assert doc == {"codes": [0, 0, 0], "heavy": [], "onnx": True}, proc.stderr


def test_runtime_and_device_settings_are_checked(project):
    for key, value in (("runtime", "gpu"), ("device", "tpu"), ("runtime", 3)):
        write_config(project, runtime="auto", device="auto")
        write_config(project, **{key: value})
        r = run_cli(["memory-stats", "--root", str(project)])
        assert r.code == 3 and r.error["code"] == "config-invalid-value" and r.error["details"]["key"] == f"memory.{key}"
    write_config(project, runtime="torch", device="cpu")
    assert run_cli(["memory-stats", "--root", str(project)]).code == 0


def test_a_query_spends_at_most_its_budget_catching_up(project, monkeypatch):
    """Records another process wrote without vectors: a query embeds for about a second at most,
    ranks the rest lexically and says so; the next queries (or memory-serve) catch up."""
    from nubos_memory import Memory
    from nubos_memory.embed import HashEmbedder
    from nubos_memory.search import query as query_module

    class Slow(HashEmbedder):
        def embed(self, texts):
            time.sleep(0.02 * len(texts))  # 32 texts: 0.64 s
            return super().embed(texts)

    index_records(project, [rec("first note", id="first")])
    log = project / ".nubos-pilot/memory/records.jsonl"
    with log.open("a") as f:  # written by "another process" that could not embed
        for i in range(200):
            f.write(json.dumps({"id": f"late{i}", "type": "learning", "phase": None, "title": f"late note {i}",
                                "body": "", "tags": [], "provenance": None, "created_at": None}) + "\n")
    monkeypatch.setattr(query_module, "QUERY_EMBED_BUDGET_S", 0.5)
    mem = Memory.open(project, embedder=Slow("hash-256"))
    started = time.monotonic()
    r = mem.query("late note")
    took = time.monotonic() - started
    assert took < 3.0  # 200 records would take 4 s
    behind = next(w for w in r["warnings"] if w["code"] == "index-behind")
    assert 0 < r["counts"]["pending"] < 200 and behind
    assert len(r["hits"]) == 8  # the rest still answer, lexically
    for _ in range(10):
        mem.query("late note")
    assert mem.query("late note")["counts"]["pending"] == 0


def test_memory_serve_catches_up_in_the_background(project):
    from nubos_memory.interfaces.warm import WarmMemory

    index_records(project, [rec("first note", id="first")])
    with (project / ".nubos-pilot/memory/records.jsonl").open("a") as f:
        for i in range(40):
            f.write(json.dumps({"id": f"late{i}", "type": "learning", "title": f"late note {i}"}) + "\n")
    warm = WarmMemory(str(project))
    while warm.catch_up(budget_s=0.2) > 0:
        pass
    assert run_cli(["memory-stats", "--root", str(project)]).json["consistency"]["pending"] == 0

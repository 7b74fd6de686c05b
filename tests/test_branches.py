"""Branches (issue 23): records carry where in git they were written; hits say whether that work is
merged into the current line of work; ``--branch current`` keeps only what is; ``memory-doctor``.

Every test here runs the real ``git`` command line on a repository it makes in a temporary folder.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from nubos_memory.log import same_content

from .conftest import run_cli

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs the git command line")


@pytest.fixture(autouse=True)
def _git_identity(monkeypatch):
    for key, value in (("GIT_AUTHOR_NAME", "Test"), ("GIT_AUTHOR_EMAIL", "test@example.invalid"),
                       ("GIT_COMMITTER_NAME", "Test"), ("GIT_COMMITTER_EMAIL", "test@example.invalid"),
                       ("GIT_CONFIG_GLOBAL", "/dev/null"), ("GIT_CONFIG_NOSYSTEM", "1")):
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("NUBOS_MEMORY_NO_SERVER", "1")


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True, text=True).stdout.strip()


def commit(root: Path, name: str) -> str:
    (root / name).write_text(name + "\n")
    git(root, "add", name)
    git(root, "commit", "-q", "-m", name)
    return git(root, "rev-parse", "HEAD")


@pytest.fixture
def repo(project: Path) -> Path:
    """The test project made a git repository on ``main`` with one commit (the memory folder ignored:
    checking out another branch must not touch the memory)."""
    git(project, "init", "-q", "-b", "main")
    (project / ".gitignore").write_text(".nubos-pilot/\n")
    git(project, "add", ".gitignore")
    git(project, "commit", "-q", "-m", "start")
    return project


def add(root: Path, title: str, body: str = "details") -> str:
    res = run_cli(["memory-add", "--root", str(root), "--type", "learning", "--title", title, "--body", body])
    assert res.code == 0, res.err
    return res.json["id"]


def records(root: Path) -> dict[str, dict]:
    lines = (root / ".nubos-pilot" / "memory" / "records.jsonl").read_text().splitlines()
    return {r["id"]: r for r in map(json.loads, lines) if "id" in r and "type" in r}


def query(root: Path, text: str, *extra: str) -> dict:
    res = run_cli(["memory-query", "--root", str(root), text, "--mode", "lexical", *extra])
    assert res.code == 0, res.err
    return res.json


# -- 1. stamps ----------------------------------------------------------------------------------
def test_a_write_inside_git_is_stamped_with_branch_commit_and_worktree(repo):
    head = git(repo, "rev-parse", "HEAD")
    rid = add(repo, "pin pnpm with corepack")
    assert records(repo)[rid]["git"] == {"branch": "main", "commit": head, "worktree": "."}


def test_a_write_outside_git_has_no_stamp(project):
    rid = add(project, "pin pnpm with corepack")
    assert "git" not in records(project)[rid]


def test_a_detached_head_stamps_no_branch(repo):
    first = git(repo, "rev-parse", "HEAD")
    commit(repo, "two")
    git(repo, "checkout", "-q", "--detach", first)
    rid = add(repo, "written on a detached head")
    assert records(repo)[rid]["git"] == {"branch": None, "commit": first, "worktree": "."}


def test_a_linked_worktree_is_named_relative_to_the_main_one(repo, tmp_path):
    other = tmp_path / "proj-feature"
    git(repo, "worktree", "add", "-q", "-b", "feature", str(other))
    shutil.copytree(repo / ".nubos-pilot", other / ".nubos-pilot")
    rid = add(other, "written in a linked worktree")
    stamp = records(other)[rid]["git"]
    assert stamp["branch"] == "feature" and stamp["worktree"] == "../proj-feature"


def test_a_record_that_brings_its_own_stamp_keeps_it(repo, tmp_path):
    theirs = {"branch": "elsewhere", "commit": "0" * 40, "worktree": "."}
    batch = tmp_path / "batch.jsonl"
    batch.write_text(json.dumps({"id": "r1", "type": "learning", "title": "brought", "body": "b", "git": theirs}))
    res = run_cli(["memory-index", "--root", str(repo), "--records-file", str(batch)])
    assert res.code == 0, res.err
    assert records(repo)["r1"]["git"] == theirs


def test_an_import_keeps_what_the_file_says(repo, tmp_path):
    log = tmp_path / "other.jsonl"
    log.write_text(json.dumps({"id": "plain", "type": "learning", "phase": None, "title": "no stamp here",
                               "body": "b", "tags": [], "provenance": None,
                               "created_at": "2026-01-01T00:00:00Z"}) + "\n")
    res = run_cli(["memory-import", "--root", str(repo), str(log)])
    assert res.code == 0, res.err
    assert "git" not in records(repo)["plain"]


def test_the_stamp_changes_neither_duplicates_nor_content(repo):
    first = add(repo, "one fact", "said once")
    commit(repo, "later")
    again = run_cli(["memory-add", "--root", str(repo), "--type", "learning", "--title", "one fact",
                     "--body", "said once"])
    assert again.json["duplicate_of"] == first and again.json["added"] == 0
    a = records(repo)[first]
    b = {**a, "git": {**a["git"], "commit": git(repo, "rev-parse", "HEAD")}, "created_at": "2027-01-01T00:00:00Z"}
    assert same_content(a, b)


# -- 2. merged, --branch current ----------------------------------------------------------------
def by_title(answer: dict) -> dict[str, dict]:
    return {h["record"]["title"]: h for h in answer["hits"]}


def test_hits_say_whether_their_commit_is_merged_and_branch_current_keeps_only_those(repo):
    add(repo, "retry budget on main")
    git(repo, "checkout", "-q", "-b", "feature")
    commit(repo, "feature-work")
    add(repo, "retry budget on feature")
    git(repo, "checkout", "-q", "main")
    hits = by_title(query(repo, "retry budget"))
    assert hits["retry budget on main"]["merged"] is True
    assert hits["retry budget on feature"]["merged"] is False
    current = query(repo, "retry budget", "--branch", "current")
    assert set(by_title(current)) == {"retry budget on main"}
    assert current["query"]["filters"]["branch"] == "current"
    git(repo, "merge", "-q", "--no-ff", "-m", "merge feature", "feature")
    hits = by_title(query(repo, "retry budget", "--branch", "current"))
    assert set(hits) == {"retry budget on main", "retry budget on feature"}
    assert all(h["merged"] for h in hits.values())


def test_branch_current_keeps_records_written_outside_git_and_filters_before_top_k(project):
    add(project, "retry budget before git")
    git(project, "init", "-q", "-b", "main")
    (project / ".gitignore").write_text(".nubos-pilot/\n")
    git(project, "add", ".gitignore")
    git(project, "commit", "-q", "-m", "start")
    git(project, "checkout", "-q", "-b", "feature")
    commit(project, "f")
    for i in range(5):
        add(project, f"retry budget retry budget unmerged note {i}")
    git(project, "checkout", "-q", "main")
    add(project, "retry budget on main")
    plain = query(project, "retry budget", "--k", "2")["hits"]
    assert any(h.get("merged") is False for h in plain)  # filtering after top-k would leave fewer than k
    hits = by_title(query(project, "retry budget", "--k", "2", "--branch", "current"))
    assert set(hits) == {"retry budget before git", "retry budget on main"}  # k hits, not fewer
    assert "merged" not in hits["retry budget before git"] and hits["retry budget on main"]["merged"] is True


def test_a_detached_head_answers_merged_by_reachability(repo):
    add(repo, "retry budget at start")
    second = commit(repo, "two")
    add(repo, "retry budget at two")
    git(repo, "checkout", "-q", "--detach", "HEAD~1")
    hits = by_title(query(repo, "retry budget"))
    assert hits["retry budget at start"]["merged"] is True and hits["retry budget at two"]["merged"] is False
    git(repo, "checkout", "-q", "--detach", second)
    assert all(h["merged"] for h in query(repo, "retry budget", "--branch", "current")["hits"])


def test_a_commit_this_repository_does_not_hold_is_not_merged(repo, tmp_path):
    batch = tmp_path / "batch.jsonl"
    batch.write_text(json.dumps({"id": "far", "type": "learning", "title": "retry budget from elsewhere", "body": "b",
                                 "git": {"branch": "x", "commit": "f" * 40, "worktree": "."}}))
    assert run_cli(["memory-index", "--root", str(repo), "--records-file", str(batch)]).code == 0
    assert query(repo, "retry budget")["hits"][0]["merged"] is False
    assert query(repo, "retry budget", "--branch", "current")["hits"] == []


def test_outside_git_no_hit_says_merged(project):
    add(project, "retry budget")
    hits = query(project, "retry budget", "--branch", "current")["hits"]
    assert len(hits) == 1 and "merged" not in hits[0]


def test_an_unknown_branch_value_is_refused(repo):
    from nubos_memory import Memory
    from nubos_memory.errors import InputError

    res = run_cli(["memory-query", "--root", str(repo), "x", "--branch", "feature"])
    assert res.code == 2  # argparse: not a choice
    with pytest.raises(InputError) as exc:
        Memory.open(repo).query("x", branch="feature")
    assert exc.value.code == "query-invalid-branch"


# -- 3. memory-doctor ---------------------------------------------------------------------------
def doctor(root: Path, *extra: str):
    res = run_cli(["memory-doctor", "--root", str(root), *extra])
    assert res.code == 0, res.err
    return res


def test_doctor_reports_where_git_index_runtime_and_anchors_as_text_and_json(repo):
    (repo / "retry.py").write_text("def retry():\n    return 3\n")
    git(repo, "add", "retry.py")
    git(repo, "commit", "-q", "-m", "retry")
    for title in ("kept", "drifts"):
        res = run_cli(["memory-add", "--root", str(repo), "--type", "learning", "--title", f"retry {title}",
                       "--body", "b", "--anchor", "retry.py:1-2" if title == "kept" else "retry.py:2"])
        assert res.code == 0, res.err
    (repo / "retry.py").write_text("def retry():\n    return 5\n")
    report = doctor(repo, "--format", "json").json
    head = git(repo, "rev-parse", "HEAD")
    assert report["root"] == str(repo.resolve()) and report["found_by"] == "flag"
    assert report["memory_dir"] == str(repo.resolve() / ".nubos-pilot" / "memory") and report["backend"] == "files"
    assert report["git"] == {"branch": "main", "commit": head, "worktree": "."}
    assert report["index"]["current"] is True and report["index"]["records"] == 2
    assert report["runtime"] == {"runtime": "hash"}
    assert report["anchors"]["anchored"] == 2 and report["anchors"]["drifted"] == 2
    assert report["anchors"]["fix"] == "np-tools memory-verify"
    assert report["problems"] == [] and report["healthy"] is True
    text = doctor(repo).out
    assert "found by    --root" in text and f"git           main at {head[:12]}" in text
    assert "index         current: 2 of 2 record(s) indexed" in text
    assert "2 anchored record(s): 0 verified, 0 moved, 2 drifted, 0 missing" in text
    assert "no problems found" in text
    assert not text.lstrip().startswith("{")


def test_doctor_names_each_problem_with_the_command_that_fixes_it(repo):
    add(repo, "retry budget")
    log = repo / ".nubos-pilot" / "memory" / "records.jsonl"
    by_hand = {"id": "by-hand", "type": "learning", "phase": None, "title": "written by hand", "body": "",
               "tags": [], "provenance": None, "created_at": "2026-01-01T00:00:00Z"}
    with log.open("a") as f:
        f.write("{not json\n" + json.dumps(by_hand) + "\n")
    report = doctor(repo, "--format", "json").json
    fixes = {p["code"]: p["fix"] for p in report["problems"]}
    assert fixes == {"records-corrupt-line": "np-tools memory-compact", "index-behind": "np-tools memory-rebuild"}
    assert report["index"]["current"] is False and report["index"]["pending"] == 1 and report["healthy"] is False
    text = doctor(repo).out
    assert "problem       records-corrupt-line" in text and "  fix         np-tools memory-compact" in text
    assert "index         behind (1 pending, 0 stale)" in text and "  fix         np-tools memory-rebuild" in text


def test_doctor_outside_git_and_while_disabled(tmp_path, monkeypatch):
    root = tmp_path / "plain"
    root.mkdir()
    monkeypatch.setenv("NUBOS_PILOT_ROOT", str(root))
    res = run_cli(["memory-doctor", "--format", "json"])
    assert res.code == 0, res.err
    report = res.json
    assert report["found_by"] == "env" and report["git"] is None and report["enabled"] is False
    assert report["problems"][0]["fix"] == "np-tools memory-init"
    text = run_cli(["memory-doctor"]).out
    assert "not a git repository" in text and "$NUBOS_PILOT_ROOT" in text


def test_doctor_never_loads_the_model(tmp_path):
    from .test_light_verbs import _probe

    root = tmp_path / "p"
    root.mkdir()
    res = _probe([["memory-init", "--root", str(root)], ["memory-doctor", "--root", str(root)],
                  ["memory-doctor", "--root", str(root), "--format", "json"]])
    assert res["codes"] == [0, 0, 0] and res["heavy"] == []

"""Anchors (issue 23): a record that cites code says on every read whether that code is still there.

A real git repository per test; the project root is the repository.  Statuses: verified, moved (in
the same file, or in the file git says it was renamed to), drifted (file there, text gone), missing.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from .conftest import index_records, query, run_cli

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "init.defaultBranch=main"]
RETRY = "import time\n\n\ndef retry_policy():\n    attempts = 3\n    return attempts\n\n\ndef other():\n    pass\n"


def git(root: Path, *args: str) -> str:
    return subprocess.run([*GIT, "-C", str(root), *args], check=True, capture_output=True, text=True).stdout


@pytest.fixture
def repo(project: Path) -> Path:
    (project / "src").mkdir()
    (project / "src" / "retry.py").write_text(RETRY)
    git(project, "init", "-q")
    git(project, "add", "src")
    git(project, "commit", "-qm", "retry")
    return project


def add(root: Path, title: str, *anchors: str) -> dict:
    argv = ["memory-add", "--root", str(root), "--type", "learning", "--title", title, "--body", "b"]
    for a in anchors:
        argv += ["--anchor", a]
    out = run_cli(argv)
    assert out.code == 0, out.err
    return out.json


def top(root: Path, *extra: str) -> dict:
    out = query(root, "retry policy attempts", "--mode", "lexical", *extra)
    assert out.code == 0, out.err
    return out.json["hits"][0]


def stored(root: Path) -> list[dict]:
    lines = (root / ".nubos-pilot" / "memory" / "records.jsonl").read_text().splitlines()
    return [json.loads(x) for x in lines if '"op"' not in x]


def test_an_anchor_is_stamped_on_write_with_what_it_cites_and_the_commit(repo):
    add(repo, "retry_policy caps at 3 attempts", "src/retry.py:4-6")
    (anchor,) = stored(repo)[0]["anchors"]
    assert anchor["path"] == "src/retry.py" and anchor["lines"] == [4, 6]
    assert len(anchor["sha"]) == 32 and anchor["commit"] == git(repo, "rev-parse", "HEAD").strip()
    hit = top(repo)
    assert hit["freshness"] == "verified"
    assert hit["anchors"] == [{"path": "src/retry.py", "lines": [4, 6], "status": "verified"}]


def test_reindenting_is_not_a_change_but_a_shift_is_a_move(repo):
    add(repo, "retry_policy caps at 3 attempts", "src/retry.py:4-6")
    path = repo / "src" / "retry.py"
    path.write_text(RETRY.replace("    attempts = 3", "        attempts  =  3"))  # whitespace only
    assert top(repo)["freshness"] == "verified"
    path.write_text("# header\n# more\n" + RETRY)
    hit = top(repo)
    assert hit["freshness"] == "moved"
    assert hit["anchors"][0]["now"] == {"path": "src/retry.py", "lines": [6, 8]}


def test_drifted_and_missing_hits_stay_visible_down_weighted_and_said_in_words(repo):
    add(repo, "retry_policy caps at 3 attempts", "src/retry.py:4-6")
    add(repo, "retry policy attempts are logged", "src/retry.py:9-10")  # a second hit, verified
    before = {h["record"]["title"]: h["score"] for h in query(repo, "retry policy attempts", "--mode",
                                                               "lexical").json["hits"]}
    (repo / "src" / "retry.py").write_text(RETRY.replace("attempts = 3", "attempts = 5"))
    answer = query(repo, "retry policy attempts", "--mode", "lexical", "--explain").json
    drifted = next(h for h in answer["hits"] if h["record"]["title"].startswith("retry_policy caps"))
    assert drifted["freshness"] == "drifted"
    assert drifted["score"] == pytest.approx(before["retry_policy caps at 3 attempts"] * 0.5, abs=1e-6)
    assert drifted["explain"]["freshness_factor"] == 0.5
    assert [h["score"] for h in answer["hits"]] == sorted((h["score"] for h in answer["hits"]), reverse=True)
    md = query(repo, "retry policy attempts", "--mode", "lexical", "--format", "md").out
    assert "cites src/retry.py:4-6, which changed since this was written" in md
    (repo / "src" / "retry.py").unlink()
    hit = next(h for h in query(repo, "retry policy attempts", "--mode", "lexical").json["hits"]
               if h["record"]["title"].startswith("retry_policy caps"))
    assert hit["freshness"] == "missing"


def test_the_factor_is_configurable(repo):
    from .conftest import write_config

    write_config(repo, stale_factor=1.0)
    add(repo, "retry_policy caps at 3 attempts", "src/retry.py:4-6")
    score = top(repo)["score"]
    (repo / "src" / "retry.py").write_text("nothing here\n")
    assert top(repo)["freshness"] == "drifted" and top(repo)["score"] == score


def test_a_file_git_renamed_is_followed(repo):
    add(repo, "retry_policy caps at 3 attempts", "src/retry.py:4-6")
    git(repo, "mv", "src/retry.py", "src/policy.py")
    git(repo, "commit", "-qm", "rename")
    hit = top(repo)
    assert hit["freshness"] == "moved" and hit["anchors"][0]["now"] == {"path": "src/policy.py", "lines": [4, 6]}


def test_unanchored_hits_say_so(project):
    assert index_records(project, [{"type": "learning", "title": "retry policy attempts", "body": "x"}]).code == 0
    hit = top(project)
    assert hit["freshness"] == "unanchored" and "anchors" not in hit


@pytest.mark.parametrize("anchor, why", [("../outside.py", "inside"), ("/etc/passwd", "inside"),
                                         ("src/nothere.py", "readable"), ("src/retry.py:5-99", "past the end")])
def test_anchors_outside_the_project_or_past_a_file_are_refused(repo, anchor, why, tmp_path):
    (tmp_path / "outside.py").write_text("secret\n")
    argv = ["memory-add", "--root", str(repo), "--type", "learning", "--title", "t", "--body", "b", "--anchor", anchor]
    out = run_cli(argv)
    assert out.code == 5 and out.error["code"] == "record-invalid-anchors" and why in out.error["message"]
    assert "secret" not in out.err


def test_a_symlink_out_of_the_project_is_not_followed(repo, tmp_path):
    (tmp_path / "outside.py").write_text("secret\n")
    (repo / "src" / "link.py").symlink_to(tmp_path / "outside.py")
    out = run_cli(["memory-add", "--root", str(repo), "--type", "learning", "--title", "t", "--anchor", "src/link.py"])
    assert out.code == 5 and out.error["code"] == "record-invalid-anchors"


def test_verify_counts_lists_and_update_records_the_move_in_the_log(repo):
    add(repo, "retry_policy caps at 3 attempts", "src/retry.py:4-6")
    (repo / "lib").mkdir()
    (repo / "lib" / "gone.py").write_text("x = 1\n")
    gone = add(repo, "retry notes on a file that goes", "lib/gone.py")["id"]
    (repo / "lib" / "gone.py").unlink()
    (repo / "src" / "retry.py").write_text("# moved down\n" + RETRY)
    report = run_cli(["memory-verify", "--root", str(repo)]).json
    assert report["anchored"] == 2 and report["freshness"] == {"verified": 0, "moved": 1, "drifted": 0, "missing": 1}
    assert [s["id"] for s in report["stale"]] == [gone] and report["updated"] == []
    git(repo, "commit", "-qam", "moved down")  # (a move is recorded into committed code only)
    log_before = (repo / ".nubos-pilot" / "memory" / "records.jsonl").read_bytes()
    updated = run_cli(["memory-verify", "--root", str(repo), "--update"]).json
    assert len(updated["updated"]) == 1
    log_after = (repo / ".nubos-pilot" / "memory" / "records.jsonl").read_bytes()
    assert log_after.startswith(log_before) and b'"op":"anchor"' in log_after[len(log_before):]  # appended only
    assert run_cli(["memory-verify", "--root", str(repo)]).json["freshness"]["verified"] == 1
    assert top(repo)["freshness"] == "verified"
    rebuilt = run_cli(["memory-rebuild", "--root", str(repo)])
    assert rebuilt.code == 0 and top(repo)["freshness"] == "verified"  # the log says it: rebuilds agree


def test_prune_anchors_missing_retires_only_records_whose_every_anchor_is_gone(repo):
    (repo / "lib").mkdir()
    for name in ("a.py", "b.py"):
        (repo / "lib" / name).write_text(f"{name}\n")
    both = add(repo, "retry on a and b", "lib/a.py", "lib/b.py")["id"]
    one = add(repo, "retry on a", "lib/a.py")["id"]
    (repo / "lib" / "a.py").unlink()
    dry = run_cli(["memory-prune", "--root", str(repo), "--anchors-missing", "--dry-run"]).json
    assert dry["retired"] == [one] and dry["dry_run"]
    done = run_cli(["memory-prune", "--root", str(repo), "--anchors-missing"]).json
    assert done["retired"] == [one]
    got = run_cli(["memory-get", "--root", str(repo), one, both]).json["records"]
    assert got[0]["retired"]["reason"] == "anchors-missing" and got[1]["live"]
    neither = run_cli(["memory-prune", "--root", str(repo)])
    assert neither.code == 2 and "--anchors-missing" in neither.error["message"]


def test_anchors_come_in_through_index_and_mcp_declarations(repo):
    assert index_records(repo, [{"type": "learning", "title": "retry policy attempts", "body": "x",
                                 "anchors": ["src/retry.py:4-6"]}]).code == 0
    assert stored(repo)[0]["anchors"][0]["sha"]
    from nubos_memory.params import ADD

    (anchors,) = [p for p in ADD if p.name == "anchors"]
    assert anchors.flag == "--anchor" and anchors.describe  # the tool argument is generated from it


def test_ingest_anchors_each_chunk_to_its_file_and_section(project):
    guide = project / "guide.md"
    guide.write_text("---\ncategory: ci\n---\n# Guide\n\nintro text\n\n## Build retry\n\nrun make\nthen test\n\n"
                     "## Deploy\n\nship it\n")
    assert run_cli(["memory-ingest", "--root", str(project), "guide.md"]).code == 0
    spans = {r["heading"]: r["anchors"][0]["lines"] for r in stored(project)}
    assert spans == {"Guide": [6, 6], "Build retry": [8, 11], "Deploy": [13, 15]}
    guide.write_text(guide.read_text().replace("then test", "then test twice"))
    hit = query(project, "build retry make", "--mode", "lexical").json["hits"][0]
    assert hit["record"]["heading"] == "Build retry" and hit["freshness"] == "drifted"  # until re-ingested


@pytest.mark.parametrize("old, new, kind", [("CI uses Node 18 for the build", "CI uses Node 20 for the build", "number"),
                                            ("pin pnpm v9.1.1 in CI builds", "pin pnpm v9.1.2 in CI builds", "version"),
                                            ("run the migrations on friday", "never run the migrations on friday",
                                             "negation")])
def test_a_collapsed_older_statement_that_disagrees_is_named_and_said(project, old, new, kind):
    from .conftest import write_config

    write_config(project, near_duplicate=0.5)  # the hash embedder's cosines are lower than the model's
    for title, at in ((old, "2026-01-01T00:00:00Z"), (new, "2026-06-01T00:00:00Z")):
        assert run_cli(["memory-add", "--root", str(project), "--type", "learning", "--title", title,
                        "--created-at", at]).code == 0
    hit = query(project, new).json["hits"][0]
    assert hit["record"]["title"] == new and hit["collapsed"]["count"] == 1
    assert [(c["kind"], c["said"]) for c in hit["conflicts"]] == [(kind, old)]
    assert f"supersedes an older note that said “{old}”" in query(project, new, "--format", "md").out


def test_a_repeat_in_other_words_is_no_conflict():
    from nubos_memory.search.dedup import contradiction

    assert contradiction({"title": "Use corepack to pin pnpm", "body": ""},
                         {"title": "use Corepack to pin pnpm!", "body": ""}) is None


def test_a_redaction_leaves_no_text_in_the_contradiction_cache(project):
    """Contradiction marks are cached by text in a warm process (issue 27); a log read again from its
    start — a redaction — drops them, so the process holds no redacted text there."""
    from nubos_memory import Memory
    from nubos_memory.search import dedup

    from .conftest import write_config

    write_config(project, near_duplicate=0.5)
    mem = Memory.open(project)
    old = mem.add({"type": "learning", "title": "the deploy token is hunter2 for CI 18", "created_at": "2026-01-01T00:00:00Z"})
    mem.add({"type": "learning", "title": "the deploy token is hunter2 for CI 20", "created_at": "2026-06-01T00:00:00Z"})
    hit = mem.query("deploy token for CI 20", k=3)["hits"][0]
    assert hit["conflicts"] and len(dedup.KEPT) >= 2
    mem.redact([old["id"]])
    mem.scan()  # (the log read again: its text is gone from it)
    assert len(dedup.KEPT) == 0 and dedup._contradiction.cache_info().currsize == 0


def prune_missing(root: Path) -> dict:
    out = run_cli(["memory-prune", "--root", str(root), "--anchors-missing"])
    assert out.code == 0, out.err
    return out.json


def test_a_cited_file_too_large_to_check_reads_as_drifted_and_is_never_pruned(repo, monkeypatch):
    from nubos_memory.api import anchors

    monkeypatch.setattr(anchors, "MAX_ANCHOR_FILE", 4096)  # (8 MiB in use: a file that grew past it)
    rid = add(repo, "retry_policy caps at 3 attempts", "src/retry.py:4-6")["id"]
    with (repo / "src" / "retry.py").open("a") as f:
        f.write("# padding\n" * 1000)
    hit = top(repo)
    assert hit["freshness"] == "drifted", hit  # the file is there: never "missing"
    assert prune_missing(repo)["retired"] == [] and run_cli(["memory-get", "--root", str(repo), rid]).json[
        "records"][0]["live"]


@pytest.mark.parametrize("old, new", [("src/retry.py", "src/policy.py"), ("src/retry.py", "src/réessai.py")])
def test_a_rename_is_followed_from_a_project_in_a_subfolder_and_for_any_file_name(tmp_path, old, new):
    top_dir = tmp_path / "mono"
    root = top_dir / "svc"
    (root / "src").mkdir(parents=True)
    code, _, err = run_cli(["memory-init", "--root", str(root)])
    assert code == 0, err
    from .conftest import write_config

    write_config(root, provider="hash", model="hash-256")
    (root / old).write_text(RETRY)
    git(top_dir, "init", "-q")
    git(top_dir, "add", "-A")
    git(top_dir, "commit", "-qm", "retry")
    add(root, "retry_policy caps at 3 attempts", f"./{old}:4-6")  # (as typed: the stored path is src/…)
    git(root, "mv", old, new)
    git(top_dir, "commit", "-qm", "rename")
    hit = top(root)
    assert hit["anchors"][0]["path"] == old and hit["freshness"] == "moved", hit
    assert hit["anchors"][0]["now"] == {"path": new, "lines": [4, 6]}


def test_lines_are_counted_as_git_counts_them(repo):
    (repo / "src" / "feed.py").write_text("import os\n\x0c\ndef alpha():\n    return 1\n\x0b\ndef beta():\n    return 2\n")
    git(repo, "add", "src/feed.py")
    assert git(repo, "grep", "-n", "return 2").startswith("src/feed.py:7:")
    add(repo, "retry policy attempts: beta returns 2", "src/feed.py:7")
    (repo / "src" / "feed.py").write_text("import os\n\x0c\ndef alpha():\n    return 1\n\x0b\ndef beta():\n    return 3\n")
    assert top(repo)["freshness"] == "drifted"  # line 7 changed (a form feed is not a line break)


def test_many_missing_anchors_ask_git_for_renames_once(repo, monkeypatch):
    from nubos_memory.api import anchors

    (repo / "lib").mkdir()
    for i in range(30):
        (repo / "lib" / f"m{i}.py").write_text(f"x = {i}\n")
    git(repo, "add", "lib")
    git(repo, "commit", "-qm", "lib")
    assert index_records(repo, [{"type": "learning", "title": f"note {i}", "body": "b", "anchors": [
        {"path": f"lib/m{i}.py"}]} for i in range(30)]).code == 0
    git(repo, "rm", "-q", "-r", "lib")
    git(repo, "commit", "-qm", "gone")
    asked = []
    real = anchors.run_git
    monkeypatch.setattr(anchors, "run_git", lambda *a, **k: asked.append(a) or real(*a, **k))
    report = run_cli(["memory-verify", "--root", str(repo)]).json
    assert report["freshness"]["missing"] == 30 and len([a for a in asked if "diff" in a]) == 1


def test_a_warm_process_follows_a_rename_staged_after_it_first_looked(repo):
    import time

    from nubos_memory import Memory

    add(repo, "retry_policy caps at 3 attempts", "src/retry.py:4-6")
    mem = Memory.open(repo)
    (repo / "src" / "retry.py").rename(repo / "src" / "policy.py")
    first = mem.query("retry policy attempts", mode="lexical")["hits"][0]
    assert first["freshness"] == "missing"  # (git knows no rename yet: the new file is not in its index)
    git(repo, "add", "-A")
    time.sleep(0.01)
    hit = mem.query("retry policy attempts", mode="lexical")["hits"][0]
    assert hit["freshness"] == "moved" and hit["anchors"][0]["now"] == {"path": "src/policy.py", "lines": [4, 6]}


def test_update_records_a_move_only_into_committed_code_and_never_twice(repo):
    rid = add(repo, "retry_policy caps at 3 attempts", "src/retry.py:4-6")["id"]
    git(repo, "mv", "src/retry.py", "src/policy.py")  # staged, not committed: it may be abandoned
    report = run_cli(["memory-verify", "--root", str(repo), "--update"]).json
    assert report["updated"] == [] and report["uncommitted"] == [rid], report
    git(repo, "commit", "-qm", "rename")
    assert run_cli(["memory-verify", "--root", str(repo), "--update"]).json["updated"] == [rid]


def test_two_updates_at_once_record_each_move_once(repo):
    from nubos_memory import Memory

    rid = add(repo, "retry_policy caps at 3 attempts", "src/retry.py:4-6")["id"]
    (repo / "src" / "retry.py").write_text("# moved down\n" + RETRY)
    git(repo, "commit", "-qam", "moved down")
    slow, fast = Memory.open(repo), Memory.open(repo)
    real = slow.scan

    def late_scan():  # (the slow one checked before the fast one wrote, and writes after it)
        got = real()
        if not late_scan.done:
            late_scan.done = True
            assert fast.verify(update=True)["updated"] == [rid]
        return got
    late_scan.done = False
    slow.scan = late_scan
    assert slow.verify(update=True)["updated"] == []
    log = (repo / ".nubos-pilot" / "memory" / "records.jsonl").read_text()
    assert log.count('"op":"anchor"') == 1


def test_writing_a_copy_of_a_retired_record_is_said_and_every_other_record_keeps_its_own_vector(repo):
    assert index_records(repo, [{"type": "learning", "title": "deploy on green", "body": "b", "id": "x"}]).code == 0
    old = run_cli(["memory-get", "--root", str(repo), "x"]).json["records"][0]["record"]
    assert run_cli(["memory-forget", "--root", str(repo), "x"]).code == 0
    again = {k: v for k, v in old.items() if k not in ("git",)}  # as memory-get gave it: its old created_at
    out = index_records(repo, [again, {"type": "learning", "title": "unrelated zebra note", "body": "b", "id": "y"}])
    assert out.code == 0 and out.json["ids"] == ["y"] and out.json["skipped_ids"] == ["x"], out.json
    assert next(w for w in out.json["warnings"] if w["code"] == "record-retired-copy")["ids"] == ["x"]
    hits = query(repo, "unrelated zebra note", "--mode", "vector").json["hits"]
    assert hits[0]["id"] == "y" and hits[0]["score"] > 0.5, hits


def test_a_copy_of_a_retired_record_in_a_batch_never_makes_another_record_its_duplicate(repo):
    assert index_records(repo, [{"type": "learning", "title": "deploy on green", "body": "b", "id": "x"}]).code == 0
    old = run_cli(["memory-get", "--root", str(repo), "x"]).json["records"][0]["record"]
    assert run_cli(["memory-forget", "--root", str(repo), "x"]).code == 0
    again = {k: v for k, v in old.items() if k != "git"}
    out = index_records(repo, [again, {"type": "learning", "title": "deploy on green", "body": "b", "id": "z"}])
    assert out.json["ids"] == ["z"] and out.json["duplicates"] == [] and out.json["embedded"] <= 1, out.json
    assert [h["id"] for h in query(repo, "deploy on green").json["hits"]] == ["z"]

"""Git worktrees share one memory at read time (``memory.worktrees``; ``store/worktrees.py``).

Real git: a repository with a committed memory config, two more worktrees made with ``git worktree
add``; each worktree writes its own ``records.jsonl``, every read sees the others'.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path

import pytest

from nubos_memory import codes
from nubos_memory.config import load_project
from nubos_memory.log import forget_op
from nubos_memory.store import open_store, scope
from nubos_memory.store.worktrees import WorktreeStore

from . import test_store_contract as contract
from .conftest import index_records, memory_dir, query, rec, run_cli, run_sub, write_config

GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.com", "GIT_CONFIG_NOSYSTEM": "1"}


def git(cwd: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True,
                          env={**os.environ, **GIT_ENV}, check=True)
    return done.stdout


@pytest.fixture
def repo(tmp_path: Path) -> dict[str, Path]:
    """main (branch main) with the memory initialised and committed; worktrees a and b on their own branches."""
    main = tmp_path / "main"
    main.mkdir()
    git(main, "init", "-q", "-b", "main")
    code, _, err = run_cli(["memory-init", "--root", str(main)])
    assert code == 0, err
    write_config(main, provider="hash", model="hash-256", lock_timeout=2.0, near_duplicate=None)
    git(main, "add", "-A")
    git(main, "commit", "-q", "-m", "memory")
    trees = {"main": main}
    for name in ("a", "b"):
        trees[name] = tmp_path / name
        git(main, "worktree", "add", "-q", "-b", name, str(trees[name]))
    return trees


def ids(result) -> list[str]:
    return [h["id"] for h in result.json["hits"]]


def add(root: Path, title: str, body: str = "") -> str:
    code, out, err = index_records(root, [rec(title, body)])
    assert code == 0, err
    return out["ids"][0]


def snapshot_files(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(folder.iterdir()) if p.is_file()}


def test_a_record_written_in_one_worktree_is_recalled_in_another_at_once(repo):
    rid = add(repo["a"], "Flaky payments test", "the payments test needs a fixed clock")
    before = snapshot_files(memory_dir(repo["a"]))
    result = query(repo["b"], "payments clock")
    assert result.code == 0, result.err
    assert rid in ids(result)
    got = result.json["scope"]
    folders = {Path(f["path"]): f for f in got["folders"]}
    assert folders[memory_dir(repo["b"]).resolve()]["own"] is True
    assert folders[memory_dir(repo["b"]).resolve()]["found"] == "flag"
    assert folders[memory_dir(repo["a"]).resolve()]["found"] == "worktree"
    assert folders[memory_dir(repo["a"]).resolve()]["branch"] == "a"
    assert got["branch"] == "b" and got["commit"] == git(repo["b"], "rev-parse", "HEAD").strip()
    assert got["worktrees"] == "shared"
    # B's write does not touch A's files
    add(repo["b"], "Deploys need the VPN", "staging deploys go through the VPN")
    assert snapshot_files(memory_dir(repo["a"])) == before
    assert rid in ids(query(repo["main"], "payments clock"))


def test_stats_carry_the_scope_and_count_every_worktree(repo):
    add(repo["a"], "one record in a")
    add(repo["b"], "one record in b")
    code, out, err = run_cli(["memory-stats", "--root", str(repo["main"])])
    assert code == 0, err
    assert out["count"] == 2
    assert len(out["scope"]["folders"]) == 3
    assert out["scope"]["branch"] == "main"


def test_own_hides_the_other_worktrees(repo):
    rid = add(repo["a"], "Flaky payments test", "the payments test needs a fixed clock")
    write_config(repo["b"], worktrees="own")
    result = query(repo["b"], "payments clock")
    assert result.code == 0, result.err
    assert rid not in ids(result)
    assert result.json["scope"]["worktrees"] == "own"
    assert [f["own"] for f in result.json["scope"]["folders"]] == [True]


def test_the_setting_is_validated(repo):
    write_config(repo["b"], worktrees="everyone")
    code, _, err = run_cli(["memory-stats", "--root", str(repo["b"])])
    assert code != 0 and err["code"] == codes.CONFIG_INVALID_VALUE


def test_a_removed_worktree_is_skipped_without_error(repo):
    rid = add(repo["a"], "in a", "alpha words")
    add(repo["b"], "in b", "beta words")
    assert rid in ids(query(repo["main"], "alpha words"))
    git(repo["main"], "worktree", "remove", "--force", str(repo["a"]))
    result = query(repo["main"], "alpha words")
    assert result.code == 0, result.err
    assert rid not in ids(result)
    assert not [w for w in result.json["warnings"] if w["code"] == codes.WORKTREE_MEMORY_SKIPPED]
    git(repo["main"], "worktree", "prune")
    assert query(repo["main"], "alpha words").code == 0


def test_a_folder_deleted_but_not_pruned_is_skipped(repo):
    import shutil

    add(repo["a"], "in a", "alpha words")
    shutil.rmtree(repo["a"])  # git still lists it (prunable)
    result = query(repo["b"], "alpha words")
    assert result.code == 0, result.err
    assert result.json["hits"] == []


def test_a_memory_folder_that_is_a_symlink_is_skipped_with_a_warning(repo, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "records.jsonl").write_text(json.dumps({"id": "secret", "type": "learning", "title": "stolen",
                                                       "body": "outside words"}) + "\n")
    folder = memory_dir(repo["a"])
    import shutil

    shutil.rmtree(folder)
    folder.symlink_to(outside)
    result = query(repo["b"], "outside words")
    assert result.code == 0, result.err
    assert "secret" not in ids(result)
    skipped = [w for w in result.json["warnings"] if w["code"] == codes.WORKTREE_MEMORY_SKIPPED]
    assert skipped and "symlink" in skipped[0]["message"]
    assert all(Path(f["path"]) != folder.resolve() for f in result.json["scope"]["folders"])


def test_a_log_that_is_a_symlink_is_skipped(repo, tmp_path):
    outside = tmp_path / "elsewhere.jsonl"
    outside.write_text(json.dumps({"id": "secret", "type": "learning", "title": "t", "body": "outside"}) + "\n")
    (memory_dir(repo["a"]) / "records.jsonl").symlink_to(outside)
    result = query(repo["b"], "outside")
    assert result.code == 0, result.err
    assert "secret" not in ids(result)
    assert [w for w in result.json["warnings"] if w["code"] == codes.WORKTREE_MEMORY_SKIPPED]


def test_concurrent_writes_in_two_worktrees_are_both_seen_from_a_third(repo):
    from .conftest import run_sub

    def write(root: Path, n: int) -> None:
        for i in range(n):
            r = run_sub(["memory-index", "--root", str(root), "--records-file", "-"],
                        stdin=json.dumps(rec(f"{root.name} note {i}", f"written in {root.name} number {i}")))
            assert r.code == 0, r.err

    threads = [threading.Thread(target=write, args=(repo[name], 3)) for name in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    code, out, err = run_cli(["memory-stats", "--root", str(repo["main"])])
    assert code == 0, err
    assert out["count"] == 6


def test_after_a_merge_each_record_appears_once(repo):
    shared_text = "the cache must be warmed before the benchmark"
    add(repo["b"], "Warm the cache", shared_text)
    add(repo["main"], "Main note", "written on main")
    for name in ("b", "main"):
        git(repo[name], "add", "-A")
        git(repo[name], "commit", "-q", "-m", f"memory on {name}")
    git(repo["main"], "merge", "-q", "--no-edit", "b")
    log = (memory_dir(repo["main"]) / "records.jsonl").read_text().splitlines()
    assert len(log) == 2 and not any(line.startswith(("<<<<", ">>>>")) for line in log)
    # main's log now holds b's record too, and b still holds it: the same id and content, once in answers
    result = query(repo["a"], "warm cache benchmark", "--k", "10")
    assert result.code == 0, result.err
    found = ids(result)
    assert len(found) == len(set(found))
    code, out, err = run_cli(["memory-stats", "--root", str(repo["a"])])
    assert code == 0, err
    assert out["count"] == 2
    assert not [p for p in out["consistency"]["problems"] if p["code"] == codes.RECORDS_DUPLICATE_ID]


def test_outside_a_multi_worktree_repository_nothing_changes(tmp_path, project):
    store = open_store(load_project(project))
    assert type(store).__name__ == "FileStore"
    got = scope(load_project(project))
    assert got.worktrees == "none" and got.branch is None and len(got.folders) == 1
    assert got.folders[0].found == "flag"


def test_a_write_elsewhere_changes_the_generation_and_the_vectors_follow(repo):
    """Another worktree's append re-reads everything (positions move); the vectors are re-mapped by
    id and text hash, so a query in this worktree still finds its own and the other's records."""
    from nubos_memory import Memory

    mine = add(repo["b"], "Own note", "a note about gardening tomatoes")
    mem = Memory.open(str(repo["b"]))
    first = mem.query("gardening tomatoes", k=5)
    assert mine in [h["id"] for h in first["hits"]]
    generation = mem.scan().generation
    theirs = add(repo["a"], "Their note", "a note about pruning tomatoes")
    second = mem.query("tomatoes", k=5, mode="vector")
    assert mem.scan().generation > generation
    assert {mine, theirs} <= {h["id"] for h in second["hits"]}
    stats = mem.stats()
    assert not [p for p in stats["consistency"]["problems"] if p["code"] == codes.RECORDS_DUPLICATE_ID]


# -- the store contract, run against the composed store ------------------------------------------------------
class TestWorktreeStoreContract(contract.TestStoreContract):
    """Every scenario of ``tests/test_store_contract.py`` on a :class:`WorktreeStore` of a worktree whose
    repository has another worktree with a (still empty) log: the composed reading must not change what
    the store's own log amounts to."""

    @pytest.fixture
    def stores(self, request: pytest.FixtureRequest, tmp_path: Path,
               monkeypatch: pytest.MonkeyPatch) -> contract.Stores:
        """The between-stores scenario's other memories (a database one only in the contract suite)."""
        if request.node.callspec.params.get("target") == "postgres":
            pytest.skip("export into the team database is the contract suite's")
        return contract.Stores(request, tmp_path, monkeypatch)

    @pytest.fixture
    def h(self, request: pytest.FixtureRequest, tmp_path: Path) -> contract.Harness:
        if getattr(request, "param", "files") != "files":
            pytest.skip("the composed store is a file store: the other kinds' runs are the contract suite's")
        main = tmp_path / "wt-main"
        main.mkdir()
        git(main, "init", "-q", "-b", "main")
        assert run_cli(["memory-init", "--root", str(main)]).code == 0
        write_config(main, provider="hash", model="hash-256", lock_timeout=2.0, near_duplicate=None)
        git(main, "add", "-A")
        git(main, "commit", "-q", "-m", "memory")
        other = tmp_path / "wt-other"
        git(main, "worktree", "add", "-q", "-b", "other", str(other))
        (memory_dir(other) / "records.jsonl").write_bytes(b"")
        project = load_project(main)
        store = open_store(project)
        assert isinstance(store, WorktreeStore)
        store.prepare()

        def backup() -> list[bytes]:
            backups = sorted(store.folder.glob("records.jsonl.bak-*"))
            return backups[-1].read_bytes().splitlines(keepends=True) if backups else []

        return contract.Harness("files", store, project, lambda: WorktreeStore(project, contract.LOCK_S), backup,
                                [contract.Crash("torn-line", contract._files_torn, "rolled-back"),
                                 contract.Crash("open-group", contract._files_open_group, "committed")])


def test_a_forget_in_one_worktree_hides_the_record_in_every_worktree(repo):
    rid = add(repo["a"], "Wrong note", "the staging password is hunter2")
    code, _, err = run_cli(["memory-forget", "--root", str(repo["b"]), rid, "--reason", "wrong"])
    assert code == 0, err
    for name in ("a", "b", "main"):
        result = query(repo[name], "staging password")
        assert result.code == 0, result.err
        assert rid not in ids(result), name
    assert rid.encode() not in (memory_dir(repo["b"]) / "records.jsonl").read_bytes().split(b'"op"')[0]


def test_compact_in_a_worktree_keeps_only_its_own_records_and_its_forgets_of_others(repo):
    theirs = add(repo["a"], "Their note", "written in a")
    gone = add(repo["a"], "Their wrong note", "a wrong note written in a")
    mine = add(repo["b"], "My note", "written in b")
    assert run_cli(["memory-forget", "--root", str(repo["b"]), gone]).code == 0
    before_a = snapshot_files(memory_dir(repo["a"]))
    code, _, err = run_cli(["memory-compact", "--root", str(repo["b"])])
    assert code == 0, err
    lines = [json.loads(x) for x in (memory_dir(repo["b"]) / "records.jsonl").read_text().splitlines()]
    assert [x["id"] for x in lines if "op" not in x] == [mine]
    assert [(x["op"], x["id"]) for x in lines if "op" in x and x["op"] == "forget"] == [("forget", gone)]
    assert snapshot_files(memory_dir(repo["a"])) == before_a
    found = {h["id"] for h in query(repo["b"], "note written", "--k", "10").json["hits"]}
    assert found == {theirs, mine}


def test_the_saved_lexical_index_is_not_reused_when_another_worktree_changed(repo):
    """The persisted postings cover the other logs' bytes as read: another worktree's append must not
    leave this worktree with postings whose positions moved."""
    add(repo["a"], "First of a", "apples grow on trees")
    mine = add(repo["b"], "Own of b", "bananas grow on plants")
    assert run_cli(["memory-rebuild", "--root", str(repo["b"])]).code == 0  # saves the lexical index
    theirs = add(repo["a"], "Second of a", "cherries grow on trees")
    assert ids(query(repo["b"], "bananas plants", "--mode", "lexical"))[0] == mine
    assert ids(query(repo["b"], "cherries", "--mode", "lexical"))[0] == theirs


def test_a_copys_redact_line_retires_lines_by_hash_never_a_record_of_its_id_in_another_worktree(repo):
    """What memory-redact writes for a line only a copy held (``"copy": true``): in every worktree, a
    record of that id with other content stays live, and the line it names is read nowhere."""
    from nubos_memory import Memory
    from nubos_memory.fsio import dumps
    from nubos_memory.log import line_hash, redact_op

    a, b = repo["a"], repo["b"]
    secret_line = dumps({"id": "s", "type": "learning", "title": "leaked key", "body": "sk-live-ZZSECRET",
                         "created_at": "2026-11-01T00:00:00Z"})
    store = Memory.open(a).store
    with store.lock("test"):
        store.append([], [redact_op("s", line_hash(secret_line), "2026-11-24T00:00:00Z", "leaked", copy=True)])
    clean_line = dumps({"id": "s", "type": "learning", "title": "new s", "body": "clean content",
                        "created_at": "2026-11-02T00:00:00Z"})
    memory_dir(b).mkdir(parents=True, exist_ok=True)
    with (memory_dir(b) / "records.jsonl").open("ab") as f:  # a merge brought the line back into the other
        f.write(secret_line + b"\n" + clean_line + b"\n")  # worktree's log, before a record of that id with
    for root in (a, b):  # its own content, and no writer has run there since (reads never rewrite a log)
        got = run_cli(["memory-get", "--root", str(root), "s", "--history"])
        assert "ZZSECRET" not in got.out, (root, got.out)
        assert got.json["records"][0]["live"] and got.json["records"][0]["record"]["body"] == "clean content"
        assert ids(query(root, "clean content")) == ["s"]


def test_a_secret_another_worktrees_log_still_holds_is_never_read_after_a_redaction(repo):
    a, b = repo["a"], repo["b"]
    secret = "the token is SECRET-ZZ-123"
    assert index_records(a, [rec("deploy token", secret, id="x-1")]).code == 0
    git(a, "add", "-A")
    git(a, "commit", "-q", "-m", "the note")
    git(b, "merge", "-q", "a")  # the teammate's branch holds the line too
    assert run_cli(["memory-redact", "--root", str(a), "x-1", "--reason", "leaked"]).json["redacted"] == ["x-1"]
    for root in (a, b):
        got = run_cli(["memory-get", "--root", str(root), "x-1"])
        assert secret not in got.out and got.json["records"][0]["retired"]["reason"] == "redacted", (root, got.out)
        assert secret not in query(root, "deploy token").out


def test_a_forget_of_a_record_another_worktree_holds_survives_a_compaction(repo):
    a, b = repo["a"], repo["b"]
    assert index_records(a, [rec("deploy token", "old", id="x-2")]).code == 0
    git(a, "add", "-A")
    git(a, "commit", "-q", "-m", "the note")
    git(b, "merge", "-q", "a")
    assert run_cli(["memory-forget", "--root", str(a), "x-2"]).code == 0
    assert run_cli(["memory-compact", "--root", str(a)]).code == 0
    assert run_cli(["memory-get", "--root", str(a), "x-2"]).json["records"][0]["live"] is False


def test_redacting_a_record_only_another_worktree_holds_takes_it_out_of_the_open_memory_at_once(repo):
    from nubos_memory import Memory

    a, b = repo["a"], repo["b"]
    secret = "the token is SECRET-ZZ-123"
    assert index_records(b, [rec("deploy token", secret, id="x-1")]).code == 0
    mem = Memory.open(a)  # a warm process that read b's line as live before the redaction
    assert [h["id"] for h in mem.query("deploy token")["hits"]] == ["x-1"]
    assert mem.redact(["x-1"], reason="leaked")["redacted"] == ["x-1"]
    assert mem.query("deploy token")["hits"] == [] and secret not in json.dumps(mem.get(["x-1"], history=True))
    stats = run_cli(["memory-stats", "--root", str(a)]).json
    assert stats["consistency"]["consistent"], stats["consistency"]  # the rebuild read the same state
    assert secret not in run_cli(["memory-get", "--root", str(b), "x-1", "--history"]).out


def test_a_record_re_added_after_a_redaction_in_another_worktree_stays_live_in_both(repo):
    a, b = repo["a"], repo["b"]
    secrets = [rec("deploy token", f"the token is SECRET-ZZ-{i}", id=f"x-{i}") for i in (1, 2)]
    assert index_records(b, secrets).code == 0
    assert run_cli(["memory-redact", "--root", str(a), "x-1", "x-2", "--reason", "leaked"]).code == 0
    assert index_records(b, [rec("other note", "b writes again")]).code == 0  # b's writer removes its lines
    assert index_records(a, [rec("deploy token", "in the vault now (a)", id="x-1")]).code == 0
    assert index_records(b, [rec("deploy token", "in the vault now (b)", id="x-2")]).code == 0
    for root in (a, b):
        for rid in ("x-1", "x-2"):
            got = run_cli(["memory-get", "--root", str(root), rid, "--history"])
            record = got.json["records"][0]
            assert record["live"] and "vault" in record["record"]["body"], (root.name, rid, record)
            assert "SECRET-ZZ" not in got.out


def test_a_worktree_compaction_keeps_a_re_added_record_and_the_pins(repo):
    a, b = repo["a"], repo["b"]
    assert index_records(a, [rec("deploy token", "OLDCONTENT", id="s"), rec("pinned note", id="p-1")]).code == 0
    git(a, "add", "-A")
    git(a, "commit", "-q", "-m", "notes")
    git(b, "merge", "-q", "a")
    assert run_cli(["memory-forget", "--root", str(a), "s"]).code == 0
    assert index_records(a, [rec("deploy token", "NEWCONTENT", id="s")]).code == 0
    assert run_cli(["memory-pin", "--root", str(a), "p-1"]).code == 0
    assert run_cli(["memory-compact", "--root", str(a)]).code == 0
    for root in (a, b):
        got = run_cli(["memory-get", "--root", str(root), "s"]).json["records"][0]
        assert got["live"] and got["record"]["body"] == "NEWCONTENT", (root.name, got)
    again = run_cli(["memory-pin", "--root", str(a), "p-1"]).json  # still hot: nothing to change
    assert again["unchanged"] == ["p-1"] and again["pinned"] == [], again


@pytest.mark.parametrize("extra", [{}, {"domain": "ops"}, {"hot": True}])  # (fields a re-serialised line reorders)
def test_a_worktree_compaction_never_writes_anew_a_line_a_redaction_elsewhere_names(repo, extra):
    from nubos_memory import Memory

    a, b = repo["a"], repo["b"]
    secret = "the token is SECRET-WW-777"
    assert index_records(a, [rec("deploy token", secret, id="s", **extra)]).code == 0
    assert run_cli(["memory-pin", "--root", str(a), "s"]).code == 0
    git(a, "add", "-A")
    git(a, "commit", "-q", "-m", "notes")
    git(b, "merge", "-q", "a")
    mem = Memory.open(a)
    assert mem.query("deploy token")["hits"]
    assert run_cli(["memory-redact", "--root", str(b), "s", "--reason", "leaked"]).code == 0
    mem.compact()  # (under its lock this worktree does not read the others: it must not write s anew)
    for root in (a, b):
        got = run_cli(["memory-get", "--root", str(root), "s", "--history"])
        assert secret not in got.out and not got.json["records"][0]["live"], (root.name, got.out)


def test_a_worktree_compaction_keeps_pins_and_unpins_made_anywhere(repo):
    a, b = repo["a"], repo["b"]
    assert index_records(a, [rec("hot by its field", id="r", hot=True)]).code == 0
    git(a, "add", "-A")
    git(a, "commit", "-q", "-m", "notes")
    git(b, "merge", "-q", "a")
    assert index_records(b, [rec("b's own note", id="p-1")]).code == 0
    assert run_cli(["memory-unpin", "--root", str(b), "r"]).code == 0  # unpinned in the other worktree
    assert run_cli(["memory-pin", "--root", str(a), "p-1"]).code == 0  # a pin of the other worktree's record
    assert run_cli(["memory-compact", "--root", str(a)]).code == 0
    assert run_cli(["memory-unpin", "--root", str(a), "r"]).json["unchanged"] == ["r"]  # still unpinned
    assert run_cli(["memory-pin", "--root", str(a), "p-1"]).json["unchanged"] == ["p-1"]  # still pinned



@pytest.mark.parametrize("first, then", [("unpin", "pin"), ("pin", "unpin")])
def test_a_pin_state_set_across_worktrees_survives_a_compaction(repo, first, then):
    a, b = repo["a"], repo["b"]
    assert index_records(a, [rec("release checklist", id="r", hot=first == "unpin")]).code == 0
    git(a, "add", "-A")
    git(a, "commit", "-q", "-m", "notes")
    git(b, "merge", "-q", "a")
    assert run_cli([f"memory-{first}", "--root", str(b), "r"]).json[f"{first}ned"] == ["r"]  # the other worktree
    assert run_cli([f"memory-{then}", "--root", str(a), "r"]).json[f"{then}ned"] == ["r"]  # then this one
    assert run_cli(["memory-compact", "--root", str(a)]).code == 0
    assert run_cli([f"memory-{then}", "--root", str(a), "r"]).json["unchanged"] == ["r"]  # as it was set last


def test_a_compaction_never_pins_a_re_added_record_nor_one_a_rolled_back_pin_named(repo):
    a, b = repo["a"], repo["b"]
    assert index_records(a, [rec("deploy token", "OLDCONTENT", id="s"), rec("one", id="r1"), rec("two", id="r2")]
                         ).code == 0
    git(a, "add", "-A")
    git(a, "commit", "-q", "-m", "notes")
    git(b, "merge", "-q", "a")
    assert run_cli(["memory-pin", "--root", str(a), "s"]).code == 0  # the old version pinned ...
    assert run_cli(["memory-forget", "--root", str(a), "s"]).code == 0
    assert index_records(a, [rec("deploy token", "NEWCONTENT", id="s")]).code == 0  # ... not the new one
    crashed = run_sub(["memory-pin", "--root", str(a), "r1", "r2"], env={"NUBOS_MEMORY_CRASH_AT": "append-torn"})
    assert crashed.code != 0  # a pin of two records torn mid-write: rolled back by the next writer
    assert index_records(a, [rec("a later note")]).code == 0
    assert run_cli(["memory-compact", "--root", str(a)]).code == 0
    for root in (a, b):
        for rid in ("s", "r1", "r2"):
            assert run_cli(["memory-unpin", "--root", str(root), rid]).json["unchanged"] == [rid], (root.name, rid)


@pytest.mark.parametrize("change", ["pin", "unpin"])
def test_a_long_lived_memory_compacting_keeps_a_pin_change_the_other_worktree_made_since_it_read(repo, change):
    from nubos_memory import Memory

    a, b = repo["a"], repo["b"]
    assert index_records(a, [rec("x title", "body of x", id="x")]).code == 0
    assert index_records(b, [rec("z title", "body of z", id="z", hot=change == "unpin")]).code == 0
    mem = Memory.open(a)  # memory-serve's, say: it read every log with this query
    assert mem.query("body")["hits"]
    assert run_cli([f"memory-{change}", "--root", str(b), "z"]).json[f"{change}ned"] == ["z"]
    mem.compact()  # (under its lock it does not read the other logs: its view of z is the old one)
    for root in (a, b):
        assert run_cli([f"memory-{change}", "--root", str(root), "z"]).json["unchanged"] == ["z"], root.name


def rolled_back_forget(root: Path, *rids: str) -> None:
    """What a writer killed in the last line of a forget of several records, and the next writer, leave in
    ``root``'s log: the group's whole lines (the torn one was cut), then its rollback line (never applied)."""
    lines = [{"op": "group", "lines": len(rids) + 1, "gid": "g-1"}, *(forget_op(rid) for rid in rids),
             {"op": "rollback", "gid": "g-1", "at": "2026-11-25T00:00:00Z"}]
    with (memory_dir(root) / "records.jsonl").open("ab") as f:
        f.write(b"".join(json.dumps(line).encode() + b"\n" for line in lines))


def test_a_rolled_back_forget_in_another_worktree_retires_nothing(repo):
    a, b = repo["a"], repo["b"]
    assert index_records(a, [rec("one", id="r1"), rec("two", id="r2")]).code == 0  # only a's log holds them
    rolled_back_forget(b, "r1", "r2")
    for root in (a, b):
        for rid in ("r1", "r2"):
            got = run_cli(["memory-get", "--root", str(root), rid]).json["records"][0]
            assert got["live"], (root.name, rid, got)


def test_a_worktree_compaction_never_copies_a_rolled_back_forget(repo):
    a, b = repo["a"], repo["b"]
    assert index_records(b, [rec("one", id="r1"), rec("two", id="r2")]).code == 0  # only b's log holds them
    rolled_back_forget(a, "r1", "r2")
    assert index_records(a, [rec("a's own note")]).code == 0
    assert run_cli(["memory-compact", "--root", str(a)]).code == 0  # keeps a's forgets of b's records: not these
    for root in (a, b):
        for rid in ("r1", "r2"):
            got = run_cli(["memory-get", "--root", str(root), rid]).json["records"][0]
            assert got["live"], (root.name, rid, got)


def append_lines(root: Path, *lines: dict) -> None:
    with (memory_dir(root) / "records.jsonl").open("ab") as f:
        f.write(b"".join(json.dumps(line).encode() + b"\n" for line in lines))


def test_a_forget_retires_an_id_a_log_read_later_forgets_and_adds_again_in_every_worktree(repo):
    a, b = repo["a"], repo["b"]
    assert index_records(a, [rec("one", id="r1")]).code == 0
    append_lines(a, forget_op("r1"))
    append_lines(b, forget_op("r1"), rec("one again", id="r1", created_at="2026-11-25T00:00:00Z"))
    for root in (a, b, repo["main"]):  # a's forget retires b's record too, whichever log is read first
        got = run_cli(["memory-get", "--root", str(root), "r1"]).json["records"][0]
        assert not got["live"], (root.name, got)


def test_a_forget_line_says_the_same_reason_wherever_its_record_was_read(repo):
    a, b = repo["a"], repo["b"]
    assert index_records(a, [rec("one", id="r1"), rec("two", id="r2")]).code == 0
    append_lines(b, {**forget_op("r1"), "reason": ""}, {**forget_op("r2"), "reason": 7})  # (hand edits)
    for root in (a, b, repo["main"]):
        got = run_cli(["memory-get", "--root", str(root), "r1", "r2"]).json["records"]
        assert [r["retired"]["reason"] for r in got] == ["", "forgotten"], root.name


def test_pruning_records_whose_code_is_gone_leaves_another_worktrees_records_alone(repo):
    a, b = repo["a"], repo["b"]
    (b / "new.py").write_text("def fresh():\n    return 1\n")
    git(b, "add", "new.py")
    git(b, "commit", "-q", "-m", "new code")
    out = run_cli(["memory-add", "--root", str(b), "--type", "learning", "--title", "fresh returns 1", "--body", "b",
                   "--anchor", "new.py:1-2"])
    assert out.code == 0, out.err
    rid = out.json["id"]
    pruned = run_cli(["memory-prune", "--root", str(a), "--anchors-missing"]).json  # a has no new.py: b's code
    assert pruned["retired"] == [] and pruned["other_worktrees"] == [rid], pruned
    assert run_cli(["memory-get", "--root", str(b), rid]).json["records"][0]["live"]


def test_a_merged_record_of_a_worktree_since_removed_is_pruned_where_its_code_went(repo):
    main, b = repo["main"], repo["b"]
    (b / "new.py").write_text("def fresh():\n    return 1\n")
    git(b, "add", "new.py")
    out = run_cli(["memory-add", "--root", str(b), "--type", "learning", "--title", "fresh returns 1", "--body", "b",
                   "--anchor", "new.py:1-2"])
    assert out.code == 0, out.err
    git(b, "add", "-A")
    git(b, "commit", "-q", "-m", "new code and its note")
    git(main, "merge", "-q", "b")
    git(main, "worktree", "remove", "--force", str(b))
    git(main, "rm", "-q", "new.py")
    git(main, "commit", "-q", "-m", "gone")
    pruned = run_cli(["memory-prune", "--root", str(main), "--anchors-missing"]).json
    assert pruned["retired"] == [out.json["id"]] and pruned["other_worktrees"] == [], pruned


def test_a_record_written_after_another_worktrees_forget_of_its_id_stays_live_everywhere(repo):
    a, b = repo["a"], repo["b"]
    assert index_records(a, [rec("one", id="r1")]).code == 0
    assert run_cli(["memory-forget", "--root", str(a), "r1"]).code == 0
    out = index_records(b, [rec("one, said again", id="r1")])  # (after the forget: a new statement of r1)
    assert out.code == 0 and out.json["ids"] == ["r1"], out.json
    for root in (a, b, repo["main"]):
        got = run_cli(["memory-get", "--root", str(root), "r1"]).json["records"][0]
        assert got["live"] and got["record"]["title"] == "one, said again", (root.name, got)

"""The user-level memory (issue 25): ``--scope user`` writes, ``--scope project|user|all`` reads, both
memories in one ranking over one scope statistic, each hit naming its memory; the user memory lives in
this user's data folder ($XDG_DATA_HOME, a tmp folder per test: conftest.user_data_home) and nothing in
a project can move it or is written about it into the project."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from nubos_memory import Memory, codes
from nubos_memory.api import usermemory
from nubos_memory.embed.hashing import HashEmbedder
from nubos_memory.errors import InputError, StoreError

from .conftest import index_records, memory_dir, query, rec, run_cli, write_config

HASH = {"provider": "hash", "model": "hash-256", "near_duplicate": None, "context": "off"}


def user_dir(data_home: Path) -> Path:
    return data_home / "nubos-memory" / "user"


def configure_user(data_home: Path, **memory: object) -> None:
    """The user memory's own settings (its config.json in the data folder): the hash embedder, like the tests'
    projects."""
    folder = user_dir(data_home) / ".nubos-pilot"
    folder.mkdir(parents=True, mode=0o700)
    os.chmod(data_home / "nubos-memory", 0o700)
    os.chmod(user_dir(data_home), 0o700)
    (folder / "config.json").write_text(json.dumps({"memory": {**HASH, **memory}}))


@pytest.fixture
def both(project: Path, user_data_home: Path) -> Path:
    """A project and a user memory, both on the hash embedder, neighbours' context off."""
    write_config(project, **HASH)
    configure_user(user_data_home)
    return project


def add(root: Path, title: str, body: str = "", *extra: str) -> dict:
    code, out, err = run_cli(["memory-add", "--root", str(root), "--type", "learning", "--title", title, "--body", body,
                              *extra])
    assert code == 0, err
    return out


def test_a_user_write_goes_to_the_data_folder_and_never_into_the_project(both: Path, user_data_home: Path):
    before = (memory_dir(both) / "records.jsonl").read_bytes() if (memory_dir(both) / "records.jsonl").exists() else b""
    out = add(both, "I prefer pnpm over npm", "always enable corepack", "--scope", "user")
    user_log = user_dir(user_data_home) / ".nubos-pilot" / "memory" / "records.jsonl"
    assert out["id"] in user_log.read_text()
    assert ((memory_dir(both) / "records.jsonl").read_bytes() if (memory_dir(both) / "records.jsonl").exists()
            else b"") == before
    got = run_cli(["memory-get", "--root", str(both), "--scope", "user", out["id"]]).json
    assert got["records"][0]["record"]["title"] == "I prefer pnpm over npm"
    assert run_cli(["memory-get", "--root", str(both), out["id"]]).error["code"] == "record-not-found"


def test_reads_cover_both_memories_once_a_user_memory_exists(both: Path):
    mine = add(both, "pnpm lockfile drift broke the CI cache", "pin pnpm with corepack")["id"]
    alone = query(both, "pnpm corepack").json
    assert [h["memory"] for h in alone["hits"]] == ["project"]  # no user memory yet: the project's alone
    assert alone["scope"]["memories"] == ["project"]
    theirs = add(both, "I prefer pnpm everywhere", "corepack enable in every repository", "--scope", "user")["id"]
    every = query(both, "pnpm corepack").json  # default: all
    assert {h["id"]: h["memory"] for h in every["hits"]} == {mine: "project", theirs: "user"}
    assert every["scope"]["memories"] == ["project", "user"]
    user_folder = [f for f in every["scope"]["folders"] if f.get("memory") == "user"]
    assert user_folder and user_folder[0]["path"].endswith("nubos-memory/user/.nubos-pilot/memory")
    assert [h["id"] for h in query(both, "pnpm corepack", "--scope", "project").json["hits"]] == [mine]
    write_config(both, enabled=False)  # the user memory is read even where this project's memory is off
    assert [h["id"] for h in query(both, "pnpm corepack", "--scope", "user").json["hits"]] == [theirs]
    assert query(both, "pnpm corepack").error["code"] == "memory-disabled"
    assert add(both, "written while the project's memory is off", "", "--scope", "user")["added"] == 1
    write_config(both, enabled=True)
    only_user = query(both, "pnpm corepack", "--scope", "user").json
    assert [(h["id"], h["memory"]) for h in only_user["hits"]] == [(theirs, "user")]
    assert only_user["scope"]["memories"] == ["user"]


PROJECT_RECORDS = [rec(f"cache note {i}", f"the build cache missed after change {i} to the lockfile") for i in range(8)] \
    + [rec("release checklist", "tag the commit, then push the tag"), rec("cache eviction", "the LRU cache holds 512 keys")]
USER_RECORDS = [rec("editor habit", "I keep one terminal per repository"),
                rec("lockfile rule", "never edit a lockfile by hand; regenerate it"),
                rec("cache rule", "clear the package cache before blaming the lockfile")]


@pytest.mark.parametrize("mode", ["lexical", "hybrid", "vector"])
@pytest.mark.parametrize("fusion", ["z", "alpha"])
def test_the_fused_ranking_is_that_of_one_memory_holding_both(both: Path, tmp_path: Path, mode: str, fusion: str):
    """One scope statistic: every fused score equals the score the record gets in one memory holding both logs'
    records (BM25 over both indexes' statistic, z-scores over both scopes).  Per-memory statistics would not
    (checked below: the project's own scores differ), so this fails without the shared statistic."""
    assert index_records(both, PROJECT_RECORDS).code == 0
    assert run_cli(["memory-index", "--root", str(both), "--scope", "user", "--records-file", "-"],
                   stdin="\n".join(json.dumps(r) for r in USER_RECORDS)).code == 0
    merged = tmp_path / "merged"
    merged.mkdir()
    assert run_cli(["memory-init", "--root", str(merged)]).code == 0
    write_config(merged, **HASH)
    assert index_records(merged, PROJECT_RECORDS + USER_RECORDS).code == 0
    text = "lockfile cache"
    args = ["--mode", mode, "--fusion", fusion, "--k", "20", "--no-collapse"]
    fused = query(both, text, *args).json
    one = query(merged, text, *args, "--scope", "project").json
    title = {h["id"]: h["record"]["title"] for h in fused["hits"]}
    fused_scores = {title[h["id"]]: h["score"] for h in fused["hits"]}
    one_scores = {h["record"]["title"]: h["score"] for h in one["hits"]}
    assert fused_scores == pytest.approx(one_scores, abs=2e-6)
    assert [h["record"]["title"] for h in fused["hits"]] == [h["record"]["title"] for h in one["hits"]]
    assert {h["memory"] for h in fused["hits"]} == {"project", "user"}
    if mode != "vector":
        alone = {h["record"]["title"]: h["score"] for h in query(both, text, *args, "--scope", "project").json["hits"]}
        assert any(abs(alone[t] - one_scores[t]) > 1e-3 for t in alone)  # the project's own statistic differs


def test_context_includes_the_user_memorys_hot_records(both: Path):
    add(both, "the invoice total is in cents", "")
    add(both, "answer in British English", "colour, behaviour", "--scope", "user", "--hot")
    out = run_cli(["memory-context", "--root", str(both), "invoice totals"]).json
    hot = out["sections"]["hot"]["hits"]
    assert [(h["record"]["title"], h["memory"]) for h in hot] == [("answer in British English", "user")]
    project_only = run_cli(["memory-context", "--root", str(both), "invoice totals", "--scope", "project"]).json
    assert project_only["sections"]["hot"]["hits"] == []


def test_stats_report_the_user_memory(both: Path, user_data_home: Path):
    assert run_cli(["memory-stats", "--root", str(both)]).json["user_memory"]["exists"] is False
    add(both, "one user note", "", "--scope", "user")
    stats = run_cli(["memory-stats", "--root", str(both)]).json["user_memory"]
    assert stats["exists"] is True and stats["live"] == 1
    assert stats["path"] == str(user_dir(user_data_home) / ".nubos-pilot" / "memory")


def test_forget_and_scope_errors(both: Path):
    assert query(both, "anything", "--scope", "user").error["code"] == "user-memory-missing"
    assert query(both, "anything", "--scope", "both").code == 2  # the command line's choices
    mem = Memory.open(both, embedder=HashEmbedder("hash-256"))
    with pytest.raises(InputError) as refused:
        mem.query("anything", scope="both")
    assert refused.value.code == "query-invalid-scope"
    with pytest.raises(InputError) as refused:
        mem.for_scope("all", create=True)  # a write goes to one memory
    assert refused.value.code == "query-invalid-scope"
    rid = add(both, "a user note to forget", "", "--scope", "user")["id"]
    assert run_cli(["memory-forget", "--root", str(both), "--scope", "user", rid]).json["forgotten"] == [rid]
    assert query(both, "user note forget", "--scope", "user").json["hits"] == []


def test_a_project_cannot_move_or_learn_about_the_user_memory(both: Path, user_data_home: Path, tmp_path: Path):
    """adr/0010: the place comes from the environment only; the project's config has no key for it, and
    nothing of the user memory (its path, its records) is written into the project's folder by reads or
    writes of both."""
    elsewhere = tmp_path / "elsewhere"
    write_config(both, user_memory=str(elsewhere))
    assert query(both, "anything").error["code"] == "config-unknown-key"
    doc = json.loads((both / ".nubos-pilot" / "config.json").read_text())
    del doc["memory"]["user_memory"]
    (both / ".nubos-pilot" / "config.json").write_text(json.dumps(doc))
    add(both, "project fact about the importer", "it runs nightly")
    add(both, "secret-ish user habit zebrafinch", "importer habits of mine", "--scope", "user")
    assert query(both, "importer habits").json["scope"]["memories"] == ["project", "user"]
    run_cli(["memory-context", "--root", str(both), "importer"])
    run_cli(["memory-stats", "--root", str(both)])
    for path in (both / ".nubos-pilot").rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert b"zebrafinch" not in data and str(user_data_home).encode() not in data, path
    assert not elsewhere.exists()


def test_an_unsafe_data_folder_is_refused(both: Path, user_data_home: Path):
    os.chmod(user_data_home / "nubos-memory", 0o777)
    code, _, err = run_cli(["memory-add", "--root", str(both), "--type", "learning", "--title", "x", "--body", "",
                            "--scope", "user"])
    assert code == 7 and err["code"] == "user-memory-unavailable"
    assert "writable by group or others" in json.dumps(err)
    assert not (user_data_home / "nubos-memory" / "user" / ".nubos-pilot" / "memory" / "records.jsonl").exists()
    # A read that names the user memory says it is refused (not "missing"); a read over all says so too.
    code, _, err = run_cli(["memory-query", "--root", str(both), "x", "--scope", "user"])
    assert err["code"] == "user-memory-unavailable"
    out = run_cli(["memory-query", "--root", str(both), "x"]).json
    assert out["scope"]["memories"] == ["project"]
    assert "user-memory-unavailable" in [w["code"] for w in out["warnings"]]
    os.chmod(user_data_home / "nubos-memory", 0o700)
    assert "user-memory-unavailable" not in [w["code"] for w in run_cli(["memory-query", "--root", str(both),
                                                                          "x"]).json["warnings"]]


def test_the_user_memorys_own_folder_opened_as_a_project_is_read_once(both: Path, user_data_home: Path):
    add(both, "a user note about tabs", "", "--scope", "user")
    assert run_cli(["memory-init", "--root", str(user_dir(user_data_home))]).code == 0
    res = run_cli(["memory-query", "--root", str(user_dir(user_data_home)), "user note tabs"])
    assert res.code == 0, res.err
    out = res.json
    assert [h["title"] if "title" in h else h["record"]["title"] for h in out["hits"]] == ["a user note about tabs"]
    for scope in ([], ["--scope", "user"], ["--scope", "project"], ["--scope", "all"]):  # one memory, however named
        block = run_cli(["memory-context", "--root", str(user_dir(user_data_home)), "user note tabs", *scope])
        assert block.code == 0 and block.json["sections"]["relevant"]["hits"], (scope, block.err)


def test_library_and_scratch_memories(both: Path, monkeypatch: pytest.MonkeyPatch):
    """A memory opened with user=False (memory-eval's scratch memories, the benchmarks) never reads the user
    memory, whatever exists."""
    add(both, "user fact about rust lifetimes", "", "--scope", "user")
    mem = Memory.open(both, embedder=HashEmbedder("hash-256"))
    assert [h["memory"] for h in mem.query("rust lifetimes")["hits"]] == ["user"]
    assert mem.for_scope("user").name == "user"
    scratch = Memory.open(both, embedder=HashEmbedder("hash-256"), user=False)
    assert scratch.query("rust lifetimes")["hits"] == []
    for scope in ("user", "all"):  # asked of a memory opened without it: an error, never the project quietly
        with pytest.raises(InputError) as exc:
            scratch.query("rust lifetimes", scope=scope)
        assert exc.value.code == "query-invalid-scope"


def test_memory_eval_never_reads_the_user_memory(both: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    add(both, "a user note", "", "--scope", "user")
    seen: list[list[str]] = []
    real = usermemory.reads
    monkeypatch.setattr(usermemory, "reads", lambda mem, scope: seen.append(real(mem, scope)) or seen[-1])
    beir = tmp_path / "beir"
    (beir / "qrels").mkdir(parents=True)
    (beir / "corpus.jsonl").write_text("\n".join(json.dumps({"_id": f"d{i}", "title": t, "text": t}) for i, t in
                                                 enumerate(["a user note", "cats and dogs", "tax law"])))
    (beir / "queries.jsonl").write_text(json.dumps({"_id": "q1", "text": "user note"}))
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td0\t1\n")
    code, _, err = run_cli(["memory-eval", "--root", str(both), "--beir", str(beir), "--mode", "lexical",
                              "--no-cache"])
    assert code == 0, err
    assert seen and all(s == ["project"] for s in seen)


def test_a_missing_data_folder_is_looked_for_with_a_stat_until_it_is_made(user_data_home: Path,
                                                                           monkeypatch: pytest.MonkeyPatch):
    """Every query asks whether a user memory exists (twice); where the data folder is not there, that is one
    ``stat`` of the place refused as missing, not the whole resolution (issue 27), and a folder made
    meanwhile is still found at once."""
    from nubos_memory import userdirs

    resolved: list[str] = []
    real = userdirs._resolve
    monkeypatch.setattr(userdirs, "_resolve", lambda kind, *a, **k: resolved.append(kind) or real(kind, *a, **k))
    assert userdirs.user_data_dir() is None
    assert userdirs.user_data_dir() is None and usermemory.user_root() is None and not usermemory.exists()
    assert resolved == ["data"]
    (user_data_home / userdirs.APP).mkdir(mode=0o700)
    assert userdirs.user_data_dir() == user_data_home / userdirs.APP
    assert resolved == ["data", "data"]
    assert userdirs.user_data_dir(write=True) == user_data_home / userdirs.APP  # (a write resolves its own)
    # without an absolute $HOME the places come from the passwd entry, which may answer otherwise later:
    # a folder not found is resolved again each time
    monkeypatch.delenv("HOME")
    (user_data_home / userdirs.APP).rmdir()
    resolved.clear()
    assert userdirs.user_data_dir() is None and userdirs.user_data_dir() is None
    assert resolved == ["data", "data"]


def test_a_found_data_folder_others_can_now_write_is_refused_at_its_next_use(user_data_home: Path,
                                                                            monkeypatch: pytest.MonkeyPatch):
    """A folder found once is kept for the process, but only while it still passes the checks that found it: one
    made writable by others since is refused from the next call on, not used until the process ends."""
    from nubos_memory import userdirs

    resolved: list[str] = []
    real = userdirs._resolve
    monkeypatch.setattr(userdirs, "_resolve", lambda kind, *a, **k: resolved.append(kind) or real(kind, *a, **k))
    folder = user_data_home / userdirs.APP
    folder.mkdir(mode=0o700)
    assert userdirs.user_data_dir() == folder and userdirs.user_data_dir() == folder
    assert resolved == ["data"]  # (kept while it is safe)
    os.chmod(folder, 0o777)
    try:
        assert userdirs.user_data_dir() is None
        refused = userdirs.folder("data", write=False).refused or []
        assert [r["path"] for r in refused] == [str(folder)] and "writable by group or others" in refused[0]["why"]
        with pytest.raises(StoreError) as err:
            usermemory.user_root(strict=True)
        assert err.value.code == codes.USER_MEMORY_UNAVAILABLE
    finally:
        os.chmod(folder, 0o700)
    assert userdirs.user_data_dir() == folder


def test_a_warm_process_stops_using_a_user_memory_whose_folder_others_can_now_write(project: Path,
                                                                                   user_data_home: Path):
    """memory-serve keeps one ``Memory``: the user memory it opened is checked again at each use, so a folder
    made writable by others since is refused (``user-memory-unavailable``), as a new process would refuse it."""
    from nubos_memory import userdirs

    configure_user(user_data_home)  # (the user memory's own settings: the hash embedder, no model)
    mem = Memory.open(project, embedder=HashEmbedder("hash-64"))
    assert mem.for_scope("user", create=True).add(rec("a user note", "kept for every project"))["id"]
    assert mem.for_scope("user") is mem.for_scope("user")  # (kept while its folder is unchanged)
    folder = user_data_home / userdirs.APP
    os.chmod(folder, 0o777)
    try:
        for create in (False, True):
            with pytest.raises(StoreError) as err:
                mem.for_scope("user", create=create)
            assert err.value.code == codes.USER_MEMORY_UNAVAILABLE
    finally:
        os.chmod(folder, 0o700)
    assert mem.for_scope("user").query("user note")["hits"]


@pytest.mark.parametrize("verb", ["query", "context"])
def test_a_user_folder_refused_during_a_read_of_both_memories_leaves_the_projects_answer(
        both: Path, user_data_home: Path, monkeypatch: pytest.MonkeyPatch, verb: str):
    """A read over both memories decides at its start that the user memory is read; if its folder is made
    writable by others before the read opens it, the answer is the project's alone, with the refusal warned
    of as when it is refused from the start (not a ``user-memory-unavailable`` error)."""
    from nubos_memory import userdirs

    add(both, "the invoice total is in cents", "")
    add(both, "invoice totals are rounded per line", "", "--scope", "user", "--hot")
    mem = Memory.open(both)
    folder = user_data_home / userdirs.APP
    opening = Memory.for_scope

    def refused_on_opening(self: Memory, scope: str | None, **kwargs: bool) -> Memory:  # others get write access
        if scope == "user":  # just as the read opens the user memory, after it decided to read it
            os.chmod(folder, 0o777)
        return opening(self, scope, **kwargs)

    monkeypatch.setattr(Memory, "for_scope", refused_on_opening)
    try:
        out = mem.query("invoice totals") if verb == "query" else mem.context("invoice totals")
    finally:
        os.chmod(folder, 0o700)
    hits = out["hits"] if verb == "query" else [h for s in out["sections"].values() for h in s["hits"]]
    assert hits and {h["memory"] for h in hits} == {"project"}
    assert codes.USER_MEMORY_UNAVAILABLE in [w["code"] for w in out["warnings"]]
    monkeypatch.setattr(Memory, "for_scope", opening)  # (undo() would drop the data folder's setting too)
    assert {h["memory"] for h in mem.query("invoice totals")["hits"]} == {"project", "user"}  # safe again: both


def test_a_user_folder_refused_after_the_context_read_its_hot_records_gives_the_projects_block_alone(
        both: Path, user_data_home: Path, monkeypatch: pytest.MonkeyPatch):
    """memory-context reads the hot records, then queries: a user folder refused in between never gives a block
    that mixes the user memory's hot records with a project-only query; the block is made again from the
    project alone, warned of, and nothing is recorded in the user memory."""
    from nubos_memory import userdirs
    from nubos_memory.api import turn

    add(both, "the invoice total is in cents", "")
    add(both, "invoice totals are rounded per line", "", "--scope", "user", "--hot")
    usage = user_dir(user_data_home) / ".nubos-pilot" / "memory" / "usage.jsonl"
    before = usage.read_bytes() if usage.exists() else b""
    mem = Memory.open(both)
    folder = user_data_home / userdirs.APP
    querying = turn._relevant

    def refused_before_the_query(*args: object) -> object:
        os.chmod(folder, 0o777)
        return querying(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(turn, "_relevant", refused_before_the_query)
    try:
        out = mem.context("invoice totals")
    finally:
        os.chmod(folder, 0o700)
    assert {h["memory"] for s in out["sections"].values() for h in s["hits"]} == {"project"}
    assert codes.USER_MEMORY_UNAVAILABLE in [w["code"] for w in out["warnings"]]
    assert (usage.read_bytes() if usage.exists() else b"") == before

"""Rebuild, stats, fingerprints, pending records, damaged files (acceptance 15-21)."""

from __future__ import annotations

import hashlib
import json

import pytest

from .conftest import index_records, query, rec, run_cli, write_config

RECS = [rec(f"learning number {i}", f"body text about topic {i % 7} and widget {i}", id=f"id{i:03d}",
            tags=[f"t{i % 3}"]) for i in range(40)]


def folder(root):
    return root / ".nubos-pilot/memory"


def derived(root):
    m = json.loads((folder(root) / "manifest.json").read_text())
    return {k: folder(root) / v["name"] for k, v in m["files"].items()}, m


def sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def filled(project):
    assert index_records(project, RECS).code == 0
    return project


def stats(root):
    return run_cli(["memory-stats", "--root", str(root)]).json


def test_rebuild_is_byte_identical_and_reports(filled):
    r1 = run_cli(["memory-rebuild", "--root", str(filled)]).json
    files1, _ = derived(filled)
    digests1 = {k: sha(files1[k]) for k in ("index", "keymap", "vectors")}
    r2 = run_cli(["memory-rebuild", "--root", str(filled)]).json
    files2, m2 = derived(filled)
    assert {k: sha(files2[k]) for k in ("index", "keymap", "vectors")} == digests1
    assert r1["rebuilt"] and r1["count"] == 40 and r2["reused"] == 40 and r2["embedded"] == 0
    assert m2["rebuilt_at"] and m2["embedding"]["model"] == "hash-256"
    # Deleting every derived file and rebuilding gives the same bytes again (re-embedded).
    for p in folder(filled).iterdir():
        if p.name not in ("records.jsonl", ".gitignore", ".gitattributes"):
            p.unlink()
    r3 = run_cli(["memory-rebuild", "--root", str(filled)]).json
    files3, _ = derived(filled)
    assert r3["embedded"] == 40
    assert {k: sha(files3[k]) for k in ("index", "keymap", "vectors")} == digests1


def test_incremental_adds_match_rebuild_results(filled):
    # Appends in several commits: each one a segment, then one merge that copies the base's rows and adds them.
    for i in range(3):
        extra = [rec(f"appended {['alpha', 'beta', 'gamma'][i]} {['one', 'two', 'three', 'four'][j]}",
                     f"widget topic {j}", id=f"app{i}{j}") for j in range(4)]
        assert index_records(filled, extra).code == 0
    files, manifest = derived(filled)
    assert manifest["appended_to"] is not None and manifest["covers"]["count"] == 52
    assert [seg["rows"] for seg in manifest["segments"]] == [4, 4, 4]  # each commit: one small segment
    from nubos_memory import Memory

    assert Memory.open(filled).vectors.merge_segments("test")  # a merge copies the base's rows, adds the rest
    files, manifest = derived(filled)
    assert not manifest.get("segments")
    incremental = sha(files["vectors"])
    before = query(filled, "widget 7 topic").json["hits"]
    run_cli(["memory-rebuild", "--root", str(filled)])
    after = query(filled, "widget 7 topic").json["hits"]
    assert [(h["id"], h["score"]) for h in before] == [(h["id"], h["score"]) for h in after]
    files, manifest = derived(filled)
    assert manifest["appended_to"] is None
    assert sha(files["vectors"]) == incremental  # the appended file is exactly what a rebuild writes


def test_a_warm_reader_follows_appended_generations(filled):
    """A long-lived Memory keeps its label mapping across appends by other writers and still
    finds every record, old and new, by its vector."""
    from nubos_memory import Memory

    reader = Memory.open(filled)
    assert reader.query("widget 3", k=3)["degraded"] is None
    for i in range(2):
        assert index_records(filled, [rec(f"zebra crossing {i}", "stripes", id=f"z{i}")]).code == 0
        res = reader.query(f"zebra crossing {i}", k=2)
        assert res["hits"][0]["id"] == f"z{i}" and res["hits"][0]["retrieval"] == "hybrid"
        assert res["counts"]["pending"] == 0
    _, labels = reader.snap.vectors()[1:]
    assert (labels >= 0).all() and len(set(labels.tolist())) == len(labels)


def test_stats_report_and_empty_store(project, filled):
    s = stats(filled)
    for key in ("count", "dim", "model", "schema_version", "alpha", "created_at", "rebuilt_at", "consistency"):
        assert key in s
    assert (s["count"], s["dim"], s["schema_version"]) == (40, 256, 2)
    c = s["consistency"]
    assert (c["records"], c["keymap"], c["index"], c["pending"]) == (40, 40, 40, 0) and c["consistent"]
    assert c["fingerprint_match"] is True


def test_stats_on_empty_store_reports_zeros(tmp_path):
    root = tmp_path / "empty"
    root.mkdir()
    run_cli(["memory-init", "--root", str(root)])
    s = stats(root)
    assert s["count"] == 0 and s["consistency"]["keymap"] == 0 and s["consistency"]["pending"] == 0
    assert s["dim"] == 384 and s["model"] == "sentence-transformers/all-MiniLM-L6-v2"


@pytest.mark.parametrize("change", [{"model": "hash-128"}, {"provider": "local"}])
def test_model_change_requires_rebuild_and_never_mixes(filled, change):
    write_config(filled, **change) if "provider" not in change else write_config(
        filled, provider="local", model="/nonexistent/model")
    _, m_before = derived(filled)
    q = query(filled, "widget 3")
    assert q.code == 0
    assert q.json["degraded"]["code"] in ("memory-rebuild-required",)
    d = q.json["degraded"]["details"]
    assert d["index"]["model"] == "hash-256" and d["config"]["model"] != "hash-256"
    assert all(h["retrieval"] == "bm25" for h in q.json["hits"])
    add = index_records(filled, [rec("new after model change", id="new1")])
    assert add.code == 0 and add.json["added"] == 1
    assert add.json["degraded"]["code"] == "memory-rebuild-required"
    _, m_after = derived(filled)
    assert m_after == m_before  # the index was left alone
    s = stats(filled)
    assert s["consistency"]["fingerprint_match"] is False and not s["consistency"]["consistent"]
    if "model" in change:
        r = run_cli(["memory-rebuild", "--root", str(filled)])
        assert r.code == 0 and r.json["count"] == 41 and r.json["model"] == "hash-128"
        assert query(filled, "widget 3").json["degraded"] is None
        assert stats(filled)["consistency"]["fingerprint_match"] is True


def test_records_appended_outside_index_are_picked_up(filled):
    line = json.dumps({"id": "outside", "type": "learning", "phase": None, "title": "hand added zebra note",
                       "body": "", "tags": [], "provenance": None, "created_at": "2026-01-01T00:00:00Z"})
    with (folder(filled) / "records.jsonl").open("a") as f:
        f.write(line + "\n")
    assert stats(filled)["consistency"]["pending"] == 1
    q = query(filled, "zebra")
    assert q.json["hits"][0]["id"] == "outside" and q.json["hits"][0]["retrieval"] == "hybrid"
    s = stats(filled)
    assert s["consistency"]["pending"] == 0 and s["consistency"]["keymap"] == 41


def test_no_temp_files_and_old_generations_removed(filled):
    index_records(filled, [rec("another", id="zz")])
    names = sorted(p.name for p in folder(filled).iterdir())
    assert not [n for n in names if n.endswith(".tmp")]
    assert len([n for n in names if n.startswith("index-")]) == 1
    assert len([n for n in names if n.startswith("keymap-")]) == 1


@pytest.mark.parametrize("which, code", [("keymap", "keymap-corrupt"), ("index", "index-corrupt"),
                                         ("vectors", "vectors-corrupt")])
@pytest.mark.parametrize("damage", ["truncate", "delete", "garble"])
def test_damaged_derived_file_is_named_and_rebuild_repairs(filled, which, code, damage):
    files, _ = derived(filled)
    path = files[which]
    if damage == "delete":
        path.unlink()
        code = "index-missing"
    elif damage == "truncate":
        path.write_bytes(path.read_bytes()[:10])
    else:
        data = bytearray(path.read_bytes())
        data[: min(64, len(data))] = b"\xff" * min(64, len(data))
        path.write_bytes(bytes(data))
    q = query(filled, "widget 5")
    if damage == "garble" and which == "index":
        # Same size, garbled bytes: hnswlib is not read on small memories, so stats cannot tell either;
        # what matters is that nothing crashes and the answer stays correct.
        assert q.code == 0
    else:
        assert q.code == 0 and q.json["degraded"]["code"] == code
        assert q.json["hits"] and all(h["retrieval"] == "bm25" for h in q.json["hits"])
        assert any(p["code"] == code for p in stats(filled)["consistency"]["problems"])
    assert run_cli(["memory-rebuild", "--root", str(filled)]).code == 0
    q = query(filled, "widget 5")
    assert q.json["degraded"] is None
    assert stats(filled)["consistency"]["consistent"]


def test_corrupt_manifest_is_reported_never_overwritten(filled):
    mpath = folder(filled) / "manifest.json"
    mpath.write_text("{ this is not json")
    q = query(filled, "widget 2")
    assert q.code == 0 and q.json["degraded"]["code"] == "manifest-corrupt"
    add = index_records(filled, [rec("still saved", id="saved1")])
    assert add.code == 0 and add.json["added"] == 1 and add.json["degraded"]["code"] == "manifest-corrupt"
    assert mpath.read_text() == "{ this is not json"
    s = stats(filled)
    assert any(p["code"] == "manifest-corrupt" for p in s["consistency"]["problems"])
    assert run_cli(["memory-rebuild", "--root", str(filled)]).json["count"] == 41
    assert json.loads(mpath.read_text())["covers"]["count"] == 41


def test_corrupt_lines_are_skipped_counted_and_never_block_writes(filled):
    path = folder(filled) / "records.jsonl"
    first = path.read_bytes().count(b"\n") + 1  # the line number the garbage starts at
    with path.open("ab") as f:
        f.write(b"this is garbage\n")
        f.write(b'{"id": "bad-type", "type": 7, "title": "x"}\n')
        f.write(b"\xff\xfe not utf8\n")
    q = query(filled, "widget 1")
    assert q.code == 0
    warned = [w for w in q.json["warnings"] if w["code"] == "records-corrupt-line"]
    assert [w["line"] for w in warned] == [first, first + 1, first + 2]
    assert index_records(filled, [rec("after garbage", id="after")]).json["added"] == 1
    s = stats(filled)
    assert s["count"] == 41 and s["consistency"]["corrupt_count"] == 3
    assert run_cli(["memory-rebuild", "--root", str(filled)]).json["count"] == 41
    assert b"this is garbage" in path.read_bytes()  # nothing is dropped from the file


def test_torn_last_line_is_recovered_on_next_write(filled):
    path = folder(filled) / "records.jsonl"
    lines = path.read_bytes().count(b"\n")
    with path.open("ab") as f:
        f.write(b'{"id": "torn", "type": "learning", "tit')
    r = index_records(filled, [rec("written after the crash", id="after-crash")])
    assert r.json["recovered"]["action"] == "set-aside" and r.json["recovered"]["line"] == lines + 1
    assert (folder(filled) / "records.jsonl.torn").read_bytes().startswith(b'{"id": "torn"')
    text = path.read_text().splitlines()
    assert json.loads(text[-1])["id"] == "after-crash" and len(text) == lines + 1


def test_a_reader_settles_a_crashed_writers_torn_line_when_no_writer_runs(filled):
    path = folder(filled) / "records.jsonl"
    good = path.read_bytes()
    with path.open("ab") as f:
        f.write(b'{"id": "torn", "type": "learning", "tit')
    from nubos_memory import Memory

    holder = Memory.open(filled)
    with holder.store.lock("a writer"):  # a write in progress: a reader leaves the tail alone
        q = query(filled, "widget")
        assert q.code == 0 and any(w["code"] == "records-unfinished-write" for w in q.json["warnings"])
        assert path.read_bytes().endswith(b'"tit')
    assert query(filled, "widget").json["warnings"] == []  # no writer now: the leftovers are settled
    assert path.read_bytes() == good
    assert (folder(filled) / "records.jsonl.torn").read_bytes() == b'{"id": "torn", "type": "learning", "tit\n'


def test_complete_record_missing_newline_is_kept(filled):
    path = folder(filled) / "records.jsonl"
    lines = path.read_bytes().count(b"\n")
    with path.open("a") as f:
        f.write(json.dumps({"id": "nonl", "type": "learning", "title": "no newline"}))
    r = index_records(filled, [rec("next", id="next")])
    assert r.json["recovered"] == {"line": lines + 1, "action": "completed", "id": "nonl"}
    assert stats(filled)["count"] == 42

"""Writing: memory-add, memory-index, validation, durability (acceptance 1-6, 23, 24)."""

from __future__ import annotations

import json
import uuid

import pytest

from nubos_memory import Memory
from nubos_memory.store.cache import DerivedCache

from .conftest import index_records, rec, run_cli, write_config


def lines(root):
    """The record lines of the log (operation lines such as group headers left out)."""
    text = (root / ".nubos-pilot/memory/records.jsonl").read_text().splitlines()
    return [line for line in text if '"op":' not in line[:8]]


def test_add_prints_new_uuid_and_persists(project):
    r = run_cli(["memory-add", "--root", str(project), "--type", "learning", "--title", "Use jose for JWT",
                 "--body", "jsonwebtoken lacks EdDSA", "--tags", "auth, jwt", "--provenance", "verified",
                 "--phase", "M001-S001-T0001"])
    assert r.code == 0, r.err
    doc = r.json
    assert uuid.UUID(doc["id"]).version == 4
    assert doc["added"] == 1 and doc["skipped"] == 0 and doc["degraded"] is None
    stored = json.loads(lines(project)[0])
    assert stored == {**stored, "id": doc["id"], "type": "learning", "title": "Use jose for JWT",
                      "tags": ["auth", "jwt"], "provenance": "VERIFIED", "phase": "M001-S001-T0001"}
    # A new process sees it.
    assert Memory.open(project).scan().records[0]["id"] == doc["id"]


def test_add_body_from_file_and_stdin(project, tmp_path):
    body_file = tmp_path / "body.md"
    body_file.write_text("from a file ✓")
    a = run_cli(["memory-add", "--root", str(project), "--type", "research", "--title", "t1",
                 "--body-file", str(body_file)])
    b = run_cli(["memory-add", "--root", str(project), "--type", "research", "--title", "t2"], stdin="from stdin")
    assert a.code == b.code == 0
    bodies = [json.loads(x)["body"] for x in lines(project)]
    assert bodies == ["from a file ✓", "from stdin"]
    missing = run_cli(["memory-add", "--root", str(project), "--type", "research", "--title", "t3",
                       "--body-file", str(tmp_path / "nope")])
    assert missing.code == 5 and missing.error["code"] == "body-file-unreadable"


def test_index_accepts_json_array_and_jsonl(project, tmp_path):
    arr = tmp_path / "a.json"
    arr.write_text(json.dumps([rec("alpha one", id="a1"), rec("alpha two", id="a2")]))
    jl = tmp_path / "b.jsonl"
    jl.write_text(json.dumps(rec("beta", id="b1")) + "\n\n" + json.dumps(rec("gamma", id="b2")) + "\n")
    r1 = run_cli(["memory-index", "--root", str(project), "--records-file", str(arr)])
    r2 = run_cli(["memory-index", "--root", str(project), "--records-file", str(jl)])
    assert (r1.json["added"], r1.json["skipped"]) == (2, 0)
    assert (r2.json["added"], r2.json["skipped"]) == (2, 0)
    assert len(lines(project)) == 4


def test_index_bad_file_names_first_bad_line_and_writes_nothing(project, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(rec("fine")) + "\n" + "{not json at all\n" + json.dumps(rec("also fine")) + "\n")
    r = run_cli(["memory-index", "--root", str(project), "--records-file", str(bad)])
    assert r.code == 5
    assert r.error["code"] == "records-file-invalid"
    assert r.error["details"]["line"] == 2 and r.error["details"]["excerpt"].startswith("{not json")
    assert not (project / ".nubos-pilot/memory/records.jsonl").exists()
    broken_array = tmp_path / "bad.json"
    broken_array.write_text('[\n {"type": "learning", "title": "x"},\n {oops}\n]')
    r = run_cli(["memory-index", "--root", str(project), "--records-file", str(broken_array)])
    assert r.error["code"] == "records-file-invalid" and r.error["details"]["line"] == 3


def test_readding_existing_id_is_skipped_and_batch_duplicates_collapse(project):
    first = index_records(project, [rec("one", id="x1"), rec("one again", id="x1"), rec("two", id="x2")])
    assert (first.json["added"], first.json["skipped"]) == (2, 1)
    size = (project / ".nubos-pilot/memory/records.jsonl").stat().st_size
    again = index_records(project, [rec("one", id="x1")])
    assert (again.json["added"], again.json["skipped"]) == (0, 1)
    assert (project / ".nubos-pilot/memory/records.jsonl").stat().st_size == size
    add = run_cli(["memory-add", "--root", str(project), "--type", "learning", "--title", "dup", "--id", "x2"])
    assert add.code == 0 and add.json["id"] == "x2" and add.json["added"] == 0


@pytest.mark.parametrize(
    "bad, code, field",
    [
        ({"type": "poem", "title": "t"}, "record-invalid-type", "type"),
        ({"title": "t"}, "record-missing-type", "type"),
        ({"type": "learning"}, "record-missing-title", "title"),
        ({"type": "learning", "title": "   "}, "record-missing-title", "title"),
        ({"type": "learning", "title": "t", "tags": "a,b"}, "record-invalid-tags", "tags"),
        ({"type": "learning", "title": "t", "tags": ["ok", 3]}, "record-invalid-tags", "tags"),
        ({"type": "learning", "title": "t", "provenance": "RUMOUR"}, "record-invalid-provenance", "provenance"),
        ({"type": "learning", "title": "t", "id": "has space"}, "record-invalid-id", "id"),
        ({"type": "learning", "title": "t", "created_at": "yesterday"}, "record-invalid-created-at", "created_at"),
        ({"type": "learning", "title": "t", "body": 5}, "record-invalid-body", "body"),
        ({"type": "learning", "title": "t", "body": "x" * 100_001}, "record-too-large", "body"),
        ({"type": "learning", "title": "t", "colour": "red"}, "record-unknown-field", "colour"),
        ("just a string", "record-not-object", "record"),
    ],
)
def test_whole_batch_is_validated_before_writing(project, bad, code, field):
    r = index_records(project, [rec("good one", id="g1"), bad])
    assert r.code == 5
    assert r.error["code"] == code
    err = r.error["details"]["errors"][0]
    assert err["index"] == 1 and err["field"] == field
    assert "record 1" in r.error["message"]
    assert not (project / ".nubos-pilot/memory/records.jsonl").exists()


def test_error_names_record_by_id(project):
    r = index_records(project, [{"id": "lrn-7", "type": "learning", "title": ""}])
    assert r.error["details"]["errors"][0]["id"] == "lrn-7" and "lrn-7" in r.error["message"]


def test_custom_types_from_config(project):
    write_config(project, types=["decision"])
    assert index_records(project, [rec("we chose postgres", type="decision")]).code == 0


def test_record_is_durable_before_index_and_retry_after_index_failure(project, monkeypatch):
    """Acceptance 5 and 6: the line is fsynced first; a failed index write loses nothing."""
    calls = []

    def failing_commit(self, **kw):
        calls.append((project / ".nubos-pilot/memory/records.jsonl").read_text())
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(DerivedCache, "commit", failing_commit)
    r = index_records(project, [rec("survives", id="s1")])
    assert r.code == 0
    assert r.json["degraded"]["code"] == "index-write-failed"
    assert '"s1"' in calls[0]  # the record was on disk when the index write began
    monkeypatch.undo()
    retry = index_records(project, [rec("survives", id="s1")])
    assert (retry.json["added"], retry.json["skipped"]) == (0, 1)
    assert len(lines(project)) == 1
    # The pending record is indexed by the next query.
    q = run_cli(["memory-query", "--root", str(project), "survives"])
    assert q.json["hits"][0]["id"] == "s1" and q.json["hits"][0]["retrieval"] == "hybrid"
    stats = run_cli(["memory-stats", "--root", str(project)]).json
    assert stats["consistency"]["pending"] == 0 and stats["consistency"]["consistent"]


def test_file_is_only_appended(project):
    index_records(project, [rec("first", id="f1")])
    before = (project / ".nubos-pilot/memory/records.jsonl").read_bytes()
    index_records(project, [rec("second", id="f2")])
    after = (project / ".nubos-pilot/memory/records.jsonl").read_bytes()
    assert after.startswith(before) and len(after) > len(before)


def test_disabled_memory_refuses_every_verb_and_writes_nothing(tmp_path):
    root = tmp_path / "p"
    (root / ".nubos-pilot").mkdir(parents=True)
    (root / ".nubos-pilot/config.json").write_text(json.dumps({"memory": {"enabled": False}}))
    for argv in (["memory-add", "--type", "learning", "--title", "t", "--body", "b"],
                 ["memory-index", "--records-file", "-"], ["memory-query", "x"], ["memory-rebuild"],
                 ["memory-stats"]):
        r = run_cli([*argv, "--root", str(root)], stdin="[]")
        assert r.code == 4 and r.error["code"] == "memory-disabled" and r.out == ""
        s = run_cli([*argv, "--root", str(root), "--skip-if-disabled"], stdin="[]")
        assert s.code == 0 and s.json == {"skipped": True, "reason": "memory-disabled"}
    assert not (root / ".nubos-pilot/memory").exists()


def test_skip_if_disabled_does_not_swallow_other_errors(project):
    r = run_cli(["memory-add", "--root", str(project), "--type", "poem", "--title", "t", "--skip-if-disabled"])
    assert r.code == 5 and r.error["code"] == "record-invalid-type"


def test_envelopes(project):
    ok = run_cli(["memory-stats", "--root", str(project)])
    assert ok.code == 0 and ok.err == "" and len(ok.out.strip().splitlines()) == 1
    bad = run_cli(["memory-query", "--root", str(project), "--k", "0", "x"])
    assert bad.out == "" and set(json.loads(bad.err)) == {"error"}
    assert set(bad.error) == {"code", "message", "details"} and bad.code != 0
    usage = run_cli(["memory-add", "--root", str(project)])
    assert usage.code == 2 and usage.error["code"] == "usage"
    nothing = run_cli([])
    assert nothing.code == 2 and nothing.error["code"] == "usage"


def test_real_entry_point_across_processes(project, tmp_path):
    """The installed entry point (python -m nubos_memory) and bin/np-tools, in separate processes."""
    from .conftest import REPO, run_sub

    a = run_sub(["memory-add", "--root", str(project), "--type", "handoff", "--title", "handoff for M002",
                 "--body", "invoice PDF rendering is open"])
    assert a.code == 0, a.err
    import subprocess

    proc = subprocess.run([str(REPO / "bin/np-tools"), "memory-query", "--root", str(project), "invoice PDF"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["hits"][0]["id"] == a.json["id"]


def test_a_batch_is_measured_in_bytes_whether_read_as_bytes_or_as_text(monkeypatch):
    """The records file's text, as the caller read it, is held to the same limit as its bytes (found by
    review: characters were counted, so multibyte text could pass the limit)."""
    from nubos_memory.errors import InputError
    from nubos_memory.interfaces import batchfile

    monkeypatch.setattr(batchfile, "MAX_BATCH_BYTES", 100)
    text = json.dumps({"type": "learning", "title": "t", "body": "é" * 50}, ensure_ascii=False) + "\n"
    assert len(text) <= 100 < len(text.encode())
    for data in (text, text.encode()):
        with pytest.raises(InputError) as got:
            batchfile.parse_batch(data, "/abs/x.jsonl")
        assert got.value.code == "records-file-too-large" and got.value.details["source"] == "/abs/x.jsonl"
    assert len(batchfile.parse_batch(json.dumps({"type": "learning", "title": "ok"}), "-")) == 1

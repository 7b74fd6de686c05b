"""records.jsonl reading: incremental refresh sees appends, and re-parses after edits."""

from __future__ import annotations

import json

from nubos_memory.store.recordlog import GUARD, RecordLog


def line(i, **kw):
    return json.dumps({"id": f"r{i}", "type": "learning", "phase": None, "title": f"title {i}", "body": "b" * 50,
                       "tags": [], "provenance": None, "created_at": "2026-01-01T00:00:00Z", **kw}) + "\n"


def test_refresh_parses_only_appends(tmp_path):
    path = tmp_path / "records.jsonl"
    path.write_text("".join(line(i) for i in range(200)))
    log = RecordLog(path)
    scan = log.scan()
    assert len(scan.records) == 200 and scan.applied == path.stat().st_size
    assert log.refresh(scan) is scan  # unchanged: same object, nothing parsed
    with path.open("a") as f:
        # a new record, a corrupt line, a duplicate id with other content, the same line again (written later)
        f.write(line(200) + "garbage\n" + line(5, body="changed") + line(6, created_at="2026-02-01T00:00:00Z"))
        f.write('{"id": "partial"')
    again = log.refresh(scan)
    assert again is scan and again.generation == 0
    assert [r["id"] for r in again.records[-1:]] == ["r200"]
    assert again.corrupt[-1]["line"] == 202 and again.duplicates == [{"line": 203, "id": "r5", "first_line": 6}]
    assert again.repeats == 1  # the same record twice is no problem worth a warning (issue 20 item 11)
    assert again.partial_tail["line"] == 205
    with path.open("a") as f:
        f.write(', "type": "learning", "title": "now complete"}\n')
    done = log.refresh(scan)
    assert done.records[-1]["id"] == "partial" and done.partial_tail is None
    assert done.records == RecordLog(path).scan().records


def test_edit_before_offset_forces_full_reparse(tmp_path):
    path = tmp_path / "records.jsonl"
    path.write_text("".join(line(i) for i in range(100)))
    log = RecordLog(path)
    scan = log.scan()
    text = path.read_text().replace("title 99", "title XX")  # inside the guarded block
    path.write_text(text + line(100))
    fresh = log.refresh(scan)
    assert fresh is not scan and fresh.generation == 1
    assert fresh.records[99]["title"] == "title XX" and len(fresh.records) == 101
    assert GUARD > 0


def test_replaced_or_shrunk_file_reparses(tmp_path):
    path = tmp_path / "records.jsonl"
    path.write_text("".join(line(i) for i in range(10)))
    log = RecordLog(path)
    scan = log.scan()
    path.unlink()
    path.write_text(line(42))
    fresh = log.refresh(scan)
    assert [r["id"] for r in fresh.records] == ["r42"]


def test_hand_written_lines_are_fully_validated(tmp_path):
    path = tmp_path / "records.jsonl"
    path.write_text(json.dumps({"id": "ok", "type": "learning", "title": "short form"}) + "\n"
                    + json.dumps({"id": "bad", "type": "learning", "title": "x", "provenance": "NOPE"}) + "\n")
    scan = RecordLog(path).scan()
    assert [r["id"] for r in scan.records] == ["ok"] and scan.records[0]["tags"] == []
    assert "record-invalid-provenance" in scan.corrupt[0]["reason"]

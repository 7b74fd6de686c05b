"""The log state's records as a list decoded on first read (issue 27; nubos_memory/recordlist.py): it
behaves as the list of records did, and a new process restored from the checkpoint decodes only what
it reads."""

from __future__ import annotations

from pathlib import Path

import pytest

from nubos_memory.api.memory import Memory
from nubos_memory.columns import Coded
from nubos_memory.recordlist import COLUMNS, RecordList
from nubos_memory.store import checkpoint

from .conftest import index_records, memory_dir, rec


def records(n: int) -> list[dict]:
    return [{"id": f"r{i}", "type": "learning" if i % 2 else "decision", "title": f"t{i}", "body": "b",
             "tags": [f"g{i % 3}"], **({"domain": "ops"} if i % 4 == 0 else {})} for i in range(n)]


def kept(recs: list[dict]) -> RecordList:
    """What a checkpoint restores: the records encoded, then read back from the bytes."""
    plain = RecordList()  # (a state read from the log: plain objects)
    for r in recs:
        plain.append(r)
    blob, offsets, columns = plain.encode()
    return RecordList(memoryview(blob), offsets, columns)


def test_it_behaves_as_the_list_it_replaces():
    recs = records(7)
    got = kept(recs)
    assert len(got) == 7 and list(got) == recs and got[0] == recs[0] and got[-1] == recs[-1]
    assert got[2:5] == recs[2:5] and got[::-2] == recs[::-2] and got[5:] == recs[5:]
    with pytest.raises(IndexError):
        got[7]
    with pytest.raises(IndexError):
        got[-8]
    extra = {"id": "x", "type": "learning", "title": "x", "body": "y"}
    got.append(extra)  # appended after the kept part
    recs.append(extra)
    assert len(got) == 8 and got[-1] is extra and list(got) == recs and got[6:] == recs[6:]
    moved = {**recs[1], "anchors": [{"path": "a.py"}], "type": "decision"}
    got[1] = moved  # an anchor op replaces a kept record
    assert got[1] == moved and got.values("type")[1] == "decision"
    for name in COLUMNS:  # a column is what the records hold, kept or appended, from any start
        assert got.values(name) == [r.get(name) for r in [recs[0], moved, *recs[2:]]]
        assert got.values(name, 5) == [r.get(name) for r in recs[5:]]
        assert got.values(name, 8) == []
        assert [got.value(i, name) for i in range(8)] == got.values(name)
        assert got.values_at([7, 0, 3, 3, 6], name) == [got.value(i, name) for i in (7, 0, 3, 3, 6)]
    with pytest.raises(IndexError):
        got[-9] = extra  # (before the first: never a column written through a wrapped index)
    with pytest.raises(IndexError):
        got[8] = extra
    assert got == [recs[0], moved, *recs[2:]] and got.values("id")[0] == "r0"
    again = RecordList(*got.encode())  # a list that was read, replaced and appended to encodes all of it
    assert list(again) == [recs[0], moved, *recs[2:]]


def test_values_at_reads_columns_as_held_without_decoding():
    """A query's candidates' field in one pass (``values_at``): from a checkpoint's coded column, a plain
    column or the records themselves, the kept part and the appended one alike."""
    recs = records(9)
    blob, offsets, columns = kept(recs).encode()
    extra = {"id": "x", "type": "learning", "title": "x", "body": "y", "importance": 0.25}
    for held in ({n: Coded.of(v) for n, v in columns.items()}, columns, {}):
        got = RecordList(memoryview(blob), offsets, held)
        got.append(extra)
        for name in COLUMNS:
            want = [r.get(name) for r in [*recs, extra]]
            assert got.values_at([9, 0, 8, 4], name) == [want[i] for i in (9, 0, 8, 4)]
        assert got.decoded == (0 if held else 3)  # (without columns: the records asked for)


def test_it_decodes_a_record_only_when_read_and_once():
    got = kept(records(100))
    assert got.decoded == 0
    assert got.values("id")[42] == "r42" and got.values("tags")[4] == ["g1"] and got.decoded == 0  # columns
    assert got.value(7, "domain") is None and got.value(8, "domain") == "ops" and got.decoded == 0
    first = got[42]
    assert got.decoded == 1 and got[42] is first  # kept, as a list's item is the same object each time
    with pytest.raises(ValueError):
        RecordList(b"{}", [0, 2], {"id": ["a", "b"]})  # a column longer than the records


def test_a_new_process_restored_from_the_checkpoint_decodes_its_hits_not_its_candidates(
        project: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(checkpoint, "MIN_TAIL", 1)
    assert index_records(project, [rec(f"note {i} about topic {i % 7}", f"body {i}", id=f"n{i}")
                                   for i in range(1200)]).code == 0
    assert (memory_dir(project) / checkpoint.NAME).exists()
    mem = Memory.open(project)  # a new process: its state comes from the checkpoint
    hits = mem.query("topic 3", k=5)["hits"]
    scan = mem.scan()
    assert hits and len(scan.records) == 1200
    # the hits' records and the near duplicates collapsed into them, not every candidate (their importance
    # is a column) nor the 1,200 records
    shown = sum(1 + h.get("collapsed", {}).get("count", 0) for h in hits)
    assert 0 < scan.records.decoded <= shown, (scan.records.decoded, shown)
    assert {h["id"] for h in hits} <= {r["id"] for r in scan.records}

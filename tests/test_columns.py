"""A restored log state's per-record lists kept in binary (issue 27; nubos_memory/columns.py and
search/facets.py): each behaves as the list or dict it replaces, and a new process restored from a
checkpoint answers a query and applies a tail of new lines without decoding every id."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from nubos_memory import columns
from nubos_memory.api.memory import Memory
from nubos_memory.columns import Coded, Hex, Lines, Positions, pack, unpack
from nubos_memory.fsio import dumps
from nubos_memory.search.facets import Facet
from nubos_memory.store import cache, checkpoint
from nubos_memory.store.cache import keymap_parts
from nubos_memory.trust import sign

from .conftest import index_records, memory_dir, rec


def roundtrip(values, kind):
    desc, data = pack(values, kind)
    return desc, unpack(desc, memoryview(data))


def test_each_kind_reads_back_what_was_packed_and_behaves_as_a_list():
    hashes = [hashlib.sha256(str(i).encode()).hexdigest()[:32] for i in range(50)]
    desc, got = roundtrip(hashes, "hex")
    assert desc["kind"] == "hex" and isinstance(got, Hex) and len(got) == 50
    assert list(got) == hashes and got[3] == hashes[3] and got[-1] == hashes[-1] and got[5:9] == hashes[5:9]
    assert got.raw(2, 4) == bytes.fromhex(hashes[2] + hashes[3]) and got.raw(0, 51) is None
    got.append("ab" * 16)  # (content hashes of records appended after the checkpoint)
    assert got[50] == "ab" * 16 and got.raw(49, 51) is None and got == [*hashes, "ab" * 16]
    assert (got + ["cd" * 16])[-2:] == ["ab" * 16, "cd" * 16] and len(got) == 51  # noqa: RUF005 (the operator is what is tested)
    assert got[0:2] == hashes[0:2] and got[49:51] == [hashes[49], "ab" * 16]  # (a slice within the packed part)
    got[0] = "cd" * 16  # a replaced item: every item is a string from then on, still in order
    assert got == ["cd" * 16, *hashes[1:], "ab" * 16]
    with pytest.raises(IndexError):
        got[52]

    ids = [f"r{i}" for i in range(30)] + ["ünï-cödé"]
    desc, got = roundtrip(ids, "lines")
    assert desc["kind"] == "lines" and isinstance(got, Lines)
    assert len(got) == 31 and got[30] == "ünï-cödé" and got[-2] == "r29" and got[3:6] == ids[3:6] and got[6:3] == []
    assert got[::5] == ids[::5] and list(got) == ids
    assert got.raw(3, 5) == b"r3\nr4\n" and got.raw(5, 5) == b"" and got.raw(29, 31) == "r29\nünï-cödé\n".encode()
    got[1] = "moved"
    assert got[1] == "moved" and got.values()[1] == "moved" and got.raw(0, 2) is None and got[2] == "r2"
    more = got + ["x", "y"]  # (shares what it holds: nothing copied but the strings added)  # noqa: RUF005
    assert len(more) == 33 and more[31:] == ["x", "y"] and more[:2] == ["r0", "moved"] and len(got) == 31
    few = roundtrip(list("abcde"), "lines")[1] + list("fghij")
    assert few[0:3] == list("abc") and few[3:7] == list("defg") and few[-2:] == list("ij") and few[5:5] == []
    short = roundtrip(["aa", "bb", "cc"], "hex")[1] + ["dd", "ee", "ff"]  # (found by review: a slice within
    assert short[0:1] == ["aa"] and short[1:4] == ["bb", "cc", "dd"]  # the packed part took appended items)
    _, fresh = roundtrip(ids, "lines")
    grown = fresh + ["x"]  # noqa: RUF005
    assert grown.raw(0, 31) == fresh.raw(0, 31) and grown.raw(0, 32) is None and grown[-1] == "x" and grown == [*ids, "x"]

    values = ["learning", None, "decision", ["a", "b"], 1, True, ["a", "b"], "learning"]
    desc, got = roundtrip(values, "coded")
    assert isinstance(got, Coded) and len(got.distinct) == 6  # 1 and True are two values, the lists one
    assert got[:] == values and got[4] == 1 and got[5] is True and got[-1] == "learning"
    got[1] = "new"
    assert got[1] == "new" and len(got.distinct) == 7

    assert list(roundtrip([3, 1 << 40, -2], "q")[1]) == [3, 1 << 40, -2]
    assert list(roundtrip([7, 4_000_000_000], "I")[1]) == [7, 4_000_000_000]


def test_values_a_kind_cannot_hold_are_kept_as_json():
    assert roundtrip(["a\nb", "c"], "lines") == ({"kind": "json", "count": 2}, ["a\nb", "c"])
    assert roundtrip(["ab", "abcd"], "hex")[0]["kind"] == "json"  # (not of one length)
    assert roundtrip(["AB"], "hex")[0]["kind"] == "json"  # (not lowercase)
    assert roundtrip([], "hex")[1] == []
    with pytest.raises(ValueError):
        unpack({"kind": "q", "count": 3}, b"\0" * 16)  # a column of another length
    with pytest.raises(ValueError):
        unpack({"kind": "lines", "count": 1}, b"\0" * 8)


@pytest.mark.parametrize("collide", [False, True])
def test_positions_answers_as_the_dict_it_replaces(monkeypatch: pytest.MonkeyPatch, collide: bool):
    if collide:  # every id one key: told apart by the id alone
        monkeypatch.setattr(columns, "crc", lambda rid: 7)
    ids = [f"id{i}" for i in range(40)] + ["id3", "id10"]  # revived ids: their latest position counts
    plain = dict(zip(ids, range(len(ids))))
    keys, at = Positions.index(plain)
    _, lines = roundtrip(ids, "lines")
    pos = Positions(keys, at, lines)
    assert all(pos[rid] == p for rid, p in plain.items()) and pos["id3"] == 40 and pos.get("nope") is None
    assert "id39" in pos and "id40" not in pos and pos.get(None) is None  # type: ignore[arg-type]
    pos["new"] = 42  # a record line applied after the checkpoint
    pos["id5"] = 43
    assert pos["new"] == 42 and pos["id5"] == 43 and pos._dict is None  # (looked up, not made)
    plain.update(new=42, id5=43)
    assert dict(pos) == plain and list(pos) == list(plain) and len(pos) == len(plain)  # the same order too
    assert dict(pos.items()) == plain
    del pos["new"]
    assert "new" not in pos and len(pos) == len(plain) - 1


def test_a_facet_codes_appended_and_checkpointed_values_alike():
    facet = Facet()
    facet.extend(["a", None, "b"])
    facet.extend_coded(Coded.of(["b", "c", None, "a", "c"]), start=1)  # its own codes, remapped
    facet.extend(["c"] * 100)  # (grown past its first block)
    assert len(facet) == 107 and [facet.distinct[c] for c in facet.codes[:7]] == ["a", None, "b", "c", None, "a", "c"]
    assert facet.where(lambda v: v == "c").sum() == 102 and facet.where(lambda v: v == "a", 4).tolist() == [
        True, False, False, False]
    assert facet.counts(np.arange(107) < 3) == {"a": 1, None: 1, "b": 1} and set(facet.present()) == {"a", None, "b", "c"}
    assert Facet().where(lambda v: True, 0).tolist() == []


def test_a_new_process_applies_a_tail_and_filters_without_decoding_every_id(project: Path,
                                                                           monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(checkpoint, "MIN_TAIL", 1)
    recs = [rec(f"note {i} about topic {i % 7}", f"body {i}", id=f"n{i}", tags=[f"t{i % 3}"],
                **({"domain": "ops"} if i % 5 == 0 else {}),
                **({"valid_until": f"{2001 + i // 50}-01-0{1 + i % 9}T00:00:00Z"} if i % 25 == 3 else {}),
                **({"valid_until": f"{2101 + i // 50}-03-0{1 + i % 9}T00:00:00Z"} if i % 25 == 4 else {}))
            for i in range(600)]  # (each record with a time has one of its own: past ones expired, future ones not)
    assert index_records(project, recs).code == 0
    assert (memory_dir(project) / checkpoint.NAME).exists()
    monkeypatch.setattr(checkpoint, "MIN_TAIL", 1 << 40)  # the tail below stays a tail
    assert index_records(project, [rec("tail note about topic 3", "late", id="late", tags=["t1"]),
                                   rec("note 0 about topic 0", "again", id="n0")]).code == 0
    mem = Memory.open(project)  # a new process: the checkpoint, then the two lines after it
    scan = mem.scan()
    assert isinstance(scan._position, Positions) and scan._position._dict is None
    assert isinstance(scan.records.column("id"), Lines) and scan.records.column("id")._kept == 600  # (in place)
    assert scan.position["late"] == 600 and "n0" in scan.ids()
    hits = mem.query("topic 3", k=50, tags=["t1"])["hits"]
    assert hits and all(h["id"] == "late" or int(h["id"][1:]) % 3 == 1 for h in hits)
    assert any(h["id"] == "late" for h in hits)
    assert scan._position._dict is None  # (a query, a filter and a tail made no dict of every id)
    fresh = Memory.open(project)  # the same answers as the whole log read line by line
    (memory_dir(project) / checkpoint.NAME).unlink()
    whole = Memory.open(project)
    for kwargs in ({"type": "learning"}, {"domain": "ops"}, {"tags": ["t2"]}, {}):
        assert [h["id"] for h in fresh.query("topic 3", k=20, **kwargs)["hits"]] == \
            [h["id"] for h in whole.query("topic 3", k=20, **kwargs)["hits"]], kwargs
    assert fresh.stats()["domains"] == whole.stats()["domains"]
    assert fresh.stats()["retired"]["expired"] == whole.stats()["retired"]["expired"] == 24
    expired = {f"n{i}" for i in range(600) if i % 25 == 3}
    assert not expired & {h["id"] for h in fresh.query("note about topic", k=600)["hits"]}


def test_a_keymap_is_written_in_binary_and_one_written_as_json_before_is_still_read(project: Path):
    assert index_records(project, [rec(f"note {i} about topic {i % 7}", f"body {i}", id=f"n{i}")
                                   for i in range(40)]).code == 0
    folder = memory_dir(project)
    manifest = json.loads((folder / "manifest.json").read_text())
    path = folder / manifest["files"]["keymap"]["name"]
    raw = path.read_bytes()
    ids, hashes, owner, _, _ = keymap_parts(raw)
    assert json.loads(raw.split(b"\n", 1)[0])["keymap"] == cache.KEYMAP_FORMAT
    assert isinstance(ids, Lines) and isinstance(hashes, Hex) and list(ids) == [f"n{i}" for i in range(40)]
    before = [h["id"] for h in Memory.open(project).query("topic 3", k=10)["hits"]]
    # a generation written before the binary keymap: one JSON document, named by a signed manifest
    old = dumps({"format": cache.CACHE_FORMAT, "ids": list(ids), "hashes": list(hashes), "piece_owner": list(owner)})
    path.write_bytes(old)
    manifest["files"]["keymap"].update(sha256=hashlib.sha256(old).hexdigest(), bytes=len(old))
    manifest.pop("signature", None)
    (folder / "manifest.json").write_bytes(dumps(sign(manifest), pretty=True))
    mem = Memory.open(project)
    assert [h["id"] for h in mem.query("topic 3", k=10)["hits"]] == before
    assert mem.stats()["consistency"]["consistent"] and not mem.stats().get("degraded")
    assert isinstance(mem.snap.vectors()[1].ids, list)  # (read as the JSON it is)


def test_a_record_replaced_in_place_writes_only_the_columns_it_changes():
    from nubos_memory.recordlist import COLUMNS, RecordList

    recs = [{"id": f"r{i}", "type": "learning", "title": "t", "body": "b", "tags": ["x"]} for i in range(5)]
    plain = RecordList()
    for r in recs:
        plain.append(r)
    blob, offsets, cols = plain.encode()
    got = RecordList(memoryview(blob), offsets,
                     {name: roundtrip(cols[name], "lines" if name == "id" else "coded")[1] for name in COLUMNS})
    got[2] = {**recs[2], "anchors": [{"path": "a.py"}]}  # (an anchor op: the id is the same)
    got[3] = {**recs[3], "type": "decision"}
    ids = got.column("id")
    assert isinstance(ids, Lines) and ids.raw(0, 5) is not None  # (found by review: one anchor op decoded every id)
    assert got.values("type") == ["learning"] * 3 + ["decision", "learning"] and got[2]["anchors"] == [{"path": "a.py"}]
    assert got.values("id") == [f"r{i}" for i in range(5)]

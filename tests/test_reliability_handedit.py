"""Hand edits of ``records.jsonl`` (issue 10): random deletions, duplications and reorderings of whole
lines of a real log, as a person editing the file, resolving a merge conflict or reverting a commit
would make.  After each edit: every record line still present is applied exactly as a plain
line-by-line replay of the edited file says (so each is retrievable unless a tombstone still in the
file retires it), queries and writes work, and nothing is moved out of the log: the next write only
appends.

Quick by default (a few dozen edits); ``NUBOS_MEMORY_HEAVY=1`` runs hundreds (docs/reliability.md).
"""

from __future__ import annotations

import json
import random

import pytest

from nubos_memory import Memory

from .conftest import HEAVY, memory_dir, run_cli, write_config

pytestmark = pytest.mark.reliability

TRIALS = 400 if HEAVY else 25


def build_log(root, rng: random.Random) -> None:
    """A real log: batches (groups), single adds, forgets and supersedes, through the library."""
    mem = Memory.open(root)
    n = 0

    def record(**kw):
        nonlocal n
        n += 1
        return {"id": f"r{n}", "type": "learning", "title": f"edited note tok{n}x", "body": f"body {n}", **kw}

    for _ in range(14):
        roll = rng.random()
        if roll < 0.45:
            mem.index([record() for _ in range(rng.randint(2, 6))])
        elif roll < 0.75:
            mem.add(record())
        elif roll < 0.9:
            live = sorted(mem.scan().ids())
            if live:
                mem.forget(rng.sample(live, min(len(live), rng.randint(1, 2))))
        else:
            live = sorted(mem.scan().ids())
            if live:
                mem.add(record(supersedes=rng.choice(live)))


def edit(lines: list[bytes], rng: random.Random) -> list[bytes]:
    """1-4 random deletions, duplications and moves of whole lines."""
    out = list(lines)
    for _ in range(rng.randint(1, 4)):
        if not out:
            break
        i = rng.randrange(len(out))
        what = rng.choice(("delete", "duplicate", "move", "move-block"))
        if what == "delete":
            del out[i]
        elif what == "duplicate":
            out.insert(rng.randrange(len(out) + 1), out[i])
        elif what == "move":
            line = out.pop(i)
            out.insert(rng.randrange(len(out) + 1), line)
        else:  # a revert or a merge moves whole runs of lines
            j = min(len(out), i + rng.randint(2, 8))
            block, out[i:j] = out[i:j], []
            at = rng.randrange(len(out) + 1)
            out[at:at] = block
    return out


def replay(lines: list[bytes]) -> set[str]:
    """The live ids of a log read one line at a time, ignoring group structure."""
    live: dict[str, bool] = {}
    for raw in lines:
        obj = json.loads(raw)
        if "op" in obj:
            if obj["op"] == "forget" and live.get(obj["id"]):
                live[obj["id"]] = False
            continue
        if live.get(obj["id"]):
            continue  # a repeated id of a live record: the first is kept
        live[obj["id"]] = True
        old = obj.get("supersedes")
        if old is not None and live.get(old) and old != obj["id"]:
            live[old] = False
    return {rid for rid, alive in live.items() if alive}


def test_random_hand_edits_never_hide_or_cut_a_line(tmp_path):
    rng = random.Random(1234 if not HEAVY else None)
    checked = 0
    for trial in range(TRIALS):
        root = tmp_path / f"p{trial}"
        root.mkdir()
        run_cli(["memory-init", "--root", str(root)])
        write_config(root, provider="hash", model="hash-64", near_duplicate=None)
        build_log(root, rng)
        log = memory_dir(root) / "records.jsonl"
        lines = log.read_bytes().splitlines()
        edited = b"".join(line + b"\n" for line in edit(lines, rng))
        log.write_bytes(edited)
        expected = replay(edited.splitlines())
        mem = Memory.open(root)
        assert mem.scan().ids() == expected, trial
        s = run_cli(["memory-stats", "--root", str(root)]).json
        assert s["count"] == len(expected)
        for rid in sorted(expected):  # every live record is retrievable by its own word
            n = rid[1:]
            q = run_cli(["memory-query", "--root", str(root), "--mode", "lexical", "--k", "3", f"tok{n}x"])
            assert [h["id"] for h in q.json["hits"]][:1] == [rid], (trial, rid)
        add = run_cli(["memory-add", "--root", str(root), "--type", "learning", "--title", f"after edit {trial}"])
        assert add.code == 0 and add.json["added"] == 1
        assert log.read_bytes().startswith(edited), trial  # only ever appended to
        assert not (memory_dir(root) / "records.jsonl.torn").exists()
        assert Memory.open(root).scan().ids() == expected | {add.json["id"]}
        # The writes appended segments (store/cache.py); merging them after the edit keeps every vector.
        merged = Memory.open(root)
        merged.vectors.merge_segments("test")
        c = merged.stats()["consistency"]
        manifest = json.loads((memory_dir(root) / "manifest.json").read_text())
        assert not manifest.get("segments") and c["index"] == c["keymap"] and c["pending"] == 0, (trial, c)
        checked += len(expected)
    if HEAVY:
        print("\nHANDEDIT-REPORT", json.dumps({"trials": TRIALS, "records_checked": checked}))

"""The log checkpoint (issue 27; store/checkpoint.py): a new process restores the log's state instead of
reading every line, and gets exactly what reading every line gives."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from nubos_memory.api.memory import Memory
from nubos_memory.log import LogScan, fill_content_hashes, state_doc
from nubos_memory.store import checkpoint
from nubos_memory.store.recordlog import RecordLog

from .conftest import index_records, memory_dir, rec, run_cli, run_sub


@pytest.fixture(autouse=True)
def small_tail(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checkpoint, "MIN_TAIL", 1)  # every read that moved writes one (1 MiB by default)


def full(scan: LogScan) -> dict:
    """The state, with every record's content hash (made on first need: a restored state carries them)."""
    fill_content_hashes(scan)
    return state_doc(scan)


def whole(path: Path) -> dict:
    """What reading every line gives (no checkpoint)."""
    return full(RecordLog(path).scan())


def restored(path: Path) -> tuple[dict, bool]:
    """What a new process gets with the checkpoint, and whether it started from one."""
    log = RecordLog(path, checkpoint=True)
    got = checkpoint.load(log.checkpoint, path, os.stat(path).st_ino) if log.checkpoint.exists() else None
    return full(log.scan()), got is not None


def busy_memory(project: Path) -> Path:
    """A log with every kind of line: records, a supersede, a forget, a pin, anchors' stamps, a redaction."""
    assert index_records(project, [rec(f"note {i} about caching", f"body {i}", id=f"n{i}") for i in range(30)]).code == 0
    assert run_cli(["memory-forget", "--root", str(project), "n3"]).code == 0
    assert run_cli(["memory-pin", "--root", str(project), "n4"]).code == 0
    assert run_cli(["memory-add", "--root", str(project), "--type", "learning", "--title", "n5 again",
                    "--body", "replaces n5", "--supersedes", "n5"]).code == 0
    return memory_dir(project) / "records.jsonl"


def test_a_new_process_restores_the_state_that_reading_every_line_gives(project: Path):
    log = busy_memory(project)
    assert (log.parent / checkpoint.NAME).exists()
    mode = stat.S_IMODE((log.parent / checkpoint.NAME).stat().st_mode)
    assert mode & 0o077 == 0  # it holds the records' text: owner-only
    state, from_checkpoint = restored(log)
    assert from_checkpoint and state == whole(log)
    # appended after the checkpoint: read as a tail on top of it
    assert run_cli(["memory-add", "--root", str(project), "--type", "learning", "--title", "after",
                    "--body", "the checkpoint"]).code == 0
    state, _ = restored(log)
    assert state == whole(log) and state["records"][-1]["title"] == "after"
    hits = run_cli(["memory-query", "--root", str(project), "n4 caching", "--mode", "lexical"]).json["hits"]
    assert hits and all(h["id"] != "n3" for h in hits)


def test_a_checkpoint_of_another_log_or_user_or_content_is_never_used(project: Path):
    log = busy_memory(project)
    path = log.parent / checkpoint.NAME
    header, payload = path.read_bytes().split(b"\n", 1)
    assert b"note 0 about caching" in payload
    path.write_bytes(header + b"\n" + payload.replace(b"note 0 about caching", b"note 0 about planted"))
    # (the same length: only the payload's hash tells)
    assert checkpoint.load(path, log, os.stat(log).st_ino) is None
    state, _ = restored(log)
    assert state == whole(log) and "planted" not in json.dumps(state)
    unsigned = json.loads(header)
    unsigned["signature"] = "0" * 64
    path.write_bytes(json.dumps(unsigned).encode() + b"\n" + payload)  # not signed by this user's key
    assert checkpoint.load(path, log, os.stat(log).st_ino) is None


def test_a_hand_edit_before_the_checkpoint_reads_the_whole_log(project: Path):
    log = busy_memory(project)
    assert index_records(project, [rec(f"filler {i}", "x" * 300, id=f"f{i}") for i in range(40)]).code == 0
    assert log.stat().st_size > 4 * 4096  # the edit is far before the guard's last block
    inode = log.stat().st_ino
    with open(log, "r+b") as f:  # in place: same inode, same length, other bytes
        data = f.read()
        f.seek(0)
        f.write(data.replace(b"note 7 about caching", b"note 7 about kittens"))
    assert log.stat().st_ino == inode
    state, from_checkpoint = restored(log)
    assert not from_checkpoint and state == whole(log) and "kittens" in json.dumps(state)


def test_redact_and_compact_delete_the_checkpoint_with_the_text_it_holds(project: Path):
    log = busy_memory(project)
    path = log.parent / checkpoint.NAME
    assert path.exists()
    assert run_cli(["memory-redact", "--root", str(project), "n8"]).code == 0
    assert not path.exists() or b"body 8" not in path.read_bytes()
    assert all(b"body 8" not in p.read_bytes() for p in log.parent.iterdir() if p.is_file())
    run_cli(["memory-query", "--root", str(project), "caching"])  # a new process may write a new one
    assert run_cli(["memory-compact", "--root", str(project)]).code == 0
    state, _ = restored(log)
    assert state == whole(log)


def test_the_library_and_a_warm_process_see_what_the_checkpoint_gives(project: Path):
    busy_memory(project)
    mem = Memory.open(project)
    live = sorted(mem.scan().ids())
    assert "n3" not in live and "n5" not in live and len(live) == 29


# -- found by review (helper red team): a redaction racing a reader, planted files, a redaction in the tail --
def test_no_checkpoint_is_written_while_another_holds_the_write_lock(project: Path):
    log = busy_memory(project)
    path = log.parent / checkpoint.NAME
    checkpoint.drop(path)
    holder, reader = Memory.open(project).store, Memory.open(project).store  # two processes' worth of stores
    with holder.lock("memory-redact"):  # a redaction or a compaction may be rewriting the log
        reader.refresh(None)
        assert not path.exists()
    reader.refresh(None)
    assert path.exists()


def test_a_planted_folder_or_fifo_never_blocks_a_read_or_a_redaction(project: Path):
    import threading

    log = busy_memory(project)
    path = log.parent / checkpoint.NAME
    checkpoint.drop(path)
    os.mkfifo(path)
    done: list[dict] = []
    reader = threading.Thread(target=lambda: done.append(full(RecordLog(log, checkpoint=True).scan())))
    reader.start()
    reader.join(20)
    assert not reader.is_alive() and done and done[0] == whole(log)  # a FIFO there: read whole, no hang
    path.unlink()
    path.mkdir()  # a folder a clone planted there
    (path / "x").write_text("x")
    assert run_cli(["memory-redact", "--root", str(project), "n9"]).code == 0
    assert not path.is_dir() and b"body 9" not in log.read_bytes()
    assert not path.exists() or b"body 9" not in path.read_bytes()


def test_a_redaction_appended_after_the_checkpoint_reads_the_whole_log(project: Path):
    from nubos_memory.log import redact_lines

    log = busy_memory(project)
    raw = next(line for line in log.read_bytes().splitlines(keepends=True) if b'"id":"n11"' in line)
    redacted, _ = redact_lines([raw], {"n11"}, "by hand")
    with open(log, "ab") as f:  # appended by hand (a merge): it applies to the line before the checkpoint
        f.write(redacted[0])
    state, _ = restored(log)
    assert state == whole(log)
    assert "n11" not in {r["id"] for r in state["records"]}


def test_a_warm_process_lets_go_of_a_mapped_checkpoint_a_redaction_deleted(project: Path):
    """The checkpoint file is memory-mapped (its records are decoded when read): after a redaction elsewhere
    deletes it, a warm process's background look reads the log again and unmaps it, not only at its next
    request (found by review: the deleted file kept the redacted text on disk while mapped)."""
    import gc

    from nubos_memory.interfaces.warm import WarmMemory

    log = busy_memory(project)
    path = str(log.parent.resolve() / checkpoint.NAME)
    gc.collect()  # (the in-process CLI calls' memories: cyclic garbage that may hold a map of it too)

    def mapped() -> bool:
        return any(path in line for line in Path("/proc/self/maps").read_text().splitlines())

    warm = WarmMemory(str(project))
    warm.warm_up()
    assert mapped()
    assert run_sub(["memory-redact", "--root", str(project), "n8"]).code == 0  # another process
    warm.catch_up()
    assert not mapped()
    with warm.use(writes=False) as reader:
        assert "n8" not in reader.scan().ids()

"""A derived file checked once is not hashed again while unchanged (store/verified.py, adr/0021), and
the lexical postings are memory-mapped from their npz file (store/lexcache.py)."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import numpy as np
import pytest

from nubos_memory import Memory
from nubos_memory.store import verified as verified_module
from nubos_memory.store.lexcache import mapped_members
from nubos_memory.store.verified import Verified

from .conftest import memory_dir, rec


class Counting:
    def __init__(self, path: Path):
        self.path, self.calls = path, 0

    def __call__(self) -> str:
        self.calls += 1
        return hashlib.sha256(self.path.read_bytes()).hexdigest()


def _settled(path: Path) -> None:
    """Make the file's ctime older than SETTLE_S without touching it: wait it out."""
    while time.time_ns() - os.stat(path).st_ctime_ns <= verified_module.SETTLE_S * 1e9:
        time.sleep(0.1)


def _settled_file(folder: Path, data: bytes) -> tuple[Path, str, Counting]:
    """A derived file that has settled, its sha256, and a counting digest of it."""
    path = folder / "vectors-x.npy"
    path.write_bytes(data)
    _settled(path)
    return path, hashlib.sha256(data).hexdigest(), Counting(path)


@pytest.fixture
def fast_settle(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verified_module, "SETTLE_S", 0.2)


def test_a_checked_file_is_not_hashed_again_until_it_changes(tmp_path: Path, fast_settle: None):
    path, sha, digest = _settled_file(tmp_path, b"a" * 1000)
    assert Verified(tmp_path).check(path, sha, digest) and digest.calls == 1
    assert Verified(tmp_path).check(path, sha, digest) and digest.calls == 1  # a new process: remembered
    assert not Verified(tmp_path).check(path, "0" * 64, digest)  # another claimed sha256: hashed, refused
    path.write_bytes(b"b" * 1000)  # same size, other bytes: its ctime moved
    assert not Verified(tmp_path).check(path, sha, digest) and digest.calls == 3
    os.utime(path, ns=(os.stat(path).st_atime_ns, os.stat(path).st_mtime_ns))  # mtime put back: ctime still moves
    assert not Verified(tmp_path).check(path, sha, digest)


def test_a_fresh_file_is_hashed_by_every_reader_until_it_settles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(verified_module, "SETTLE_S", 3600.0)
    path = tmp_path / "vectors-x.npy"
    path.write_bytes(b"a" * 100)
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    digest = Counting(path)
    for _ in range(3):
        assert Verified(tmp_path).check(path, sha, digest)
    assert digest.calls == 3 and not (tmp_path / verified_module.NAME).exists()


def test_a_verified_json_this_user_did_not_sign_is_ignored(tmp_path: Path, fast_settle: None):
    path, sha, digest = _settled_file(tmp_path, b"a" * 100)
    assert Verified(tmp_path).check(path, sha, digest)
    doc = json.loads((tmp_path / verified_module.NAME).read_text())
    doc["signature"] = "0" * 64
    (tmp_path / verified_module.NAME).write_text(json.dumps(doc))
    assert Verified(tmp_path).check(path, sha, digest) and digest.calls == 2  # not trusted: hashed again


def test_a_memory_hashes_its_vectors_once_across_processes(project: Path, fast_settle: None,
                                                           monkeypatch: pytest.MonkeyPatch):

    Memory.open(project).index([rec(f"note {i}", f"body {i}") for i in range(20)])
    manifest = json.loads((memory_dir(project) / "manifest.json").read_text())
    vectors = memory_dir(project) / manifest["files"]["vectors"]["name"]
    _settled(vectors)
    hashed: list[str] = []
    real = verified_module.file_sha256  # (where a derived file is hashed when its check is not known)
    monkeypatch.setattr(verified_module, "file_sha256", lambda p, *a: hashed.append(Path(p).name) or real(p, *a))
    for _ in range(3):
        assert Memory.open(project).query("note 3", k=3)["degraded"] is None
    assert hashed.count(vectors.name) == 1
    # A file changed in place (same size) is hashed again and refused.
    data = bytearray(vectors.read_bytes())
    data[-4:] = b"\x00\x00\x80\x7f"
    vectors.write_bytes(bytes(data))
    res = Memory.open(project).query("note 3", k=3)
    assert res["degraded"]["code"] == "vectors-corrupt" and hashed.count(vectors.name) == 2


def test_lexical_postings_are_mapped_not_read(project: Path):
    mem = Memory.open(project)
    mem.index([rec(f"note {i} kafka", f"body {i} redis") for i in range(50)])
    mem.rebuild()  # saves the lexical postings
    meta = json.loads((memory_dir(project) / "lexical.json").read_text())
    path = memory_dir(project) / meta["file"]
    got = mapped_members(path)
    with np.load(path, allow_pickle=False) as z:
        assert sorted(got) == sorted(k for k in z.files)
        for key in z.files:
            assert np.array_equal(np.asarray(got[key]), z[key]), key
    assert isinstance(got["docs"], np.memmap) and isinstance(got["tfs"], np.memmap)
    before = [h["id"] for h in Memory.open(project).query("kafka redis", mode="lexical", k=5)["hits"]]
    assert len(before) == 5


def test_lexical_postings_changed_in_place_are_not_used(project: Path):
    mem = Memory.open(project)
    mem.index([rec(f"note {i} kafka", f"body {i} redis") for i in range(50)])
    mem.rebuild()
    meta = json.loads((memory_dir(project) / "lexical.json").read_text())
    path = memory_dir(project) / meta["file"]
    want = [h["id"] for h in Memory.open(project).query("kafka redis", mode="lexical", k=5)["hits"]]
    data = bytearray(path.read_bytes())
    at = len(data) // 2
    data[at:at + 8] = bytes(b ^ 0xFF for b in data[at:at + 8])  # same size: no zip check runs on a mapped array
    path.write_bytes(bytes(data))
    fresh = Memory.open(project)
    assert fresh.store.load_lexical(10_000) is None  # its sha256 no longer matches: read from the log instead
    assert [h["id"] for h in fresh.query("kafka redis", mode="lexical", k=5)["hits"]] == want

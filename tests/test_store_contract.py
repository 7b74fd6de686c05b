"""The store contract (issue 22): one suite of scenarios, run against every store.

``store/base.py`` promises that every verb works unchanged on any store.  These scenarios are that
promise, each run against the file store, the PostgreSQL store (a real server: ``pg``) and the
in-memory store, through the :class:`~nubos_memory.store.base.Store` Protocol only.  What only a
store-specific hook can do (leave a crashed writer's leftovers, open a second handle on the same
memory, read the backup a compaction kept) is the store's :class:`Harness`.

A scenario that fails on one store because the stores really differ is marked ``xfail(strict=True)``
for that store, with the reason, so the difference stays visible (``KNOWN_GAPS``).
"""

from __future__ import annotations

import itertools
import sys
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from nubos_memory.api.memory import Memory
from nubos_memory.config import Project, load_project
from nubos_memory.embed.hashing import HashEmbedder
from nubos_memory.errors import LockTimeout, StoreError
from nubos_memory.fsio import dumps
from nubos_memory.index.lexical import PostingsBM25
from nubos_memory.index.vectors import PIECE_LAMBDA, PIECE_RULE, HnswParams, Pieces
from nubos_memory.log import forget_op, frame, line_hash
from nubos_memory.records import lexical_text, read_record
from nubos_memory.store.base import Store
from nubos_memory.store.files import FileStore
from nubos_memory.store.inmemory import InMemoryStore
from nubos_memory.tokenize import tokenize

from .conftest import run_cli, write_config

KINDS = ("files", "postgres", "memory")
LOCK_S = 0.5  # every store of the suite waits this long for the write lock


def R(rid: str, title: str | None = None, body: str = "", **extra: Any) -> dict[str, Any]:
    """A valid record, as the log holds it."""
    record, err = read_record({"id": rid, "type": "learning", "title": title or f"note {rid}", "body": body,
                               "created_at": "2026-03-01T00:00:00Z", **extra})
    assert record is not None, err
    return dict(record)


def append(store: Store, records: list[dict[str, Any]], ops: list[dict[str, Any]] | None = None) -> None:
    with store.lock("contract-append"):
        store.append(records, ops or [])


def log_bytes(store: Store) -> bytes:
    return b"".join(store.export_lines())


def live_records(scan: Any) -> list[dict[str, Any]]:
    return [dict(r) for p, r in enumerate(scan.records) if p not in scan.dead]


def retirements(scan: Any) -> list[tuple[Any, ...]]:
    return sorted((scan.records[p]["id"], why.get("reason"), why.get("at"), why.get("by"))
                  for p, why in scan.dead.items())


# -- the harness: what only a store-specific hook can do -----------------------------------------------
@dataclass
class Crash:
    """A way this store's writer can be interrupted mid-append, and what settling it then gives:
    ``committed`` (every line was there: the change is applied), ``rolled-back`` (a torn line showed
    a crash: none of it is applied) or ``nothing-left`` (the write was one transaction: nothing to settle)."""

    name: str
    leave: Callable[[Store, list[dict[str, Any]]], None]  # called holding the write lock, as a writer would
    outcome: str


@dataclass
class Harness:
    kind: str
    store: Store
    project: Project  # its config (for the in-memory store, a project only for Memory's settings)
    second: Callable[[], Store]  # another handle on the same memory (another process, another machine)
    backup_lines: Callable[[], list[bytes]]  # the log the last rewrite replaced, as it is kept now
    crashes: list[Crash] = field(default_factory=list)


def _files_torn(store: Store, records: list[dict[str, Any]]) -> None:
    """A writer killed in its one ``write`` of a group: the header, a record, half the next line."""
    assert isinstance(store, FileStore)
    lines = frame(records)
    cut = len(lines[0]) + 1 + len(lines[1]) + 1 + len(lines[2]) // 2
    with open(store.log.path, "ab") as f:
        f.write((b"\n".join(lines) + b"\n")[:cut])


def _files_open_group(store: Store, records: list[dict[str, Any]]) -> None:
    """A writer killed at a line boundary (or a hand edit): every line of the group, no commit line."""
    assert isinstance(store, FileStore)
    lines = frame(records)
    with open(store.log.path, "ab") as f:
        f.write(b"\n".join(lines[:-1]) + b"\n")


class _KilledBeforeCommit:
    """A database connection whose session the server terminates once a change's lines are inserted,
    before its transaction commits (the writer's machine died there)."""

    def __init__(self, conn: Any, killed: list[bool]):
        self._conn, self._killed = conn, killed

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    def execute(self, statement: Any, *args: Any, **kwargs: Any) -> Any:
        if "SET updated_at = now()" in str(statement):  # the change's last statement, lines inserted
            self._killed.append(True)
            self._conn.execute("SELECT pg_terminate_backend(pg_backend_pid())")
        return self._conn.execute(statement, *args, **kwargs)


def _pg_killed(store: Store, records: list[dict[str, Any]]) -> None:
    real = store.db
    killed: list[bool] = []

    @contextmanager
    def db() -> Any:
        with real() as conn:
            yield _KilledBeforeCommit(conn, killed)

    store.db = db
    try:
        with pytest.raises(StoreError) as err:
            store.append(records)
    finally:
        del store.db
    assert killed and err.value.code == "store-unavailable"


def _memory_failed(store: Store, records: list[dict[str, Any]]) -> None:
    """The one way an in-memory append stops partway: it fails before its one step (here: a value of
    the third line cannot be written)."""
    broken = [*records[:2], {**records[2], "unwritable": object()}, *records[3:]]
    with pytest.raises(TypeError):
        store.append(broken)


class Stores:
    """Makes a fresh memory of each kind (a project folder; a fresh namespace of the test database)."""

    def __init__(self, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
        self.request, self.tmp_path, self.monkeypatch = request, tmp_path, monkeypatch
        self.count = itertools.count()

    def project(self, kind: str) -> Path:
        root = self.tmp_path / f"{kind}-{next(self.count)}"
        root.mkdir()
        assert run_cli(["memory-init", "--root", str(root)]).code == 0
        memory: dict[str, Any] = {"provider": "hash", "model": "hash-256", "lock_timeout": 2.0, "near_duplicate": None}
        if kind == "postgres":
            dsn, _ = self.request.getfixturevalue("pg")  # started only when a postgres store is asked for
            self.monkeypatch.setenv("NUBOS_MEMORY_DSN", dsn)
            self.monkeypatch.setenv("NUBOS_MEMORY_CACHE", str(self.tmp_path / "cache"))
            memory.update(backend="postgres", postgres={"namespace": "contract-" + uuid.uuid4().hex[:12]})
        write_config(root, **memory)
        return root

    def make(self, kind: str) -> Harness:
        project = load_project(self.project(kind))
        if kind == "files":
            store = FileStore(project, LOCK_S)
            store.prepare()

            def files_backup() -> list[bytes]:
                backups = sorted(store.folder.glob("records.jsonl.bak-*"))
                return backups[-1].read_bytes().splitlines(keepends=True) if backups else []

            return Harness(kind, store, project, lambda: FileStore(project, LOCK_S), files_backup,
                           [Crash("torn-line", _files_torn, "rolled-back"),
                            Crash("open-group", _files_open_group, "committed")])
        if kind == "postgres":
            import psycopg

            from nubos_memory.store.postgres import PgStore

            pg_store = PgStore(project, LOCK_S)
            pg_store.prepare()
            dsn = self.request.getfixturevalue("pg")[0]

            def pg_backup() -> list[bytes]:
                with psycopg.connect(dsn) as conn:
                    rows = conn.execute("SELECT line FROM nubos_memory_log_backup WHERE namespace = %s AND epoch = "
                                        "(SELECT max(epoch) FROM nubos_memory_log_backup WHERE namespace = %s) "
                                        "ORDER BY seq", (pg_store.namespace, pg_store.namespace)).fetchall()
                return [line.encode() + b"\n" for (line,) in rows]

            return Harness(kind, pg_store, project, lambda: PgStore(project, LOCK_S), pg_backup,
                           [Crash("killed-in-transaction", _pg_killed, "nothing-left")])
        assert kind == "memory"
        mem_store = InMemoryStore(LOCK_S)

        def memory_backup() -> list[bytes]:
            return mem_store.backups[-1].splitlines(keepends=True) if mem_store.backups else []

        return Harness(kind, mem_store, project, lambda: mem_store, memory_backup,
                       [Crash("failed-append", _memory_failed, "nothing-left")])


@pytest.fixture
def stores(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Stores:
    return Stores(request, tmp_path, monkeypatch)


def kinds(**gaps: str) -> list[Any]:
    """The three stores as parameters (postgres marked), with ``gaps`` (kind -> why) as strict xfails."""
    out = []
    for kind in KINDS:
        marks = [pytest.mark.postgres] if kind == "postgres" else []
        if kind in gaps:
            marks.append(pytest.mark.xfail(strict=True, reason=gaps[kind]))
        out.append(pytest.param(kind, marks=marks, id=kind))
    return out


@pytest.fixture(params=kinds())
def h(request: pytest.FixtureRequest, stores: Stores) -> Harness:
    return stores.make(request.param)


# -- the log -------------------------------------------------------------------------------------------
def _generation_inputs(fingerprint: str, dim: int, n: int, *, seed: int) -> tuple[dict[str, Any], np.ndarray]:
    """A hash-model embedding spec under ``fingerprint`` and ``n`` seeded unit vectors of ``dim``."""
    rows = np.random.default_rng(seed).normal(size=(n, dim)).astype(np.float32)
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    return {"provider": "hash", "model": f"hash-{dim}", "dim": dim, "fingerprint": fingerprint}, rows


class TestStoreContract:
    """Every scenario runs once per store (``h``); see the module docstring."""

    def test_append_and_refresh_read_only_what_was_appended(self, h: Harness, monkeypatch: pytest.MonkeyPatch):
        store = h.store
        empty = store.refresh(None)
        assert empty.records == [] and empty.partial_tail is None and empty.applied == 0
        append(store, [R("a1")])
        first = store.refresh(empty)
        assert [r["id"] for r in first.records] == ["a1"]

        from nubos_memory import log

        fed: list[bytes] = []

        def spy(scan: Any, data: bytes) -> int:
            fed.append(data)
            return log.feed(scan, data)

        for module in [m for name, m in sys.modules.items() if name.startswith("nubos_memory.store.")]:
            if getattr(module, "feed", None) is log.feed:
                monkeypatch.setattr(module, "feed", spy)
        before = log_bytes(store)
        append(store, [R("a2"), R("a3")], [forget_op("a1", "replaced")])
        appended = log_bytes(store)[len(before):]
        again = store.refresh(first)
        assert again is first and again.generation == first.generation  # extended, not parsed again
        assert fed == [appended]  # only the appended bytes were read
        assert [r["id"] for r in again.records] == ["a1", "a2", "a3"] and again.ids() == {"a2", "a3"}
        assert again.applied == len(log_bytes(store)) and again.partial_tail is None

        fed.clear()
        state = (len(again.records), again.applied, again.size, again.lines, again.ops)
        unchanged = store.refresh(again)
        assert unchanged is again and fed == []  # nothing appended: the same state, nothing read
        assert (len(unchanged.records), unchanged.applied, unchanged.size, unchanged.lines, unchanged.ops) == state

        other = h.second().refresh(None)  # another reader, from the start
        assert other.records == again.records and other.ids() == again.ids()

    def test_a_change_of_several_lines_is_seen_whole_or_not_at_all(self, h: Harness):
        store = h.store
        append(store, [R("g0")])
        size, per = 20, 4
        groups = [[R(f"g{n}-{i}", body=f"part {i} of change {n} " * 120) for i in range(per)] for n in range(size)]
        reader = h.second()
        seen: list[set[str]] = []
        done = threading.Event()
        failures: list[BaseException] = []

        def read() -> None:
            scan = None
            try:
                while not done.is_set():
                    scan = reader.refresh(scan)
                    seen.append(scan.ids())
                    seen.append(reader.refresh(None).ids())  # a fresh reader too
            except BaseException as exc:  # noqa: BLE001 - reported below
                failures.append(exc)

        thread = threading.Thread(target=read)
        thread.start()
        try:
            for group in groups:
                append(store, group)
        finally:
            done.set()
            thread.join(30)
        assert not failures, failures
        assert len(seen) > 2
        for ids in seen:
            for n in range(size):
                present = sum(f"g{n}-{i}" in ids for i in range(per))
                assert present in (0, per), f"a reader saw {present} of {per} lines of change {n}"
        final = store.refresh(None)
        assert len(final.ids()) == 1 + size * per
        lines = list(store.export_lines())[-(per + 2):]  # the last change, as the log holds it
        assert b'"op":"group"' in lines[0] and b'"op":"commit"' in lines[-1]

    def test_settle_after_an_interrupted_write(self, h: Harness):
        store = h.store
        append(store, [R("kept")])
        assert h.crashes
        for crash in h.crashes:
            ids = [f"{crash.name}-{i}" for i in range(4)]
            scan = store.refresh(None)
            before = scan.ids()
            with store.lock("the writer that dies"):
                crash.leave(store, [R(rid) for rid in ids])
            scan = store.refresh(scan)
            assert not set(ids) & scan.ids(), crash.name  # unsettled: none of it is visible
            with store.lock("the next writer"):
                scan = store.refresh(scan)
                done = store.settle(scan)
                scan = store.refresh(scan)
                assert store.settle(scan) is None  # settled once: nothing left to do
            visible = set(ids) & scan.ids()
            assert scan.partial_tail is None and before <= scan.ids(), crash.name
            if crash.outcome == "committed":
                assert visible == set(ids) and done is not None and done["action"] == "group-committed"
            elif crash.outcome == "rolled-back":
                assert visible == set() and done is not None and done["action"] == "group-rolled-back"
            else:
                assert crash.outcome == "nothing-left"
                assert visible == set() and done is None
                assert not any(rid.encode() in line for line in store.export_lines() for rid in ids)
            assert h.second().refresh(None).ids() == scan.ids()  # every reader agrees
        append(store, [R("after")])
        assert "after" in store.refresh(None).ids()

    def test_compaction_keeps_a_backup_and_only_the_live_records(self, h: Harness):
        store = h.store
        append(store, [R("c1"), R("c2")])
        append(store, [R("c3")], [forget_op("c1", "wrong")])
        append(store, [R("c4", supersedes="c3")])
        reader = h.second()
        old_scan = reader.refresh(None)
        old = list(store.export_lines())
        with store.lock("memory-compact"):
            scan = store.refresh(None)
            live = live_records(scan)
            assert [r["id"] for r in live] == ["c2", "c4"]
            out = store.rewrite(live)
        assert out["backup"]
        assert out["bytes"] == {"before": len(b"".join(old)), "after": sum(len(line) for line in store.export_lines())}
        assert h.backup_lines() == old  # the old log, every line of it
        new = store.refresh(None)
        assert live_records(new) == live and not new.dead and new.ops == 0
        assert list(store.export_lines()) == [dumps(r) + b"\n" for r in live]
        again = reader.refresh(old_scan)  # a reader of the old log reads the new one from its start
        assert again.generation > old_scan.generation and live_records(again) == live
        append(store, [R("c5")])
        assert store.refresh(new).ids() == {"c2", "c4", "c5"}

    def test_redact_removes_the_text_from_the_log_and_its_backups(self, h: Harness):
        store = h.store
        append(store, [R("s1", body="the key is sk-live-0123456789"), R("s2")])
        with store.lock("memory-compact"):
            store.rewrite(live_records(store.refresh(None)))  # a backup that holds the text too
        with store.lock("memory-redact"):
            done = store.redact({"s1"}, "leaked")
        assert done["ids"] == ["s1"] and done["lines"] == 1
        assert b"sk-live" not in log_bytes(store) and not any(b"sk-live" in line for line in h.backup_lines())
        scan = store.refresh(None)
        assert scan.ids() == {"s2"} and "s1" in scan.redacted

    def test_a_rewrite_keeps_the_redact_lines_so_a_redacted_line_brought_back_is_never_read(self, h: Harness):
        store = h.store
        append(store, [R("s1", body="the key is sk-live-0123456789"), R("s2")])
        with store.lock("memory-redact"):
            store.redact({"s1"}, "leaked")
        with store.lock("memory-compact"):
            store.rewrite(live_records(store.refresh(None)))
        assert b"sk-live" not in log_bytes(store) and b'"redact"' in log_bytes(store)
        scan = store.refresh(None)
        assert "s1" in scan.redacted and scan.ids() == {"s2"}
        append(store, [R("s1", body="the key is sk-live-0123456789")])  # the same line again (a merge)
        scan = store.refresh(None)
        assert scan.ids() == {"s2"} and scan.redacted_present

    def test_a_record_compacted_out_of_the_log_is_still_found_in_its_backups_and_redacted_there(self, h: Harness):
        store = h.store
        append(store, [R("s1", body="the key is sk-live-0123456789"), R("s2")])
        kept = [r for r in live_records(store.refresh(None)) if r["id"] == "s2"]
        with store.lock("memory-compact"):
            store.rewrite(kept)  # s1 is no longer in the log, only in the backup
        held = store.held_in_copies({"s1", "s2", "nope"})
        assert set(held) == {"s1", "s2"}
        s1_line = next(line for line in h.backup_lines() if b'"s1"' in line)
        assert held["s1"] == {line_hash(s1_line)}  # what the log's redact line names
        with store.lock("memory-redact"):
            store.redact({"s1"}, "leaked")
        assert "s1" not in store.refresh(None).ids()
        assert not any(b"sk-live" in line for line in h.backup_lines()) and store.held_in_copies({"s1"}) == {}

    # -- the lock ----------------------------------------------------------------------------------------
    def test_the_write_lock_excludes_a_second_holder(self, h: Harness):
        other = h.second()
        outcome: dict[str, Any] = {}

        def wait() -> None:
            started = time.monotonic()
            try:
                with other.lock("the second writer"):
                    outcome["got"] = True
            except LockTimeout as exc:
                outcome["error"], outcome["waited"] = exc, time.monotonic() - started

        with h.store.lock("the first writer"):
            thread = threading.Thread(target=wait)
            thread.start()
            thread.join(30)
            with other.try_lock("a query's upkeep") as got:
                assert got is False
        error = outcome.get("error")
        assert "got" not in outcome and isinstance(error, LockTimeout)
        assert error.code == "lock-timeout" and error.exit_code == 6 and outcome["waited"] >= LOCK_S * 0.9
        with other.try_lock("a query's upkeep") as got:
            assert got is True

        held = threading.Event()

        def hold_briefly() -> None:
            with h.store.lock("a short writer"):
                held.set()
                time.sleep(0.2)

        holder = threading.Thread(target=hold_briefly)
        holder.start()
        assert held.wait(10)
        started = time.monotonic()
        with other.lock("a patient writer"):  # waits for the holder, within its timeout
            waited = time.monotonic() - started
        holder.join()
        assert waited >= 0.1

    @pytest.mark.parametrize("h", kinds(files=(
        "the file store's lock is filelock.FileLock(thread_local=False), re-entrant for its object: a "
        "second thread using the same FileStore gets it at once (PgStore's _held and the in-memory "
        "store's threading lock make that thread wait)")), indirect=True)
    def test_threads_sharing_one_store_object_exclude_each_other(self, h: Harness):
        got: list[bool] = []

        def other_thread() -> None:
            with h.store.try_lock("another thread") as free:
                got.append(free)

        with h.store.lock("this thread"):
            thread = threading.Thread(target=other_thread)
            thread.start()
            thread.join(30)
        assert got == [False]

    # -- derived state -----------------------------------------------------------------------------------
    def test_commit_and_load_a_vector_generation(self, h: Harness):
        store = h.store
        dim = 8
        embedding, rows = _generation_inputs("contract-" + h.kind, dim, 3, seed=7)
        assert store.read_manifest() is None and store.load_current() == (None, None)
        with store.lock("memory-rebuild"):
            first = store.commit(ids=["v1", "v2"], hashes=["h1", "h2"], vectors=rows[:2], embedding=embedding,
                                 params=HnswParams(), alpha=0.5, previous=None, rebuilt=True)
        manifest, index = store.load_current()
        assert manifest is not None and index is not None
        assert manifest["generation"] == first["generation"] == (store.read_manifest() or {}).get("generation")
        assert manifest["covers"]["count"] == 2 and manifest["embedding"]["fingerprint"] == embedding["fingerprint"]
        assert manifest["rebuilt_at"] and manifest.get("appended_to") is None
        assert index.ids == ["v1", "v2"] and index.hashes == ["h1", "h2"]
        assert np.array_equal(np.asarray(index.vectors), rows[:2])

        with store.lock("memory-add"):
            second = store.commit(ids=["v1", "v2", "v3"], hashes=["h1", "h2", "h3"], vectors=rows[2:],
                                  embedding=embedding, params=HnswParams(), alpha=0.5, previous=manifest, base=index)
        manifest, index = store.load_current()
        assert manifest is not None and index is not None
        assert manifest["generation"] == second["generation"] != first["generation"]
        assert manifest["appended_to"] == first["generation"] and manifest["covers"]["count"] == 3
        assert manifest["created_at"] == first["created_at"]
        assert index.ids == ["v1", "v2", "v3"] and index.hashes == ["h1", "h2", "h3"]
        assert np.array_equal(np.asarray(index.vectors), rows)
        assert index.top(rows[2], 1)[0].tolist() == [2]

    def test_a_generation_keeps_the_pieces_of_several_piece_records(self, h: Harness):
        store = h.store
        dim = 8
        embedding, unit = _generation_inputs("pieces-" + h.kind, dim, 9, seed=11)
        rows, parts = unit[:3], unit[3:]
        with store.lock("memory-rebuild"):  # v1 in two pieces, v2 in one (none kept)
            first = store.commit(ids=["v1", "v2"], hashes=["h1", "h2"], vectors=rows[:2], embedding=embedding,
                                 params=HnswParams(), alpha=0.5, previous=None, rebuilt=True,
                                 pieces=Pieces.of_labels({0: parts[:2]}, dim))
        manifest, index = store.load_current()
        assert manifest is not None and index is not None and index.pieces is not None
        assert manifest["pieces"] == {"rule": PIECE_RULE, "lambda": PIECE_LAMBDA, "rows": 2}
        assert index.pieces.owner.tolist() == [0, 0] and np.array_equal(index.pieces.rows_of(0), parts[:2])
        assert len(index.pieces.rows_of(1)) == 0
        with store.lock("memory-add"):  # v3 appended in four pieces: the base's pieces are kept before them
            store.commit(ids=["v1", "v2", "v3"], hashes=["h1", "h2", "h3"], vectors=rows[2:], embedding=embedding,
                         params=HnswParams(), alpha=0.5, previous=manifest, base=index,
                         pieces=Pieces.of_labels({2: parts[2:]}, dim))
        manifest, index = store.load_current()
        assert manifest is not None and index is not None and index.pieces is not None
        assert manifest["pieces"]["rows"] == 6 and manifest["appended_to"] == first["generation"]
        held = index.pieces_by_label()  # (the file store keeps the appended ones in a segment)
        assert sorted(held) == [0, 2] and np.array_equal(held[0], parts[:2]) and np.array_equal(held[2], parts[2:])
        assert np.array_equal(index.piece_rows(2), parts[2:]) and len(index.piece_rows(1)) == 0
        q = parts[4]  # v3's third piece: v3's cosine mixes its best piece (this one) with its pooled vector
        best = index.best_pieces(q)
        assert best is not None and np.isnan(best[1]) and best[2] == pytest.approx(1.0, abs=1e-6)
        got = index.cosines(np.array([0, 1, 2]), q, best)
        assert got[1] == pytest.approx(float(rows[1] @ q), abs=1e-6)
        assert got[2] == pytest.approx(PIECE_LAMBDA + (1 - PIECE_LAMBDA) * float(rows[2] @ q), abs=1e-6)
        assert got[0] == pytest.approx(PIECE_LAMBDA * float(max(parts[:2] @ q))
                                       + (1 - PIECE_LAMBDA) * float(rows[0] @ q), abs=1e-6)
        with store.lock("memory-rebuild"):  # a generation without the rule: none kept, none in the manifest
            store.commit(ids=["v1"], hashes=["h1"], vectors=rows[:1], embedding=embedding, params=HnswParams(),
                         alpha=0.5, previous=manifest, rebuilt=True)
        manifest, index = store.load_current()
        assert manifest is not None and "pieces" not in manifest and index is not None and index.pieces is None

    def test_the_lexical_cache_is_returned_only_while_valid(self, h: Harness):
        store = h.store
        append(store, [R("l1", "webhooks retry"), R("l2", "pnpm lockfile"), R("l3", "jwt expiry")])
        scan = store.refresh(None)
        engine = PostingsBM25()
        engine.add([tokenize(lexical_text(r)) for r in scan.records])
        want = engine.scores(["pnpm"]).tolist()
        with store.lock("memory-add"):
            store.save_lexical(engine, scan.applied)
        loaded = store.load_lexical(len(scan.records))
        assert loaded is not None
        assert loaded[1] == scan.applied and loaded[0].size == 3 and loaded[0].scores(["pnpm"]).tolist() == want
        assert store.load_lexical(2) is None  # it covers more records than the log holds: not this log's

        append(store, [R("l4", "more")])
        scan = store.refresh(scan)
        loaded = store.load_lexical(len(scan.records))
        assert loaded is not None and loaded[1] < scan.applied  # an append keeps it: it covers a prefix
        covered = loaded[1]

        with store.lock("memory-compact"):
            store.rewrite(live_records(scan))
        scan = store.refresh(scan)
        assert scan.applied >= covered  # as long as before: only what it is tells the cache is stale
        assert store.load_lexical(len(scan.records) + 10) is None  # the log it covered is gone

        engine = PostingsBM25()
        engine.add([tokenize(lexical_text(r)) for r in scan.records])
        with store.lock("memory-rebuild"):
            store.save_lexical(engine, scan.applied)
        assert store.load_lexical(len(scan.records)) is not None
        store.invalidate_lexical()
        assert store.load_lexical(len(scan.records)) is None

    def test_usage_counts_retrievals(self, h: Harness):
        store = h.store
        append(store, [R("u1"), R("u2")])
        store.usage.start()
        started = time.time()
        assert store.usage.record(["u1", "u2"]) and store.usage.record(["u1"]) and store.usage.record([])
        since, ids = store.usage.summary()
        assert since is not None and since <= time.time()
        assert ids["u1"][0] == 2 and ids["u2"][0] == 1 and set(ids) == {"u1", "u2"}
        assert started - 1 <= ids["u1"][1] <= time.time() + 1
        with store.lock("memory-compact"):
            store.usage.fold(force=True)
        assert store.usage.summary()[1] == ids  # folding loses nothing
        store.usage.record(["u2"])
        assert store.usage.summary()[1]["u2"][0] == 2

    # -- between stores ----------------------------------------------------------------------------------
    @pytest.mark.parametrize("target", kinds())
    def test_export_then_import_gives_the_same_live_records(self, h: Harness, target: str, stores: Stores,
                                                            tmp_path: Path):
        source = h.store
        append(source, [R("e1", "first"), R("e2", "second"), R("e3", "third")])
        append(source, [], [forget_op("e2", "wrong")])
        append(source, [R("e4", "fourth", supersedes="e3")])
        append(source, [R("e2", "second, corrected")])  # a retired id added again
        theirs = source.refresh(None)
        exported = tmp_path / f"export-{h.kind}.jsonl"
        exported.write_bytes(b"".join(source.export_lines()))

        into = stores.make(target)
        mem = Memory(into.project, embedder=HashEmbedder("hash-256"), store=into.store)
        out = mem.import_log(str(exported))
        assert out["imported"] >= 4 and out["retired"] == 1, out
        ours = into.store.refresh(None)
        assert live_records(ours) == live_records(theirs)
        assert retirements(ours) == retirements(theirs)
        assert mem.import_log(str(exported))["imported"] == 0  # by id: nothing twice


# -- the suite itself --------------------------------------------------------------------------------------
@pytest.mark.postgres
def test_the_suite_runs_three_different_stores(stores: Stores):
    """The parametrization cannot collapse: three factories, three kinds, each a whole Store."""
    made = {kind: stores.make(kind) for kind in KINDS}
    assert {kind: harness.store.kind for kind, harness in made.items()} == {k: k for k in KINDS}
    assert len({type(harness.store) for harness in made.values()}) == 3
    members = [name for name in vars(Store) if not name.startswith("_")] + list(Store.__annotations__)
    for harness in made.values():
        missing = [name for name in members if not hasattr(harness.store, name)]
        assert not missing, (harness.kind, missing)


def test_memory_works_end_to_end_on_the_in_memory_store(throwaway_memory: Memory, project: Path):
    """Ordinary verbs on a throwaway memory (conftest's ``throwaway_memory``: ``Memory(project,
    embedder=HashEmbedder(...), store=InMemoryStore())``): nothing reaches the project's memory folder."""
    mem = throwaway_memory
    assert mem.store.kind == "memory"
    notes = [{"type": "learning", "title": f"note {i} about {topic}", "body": f"details of {topic} number {i}",
              "id": f"n{i}"} for i, topic in enumerate(["webhooks", "jwt", "pnpm", "invoices"] * 3)]
    assert mem.index(notes)["added"] == len(notes)
    added = mem.add({"type": "learning", "title": "Pin pnpm with corepack", "body": "lockfile drift broke the cache",
                     "id": "pnpm-1"})
    assert added["id"] == "pnpm-1" and added["duplicate_of"] is None
    hits = mem.query("pnpm lockfile corepack")["hits"]
    assert hits[0]["id"] == "pnpm-1" and hits[0]["record"]["title"] == "Pin pnpm with corepack"
    assert mem.add({"type": "learning", "title": "Pin pnpm with corepack",
                    "body": "lockfile drift broke the cache"})["duplicate_of"] == "pnpm-1"
    assert mem.forget(["pnpm-1"], reason="wrong")["forgotten"] == ["pnpm-1"]
    assert "pnpm-1" not in {hit["id"] for hit in mem.query("pnpm lockfile corepack", k=20)["hits"]}
    got = mem.get(["pnpm-1", "n2"])["records"]
    assert got[0]["live"] is False and got[0]["retired"]["reason"] == "wrong" and got[1]["live"] is True
    stats = mem.stats()
    assert stats["backend"] == "memory" and stats["count"] == len(notes) and stats["consistency"]["consistent"]
    assert mem.compact()["kept"] == len(notes)
    assert mem.query("invoices", k=3)["hits"][0]["id"] in {"n3", "n7", "n11"}
    assert not (project / ".nubos-pilot" / "memory" / "records.jsonl").exists()

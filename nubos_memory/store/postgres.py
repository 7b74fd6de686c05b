"""The PostgreSQL store (``memory.backend: "postgres"``): one namespace of a shared database.

Team memory for many agents on many machines (adr/0014).  What is shared
lives in the database; what is derived lives on each machine::

    nubos_memory_log        (namespace, seq, line)  the log: the same lines as records.jsonl, in order
    nubos_memory_namespace  (namespace, epoch)      bumped when memory-compact rewrites the log
    nubos_memory_log_backup (namespace, epoch, seq, line)  the log before each memory-compact
    nubos_memory_vectors    (namespace, fingerprint, key, vector)  vectors by text hash, shared (derived)

    ~/.cache/nubos-memory/postgres/<host-db-namespace>/   vector generation, usage (this machine's)

* **The log** is the source of truth, as in the file store: record lines,
  tombstones and groups are the same bytes (``recordlog.py`` parses them), so
  ``memory-export`` writes a ``records.jsonl`` the file store reads as is.
  A change is one transaction: readers see all of it or none, and a write is
  acknowledged only after its commit.
* **The write lock** is a PostgreSQL advisory lock per namespace (session
  level, on this store's connection), held from read → decide → append →
  commit, so dedup, supersede and forget decide on the log as it is across
  every machine, and sequence order is commit order.
* **Derived state** (vector generation, graph, keymap, usage) is built from
  the log on each machine, in its own cache folder, with the same code as the
  file store: scores are the same numbers (the lexical postings are saved
  there too, keyed by the namespace's epoch).  Vectors are shared: a text's
  vector under a model fingerprint is stored once in ``nubos_memory_vectors``
  (float32 bytes, exactly the numbers its maker computed), so a machine embeds
  only texts no machine has embedded.

A database that is down or refuses us is ``store-unavailable`` (exit 7) naming
the host, never a traceback and never an empty answer.  All SQL is
parameterised; the DSN (from the environment, never from config.json) is
never echoed, only its host, port and database.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, LockTimeout, StoreError
from ..fsio import dumps, ensure_dir
from ..userdirs import user_cache_dir
from .cache import DerivedCache, LocalDerivedState
from .lexcache import LexicalCache
from .recordlog import LogScan, RecordLog
from .usage import Usage

if TYPE_CHECKING:
    import numpy as np

    from ..config import Project
    from ..index.lexical import PostingsBM25
    from ..types import Record

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS nubos_memory_namespace (
           namespace text PRIMARY KEY, epoch bigint NOT NULL DEFAULT 0,
           created_at timestamptz NOT NULL DEFAULT now())""",
    """CREATE TABLE IF NOT EXISTS nubos_memory_log (
           namespace text NOT NULL, seq bigint GENERATED ALWAYS AS IDENTITY, line text NOT NULL,
           PRIMARY KEY (namespace, seq))""",
    """CREATE TABLE IF NOT EXISTS nubos_memory_vectors (
           namespace text NOT NULL, fingerprint text NOT NULL, key text NOT NULL, vector bytea NOT NULL,
           PRIMARY KEY (namespace, fingerprint, key))""",
    """CREATE TABLE IF NOT EXISTS nubos_memory_log_backup (
           namespace text NOT NULL, epoch bigint NOT NULL, seq bigint NOT NULL, line text NOT NULL,
           saved_at timestamptz NOT NULL DEFAULT now())""",
)
LOCK_POLL_S = 0.05
SHARE_BATCH = 5_000  # vectors per statement


def where(dsn: str) -> dict[str, Any]:
    """Host, port and database of a DSN, for errors and stats (never the password or the DSN)."""
    from psycopg.conninfo import conninfo_to_dict

    try:
        info = conninfo_to_dict(dsn)
    except Exception:  # noqa: BLE001 - a malformed DSN is reported by connect
        return {"host": None, "port": None, "dbname": None}
    return {"host": info.get("host") or "localhost", "port": info.get("port") or 5432,
            "dbname": info.get("dbname")}


class PgStore(LocalDerivedState):
    """The :class:`~nubos_memory.store.base.Store` of one namespace in a PostgreSQL database."""

    kind = "postgres"

    def __init__(self, project: "Project", lock_timeout: float):
        settings = project.config.postgres
        self.project = project
        self.env = settings.dsn_env
        dsn = os.environ.get(self.env, "")
        if not dsn.strip():
            raise ConfigError(f"memory.backend is postgres but ${self.env} is not set; put the connection "
                              "string in the environment (never in config.json, which is committed)",
                              code="store-dsn-missing", details={"env": self.env})
        self.dsn = dsn
        self.namespace = settings.namespace or default_namespace(project.root)
        self.place = where(dsn)
        self.lock_timeout = lock_timeout
        key = hashlib.sha256(dumps([self.place, self.namespace])).hexdigest()[:16]
        self.folder = user_cache_dir() / "postgres" / f"{self.namespace[:40]}-{key}"
        self.cache = DerivedCache(self.folder)
        self.lexcache = LexicalCache(self.folder, self._digest)
        self._epoch: int | None = None  # of the log as last read
        self.usage = Usage(self.folder)
        self.log = RecordLog(Path(self.namespace))  # parses the lines; the database holds them
        self._conn: Any = None
        self._mutex = threading.RLock()  # one connection, used by one thread at a time
        self._held = threading.Lock()  # advisory locks are re-entrant per session: not across threads
        self._ready = False

    # -- the connection ----------------------------------------------------------------------
    def _fail(self, exc: BaseException) -> StoreError:
        self._drop()
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        host = self.place["host"]
        return StoreError(f"the memory database at {host} is unavailable: {why[:300]}", code="store-unavailable",
                          details={**self.place, "namespace": self.namespace, "env": self.env})

    def _drop(self) -> None:
        conn, self._conn, self._ready = self._conn, None, False
        if conn is not None:
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - it is gone either way
                pass

    @contextmanager
    def _db(self) -> Iterator[Any]:
        """The connection (made on first use, remade after a failure); errors as ``store-unavailable``."""
        import psycopg

        with self._mutex:
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=5,
                                                 application_name="nubos-memory")
                if not self._ready:
                    with self._conn.transaction():
                        missing = self._conn.execute(
                            "SELECT to_regclass('nubos_memory_namespace') IS NULL OR to_regclass('nubos_memory_log') "
                            "IS NULL OR to_regclass('nubos_memory_log_backup') IS NULL OR to_regclass('nubos_memory_vectors') IS NULL"
                        ).fetchone()[0]
                        if missing:  # only then: a role with table privileges alone needs no CREATE
                            self._conn.execute("SELECT pg_advisory_xact_lock(%s)",
                                               (_lock_key("nubos-memory-schema"),))
                            for statement in SCHEMA:
                                self._conn.execute(statement)
                        self._conn.execute("INSERT INTO nubos_memory_namespace (namespace) VALUES (%s) "
                                           "ON CONFLICT DO NOTHING", (self.namespace,))
                    self._ready = True
                yield self._conn
            except psycopg.Error as exc:
                raise self._fail(exc) from None

    # -- the place -------------------------------------------------------------------------
    def check(self) -> list[dict[str, Any]]:
        return []

    def prepare(self) -> None:
        ensure_dir(self.folder)
        with self._db():
            pass

    def describe(self) -> dict[str, Any]:
        return {"backend": self.kind, **self.place, "namespace": self.namespace, "cache_dir": str(self.folder)}

    # -- the log -----------------------------------------------------------------------------
    def refresh(self, scan: LogScan | None) -> LogScan:
        """``scan`` with the lines committed since its cursor; a fresh parse after a rewrite."""
        with self._db() as conn, conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            row = conn.execute("SELECT epoch FROM nubos_memory_namespace WHERE namespace = %s",
                               (self.namespace,)).fetchone()
            epoch = int(row[0]) if row else 0
            self._epoch = epoch
            if scan is None or scan.inode != epoch:
                scan = LogScan(inode=epoch, generation=(scan.generation + 1) if scan is not None else 0)
            rows = conn.execute("SELECT seq, line FROM nubos_memory_log WHERE namespace = %s AND seq > %s "
                                "ORDER BY seq", (self.namespace, scan.cursor)).fetchall()
        if rows:
            self.log.parse(scan, "".join(line + "\n" for _, line in rows).encode())
            scan.cursor = int(rows[-1][0])
        return scan

    def append(self, records: "Sequence[Record]", ops: Sequence[dict[str, Any]] = ()) -> None:
        """One transaction (under the lock): committed before this returns, or an error."""
        lines = self.log.lines(records, ops)
        if not lines:
            return
        with self._db() as conn, conn.transaction(), conn.cursor() as cur:
            cur.executemany("INSERT INTO nubos_memory_log (namespace, line) VALUES (%s, %s)",
                            [(self.namespace, line.decode()) for line in lines])

    def settle(self, scan: LogScan) -> dict[str, Any] | None:
        return None  # a change is one transaction: a crashed writer leaves nothing half-written

    def rewrite(self, records: "Sequence[Record]") -> dict[str, Any]:
        """Under the lock: the log is copied to ``nubos_memory_log_backup`` and replaced, in one transaction."""
        with self._db() as conn, conn.transaction():
            epoch = int(conn.execute("UPDATE nubos_memory_namespace SET epoch = epoch + 1 WHERE namespace = %s "
                                     "RETURNING epoch", (self.namespace,)).fetchone()[0])
            conn.execute("INSERT INTO nubos_memory_log_backup (namespace, epoch, seq, line) "
                         "SELECT namespace, %s, seq, line FROM nubos_memory_log WHERE namespace = %s",
                         (epoch - 1, self.namespace))
            before = int(conn.execute("SELECT coalesce(sum(octet_length(line) + 1), 0) FROM nubos_memory_log "
                                      "WHERE namespace = %s", (self.namespace,)).fetchone()[0])
            conn.execute("DELETE FROM nubos_memory_log WHERE namespace = %s", (self.namespace,))
            lines = [dumps(r).decode() for r in records]
            with conn.cursor() as cur:
                cur.executemany("INSERT INTO nubos_memory_log (namespace, line) VALUES (%s, %s)",
                                [(self.namespace, line) for line in lines])
        return {"backup": f"nubos_memory_log_backup (namespace {self.namespace!r}, epoch {epoch - 1})",
                "bytes": {"before": before, "after": sum(len(line.encode()) + 1 for line in lines)}}

    def export_lines(self) -> Iterator[bytes]:
        """Every line of the log, in order (``memory-export``)."""
        with self._db() as conn, conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            with conn.cursor(name="nubos_memory_export") as cur:
                cur.execute("SELECT line FROM nubos_memory_log WHERE namespace = %s ORDER BY seq", (self.namespace,))
                for (line,) in cur:
                    yield line.encode() + b"\n"

    def drop(self) -> None:
        """Delete this namespace and everything in it (memory-eval's scratch namespaces only) and
        this machine's derived files of it."""
        import shutil

        with self._db() as conn, conn.transaction():
            for statement in ("DELETE FROM nubos_memory_log WHERE namespace = %s",
                              "DELETE FROM nubos_memory_log_backup WHERE namespace = %s",
                              "DELETE FROM nubos_memory_vectors WHERE namespace = %s",
                              "DELETE FROM nubos_memory_namespace WHERE namespace = %s"):
                conn.execute(statement, (self.namespace,))
        shutil.rmtree(self.folder, ignore_errors=True)

    # -- the lock ------------------------------------------------------------------------------
    @contextmanager
    def lock(self, verb: str, timeout: float | None = None) -> Iterator[None]:
        wait = self.lock_timeout if timeout is None else timeout
        deadline = time.monotonic() + wait
        if not self._held.acquire(timeout=max(wait, 0.0)):
            raise LockTimeout(f"another thread of this process holds the memory write lock (waited {wait:g}s)",
                              details={"waited_s": wait, "namespace": self.namespace})
        try:
            key = _lock_key(self.namespace)
            while True:
                with self._db() as conn:
                    if conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()[0]:
                        break
                if time.monotonic() >= deadline:
                    raise LockTimeout(f"another writer holds the write lock of namespace {self.namespace!r} "
                                      f"(waited {wait:g}s)",
                                      details={"waited_s": wait, "namespace": self.namespace, **self.place})
                time.sleep(LOCK_POLL_S)
            try:
                yield
            finally:
                with self._mutex:
                    if self._conn is not None and not self._conn.closed:
                        try:
                            self._conn.execute("SELECT pg_advisory_unlock(%s)", (key,))
                        except Exception:  # noqa: BLE001 - a lost session released it already
                            self._drop()
        finally:
            self._held.release()

    @contextmanager
    def try_lock(self, verb: str) -> Iterator[bool]:
        try:
            cm: AbstractContextManager[None] = self.lock(verb, timeout=0)
            cm.__enter__()
        except (LockTimeout, StoreError):
            yield False
            return
        try:
            yield True
        finally:
            cm.__exit__(None, None, None)

    # -- derived state (this machine's cache folder) -------------------------------------------
    def shared_vectors(self, fingerprint: str, keys: list[str]) -> "dict[str, np.ndarray]":
        """Vectors another machine made for these texts (float32 bytes: exactly its numbers)."""
        import numpy as np

        out: dict[str, np.ndarray] = {}
        try:
            with self._db() as conn:
                for start in range(0, len(keys), SHARE_BATCH):
                    rows = conn.execute("SELECT key, vector FROM nubos_memory_vectors WHERE namespace = %s AND "
                                        "fingerprint = %s AND key = ANY(%s)",
                                        (self.namespace, fingerprint, keys[start:start + SHARE_BATCH])).fetchall()
                    out.update((key, np.frombuffer(bytes(vec), dtype="<f4")) for key, vec in rows)
        except StoreError:
            return {}  # embedded here instead; a down database fails the write itself, not this
        return out

    def share_vectors(self, fingerprint: str, vectors: "dict[str, np.ndarray]") -> None:
        items = [(self.namespace, fingerprint, key, vec.astype("<f4").tobytes()) for key, vec in vectors.items()]
        try:
            with self._db() as conn, conn.transaction(), conn.cursor() as cur:
                for start in range(0, len(items), SHARE_BATCH):
                    cur.executemany("INSERT INTO nubos_memory_vectors (namespace, fingerprint, key, vector) "
                                    "VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING", items[start:start + SHARE_BATCH])
        except StoreError:
            pass  # derived data: the next machine embeds it itself

    def _digest(self, offset: int) -> str:
        """What identifies the log's first ``offset`` bytes: lines are never changed in place, so
        the namespace, its epoch (bumped by memory-compact) and the offset."""
        return f"postgres:{self.place['host']}:{self.place['dbname']}:{self.namespace}:{self._epoch}:{offset}"

    def load_lexical(self, max_records: int) -> "tuple[PostingsBM25, int] | None":
        return self.lexcache.load(max_records) if self._epoch is not None else None

    def save_lexical(self, engine: "PostingsBM25", offset: int) -> None:
        if self._epoch is not None:
            ensure_dir(self.folder)
            self.lexcache.save(engine, offset)

    def invalidate_lexical(self) -> None:
        self.lexcache.invalidate()


def _lock_key(name: str) -> int:
    """A stable signed 64-bit advisory lock key for a name."""
    return int.from_bytes(hashlib.sha256(b"nubos-memory:" + name.encode()).digest()[:8], "big", signed=True)


def default_namespace(root: Path) -> str:
    """The project's folder name: the same on every machine that clones it under that name."""
    name = "".join(c if c.isalnum() or c in "._-" else "-" for c in root.resolve().name)
    return name[:128] or "default"

"""The PostgreSQL store (``memory.backend: "postgres"``): one namespace of a shared database.

Team memory for many agents on many machines (adr/0014).  What is shared
lives in the database; what is derived lives on each machine::

    nubos_memory_log        (namespace, seq, line)  the log: the same lines as records.jsonl, in order
    nubos_memory_namespace  (namespace, epoch, usage_since)  epoch bumped when memory-compact rewrites the log
    nubos_memory_log_backup (namespace, epoch, seq, line)  the log before each memory-compact
    nubos_memory_embeddings (namespace, fingerprint, key, embedding vector)  derived: one vector per
                            embedded text (key: its hash) under a model fingerprint, with a pgvector
                            HNSW index (vector_cosine_ops) per namespace and fingerprint
    nubos_memory_usage      (namespace, id, count, last)  retrievals, for memory-prune (derived)

    ~/.cache/nubos-memory/postgres/<host-db-namespace>/   keymap, vectors, lexical postings (this machine's)

* **The log** is the source of truth, as in the file store: record lines,
  tombstones and groups are the same bytes (``recordlog.py`` parses them), so
  ``memory-export`` writes a ``records.jsonl`` the file store reads as is.
  A change is one transaction: readers see all of it or none, and a write is
  acknowledged only after its commit.
* **The write lock** is a PostgreSQL advisory lock per namespace (session
  level, on this store's connection), held from read → decide → append →
  commit, so dedup, supersede and forget decide on the log as it is across
  every machine, and sequence order is commit order.
* **Vectors and candidates live in the database**: a text's vector under a
  model fingerprint is stored once in ``nubos_memory_embeddings`` (pgvector
  keeps float4: exactly the numbers its maker computed), so a machine embeds
  only texts no machine has embedded, and above ``EXACT_LIMIT`` records the
  pgvector HNSW index proposes the vector candidates (over-fetching past
  excluded rows, as the file store's graph does; pgvector 0.6 has no iterative
  scans).  Every machine's commit first publishes its rows there, so the
  index covers every vector a machine searches with.
* **What scores come from stays per machine** (the keymap and vectors of the
  records, the lexical postings keyed by the namespace's epoch), built from
  the log by the same code as the file store's: a record's BM25 and cosine
  are the same numbers, and fusion needs every in-scope record's cosine for
  its statistics (adr/0014).  No local graph is built.

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
from .recordlog import LogScan, RecordLog, redact_lines

if TYPE_CHECKING:
    import numpy as np

    from ..config import Project
    from ..index.lexical import PostingsBM25
    from ..index.vectors import HnswParams, VectorIndex
    from ..types import Manifest, Record

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS nubos_memory_namespace (
           namespace text PRIMARY KEY, epoch bigint NOT NULL DEFAULT 0,
           created_at timestamptz NOT NULL DEFAULT now())""",
    # Usage is tracked from a namespace's creation on (and, for one older than this column, from now).
    """ALTER TABLE nubos_memory_namespace ADD COLUMN IF NOT EXISTS usage_since double precision
           DEFAULT extract(epoch FROM now())""",
    """CREATE TABLE IF NOT EXISTS nubos_memory_log (
           namespace text NOT NULL, seq bigint GENERATED ALWAYS AS IDENTITY, line text NOT NULL,
           PRIMARY KEY (namespace, seq))""",
    """CREATE TABLE IF NOT EXISTS nubos_memory_embeddings (
           namespace text NOT NULL, fingerprint text NOT NULL, key text NOT NULL, embedding vector NOT NULL,
           PRIMARY KEY (namespace, fingerprint, key))""",
    """CREATE TABLE IF NOT EXISTS nubos_memory_usage (
           namespace text NOT NULL, id text NOT NULL, count bigint NOT NULL, last double precision NOT NULL,
           PRIMARY KEY (namespace, id))""",
    """CREATE TABLE IF NOT EXISTS nubos_memory_log_backup (
           namespace text NOT NULL, epoch bigint NOT NULL, seq bigint NOT NULL, line text NOT NULL,
           saved_at timestamptz NOT NULL DEFAULT now())""",
)
TABLES = ("nubos_memory_namespace", "nubos_memory_log", "nubos_memory_log_backup", "nubos_memory_embeddings",
          "nubos_memory_usage")
LOCK_POLL_S = 0.05
SHARE_BATCH = 5_000  # vectors per statement
EF_SEARCH_MAX = 1_000  # pgvector's upper bound for hnsw.ef_search
INDEX_BUILD_MEMORY = "512MB"  # maintenance_work_mem while this session builds an HNSW index
# Inserting a row into pgvector's HNSW index costs about this many rows of a bulk build (6.0 vs
# 0.64 ms a row, 384-d, M 16, ef_construction 200, docs/benchmarks.md): a batch of new rows that
# would cost more row by row than building the whole index again drops it first and rebuilds it.
INSERT_VS_BUILD = 9
BULK_MIN = 1_000  # smaller batches always insert into the index


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
        cache = user_cache_dir()
        if cache is None:
            raise StoreError("team memory keeps this machine's derived files in the user's cache folder, and no "
                             "safe one can be used (HOME unset or read-only, and the fallback refused); set "
                             "NUBOS_MEMORY_CACHE to a folder only you can write", code="store-cache-unavailable")
        self.folder = cache / "postgres" / f"{self.namespace[:40]}-{key}"
        self.cache = DerivedCache(self.folder, graph=False)  # candidates come from pgvector
        self.lexcache = LexicalCache(self.folder, self._digest)
        self._epoch: int | None = None  # of the log as last read
        self.usage = PgUsage(self)
        self._ns_key = hashlib.sha256(self.namespace.encode()).hexdigest()[:12]
        self._ef: int | None = None  # hnsw.ef_search as set on this session
        self.index_refused: str | None = None  # why this role could not build the HNSW index, if so
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
        conn, self._conn, self._ready, self._ef = self._conn, None, False, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - it is gone either way
                pass

    @contextmanager
    def db(self) -> Iterator[Any]:
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
                            "SELECT to_regtype('vector') IS NULL OR EXISTS (SELECT FROM unnest(%s::text[]) t "
                            "WHERE to_regclass(t) IS NULL) OR NOT EXISTS (SELECT FROM information_schema.columns "
                            "WHERE table_name = 'nubos_memory_namespace' AND column_name = 'usage_since')",
                            (list(TABLES),)).fetchone()[0]
                        if missing:  # only then: a role with table privileges alone needs no CREATE
                            self._conn.execute("SELECT pg_advisory_xact_lock(%s)",
                                               (_lock_key("nubos-memory-schema"),))
                            self._create_extension()
                            for statement in SCHEMA:
                                self._conn.execute(statement)
                        self._conn.execute("INSERT INTO nubos_memory_namespace (namespace) VALUES (%s) "
                                           "ON CONFLICT DO NOTHING", (self.namespace,))
                    _register_vector(self._conn)
                    self._ready = True
                yield self._conn
            except psycopg.Error as exc:
                raise self._fail(exc) from None

    def _create_extension(self) -> None:
        """pgvector, once per database; a clear error when this role may not create it."""
        import psycopg

        if self._conn.execute("SELECT to_regtype('vector') IS NOT NULL").fetchone()[0]:
            return
        try:
            with self._conn.transaction():  # a savepoint: the error below is ours, not an aborted transaction
                self._conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        except psycopg.Error as exc:
            why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise StoreError(f"the memory database at {self.place['host']} has no pgvector and this role cannot "
                             f"create it ({why[:200]}); a database owner runs CREATE EXTENSION vector once",
                             code="store-pgvector-missing", details={**self.place, "namespace": self.namespace}) from None

    # -- the place -------------------------------------------------------------------------
    def check(self) -> list[dict[str, Any]]:
        return []

    def prepare(self) -> None:
        ensure_dir(self.folder)
        with self.db():
            pass

    def describe(self) -> dict[str, Any]:
        return {"backend": self.kind, **self.place, "namespace": self.namespace, "cache_dir": str(self.folder),
                "candidates": "pgvector"}

    # -- the log -----------------------------------------------------------------------------
    def refresh(self, scan: LogScan | None) -> LogScan:
        """``scan`` with the lines committed since its cursor; a fresh parse after a rewrite."""
        # One statement: one snapshot (whole changes or none) and one round trip per query.
        statement = ("SELECT n.epoch, l.seq, l.line FROM nubos_memory_namespace n LEFT JOIN nubos_memory_log l "
                     "ON l.namespace = n.namespace AND l.seq > %s WHERE n.namespace = %s ORDER BY l.seq")
        with self.db() as conn:
            cursor = scan.cursor if scan is not None else 0
            found = conn.execute(statement, (cursor, self.namespace)).fetchall()
            epoch = int(found[0][0]) if found else 0
            if scan is None or scan.inode != epoch:  # first read, or memory-compact rewrote the log
                scan = LogScan(inode=epoch, generation=(scan.generation + 1) if scan is not None else 0)
                if cursor:  # those were lines past the old log's position: read the new one from its start
                    found = conn.execute(statement, (0, self.namespace)).fetchall()
                    epoch = int(found[0][0]) if found else 0
                    scan.inode = epoch
        self._epoch = epoch
        rows = [(seq, line) for _, seq, line in found if seq is not None]
        if rows:
            self.log.parse(scan, "".join(line + "\n" for _, line in rows).encode())
            scan.cursor = int(rows[-1][0])
        return scan

    def append(self, records: "Sequence[Record]", ops: Sequence[dict[str, Any]] = ()) -> None:
        """One transaction (under the lock): committed before this returns, or an error."""
        lines = self.log.lines(records, ops)
        if not lines:
            return
        with self.db() as conn, conn.transaction(), conn.cursor() as cur:
            cur.executemany("INSERT INTO nubos_memory_log (namespace, line) VALUES (%s, %s)",
                            [(self.namespace, line.decode()) for line in lines])

    def settle(self, scan: LogScan) -> dict[str, Any] | None:
        return None  # a change is one transaction: a crashed writer leaves nothing half-written

    def rewrite(self, records: "Sequence[Record]") -> dict[str, Any]:
        """Under the lock: the log is copied to ``nubos_memory_log_backup`` and replaced, in one transaction."""
        with self.db() as conn, conn.transaction():
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

    def redact(self, ids: set[str], reason: str, keys: Sequence[str] = ()) -> dict[str, Any]:
        """Under the lock, one transaction: every record line of ``ids`` in the log and in its backups is
        replaced by a ``redact`` line (``recordlog.redact_lines``), the texts' shared vectors are deleted,
        and the epoch is bumped, so every machine reads the log again from its start."""
        found: list[str] = []
        tables: list[str] = []
        patterns = [f"%{rid}%" for rid in ids]
        with self.db() as conn, conn.transaction():
            for table, key in (("nubos_memory_log", "seq"), ("nubos_memory_log_backup", "ctid")):
                rows = conn.execute(f"SELECT {key}::text, line FROM {table} WHERE namespace = %s "
                                    "AND line LIKE ANY(%s)", (self.namespace, patterns)).fetchall()
                changed = []
                for ref, line in rows:
                    (new,), hit = redact_lines([line.encode() + b"\n"], ids, reason)
                    if hit:
                        changed.append((new.decode().rstrip("\n"), ref))
                        found += hit if table == "nubos_memory_log" else []
                if changed:
                    tables.append(table)
                    with conn.cursor() as cur:
                        cur.executemany(f"UPDATE {table} SET line = %s WHERE namespace = %s AND "
                                        f"{key} = %s::{'bigint' if key == 'seq' else 'tid'}",
                                        [(line, self.namespace, ref) for line, ref in changed])
            if keys:
                conn.execute("DELETE FROM nubos_memory_embeddings WHERE namespace = %s AND key = ANY(%s)",
                             (self.namespace, list(keys)))
            conn.execute("UPDATE nubos_memory_namespace SET epoch = epoch + 1 WHERE namespace = %s",
                         (self.namespace,))
        self.lexcache.invalidate()
        return {"lines": len(found), "ids": sorted(set(found)), "files": tables}

    def export_lines(self) -> Iterator[bytes]:
        """Every line of the log, in order (``memory-export``)."""
        with self.db() as conn, conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            with conn.cursor(name="nubos_memory_export") as cur:
                cur.execute("SELECT line FROM nubos_memory_log WHERE namespace = %s ORDER BY seq", (self.namespace,))
                for (line,) in cur:
                    yield line.encode() + b"\n"

    def drop(self) -> None:
        """Delete this namespace and everything in it (memory-eval's scratch namespaces only) and
        this machine's derived files of it."""
        import shutil

        from psycopg import sql

        with self.db() as conn, conn.transaction():
            for table in TABLES:
                conn.execute(sql.SQL("DELETE FROM {} WHERE namespace = %s").format(sql.Identifier(table)),
                             (self.namespace,))
            names = conn.execute("SELECT relname FROM pg_class WHERE relkind = 'i' AND relname LIKE %s",
                                 (f"{self._index_prefix()}%",)).fetchall()
            for (name,) in names:
                conn.execute(sql.SQL("DROP INDEX IF EXISTS {}").format(sql.Identifier(name)))
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
                with self.db() as conn:
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

    # -- derived state: vectors and candidates in the database ----------------------------------
    def shared_vectors(self, fingerprint: str, keys: list[str]) -> "dict[str, np.ndarray]":
        """Vectors another machine made for these texts (float4 in pgvector: exactly its numbers)."""
        out: dict[str, np.ndarray] = {}
        try:
            with self.db() as conn:
                for start in range(0, len(keys), SHARE_BATCH):
                    rows = conn.execute("SELECT key, embedding FROM nubos_memory_embeddings WHERE namespace = %s AND "
                                        "fingerprint = %s AND key = ANY(%s)",
                                        (self.namespace, fingerprint, keys[start:start + SHARE_BATCH]),
                                        binary=True).fetchall()
                    out.update(rows)
        except StoreError:
            return {}  # embedded here instead; a down database fails the write itself, not this
        return out

    def share_vectors(self, fingerprint: str, vectors: "dict[str, np.ndarray]") -> None:
        try:
            self._publish(fingerprint, list(vectors), list(vectors.values()))
        except StoreError:
            pass  # derived data: the next machine embeds it itself

    def _publish(self, fingerprint: str, keys: list[str], vectors: "Sequence[np.ndarray] | np.ndarray",
                 replace: bool = False) -> None:
        """Store vectors by text key (``replace``: overwrite what differs: a re-embed on request).
        A big batch of new rows goes in without the HNSW index, which is built again after it."""
        dropped = len(keys) >= BULK_MIN and self._before_bulk(fingerprint, keys)
        clash = ("DO UPDATE SET embedding = EXCLUDED.embedding WHERE "
                 "nubos_memory_embeddings.embedding IS DISTINCT FROM EXCLUDED.embedding" if replace else "DO NOTHING")
        statement = ("INSERT INTO nubos_memory_embeddings (namespace, fingerprint, key, embedding) "
                     f"VALUES (%s, %s, %s, %b) ON CONFLICT (namespace, fingerprint, key) {clash}")
        with self.db() as conn, conn.transaction(), conn.cursor() as cur:
            for start in range(0, len(keys), SHARE_BATCH):
                cur.executemany(statement, [(self.namespace, fingerprint, key, vectors[start + i])
                                            for i, key in enumerate(keys[start:start + SHARE_BATCH])])
        if dropped:
            self._ensure_index(fingerprint, len(vectors[0]))

    def commit(self, *, ids: list[str], hashes: list[str], vectors: "np.ndarray", embedding: dict[str, Any],
               params: "HnswParams", alpha: float, previous: "Manifest | None", base: "VectorIndex | None" = None,
               rebuilt: bool = False) -> "Manifest":
        """Under the lock: publish the rows to the database (so its index covers every vector this
        machine searches with), build the HNSW index once the namespace outgrows the exact scan,
        then commit this machine's generation."""
        import numpy as np

        fingerprint, dim = str(embedding["fingerprint"]), int(embedding["dim"])
        covered = bool(((previous or {}).get("candidates") or {}).get("covered"))
        if base is not None and covered:  # the base's rows are there already
            keys, rows = hashes[len(base):], vectors
        elif base is not None:  # a generation from before the database held vectors: all of it, once
            keys, rows = hashes, np.concatenate([np.asarray(base.vectors, dtype=np.float32), vectors])
        else:
            keys, rows = hashes, vectors
        self._publish(fingerprint, keys, rows, replace=rebuilt)
        if rebuilt:  # texts no live record has any more: the index forgets them
            with self.db() as conn:
                conn.execute("DELETE FROM nubos_memory_embeddings WHERE namespace = %s AND fingerprint = %s "
                             "AND NOT (key = ANY(%s))", (self.namespace, fingerprint, list(set(hashes))))
        index = self._ensure_index(fingerprint, dim)
        ensure_dir(self.folder)
        return self.cache.commit(ids=ids, hashes=hashes, vectors=vectors, embedding=embedding, params=params,
                                 alpha=alpha, previous=previous, base=base, rebuilt=rebuilt,
                                 extra={"candidates": {"engine": "pgvector", "covered": True, "index": index,
                                                       "index_refused": self.index_refused}})

    def _before_bulk(self, fingerprint: str, keys: list[str]) -> bool:
        """Drop the HNSW index before a batch that would cost more to insert into it row by row
        than to build it again in bulk (``_ensure_index`` builds it after the batch)."""
        from psycopg import sql

        name = self.index_name(fingerprint)
        with self.db() as conn, self._index_lock(conn) as mine:
            if not mine or conn.execute("SELECT to_regclass(%s) IS NULL", (name,)).fetchone()[0]:
                return False
            there, new = conn.execute(
                "SELECT count(*), %s - count(*) FILTER (WHERE key = ANY(%s)) FROM nubos_memory_embeddings "
                "WHERE namespace = %s AND fingerprint = %s",
                (len(set(keys)), list(set(keys)), self.namespace, fingerprint)).fetchone()
            if new >= BULK_MIN and new * INSERT_VS_BUILD >= there + new:
                conn.execute(sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}").format(sql.Identifier(name)))
                return True
        return False

    @contextmanager
    def _index_lock(self, conn: Any) -> Iterator[bool]:
        """Whether this session may drop or build the namespace's HNSW index now (one at a time,
        so no session drops an index another is still building)."""
        key = _lock_key(self.namespace + ":hnsw")
        mine = bool(conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()[0])
        try:
            yield mine
        finally:
            if mine:
                conn.execute("SELECT pg_advisory_unlock(%s)", (key,))

    def load_current(self) -> "tuple[Manifest | None, VectorIndex | None]":
        manifest, index = self.cache.load_current()
        candidates = (manifest or {}).get("candidates") or {}
        if index is not None and len(index) and candidates.get("covered") and candidates.get("index"):
            index.ann = PgCandidates(self, str((manifest or {}).get("embedding", {}).get("fingerprint")), index)
        return manifest, index

    def _index_prefix(self) -> str:
        return f"nubos_memory_hnsw_{self._ns_key}_"

    def index_name(self, fingerprint: str) -> str:
        """The HNSW index of this namespace's vectors under one fingerprint (a partial index)."""
        return self._index_prefix() + hashlib.sha256(fingerprint.encode()).hexdigest()[:12]

    def _ensure_index(self, fingerprint: str, dim: int) -> str | None:
        """The HNSW index's name, built first if the namespace has more vectors under this
        fingerprint than the exact scan serves; None while it needs none (or may not build it)."""
        from psycopg import sql

        from ..index import vectors as vector_index

        name, cfg = self.index_name(fingerprint), self.project.config
        with self.db() as conn, self._index_lock(conn) as mine:
            row = conn.execute("SELECT i.indisvalid FROM pg_class c JOIN pg_index i ON i.indexrelid = c.oid "
                               "WHERE c.relname = %s", (name,)).fetchone()
            if row is not None and row[0]:
                return name
            if not mine:  # another session is building it: it serves once built
                return None
            count = conn.execute("SELECT count(*) FROM nubos_memory_embeddings WHERE namespace = %s AND "
                                 "fingerprint = %s", (self.namespace, fingerprint)).fetchone()[0]
            if count <= vector_index.EXACT_LIMIT:
                return None
            if row is not None:  # a build that was interrupted leaves an invalid index: start again
                conn.execute(sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}").format(sql.Identifier(name)))
            conn.execute("SELECT set_config('maintenance_work_mem', %s, false)", (INDEX_BUILD_MEMORY,))
            try:  # CONCURRENTLY: other namespaces and readers go on while it builds
                self._create_index(conn, sql.SQL(
                    "CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON nubos_memory_embeddings USING hnsw "
                    "((embedding::vector({dim})) vector_cosine_ops) WITH (m = {m}, ef_construction = {efc}) "
                    "WHERE namespace = {ns} AND fingerprint = {fp}").format(
                        name=sql.Identifier(name), dim=sql.Literal(dim), m=sql.Literal(cfg.hnsw_m),
                        efc=sql.Literal(cfg.hnsw_ef_construction), ns=sql.Literal(self.namespace),
                        fp=sql.Literal(fingerprint)))
            finally:
                conn.execute("RESET maintenance_work_mem")
        return None if self.index_refused is not None else name

    def _create_index(self, conn: Any, statement: Any) -> None:
        """Build an index; a role that does not own the table may not, which costs speed, not
        answers (the exact scan serves), so it is reported in memory-stats, not raised."""
        import psycopg

        try:
            conn.execute(statement)
        except psycopg.errors.InsufficientPrivilege as exc:
            self.index_refused = str(exc).strip().splitlines()[0][:300]

    def nearest(self, fingerprint: str, dim: int, query: "np.ndarray", want: int, ef_search: int) -> list[str] | None:
        """The keys of the ``want`` texts nearest ``query`` by the HNSW index (None: ask too many)."""
        from psycopg import sql

        ef = max(ef_search, want)
        if ef > EF_SEARCH_MAX:
            return None
        with self.db() as conn:
            if self._ef != ef:
                conn.execute("SELECT set_config('hnsw.ef_search', %s, false)", (str(ef),))
                self._ef = ef
            # Not prepared: planned with these values, so the partial index's predicate matches.
            rows = conn.execute(sql.SQL(
                "SELECT key FROM nubos_memory_embeddings WHERE namespace = %s AND fingerprint = %s "
                "ORDER BY embedding::vector({dim}) <=> %b::vector({dim}) LIMIT %s").format(dim=sql.Literal(dim)),
                (self.namespace, fingerprint, query, want), prepare=False).fetchall()
        return [key for (key,) in rows]

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


class PgCandidates:
    """A generation's vector candidates from the database's HNSW index (``VectorIndex.ann``): keys
    found there become this generation's labels; the caller scores them exactly."""

    def __init__(self, store: PgStore, fingerprint: str, index: "VectorIndex"):
        self.store, self.fingerprint, self.index = store, fingerprint, index

    def __call__(self, query: "np.ndarray", want: int) -> "np.ndarray | None":
        import numpy as np

        try:
            keys = self.store.nearest(self.fingerprint, self.index.dim, query, want, self.index.ef_search)
        except StoreError:
            return None  # the exact scan answers
        if keys is None:
            return None
        found = [label for key in keys for label in self.index.labels_of_hash(key)]
        return np.array(found, dtype=np.int64)


class PgUsage:
    """Retrievals of one namespace, shared by every machine (``memory-prune`` decides on all of them)."""

    def __init__(self, store: PgStore):
        self.store = store

    def start(self) -> None:
        with self.store.db() as conn:
            conn.execute("UPDATE nubos_memory_namespace SET usage_since = coalesce(usage_since, %s) "
                         "WHERE namespace = %s", (time.time(), self.store.namespace))

    def record(self, ids: list[str]) -> bool:
        if not ids:
            return True
        now = round(time.time(), 3)
        try:
            with self.store.db() as conn, conn.transaction():
                conn.execute("INSERT INTO nubos_memory_usage AS u (namespace, id, count, last) "
                             "SELECT %s, id, 1, %s FROM unnest(%s::text[]) AS id ON CONFLICT (namespace, id) "
                             "DO UPDATE SET count = u.count + 1, last = greatest(u.last, EXCLUDED.last)",
                             (self.store.namespace, now, sorted(set(ids))))
                conn.execute("UPDATE nubos_memory_namespace SET usage_since = coalesce(usage_since, %s) "
                             "WHERE namespace = %s", (now, self.store.namespace))
        except StoreError:
            return False  # derived data: the query still answers, with a usage-not-recorded warning
        return True

    def summary(self) -> tuple[float | None, dict[str, list[float]]]:
        with self.store.db() as conn, conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            row = conn.execute("SELECT usage_since FROM nubos_memory_namespace WHERE namespace = %s",
                               (self.store.namespace,)).fetchone()
            rows = conn.execute("SELECT id, count, last FROM nubos_memory_usage WHERE namespace = %s",
                                (self.store.namespace,)).fetchall()
        since = row[0] if row is not None else None
        return (float(since) if since is not None else None), {rid: [int(n), float(t)] for rid, n, t in rows}

    def fold(self, force: bool = False) -> None:
        return None  # one row per record already


def _register_vector(conn: Any) -> None:
    """Send and receive numpy vectors as pgvector's binary form (float4, big-endian), so the
    numbers stored are exactly the float32 numbers computed."""
    import struct

    import numpy as np
    from psycopg.adapt import Dumper, Loader
    from psycopg.pq import Format
    from psycopg.types import TypeInfo

    info = TypeInfo.fetch(conn, "vector")
    if info is None:
        raise StoreError("pgvector's type is missing from the memory database", code="store-pgvector-missing")

    class VectorDumper(Dumper):
        format = Format.BINARY
        oid = info.oid

        def dump(self, obj: Any) -> bytes:
            vec = np.asarray(obj, dtype=">f4").reshape(-1)
            return struct.pack(">HH", len(vec), 0) + vec.tobytes()

    class VectorLoader(Loader):
        format = Format.BINARY

        def load(self, data: Any) -> Any:
            dim = struct.unpack_from(">H", data)[0]
            return np.frombuffer(bytes(data), dtype=">f4", count=dim, offset=4).astype(np.float32)

    conn.adapters.register_dumper(np.ndarray, VectorDumper)
    conn.adapters.register_loader(info.oid, VectorLoader)


def _lock_key(name: str) -> int:
    """A stable signed 64-bit advisory lock key for a name."""
    return int.from_bytes(hashlib.sha256(b"nubos-memory:" + name.encode()).digest()[:8], "big", signed=True)


def default_namespace(root: Path) -> str:
    """The project's folder name: the same on every machine that clones it under that name."""
    name = "".join(c if c.isalnum() or c in "._-" else "-" for c in root.resolve().name)
    return name[:128] or "default"

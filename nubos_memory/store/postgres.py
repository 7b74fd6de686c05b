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
  tombstones and groups are the same bytes (``log.py`` reads them), so
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

import atexit
import hashlib
import os
import socket
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import codes
from ..config import dsn_env_name
from ..errors import ConfigError, LockTimeout, StoreError
from ..fsio import dumps, ensure_dir
from ..log import LogScan, copied_lines, feed, frame, redact_lines, redactions_in, restart
from ..userdirs import user_cache_dir
from .cache import DerivedCache, LocalDerivedState
from .lexcache import LexicalCache
from .lock import try_enter

if TYPE_CHECKING:
    import numpy as np

    from ..columns import Digests, Strings
    from ..config import Project
    from ..index.lexical import PostingsBM25
    from ..index.vectors import HnswParams, Pieces, Questions, VectorIndex
    from ..types import Manifest, Record

# The tables, as migrations: version N is reached by running MIGRATIONS[N - 1] on version N - 1 (a
# database from before the schema table is version 1 if its tables exist).  The next change of the
# tables is a new entry here; a role that may not run it is told who must (store-schema-outdated).
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (  # 1: the tables of issue 15
        """CREATE TABLE IF NOT EXISTS nubos_memory_namespace (
               namespace text PRIMARY KEY, epoch bigint NOT NULL DEFAULT 0,
               created_at timestamptz NOT NULL DEFAULT now())""",
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
    ),
    (  # 2 (issue 21): the schema's version, a namespace's last write, when each shared vector was made
        """CREATE TABLE IF NOT EXISTS nubos_memory_schema (
               version integer NOT NULL, migrated_at timestamptz NOT NULL DEFAULT now())""",
        "ALTER TABLE nubos_memory_namespace ADD COLUMN IF NOT EXISTS updated_at timestamptz",
        "ALTER TABLE nubos_memory_embeddings ADD COLUMN IF NOT EXISTS created_at timestamptz DEFAULT now()",
    ),
)
SCHEMA_VERSION = len(MIGRATIONS)
TABLES = ("nubos_memory_namespace", "nubos_memory_log", "nubos_memory_log_backup", "nubos_memory_embeddings",
          "nubos_memory_usage", "nubos_memory_schema")
LOCK_POLL_S = 0.05
# Rows per executemany: one call is one wait on the server, bounded by timeout_s, and a row inserted
# into a large HNSW index can take 10-20 ms: a batch stays well within the deadline.
SHARE_BATCH = 250
LOG_BATCH = 5_000  # log lines per executemany (a change of more lines is still one transaction), keys per read
EF_SEARCH_MAX = 1_000  # pgvector's upper bound for hnsw.ef_search
INDEX_BUILD_MEMORY = "512MB"  # maintenance_work_mem while this session builds an HNSW index
INDEX_SNAPSHOT_WAIT_S = 2.0  # how long a write's index build waits for older transactions before giving up
INDEX_RETRY_S = 300.0  # a build that gave up is tried again by this process after this long
INDEX_CHECK_S = 30.0  # how often a process looks whether the index became valid (another session built it)
# Inserting a row into pgvector's HNSW index costs about this many rows of a bulk build (6.0 vs
# 0.64 ms a row, 384-d, M 16, ef_construction 200, docs/benchmarks.md): a batch of new rows that
# would cost more row by row than building the whole index again drops it first and rebuilds it.
INSERT_VS_BUILD = 9
BULK_MIN = 1_000  # smaller batches always insert into the index
USAGE_FLUSH_S = 30.0  # retrievals are written at most this often by a process (and when it exits)
# Up to this many rows a machine scans its own copy of the vectors for candidates instead of asking the
# pgvector index: measured 0.6 / 2.1 / 4.2 ms for 20k / 50k / 100k rows of 384 floats here, against
# 8-25 ms for the index's candidate query at 8k-100k rows (docs/benchmarks.md, issue 21).
LOCAL_SCAN_LIMIT = 200_000
MODEL_ACTIVE_DAYS = 7  # another fingerprint that got vectors this recently means another model in use


def where(dsn: str) -> dict[str, Any]:
    """Host, port and database of a DSN, for errors and stats (never the password or the DSN); raises
    ``store-dsn-invalid`` (quoting nothing of it) when it cannot be parsed."""
    from psycopg.conninfo import conninfo_to_dict

    try:
        info = conninfo_to_dict(dsn)
    except Exception:  # noqa: BLE001 - its message quotes the DSN: never shown
        raise ConfigError("the team database's connection string is malformed (it is not quoted here: it may hold "
                          "a password); check the variable that holds it", code=codes.STORE_DSN_INVALID,
                          details={"env": dsn_env_name()}) from None
    port = info.get("port")
    return {"host": info.get("host") or "localhost",
            "port": int(port) if isinstance(port, str) and port.isdigit() else 5432, "dbname": info.get("dbname")}


_CONNECTION: Any = None


def connection_class() -> Any:
    """A psycopg connection whose every wait on the server is bounded by ``deadline_s``: a server that
    stops answering (SIGSTOP, a network cut: neither its statement timeout nor, over a Unix socket, any
    keepalive ever fires) costs one call at most that long, then the connection is closed."""
    global _CONNECTION
    if _CONNECTION is None:
        import psycopg

        class DeadlineConnection(psycopg.Connection):
            deadline_s: float | None = 15.0

            def wait(self, gen: Any, interval: float = 0.1, timeout: float | None = None) -> Any:
                limit = self.deadline_s if timeout is None else timeout
                started = time.monotonic()
                try:
                    return super().wait(gen, interval, limit)
                except psycopg.OperationalError:
                    if limit is not None and time.monotonic() - started >= limit * 0.99:
                        self.pgconn.finish()  # the server said nothing in time: this connection is done
                        raise psycopg.OperationalError(f"no answer from the server within {limit:g} s") from None
                    raise

        _CONNECTION = DeadlineConnection
    return _CONNECTION


@dataclass(frozen=True)
class PgCursor:
    """Where a namespace's log was read to: its epoch (a new one after ``memory-compact`` rewrote the
    log) and the last sequence number read."""

    epoch: int
    seq: int


class PgStore(LocalDerivedState):
    """The :class:`~nubos_memory.store.base.Store` of one namespace in a PostgreSQL database."""

    kind = "postgres"
    shares_vectors = True

    def __init__(self, project: "Project", lock_timeout: float):
        settings = project.config.postgres
        self.project = project
        self.env = dsn_env_name()
        dsn = os.environ.get(self.env, "")
        if not dsn.strip():
            raise ConfigError(f"memory.backend is postgres but ${self.env} is not set; put the connection "
                              "string in the environment (never in config.json, which is committed)",
                              code=codes.STORE_DSN_MISSING, details={"env": self.env})
        if not settings.namespace:
            raise ConfigError('memory.backend is postgres but memory.postgres.namespace is not set: name the team '
                              'memory explicitly (e.g. {"postgres": {"namespace": "acme-billing"}}), so that every '
                              "clone of every machine agrees and no two projects share one by accident",
                              code=codes.STORE_NAMESPACE_MISSING, details={"key": "memory.postgres.namespace"})
        self.dsn = dsn
        self.place = where(dsn)
        self.namespace = settings.namespace
        self.timeout_s = settings.timeout_s
        self.lock_hold_s = settings.lock_hold_s
        self.lock_timeout = lock_timeout
        key = hashlib.sha256(dumps([self.place, self.namespace])).hexdigest()[:16]
        cache = user_cache_dir()
        if cache is None:
            raise StoreError("team memory keeps this machine's derived files in the user's cache folder, and no "
                             "safe one can be used (HOME unset or read-only, and the fallback refused); set "
                             "NUBOS_MEMORY_CACHE to a folder only you can write", code=codes.STORE_CACHE_UNAVAILABLE)
        self.folder = cache / "postgres" / f"{self.namespace[:40]}-{key}"
        self.cache = DerivedCache(self.folder, graph=False)  # candidates come from pgvector
        self.lexcache = LexicalCache(self.folder, self._digest, self.cache.verified)
        self._epoch: int | None = None  # of the log as last read
        self.usage = PgUsage(self)
        self._ns_key = hashlib.sha256(self.namespace.encode()).hexdigest()[:12]
        self._ef: int | None = None  # hnsw.ef_search as set on this session
        self.index_refused: str | None = None  # why this role could not build the HNSW index, if so
        self.index_note: str | None = None  # why the last build here did not finish (an old snapshot)
        self._index_tried = -INDEX_RETRY_S  # when this process last tried to build it
        self._index_due: tuple[str, int] | None = None  # (fingerprint, dim) a commit may have made worth an index
        self._valid: dict[str, tuple[float, bool]] = {}  # fingerprint -> (when looked, index valid)
        self.namespace_existed: bool | None = None  # before this process first looked (None: not yet)
        self._conn: Any = None
        self._lock_conn: Any = None  # the session that holds the write lock (its own, see lock())
        self._mutex = threading.RLock()  # one connection, used by one thread at a time
        self._lock_mutex = threading.Lock()
        self._held = threading.Lock()  # advisory locks are re-entrant per session: not across threads
        self._lock_lost = False  # the lock session died while held (the heartbeat saw it)
        self._ready = False
        self._notices: list[dict[str, Any]] = []

    # -- the connection ----------------------------------------------------------------------
    def _scrub(self, text: str) -> str:
        """``text`` without anything of the DSN but its host, port and database (a server or driver
        message may quote the connection string or the password)."""
        from psycopg.conninfo import conninfo_to_dict

        secrets_ = [self.dsn]
        try:
            info = conninfo_to_dict(self.dsn)
            secrets_ += [str(v) for k, v in info.items() if k not in ("host", "port", "dbname") and len(str(v)) >= 3]
        except Exception:  # noqa: BLE001 - where() refused a malformed DSN already
            pass
        for secret in sorted(secrets_, key=len, reverse=True):
            text = text.replace(secret, "…")
        return text

    def _fail(self, exc: BaseException) -> StoreError:
        import psycopg

        self._drop()
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        why = self._scrub(why)[:300]
        host = self.place["host"]
        details = {**self.place, "namespace": self.namespace, "env": self.env}
        if isinstance(exc, psycopg.errors.InsufficientPrivilege):
            return StoreError(f"this role may not do that in the memory database at {host}: {why}. The README's "
                              "Team memory section lists the GRANTs of the owner, writer and reader roles",
                              code=codes.STORE_PERMISSION_DENIED, details=details)
        return StoreError(f"the memory database at {host} is unavailable: {why}", code=codes.STORE_UNAVAILABLE,
                          details=details)

    def _drop(self) -> None:
        conn, self._conn, self._ready, self._ef = self._conn, None, False, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - it is gone either way
                pass

    def connect(self, application: str = "nubos-memory", *, deadline: bool = True) -> Any:
        """A new session: bounded everywhere (connect, each wait on the server, each statement, locks,
        idle transactions; TCP keepalives and tcp_user_timeout where the transport is TCP)."""
        ms = int(self.timeout_s * 1000)
        conn = connection_class().connect(
            self.dsn, autocommit=True, connect_timeout=max(1, min(10, round(self.timeout_s))),
            application_name=application[:63], keepalives=1, keepalives_idle=max(1, round(self.timeout_s / 3)),
            keepalives_interval=max(1, round(self.timeout_s / 6)), keepalives_count=3, tcp_user_timeout=ms,
            options=f"-c statement_timeout={ms} -c lock_timeout={ms} "
                    f"-c idle_in_transaction_session_timeout={max(ms, int(self.lock_hold_s * 1000))}")
        conn.deadline_s = self.timeout_s if deadline else None
        return conn

    @contextmanager
    def db(self) -> Iterator[Any]:
        """The connection (made on first use, remade after a failure); errors as ``store-unavailable``
        (or ``store-permission-denied``).  Reading needs SELECT only: nothing is written on connect."""
        import psycopg

        with self._mutex:
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = self.connect()
                if not self._ready:
                    self._migrate(self._conn)
                    _register_vector(self._conn)
                    self._ready = True
                yield self._conn
            except psycopg.Error as exc:
                raise self._fail(exc) from None

    def _migrate(self, conn: Any) -> None:
        """Bring the tables to ``SCHEMA_VERSION`` (creating them on the first run), or say who must."""
        import psycopg

        with conn.transaction():
            version = self._schema_version(conn)
            if version == SCHEMA_VERSION:
                return
            if version > SCHEMA_VERSION:
                raise StoreError(f"the memory database's tables are of schema version {version}, newer than this "
                                 f"nubos-memory knows ({SCHEMA_VERSION}); upgrade nubos-memory",
                                 code=codes.STORE_SCHEMA_NEWER, details={"found": version, "known": SCHEMA_VERSION})
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_lock_key("nubos-memory-schema"),))
            version = self._schema_version(conn)  # another session may have migrated meanwhile
            if version < 1:
                self._create_extension(conn)
            try:
                with conn.transaction():
                    for step in MIGRATIONS[version:]:
                        for statement in step:
                            conn.execute(statement)
                    conn.execute("DELETE FROM nubos_memory_schema")
                    conn.execute("INSERT INTO nubos_memory_schema (version) VALUES (%s)", (SCHEMA_VERSION,))
            except psycopg.errors.InsufficientPrivilege as exc:
                raise StoreError(f"the memory database's tables are at schema version {version} and this role may "
                                 f"not bring them to {SCHEMA_VERSION} ({self._scrub(str(exc).splitlines()[0])[:200]}); "
                                 "run any nubos-memory verb once as the role that owns them (the README's owner role)",
                                 code=codes.STORE_SCHEMA_OUTDATED, details={"found": version, "known": SCHEMA_VERSION,
                                                                        **self.place}) from None

    @staticmethod
    def _schema_version(conn: Any) -> int:
        if conn.execute("SELECT to_regclass('nubos_memory_schema') IS NOT NULL").fetchone()[0]:
            row = conn.execute("SELECT max(version) FROM nubos_memory_schema").fetchone()
            if row is not None and row[0] is not None:
                return int(row[0])
        have = conn.execute("SELECT count(*) FROM unnest(%s::text[]) t WHERE to_regclass(t) IS NOT NULL",
                            (list(TABLES[:5]),)).fetchone()[0]
        return 1 if have == 5 else 0

    def _create_extension(self, conn: Any) -> None:
        """pgvector, once per database; a clear error saying who must act when this role cannot."""
        import psycopg

        if conn.execute("SELECT to_regtype('vector') IS NOT NULL").fetchone()[0]:
            return
        available = conn.execute("SELECT count(*) FROM pg_available_extensions WHERE name = 'vector'").fetchone()[0]
        if not available:
            raise StoreError(f"the PostgreSQL server at {self.place['host']} has no pgvector package installed; its "
                             "administrator installs it (e.g. the postgresql-16-pgvector package), then a superuser "
                             "runs CREATE EXTENSION vector in the database once",
                             code=codes.STORE_PGVECTOR_MISSING, details={**self.place, "who": "server administrator"})
        try:
            with conn.transaction():  # a savepoint: the error below is ours, not an aborted transaction
                conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        except psycopg.Error as exc:
            why = self._scrub(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)
            raise StoreError(f"pgvector is installed on the server at {self.place['host']} but not created in this "
                             f"database, and this role may not create it ({why[:200]}); a superuser runs "
                             "CREATE EXTENSION vector in the database once", code=codes.STORE_PGVECTOR_MISSING,
                             details={**self.place, "namespace": self.namespace, "who": "superuser"}) from None

    def _ensure_namespace(self, conn: Any) -> None:
        """Under the write lock: the namespace's row exists (a write creates it; reads never do)."""
        if self.namespace_existed is None:
            self.namespace_existed = bool(conn.execute("SELECT EXISTS (SELECT FROM nubos_memory_namespace WHERE "
                                                       "namespace = %s)", (self.namespace,)).fetchone()[0])
        conn.execute("INSERT INTO nubos_memory_namespace (namespace) VALUES (%s) ON CONFLICT DO NOTHING",
                     (self.namespace,))

    # -- the place -------------------------------------------------------------------------
    def check(self) -> list[dict[str, Any]]:
        self._notices = []  # filled as this call learns things (an empty namespace no write ever reached)
        return self._notices

    def prepare(self) -> None:
        ensure_dir(self.folder)
        with self.db():
            pass

    def describe(self) -> dict[str, Any]:
        return {"backend": self.kind, **self.place, "namespace": self.namespace, "cache_dir": str(self.folder),
                "candidates": "pgvector", "namespace_existed": self.namespace_existed,
                "schema_version": SCHEMA_VERSION}

    # -- the log -----------------------------------------------------------------------------
    def refresh(self, scan: LogScan | None) -> LogScan:
        """``scan`` with the lines committed since its cursor; a fresh parse after a rewrite."""
        # One statement: one snapshot (whole changes or none) and one round trip per query.
        statement = ("SELECT n.epoch, l.seq, l.line FROM nubos_memory_namespace n LEFT JOIN nubos_memory_log l "
                     "ON l.namespace = n.namespace AND l.seq > %s WHERE n.namespace = %s ORDER BY l.seq")
        with self.db() as conn:
            cursor = scan.cursor if scan is not None and isinstance(scan.cursor, PgCursor) else PgCursor(-1, 0)
            found = conn.execute(statement, (cursor.seq, self.namespace)).fetchall()
            epoch = int(found[0][0]) if found else 0
            if scan is None or cursor.epoch != epoch:  # first read, or memory-compact rewrote the log
                scan = restart(scan)
                if cursor.seq:  # those were lines past the old log's position: read the new one from its start
                    found = conn.execute(statement, (0, self.namespace)).fetchall()
                    epoch = int(found[0][0]) if found else 0
                scan.cursor = cursor = PgCursor(epoch, 0)
        self._epoch = epoch
        if not found:  # no write ever reached this namespace: a typo in memory.postgres.namespace?
            if self.namespace_existed is None:
                self.namespace_existed = False
            note = {"code": codes.NAMESPACE_EMPTY, "namespace": self.namespace,
                    "message": f"no write has ever reached namespace {self.namespace!r} of the memory database at "
                               f"{self.place['host']}; if you expected a team memory here, check "
                               "memory.postgres.namespace (memory-namespaces lists them)"}
            if note not in self._notices:
                self._notices.append(note)
        elif self.namespace_existed is None:
            self.namespace_existed = True
        rows = [(seq, line) for _, seq, line in found if seq is not None]
        if rows:
            feed(scan, "".join(line + "\n" for _, line in rows).encode())
            scan.cursor = PgCursor(epoch, int(rows[-1][0]))
        return scan

    def append(self, records: "Sequence[Record]", ops: Sequence[dict[str, Any]] = ()) -> None:
        """One transaction (under the lock): committed before this returns, or an error."""
        lines = frame(records, ops)
        if not lines:
            return
        self._still_locked()
        with self.db() as conn, conn.transaction():
            self._ensure_namespace(conn)
            with conn.cursor() as cur:
                for start in range(0, len(lines), LOG_BATCH):
                    cur.executemany("INSERT INTO nubos_memory_log (namespace, line) VALUES (%s, %s)",
                                    [(self.namespace, line.decode()) for line in lines[start:start + LOG_BATCH]])
            conn.execute("UPDATE nubos_memory_namespace SET updated_at = now() WHERE namespace = %s", (self.namespace,))

    def settle(self, scan: LogScan) -> dict[str, Any] | None:
        return None  # a change is one transaction: a crashed writer leaves nothing half-written

    def rewrite(self, records: "Sequence[Record]") -> dict[str, Any]:
        """Under the lock: the log is copied to ``nubos_memory_log_backup`` and replaced by ``records`` and
        its ``redact`` lines, in one transaction."""
        self._still_locked()
        with self.db() as conn, conn.transaction():
            epoch = int(conn.execute("UPDATE nubos_memory_namespace SET epoch = epoch + 1 WHERE namespace = %s "
                                     "RETURNING epoch", (self.namespace,)).fetchone()[0])
            conn.execute("INSERT INTO nubos_memory_log_backup (namespace, epoch, seq, line) "
                         "SELECT namespace, %s, seq, line FROM nubos_memory_log WHERE namespace = %s",
                         (epoch - 1, self.namespace))
            before = int(conn.execute("SELECT coalesce(sum(octet_length(line) + 1), 0) FROM nubos_memory_log "
                                      "WHERE namespace = %s", (self.namespace,)).fetchone()[0])
            rows = conn.execute("SELECT line FROM nubos_memory_log WHERE namespace = %s AND line LIKE %s "
                                "ORDER BY seq", (self.namespace, '%"redact"%')).fetchall()
            kept = redactions_in(line.encode() for (line,) in rows)
            conn.execute("DELETE FROM nubos_memory_log WHERE namespace = %s", (self.namespace,))
            lines = [dumps(r).decode() for r in [*records, *kept]]
            with conn.cursor() as cur:
                cur.executemany("INSERT INTO nubos_memory_log (namespace, line) VALUES (%s, %s)",
                                [(self.namespace, line) for line in lines])
        return {"backup": f"nubos_memory_log_backup (namespace {self.namespace!r}, epoch {epoch - 1})",
                "bytes": {"before": before, "after": sum(len(line.encode()) + 1 for line in lines)}}

    def redact(self, ids: set[str], reason: str, keys: Sequence[str] = ()) -> dict[str, Any]:
        """Under the lock, one transaction: every record line of ``ids`` in the log and in its backups is
        replaced by a ``redact`` line (``log.redact_lines``), the texts' shared vectors are deleted,
        and the epoch is bumped, so every machine reads the log again from its start."""
        self._still_locked()
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

    def held_in_copies(self, ids: set[str]) -> dict[str, set[str]]:
        with self.db() as conn:
            rows = conn.execute("SELECT line FROM nubos_memory_log_backup WHERE namespace = %s AND line LIKE ANY(%s)",
                                (self.namespace, [f"%{rid}%" for rid in ids])).fetchall()
        return copied_lines([[line.encode() + b"\n" for (line,) in rows]], ids)

    def export_lines(self) -> Iterator[bytes]:
        """Every line of the log, in order (``memory-export``)."""
        with self.db() as conn, conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            with conn.cursor(name="nubos_memory_export") as cur:
                cur.execute("SELECT line FROM nubos_memory_log WHERE namespace = %s ORDER BY seq", (self.namespace,))
                for (line,) in cur:
                    yield line.encode() + b"\n"

    def namespaces(self) -> list[dict[str, Any]]:
        """Every namespace of the database: log lines, live-ish record lines, vectors, created, last write."""
        with self.db() as conn:
            rows = conn.execute(
                "SELECT n.namespace, n.created_at, n.updated_at, "
                "(SELECT count(*) FROM nubos_memory_log l WHERE l.namespace = n.namespace), "
                "(SELECT count(*) FROM nubos_memory_log l WHERE l.namespace = n.namespace AND l.line NOT LIKE "
                "'{\"op\"%%'), "
                "(SELECT count(*) FROM nubos_memory_embeddings e WHERE e.namespace = n.namespace) "
                "FROM nubos_memory_namespace n ORDER BY n.namespace").fetchall()
        return [{"namespace": ns, "created_at": created.isoformat() if created else None,
                 "last_write": updated.isoformat() if updated else None, "lines": int(lines),
                 "record_lines": int(records), "vectors": int(vectors), "this_project": ns == self.namespace}
                for ns, created, updated, lines, records, vectors in rows]

    def drop_namespace(self, name: str) -> dict[str, Any]:
        """Delete a namespace and everything in it (its log, backups, vectors, usage and HNSW indexes);
        this machine's derived files of it too when it is this project's."""
        import shutil

        from psycopg import sql

        prefix = f"nubos_memory_hnsw_{hashlib.sha256(name.encode()).hexdigest()[:12]}_"
        with self.db() as conn, conn.transaction():
            counts = {}
            for table in TABLES[:5]:
                cur = conn.execute(sql.SQL("DELETE FROM {} WHERE namespace = %s").format(sql.Identifier(table)),
                                   (name,))
                counts[table] = cur.rowcount
            indexes = [n for (n,) in conn.execute("SELECT relname FROM pg_class WHERE relkind = 'i' AND relname "
                                                  "LIKE %s", (f"{prefix}%",)).fetchall()]
            for index in indexes:
                conn.execute(sql.SQL("DROP INDEX IF EXISTS {}").format(sql.Identifier(index)))
        if name == self.namespace:
            shutil.rmtree(self.folder, ignore_errors=True)
        return {"dropped": name, "rows": counts, "indexes": indexes}

    def owns(self, path: Path) -> bool:
        return False  # the log is in the database: no file is its own

    def discard(self) -> None:
        """Delete this namespace (memory-eval's scratch namespaces) and this machine's derived files of it."""
        self.drop_namespace(self.namespace)

    # -- the lock ------------------------------------------------------------------------------
    @contextmanager
    def _lock_session(self, verb: str) -> Iterator[Any]:
        """The session that holds the write lock: its own connection, named after its holder (verb, host,
        pid) in ``application_name``, ended by the server once idle for ``lock_hold_s`` (PostgreSQL 14+
        ``idle_session_timeout``): the holder's heartbeat keeps it alive, so a paused or cut-off writer
        loses the lock after that long instead of holding it for the life of its session."""
        import psycopg

        with self._lock_mutex:
            name = f"nubos-memory {verb} {socket.gethostname()[:24]} pid {os.getpid()}"
            if self._lock_conn is not None and not self._lock_conn.closed:
                try:  # kept from an earlier lock: the server ends it once idle past lock_hold_s
                    self._lock_conn.execute("SELECT set_config('application_name', %s, false)", (name[:63],))
                except psycopg.Error:
                    self._lock_conn.close()
                    self._lock_conn = None
            try:
                if self._lock_conn is None or self._lock_conn.closed:
                    self._lock_conn = self.connect(name)
                    try:
                        self._lock_conn.execute("SELECT set_config('idle_session_timeout', %s, false)",
                                                (f"{int(self.lock_hold_s * 1000)}",))
                    except psycopg.Error:  # before PostgreSQL 14: no such setting, no such protection
                        pass
                yield self._lock_conn
            except psycopg.Error as exc:
                if self._lock_conn is not None:
                    self._lock_conn.close()
                self._lock_conn = None
                raise self._fail(exc) from None

    def _holder(self, key: int) -> dict[str, Any] | None:
        """Who holds the write lock: backend pid, client address, application name (verb, host, pid of
        a nubos-memory writer), since when; None when nobody (or it cannot be seen)."""
        unsigned = key & 0xFFFFFFFFFFFFFFFF
        try:
            with self.db() as conn:
                row = conn.execute(
                    "SELECT a.pid, a.client_addr::text, a.application_name, a.backend_start, a.state_change, a.state "
                    "FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory' AND "
                    "l.granted AND l.classid = %s AND l.objid = %s AND l.objsubid = 1",
                    (unsigned >> 32, unsigned & 0xFFFFFFFF)).fetchone()
        except StoreError:
            return None
        if row is None:
            return None
        pid, addr, app, started, changed, state = row
        return {"backend_pid": pid, "client_addr": addr or "local socket", "application_name": app,
                "session_since": started.isoformat() if started else None,
                "idle_since": changed.isoformat() if changed and state == "idle" else None,
                "break_with": f"SELECT pg_terminate_backend({pid});"}

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
                with self._lock_session(verb) as conn:
                    if conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()[0]:
                        break
                if time.monotonic() >= deadline:
                    holder = self._holder(key)
                    who = (f" (backend {holder['backend_pid']}, {holder['application_name'] or 'no name'}, from "
                           f"{holder['client_addr']})") if holder else ""
                    raise LockTimeout(f"another writer holds the write lock of namespace {self.namespace!r}{who} "
                                      f"(waited {wait:g}s); a writer that stopped loses it after "
                                      f"memory.postgres.lock_hold_s = {self.lock_hold_s:g}s",
                                      details={"waited_s": wait, "namespace": self.namespace, **self.place,
                                               "holder": holder})
                time.sleep(LOCK_POLL_S)
            self._lock_lost = False
            stop = threading.Event()
            beat = threading.Thread(target=self._heartbeat, args=(stop,), name="nubos-memory-lock", daemon=True)
            beat.start()
            try:
                yield
            finally:
                stop.set()
                beat.join()
                with self._lock_mutex:
                    if self._lock_conn is not None and not self._lock_conn.closed:
                        try:
                            self._lock_conn.execute("SELECT pg_advisory_unlock(%s)", (key,))
                        except Exception:  # noqa: BLE001 - a lost session released it already
                            self._lock_conn.close()
                            self._lock_conn = None
        finally:
            self._held.release()

    def _heartbeat(self, stop: threading.Event) -> None:
        """Keep the lock session from looking idle while this process works under the lock."""
        while not stop.wait(max(0.2, self.lock_hold_s / 4)):
            with self._lock_mutex:
                try:
                    if self._lock_conn is not None and not self._lock_conn.closed:
                        self._lock_conn.execute("SELECT 1")
                except Exception:  # noqa: BLE001 - the session is gone: so is the lock
                    self._lock_lost = True
                    return

    def _still_locked(self) -> None:
        """Before a change: the lock session is alive (a writer paused past ``lock_hold_s`` lost its lock,
        and another may hold it now: its change must not land)."""
        lost = self._lock_lost
        if not lost and self._held.locked():
            with self._lock_mutex:
                try:
                    if self._lock_conn is None or self._lock_conn.closed:
                        lost = True
                    else:
                        self._lock_conn.execute("SELECT 1")
                except Exception:  # noqa: BLE001
                    lost = True
        if lost:
            raise StoreError(f"this writer lost the write lock of namespace {self.namespace!r} (its session was "
                             f"idle longer than memory.postgres.lock_hold_s = {self.lock_hold_s:g}s: a paused "
                             "process?); nothing was written, try again", code=codes.STORE_LOCK_LOST,
                             details={"namespace": self.namespace, **self.place})

    def try_lock(self, verb: str) -> AbstractContextManager[bool]:
        return try_enter(self.lock(verb, timeout=0), (LockTimeout, StoreError))

    # -- derived state: vectors and candidates in the database ----------------------------------
    def shared_vectors(self, fingerprint: str, keys: list[str]) -> "dict[str, np.ndarray]":
        """Vectors another machine made for these texts (float4 in pgvector: exactly its numbers)."""
        out: dict[str, np.ndarray] = {}
        try:
            with self.db() as conn:
                for start in range(0, len(keys), LOG_BATCH):
                    rows = conn.execute("SELECT key, embedding FROM nubos_memory_embeddings WHERE namespace = %s AND "
                                        "fingerprint = %s AND key = ANY(%s)",
                                        (self.namespace, fingerprint, keys[start:start + LOG_BATCH]),
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
        if dropped:  # built again after the write, outside the lock (maintain): now, not after a retry pause
            self._index_tried = -INDEX_RETRY_S
            self._valid.pop(fingerprint, None)

    def commit(self, *, ids: "Strings", hashes: "Digests", vectors: "np.ndarray", embedding: dict[str, Any],
               params: "HnswParams", alpha: float, previous: "Manifest | None", base: "VectorIndex | None" = None,
               rebuilt: bool = False, side_weight: "dict[str, Any] | None" = None,
               pieces: "Pieces | None" = None, questions: "Questions | None" = None) -> "Manifest":
        """Under the lock: publish the rows to the database (so its index covers every vector this
        machine searches with), then commit this machine's generation.  The HNSW index is never built
        here (a build waits for every older transaction in the database, and would hold every writer
        of the namespace meanwhile): :meth:`maintain` builds it after the lock is released."""
        import numpy as np

        fingerprint, dim = str(embedding["fingerprint"]), int(embedding["dim"])
        covered = bool(((previous or {}).get("candidates") or {}).get("covered"))
        if base is not None and covered:  # the base's rows are there already
            keys, rows = list(hashes[len(base):]), vectors
        elif base is not None:  # a generation from before the database held vectors: all of it, once
            keys, rows = list(hashes), np.concatenate([np.asarray(base.vectors, dtype=np.float32), vectors])
        else:
            keys, rows = list(hashes), vectors  # (a list: what the driver adapts)
        try:
            self._publish(fingerprint, keys, rows, replace=rebuilt)
            if rebuilt:  # texts no live record has any more: the index forgets them
                with self.db() as conn:
                    conn.execute("DELETE FROM nubos_memory_embeddings WHERE namespace = %s AND fingerprint = %s "
                                 "AND NOT (key = ANY(%s))", (self.namespace, fingerprint, list(set(hashes))))
            covered = True
        except StoreError as exc:
            if exc.code != codes.STORE_PERMISSION_DENIED:
                raise
            covered = False  # a reader role: this machine's generation serves it, nothing is shared
        from ..index import vectors as vector_index

        if len(ids) > vector_index.EXACT_LIMIT:  # only then can the namespace need its index
            self._index_due = (fingerprint, dim)
        ensure_dir(self.folder)
        return self.cache.commit(ids=ids, hashes=hashes, vectors=vectors, embedding=embedding, params=params,
                                 alpha=alpha, previous=previous, base=base, rebuilt=rebuilt, side_weight=side_weight,
                                 extra={"candidates": {"engine": "pgvector", "covered": covered}}, pieces=pieces,
                                 questions=questions)

    def _before_bulk(self, fingerprint: str, keys: list[str]) -> bool:
        """Drop the HNSW index before a batch that would cost more to insert into it row by row
        than to build it again in bulk (:meth:`maintain` builds it after the write)."""
        import psycopg
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
                try:  # not CONCURRENTLY: that waits for every older transaction, and this runs under the lock
                    with conn.transaction():
                        conn.execute("SET LOCAL lock_timeout = '2s'")
                        conn.execute(sql.SQL("DROP INDEX IF EXISTS {}").format(sql.Identifier(name)))
                except psycopg.errors.LockNotAvailable:
                    return False  # a long query is using the table: insert into the index row by row
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
        if index is not None and len(index) and candidates.get("covered"):
            index.ann = PgCandidates(self, str((manifest or {}).get("embedding", {}).get("fingerprint")), index)
        return manifest, index

    def index_valid(self, fingerprint: str) -> bool:
        """Whether the namespace's HNSW index under this fingerprint is built and valid (looked up at
        most every ``INDEX_CHECK_S``: a build by another session serves from then on)."""
        now = time.monotonic()
        known = self._valid.get(fingerprint)
        if known is not None and now - known[0] < INDEX_CHECK_S:
            return known[1]
        try:
            with self.db() as conn:
                row = conn.execute("SELECT i.indisvalid FROM pg_class c JOIN pg_index i ON i.indexrelid = c.oid "
                                   "WHERE c.relname = %s", (self.index_name(fingerprint),)).fetchone()
        except StoreError:
            return False
        valid = bool(row is not None and row[0])
        self._valid[fingerprint] = (now, valid)
        return valid

    def maintain(self, wait_s: float | None = None) -> dict[str, Any] | None:
        """Outside the write lock, after a write: build the HNSW index the namespace now needs (more
        vectors under a fingerprint than the exact scan serves, and no valid index).  The build waits
        at most ``wait_s`` (default ``INDEX_SNAPSHOT_WAIT_S``) for older transactions in the database
        (CREATE INDEX CONCURRENTLY waits for every one of them: a report, a pg_dump); then it gives up,
        leaves no invalid index behind, and says why (``memory-stats.store.index``); queries scan
        exactly meanwhile.  A process tries again after ``INDEX_RETRY_S``; ``memory-rebuild`` waits
        ``memory.postgres.timeout_s``."""
        due = getattr(self, "_index_due", None)
        if due is None or (wait_s is None and time.monotonic() - self._index_tried < INDEX_RETRY_S):
            return None
        self._index_due = None
        fingerprint, dim = due
        if self.index_valid(fingerprint):
            return None
        self._index_tried = time.monotonic()
        self._valid.pop(fingerprint, None)
        return self._ensure_index(fingerprint, dim, INDEX_SNAPSHOT_WAIT_S if wait_s is None else wait_s)

    def _index_prefix(self) -> str:
        return f"nubos_memory_hnsw_{self._ns_key}_"

    def index_name(self, fingerprint: str) -> str:
        """The HNSW index of this namespace's vectors under one fingerprint (a partial index)."""
        return self._index_prefix() + hashlib.sha256(fingerprint.encode()).hexdigest()[:12]

    def _ensure_index(self, fingerprint: str, dim: int, wait_s: float) -> dict[str, Any] | None:
        """Build the HNSW index in a session of its own (no client deadline: a build of 100k rows takes
        about a minute), waiting at most ``wait_s`` for older transactions; what happened, or None when
        none was needed or another session is at it."""
        import psycopg
        from psycopg import sql

        from ..index import vectors as vector_index

        name, cfg = self.index_name(fingerprint), self.project.config
        try:
            conn = self.connect(f"nubos-memory index build pid {os.getpid()}", deadline=False)
        except psycopg.Error as exc:
            raise self._fail(exc) from None
        try:
            with self._index_lock(conn) as mine:
                if not mine:  # another session is building it: it serves once built
                    return None
                count = conn.execute("SELECT count(*) FROM nubos_memory_embeddings WHERE namespace = %s AND "
                                     "fingerprint = %s", (self.namespace, fingerprint)).fetchone()[0]
                if count <= vector_index.EXACT_LIMIT:
                    return None
                conn.execute("SELECT set_config('lock_timeout', %s, false), set_config('statement_timeout', '0', "
                             "false), set_config('maintenance_work_mem', %s, false)",
                             (f"{int(wait_s * 1000)}", INDEX_BUILD_MEMORY))
                self._drop_invalid(conn, name)
                started = time.monotonic()
                try:  # CONCURRENTLY: writers and readers of every namespace go on while it builds
                    conn.execute(sql.SQL(
                        "CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON nubos_memory_embeddings USING hnsw "
                        "((embedding::vector({dim})) vector_cosine_ops) WITH (m = {m}, ef_construction = {efc}) "
                        "WHERE namespace = {ns} AND fingerprint = {fp}").format(
                            name=sql.Identifier(name), dim=sql.Literal(dim), m=sql.Literal(cfg.hnsw_m),
                            efc=sql.Literal(cfg.hnsw_ef_construction), ns=sql.Literal(self.namespace),
                            fp=sql.Literal(fingerprint)))
                except psycopg.errors.InsufficientPrivilege as exc:
                    self.index_refused = self._scrub(str(exc).strip().splitlines()[0])[:300]
                    return {"built": False, "why": self.index_refused}
                except (psycopg.errors.LockNotAvailable, psycopg.errors.QueryCanceled):
                    self._drop_invalid(conn, name)
                    self.index_note = (f"the HNSW index build waited {wait_s:g}s for older transactions in the "
                                       "database (memory-stats.store.index.blocked_by) and gave up; queries scan "
                                       "exactly until a later write or memory-rebuild builds it")
                    return {"built": False, "why": self.index_note}
                self.index_note = None
                self._valid[fingerprint] = (time.monotonic(), True)
                return {"built": True, "seconds": round(time.monotonic() - started, 2), "rows": count}
        except psycopg.Error as exc:
            raise self._fail(exc) from None
        finally:
            conn.close()

    @staticmethod
    def _drop_invalid(conn: Any, name: str) -> None:
        """Drop what an interrupted build left (an invalid index), without waiting long for the table."""
        import psycopg
        from psycopg import sql

        row = conn.execute("SELECT i.indisvalid FROM pg_class c JOIN pg_index i ON i.indexrelid = c.oid WHERE "
                           "c.relname = %s", (name,)).fetchone()
        if row is not None and not row[0]:
            try:
                conn.execute(sql.SQL("DROP INDEX IF EXISTS {}").format(sql.Identifier(name)))
            except psycopg.errors.LockNotAvailable:
                pass  # left for the next build

    def status(self) -> dict[str, Any]:
        """What ``memory-stats`` shows of the database: the HNSW index (valid, being built, or missing and
        which older transactions a build would wait for), the models whose vectors the namespace holds."""
        out: dict[str, Any] = {}
        try:
            with self.db() as conn:
                manifest = self.read_manifest()
                fingerprint = str(((manifest or {}).get("embedding") or {}).get("fingerprint"))
                name = self.index_name(fingerprint)
                row = conn.execute("SELECT i.indisvalid FROM pg_class c JOIN pg_index i ON i.indexrelid = c.oid "
                                   "WHERE c.relname = %s", (name,)).fetchone()
                building = conn.execute(
                    "SELECT p.pid, p.phase, p.current_locker_pid FROM pg_stat_progress_create_index p JOIN "
                    "pg_class c ON c.oid = p.index_relid WHERE c.relname = %s", (name,)).fetchone()
                old = conn.execute(
                    "SELECT pid, application_name, xact_start FROM pg_stat_activity WHERE backend_xmin IS NOT NULL "
                    "AND pid <> pg_backend_pid() AND xact_start < now() - interval '1 second' ORDER BY xact_start "
                    "LIMIT 5").fetchall()
                owner = conn.execute("SELECT pg_has_role(current_user, tableowner, 'USAGE') FROM pg_tables WHERE "
                                     "tablename = 'nubos_memory_embeddings'").fetchone()
                models = conn.execute(
                    "SELECT fingerprint, count(*), max(created_at) > now() - make_interval(days => %s) FROM "
                    "nubos_memory_embeddings WHERE namespace = %s GROUP BY fingerprint",
                    (MODEL_ACTIVE_DAYS, self.namespace)).fetchall()
        except StoreError as exc:
            return {"error": exc.code}
        state = "valid" if row is not None and row[0] else "building" if building else \
            "invalid" if row is not None else "none"
        refused = self.index_refused
        if refused is None and state != "valid" and owner is not None and not owner[0]:
            refused = ("this role does not own nubos_memory_embeddings, so it may not build the HNSW index: the "
                       "owner role builds it (memory-rebuild as that role); queries scan exactly meanwhile")
        out["index"] = {"name": name, "state": state, "note": self.index_note, "refused": refused}
        if building:
            out["index"]["build"] = {"pid": building[0], "phase": building[1], "waiting_on": building[2]}
        if state != "valid":
            out["index"]["blocked_by"] = [{"pid": pid, "application_name": app,
                                           "transaction_since": since.isoformat() if since else None}
                                          for pid, app, since in old]
        out["models"] = {fp: {"vectors": int(n), "recent": bool(recent)} for fp, n, recent in models}
        return out

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

        if len(self.index) <= LOCAL_SCAN_LIMIT:
            return None  # this machine's exact scan is cheaper than a round trip to the index (adr/0014)
        if not self.store.index_valid(self.fingerprint):
            return None  # no valid index (yet): the exact scan answers, never a sequential scan in the database
        try:
            keys = self.store.nearest(self.fingerprint, self.index.dim, query, want, self.index.ef_search)
        except StoreError:
            return None  # the exact scan answers
        if keys is None:
            return None
        found = [label for key in keys for label in self.index.labels_of_hash(key)]
        return np.array(found, dtype=np.int64)


def _flush_all() -> None:
    for usage in list(_LIVE_USAGE):
        usage.flush()


_LIVE_USAGE: "weakref.WeakSet[PgUsage]" = weakref.WeakSet()
atexit.register(_flush_all)


class PgUsage:
    """Retrievals of one namespace, shared by every machine (``memory-prune`` decides on all of them).

    Reads do not write: a query only counts its hits in memory, and the counts are written in one
    statement at most every ``USAGE_FLUSH_S`` seconds (by a background thread of a warm process) and
    when the process exits.  What a process killed with SIGKILL had not written yet (at most that
    many seconds of retrievals), and the retrievals of a role that may only read, are not counted:
    ``memory-prune`` is then a little more eager, never wrong about what it was told."""

    def __init__(self, store: PgStore):
        self.store = store
        self._pending: dict[str, list[float]] = {}  # id -> [count, last retrieval]
        self._mutex = threading.Lock()
        self._last_flush = time.monotonic()
        self._flusher: threading.Thread | None = None
        _LIVE_USAGE.add(self)  # flushed at exit; weakly held, so a store no one uses is freed with its sessions

    def start(self) -> None:
        with self.store.db() as conn:
            conn.execute("UPDATE nubos_memory_namespace SET usage_since = coalesce(usage_since, %s) "
                         "WHERE namespace = %s", (time.time(), self.store.namespace))

    def record(self, ids: list[str]) -> bool:
        now = round(time.time(), 3)
        with self._mutex:
            for rid in set(ids):
                entry = self._pending.setdefault(rid, [0, now])
                entry[0] += 1
                entry[1] = now
            due = time.monotonic() - self._last_flush >= USAGE_FLUSH_S and (
                self._flusher is None or not self._flusher.is_alive())
            if due:
                self._flusher = threading.Thread(target=self.flush, name="nubos-memory-usage", daemon=True)
                self._flusher.start()
        return True

    def flush(self) -> bool:
        """Write the retrievals counted so far (one statement); False when they could not be written."""
        with self._mutex:
            pending, self._pending = self._pending, {}
            self._last_flush = time.monotonic()
        if not pending:
            return True
        ids = sorted(pending)
        try:
            with self.store.db() as conn, conn.transaction():
                conn.execute("INSERT INTO nubos_memory_usage AS u (namespace, id, count, last) "
                             "SELECT %s, id, n, t FROM unnest(%s::text[], %s::bigint[], %s::float8[]) AS x(id, n, t) "
                             "ON CONFLICT (namespace, id) DO UPDATE SET count = u.count + EXCLUDED.count, "
                             "last = greatest(u.last, EXCLUDED.last)",
                             (self.store.namespace, ids, [int(pending[i][0]) for i in ids],
                              [pending[i][1] for i in ids]))
                conn.execute("UPDATE nubos_memory_namespace SET usage_since = coalesce(usage_since, %s) "
                             "WHERE namespace = %s", (min(v[1] for v in pending.values()), self.store.namespace))
        except StoreError:
            return False  # derived data (see the class docstring)
        return True

    def summary(self) -> tuple[float | None, dict[str, list[float]]]:
        self.flush()
        with self.store.db() as conn, conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            row = conn.execute("SELECT usage_since FROM nubos_memory_namespace WHERE namespace = %s",
                               (self.store.namespace,)).fetchone()
            rows = conn.execute("SELECT id, count, last FROM nubos_memory_usage WHERE namespace = %s",
                                (self.store.namespace,)).fetchall()
        since = row[0] if row is not None else None
        return (float(since) if since is not None else None), {rid: [int(n), float(t)] for rid, n, t in rows}

    def fold(self, force: bool = False) -> None:
        if force:
            self.flush()


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
        raise StoreError("pgvector's type is missing from the memory database", code=codes.STORE_PGVECTOR_MISSING)

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

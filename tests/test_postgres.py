"""Team memory on PostgreSQL: the same verbs against a real server (no mocks).

The suite starts PostgreSQL 16 from the ``pgserver`` wheel in a temp folder; set
``NUBOS_MEMORY_TEST_DSN`` to run it against your own server instead.  Every test
works in its own namespace.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from .conftest import HEAVY, REPO, index_records, query, rec, run_cli, run_sub, write_config

pytestmark = pytest.mark.postgres


def files_twin(tmp_path: Path) -> Path:
    root = tmp_path / "files"
    root.mkdir()
    assert run_cli(["memory-init", "--root", str(root)]).code == 0
    write_config(root, provider="hash", model="hash-256", lock_timeout=5.0, near_duplicate=None)
    return root


NOTES = [rec(f"note {i} about {topic}", f"details of {topic} number {i}", id=f"n{i}", tags=[topic],
             created_at=f"2026-10-{1 + i:02d}T00:00:00Z")
         for i, topic in enumerate(["webhooks", "jwt", "pnpm", "invoices", "webhooks", "flags"] * 4)]


def test_the_same_verbs_give_the_same_answers_as_the_file_store(team, tmp_path):
    twin = files_twin(tmp_path)
    for root in (team, twin):
        assert index_records(root, NOTES).code == 0
        assert run_cli(["memory-add", "--root", str(root), "--type", "learning", "--title", "Pin pnpm with corepack",
                        "--body", "lockfile drift broke the cache", "--id", "pnpm-1",
                        "--created-at", "2026-11-01T00:00:00Z"]).code == 0
        assert run_cli(["memory-forget", "--root", str(root), "n2", "--reason", "wrong"]).code == 0
    for text, extra in (("pnpm lockfile", ()), ("webhooks", ("--explain",)), ("jwt", ("--mode", "lexical")),
                        ("invoices number", ("--type", "learning", "--k", "3"))):
        ours, theirs = query(team, text, *extra).json, query(twin, text, *extra).json
        assert ours["hits"] and ours["hits"] == theirs["hits"], text
        assert ours["degraded"] is None
    got = run_cli(["memory-get", "--root", str(team), "n2", "pnpm-1"]).json["records"]
    assert got[0]["live"] is False and got[0]["retired"]["reason"] == "wrong" and got[1]["live"] is True
    stats = run_cli(["memory-stats", "--root", str(team)]).json
    assert stats["backend"] == "postgres" and stats["store"]["namespace"].startswith("t-")
    assert stats["count"] == len(NOTES) + 1 - 1 and stats["consistency"]["consistent"], stats["consistency"]
    dup = run_cli(["memory-add", "--root", str(team), "--type", "learning", "--title", "Pin pnpm with corepack",
                   "--body", "lockfile drift broke the cache"]).json
    assert dup["added"] == 0 and dup["duplicate_of"] == "pnpm-1"
    assert run_cli(["memory-rebuild", "--root", str(team)]).json["count"] == len(NOTES)


def test_a_second_machine_sees_the_first_ones_writes(team, tmp_path):
    assert index_records(team, NOTES[:6]).code == 0
    other = {"NUBOS_MEMORY_CACHE": str(tmp_path / "cache-b")}  # another machine: its own derived files
    r = run_sub(["memory-query", "--root", str(team), "webhooks"], env=other)
    assert r.code == 0 and r.json["hits"][0]["record"]["tags"] == ["webhooks"]
    w = run_sub(["memory-add", "--root", str(team), "--type", "critic", "--title", "Stripe retries webhooks for 3 days",
                 "--id", "from-b"], env=other)
    assert w.code == 0, w.err
    hits = query(team, "stripe retries").json["hits"]
    assert hits[0]["id"] == "from-b"


def test_a_machine_takes_the_vectors_another_one_made(team, tmp_path):
    assert index_records(team, NOTES).code == 0  # machine A embeds
    other = {"NUBOS_MEMORY_CACHE": str(tmp_path / "cache-b")}
    r = run_sub(["memory-rebuild", "--root", str(team)], env=other)
    assert r.code == 0 and r.json["shared"] == len(NOTES) and r.json["embedded"] == 0, r.out
    again = run_sub(["memory-rebuild", "--root", str(team), "--reembed"], env={"NUBOS_MEMORY_CACHE": str(tmp_path / "c")})
    assert again.json["shared"] == 0 and again.json["embedded"] == len(NOTES)  # --reembed means it
    assert query(team, "webhooks").json["hits"] == run_sub(["memory-query", "--root", str(team), "webhooks"],
                                                           env=other).json["hits"]


def test_compact_keeps_a_backup_and_readers_follow(team):
    assert index_records(team, NOTES).code == 0
    assert run_cli(["memory-forget", "--root", str(team), "n0", "n1"]).code == 0
    c = run_cli(["memory-compact", "--root", str(team)])
    assert c.code == 0, c.err
    assert c.json["kept"] == len(NOTES) - 2 and "nubos_memory_log_backup" in c.json["backup"]
    assert query(team, "webhooks").json["hits"] and run_cli(["memory-stats", "--root", str(team)]).json["count"] == 22


def test_export_then_import_gives_back_the_same_records(team, tmp_path):
    twin = files_twin(tmp_path)
    index_records(twin, NOTES)
    run_cli(["memory-add", "--root", str(twin), "--type", "learning", "--title", "v2", "--id", "v2",
             "--supersedes", "n3"])
    run_cli(["memory-forget", "--root", str(twin), "n5", "--reason", "obsolete"])
    src = twin / ".nubos-pilot/memory/records.jsonl"
    first = run_cli(["memory-import", "--root", str(team), str(src)])
    assert first.code == 0, first.err
    assert first.json["imported"] == len(NOTES) + 1 and first.json["retired"] >= 1
    again = run_cli(["memory-import", "--root", str(team), str(src)]).json
    assert again["imported"] == 0 and again["retired"] == 0 and again["already_present"] == len(NOTES) + 1
    out = tmp_path / "export.jsonl"
    e = run_cli(["memory-export", "--root", str(team), str(out)])
    assert e.code == 0 and e.json["live"] == len(NOTES) - 1

    def live(path: Path) -> list[dict]:
        from nubos_memory.store.recordlog import RecordLog

        scan = RecordLog(path).scan()
        return [scan.records[p] for p in range(len(scan.records)) if p not in scan.dead]

    assert live(out) == live(src)  # same ids, fields and order of live records
    # and the file store reads the export as is
    back = tmp_path / "back"
    back.mkdir()
    assert run_cli(["memory-init", "--root", str(back)]).code == 0
    write_config(back, provider="hash", model="hash-256")
    (back / ".nubos-pilot/memory/records.jsonl").write_bytes(out.read_bytes())
    stats = run_cli(["memory-stats", "--root", str(back)]).json
    assert stats["count"] == len(NOTES) - 1
    assert [p["code"] for p in stats["consistency"]["problems"]] == ["index-behind"]  # vectors come on first use
    assert query(back, "flags").json["hits"][0]["id"] != "n5"


def test_a_database_that_is_down_is_a_clear_error_naming_the_host(team, monkeypatch, tmp_path):
    monkeypatch.setenv("NUBOS_MEMORY_DSN", f"postgresql://nobody:secret@/postgres?host={tmp_path}/nowhere")
    for argv in (["memory-query", "x"], ["memory-add", "--type", "learning", "--title", "t"], ["memory-stats"]):
        r = run_cli([argv[0], "--root", str(team), *argv[1:]])
        assert r.code == 7, (argv, r.err)
        err = r.error
        assert err["code"] == "store-unavailable" and str(tmp_path) in err["message"]
        assert "secret" not in r.err and "Traceback" not in r.err


def test_no_dsn_is_a_config_error_and_the_dsn_never_comes_from_config(team, monkeypatch):
    monkeypatch.delenv("NUBOS_MEMORY_DSN")
    r = run_cli(["memory-stats", "--root", str(team)])
    assert r.code == 3 and r.error["code"] == "store-dsn-missing" and r.error["details"]["env"] == "NUBOS_MEMORY_DSN"
    write_config(team, postgres={"dsn": "postgresql://x"})
    assert run_cli(["memory-stats", "--root", str(team)]).error["code"] == "config-invalid-value"


WRITER = """
import json, sys
from nubos_memory.interfaces.cli import main
root, who, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
acked = open(sys.argv[4], "a")
for i in range(n):
    rid = f"{who}-{i}"
    while True:
        code = main(["memory-add", "--root", root, "--type", "learning", "--title", f"writer {who} note {i} zq{who}x{i}",
                     "--id", rid])
        if code == 0:
            acked.write(rid + "\\n"); acked.flush()
            break
        if code != 7:
            sys.exit(code)
        open(sys.argv[4] + ".down", "a").write(rid + "\\n")  # store-unavailable: the database is down; retry
"""


def writers(team, tmp_path, count, each, restart=None):
    env = {**os.environ, "PYTHONPATH": str(REPO), "NUBOS_MEMORY_NO_SERVER": "1"}
    procs = []
    for w in range(count):
        procs.append(subprocess.Popen(
            [sys.executable, "-c", WRITER, str(team), f"w{w}", str(each), str(tmp_path / f"acked-{w}")],
            env={**env, "NUBOS_MEMORY_CACHE": str(tmp_path / f"cache-{w}")},
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    if restart is not None:  # kill the database once the writers are under way, long before they finish
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and sum(
                len(p.read_text().split()) for p in tmp_path.glob("acked-*") if p.suffix != ".down") < count * each // 10:
            time.sleep(0.05)
        restart(1.0)
    for p in procs:
        _, err = p.communicate(timeout=1200)
        assert p.returncode == 0, err[-2000:]
    down = sum(len(p.read_text().split()) for p in tmp_path.glob("acked-*.down"))
    return [line for w in range(count) for line in (tmp_path / f"acked-{w}").read_text().split()], down


def check_all_there(team, acked, tmp_path, expected):
    stats = run_cli(["memory-stats", "--root", str(team)]).json
    assert stats["count"] == expected and not stats["consistency"]["duplicate_ids"]
    assert len(set(acked)) == len(acked) == expected
    for rid in acked[:: max(1, len(acked) // 25)]:  # retrievable by its title from another machine
        who, i = rid.split("-")
        r = run_sub(["memory-query", "--root", str(team), f"zq{who}x{i}", "--k", "1"],
                    env={"NUBOS_MEMORY_CACHE": str(tmp_path / "cache-0")})
        assert r.json["hits"][0]["id"] == rid


def test_many_machines_write_at_once(team, tmp_path):
    count, each = (8, 250) if HEAVY else (4, 15)
    acked, _ = writers(team, tmp_path, count, each)
    check_all_there(team, acked, tmp_path, count * each)


def test_a_database_killed_mid_run_loses_no_acknowledged_write(team, tmp_path, pg):
    _, restart = pg
    if restart is None:
        pytest.skip("NUBOS_MEMORY_TEST_DSN names a server this suite cannot restart")
    count, each = (8, 250) if HEAVY else (3, 40)
    acked, down = writers(team, tmp_path, count, each, restart=restart)
    assert down > 0  # the writers met the dead database (store-unavailable) and went on after it came back
    check_all_there(team, acked, tmp_path, count * each)


def test_eval_on_the_team_store_scores_like_the_file_store_and_leaves_nothing(team, tmp_path, pg):
    from .test_evaluate import _mini_beir

    _mini_beir(tmp_path / "beir")
    twin = files_twin(tmp_path)
    ours = run_cli(["memory-eval", "--root", str(team), "--beir", str(tmp_path / "beir"), "--no-cache"])
    theirs = run_cli(["memory-eval", "--root", str(twin), "--beir", str(tmp_path / "beir"), "--no-cache"])
    assert ours.code == 0, ours.err
    for mode, m in ours.json["modes"].items():
        assert {k: v for k, v in m.items() if k != "latency_ms"} == \
            {k: v for k, v in theirs.json["modes"][mode].items() if k != "latency_ms"}, mode
    import psycopg

    with psycopg.connect(pg[0]) as conn:  # the scratch namespace is gone, the team's untouched
        left = conn.execute("SELECT count(*) FROM nubos_memory_namespace WHERE namespace LIKE 'nubos-eval-%'")
        assert left.fetchone()[0] == 0
    assert run_cli(["memory-stats", "--root", str(team)]).json["count"] == 0


MANY = [rec(f"entry {i} on {topic} {i % 7}", f"what we learned about {topic}, case {i}", id=f"m{i}",
            type="critic" if i % 10 == 0 else "learning", tags=[topic], created_at="2026-10-01T00:00:00Z")
        for i, topic in enumerate(["queues", "caching", "retries", "schemas", "billing", "auth"] * 15)]


def test_vector_candidates_come_from_the_pgvector_hnsw_index(team, tmp_path, pg, monkeypatch):
    """Above the exact-scan limit the database's HNSW index proposes the candidates: it exists,
    the planner uses it, and answers match the file store's (filters included)."""
    import psycopg

    from nubos_memory.index import vectors as vi
    from nubos_memory.store import postgres
    from nubos_memory.store.postgres import PgStore

    monkeypatch.setattr(vi, "EXACT_LIMIT", 30)  # make this small memory a "large" one
    monkeypatch.setattr(postgres, "LOCAL_SCAN_LIMIT", 30)  # and one this machine would not scan itself
    asked: list[int] = []
    nearest = PgStore.nearest

    def spy(self, fingerprint, dim, q, want, ef):
        asked.append(want)
        return nearest(self, fingerprint, dim, q, want, ef)

    monkeypatch.setattr(PgStore, "nearest", spy)
    twin = files_twin(tmp_path)
    for root in (team, twin):
        write_config(root, candidates=12)  # fewer candidates than records: the index's choice matters
        r = index_records(root, MANY)
        assert r.code == 0, r.err
        assert run_cli(["memory-forget", "--root", str(root), "m1", "m2", "m3"]).code == 0
    for text, extra in (("retries case 14", ()), ("caching", ("--mode", "vector", "--k", "10")),
                        ("billing schemas", ("--explain",)), ("learned retries", ("--type", "critic", "--k", "5"))):
        ours, theirs = query(team, text, *extra).json, query(twin, text, *extra).json
        assert ours["degraded"] is None and ours["hits"] and ours["hits"] == theirs["hits"], text
    assert asked and all(w >= 12 + 3 for w in asked)  # over-fetched past the forgotten rows
    vector_hits = query(team, "caching", "--mode", "vector", "--k", "20").json["hits"]
    assert len(vector_hits) == 20 and not {"m1", "m2", "m3"} & {h["id"] for h in vector_hits}
    decisions = query(team, "auth", "--type", "critic", "--k", "9", "--mode", "vector").json["hits"]
    assert len(decisions) == 9 and all(h["record"]["type"] == "critic" for h in decisions)  # exact scan

    from nubos_memory.config import load_project

    store = PgStore(load_project(team), 5.0)
    manifest = run_cli(["memory-stats", "--root", str(team)]).json
    fingerprint = manifest["fingerprint"]
    name = store.index_name(fingerprint)
    with psycopg.connect(pg[0], autocommit=True) as conn:
        valid = conn.execute("SELECT i.indisvalid, pg_get_indexdef(i.indexrelid) FROM pg_class c "
                             "JOIN pg_index i ON i.indexrelid = c.oid WHERE c.relname = %s", (name,)).fetchone()
        assert valid and valid[0] and "hnsw" in valid[1] and "vector_cosine_ops" in valid[1]
        rows = conn.execute("SELECT count(*) FROM nubos_memory_embeddings WHERE namespace = %s AND fingerprint = %s",
                            (store.namespace, fingerprint)).fetchone()[0]
        assert rows == len(MANY)
        conn.execute("SET enable_seqscan = off")  # on 90 rows a sort is cheaper: ask whether the
        conn.execute("SET enable_sort = off")  # index can serve this query's predicate and expression
        plan = "\n".join(r[0] for r in conn.execute(
            "EXPLAIN SELECT key FROM nubos_memory_embeddings WHERE namespace = %s AND fingerprint = %s "
            "ORDER BY embedding::vector(256) <=> (SELECT embedding FROM nubos_memory_embeddings LIMIT 1)::vector(256) "
            "LIMIT 10", (store.namespace, fingerprint), prepare=False).fetchall())
        assert name in plan, plan
    # memory-rebuild recreates it from the log: only live texts stay, and answers are unchanged
    before = query(team, "retries case 14").json["hits"]
    assert run_cli(["memory-rebuild", "--root", str(team)]).code == 0
    with psycopg.connect(pg[0]) as conn:
        rows = conn.execute("SELECT count(*) FROM nubos_memory_embeddings WHERE namespace = %s AND fingerprint = %s",
                            (store.namespace, fingerprint)).fetchone()[0]
    assert rows == len(MANY) - 3
    assert query(team, "retries case 14").json["hits"] == before


def test_prune_counts_every_machines_retrievals(team, tmp_path):
    """Usage is the namespace's, not one machine's: a record another machine retrieves is kept."""
    old = [rec(f"old note {i} about {t}", id=f"o{i}", created_at="2026-01-01T00:00:00Z")
           for i, t in enumerate(["kafka", "redis", "nginx", "terraform"])]
    assert index_records(team, old).code == 0
    time.sleep(1.2)
    other = {"NUBOS_MEMORY_CACHE": str(tmp_path / "cache-b")}
    r = run_sub(["memory-query", "--root", str(team), "kafka", "--k", "1"], env=other)
    assert r.json["hits"][0]["id"] == "o0"
    plan = run_cli(["memory-prune", "--root", str(team), "--unused-for", "1s", "--dry-run"]).json
    assert sorted(plan["retired"]) == ["o1", "o2", "o3"] and plan["kept"]["retrieved"] == 1, plan


def test_a_database_without_pgvector_is_a_clear_error(team, pg, monkeypatch):
    """A role that may not create the extension is told what a database owner must do."""
    import psycopg
    from psycopg.conninfo import make_conninfo

    dsn, restart = pg
    if restart is None:
        pytest.skip("needs a server where this suite may create roles and databases")
    name = "noext_" + uuid.uuid4().hex[:8]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {name} LOGIN")
        conn.execute(f"CREATE DATABASE {name} OWNER {name}")
    monkeypatch.setenv("NUBOS_MEMORY_DSN", make_conninfo(dsn, user=name, dbname=name))
    r = run_cli(["memory-add", "--root", str(team), "--type", "learning", "--title", "t"])
    assert r.code == 7 and r.error["code"] == "store-pgvector-missing", r.err
    assert "CREATE EXTENSION vector" in r.error["message"] and "Traceback" not in r.err
    with psycopg.connect(make_conninfo(dsn, dbname=name), autocommit=True) as conn:
        conn.execute("CREATE EXTENSION vector")  # a superuser creates it once: the role goes on
    assert run_cli(["memory-add", "--root", str(team), "--type", "learning", "--title", "t"]).code == 0
    # A role with the table GRANTs but not the table's owner may not build the HNSW index: writes
    # and queries go on (the exact scan serves) and memory-stats says why.
    from nubos_memory.index import vectors as vi

    monkeypatch.setattr(vi, "EXACT_LIMIT", 30)
    agent = name + "_agent"
    with psycopg.connect(make_conninfo(dsn, dbname=name), autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {agent} LOGIN")
        conn.execute(f"GRANT USAGE, CREATE ON SCHEMA public TO {agent}")
        conn.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON nubos_memory_log, nubos_memory_namespace, "
                     f"nubos_memory_log_backup, nubos_memory_embeddings, nubos_memory_usage TO {agent}")
        conn.execute(f"GRANT SELECT ON nubos_memory_schema TO {agent}")
    monkeypatch.setenv("NUBOS_MEMORY_DSN", make_conninfo(dsn, user=agent, dbname=name))
    r = index_records(team, MANY)
    assert r.code == 0, r.err
    hits = query(team, "retries case 14").json
    assert hits["degraded"] is None and hits["hits"][0]["id"] == "m14"
    index = run_cli(["memory-stats", "--root", str(team)]).json["store"]["index"]
    assert index["state"] == "none" and "owner" in index["refused"], index


def test_a_record_written_where_no_model_works_gets_its_vector_from_a_machine_that_has_one(team, tmp_path,
                                                                                          monkeypatch):
    from nubos_memory.embed.hashing import HashEmbedder
    from nubos_memory.errors import EmbeddingError

    def broken(self, texts):
        raise EmbeddingError("no model on this machine", code="embedding-unavailable")

    with monkeypatch.context() as m:
        m.setattr(HashEmbedder, "embed", broken)
        r = run_cli(["memory-add", "--root", str(team), "--type", "learning", "--title", "Rotate the signing key yearly",
                     "--id", "k1"])
        assert r.code == 0 and r.json["degraded"]["code"] == "embedding-unavailable"
    other = {"NUBOS_MEMORY_CACHE": str(tmp_path / "cache-b")}  # a machine whose model works
    b = run_sub(["memory-query", "--root", str(team), "signing key", "--mode", "vector"], env=other)
    assert b.code == 0 and b.json["degraded"] is None and b.json["hits"][0]["id"] == "k1"
    embedded: list[str] = []
    real = HashEmbedder.embed

    def counting(self, texts):
        embedded.extend(texts)
        return real(self, texts)

    with monkeypatch.context() as m:  # the first machine takes that vector: it embeds only the query
        m.setattr(HashEmbedder, "embed", counting)
        a = query(team, "signing key", "--mode", "vector").json
        assert a["degraded"] is None and a["hits"][0]["id"] == "k1"
    assert embedded == ["signing key"]


def test_a_big_batch_rebuilds_the_hnsw_index_in_bulk_and_a_small_one_extends_it(team, pg, monkeypatch):
    """Row-by-row inserts into pgvector's HNSW index cost ~9 rows of a bulk build each: a batch that
    would cost more drops the index and builds it again; a small one inserts into it."""
    import psycopg

    from nubos_memory.index import vectors as vi
    from nubos_memory.store import postgres

    monkeypatch.setattr(vi, "EXACT_LIMIT", 30)
    monkeypatch.setattr(postgres, "BULK_MIN", 20)

    def index_oid() -> int | None:
        with psycopg.connect(pg[0]) as conn:
            row = conn.execute("SELECT c.oid FROM pg_class c JOIN pg_index i ON i.indexrelid = c.oid "
                               "WHERE c.relname LIKE 'nubos_memory_hnsw_%%' AND i.indisvalid AND "
                               "pg_get_expr(i.indpred, i.indrelid) LIKE %s", (f"%{namespace}%",)).fetchone()
        return row[0] if row else None

    namespace = json.loads((team / ".nubos-pilot/config.json").read_text())["memory"]["postgres"]["namespace"]
    assert index_records(team, MANY[:40]).code == 0
    first = index_oid()
    assert first is not None
    assert index_records(team, MANY[40:50]).code == 0  # 10 rows: inserted into the index
    assert index_oid() == first
    assert index_records(team, MANY[50:]).code == 0  # 40 new rows on 50: built again
    second = index_oid()
    assert second is not None and second != first
    hits = query(team, "retries case 86", "--mode", "vector").json
    assert hits["degraded"] is None and hits["hits"][0]["id"] == "m86"


def test_redact_removes_the_text_from_the_log_table_and_its_backups(team, pg, tmp_path):
    """Issue 20 item 3 on the team store: after memory-redact neither nubos_memory_log nor
    nubos_memory_log_backup holds the text, every machine reads the log again, and the shared vector
    of the text is gone."""
    import psycopg

    secret = "hunter2-team-SECRET"
    assert index_records(team, NOTES[:4]).code == 0
    assert run_cli(["memory-add", "--root", str(team), "--type", "learning", "--title", "agent: bad note",
                    "--body", f"the password is {secret}", "--id", "bad1"]).code == 0
    assert run_cli(["memory-compact", "--root", str(team)]).code == 0  # a backup holding the secret
    other = {"NUBOS_MEMORY_CACHE": str(tmp_path / "cache-b")}
    assert secret in run_sub(["memory-query", "--root", str(team), "password"], env=other).out
    namespace = json.loads((team / ".nubos-pilot" / "config.json").read_text())["memory"]["postgres"]["namespace"]

    def holding() -> int:
        with psycopg.connect(pg[0]) as conn:
            return sum(conn.execute(f"SELECT count(*) FROM {t} WHERE namespace = %s AND line LIKE %s",
                                    (namespace, f"%{secret}%")).fetchone()[0]
                       for t in ("nubos_memory_log", "nubos_memory_log_backup"))

    before = holding()
    assert before >= 2
    out = run_cli(["memory-redact", "--root", str(team), "bad1", "--reason", "leaked"]).json
    assert out["redacted"] == ["bad1"] and set(out["rewritten"]) == {"nubos_memory_log", "nubos_memory_log_backup"}
    assert holding() == 0
    after = run_sub(["memory-query", "--root", str(team), "password"], env=other)  # another machine's cache
    assert after.code == 0 and secret not in after.out
    got = run_cli(["memory-get", "--root", str(team), "bad1"]).json["records"][0]
    assert got["record"] is None and got["retired"]["reason"] == "redacted"
    assert run_cli(["memory-stats", "--root", str(team)]).json["count"] == 4

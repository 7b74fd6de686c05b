"""Forgetting, superseding, compaction, usage and pruning (acceptance 26-28, 32)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from nubos_memory.store.cache import keymap_parts
from nubos_memory.store.recordlog import RecordLog

from .conftest import REPO, index_records, memory_dir, query, rec, run_cli, write_config

NOTES = [
    rec("Stripe webhooks arrive out of order", "use the event created timestamp and idempotency keys", id="hook"),
    rec("JWT signing uses jose", "jose supports EdDSA and runs on the edge runtime", id="jwt"),
    rec("pnpm lockfile drift breaks the CI cache", "pin pnpm with corepack and key the cache on the lockfile",
        id="pnpm"),
    rec("Invoice numbers are gapless", "a Postgres advisory lock serialises invoice number allocation", id="inv"),
    rec("Feature flags live in LaunchDarkly", "server-side evaluation only; never ship flag keys to the client",
        id="flags"),
]


def ids(result):
    return [h["id"] for h in result.json["hits"]]


def test_forget_removes_a_record_from_lexical_and_vector_results_alike(project):
    assert index_records(project, NOTES).code == 0
    for mode in ("hybrid", "lexical", "vector"):
        assert "hook" in ids(query(project, "--mode", mode, "stripe webhooks out of order"))
    f = run_cli(["memory-forget", "--root", str(project), "hook", "--reason", "moved to the runbook"])
    assert f.code == 0 and f.json == {"forgotten": ["hook"], "already_retired": [], "recovered": None,
                                      "warnings": []}
    for mode in ("hybrid", "lexical", "vector"):
        assert "hook" not in ids(query(project, "--mode", mode, "--k", "10", "stripe webhooks out of order"))
    s = run_cli(["memory-stats", "--root", str(project)]).json
    assert s["count"] == 4 and s["retired"] == {"total": 1, "by_reason": {"moved to the runbook": 1}, "redacted": 0,
                                               "expired": 0}
    assert s["consistency"]["consistent"] and s["consistency"]["retired_in_index"] == 1
    # The log only grew: the record is still there, followed by its tombstone.
    lines = (memory_dir(project) / "records.jsonl").read_text().splitlines()
    assert json.loads(lines[-1])["op"] == "forget" and any('"id":"hook"' in line for line in lines)


def test_after_forgetting_bm25_scores_equal_a_memory_that_never_held_the_record(project, tmp_path):
    assert index_records(project, NOTES).code == 0
    run_cli(["memory-forget", "--root", str(project), "pnpm", "flags"])
    other = tmp_path / "never"
    other.mkdir()
    run_cli(["memory-init", "--root", str(other)])
    write_config(other, provider="hash", model="hash-256", near_duplicate=None)
    assert index_records(other, [n for n in NOTES if n["id"] not in ("pnpm", "flags")]).code == 0
    for q in ("cache lock", "jose edge runtime", "invoice advisory lock postgres"):
        mine = {h["id"]: h["explain"]["lexical"]["raw"] for h in query(project, "--mode", "lexical", "--explain", q)
                .json["hits"]}
        theirs = {h["id"]: h["explain"]["lexical"]["raw"] for h in query(other, "--mode", "lexical", "--explain", q)
                  .json["hits"]}
        assert mine == theirs and mine


def test_forget_validates_every_id_before_writing(project):
    assert index_records(project, NOTES).code == 0
    log = memory_dir(project) / "records.jsonl"
    before = log.read_bytes()
    r = run_cli(["memory-forget", "--root", str(project), "jwt", "no-such-id"])
    assert r.code == 5 and r.error["code"] == "record-not-found" and r.error["details"]["ids"] == ["no-such-id"]
    assert log.read_bytes() == before
    assert run_cli(["memory-forget", "--root", str(project), "jwt"]).json["forgotten"] == ["jwt"]
    again = run_cli(["memory-forget", "--root", str(project), "jwt"])
    assert again.code == 0 and again.json["already_retired"] == ["jwt"] and again.json["forgotten"] == []
    bad = run_cli(["memory-forget", "--root", str(project), "has space"])
    assert bad.code == 5 and bad.error["code"] == "record-invalid-id"
    # A reason is bounded: a tombstone must never outgrow the line limit and be skipped as corrupt.
    long = run_cli(["memory-forget", "--root", str(project), "hook", "--reason", "x" * 2_000_000])
    assert long.code == 5 and long.error["code"] == "forget-invalid-reason"
    assert log.read_bytes().count(b'"op":"forget"') == 1


def test_a_superseded_record_never_appears_and_a_forgotten_id_can_return(project):
    assert index_records(project, NOTES).code == 0
    new = run_cli(["memory-add", "--root", str(project), "--type", "learning", "--supersedes", "jwt",
                   "--title", "JWT signing moved to the auth service", "--body", "tokens are minted by auth-svc"])
    assert new.code == 0 and new.json["added"] == 1
    hits = ids(query(project, "--k", "10", "jwt signing"))
    assert new.json["id"] in hits and "jwt" not in hits
    s = run_cli(["memory-stats", "--root", str(project)]).json
    assert s["retired"]["by_reason"] == {"superseded": 1}
    unknown = run_cli(["memory-add", "--root", str(project), "--type", "learning", "--supersedes", "ghost",
                       "--title", "x"])
    assert unknown.code == 5 and unknown.error["code"] == "record-supersedes-unknown"
    # A retired id written again is a new life of that id, with its new content.
    back = index_records(project, [rec("JWT signing is back in the gateway", "jose again", id="jwt")])
    assert back.json["added"] == 1
    hit = query(project, "gateway jwt").json["hits"][0]
    assert hit["id"] == "jwt" and hit["record"]["title"] == "JWT signing is back in the gateway"


def test_rebuild_drops_retired_records_from_the_derived_files(project):
    assert index_records(project, NOTES).code == 0
    run_cli(["memory-forget", "--root", str(project), "inv"])
    r = run_cli(["memory-rebuild", "--root", str(project)]).json
    assert r["count"] == 4
    m = json.loads((memory_dir(project) / "manifest.json").read_text())
    ids = list(keymap_parts((memory_dir(project) / m["files"]["keymap"]["name"]).read_bytes())[0])
    assert "inv" not in ids and len(ids) == 4
    s = run_cli(["memory-stats", "--root", str(project)]).json["consistency"]
    assert s["retired_in_index"] == 0 and s["consistent"]


def test_compact_rewrites_the_log_atomically_with_a_backup_and_keeps_answers(project):
    assert index_records(project, NOTES).code == 0
    run_cli(["memory-forget", "--root", str(project), "pnpm"])
    run_cli(["memory-add", "--root", str(project), "--type", "learning", "--supersedes", "flags",
             "--title", "Feature flags moved to Unleash", "--body", "self-hosted; evaluation stays server-side"])
    log = memory_dir(project) / "records.jsonl"
    original = log.read_bytes()
    with log.open("ab") as f:
        f.write(b"garbage line\n")
    before = {q: ids(query(project, q)) for q in ("feature flags", "invoice numbers", "webhooks order")}
    c = run_cli(["memory-compact", "--root", str(project)])
    assert c.code == 0, c.err
    doc = c.json
    assert doc["kept"] == 4 and doc["dropped"]["retired"] == 2 and doc["dropped"]["corrupt_lines"] == 1
    assert doc["embedded"] == 0  # live records' vectors are reused
    backup = memory_dir(project) / doc["backup"]
    assert backup.read_bytes() == original + b"garbage line\n"  # not a byte lost
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["hook", "jwt", "inv", rows[-1]["id"]] and all("op" not in r for r in rows)
    assert {q: ids(query(project, q)) for q in before} == before
    assert not list(memory_dir(project).glob("*.tmp"))


def _age(root, **usage):
    """Pretend usage tracking began long ago."""
    (memory_dir(root) / "usage.json").write_text(json.dumps({"format": 1, "ids": {}, **usage}))


def test_prune_retires_only_never_retrieved_records_older_than_the_window(project):
    old = "2025-01-01T00:00:00Z"
    records = [rec("old unused note about kafka", "partitions", id="old-unused", created_at=old),
               rec("old note about redis that agents read", "eviction", id="old-used", created_at=old),
               rec("fresh note about kafka consumers", "lag", id="fresh")]
    assert index_records(project, records).code == 0
    assert "old-used" in ids(query(project, "redis eviction"))  # counted as retrieved
    young = run_cli(["memory-prune", "--root", str(project), "--unused-for", "90d"]).json
    assert young["retired"] == [] and young["warnings"][0]["code"] == "usage-history-too-short"
    _age(project, since=time.time() - 400 * 86400)
    dry = run_cli(["memory-prune", "--root", str(project), "--unused-for", "90d", "--dry-run"]).json
    from nubos_memory import Memory

    untracked = Memory.open(project).query("kafka partitions", track=False)  # looking is not retrieving
    assert dry["retired"] == ["old-unused"] and "old-unused" in [h["id"] for h in untracked["hits"]]
    done = run_cli(["memory-prune", "--root", str(project), "--unused-for", "90d"]).json
    assert done["retired"] == ["old-unused"] and done["kept"] == {"recent": 1, "retrieved": 1, "unknown_age": 0}
    assert "old-unused" not in ids(query(project, "--k", "10", "kafka partitions"))
    stats = run_cli(["memory-stats", "--root", str(project)]).json
    assert stats["retired"]["by_reason"] == {"pruned": 1}
    bad = run_cli(["memory-prune", "--root", str(project), "--unused-for", "ninety days"])
    assert bad.code == 5 and bad.error["code"] == "duration-invalid"


def test_usage_is_derived_and_survives_compaction(project):
    assert index_records(project, NOTES).code == 0
    query(project, "invoice numbers")
    query(project, "invoice advisory lock")
    lines = (memory_dir(project) / "usage.jsonl").read_text().splitlines()
    assert len(lines) == 2 and "inv" in json.loads(lines[0])["ids"]
    run_cli(["memory-compact", "--root", str(project)])
    since, counts = __import__("nubos_memory.store.usage", fromlist=["Usage"]).Usage(memory_dir(project)).summary()
    assert counts["inv"][0] == 2 and since is not None
    assert (memory_dir(project) / "usage.jsonl").stat().st_size == 0  # folded into usage.json


def test_a_group_is_applied_whole_or_not_at_all(tmp_path):
    path = tmp_path / "records.jsonl"
    log = RecordLog(path)
    log.append([rec("first", id="a")])
    group = [json.dumps({"op": "group", "lines": 3}),
             json.dumps({**rec("second", id="b"), "phase": None, "tags": [], "provenance": None,
                         "created_at": None}),
             json.dumps({"op": "forget", "id": "a", "at": "2026-01-01T00:00:00Z", "reason": "replaced"}),
             json.dumps({**rec("third", id="c"), "phase": None, "tags": [], "provenance": None,
                         "created_at": None})]
    scan = log.scan()
    for n in range(1, 4):  # a reader that sees the group cut after n lines applies none of it
        path.write_bytes(path.read_bytes().split(b"\n", 1)[0] + b"\n" + "\n".join(group[:n]).encode() + b"\n")
        partial = log.refresh(scan)
        assert [r["id"] for r in partial.records] == ["a"] and not partial.dead
        assert partial.partial_tail["open_group"] == {"line": 2, "lines": 3, "gid": None, "present": n - 1}
    path.write_bytes(path.read_bytes() + (group[3] + "\n").encode())
    whole = log.refresh(scan)
    assert whole.ids() == {"b", "c"} and whole.partial_tail is None


def test_a_group_cut_at_a_line_boundary_is_committed_and_a_torn_one_rolled_back(project):
    """Nothing complete leaves the log: a group whose lines are all there lost at most its commit
    line (it is applied); one that ends in a torn line was a crashed write (it is rolled back: its
    lines stay in the file, unapplied, and only the torn bytes are set aside)."""
    assert index_records(project, NOTES).code == 0
    log = memory_dir(project) / "records.jsonl"
    good = log.read_bytes()
    whole = (json.dumps({"op": "group", "lines": 2, "gid": "g1"}) + "\n" + json.dumps(rec("kept one", id="k1"))
             + "\n" + json.dumps(rec("kept two", id="k2")) + "\n").encode()
    log.write_bytes(good + whole)
    r = index_records(project, [rec("after the first crash", id="after1")])
    assert r.json["recovered"]["action"] == "group-committed" and r.json["recovered"]["open_group"]["present"] == 2
    assert {"k1", "k2", "after1"} <= set(ids(query(project, "--k", "20", "kept one two after first crash")))
    assert log.read_bytes().startswith(good + whole)
    grown = log.read_bytes()
    crashed = (json.dumps({"op": "group", "lines": 3, "gid": "g2"}) + "\n" + json.dumps(rec("half written", id="half"))
               + "\n" + '{"id": "cut", "type": "lea').encode()
    log.write_bytes(grown + crashed)
    assert "half" not in ids(query(project, "--k", "10", "--mode", "lexical", "half written"))
    text = log.read_bytes()
    assert text.startswith(grown + crashed.rsplit(b"\n", 1)[0] + b"\n")  # the complete lines stay
    assert json.loads(text.splitlines()[-1])["op"] == "rollback"
    assert (memory_dir(project) / "records.jsonl.torn").read_bytes() == b'{"id": "cut", "type": "lea\n'
    assert run_cli(["memory-stats", "--root", str(project)]).json["consistency"]["rolled_back"][0]["lines"] == 1


WRITER = """
import json, sys
sys.path.insert(0, sys.argv[2])
from nubos_memory import Memory
mem = Memory.open(sys.argv[1])
for round_ in range(int(sys.argv[3])):
    old = [r["id"] for r in mem.scan().records if r["id"].startswith("doc-") and mem.scan().live(r["id"]) is not None]
    new = [{"id": f"doc-{round_}-{i}", "type": "research", "title": f"section {i} of round {round_}",
            "body": "text " * 50} for i in range(20)]
    mem.apply(new, forget=old, reason="re-ingested", verb="test-writer", force=True)
"""


def test_a_reader_never_sees_half_of_a_change(project):
    """A writer replaces 20 records by 20 others in one change, over and over; a reader polling the
    log meanwhile must always count exactly 20 live ones (never 0 < n < 20, never 40)."""
    from nubos_memory import Memory

    first = [{"id": f"doc-start-{i}", "type": "research", "title": f"section {i}", "body": "x"} for i in range(20)]
    assert index_records(project, first).code == 0
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(project), str(REPO), "25"],
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    reader = Memory.open(project)
    seen = set()
    try:
        while writer.poll() is None:
            scan = reader.scan()
            seen.add(sum(1 for rid in scan.ids() if rid.startswith("doc-")))
    finally:
        writer.wait(timeout=60)
    assert writer.returncode == 0
    assert seen == {20}


RECORDER = """
import sys
sys.path.insert(0, sys.argv[2])
from nubos_memory.store.usage import Usage
u = Usage(__import__("pathlib").Path(sys.argv[1]))
for i in range(int(sys.argv[4])):
    assert u.record([f"{sys.argv[3]}-{i % 7}"])
"""


def test_no_retrieval_is_lost_while_usage_is_folded(tmp_path):
    """Four processes record 300 retrievals each while the log is folded over and over: every one
    is counted (a lost one could let prune retire a record that was used)."""
    from nubos_memory.store.usage import Usage

    usage = Usage(tmp_path)
    procs = [subprocess.Popen([sys.executable, "-c", RECORDER, str(tmp_path), str(REPO), f"p{n}", "300"])
             for n in range(4)]
    while any(p.poll() is None for p in procs):
        usage.fold(force=True)
    assert all(p.wait() == 0 for p in procs)
    usage.fold(force=True)
    _, counts = usage.summary()
    assert sum(c for c, _ in counts.values()) == 1200 and len(counts) == 28


def test_prune_leaves_an_expired_record_alone(project):
    """An expired record is no longer live (valid_until): pruning by age does not tombstone it."""
    old = "2025-01-01T00:00:00Z"
    records = [rec("old unused note about kafka", "partitions", id="old-unused", created_at=old),
               rec("old expired note about kafka", "offsets", id="expired", created_at=old,
                   valid_until="2025-06-01T00:00:00Z")]
    assert index_records(project, records).code == 0
    _age(project, since=time.time() - 400 * 86400)
    done = run_cli(["memory-prune", "--root", str(project), "--unused-for", "90d"]).json
    assert done["retired"] == ["old-unused"]
    got = run_cli(["memory-get", "--root", str(project), "expired"]).json["records"][0]
    assert got["retired"]["reason"] == "expired"  # still expired, not pruned

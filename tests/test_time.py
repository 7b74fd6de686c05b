"""Time (issue 23): ``valid_until`` retires a record by itself at read time, ``memory-query --as-of``
answers from the memory as it stood then, ``memory-get --history`` lists every version of an id."""

from __future__ import annotations

import json

import numpy as np

from nubos_memory.log import read
from nubos_memory.search.timeline import live_at

from .conftest import index_records, memory_dir, query, rec, run_cli

PAST = "2020-01-01T00:00:00Z"
FUTURE = "2999-01-01T00:00:00Z"


def titles(result) -> list[str]:
    return [h["record"]["title"] for h in result.json["hits"]]


def forget(root, rid: str, reason: str = "forgotten"):
    return run_cli(["memory-forget", "--root", str(root), rid, "--reason", reason])


def get(root, *args: str):
    return run_cli(["memory-get", "--root", str(root), *args])


def stats(root) -> dict:
    return run_cli(["memory-stats", "--root", str(root)]).json


def tombstone_at(root, rid: str, at: str) -> None:
    """Give the forget tombstone of ``rid`` a known time (a forget stamps now)."""
    log = memory_dir(root) / "records.jsonl"
    lines = log.read_text().splitlines()
    for i, line in enumerate(lines):
        obj = json.loads(line)
        if obj.get("op") == "forget" and obj["id"] == rid:
            obj["at"] = at
            lines[i] = json.dumps(obj)
    log.write_text("\n".join(lines) + "\n")


# -- valid_until -----------------------------------------------------------------------------
def test_expiry_hides_a_record_counts_it_and_loses_nothing(project):
    assert index_records(project, [
        rec("rotate the signing key monthly", "key rotation", id="old", valid_until=PAST),
        rec("rotate the signing key weekly", "key rotation", id="new", valid_until=FUTURE),
        rec("rotate the signing key daily", "key rotation", id="plain"),
    ]).code == 0
    got = query(project, "rotate signing key", "--mode", "lexical")
    assert set(titles(got)) == {"rotate the signing key weekly", "rotate the signing key daily"}
    assert got.json["counts"]["records"] == 2
    hybrid = query(project, "rotate signing key")
    assert "old" not in {h["id"] for h in hybrid.json["hits"]}
    s = stats(project)
    assert s["count"] == 2 and s["retired"]["expired"] == 1 and s["retired"]["total"] == 0
    shown = get(project, "old", "new").json["records"]
    assert shown[0]["live"] is False and shown[0]["retired"] == {"reason": "expired", "at": PAST}
    assert shown[0]["record"]["title"] == "rotate the signing key monthly"  # nothing is lost
    assert shown[1]["live"] is True and shown[1]["retired"] is None
    log = (memory_dir(project) / "records.jsonl").read_bytes()
    assert b'"forget"' not in log and b'"redact"' not in log  # no log operation retired it


def test_memory_add_takes_valid_until(project):
    added = run_cli(["memory-add", "--root", str(project), "--type", "learning", "--title", "the staging db is "
                     "read only this week", "--body", "freeze", "--valid-until", PAST])
    assert added.code == 0, added.err
    assert query(project, "staging read only", "--mode", "lexical").json["hits"] == []
    assert get(project, added.json["id"]).json["records"][0]["record"]["valid_until"] == PAST
    bad = run_cli(["memory-add", "--root", str(project), "--type", "learning", "--title", "x y z", "--body", "b",
                   "--valid-until", "next week"])
    assert bad.code == 5 and bad.error["code"] == "record-invalid-valid-until"


def test_the_add_tool_declares_valid_until(project):
    from .test_mcp import list_tools

    schema = list_tools(project)["memory_add"].input_schema
    assert "valid_until" in schema["properties"]
    assert "history" in list_tools(project)["memory_get"].input_schema["properties"]


def test_expiry_in_the_library(throwaway_memory):
    mem = throwaway_memory
    mem.index([rec("cache warmup takes ten minutes", "warm", id="a", valid_until=PAST),
               rec("cache warmup takes one minute", "warm", id="b")])
    assert [h["id"] for h in mem.query("cache warmup", mode="lexical")["hits"]] == ["b"]
    assert mem.stats()["retired"]["expired"] == 1


# -- as-of -----------------------------------------------------------------------------------
def history_project(project):
    """a (2026-01) forgotten at 2026-06; b (2026-02) superseded by c (2026-05); d created 2026-08;
    e (2026-01) valid until 2026-04."""
    assert index_records(project, [
        rec("deploy through the blue green switch", "deploy", id="a", created_at="2026-01-01T00:00:00Z"),
        rec("deploy through the old jenkins job", "deploy", id="b", created_at="2026-02-01T00:00:00Z"),
        rec("deploy through github actions", "deploy", id="c", created_at="2026-05-01T00:00:00Z", supersedes="b"),
        rec("deploy through argo rollouts", "deploy", id="d", created_at="2026-08-01T00:00:00Z"),
        rec("deploy only on tuesdays", "deploy", id="e", created_at="2026-01-01T00:00:00Z",
            valid_until="2026-04-01T00:00:00Z"),
    ]).code == 0
    assert forget(project, "a", "replaced by argo").code == 0
    tombstone_at(project, "a", "2026-06-01T00:00:00Z")


def ids_as_of(project, when: str | None, *extra: str) -> set[str]:
    args = ["deploy", "--mode", "lexical", "--k", "20", *extra] + ([] if when is None else ["--as-of", when])
    got = query(project, *args)
    assert got.code == 0, got.err
    return {h["id"] for h in got.json["hits"]}


def test_as_of_before_and_after_forget_supersede_creation_and_expiry(project):
    history_project(project)
    assert ids_as_of(project, None) == {"c", "d"}
    assert ids_as_of(project, "2025-12-01T00:00:00Z") == set()  # before creation
    assert ids_as_of(project, "2026-03-01T00:00:00Z") == {"a", "b", "e"}  # before the supersede and the forget
    assert ids_as_of(project, "2026-04-01T00:00:00Z") == {"a", "b"}  # e expired at T
    assert ids_as_of(project, "2026-05-01T00:00:00Z") == {"a", "c"}  # c superseded b at its created_at
    assert ids_as_of(project, "2026-06-01T00:00:00Z") == {"c"}  # a forgotten at T
    assert ids_as_of(project, "2026-07-01T00:00+02:00") == {"c"}
    assert ids_as_of(project, "2026-09-01T00:00:00Z") == {"c", "d"}
    assert ids_as_of(project, "2026-03-01T00:00:00Z", "--since", "2026-01-15T00:00:00Z") == {"b"}


def test_as_of_answer_says_so_and_hybrid_ranks_records_without_vectors(project):
    history_project(project)
    got = query(project, "deploy jenkins", "--as-of", "2026-03-01T00:00:00Z")
    assert got.code == 0, got.err
    assert got.json["hits"][0]["id"] == "b"
    assert got.json["query"]["filters"]["as_of"] == "2026-03-01T00:00:00Z"
    as_of = got.json["query"]["as_of"]
    assert as_of["live"] == 3 and as_of["retired_since"] == 3 and got.json["counts"]["records"] == 3
    assert got.json["degraded"] is None
    before = query(project, "deploy", "--as-of", "2025-01-01T00:00:00Z")
    assert before.json["hits"] == [] and before.json["warnings"][0]["code"] == "filters-match-nothing"


def test_live_at_is_the_log_meaning(project):
    history_project(project)
    scan = read((memory_dir(project) / "records.jsonl").read_bytes())
    from nubos_memory.records import iso_to_epoch

    at = live_at(scan, iso_to_epoch("2026-03-01T00:00:00Z"))
    assert [scan.records[p]["id"] for p in at] == ["a", "b", "e"]
    assert isinstance(at, np.ndarray)


def test_as_of_in_the_library_and_invalid_times(project, throwaway_memory):
    mem = throwaway_memory
    mem.index([rec("queue retries back off", "retry", id="q1", created_at="2026-01-01T00:00:00Z"),
               rec("queue retries are fixed", "retry", id="q2", created_at="2026-03-01T00:00:00Z",
                   supersedes="q1")])
    assert [h["id"] for h in mem.query("queue retries", as_of="2026-02-01T00:00:00Z")["hits"]] == ["q1"]
    assert [h["id"] for h in mem.query("queue retries")["hits"]] == ["q2"]
    index_records(project, [rec("anything at all", "x")])
    for bad in ("yesterday", "2026-01-01T00:00:00"):
        got = query(project, "anything", "--as-of", bad)
        assert got.code == 5 and got.error["code"] == "query-invalid-as-of"


def test_answers_without_the_options_are_unchanged(project, tmp_path):
    """A query's JSON is the same whether or not the log holds the feature's fields (valid_until in
    the future), and a get without --history has no history key."""
    base = [rec("pin node with volta", "node", id="n1", created_at="2026-01-01T00:00:00Z"),
            rec("pin pnpm with corepack", "pnpm", id="n2", created_at="2026-01-02T00:00:00Z")]
    assert index_records(project, base).code == 0
    plain = query(project, "pin node pnpm", "--mode", "lexical").json
    other = tmp_path / "other"
    other.mkdir()
    assert run_cli(["memory-init", "--root", str(other)]).code == 0
    (other / ".nubos-pilot" / "config.json").write_text((project / ".nubos-pilot" / "config.json").read_text())
    assert index_records(other, [{**r, "valid_until": FUTURE} for r in base]).code == 0
    timed = query(other, "pin node pnpm", "--mode", "lexical").json
    for hit in timed["hits"]:
        assert hit["record"].pop("valid_until") == FUTURE
    assert json.dumps(plain, sort_keys=True) == json.dumps(timed, sort_keys=True).replace(str(other), str(project))
    assert "as_of" not in plain["query"]["filters"] and "as_of" not in plain["query"]
    assert "history" not in get(project, "n1").json["records"][0]


# -- history ---------------------------------------------------------------------------------
def test_history_lists_versions_in_order_with_their_fates(project):
    history_project(project)
    assert index_records(project, [rec("deploy through the blue green switch, again", "deploy", id="a",
                                       created_at="2026-07-01T00:00:00Z")]).code == 0
    got = get(project, "a", "b", "e", "--history")
    assert got.code == 0, got.err
    by_id = {r["id"]: r for r in got.json["records"]}
    a = by_id["a"]["history"]
    assert [v["record"]["title"] for v in a] == ["deploy through the blue green switch",
                                                "deploy through the blue green switch, again"]
    assert a[0]["retired"] == {"reason": "replaced by argo", "at": "2026-06-01T00:00:00Z"} and not a[0]["live"]
    assert a[1]["live"] and a[1]["retired"] is None and a[0]["line"] < a[1]["line"]
    assert by_id["b"]["history"][0]["retired"] == {"reason": "superseded", "by": "c", "at": "2026-05-01T00:00:00Z"}
    assert by_id["e"]["history"][0]["retired"] == {"reason": "expired", "at": "2026-04-01T00:00:00Z"}
    assert by_id["b"]["retired"] == {"reason": "superseded", "by": "c"}  # the plain answer as before


def _state(*lines: dict):
    return read(b"".join(json.dumps(line).encode() + b"\n" for line in lines))


def _line(rid: str, title: str, created: str, **extra) -> dict:
    return {"id": rid, "type": "learning", "title": title, "body": "b", "created_at": created, **extra}


def test_an_older_copy_of_a_retired_record_never_brings_it_back_whichever_way_a_merge_ordered_the_lines():
    x = _line("x", "deploy on green", "2026-01-01T00:00:00Z")
    copy = {**x, "git": {"branch": "b", "commit": "c0ffee", "worktree": "."}}  # (the teammate's line of it)
    forget = {"op": "forget", "id": "x", "at": "2026-02-01T00:00:00Z", "reason": "obsolete"}
    newer = _line("y", "deploy on canary", "2026-02-01T00:00:00Z", supersedes="x")
    for retire in (forget, newer):
        for order in ([x, retire, copy], [x, copy, retire], [copy, retire, x]):
            scan = _state(*order)
            assert scan.live("x") is None, (retire, order)
    again = _line("x", "deploy on green", "2026-03-01T00:00:00Z")  # the same words said again, after: a new version
    assert _state(x, forget, again).live("x") is not None
    other = _line("x", "deploy on blue", "2026-01-01T00:00:00Z")  # other words under the id: brings it back
    assert _state(x, forget, other).live("x") is not None


def test_a_record_retired_twice_is_retired_by_the_earlier_whichever_line_a_merge_put_first():
    from nubos_memory.log import retired_at
    from nubos_memory.records import iso_to_epoch
    from nubos_memory.search.timeline import live_mask

    x = _line("x", "deploy on green", "2026-01-01T00:00:00Z")
    early = {"op": "forget", "id": "x", "at": "2026-02-01T00:00:00Z", "reason": "obsolete"}
    late = {"op": "forget", "id": "x", "at": "2026-03-01T00:00:00Z", "reason": "wrong"}
    by_y = _line("y", "deploy on canary", "2026-02-01T00:00:00Z", supersedes="x")
    by_z = _line("z", "deploy on blue", "2026-03-01T00:00:00Z", supersedes="x")
    between = iso_to_epoch("2026-02-15T00:00:00Z")
    for first, second, reason in ((early, late, "obsolete"), (by_y, late, "superseded"), (by_y, by_z, "superseded"),
                                  (early, by_z, "obsolete")):
        for order in ([x, first, second], [x, second, first]):
            scan = _state(*order)
            pos = 0
            assert scan.dead[pos]["reason"] == reason and retired_at(scan, pos) == "2026-02-01T00:00:00Z", order
            assert not live_mask(scan, between)[pos], order  # (as of between the two, retired)


def test_a_copy_of_any_retired_version_stays_retired_and_a_supersede_is_timed_by_its_own_record():
    from nubos_memory.log import LogScan, feed

    v1 = _line("x", "deploy on green", "2026-01-01T00:00:00Z")
    v2 = _line("x", "deploy on blue", "2026-03-01T00:00:00Z")
    forgets = [{"op": "forget", "id": "x", "at": at, "reason": "obsolete"}
               for at in ("2026-02-01T00:00:00Z", "2026-04-01T00:00:00Z")]
    assert _state(v1, forgets[0], v2, forgets[1], {**v1, "git": {"branch": "b"}}).live("x") is None  # (v1's copy)
    # Two logs read as one (a worktree's): the second's lines are numbered from 1 again
    other = b"".join(json.dumps(_line(f"o{i}", f"other {i}", f"20{30 if i == 1 else 26}-01-01T00:00:00Z")).encode()
                     + b"\n" for i in range(5))
    own = [v1, _line("y", "deploy on canary", "2026-02-01T00:00:00Z", supersedes="x"),
           {**v1, "created_at": "2026-03-01T00:00:00Z"}]  # the same words said again after the supersede
    scan = LogScan()
    feed(scan, other)
    scan.applied = scan.size = scan.lines = 0
    feed(scan, b"".join(json.dumps(line).encode() + b"\n" for line in own))
    assert scan.live("x") is not None


def test_a_retirement_without_a_time_or_tied_in_time_gives_one_answer_whichever_line_came_first():
    from nubos_memory.log import retired_at

    x = _line("x", "deploy on green", "2026-01-01T00:00:00Z")
    timeless = {"op": "forget", "id": "x", "reason": "hand edit"}
    late = {"op": "forget", "id": "x", "at": "2026-05-01T00:00:00Z", "reason": "late"}
    tied = {"op": "forget", "id": "x", "at": "2026-03-01T00:00:00Z", "reason": "a"}
    by_y = _line("y", "deploy on canary", "2026-03-01T00:00:00Z", supersedes="x")
    named = {"op": "forget", "id": "x", "at": "2026-02-01T00:00:00Z", "reason": "superseded"}  # (a forget's words)
    for first, second in ((timeless, late), (tied, by_y), (named, by_y)):
        seen = set()
        for order in ([x, first, second], [x, second, first]):
            scan = _state(*order)
            seen.add((scan.dead[0]["reason"], retired_at(scan, 0)))
        assert len(seen) == 1, (first, second, seen)
    assert retired_at(_state(x, named), 0) == "2026-02-01T00:00:00Z"  # a forget, whatever its reason says


def test_a_forget_whose_reason_reads_superseded_survives_an_export_and_import(project, tmp_path):
    assert index_records(project, [rec("deploy on green", id="x")]).code == 0
    assert forget(project, "x", "superseded").code == 0
    exported = tmp_path / "export.jsonl"
    assert run_cli(["memory-export", "--root", str(project), str(exported)]).code == 0
    other = tmp_path / "other"
    other.mkdir()
    assert run_cli(["memory-init", "--root", str(other)]).code == 0
    from .conftest import write_config

    write_config(other, provider="hash", model="hash-256", near_duplicate=None)
    assert run_cli(["memory-import", "--root", str(other), str(exported)]).code == 0
    assert not get(other, "x").json["records"][0]["live"]


def test_a_forget_never_retires_a_version_written_after_it_whichever_way_a_merge_put_the_lines():
    from nubos_memory.log import retired_at

    x = _line("x", "deploy on green", "2026-01-01T00:00:00Z")
    drop_a = {"op": "forget", "id": "x", "at": "2026-02-01T00:00:00Z", "reason": "dropA"}  # branch a
    drop_b = {"op": "forget", "id": "x", "at": "2026-02-15T00:00:00Z", "reason": "dropB"}  # branch b, then ...
    canary = _line("x", "deploy on canary", "2026-03-01T00:00:00Z")  # ... b says it anew
    for order in ([x, drop_a, drop_b, canary], [x, drop_b, canary, drop_a]):
        scan = _state(*order)
        assert scan.records[scan.live("x")]["title"] == "deploy on canary", order
        assert (scan.dead[0]["reason"], retired_at(scan, 0)) == ("dropA", "2026-02-01T00:00:00Z"), order


def test_a_record_from_a_machine_whose_clock_is_ahead_is_still_forgotten_and_superseded(project):
    from datetime import UTC, datetime, timedelta

    ahead = (datetime.now(UTC) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    assert index_records(project, [rec("deploy on green", id="x", created_at=ahead),
                                   rec("deploy on blue", id="z", created_at=ahead)]).code == 0
    assert forget(project, "x").code == 0
    assert not get(project, "x").json["records"][0]["live"]
    out = index_records(project, [rec("deploy on canary", id="y", supersedes="z")])
    assert out.code == 0, out.err
    got = get(project, "z", "y").json["records"]
    assert not got[0]["live"] and got[0]["retired"]["by"] == "y" and got[1]["live"], got


def test_an_import_reads_as_its_source_when_a_merge_put_the_earlier_forget_after_a_re_add(project, tmp_path):
    x = _line("x", "deploy on green", "2026-01-01T00:00:00Z")
    lines = [x, {"op": "forget", "id": "x", "at": "2026-02-15T00:00:00Z", "reason": "dropB"},
             _line("x", "deploy on canary", "2026-03-01T00:00:00Z"),
             {"op": "forget", "id": "x", "at": "2026-02-01T00:00:00Z", "reason": "dropA"}]
    source = tmp_path / "merged.jsonl"
    source.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert _state(*lines).records[_state(*lines).live("x")]["title"] == "deploy on canary"
    out = run_cli(["memory-import", "--root", str(project), str(source)])
    assert out.code == 0, out.err
    got = get(project, "x").json["records"][0]
    assert got["live"] and got["record"]["title"] == "deploy on canary", got

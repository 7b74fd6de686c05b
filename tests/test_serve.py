"""Warm mode: a real memory-serve subprocess; same answers as in-process; clean fallback."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time

import pytest

from .conftest import REPO, index_records, rec, run_sub

CORPUS = [rec(f"note {i} about {topic}", f"details of {topic} number {i}", id=f"n{i}", tags=[topic])
          for i, topic in enumerate(["webhooks", "jwt", "pnpm", "invoices", "webhooks", "flags"] * 3)]


def start_server(root, *extra):
    proc = subprocess.Popen([sys.executable, "-m", "nubos_memory", "memory-serve", "--root", str(root), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    line = proc.stderr.readline()
    assert '"serving"' in line, line + proc.stderr.read()
    return proc


def stop(proc):
    proc.send_signal(signal.SIGTERM)
    out, proc.err_text = proc.communicate(timeout=20)  # (what the server said on stderr, for the tests)
    return json.loads(out)


@pytest.fixture
def served(project):
    index_records(project, CORPUS)
    proc = start_server(project)
    yield project, proc
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def stale_socket(root):
    """A socket file bound once by a process that is gone (a killed server's leftover)."""
    path = root / ".nubos-pilot/memory/serve.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.close()
    return path


def in_process(*argv):
    return run_sub(list(argv), env={"NUBOS_MEMORY_NO_SERVER": "1"})


def test_server_answers_exactly_like_in_process(served):
    root, proc = served
    sock = root / ".nubos-pilot/memory/serve.sock"
    assert stat.S_IMODE(sock.stat().st_mode) == 0o600
    for argv in (["memory-query", "webhooks", "--explain"], ["memory-query", "--type", "critic", "x"],
                 ["memory-query", "--text", " "], ["memory-query", "--k", "0", "x"], ["memory-stats"]):
        warm = run_sub([*argv, "--root", str(root)])
        cold = in_process(*argv, "--root", str(root))
        assert (warm.code, warm.json, warm.error) == (cold.code, cold.json, cold.error), argv
    summary = stop(proc)
    assert summary["stopped"] and summary["served"] == 5 and summary["reason"] == "signal"
    assert not sock.exists()


def test_writes_through_server_and_by_others_are_seen(served):
    root, proc = served
    add = run_sub(["memory-add", "--root", str(root), "--type", "learning", "--title", "zebra crossing rules"],
                  stdin="stdin body reaches the server")
    assert add.code == 0 and add.json["added"] == 1
    # Written by "another process" behind the server's back.
    other = in_process("memory-add", "--root", str(root), "--type", "learning", "--title", "quokka habitat")
    assert other.code == 0
    for word, rid in (("zebra", add.json["id"]), ("quokka", other.json["id"])):
        q = run_sub(["memory-query", "--root", str(root), word])
        assert q.json["hits"][0]["id"] == rid
    lines = (root / ".nubos-pilot/memory/records.jsonl").read_text().splitlines()
    assert json.loads(lines[-2])["body"] == "stdin body reaches the server"
    batch = root / "batch.jsonl"
    batch.write_text(json.dumps(rec("walrus tusks", id="w1")) + "\n")
    idx = run_sub(["memory-index", "--root", str(root), "--records-file", "batch.jsonl"], cwd=root)
    assert idx.code == 0 and idx.json["added"] == 1
    stats = in_process("memory-stats", "--root", str(root)).json
    assert stats["count"] == len(CORPUS) + 3 and stats["consistency"]["consistent"]
    assert stop(proc)["served"] == 4  # add, two queries, index; in_process calls bypass it


def test_fallback_when_no_server_and_stale_socket_is_replaced(project):
    index_records(project, CORPUS)
    sock_path = stale_socket(project)
    assert sock_path.exists()
    q = run_sub(["memory-query", "--root", str(project), "jwt"])
    assert q.code == 0 and q.json["hits"]
    proc = start_server(project)  # replaces the stale socket
    try:
        assert run_sub(["memory-query", "--root", str(project), "jwt"]).json == q.json
    finally:
        assert stop(proc)["served"] == 1


def test_killed_server_leaves_socket_that_clients_survive(project):
    index_records(project, CORPUS)
    proc = start_server(project)
    proc.kill()
    proc.wait()
    assert (project / ".nubos-pilot/memory/serve.sock").exists()
    q = run_sub(["memory-query", "--root", str(project), "pnpm"])
    assert q.code == 0 and q.json["hits"][0]["record"]["tags"] == ["pnpm"]


def test_idle_shutdown_and_second_server_refused(project):
    index_records(project, CORPUS)
    proc = start_server(project, "--idle-timeout", "1.5")
    second = run_sub(["memory-serve", "--root", str(project)])
    assert second.code == 5 and second.error["code"] == "serve-already-running"
    out, _ = proc.communicate(timeout=20)
    assert json.loads(out)["reason"] == "idle"
    assert not (project / ".nubos-pilot/memory/serve.sock").exists()


def test_disabled_memory_refuses_to_serve(tmp_path):
    r = run_sub(["memory-serve", "--root", str(tmp_path)])
    assert r.code == 4 and r.error["code"] == "memory-disabled"
    t = time.monotonic()
    assert time.monotonic() - t < 5


def test_forwarded_verbs_do_not_load_the_library(served):
    """The client side of warm mode imports neither numpy nor the library's heavy modules."""
    root, proc = served
    probe = ("import io, json, sys, contextlib; from nubos_memory.interfaces import cli; out = io.StringIO()\n"
             "with contextlib.redirect_stdout(out): code = cli.main(['memory-query', '--root', sys.argv[1], 'jwt'])\n"
             "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('numpy', 'torch', 'hnswlib', 'filelock')"
             " or m in ('nubos_memory.api.memory', 'nubos_memory.search.query'))\n"
             "print(json.dumps({'code': code, 'heavy': heavy, 'hits': len(json.loads(out.getvalue())['hits'])}))")
    res = subprocess.run([sys.executable, "-c", probe, str(root)], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)
    doc = json.loads(res.stdout.strip().splitlines()[-1])
    assert doc == {"code": 0, "heavy": [], "hits": doc["hits"]} and doc["hits"] > 0
    assert stop(proc)["served"] == 1


SLOW_WARM_UP = """
import sys, time
from nubos_memory.interfaces import warm
fast = warm.WarmMemory.warm_up
def slow(self):
    time.sleep(float(sys.argv[1]))
    fast(self)
warm.WarmMemory.warm_up = slow
from nubos_memory.interfaces.cli import main
sys.exit(main(sys.argv[2:]))
"""


def slow_server(root, warm_up_s, *extra):
    """A real memory-serve whose warm-up takes ``warm_up_s`` longer (a big model, a cold disk)."""
    return subprocess.Popen([sys.executable, "-c", SLOW_WARM_UP, str(warm_up_s), "memory-serve", "--root", str(root),
                             *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})


def test_idle_time_counts_from_the_end_of_warm_up_and_clients_never_wait_for_it(project):
    index_records(project, CORPUS)
    sock_path = project / ".nubos-pilot/memory/serve.sock"
    started = time.monotonic()
    proc = slow_server(project, 4.0, "--idle-timeout", "2")
    try:
        time.sleep(0.8)
        assert proc.poll() is None and not sock_path.exists()  # warming up: no socket to block on yet
        q = run_sub(["memory-query", "--root", str(project), "jwt"])
        assert q.code == 0 and q.json["hits"]
        assert time.monotonic() - started < 4.0  # answered in-process while the server warmed up
        line = proc.stderr.readline()
        assert '"serving"' in line and time.monotonic() - started >= 4.0
        time.sleep(0.5)
        assert proc.poll() is None  # warm-up did not count as idle time
        assert run_sub(["memory-query", "--root", str(project), "jwt"]).json == q.json
        out, _ = proc.communicate(timeout=20)
        summary = json.loads(out)
        assert summary["reason"] == "idle" and summary["served"] == 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_two_servers_racing_for_a_stale_socket_one_serves_the_other_is_told_why(project):
    index_records(project, CORPUS)
    stale_socket(project)
    procs = [slow_server(project, 0.5) for _ in range(2)]
    try:
        loser = None
        for _ in range(200):
            done = [p for p in procs if p.poll() is not None]
            if done:
                loser = done[0]
                break
            time.sleep(0.05)
        assert loser is not None, "neither server gave way"
        err = json.loads(loser.stderr.read())
        assert loser.returncode == 5 and err["error"]["code"] == "serve-already-running"
        winner = next(p for p in procs if p is not loser)
        assert '"serving"' in winner.stderr.readline()
        assert run_sub(["memory-query", "--root", str(project), "jwt"]).code == 0
        assert stop(winner)["served"] == 1
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_progress_of_a_forwarded_long_verb_comes_through_the_server(served):
    root, proc = served
    r = run_sub(["memory-rebuild", "--root", str(root), "--reembed", "--progress", "json"])
    assert r.code == 0 and r.json["rebuilt"] is True
    stages = [json.loads(line)["progress"]["stage"] for line in r.err.splitlines()]
    assert "embedding" in stages and "indexing" in stages
    assert stop(proc)["served"] == 1  # it was the server that did it


# -- a command line handed over as typed (issue 27: a served call within 3x of starting Python) --------------
LIGHT_PROBE = ("import io, json, sys, contextlib; from nubos_memory.interfaces import entry; out = io.StringIO()\n"
               "with contextlib.redirect_stdout(out): code = entry.main(sys.argv[1:])\n"
               "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('numpy', 'orjson', 'hnswlib', 'torch')"
               " or m in ('nubos_memory.interfaces.cli', 'nubos_memory.config', 'nubos_memory.params', 'argparse'))\n"
               "print(json.dumps({'code': code, 'heavy': heavy, 'out': out.getvalue()}))")


def light_call(*argv: str) -> dict:
    res = subprocess.run([sys.executable, "-c", LIGHT_PROBE, *argv], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_a_command_line_is_answered_by_the_server_before_the_cli_is_imported(served):
    root, proc = served
    for argv in (["memory-query", "--root", str(root), "jwt", "--explain"], ["memory-stats", "--root", str(root)],
                 ["memory-query", "--root", str(root), "webhooks", "--format", "md"]):
        doc = light_call(*argv)
        cold = in_process(*argv)
        assert doc["heavy"] == [] and (doc["code"], doc["out"]) == (cold.code, cold.out), argv
    bad = run_sub(["memory-query", "--root", str(root), "--k", "many", "x"])  # a usage error, said by the server
    cold = in_process("memory-query", "--root", str(root), "--k", "many", "x")
    assert bad.code == cold.code == 2 and bad.err == cold.err and bad.error["code"] == "usage"
    assert stop(proc)["served"] == 4


def test_what_the_server_must_not_run_for_a_command_line_the_cli_runs(served, tmp_path):
    root, proc = served
    helped = run_sub(["memory-query", "--root", str(root), "--help"])  # argparse prints it and exits
    assert helped.code == 0 and helped.out.startswith("usage: np-tools memory-query")
    # the body from this process's standard input (the CLI reads it, then hands the request over)
    add = run_sub(["memory-add", "--root", str(root), "--type", "learning", "--title", "from stdin"],
                  stdin="stdin body for the server")
    # a file named relative to this process's working directory, not the server's
    (tmp_path / "note.txt").write_text("a body from a relative file")
    rel = run_sub(["memory-add", "--root", os.path.relpath(root, tmp_path), "--type", "learning",
                   "--title", "from a file", "--body-file", "note.txt"], cwd=tmp_path)
    assert add.code == 0 and rel.code == 0, (add.err, rel.err)
    got = in_process("memory-get", "--root", str(root), add.json["id"], rel.json["id"]).json["records"]
    assert [g["record"]["body"] for g in got] == ["stdin body for the server", "a body from a relative file"]
    # --root names another memory (with no server): answered there, not by this server
    other = tmp_path / "other"
    other.mkdir()
    assert run_sub(["memory-init", "--root", str(other)]).code == 0
    index_records(other, [rec("only in the other memory", "zanzibar", id="o1")])
    there = run_sub(["memory-query", "--root", str(other), "zanzibar"], cwd=root)
    assert [h["id"] for h in there.json["hits"]] == ["o1"]
    assert stop(proc)["served"] == 2  # the two writes (one as a prepared request), nothing else


def test_a_server_lost_after_it_took_a_write_is_reported_never_redone(project):
    """The client learns before anything runs whether the server took the call, and whether it writes: lost
    after that, a read is redone here, a write is reported (it may have been written)."""
    import threading

    from nubos_memory.interfaces import client

    path = project / ".nubos-pilot/memory/serve.sock"
    path.parent.mkdir(parents=True, exist_ok=True)

    def fake_server(writes: bool) -> threading.Thread:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            listener.bind(str(path))
        finally:
            os.umask(old)
        listener.listen(1)

        def serve() -> None:
            conn, _ = listener.accept()
            client.recv_message(conn)
            client.send_message(conn, {"accepted": True, "writes": writes})
            conn.close()  # and dies before it answers
            listener.close()
            path.unlink()

        thread = threading.Thread(target=serve)
        thread.start()
        return thread

    thread = fake_server(writes=True)
    got = client.quick(["memory-add", "--root", str(project), "--type", "learning", "--title", "t", "--body", "b"])
    thread.join(10)
    assert got is not None and got[0] == 7 and json.loads(got[2])["error"]["code"] == "server-lost"
    thread = fake_server(writes=False)
    assert client.quick(["memory-query", "--root", str(project), "x"]) is None  # the CLI runs it here
    thread.join(10)


def test_the_server_never_reads_its_own_stdin_or_a_file_for_a_client(project, tmp_path):
    """Files a command line names are read by the caller (``verbs.prepare``), the server's standard input
    never: ``--body-file -`` and ``/dev/stdin`` are the client's (found by review)."""
    index_records(project, CORPUS)
    proc = subprocess.Popen([sys.executable, "-m", "nubos_memory", "memory-serve", "--root", str(project)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        proc.stdin.write("SERVER'S OWN STDIN\n")
        proc.stdin.flush()  # (left open: a server that read it would wait for more)
        assert '"serving"' in proc.stderr.readline()
        (tmp_path / "-").write_text("a file named dash")
        bodies = []
        for named in ("-", "/dev/stdin"):
            add = run_sub(["memory-add", "--root", str(project), "--type", "learning", "--title", f"via {named}",
                           "--body-file", named], stdin=f"client stdin for {named}\n", cwd=tmp_path, timeout=30)
            assert add.code == 0, add.err
            bodies.append(in_process("memory-get", "--root", str(project), add.json["id"]).json["records"][0]
                          ["record"]["body"])
        assert bodies == ["client stdin for -", "client stdin for /dev/stdin\n"]
        helped = run_sub(["memory-query", "--root", str(project), "--hel"])  # an abbreviation of --help
        assert helped.code == 0 and helped.out.startswith("usage: np-tools memory-query")
        assert stop(proc)["stopped"]  # its stdout holds its summary alone: no help was printed there
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_an_abbreviated_root_is_left_to_the_cli():
    from nubos_memory.interfaces import client

    assert client._root_argument(["memory-query", "--ro", "x", "q"]) == (False, None)
    assert client._root_argument(["memory-query", "--roo=x", "q"]) == (False, None)
    assert client._root_argument(["memory-query", "--root", "a", "--root=b"]) == (True, "b")
    assert client._root_argument(["memory-query", "--", "--ro"]) == (True, None)


def test_a_prepared_request_naming_a_file_is_refused(served):
    """Only the caller opens the files it names: a request that still names one (not from this CLI) is
    refused, never opened by the server (found by review)."""
    from nubos_memory.interfaces import client

    root, proc = served
    for args in ({"type": "learning", "title": "x", "body_file": "/dev/stdin"},
                 {"records_file": "/dev/stdin"}):
        verb = "memory-add" if "body_file" in args else "memory-index"
        with client.connect(root / ".nubos-pilot/memory/serve.sock", timeout=10) as sock:
            client.send_message(sock, {"verb": verb, "args": args})
            reply = client.recv_message(sock)
        assert reply["code"] == 2 and reply["doc"]["error"]["code"] == "usage", reply
    stop(proc)


def test_the_parser_is_built_once_and_a_bad_command_line_leaves_it_as_it_was(monkeypatch: pytest.MonkeyPatch):
    """A served call paid ~4 ms building argparse's parser for every command line (issue 27)."""
    from nubos_memory.errors import UsageError
    from nubos_memory.interfaces import cli

    built = []
    real = cli.build_parser
    monkeypatch.setattr(cli, "build_parser", lambda quiet=False: built.append(quiet) or real(quiet))
    cli._parser.cache_clear()
    try:
        assert cli.parse(["memory-query", "one", "--k", "3"], quiet=True)[1]["k"] == 3
        with pytest.raises(UsageError):
            cli.parse(["memory-query", "--k", "many"], quiet=True)
        with pytest.raises(cli._Printing):
            cli.parse(["memory-query", "--help"], quiet=True)  # (what argparse would print: the CLI prints it)
        for argv in (["memory-query", "two"], ["memory-add", "--type", "learning", "--title", "t", "--body", "b"], ["memory-stats"]):
            fresh = vars(real(True).parse_args(argv))  # what a parser of its own gives
            name, request = cli.parse(argv, quiet=True)
            assert {"verb": name, **request} == fresh
        assert built == [True]
    finally:
        cli._parser.cache_clear()


# -- a stopped server, a config turned invalid, another environment, a broken request --------------------
def test_a_stopped_server_never_hangs_a_call_it_is_answered_in_process(served, monkeypatch):
    from nubos_memory.interfaces import client

    root, proc = served
    monkeypatch.setattr(client, "ACCEPT_TIMEOUT_S", 1.0)
    proc.send_signal(signal.SIGSTOP)  # Ctrl-Z in the server's terminal: it still holds the socket
    try:
        t = time.monotonic()
        assert client.quick(["memory-query", "--root", str(root), "jwt"]) is None  # the CLI runs it itself
        assert client.forward("memory-query", {"root": str(root), "text": "jwt"}) == (None, None)
        assert time.monotonic() - t < 10
        q = run_sub(["memory-query", "--root", str(root), "jwt"], timeout=60)  # (the real wait: 10 s, then here)
        assert q.code == 0 and q.json["hits"]
    finally:
        proc.send_signal(signal.SIGCONT)
    assert stop(proc)["served"] == 0  # the calls it never accepted were not run when it woke up


def test_a_config_turned_invalid_is_the_answer_of_a_served_write_not_server_lost(served):
    root, proc = served
    config = root / ".nubos-pilot/config.json"
    good = config.read_text()
    config.write_text(good[:-3])  # truncated JSON
    try:
        for argv in (["memory-forget", "nope"], ["memory-pin", "n1"]):
            warm = run_sub([*argv, "--root", str(root)])
            cold = in_process(*argv, "--root", str(root))
            assert (warm.code, warm.error["code"]) == (cold.code, cold.error["code"]) == (3, "config-invalid-json")
    finally:
        config.write_text(good)
    assert run_sub(["memory-query", "--root", str(root), "jwt"]).code == 0
    stop(proc)
    assert "Traceback" not in proc.err_text


def test_a_caller_in_another_environment_is_answered_by_its_own_cli(served, tmp_path):
    root, proc = served
    other_home = tmp_path / "other-data"  # another user-memory folder: the server's answers read its own
    add = run_sub(["memory-add", "--root", str(root), "--scope", "user", "--type", "learning", "--title",
                   "okapi stripes"], env={"XDG_DATA_HOME": str(other_home)})
    assert add.code == 0, add.err
    assert list(other_home.rglob("records.jsonl"))  # written where the caller's environment says
    assert add.json["warnings"][-1]["code"] == "server-other-environment"
    q = run_sub(["memory-query", "--root", str(root), "okapi"], env={"XDG_DATA_HOME": str(other_home)})
    assert [h["id"] for h in q.json["hits"]] == [add.json["id"]]
    assert q.json["warnings"][-1]["code"] == "server-other-environment"
    assert run_sub(["memory-query", "--root", str(root), "okapi"]).json["hits"] == []  # the server's own
    assert stop(proc)["served"] == 1


def test_a_request_the_server_cannot_read_is_dropped_without_a_traceback(served):
    from nubos_memory.interfaces.client import connect, recv_message, send_message

    root, proc = served
    for bad in ({"verb": ["x"], "args": {}}, {"verb": "memory-query", "args": 5}, [1, 2]):
        with connect(root / ".nubos-pilot/memory/serve.sock", timeout=5) as sock:
            send_message(sock, bad)
            with pytest.raises((ConnectionError, OSError, ValueError)):
                recv_message(sock)
    assert run_sub(["memory-query", "--root", str(root), "jwt"]).code == 0
    assert stop(proc)["served"] == 1
    assert "Traceback" not in proc.err_text


def test_a_segment_deleted_between_the_manifest_and_its_read_is_read_again_or_said_missing(project, monkeypatch):
    from nubos_memory import Memory
    from nubos_memory.errors import StoreError
    from nubos_memory.store.cache import DerivedCache

    index_records(project, CORPUS)
    cache = Memory.open(project).store.cache
    real = DerivedCache.load
    calls = []

    def vanishing(self, manifest):
        calls.append(manifest["generation"])
        if len(calls) == 1:
            raise FileNotFoundError(2, "No such file or directory", str(self.folder / "segment-x.vectors.npy"))
        return real(self, manifest)

    monkeypatch.setattr(DerivedCache, "load", vanishing)
    generations = iter([1, 2, 2, 2])
    real_read = DerivedCache.read_manifest
    monkeypatch.setattr(DerivedCache, "read_manifest",
                        lambda self: {**real_read(self), "generation": next(generations)})
    _, index = cache.load_current()
    assert index is not None and calls == [1, 2]  # a merge committed meanwhile: the new generation is read
    monkeypatch.setattr(DerivedCache, "load", lambda self, m: (_ for _ in ()).throw(FileNotFoundError(2, "gone", "x")))
    monkeypatch.setattr(DerivedCache, "read_manifest", lambda self: real_read(self))
    with pytest.raises(StoreError) as caught:
        cache.load_current()
    assert caught.value.code == "index-missing"


SETS_A_VARIABLE = """
import os, sys
from nubos_memory.interfaces import warm
fast = warm.WarmMemory.warm_up
def loading(self):
    fast(self)
    os.environ["NUBOS_MEMORY_ALLOW_DOWNLOADS"] = "0"  # a variable it compares, set by the server itself
warm.WarmMemory.warm_up = loading
from nubos_memory.interfaces.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_variable_the_server_set_itself_after_it_started_is_not_the_callers_environment(project):
    index_records(project, CORPUS)
    env = {k: v for k, v in os.environ.items() if k != "NUBOS_MEMORY_ALLOW_DOWNLOADS"}
    proc = subprocess.Popen([sys.executable, "-c", SETS_A_VARIABLE, "memory-serve", "--root", str(project)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**env, "PYTHONPATH": str(REPO)})
    try:
        assert '"serving"' in proc.stderr.readline()
        q = subprocess.run([sys.executable, "-m", "nubos_memory", "memory-query", "--root", str(project), "jwt"],
                           capture_output=True, text=True, env={**env, "PYTHONPATH": str(REPO)}, timeout=60)
        assert q.returncode == 0 and "server-other-environment" not in q.stdout, q.stdout
        assert stop(proc)["served"] == 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_variable_no_answer_reads_never_sends_a_caller_away(served):
    root, proc = served
    for env in ({"XDG_SESSION_ID": "7", "XDG_VTNR": "2"}, {"HF_HUB_OFFLINE": "0", "NUBOS_MEMORY_DEBUG": "1"}):
        q = run_sub(["memory-query", "--root", str(root), "jwt"], env=env)
        assert q.code == 0 and not any(w["code"] == "server-other-environment" for w in q.json["warnings"]), env
    assert stop(proc)["served"] == 2


def test_an_older_servers_answer_is_taken_never_run_again_here(project):
    """A server from before ``ack`` answers a prepared request at once: that answer is the call's."""
    import threading as th

    from nubos_memory.interfaces import client

    path = client.socket_path(project)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    os.chmod(path, 0o600)
    listener.listen(1)

    def older() -> None:
        conn, _ = listener.accept()
        with conn:
            client.recv_message(conn)
            client.send_message(conn, {"code": 0, "stream": "stdout", "doc": {"answered": "by the server"}})

    worker = th.Thread(target=older, daemon=True)
    worker.start()
    try:
        answer, warning = client.forward("memory-add", {"root": str(project), "type": "learning", "title": "t"})
        assert answer == (0, "stdout", {"answered": "by the server"}) and warning is None
    finally:
        worker.join(timeout=10)
        listener.close()

"""Shared fixtures: a fresh project per test, the CLI in-process or as a subprocess.

Most tests use the deterministic ``hash`` embedder (instant, no model); tests
marked ``model`` use the real packaged all-MiniLM-L6-v2.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from nubos_memory.interfaces import cli

REPO = Path(__file__).resolve().parents[1]
# The reliability suites run quick versions by default; NUBOS_MEMORY_HEAVY=1 runs the heavy ones
# (more writers, trials and generated inputs; docs/reliability.md).
HEAVY = os.environ.get("NUBOS_MEMORY_HEAVY") == "1"
# One-shot writes make a due side-weight estimate themselves here, as the library does, instead of starting a
# background memory-settle that would commit while a test looks (tests/test_settle.py covers the background).
os.environ[cli.SETTLE_INLINE] = "1"


def write_config(root: Path, **memory) -> None:
    cfg_path = root / ".nubos-pilot" / "config.json"
    doc = json.loads(cfg_path.read_text()) if cfg_path.exists() else {}
    doc.setdefault("memory", {}).update(memory)
    cfg_path.parent.mkdir(parents=True, exist_ok=True)
    cfg_path.write_text(json.dumps(doc))


@pytest.fixture(autouse=True, scope="session")
def worker_locks_of_this_session():
    """The lock files this session's projects leave in this user's real cache (``generator/``, one per project
    root a worker ran for: api/background.py) go when it ends; those that were there before stay."""
    from nubos_memory.userdirs import user_cache_dir

    cache = user_cache_dir()
    folder = cache / "generator" if cache is not None else None
    before = set(folder.glob("*.lock")) if folder is not None else set()
    yield
    for path in set(folder.glob("*.lock")) - before if folder is not None else ():
        path.unlink(missing_ok=True)


@pytest.fixture(autouse=True)
def user_data_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test's user-level memory lives in a data folder of its own, never in this user's real one."""
    home = tmp_path_factory.mktemp("data-home")
    monkeypatch.setenv("XDG_DATA_HOME", str(home))
    return home


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """An initialised project using the hash embedder."""
    root = tmp_path / "proj"
    root.mkdir()
    code, _, err = run_cli(["memory-init", "--root", str(root)])
    assert code == 0, err
    # Near-duplicate detection is tuned for the real model; the hash double's cosines are not comparable,
    # so it is off here and switched on by the tests that are about it (tests/test_dedup.py).
    write_config(root, provider="hash", model="hash-256", lock_timeout=2.0, near_duplicate=None)
    return root


class Result:
    def __init__(self, code: int, out: str, err: str):
        self.code, self.out, self.err = code, out, err

    def __iter__(self):
        return iter((self.code, self.json, self.error))

    @property
    def json(self):
        return json.loads(self.out) if self.out.strip() else None

    @property
    def error(self):
        return json.loads(self.err)["error"] if self.err.strip() else None


def run_cli(argv: list[str], stdin: str | None = None) -> Result:
    """Run the CLI in-process, capturing stdout/stderr."""
    out, err = io.StringIO(), io.StringIO()
    old = sys.stdout, sys.stderr, sys.stdin
    sys.stdout, sys.stderr = out, err
    fake_in = io.TextIOWrapper(io.BytesIO((stdin or "").encode()), encoding="utf-8")
    sys.stdin = fake_in
    try:
        code = cli.main(argv)
    finally:
        sys.stdout, sys.stderr, sys.stdin = old
    return Result(code, out.getvalue(), err.getvalue())


def run_sub(argv: list[str], *, cwd: Path | None = None, stdin: str | None = None, env: dict | None = None,
            timeout: float = 120) -> Result:
    """Run ``python -m nubos_memory`` as a real subprocess."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    proc = subprocess.run([sys.executable, "-m", "nubos_memory", *argv], cwd=cwd, input=stdin or "",
                          capture_output=True, text=True, env=full_env, timeout=timeout)
    return Result(proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture
def cli_run():
    return run_cli


def memory_dir(root: Path) -> Path:
    """The memory folder of the project at ``root``."""
    return root / ".nubos-pilot" / "memory"


def rec(title: str, body: str = "", **kw) -> dict:
    return {"type": kw.pop("type", "learning"), "title": title, "body": body, **kw}


def index_records(root: Path, records: list[dict]) -> Result:
    return run_cli(["memory-index", "--root", str(root), "--records-file", "-"],
                   stdin="\n".join(json.dumps(r) for r in records))


def query(root: Path, *args: str) -> Result:
    return run_cli(["memory-query", "--root", str(root), *args])


# -- team memory: a real PostgreSQL (pgserver) for the whole session ----------------------------------
@pytest.fixture(scope="session")
def pg(tmp_path_factory):
    """``(dsn, restart)``: a DSN to a PostgreSQL server, and a function that kills it with SIGKILL and
    starts it again (None for a server given by NUBOS_MEMORY_TEST_DSN)."""
    given = os.environ.get("NUBOS_MEMORY_TEST_DSN")
    if given:
        yield given, None
        return
    import pgserver

    folder = tmp_path_factory.mktemp("pg")
    server = pgserver.get_server(folder, cleanup_mode="stop")

    def restart(down_s: float = 0.0) -> None:
        pid = int((Path(folder) / "postmaster.pid").read_text().split()[0])
        os.kill(pid, signal.SIGKILL)
        for _ in range(200):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        time.sleep(down_s)
        for _ in range(60):  # its backends outlive it briefly, holding shared memory
            try:
                server.ensure_postgres_running()  # a stale postmaster.pid is recognised, the server started
                return
            except subprocess.CalledProcessError:
                time.sleep(0.5)
        server.ensure_postgres_running()

    yield server.get_uri(), restart
    server.cleanup()


@pytest.fixture
def team(pg, tmp_path, monkeypatch):
    """A project whose memory lives in a fresh namespace of the test database (hash embedder)."""
    dsn, _ = pg
    monkeypatch.setenv("NUBOS_MEMORY_DSN", dsn)
    monkeypatch.setenv("NUBOS_MEMORY_CACHE", str(tmp_path / "cache-a"))
    root = tmp_path / "team"
    root.mkdir()
    assert run_cli(["memory-init", "--root", str(root)]).code == 0
    namespace = "t-" + uuid.uuid4().hex[:12]
    write_config(root, provider="hash", model="hash-256", lock_timeout=20.0, near_duplicate=None,
                 backend="postgres", postgres={"namespace": namespace})
    return root


# -- a throwaway memory: the in-memory store (issue 22) -------------------------------------------------------
@pytest.fixture
def throwaway_memory(project):
    """A ``Memory`` with ``project``'s settings whose log, lock and derived state live in this process
    (``store/inmemory.py``, the hash embedder): nothing is written to the memory folder."""
    from nubos_memory.api.memory import Memory
    from nubos_memory.config import load_project
    from nubos_memory.embed.hashing import HashEmbedder
    from nubos_memory.store.inmemory import InMemoryStore

    return Memory(load_project(project), embedder=HashEmbedder("hash-256"), store=InMemoryStore(lock_timeout=2.0))

"""A one-shot write never waits for a side-weight estimate (issues 24 and 27): one it makes due is made by a
background ``memory-settle`` after the write answers (what ``memory-serve`` does when idle)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from nubos_memory.api import background
from nubos_memory.interfaces import cli

from .conftest import index_records, memory_dir, rec, run_cli, run_sub


def topical(n: int) -> list[dict]:
    topics = ["webhooks retry", "jwt rotation", "pnpm lockfile", "invoice rounding", "feature flags"]
    return [rec(f"{topics[i % 5]} note {i}", f"About {topics[i % 5]}. Detail number {i} of it. Another line {i}.",
                id=f"t{i}") for i in range(n)]


def estimate(root: Path) -> dict | None:
    manifest = json.loads((memory_dir(root) / "manifest.json").read_text())
    return manifest.get("side_weight")


@pytest.fixture
def background_on(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(cli.SETTLE_INLINE)
    yield
    for proc in background.running():  # never left running
        proc.wait(timeout=60)


def test_a_one_shot_write_leaves_the_estimate_to_a_background_settle(project, background_on, monkeypatch):
    started: list[tuple[str, Path]] = []
    monkeypatch.setattr(background, "start", lambda verb, root, extra=(): started.append((verb, root, *extra)) or True)
    assert index_records(project, topical(40)).code == 0  # 0 -> 40 records with vectors: an estimate is due
    assert estimate(project) is None and started == [("memory-settle", project.resolve())]
    settled = run_cli(["memory-settle", "--root", str(project)])
    assert settled.code == 0 and settled.json["committed"] and not settled.json["busy"]
    made = estimate(project)
    assert made is not None and settled.json["side_weight"]["estimate"] == made
    again = run_cli(["memory-settle", "--root", str(project)])  # nothing due, no segments: nothing committed
    assert again.code == 0 and not again.json["committed"] and estimate(project) == made
    assert run_cli(["memory-add", "--root", str(project), "--type", "learning", "--title", "one more",
                    "--body", "not 25 % more"]).code == 0
    assert started == [("memory-settle", project.resolve())]  # not due again: nothing started


def test_the_background_settle_really_runs_and_commits_it(project, background_on):
    records = "\n".join(json.dumps(r) for r in topical(40))
    assert run_sub(["memory-index", "--root", str(project), "--records-file", "-"], stdin=records).code == 0
    deadline = time.monotonic() + 60
    while (estimate(project) is None or background.busy("settle", project.resolve())) \
            and time.monotonic() < deadline:  # (and the worker, the write's child, is gone)
        time.sleep(0.2)
    assert estimate(project) is not None  # made by the detached memory-settle the write started
    assert not background.busy("settle", project.resolve())


def test_an_import_and_a_user_memory_write_leave_it_too_and_a_running_settle_is_not_doubled(
        project, background_on, monkeypatch, tmp_path):
    started: list[tuple] = []
    monkeypatch.setattr(background, "start", lambda verb, root, extra=(): started.append((verb, root, *extra)) or True)
    source = tmp_path / "other.jsonl"
    source.write_text("\n".join(json.dumps({"type": "learning", **r}) for r in topical(40)) + "\n")
    assert run_cli(["memory-import", "--root", str(project), str(source)]).code == 0
    assert estimate(project) is None and started == [("memory-settle", project.resolve())]
    records = "\n".join(json.dumps(r) for r in topical(40))
    assert run_cli(["memory-index", "--root", str(project), "--scope", "user", "--records-file", "-"],
                   stdin=records).code == 0
    assert started[1:] == [("memory-settle", project.resolve(), "--scope", "user")]
    settled = run_cli(["memory-settle", "--root", str(project), "--scope", "user"])
    assert settled.code == 0 and settled.json["committed"] and settled.json["side_weight"]["estimate"] is not None
    with background.only_worker("settle", project.resolve()):  # one runs: a write starts none
        more = "\n".join(json.dumps(r) for r in topical(80)[40:])
        assert run_cli(["memory-index", "--root", str(project), "--records-file", "-"], stdin=more).code == 0
    assert len(started) == 2


def test_a_settle_waits_for_a_writer_instead_of_dropping_its_estimate(project, monkeypatch):
    """A background worker is waited for by nobody: it takes the write lock when it is free."""
    import threading

    from nubos_memory import Memory

    monkeypatch.setattr(background, "start", lambda verb, root, extra=(): True)
    monkeypatch.delenv(cli.SETTLE_INLINE)
    assert index_records(project, topical(40)).code == 0
    assert estimate(project) is None
    holder = Memory.open(project)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with holder.store.lock("a writer"):
            held.set()
            release.wait(10)

    thread = threading.Thread(target=hold)
    thread.start()
    held.wait(10)
    threading.Timer(0.5, release.set).start()
    settled = Memory.open(project).settle()  # blocks until the writer is done, then commits
    thread.join(10)
    assert settled["committed"] and estimate(project) is not None


def test_the_inline_setting_and_the_library_make_it_on_the_write(project, tmp_path):
    assert index_records(project, topical(40)).code == 0  # the suite's setting: inline
    assert estimate(project) is not None
    from nubos_memory import Memory

    other = tmp_path / "lib"
    other.mkdir()
    assert run_cli(["memory-init", "--root", str(other)]).code == 0
    Memory.open(other, user=False).index(topical(40))  # a library caller: no worker, the write makes it
    assert estimate(other) is not None


def test_one_settle_runs_per_project_at_a_time(project):
    assert index_records(project, topical(30)).code == 0
    with background.only_worker("settle", project.resolve()) as alone:
        assert alone and background.busy("settle", project.resolve())
        busy = run_cli(["memory-settle", "--root", str(project)])
        assert busy.code == 0 and busy.json["busy"] and not busy.json["committed"]
    assert not background.busy("settle", project.resolve())

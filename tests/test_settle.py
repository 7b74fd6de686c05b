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
    monkeypatch.setattr(background, "start", lambda verb, root: started.append((verb, root)) or True)
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
    while estimate(project) is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert estimate(project) is not None  # made by the detached memory-settle the write started


def test_the_inline_setting_and_the_library_make_it_on_the_write(project):
    assert index_records(project, topical(40)).code == 0  # the suite's setting: inline
    assert estimate(project) is not None


def test_one_settle_runs_per_project_at_a_time(project):
    assert index_records(project, topical(30)).code == 0
    with background.only_worker("settle", project.resolve()) as alone:
        assert alone and background.busy("settle", project.resolve())
        busy = run_cli(["memory-settle", "--root", str(project)])
        assert busy.code == 0 and busy.json["busy"] and not busy.json["committed"]
    assert not background.busy("settle", project.resolve())

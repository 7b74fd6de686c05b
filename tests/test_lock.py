"""The write lock: a dead holder's lock is reclaimed, a live one times out (acceptance 22)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from .conftest import REPO, index_records, rec, run_cli, write_config

pytestmark = pytest.mark.reliability

HOLD = """
import sys, time
from nubos_memory.store.lock import WriteLock
from pathlib import Path
lock = WriteLock(Path(sys.argv[1]), timeout=5)
with lock.hold("test-holder"):
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def _holder(folder, seconds):
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(folder), str(seconds)], stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_live_lock_times_out_naming_the_holder(project):
    write_config(project, lock_timeout=0.3)
    folder = project / ".nubos-pilot/memory"
    proc = _holder(folder, 30)
    try:
        r = index_records(project, [rec("blocked", id="b1")])
        assert r.code == 6 and r.error["code"] == "lock-timeout"
        holder = r.error["details"]["holder"]
        assert holder["pid"] == proc.pid and holder["verb"] == "test-holder" and holder["alive"] is True
        assert not (folder / "records.jsonl").exists()
    finally:
        proc.kill()
        proc.wait()


def test_lock_of_killed_process_is_reclaimed(project):
    folder = project / ".nubos-pilot/memory"
    proc = _holder(folder, 30)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    start = time.monotonic()
    r = index_records(project, [rec("after the crash", id="a1")])
    assert r.code == 0 and r.json["added"] == 1
    assert time.monotonic() - start < 2
    assert run_cli(["memory-stats", "--root", str(project)]).json["count"] == 1

"""memory-http under load: clients sending mixed requests over loopback for a while.

A scratch memory on the hash embedder (no model: the server's own cost is what is measured), seeded
with --records records; ``np-tools memory-http`` in a subprocess on a free loopback port; --clients
threads, each on its own keep-alive connection, sending a mix of /v1/query (60 %), /v1/add (15 %),
/v1/get (10 %), /v1/context (10 %) and GET /v1/stats (5 %) for --duration seconds.  Counts every
request and every error (any status but 200), then stops the server and checks that every write it
acknowledged is in the log (no lost write).  Prints the result as JSON and writes it to
bench/results/http-<date>.json; exits 1 when any request failed or any acknowledged write was lost.
Run: .venv/bin/python bench/bench_http.py [--duration 60] [--clients 8] [--records 2000]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import date
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from benchsynth import WORDS, project  # noqa: E402

from nubos_memory.api.memory import Memory  # noqa: E402
from nubos_memory.limits import MAX_GET  # noqa: E402

MIX = (("query", 60), ("add", 15), ("get", 10), ("context", 10), ("stats", 5))


def sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


class Client:
    """One client: a keep-alive connection, its latencies by operation, its errors and acknowledged writes."""

    def __init__(self, port: int, seed: int, known: list[str]):
        self.port, self.rng, self.known = port, random.Random(seed), known
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        self.latencies: dict[str, list[float]] = {name: [] for name, _ in MIX}
        self.errors: list[dict[str, Any]] = []
        self.written: list[str] = []

    def request(self, method: str, path: str, body: dict[str, Any] | None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if data is not None else {}
        try:
            self.conn.request(method, path, body=data, headers=headers)
            resp = self.conn.getresponse()
            payload = resp.read()
        except (OSError, http.client.HTTPException) as exc:
            self.conn.close()
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
            return 0, {"exception": repr(exc)}
        return resp.status, json.loads(payload) if payload else None

    def one(self) -> None:
        op = self.rng.choices([name for name, _ in MIX], weights=[w for _, w in MIX])[0]
        method, path, body = "POST", f"/v1/{op}", None
        if op == "query":
            body = {"text": sentence(self.rng, 4), "k": 8}
        elif op == "context":
            body = {"text": sentence(self.rng, 6), "max_tokens": 1500}
        elif op == "add":
            body = {"type": "learning", "title": sentence(self.rng, 6), "body": sentence(self.rng, 30),
                    "tags": [self.rng.choice(WORDS)]}
        elif op == "get":
            body = {"ids": [self.rng.choice(self.known)]}
        else:
            method = "GET"
        t0 = time.perf_counter()
        status, doc = self.request(method, path, body)
        self.latencies[op].append((time.perf_counter() - t0) * 1000)
        if status != 200:
            self.errors.append({"op": op, "status": status, "doc": doc})
        elif op == "add":
            self.written.append(doc["id"])

    def run(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            self.one()
        self.conn.close()


def percentile(xs: list[float], q: float) -> float:
    ordered = sorted(xs)
    return round(ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))], 2) if ordered else 0.0


def seed_memory(root: Path, n: int) -> list[str]:
    mem = project(root)
    rng = random.Random(7)
    records = [{"type": "learning", "title": sentence(rng, 6), "body": sentence(rng, 30), "tags": [rng.choice(WORDS)]}
               for _ in range(n)]
    return list(mem.index(records)["ids"])


def start(root: Path) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen([sys.executable, "-m", "nubos_memory", "memory-http", "--root", str(root), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.stderr is not None
    started = json.loads(proc.stderr.readline())
    return proc, int(started["serving"].rsplit(":", 1)[1])


def lost_writes(root: Path, written: list[str]) -> list[str]:
    mem = Memory.open(root)
    lost: list[str] = []
    for i in range(0, len(written), MAX_GET):
        got = mem.get(written[i:i + MAX_GET], track=False)
        lost += got["missing"] + [r["id"] for r in got["records"] if not r["live"]]
    return lost


def main() -> int:
    """Run the benchmark; the exit status is 1 when a request failed or an acknowledged write was lost."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--records", type=int, default=2000)
    ap.add_argument("--machine", default="", help="a description of the machine, kept in the result")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="nubos-http-bench-"))
    try:
        known = seed_memory(root, args.records)
        proc, port = start(root)
        clients = [Client(port, n, known) for n in range(args.clients)]
        deadline = time.monotonic() + args.duration
        threads = [threading.Thread(target=c.run, args=(deadline,)) for c in clients]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.monotonic() - t0
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        written = [i for c in clients for i in c.written]
        lost = lost_writes(root, written)
        every = [ms for c in clients for xs in c.latencies.values() for ms in xs]
        by_op = {name: [ms for c in clients for ms in c.latencies[name]] for name, _ in MIX}
        errors = [e for c in clients for e in c.errors]
        result = {
            "date": date.today().isoformat(), "machine": args.machine, "clients": args.clients,
            "duration_s": round(elapsed, 1), "seed_records": args.records, "embedder": "hash-256",
            "requests": len(every), "errors": len(errors), "error_samples": errors[:5],
            "requests_per_s": round(len(every) / elapsed, 1),
            "latency_ms": {"p50": percentile(every, 0.5), "p95": percentile(every, 0.95),
                           "mean": round(statistics.fmean(every), 2) if every else 0.0},
            "by_operation": {name: {"requests": len(xs), "p50": percentile(xs, 0.5), "p95": percentile(xs, 0.95)}
                             for name, xs in by_op.items()},
            "writes_acknowledged": len(written), "writes_lost": len(lost),
            "server": json.loads(out) if out.strip() else None,
        }
        print(json.dumps(result, indent=2))
        target = REPO / "bench" / "results" / f"http-{result['date']}.json"
        target.write_text(json.dumps(result, indent=2) + "\n")
        if errors or lost:
            print(f"FAILED: {len(errors)} request error(s), {len(lost)} lost write(s)", file=sys.stderr)
            return 1
        return 0
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())

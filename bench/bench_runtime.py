"""Cold starts, runtimes and threads under load (issue 11), every number beside its baseline in one run.

* the first-ever call of a fresh user (the ONNX export and its parity check included);
* a 10k-record memory of real text: cold one-shot ``np-tools memory-query`` (hybrid) against a cold
  ``--mode lexical`` query, interleaved; cold ``np-tools memory-add``;
* warm hybrid queries in-process against the bare sentence-transformers ``encode`` of the same query,
  interleaved;
* index throughput of ``memory-index`` against sentence-transformers ``encode`` of the same pieces at
  the same batch size (32);
* warm queries with a competing CPU-bound process on the same cores: through ``memory-serve``, and
  in-process for each runtime and thread count (the thread policy of adr/0012).

    .venv/bin/python bench/bench_runtime.py [--records 10000] [--queries 100] [--datasets FOLDER]

SciFact from --datasets, else $NUBOS_MEMORY_DATASETS, else ../shared/datasets beside the repository.

Writes bench/results/runtime-<date>.json and prints the tables docs/benchmarks.md records.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import benchdata  # noqa: E402
from bench_scale import as_record, cache_dir, real_texts  # noqa: E402

from nubos_memory import Memory  # noqa: E402
from nubos_memory.embed.base import Embedder  # noqa: E402
from nubos_memory.embed.model import ModelEmbedder, Runtime, pieces_for  # noqa: E402
from nubos_memory.embed.torch_runtime import TorchRuntime  # noqa: E402
from nubos_memory.evaluation import CachedEmbedder  # noqa: E402
from nubos_memory.limits import DEFAULT_MODEL  # noqa: E402
from nubos_memory.records import embed_text  # noqa: E402

ENV = {**os.environ, "PYTHONPATH": str(REPO), "NUBOS_MEMORY_NO_SERVER": "1"}


def p50(values: list[float]) -> float:
    return float(np.percentile(values, 50)) if values else float("nan")


def cli(root: Path, *args: str, env: dict[str, str] | None = None) -> tuple[float, Any]:
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "nubos_memory", *args, "--root", str(root)], capture_output=True,
                          text=True, env=env or ENV)
    took = (time.perf_counter() - t) * 1000
    assert proc.returncode == 0, proc.stderr[-2000:]
    return took, json.loads(proc.stdout)


def make_memory(root: Path, records: list[dict[str, str]], embedder: Embedder) -> Memory:
    (root / ".nubos-pilot").mkdir(parents=True)
    (root / ".nubos-pilot/config.json").write_text(json.dumps({"memory": {"enabled": True}}))
    mem = Memory.open(root, embedder=embedder)
    for i in range(0, len(records), 2000):
        mem.index([{"type": "research", **r} for r in records[i:i + 2000]], force=True)
    return mem


class Burner:
    """A competing CPU-bound process (one busy loop) on the same cores."""

    def __enter__(self) -> Burner:
        self.proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        time.sleep(1.0)
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()


def first_ever_call(results: dict[str, Any]) -> None:
    """A fresh user cache: the first call exports the model to ONNX and checks parity."""
    with tempfile.TemporaryDirectory() as d:
        root = Path(d) / "p"
        root.mkdir()
        env = {**ENV, "NUBOS_MEMORY_CACHE": str(Path(d) / "cache")}
        subprocess.run([sys.executable, "-m", "nubos_memory", "memory-init", "--root", str(root)], env=env,
                       capture_output=True, check=True)
        first, _ = cli(root, "memory-add", "--type", "learning", "--title", "first note", "--body", "x", env=env)
        second, _ = cli(root, "memory-add", "--type", "learning", "--title", "second note", "--body", "y", env=env)
        results["first_ever_call"] = {"first_memory_add_ms": first, "next_memory_add_ms": second}
        print("# first ever call: " + json.dumps(results["first_ever_call"]), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=10_000)
    ap.add_argument("--queries", type=int, default=100)
    ap.add_argument("--cold", type=int, default=9, help="fresh processes per cold measurement")
    benchdata.add_flag(ap)
    args = ap.parse_args()
    data = benchdata.scifact(args.datasets)
    queries = [json.loads(line)["text"] for line in (data / "queries.jsonl").open()][: args.queries]
    results: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.node()} {platform.machine()} "
                     f"{os.cpu_count()} cpu, python {platform.python_version()}", "loadavg_start": os.getloadavg()}
    first_ever_call(results)

    onnx = ModelEmbedder(DEFAULT_MODEL)  # the default: ONNX on the CPU
    onnx.embed(["warm up"])
    results["runtime"] = onnx.runtime_info()
    reference = TorchRuntime(str(onnx.folder()))  # bare sentence-transformers, as users would call it
    reference.load()
    st = reference.model

    # -- index throughput: the product (ONNX) vs sentence-transformers encode of the same pieces ------
    base = real_texts(max(args.records, 1000), data)
    results["index_throughput"] = {}
    shapes = {"short": [r for r in base if r["title"].endswith(")")][:384] or base[:384], "long": base[:192]}
    st.encode([r["body"] for r in base[-64:]], batch_size=32)
    for shape, recs in shapes.items():
        sample = [{"type": "research", "title": r["title"] + " (throughput)", "body": r["body"]} for r in recs]
        pieces, _ = pieces_for(onnx.runtime(), [embed_text(as_record(r)) for r in sample])
        raw, prod = [], []
        for _ in range(2):  # the faster of two passes each: a noisy moment penalises neither side alone
            t = time.perf_counter()
            st.encode(pieces, batch_size=32, normalize_embeddings=True, show_progress_bar=False)
            raw.append(time.perf_counter() - t)
            with tempfile.TemporaryDirectory() as d:
                mem = make_memory(Path(d), [], onnx)
                t = time.perf_counter()
                mem.index(sample, force=True)
                prod.append(time.perf_counter() - t)
        row = {"records": len(sample), "pieces": len(pieces), "memory_index_per_s": len(sample) / min(prod),
               "st_encode_same_pieces_per_s": len(sample) / min(raw), "ratio": min(raw) / min(prod)}
        results["index_throughput"][shape] = row
        print(f"# index throughput ({shape}): " + json.dumps(row), flush=True)

    # -- a 10k memory of real text (vectors cached per fingerprint: any runtime's are the same) ---------
    records = base[: args.records]
    cached = CachedEmbedder(onnx, cache_dir())
    root = Path(tempfile.mkdtemp(prefix="nubos-runtime-bench-"))
    t = time.perf_counter()
    mem = make_memory(root, records, cached)
    cached.save()
    results["memory"] = {"records": len(records), "build_s": time.perf_counter() - t}
    print(f"# memory of {len(records)} records built in {results['memory']['build_s']:.0f}s", flush=True)

    # -- cold one-shot calls ----------------------------------------------------------------------------
    hybrid, lexical = [], []
    for i in range(args.cold):
        hybrid.append(cli(root, "memory-query", queries[i])[0])
        lexical.append(cli(root, "memory-query", "--mode", "lexical", queries[i])[0])
    adds = [cli(root, "memory-add", "--type", "learning", "--title", f"cold add {i}", "--body", f"learning {i}")[0]
            for i in range(args.cold)]
    python = statistics.median([cli_bare() for _ in range(5)])
    results["cold"] = {"hybrid_query_ms_p50": p50(hybrid), "lexical_query_ms_p50": p50(lexical),
                       "ratio": p50(hybrid) / p50(lexical), "memory_add_ms_p50": p50(adds),
                       "python_startup_ms": python, "hybrid_all_ms": hybrid, "add_all_ms": adds}
    print("# cold: " + json.dumps({k: v for k, v in results["cold"].items() if not k.endswith("all_ms")}), flush=True)

    # -- warm in-process: hybrid query vs bare encode of the same query ------------------------------------
    mem = Memory.open(root, embedder=onnx)
    mem.query("warm up")
    lat, raw = [], []
    for q in queries:
        t = time.perf_counter()
        mem.query(q, k=10, track=False)
        lat.append((time.perf_counter() - t) * 1000)
        t = time.perf_counter()
        st.encode([q], normalize_embeddings=True, show_progress_bar=False)
        raw.append((time.perf_counter() - t) * 1000)
    results["warm"] = {"hybrid_ms_p50": p50(lat), "st_encode_ms_p50": p50(raw), "ratio": p50(lat) / p50(raw)}
    print("# warm: " + json.dumps(results["warm"]), flush=True)

    # -- under load -----------------------------------------------------------------------------------------
    results["load"] = under_load(root, queries, onnx, reference)
    results["loadavg_end"] = os.getloadavg()
    out = REPO / "bench" / "results" / f"runtime-{results['date']}.json"
    out.write_text(json.dumps(results, indent=1))
    shutil.rmtree(root, ignore_errors=True)
    print_tables(results)
    print(f"\nraw results: {out.relative_to(REPO)}")


def cli_bare() -> float:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    return (time.perf_counter() - t) * 1000


def under_load(root: Path, queries: list[str], onnx: ModelEmbedder, reference: TorchRuntime) -> dict[str, Any]:
    """Warm queries idle and with one competing busy process: through memory-serve (CLI end to end),
    and in-process per runtime and thread count."""
    out: dict[str, Any] = {}
    server = subprocess.Popen([sys.executable, "-m", "nubos_memory", "memory-serve", "--root", str(root)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**ENV, "NUBOS_MEMORY_NO_SERVER": ""})
    try:
        assert server.stderr is not None and '"serving"' in server.stderr.readline()
        env = {**ENV, "NUBOS_MEMORY_NO_SERVER": ""}
        for label, ctx in (("idle", None), ("loaded", Burner)):
            def serve_p50() -> float:
                return p50([cli(root, "memory-query", q, env=env)[0] for q in queries[:30]])
            if ctx is None:
                out[f"serve_{label}_ms_p50"] = serve_p50()
            else:
                with ctx():
                    out[f"serve_{label}_ms_p50"] = serve_p50()
        out["serve_ratio"] = out["serve_loaded_ms_p50"] / out["serve_idle_ms_p50"]
    finally:
        server.send_signal(signal.SIGTERM)
        server.communicate(timeout=60)
    from nubos_memory.embed.onnx_runtime import OnnxRuntime

    folder = onnx.folder()
    assert folder is not None, "the packaged model is not on this machine"
    onnx_path = onnx.runtime().onnx_path  # type: ignore[attr-defined]
    variants: dict[str, Runtime] = {
        "onnx 2 threads (policy)": OnnxRuntime(folder, onnx_path, threads=2),
        "onnx 1 thread": OnnxRuntime(folder, onnx_path, threads=1),
        "torch 1 thread (policy for one text)": reference,
        "torch 2 threads": reference,
    }
    rows: dict[str, dict[str, float]] = {}
    for name, runtime in variants.items():
        runtime.load()
        for label, ctx in (("idle", None), ("loaded", Burner)):
            if ctx is None:
                rows.setdefault(name, {})[label] = query_embed_p50(name, runtime, queries)
            else:
                with ctx():
                    rows.setdefault(name, {})[label] = query_embed_p50(name, runtime, queries)
    out["query_embed_ms_p50"] = rows
    return out


def query_embed_p50(name: str, runtime: Runtime, queries: list[str]) -> float:
    """p50 ms of embedding one query, 60 queries: a torch variant through sentence-transformers' encode
    at its thread count, an ONNX one through the runtime."""
    if name.startswith("torch"):
        import torch

        torch.set_num_threads(2 if "2 threads" in name else 1)
        model = runtime.model  # type: ignore[attr-defined]
        ts = []
        for q in queries[:60]:
            t = time.perf_counter()
            model.encode([q], normalize_embeddings=True, show_progress_bar=False)
            ts.append((time.perf_counter() - t) * 1000)
        return p50(ts)
    ts = []
    for q in queries[:60]:
        t = time.perf_counter()
        runtime.encode([q])
        ts.append((time.perf_counter() - t) * 1000)
    return p50(ts)


def print_tables(r: dict[str, Any]) -> None:
    c, w, load = r["cold"], r["warm"], r["load"]
    print(f"\nMachine: {r['machine']}; runtime {r['runtime']}; load average at start {r['loadavg_start'][0]:.2f}\n")
    print("| what | measured | baseline in the same run | ratio |")
    print("| --- | --- | --- | --- |")
    print(f"| cold `memory-query` (hybrid), {r['memory']['records']} records, p50 | {c['hybrid_query_ms_p50']:.0f} ms "
          f"| cold `--mode lexical` {c['lexical_query_ms_p50']:.0f} ms | {c['ratio']:.2f} |")
    print(f"| cold `memory-add`, p50 | {c['memory_add_ms_p50']:.0f} ms | `python -c pass` {c['python_startup_ms']:.0f} ms | |")
    print(f"| warm hybrid query in-process, p50 | {w['hybrid_ms_p50']:.2f} ms | bare sentence-transformers encode "
          f"{w['st_encode_ms_p50']:.2f} ms | {w['ratio']:.2f} |")
    for shape, t in r["index_throughput"].items():
        print(f"| `memory-index`, {t['records']} {shape} records ({t['pieces']} pieces) | {t['memory_index_per_s']:.1f}/s "
              f"| ST encode of the same pieces, batch 32: {t['st_encode_same_pieces_per_s']:.1f}/s | {t['ratio']:.2f} |")
    print(f"| CLI query through memory-serve, p50, one busy process beside it | {load['serve_loaded_ms_p50']:.0f} ms "
          f"| idle {load['serve_idle_ms_p50']:.0f} ms | {load['serve_ratio']:.2f} |")
    fe = r["first_ever_call"]
    print(f"| first-ever call (fresh user cache: ONNX export + parity) | {fe['first_memory_add_ms'] / 1000:.1f} s "
          f"| the next call {fe['next_memory_add_ms']:.0f} ms | |")
    print("\nQuery embedding p50 (ms), idle and with one busy process:\n")
    print("| runtime, threads | idle | loaded |")
    print("| --- | --- | --- |")
    for name, v in load["query_embed_ms_p50"].items():
        print(f"| {name} | {v['idle']:.2f} | {v['loaded']:.2f} |")


if __name__ == "__main__":
    main()

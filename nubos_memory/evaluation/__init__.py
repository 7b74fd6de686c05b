"""``memory-eval``: retrieval quality and latency of the product on BEIR-format datasets.

Above ``api`` (it drives a scratch ``Memory``), below ``interfaces``:

* ``beir``: loading a BEIR folder (corpus, queries, qrels of a split);
* ``metrics``: nDCG@k, recall@k, MRR@k as trec_eval computes them, and percentiles;
* ``embedcache``: an embedding cache around the real embedder, kept between runs;
* ``runner``: indexing a corpus into a scratch memory, scoring every judged query, the report.
"""

from __future__ import annotations

from .beir import load_beir, record_id
from .embedcache import CachedEmbedder, default_cache_dir
from .metrics import mrr_at_k, ndcg_at_k, percentile, recall_at_k
from .runner import MODES, evaluate, evaluate_one, markdown_report

__all__ = ["MODES", "CachedEmbedder", "default_cache_dir", "evaluate", "evaluate_one", "load_beir",
           "markdown_report", "mrr_at_k", "ndcg_at_k", "percentile", "recall_at_k", "record_id"]

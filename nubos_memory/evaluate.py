"""Temporary alias (research scripts running during the move to sub-packages)."""
from .api.evaluate import *  # noqa: F401,F403
from .api.evaluate import default_cache_dir, load_beir, ndcg_at_k, recall_at_k, record_id  # noqa: F401

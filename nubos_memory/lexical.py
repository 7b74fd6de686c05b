"""Temporary alias (research scripts running during the move to sub-packages)."""
from .index.lexical import *  # noqa: F401,F403
from .index.lexical import PostingsBM25  # noqa: F401

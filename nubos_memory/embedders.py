"""Temporary alias (research scripts running during the move to sub-packages)."""
from .embed.model import ModelEmbedder as SentenceTransformerEmbedder  # noqa: F401

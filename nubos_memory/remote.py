"""Talking to a server the user named: the embedding gateway (``embed/gateway.py``) and the generator
(``generate/chat.py``) share this module, so both follow one set of rules.

* :class:`JsonClient`: one JSON ``POST`` with the standard library (no client package), a timeout per
  request, one retry of a refused connection, a reset or a 5xx/429 within the call's budget (a timeout
  is not retried: a server that stopped answering costs one timeout), an answer size cap, and never a
  redirect (it would carry the key elsewhere).  The key goes in a bearer header and is scrubbed from
  every message (:meth:`JsonClient.scrub`); surrounding whitespace (a trailing newline read from a
  file) is stripped, and a key holding any other character a header cannot carry is refused
  (``api-key-invalid``, :func:`clean_key`) before anything is sent, without quoting it.
* :class:`Breaker`: the circuit breaker, shared by every process of this user through one small file.
  States: *closed* (calls go through; consecutive failures are counted), *open* (after ``failures``
  consecutive failed calls, or one failed start-up probe: no call is made until ``reopens_at``, so a
  server that stopped answering costs a one-shot process nothing), *half-open* (the cool-down has
  passed: the next call tries; success closes the breaker, failure opens it again for another
  cool-down).  The state lives in ``<user cache>/<kind>/<digest of base URL and model>.json``
  (``kind``: ``gateway`` or ``generator``) so that one-shot processes (each CLI call is one) share what
  the last one learned; without a cache folder it is kept for this process only.  The file holds no
  key, only counters and times.

Where a URL and a key's variable may come from (a loopback URL from the project's config, any other
only from the user) is ``config.user_url`` and ``config.user_key_env``.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from . import codes
from .errors import ConfigError
from .fsio import JSONDecodeError, atomic_write_bytes, dumps, ensure_dir, loads, read_regular

RETRY_PAUSE_S = 0.2
MAX_MESSAGE = 300  # characters of a server's error body quoted in a message
MAX_ANSWER_BYTES = 256 << 20  # an answer larger than this is refused, never held whole


class Failed(Exception):
    """One request that failed; ``retry``: worth one more try within the call's budget."""

    def __init__(self, why: str, *, retry: bool):
        super().__init__(why)
        self.why = why
        self.retry = retry


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A server that answers with a redirect is refused: following it would send the key elsewhere."""

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> None:
        raise urllib.error.HTTPError(req.full_url, code, "a redirect is not followed", headers, fp)


_OPENER = urllib.request.build_opener(_NoRedirect)


def clean_key(key: str | None, env: str | None) -> str | None:
    """The key as sent: without surrounding whitespace, None when nothing is left.  A key with a control,
    non-ASCII or inner blank character is refused (``api-key-invalid``): ``http.client`` would refuse the
    header with a message that quotes it.  The message names the variable ``env``, never the key."""
    if key is None:
        return None
    key = key.strip()
    if not key:
        return None
    if not all("\x21" <= c <= "\x7e" for c in key):
        where = f" in ${env}" if env else ""
        raise ConfigError(f"the key{where} holds a control, non-ASCII or blank character, which an HTTP header "
                          "cannot carry; it was not sent (set the variable to the key alone)",
                          code=codes.API_KEY_INVALID, details={"env": env})
    return key


class JsonClient:
    """POSTs JSON to ``{base_url}/{path}`` (see module docstring); ``requests`` counts what was sent."""

    def __init__(self, base_url: str, *, key: str | None, timeout_s: float, budget_s: float,
                 key_env: str | None = None):
        self.base_url = base_url.rstrip("/")
        self._key = clean_key(key, key_env)
        # every form of the key a message might carry (as given, as sent, as Python quotes it), longest first
        forms = {f for k in (key, self._key) if k for f in (k, repr(k)[1:-1], k.strip()) if f.strip()}
        self._forms = sorted(forms, key=len, reverse=True)
        self.timeout_s = min(timeout_s, budget_s)
        self.budget_s = budget_s  # one call, its retry included, never takes longer
        self.requests = 0

    @property
    def has_key(self) -> bool:
        return self._key is not None

    def scrub(self, text: str) -> str:
        """``text`` without the key in any of its forms (a server may echo what it was sent)."""
        for form in self._forms:
            text = text.replace(form, "***")
        return text

    def post(self, path: str, payload: dict[str, Any]) -> Any:
        """The parsed JSON answer; :class:`Failed` when the request (and its one retry) failed."""
        deadline = time.monotonic() + self.budget_s
        body = json.dumps(payload).encode("utf-8")
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        for attempt in (1, 2):
            left = deadline - time.monotonic()
            try:
                return self._request(f"{self.base_url}/{path}", body, headers, min(self.timeout_s, left))
            except Failed as exc:
                if attempt == 2 or not exc.retry or left - RETRY_PAUSE_S < self.timeout_s:
                    raise
            time.sleep(RETRY_PAUSE_S)
        raise AssertionError("unreachable")

    def _request(self, url: str, body: bytes, headers: dict[str, str], timeout: float) -> Any:
        self.requests += 1
        req = urllib.request.Request(url, data=body, headers=headers, method="POST")
        try:
            with _OPENER.open(req, timeout=timeout) as resp:
                raw = resp.read(MAX_ANSWER_BYTES + 1)
            if len(raw) > MAX_ANSWER_BYTES:
                raise Failed(f"the answer is larger than {MAX_ANSWER_BYTES >> 20} MiB", retry=False)
        except urllib.error.HTTPError as exc:
            detail = exc.read(4096).decode("utf-8", "replace")[:MAX_MESSAGE]
            raise Failed(f"HTTP {exc.code}: {detail}", retry=exc.code >= 500 or exc.code == 429) from None
        except TimeoutError:
            raise Failed(f"no answer within {timeout:.1f} s", retry=False) from None
        except urllib.error.URLError as exc:
            timed_out = isinstance(exc.reason, TimeoutError)
            why = f"no answer within {timeout:.1f} s" if timed_out else f"cannot connect ({exc.reason})"
            raise Failed(why, retry=not timed_out) from None
        except OSError as exc:  # a reset connection
            raise Failed(f"the connection failed ({exc})", retry=True) from None
        except (ValueError, http.client.HTTPException) as exc:  # a malformed request or answer line: its message
            # may quote a header (the key), so only the kind is said
            raise Failed(f"the request or its answer is malformed ({type(exc).__name__})", retry=True) from None
        try:
            return json.loads(raw)
        except ValueError:
            raise Failed("the answer is not JSON", retry=False) from None


def when(at: Any) -> str:
    """A breaker time (epoch seconds) as ISO-8601, for messages."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at)) if isinstance(at, (int, float)) else "?"


STATE_VERSION = 1
COUNTERS = ("failures_total", "opens", "half_open_probes", "closes")


def _fresh() -> dict[str, Any]:
    return {"version": STATE_VERSION, "failures": 0, "reopens_at": None, "opened_at": None,
            **dict.fromkeys(COUNTERS, 0)}


class Breaker:
    """One server's breaker (see module docstring)."""

    def __init__(self, key: str, *, failures: int, cooldown_s: float, folder: Path | None, kind: str = "gateway"):
        self.failures = failures
        self.cooldown_s = cooldown_s
        digest = hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]
        self.path = folder / kind / f"{digest}.json" if folder is not None else None
        self._mem = _fresh()  # the state when there is no file to keep it in

    # -- the state -----------------------------------------------------------------------------
    def load(self) -> dict[str, Any]:
        if self.path is None:
            return dict(self._mem)
        try:
            doc = loads(read_regular(self.path))
        except (OSError, JSONDecodeError):
            return _fresh()
        if not isinstance(doc, dict) or doc.get("version") != STATE_VERSION:
            return _fresh()
        return {**_fresh(), **doc}

    def _save(self, state: dict[str, Any]) -> None:
        self._mem = dict(state)
        if self.path is None:
            return
        try:
            ensure_dir(self.path.parent)
            atomic_write_bytes(self.path, dumps(state))
        except OSError:
            pass  # a read-only cache: the breaker still works within this process

    @staticmethod
    def state_of(state: dict[str, Any], now: float | None = None) -> str:
        reopens = state.get("reopens_at")
        if not isinstance(reopens, (int, float)):
            return "closed"
        return "open" if (now if now is not None else time.time()) < reopens else "half-open"

    def describe(self) -> dict[str, Any]:
        """``memory-stats``: the state, consecutive failures, when it may try again, and the counters."""
        state = self.load()
        return {"state": self.state_of(state), "failures": state["failures"], "threshold": self.failures,
                "cooldown_s": self.cooldown_s, "opened_at": state["opened_at"], "reopens_at": state["reopens_at"],
                **{k: state[k] for k in COUNTERS}, "file": str(self.path) if self.path else None}

    # -- a call ------------------------------------------------------------------------------------
    def before(self) -> tuple[str, dict[str, Any]]:
        """The state a call starts in (``open``: the caller must not call), counting half-open tries."""
        state = self.load()
        now_state = self.state_of(state)
        if now_state == "half-open":
            state["half_open_probes"] += 1
            self._save(state)
        return now_state, state

    def succeeded(self) -> None:
        state = self.load()
        if state["failures"] or state["reopens_at"] is not None:
            if state["reopens_at"] is not None:
                state["closes"] += 1
            state.update(failures=0, reopens_at=None, opened_at=None)
            self._save(state)

    def failed(self, *, probe: bool, half_open: bool) -> bool:
        """Count a failed call; open (again) when it is the ``failures``-th in a row, a failed start-up
        ``probe`` or a half-open try.  Returns whether the breaker is open now."""
        state = self.load()
        state["failures"] += 1
        state["failures_total"] += 1
        opened = probe or half_open or state["failures"] >= self.failures
        if opened:
            now = time.time()
            state.update(opened_at=now, reopens_at=now + self.cooldown_s)
            state["opens"] += 1
        self._save(state)
        return opened

"""The embedding gateway's circuit breaker, shared by every process of this user through one small file.

States: *closed* (calls go through; consecutive failures are counted), *open* (after ``failures``
consecutive failed calls, or one failed start-up probe: no call is made until ``reopens_at``, so a
gateway that stopped answering costs a one-shot process nothing), *half-open* (the cool-down has
passed: the next call tries; success closes the breaker, failure opens it again for another
cool-down).  The state lives in ``<user cache>/gateway/<digest of base URL and model>.json`` so that
one-shot processes (each CLI call is one) share what the last one learned; without a cache folder it
is kept for this process only.  The file holds no key, only counters and times.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any

from ..fsio import JSONDecodeError, atomic_write_bytes, dumps, ensure_dir, loads, read_regular

STATE_VERSION = 1
COUNTERS = ("failures_total", "opens", "half_open_probes", "closes")


def _fresh() -> dict[str, Any]:
    return {"version": STATE_VERSION, "failures": 0, "reopens_at": None, "opened_at": None,
            **dict.fromkeys(COUNTERS, 0)}


class Breaker:
    """One gateway's breaker (see module docstring)."""

    def __init__(self, key: str, *, failures: int, cooldown_s: float, folder: Path | None):
        self.failures = failures
        self.cooldown_s = cooldown_s
        digest = hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]
        self.path = folder / "gateway" / f"{digest}.json" if folder is not None else None
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

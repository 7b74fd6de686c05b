"""Time in the memory: what was live at a given moment (``memory-query --as-of``), and what has expired.

A record is **live at T** when it was created by then (``created_at`` ≤ T; a record without
one has always been there), not retired by then (a forget, prune or redact tombstone whose
``at`` ≤ T; a supersede from the superseding record's ``created_at``: ``log.retired_at``), and not
expired by then (its ``valid_until`` ≤ T).  A retirement the log gives no time for counts from
always, and so does a redaction (its text must not come back through the past).  Expiry is
read-time only: nothing is written to the log, and before its ``valid_until`` the record is live.

The times are kept per position as epochs in numpy arrays (:class:`Timeline`), extended as the log
grows, so one query's "live at T" is three comparisons over arrays.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..log import death_kind, retired_at
from ..records import iso_to_epoch

if TYPE_CHECKING:
    from ..log import LogScan
    from ..types import Record

NEVER = np.inf
ALWAYS = -np.inf


class Timeline:
    """Each position's creation, retirement and expiry as epochs (``ALWAYS``/``NEVER`` where the
    log gives none), for one reading of the log (a new ``generation`` starts it again)."""

    def __init__(self) -> None:
        self._generation = -1
        self._clear()

    def _clear(self) -> None:
        self.created = np.zeros(0, dtype=np.float64)
        self.retired = np.zeros(0, dtype=np.float64)
        self.expires = np.zeros(0, dtype=np.float64)
        self._deaths = 0

    def update(self, scan: LogScan) -> Timeline:
        """Extend the arrays to what ``scan`` holds now."""
        if scan.generation != self._generation:
            self._clear()
            self._generation = scan.generation
        start, n = len(self.created), len(scan.records)
        if start < n:
            new = scan.records[start:]
            created = [iso_to_epoch(r.get("created_at")) for r in new]
            expires = [iso_to_epoch(r.get("valid_until")) for r in new]
            self.created = np.concatenate([self.created, [ALWAYS if t is None else t for t in created]])
            self.expires = np.concatenate([self.expires, [NEVER if t is None else t for t in expires]])
            self.retired = np.concatenate([self.retired, np.full(n - start, NEVER)])
        for pos in scan.deaths[self._deaths:]:
            when = None if death_kind(scan.dead[pos]) == "redact" else iso_to_epoch(retired_at(scan, pos))
            self.retired[pos] = ALWAYS if when is None else when
        self._deaths = len(scan.deaths)
        return self


def live_mask(scan: LogScan, t: float, timeline: Timeline | None = None) -> np.ndarray:
    """By position: whether the record was live at ``t`` (epoch seconds; see the module docstring)."""
    tl = (timeline or Timeline()).update(scan)
    mask: np.ndarray = (tl.created <= t) & (tl.retired > t) & (tl.expires > t)
    return mask


def live_at(scan: LogScan, t: float, timeline: Timeline | None = None) -> np.ndarray:
    """The positions of the records live at ``t``, in log order."""
    return np.flatnonzero(live_mask(scan, t, timeline))


def expiry(rec: Record, now: float) -> dict[str, Any] | None:
    """``{"reason": "expired", "at": valid_until}`` once a record's ``valid_until`` has come, else None."""
    until = rec.get("valid_until")
    when = iso_to_epoch(until)
    return {"reason": "expired", "at": until} if when is not None and when <= now else None


def fate(scan: LogScan, pos: int, now: float) -> dict[str, Any] | None:
    """What retired the record at ``pos`` and when (its reason, ``at``, and ``by`` for a supersede), or
    that it expired; None while it is live."""
    info = scan.dead.get(pos)
    if info is None:
        return expiry(scan.records[pos], now)
    out = {k: info[k] for k in ("reason", "at", "by") if info.get(k) is not None}
    at = retired_at(scan, pos)
    if at is not None:
        out["at"] = at
    return out


def history(scan: LogScan, rid: str, now: float) -> list[dict[str, Any]]:
    """Every version of ``rid`` in log order: each record line with that id (its line, whether it is
    live, the record, and what replaced or retired it, when), then its redactions (their text is gone)."""
    out: list[dict[str, Any]] = []
    for pos, rec in enumerate(scan.records):
        if rec["id"] == rid:
            retired = fate(scan, pos, now)
            out.append({"line": scan.line_of[pos], "live": retired is None, "retired": retired, "record": rec})
    gone = scan.redacted.get(rid)
    if gone is not None:
        out.append({"line": None, "live": False, "record": None, "retired": {
            "reason": "redacted", "at": gone.get("at"), "why": gone.get("reason"), "lines": len(gone["hashes"])}})
    return out

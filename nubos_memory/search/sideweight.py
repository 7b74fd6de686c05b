"""The per-memory side weight of z fusion, from the memory itself (issue 24; adr/0002).

z fusion ranks by ``w·z(b') + (1 − w)·z(c')``.  How strong each side is depends on the memory:
a pooled vector of a long, several-topic record matches none of its topics, and there BM25
should carry more weight.  The weight is estimated without labels, from known-item
pseudo-queries drawn from the records themselves (rule ``pseudo-queries v2``):

* **Drawing** (deterministic for a given log): every record body is cut into sentences and
  lines (``chunking.sentence_spans``); the (record id, sentence index) pairs are ordered by
  ``sha256(id + "\\0" + index)``; the first ``N_QUERIES`` pairs whose sentence and whose rest of
  the record each have at least ``MIN_TERMS`` distinct terms are kept.  Records of one sentence
  are skipped.
* **Task** (leave-one-out): the sentence is the query; the one right answer is its record with
  the sentence removed.  The target's BM25 is taken from the reduced text under the memory's
  statistics, its vector from embedding the reduced text; every other record keeps its stored
  BM25 and vector.  Both sides lose the verbatim match.
* **Weight**: each side is z-standardised over the memory (plain signals, no neighbour
  context); the reciprocal rank of the target is taken for each side and for the hybrid at
  ``w`` in 0.1 … 0.9.  A ``w`` is *sure* when its MRR gain over the floor's is at least ``SURE``
  standard errors of the paired per-query differences; ``w`` is the sure one of the best MRR
  (ties: the ``w`` nearest the floor, then the smaller), the floor when none is sure (on a flat
  curve the argmax is noise: adr/0002).
* **Floor**: the configured ``memory.alpha`` when fewer than ``MIN_QUERIES`` pseudo-queries
  qualify (nothing is embedded then) or both sides' MRR are below ``NO_SIGNAL`` (a memory of
  short turns, where the task says nothing about either side).

The estimate is kept in the vector generation's manifest (``side_weight``), made at rebuild and
when the memory has grown by ``REFRESH_GROWTH`` since the last one (``api/vectorsync.py``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..embed.chunking import sentence_spans
from ..records import embed_text, lexical_text
from ..tokenize import tokenize

if TYPE_CHECKING:
    from ..index.lexical import PostingsBM25
    from ..types import Record

RULE = "pseudo-queries v2"
N_QUERIES = 100
MIN_TERMS = 3
MIN_QUERIES = 20
NO_SIGNAL = 0.15
GRID = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
CERTAIN = 99.0  # the gain of a weight that wins by the same on every pseudo-query (no spread)
SURE = 1.0  # a weight moves off the floor only by a gain over it of this many standard errors (adr/0002)
REFRESH_GROWTH = 1.25  # re-estimate when the live records with a vector grew by 25 %
FEW = "few pseudo-queries"
NO_SIGNAL_WHY = "no signal"

Embed = Callable[[list[str]], np.ndarray]


@dataclass(frozen=True)
class Pseudo:
    """One pseudo-query: the sentence ``query`` of record ``row``, and that record without it."""

    row: int
    query: str
    rest: "Record"


def _key(rid: str, index: int) -> str:
    return hashlib.sha256(f"{rid}\0{index}".encode("utf-8", "surrogatepass")).hexdigest()


def draw(records: "Sequence[Record]", n: int = N_QUERIES) -> list[Pseudo]:
    """Up to ``n`` pseudo-queries of these records, in hash order (see the module docstring)."""
    candidates: list[tuple[str, int, int, int]] = []
    for row, rec in enumerate(records):
        spans = sentence_spans(rec["body"])
        if len(spans) < 2:
            continue
        candidates += [(_key(rec["id"], j), row, a, b) for j, (a, b) in enumerate(spans)]
    candidates.sort()
    out: list[Pseudo] = []
    for _, row, a, b in candidates:
        if len(out) >= n:
            break
        body = records[row]["body"]
        sentence, rest = body[a:b], body[:a] + body[b:]
        if len(set(tokenize(sentence))) >= MIN_TERMS and len(set(tokenize(rest))) >= MIN_TERMS:
            out.append(Pseudo(row, sentence.strip(), {**records[row], "body": rest.strip()}))
    return out


def _z(x: np.ndarray) -> np.ndarray:
    """Each row as z-scores over the memory (sd floored, as ``fusion.zscore_stats``)."""
    z: np.ndarray = (x - x.mean(1, keepdims=True)) / np.maximum(x.std(1, keepdims=True), 1e-9)
    return z


def _reciprocal_ranks(score: np.ndarray, target: np.ndarray) -> np.ndarray:
    """1 / the rank of each row's target (ties ranked in its favour)."""
    at = score[np.arange(len(target)), target]
    rr: np.ndarray = 1.0 / (1.0 + (score > at[:, None]).sum(1))
    return rr


def _lexical(drawn: list[Pseudo], positions: np.ndarray, lexical: "PostingsBM25") -> np.ndarray:
    """BM25 of every record for each pseudo-query; the target's from its reduced text."""
    raw = np.zeros((len(drawn), len(positions)), dtype=np.float64)
    for k, p in enumerate(drawn):
        terms = tokenize(p.query)
        raw[k] = lexical.scores(terms, keep=False)[positions]  # (pseudo-queries: no query asks them again)
        raw[k, p.row] = lexical.score_tokens(terms, tokenize(lexical_text(p.rest)))
    return raw


def _cosines(drawn: list[Pseudo], vectors: np.ndarray, embed: Embed, embed_query: Embed) -> np.ndarray:
    """Cosine of every stored vector with each pseudo-query (embedded as a query); the target's from its
    reduced text (embedded as a passage)."""
    queries = np.asarray(embed_query([p.query for p in drawn]), dtype=np.float64)
    rests = np.asarray(embed([embed_text(p.rest) for p in drawn]), dtype=np.float64)
    cos = queries @ np.asarray(vectors, dtype=np.float64).T
    cos[np.arange(len(drawn)), [p.row for p in drawn]] = (rests * queries).sum(1)
    return cos


def sure_gains(rr: dict[float, np.ndarray], floor: float) -> dict[float, float]:
    """Each weight's gain in pseudo-MRR over the grid weight nearest ``floor``, in standard errors of
    the paired per-query differences (``CERTAIN`` for the same gain on every query)."""
    base = rr[min(rr, key=lambda w: (abs(w - floor), w))]
    out = {}
    for w, r in rr.items():
        diff = r - base
        se = float(diff.std(ddof=1)) / np.sqrt(len(diff)) if len(diff) > 1 else 0.0
        mean = float(diff.mean())
        out[w] = mean / se if se > 1e-12 else (0.0 if abs(mean) < 1e-12 else float(np.sign(mean)) * CERTAIN)
    return out


def choose(curve: dict[float, float], gains: dict[float, float], lexical_mrr: float, vector_mrr: float,
           floor: float) -> tuple[float, str | None]:
    """The weight and why it is the floor (None: estimated): among the weights whose gain over the
    floor is sure (``SURE`` standard errors, ``sure_gains``), the one of the best pseudo-MRR, ties
    to the weight nearest ``floor`` then the smaller; ``floor`` when none is sure (a flat curve:
    which weight wins there is noise), and when neither side finds its targets (both MRR below
    ``NO_SIGNAL``)."""
    if max(lexical_mrr, vector_mrr) < NO_SIGNAL or not curve:
        return floor, NO_SIGNAL_WHY
    sure = [w for w in curve if gains.get(w, 0.0) >= SURE]
    if not sure:
        return floor, None
    best = max(curve[w] for w in sure)
    return float(min((w for w in sure if curve[w] >= best - 1e-12), key=lambda w: (abs(w - floor), w))), None


def floored(floor: float, n: int, records: int) -> dict[str, Any]:
    """The estimate of a memory with too few pseudo-queries: the floor, nothing embedded."""
    return {"weight": round(floor, 4), "n": n, "lexical_mrr": None, "vector_mrr": None, "curve": {},
            "records": records, "rule": RULE, "floored": FEW}


def estimate(records: "Sequence[Record]", positions: np.ndarray, vectors: np.ndarray, lexical: "PostingsBM25",
             embed: Embed, *, floor: float, n: int = N_QUERIES, embed_query: Embed | None = None) -> dict[str, Any]:
    """The side weight of a memory: its live records that have a vector (``records``, at log
    ``positions`` of the ``lexical`` engine, with their stored unit ``vectors``); ``embed`` gives
    unit vectors of texts (see the module docstring), ``embed_query`` those of queries (default ``embed``)."""
    drawn = draw(records, n)
    if len(drawn) < MIN_QUERIES:
        return floored(floor, len(drawn), len(records))
    target = np.array([p.row for p in drawn], dtype=np.int64)
    zl = _z(_lexical(drawn, np.asarray(positions, dtype=np.int64), lexical))
    zc = _z(_cosines(drawn, vectors, embed, embed_query or embed))
    lexical_mrr = float(_reciprocal_ranks(zl, target).mean())
    vector_mrr = float(_reciprocal_ranks(zc, target).mean())
    rr = {w: _reciprocal_ranks(w * zl + (1 - w) * zc, target) for w in GRID}
    curve = {w: float(r.mean()) for w, r in rr.items()}
    gains = sure_gains(rr, floor)
    weight, why = choose(curve, gains, lexical_mrr, vector_mrr, floor)
    return {"weight": round(weight, 4), "n": len(drawn), "lexical_mrr": round(lexical_mrr, 4),
            "vector_mrr": round(vector_mrr, 4), "curve": {f"{w:.1f}": round(v, 4) for w, v in curve.items()},
            "gain_se": {f"{w:.1f}": round(float(v), 2) for w, v in gains.items()},
            "records": len(records), "rule": RULE, "floored": why}


def due(previous: Any, records: int) -> bool:
    """Whether a memory of ``records`` live records with a vector needs a new estimate: none yet (or
    one by an older rule), or it has grown by ``REFRESH_GROWTH`` since the last one."""
    if not isinstance(previous, dict) or not isinstance(previous.get("records"), int) or previous.get("rule") != RULE:
        return True  # none, or one made by another rule
    before = int(previous["records"])
    return records >= REFRESH_GROWTH * before and records > before


def weight_of(manifest: Any) -> dict[str, Any] | None:
    """The manifest's estimate when it is usable (a weight in [0, 1] that is not the floor), else None."""
    side = (manifest or {}).get("side_weight") if isinstance(manifest, dict) else None
    if not isinstance(side, dict) or side.get("floored") is not None:
        return None
    w = side.get("weight")
    if isinstance(w, bool) or not isinstance(w, (int, float)) or not 0.0 <= w <= 1.0:
        return None
    return side


def explained(side: Any, weight: float) -> dict[str, Any]:
    """What ``--explain`` shows of the estimate behind the weight a query used."""
    side = side if isinstance(side, dict) else {}
    return {"weight": weight, "estimated_on": side.get("records"), "n": side.get("n"),
            "lexical_mrr": side.get("lexical_mrr"), "vector_mrr": side.get("vector_mrr"),
            "floored": side.get("floored", "none estimated") if side else "none estimated"}

"""Duplicate detection: an exact text fingerprint, and near duplicates by cosine.

A duplicate check must never eat information (adr/0009):

* An *exact duplicate* has the same type and the same title and body after
  normalising case, whitespace and the punctuation around words only
  (``normalised_text``).  Word order, negations, numbers and versions all
  count: "Do not run migrations on Friday" and "Run migrations on Friday" are
  two records.  An exact duplicate stores and embeds nothing; the answer names
  the record that already holds the text.  Candidates are found through the
  postings of the record's rarest term, so the check costs a few hashes.
* A *near duplicate* (cosine ≥ ``memory.near_duplicate`` with a live record)
  is stored like any record, and reported on write (``near_duplicate_of``,
  ``similarity``).  Queries collapse near duplicates among their hits instead
  (``collapse``): the newest of them is shown, the others are counted in its
  hit.  So an agent that re-logs one learning ten times sees it once, and a
  correction ("the limit is 1000 per minute", not 100) is never lost.
"""

from __future__ import annotations

import hashlib
import re
import threading
import unicodedata
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import numpy as np

from ..records import recency
from ..tokenize import tokenize
from ..types import Record

if TYPE_CHECKING:
    from ..index.lexical import PostingsBM25
    from ..index.vectors import VectorIndex
    from ..log import LogScan

_SIGN_BEFORE_DIGIT = "-+.$€£¥"


def _word(word: str) -> str:
    """A word without the punctuation around it; a sign before a digit and a trailing % are kept."""
    start, end = 0, len(word)
    while start < end and not word[start].isalnum():
        if word[start] in _SIGN_BEFORE_DIGIT and start + 1 < end and word[start + 1].isdigit():
            break
        start += 1
    while end > start and not word[end - 1].isalnum() and word[end - 1] != "%":
        end -= 1
    return word[start:end]


def normalised_text(text: str) -> str:
    """``text`` case-folded, with single spaces, and without the punctuation around its words
    ("Don't run it on Friday!" → "don't run it on friday"; "v1.2" and "-5" keep theirs)."""
    words = (w if w.isalnum() else _word(w) for w in unicodedata.normalize("NFKC", text).casefold().split())
    return " ".join(w for w in words if w)


def fingerprint(record: Record) -> str:
    """The exact-duplicate fingerprint: type, normalised title and normalised body."""
    basis = "\x1f".join((record["type"], normalised_text(record["title"]), normalised_text(record.get("body") or "")))
    return hashlib.sha256(basis.encode("utf-8")).hexdigest()[:32]


NEGATIONS = frozenset({"not", "no", "never", "don't", "dont", "doesn't", "isn't", "aren't", "won't", "can't",
                       "cannot", "shouldn't", "mustn't", "avoid", "without", "nor", "stop", "disable", "disabled"})
_VERSION = re.compile(r"^v?\d+(?:\.\d+)+[a-z0-9.-]*$")
_NUMBER = re.compile(r"^[-+]?\d+(?:[.,]\d+)?%?$")


def contradiction(newer: Record, older: Record) -> str | None:
    """How ``older`` disagrees with ``newer`` among the classes adr/0009 measures (``version``, ``number``,
    ``negation``), or None: their versions differ, their numbers differ, or one negates what the other
    says.  Meant for near duplicates (same topic, near-identical words)."""
    return contradictions(newer, [older])[0]


def contradictions(newer: Record, older: list[Record]) -> list[str | None]:
    """:func:`contradiction` of each of ``older`` with ``newer``: compared by their kept marks where this
    process holds both texts' (``KEPT``), else decided from where the two texts differ."""
    title, body = newer["title"], newer.get("body") or ""
    mine = KEPT.get(title, body)
    out = []
    for rec in older:
        other_title, other_body = rec["title"], rec.get("body") or ""
        theirs = None if mine is None else KEPT.get(other_title, other_body)
        if mine is not None and theirs is not None:
            out.append(_differs(mine, theirs))
        else:
            out.append(_contradiction(title, body, other_title, other_body))
    return out


@lru_cache(maxsize=16384)  # (a warm process meets the same near duplicates query after query)
def _contradiction(title: str, body: str, older_title: str, older_body: str) -> str | None:
    """Near duplicates share most of their text, so a pair whose differing words cannot tell a
    contradiction (``_same_marks``) is answered without reading the rest; the others compare their marks."""
    if _same_marks(f"{title} {body}", f"{older_title} {older_body}"):
        return None
    return _differs(KEPT.of(title, body), KEPT.of(older_title, older_body))


_Marks = str
"""A text's marks, as one string: its versions (sorted, distinct, space-separated), then ``\x1f`` and its
numbers the same way, then ``\x1f`` and ``1`` when a negation is there, else ``0``.  Words never hold
whitespace, and ``\x1f`` is whitespace to ``str.split``: two texts' marks are equal exactly when their
strings are (a string is a fraction of the three sets' memory, which a warm process keeps per text)."""


def _marks(title: str, body: str) -> _Marks:
    """What a contradiction is told by: the versions, the numbers, and whether a negation is there."""
    # (the words of ``normalised_text``, each distinct one normalised once; only a word with a digit can
    # be a version or a number)
    words = {w if w.isalnum() else _word(w) for w in set(_words(f"{title} {body}"))}
    words.discard("")
    digits = [w for w in words if not w.isalpha()]
    versions = " ".join(sorted(w for w in digits if _VERSION.match(w)))
    numbers = " ".join(sorted(w for w in digits if _NUMBER.match(w)))
    return f"{versions}\x1f{numbers}\x1f{int(bool(words & NEGATIONS))}"


class KeptMarks:
    """Each text's marks, made once and kept by (title, body) in this process: a query compares two kept
    texts' marks instead of reading where they differ (its near duplicates were often written by this very
    process: ``remember``).  At most ``limit`` texts; the first kept go first."""

    def __init__(self, limit: int):
        self.limit = limit
        self.made = 0  # marks made from a text (what a test counts)
        self._kept: dict[tuple[str, str], _Marks] = {}
        self._lock = threading.Lock()  # (writers: memory-serve's reader and writer threads share it)

    def __len__(self) -> int:
        return len(self._kept)

    def get(self, title: str, body: str) -> _Marks | None:
        """The text's marks when kept, else None (nothing is read)."""
        return self._kept.get((title, body))

    def of(self, title: str, body: str) -> _Marks:
        """The text's marks, made and kept when not kept yet."""
        found = self._kept.get((title, body))
        if found is None:
            found = _marks(title, body)
            with self._lock:
                self.made += 1
                if len(self._kept) >= self.limit:
                    del self._kept[next(iter(self._kept))]
                self._kept[(title, body)] = found
        return found

    def remember(self, records: "list[Record]") -> None:
        """Make and keep the marks of ``records`` (the write path's, as it stores them)."""
        for rec in records:
            self.of(rec["title"], rec.get("body") or "")

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()
            self.made = 0


KEPT = KeptMarks(1 << 18)  # (~100 bytes a text beside the text itself, which its record holds anyway)


def _words(text: str) -> list[str]:
    """The words the marks are read from: NFKC, case-folded, split at whitespace."""
    return unicodedata.normalize("NFKC", text).casefold().split()


def _same_marks(a: str, b: str) -> bool:
    """Whether two texts (title, a space, body) surely have the same marks, found from where they differ:
    the words from the first differing one to the last (in each; whitespace bounds them, and a whitespace
    character neither changes nor joins its neighbours under NFKC and case folding, so the words outside
    are the same in both) hold no version, number or negation.  False: compare the marks."""
    if a == b:
        return True
    start = _common_prefix(a, b)
    tail = _common_suffix(a, b, min(len(a), len(b)) - start)
    if 4 * (len(a) + len(b) - 2 * (start + tail)) > len(a) + len(b):
        return False  # they differ in much of their text: its marks (kept per text) decide
    while start > 0 and not a[start - 1].isspace():  # back to the start of the word it falls in
        start -= 1
    end_a, end_b = len(a) - tail, len(b) - tail
    while end_a < len(a) and not a[end_a].isspace():  # on to the end of that word (the same in both)
        end_a, end_b = end_a + 1, end_b + 1
    return not _telling(_words(a[start:end_a])) and not _telling(_words(b[start:end_b]))


def _common_prefix(a: str, b: str) -> int:
    """How many first characters ``a`` and ``b`` share (halving: each step one comparison in C)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a.startswith(b[lo:mid], lo):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _common_suffix(a: str, b: str, limit: int) -> int:
    """How many last characters ``a`` and ``b`` share, at most ``limit``."""
    lo, hi, la, lb = 0, limit, len(a), len(b)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a.endswith(b[lb - mid:lb - lo], 0, la - lo):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _telling(words: list[str]) -> bool:
    """Whether any of these words is one a contradiction is told by (a version, a number, a negation)."""
    for raw in set(words):
        w = raw if raw.isalnum() else _word(raw)
        if w in NEGATIONS or (w and not w.isalpha() and (_VERSION.match(w) or _NUMBER.match(w))):
            return True
    return False


def forget_texts() -> None:
    """Drop the texts the contradiction cache holds (a log read again from its start: a redaction or a
    compaction may have taken them out of the memory, so no process keeps them)."""
    KEPT.clear()
    _contradiction.cache_clear()


def _differs(a: _Marks, b: _Marks) -> str | None:
    if a == b:
        return None
    for kind, mine, theirs in zip(("version", "number", "negation"), a.split("\x1f"), b.split("\x1f")):
        if mine != theirs:
            return kind
    return None


def content_terms(record: Record) -> frozenset[str]:
    return frozenset(tokenize(f"{record['title']}\n{record.get('body') or ''}"))


def find_exact(record: Record, scan: "LogScan", lexical: "PostingsBM25", alive: np.ndarray) -> int | None:
    """The position of the newest (``records.recency``) live record that is an exact duplicate of
    ``record``, if any (a re-asserted statement can have several live copies)."""
    want = fingerprint(record)
    terms = content_terms(record)
    if terms:
        rarest = min(terms, key=lexical.document_frequency)
        if lexical.document_frequency(rarest) <= 0:
            return None  # a term no live record holds: nothing can match
        candidates = lexical.postings(rarest).tolist()
    else:  # only stop words or punctuation (rare): compare with every live record of the type
        candidates = [p for p, r in enumerate(scan.records) if r["type"] == record["type"]]
    found = [int(pos) for pos in candidates
             if pos < len(alive) and alive[pos] and fingerprint(scan.records[pos]) == want]
    return max(found, key=lambda pos: recency(scan.records[pos])) if found else None


def nearest(vectors: np.ndarray, index: "VectorIndex | None", allowed: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """For each vector, the label of the most similar allowed row of ``index`` and its cosine
    (-1 and -inf when there is none)."""
    labels = np.full(len(vectors), -1, dtype=np.int64)
    sims = np.full(len(vectors), -np.inf, dtype=np.float32)
    if index is None or not len(index) or (allowed is not None and not len(allowed)):
        return labels, sims
    for i, vec in enumerate(vectors):
        top_labels, top_sims = index.top(vec, 1, allowed)
        if len(top_labels):
            labels[i], sims[i] = top_labels[0], top_sims[0]
    return labels, sims


def within_batch(vectors: np.ndarray, threshold: float) -> list[tuple[int, int, float]]:
    """``(i, j, cosine)`` for each vector i of a batch whose most similar earlier vector j has a
    cosine of at least ``threshold``."""
    found = []
    block = 1024
    for a in range(0, len(vectors), block):
        b = min(a + block, len(vectors))
        sims = vectors[a:b] @ vectors[:b].T
        for i in range(max(a, 1), b):
            row = sims[i - a, :i]
            j = int(np.argmax(row))
            if row[j] >= threshold:
                found.append((i, j, float(row[j])))
    return found


def collapse(ranked: list[Any], vectors: np.ndarray, has: np.ndarray, threshold: float, k: int) -> list[list[Any]]:
    """The first ``k`` groups of ranked candidates: a candidate whose vector is within ``threshold``
    (cosine) of a better-ranked group's first member joins that group; one without a vector
    (``has`` False) is its own group.  ``vectors`` holds the candidates' vectors in rank order.
    Once ``k`` groups exist, the remaining candidates only join them (one matrix product)."""
    groups: list[list[Any]] = []
    heads: list[int] = []  # rank index of each group's first member that has a vector
    head_group: list[int] = []
    held = np.empty((min(k, len(ranked)), vectors.shape[1]), dtype=vectors.dtype)  # the heads' vectors, in order
    done = len(ranked)
    with_vector = has.tolist()  # (plain bools and the array's own methods: the loop runs once per candidate)
    for i, cand in enumerate(ranked):
        if len(groups) == k:
            done = i
            break
        if with_vector[i] and heads:
            sims = held[:len(heads)] @ vectors[i]
            best = int(sims.argmax())
            if sims[best] >= threshold:
                groups[head_group[best]].append(cand)
                continue
        groups.append([cand])
        if with_vector[i]:
            held[len(heads)] = vectors[i]
            heads.append(i)
            head_group.append(len(groups) - 1)
    rest = [i for i in range(done, len(ranked)) if with_vector[i]]
    if rest and heads:
        sims = vectors[rest] @ held[:len(heads)].T
        best = sims.argmax(axis=1)
        for i, j, sim in zip(rest, best.tolist(), sims[np.arange(len(rest)), best].tolist()):
            if sim >= threshold:
                groups[head_group[j]].append(ranked[i])
    return groups

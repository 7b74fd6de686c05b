"""Unicode-aware tokenizer shared by the lexical index, fingerprints and queries.

Rules (stable: changing them changes BM25 scores, so the lexical cache is keyed
by ``TOKENIZER_VERSION``):

* NFKC-normalise, then take runs of Unicode word characters (``\\w+``).
* Each run is case-folded.  Identifiers are also split into their parts, so
  ``workflow_dispatch`` yields ``workflow_dispatch``, ``workflow`` and
  ``dispatch``, and ``getUserById`` yields ``getuserbyid``, ``get``, ``user``,
  ``by``, ``id``: agents write code names, and queries rarely spell them whole.
* English stop words are dropped, so a query of only stop words has no terms.
* Chinese, Japanese and Korean are written without spaces between words, so a
  run of their characters becomes overlapping character bigrams (``数据库迁移`` →
  ``数据 据库 库迁 迁移``; a lone character stays a unigram), as Lucene's CJK
  analyzer does: any substring of two or more characters then matches.
"""

from __future__ import annotations

import math
import re
import unicodedata

TOKENIZER_VERSION = 2

_WORD = re.compile(r"\w+")
# Han (with extensions and compatibility ideographs), Hiragana, Katakana (and its extensions),
# Bopomofo, Hangul syllables and jamo: scripts written without spaces between words.
_CJK_CHARS = ("\u1100-\u11ff\u3040-\u30ff\u3100-\u312f\u3130-\u318f\u31a0-\u31ff\u3400-\u4dbf"
              "\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\U00020000-\U0003134f")
_CJK = re.compile(f"[{_CJK_CHARS}]+")

STOP_WORDS = frozenset(
    ["a", "about", "above", "after", "again", "against", "all", "am", "an", "and", "any", "are", "as", "at", "be", "because", "been", "before", "being", "below", "between", "both", "but", "by", "can", "could", "did", "do", "does", "doing", "down", "during", "each", "few", "for", "from", "further", "had", "has", "have", "having", "he", "her", "here", "hers", "herself", "him", "himself", "his", "how", "i", "if", "in", "into", "is", "it", "its", "itself", "just", "me", "more", "most", "my", "myself", "no", "nor", "not", "now", "of", "off", "on", "once", "only", "or", "other", "our", "ours", "ourselves", "out", "over", "own", "same", "she", "should", "so", "some", "such", "than", "that", "the", "their", "theirs", "them", "themselves", "then", "there", "these", "they", "this", "those", "through", "to", "too", "under", "until", "up", "very", "was", "we", "were", "what", "when", "where", "which", "while", "who", "whom", "why", "will", "with", "would", "you", "your", "yours", "yourself", "yourselves"]
)


def _split_case(piece: str) -> list[str]:
    """Split at lower→Upper, ACRONYM→Word and letter↔digit boundaries (any script)."""
    parts: list[str] = []
    start = 0
    for i in range(1, len(piece)):
        prev, cur = piece[i - 1], piece[i]
        nxt = piece[i + 1] if i + 1 < len(piece) else ""
        if (
            (prev.islower() and cur.isupper())
            or (prev.isupper() and cur.isupper() and nxt.islower())
            or (prev.isdigit() != cur.isdigit())
        ):
            parts.append(piece[start:i])
            start = i
    parts.append(piece[start:])
    return parts


def _plain(word: str) -> bool:
    """True for the common case with nothing to split: one case pattern, letters only or digits only."""
    if "_" in word:
        return False
    if word.isalpha():
        return word.islower() or word.isupper() or word[1:].islower()
    return word.isdigit()


def _parts(word: str) -> list[str]:
    """Split an identifier on underscores and case/digit boundaries."""
    if _plain(word):
        return [word]
    parts: list[str] = []
    for piece in word.split("_"):
        if piece:
            parts.extend(_split_case(piece))
    return parts


def _cjk_terms(run: str, out: list[str]) -> None:
    """Overlapping bigrams of a run of CJK characters (the character itself when it is alone)."""
    if len(run) == 1:
        out.append(run)
    else:
        out.extend(run[i:i + 2] for i in range(len(run) - 1))


def tokenize(text: str) -> list[str]:
    """Return the lexical terms of ``text`` in order (repeats kept)."""
    out: list[str] = []
    text = unicodedata.normalize("NFKC", text)
    words = _WORD.findall(text)
    cjk = _CJK.search(text) is not None
    if cjk:  # split each word into its CJK runs (bigrams) and the rest (words)
        split: list[str] = []
        for word in words:
            pos = 0
            for m in _CJK.finditer(word):
                if m.start() > pos:
                    split.append(word[pos:m.start()])
                split.append(m.group())
                pos = m.end()
            if pos < len(word):
                split.append(word[pos:])
        words = split
    for word in words:
        if cjk and _CJK.match(word):
            _cjk_terms(word, out)
            continue
        folded = word.casefold()
        if folded not in STOP_WORDS:
            out.append(folded)
        parts = _parts(word)
        if len(parts) > 1:
            for part in parts:
                p = part.casefold()
                if p not in STOP_WORDS:
                    out.append(p)
    return out


def estimate_tokens(text: str) -> int:
    """What ``text`` costs in an LLM's context: ``ceil(characters / 4)``, the usual rule of thumb
    for English text and code with GPT/Claude-style tokenizers (no tokenizer is loaded for it)."""
    return math.ceil(len(text) / 4)

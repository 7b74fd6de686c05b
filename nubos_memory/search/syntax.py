"""Query syntax for the lexical side: phrases, AND/OR/NOT, ``-term``, ``term*`` and field filters.

``parse(text)`` is None for text with no syntax at all: such a query takes the
bag-of-words path unchanged (``query.py``).  Otherwise the text is read as
clauses separated by spaces:

* a plain word or a prefix ``word*`` standing alone is scored, as without
  syntax: a record need not contain it;
* a ``"phrase"`` (its terms adjacent and in order), terms joined by ``AND`` or
  ``OR`` and an excluded term (``NOT word``, ``-word``) are *conditions*: a
  record that fails one is not returned.  A phrase standing alone in a query
  that also has plain words standing alone (a question quoting a title) is
  scored as its words instead, and such a text with no other syntax is a bag of
  words (None): LoCoMo's questions quote titles, and requiring the titles
  there lowered recall@10 (hybrid 0.7076 → 0.7023).  ``NOT`` binds tightest, then ``AND``,
  then ``OR``; each clause's conditions must all hold;
* ``type:``, ``tag:``, ``phase:``, ``id:``, ``domain:`` filter like the flags
  (values of one field: any of them; fields and flags: all of them).

Only these spellings are syntax: upper-case ``AND``/``OR``/``NOT`` as whole
words, balanced straight double quotes, ``-`` before a letter at a word's
start, ``*`` right after a word, and the five field names; anything else
(``and``, ``C++``, ``--k``, ``foo:bar``) is text.  Malformed
syntax (an unbalanced quote, an operator with nothing to apply to) is read as
plain text, with a ``query-syntax`` warning.

Terms are the tokenizer's (``tokenize.py``), so a phrase's stop words are
skipped (``"state of the art"`` matches ``state-of-the-art``) and a term made
only of stop words constrains nothing.  Phrases are checked against the
candidate records' token sequences (records holding every term of the
phrase, by the postings), so the index keeps no positions.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from ..tokenize import tokenize

FIELDS = ("type", "tag", "phase", "id", "domain")
OPERATORS = frozenset(("AND", "OR", "NOT"))
PREFIX_LIMIT = 64  # the most vocabulary terms one ``word*`` expands to (the most frequent first)

_CHUNK = re.compile(r'"[^"]*"|"|[^\s"]+')
_PREFIX = re.compile(r"(\w+)\*")
_FIELD = re.compile(r"(type|tag|phase|id|domain):([^\s\"]+)")
_EXCLUDE = re.compile(r"-([^\W\d_][^\s\"]*)")


class _Malformed(Exception):
    """The text is not well-formed syntax: it is read as plain text."""


@dataclass(frozen=True)
class Atom:
    """A word, a phrase (without its quotes) or a prefix (without its ``*``), as written."""

    text: str
    kind: str  # "word" | "phrase" | "prefix"

    def shown(self) -> str:
        return {"phrase": f'"{self.text}"', "prefix": f"{self.text}*"}.get(self.kind, self.text)


@dataclass(frozen=True)
class Node:
    """A condition: an atom, or NOT/AND/OR of conditions."""

    op: str  # "ATOM" | "NOT" | "AND" | "OR"
    children: tuple["Node", ...] = ()
    atom: Atom | None = None

    def shown(self) -> str:
        if self.atom is not None:
            return self.atom.shown()
        if self.op == "NOT":
            return f"NOT {self.children[0].shown()}"
        return "(" + f" {self.op} ".join(c.shown() for c in self.children) + ")"


@dataclass
class Parsed:
    """What a query with syntax asks: scored atoms, conditions, field filters; ``warning``: it was
    malformed and is read as plain text (``plain``)."""

    optional: list[Atom] = field(default_factory=list)
    conditions: list[Node] = field(default_factory=list)
    filters: dict[str, list[str]] = field(default_factory=dict)
    warning: str | None = None

    @property
    def plain(self) -> bool:
        return self.warning is not None

    def positive(self) -> list[Atom]:
        """The atoms the query looks for (not under a NOT), in order: they are scored."""
        out = list(self.optional)
        for node in self.conditions:
            _positive(node, False, out)
        return out

    def free_text(self) -> str:
        """The query's words without operators, filters and quotes (what the vector side embeds)."""
        return " ".join(a.text for a in self.positive())

    def explained(self, expansions: dict[str, "Expansion"]) -> dict[str, object]:
        """The parse as ``--explain`` shows it."""
        out: dict[str, object] = {"scored": [a.shown() for a in self.optional],
                                  "conditions": [n.shown() for n in self.conditions],
                                  "filters": self.filters, "free_text": self.free_text()}
        if expansions:
            out["prefixes"] = {k: {"terms": e.terms, "matched": e.matched} for k, e in expansions.items()}
        return out


def _positive(node: Node, negated: bool, out: list[Atom]) -> None:
    if node.atom is not None:
        if not negated:
            out.append(node.atom)
        return
    for child in node.children:
        _positive(child, negated != (node.op == "NOT"), out)


Token = tuple[str, object]  # ("op", "AND") | ("atom", Atom) | ("field", (name, value))


def _word(chunk: str) -> Atom:
    m = _PREFIX.fullmatch(chunk)
    return Atom(m.group(1), "prefix") if m else Atom(chunk, "word")


def _token(chunk: str) -> list[Token]:
    if chunk == '"':
        raise _Malformed("an unbalanced double quote")
    if chunk.startswith('"'):
        return [("atom", Atom(chunk[1:-1], "phrase"))]
    if chunk in OPERATORS:
        return [("op", chunk)]
    m = _FIELD.fullmatch(chunk)
    if m:
        return [("field", (m.group(1), m.group(2)))]
    m = _EXCLUDE.fullmatch(chunk)
    if m:
        return [("op", "NOT"), ("atom", _word(m.group(1)))]
    return [("atom", _word(chunk))]


def _tokens(text: str) -> list[Token]:
    out: list[Token] = []
    for chunk in _CHUNK.findall(text):
        out += _token(chunk)
    return out


class _Reader:
    """Recursive descent over the tokens: or := and (OR and)*; and := unary (AND unary)*;
    unary := NOT unary | atom."""

    def __init__(self, tokens: list[Token]):
        self.tokens, self.at = tokens, 0

    def peek(self) -> Token | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def done(self) -> bool:
        return self.at >= len(self.tokens)

    def unary(self) -> Node:
        negations = 0  # (counted, not recursed into: an odd number is one NOT, an even one two)
        while self.peek() == ("op", "NOT"):
            self.at += 1
            negations += 1
        tok = self.peek()
        if tok is None:
            raise _Malformed("an operator at the end has nothing to apply to")
        self.at += 1
        if tok[0] == "op":
            raise _Malformed(f"{tok[1]} has nothing on its left")
        assert isinstance(tok[1], Atom)
        node = Node("ATOM", atom=tok[1])
        for _ in range(min(negations, 2 - negations % 2)):  # (NOT NOT x stays a condition: x must be there)
            node = Node("NOT", (node,))
        return node

    def chain(self, op: str, part: Callable[[], Node]) -> Node:
        nodes = [part()]
        while self.peek() == ("op", op):
            self.at += 1
            nodes.append(part())
        return nodes[0] if len(nodes) == 1 else Node(op, tuple(nodes))

    def clause(self) -> Node:
        return self.chain("OR", lambda: self.chain("AND", self.unary))


def parse(text: str) -> Parsed | None:
    """The query's syntax; None when it has none (the bag-of-words path runs unchanged)."""
    try:
        tokens = _tokens(text)
    except _Malformed as exc:
        return Parsed(warning=f"{exc}: the query is read as plain words")
    if all(kind == "atom" and isinstance(value, Atom) and value.kind == "word" for kind, value in tokens):
        return None
    parsed = Parsed()
    for kind, value in tokens:
        if kind == "field" and isinstance(value, tuple):
            parsed.filters.setdefault(str(value[0]), []).append(str(value[1]))
    reader = _Reader([t for t in tokens if t[0] != "field"])
    try:
        while not reader.done():
            node = reader.clause()
            if node.atom is not None and node.atom.kind != "phrase":
                parsed.optional.append(node.atom)
            else:
                parsed.conditions.append(node)
    except _Malformed as exc:
        return Parsed(warning=f"{exc}: the query is read as plain words")
    return _prose(parsed)


def _prose(parsed: Parsed) -> Parsed | None:
    """A phrase quoted in a sentence of plain words (a question naming a title) is scored as its words,
    not required; when nothing else is syntax the text is a bag of words (None), as without quotes."""
    if not any(a.kind == "word" for a in parsed.optional):
        return parsed
    loose = [n for n in parsed.conditions if n.atom is not None]
    if not loose:
        return parsed
    parsed.conditions = [n for n in parsed.conditions if n.atom is None]
    if not parsed.conditions and not parsed.filters and all(a.kind == "word" for a in parsed.optional):
        return None
    parsed.optional += [n.atom for n in loose if n.atom is not None]
    return parsed


# -- evaluation against an index ---------------------------------------------------------------------
class Vocabulary(Protocol):
    """What evaluating a parse needs of the lexical index (``index.lexical.PostingsBM25``)."""

    vocab: dict[str, int]

    def postings(self, term: str) -> np.ndarray: ...

    def document_frequency(self, term: str) -> int: ...


def prefix_stem(text: str) -> str:
    return unicodedata.normalize("NFKC", text).casefold()


@dataclass(frozen=True)
class Expansion:
    """A prefix's terms: the ``PREFIX_LIMIT`` most frequent of the vocabulary's terms that start with
    it (then by term), and how many matched in all."""

    terms: list[str]
    matched: int


def expand(stem: str, index: Vocabulary) -> Expansion:
    """``stem``'s expansion against the index's vocabulary (``Expansion``)."""
    found = [t for t in index.vocab if t.startswith(stem)]
    found.sort(key=lambda t: (-index.document_frequency(t), t))
    return Expansion(found[:PREFIX_LIMIT], len(found))


def expansions(parsed: Parsed, index: Vocabulary) -> dict[str, Expansion]:
    """Every prefix of the parse: the terms it stands for and how many matched."""
    out: dict[str, Expansion] = {}
    atoms = list(parsed.optional)
    for node in parsed.conditions:
        _all_atoms(node, atoms)
    for atom in atoms:
        if atom.kind == "prefix" and atom.shown() not in out:
            out[atom.shown()] = expand(prefix_stem(atom.text), index)
    return out


def _all_atoms(node: Node, out: list[Atom]) -> None:
    if node.atom is not None:
        out.append(node.atom)
    for child in node.children:
        _all_atoms(child, out)


def scored_terms(parsed: Parsed, prefixes: dict[str, Expansion]) -> list[str]:
    """The terms BM25 scores: the positive words' and phrases' terms, and the prefixes' expansions."""
    terms: list[str] = []
    for atom in parsed.positive():
        if atom.kind == "prefix":
            terms += prefixes[atom.shown()].terms
        else:
            terms += tokenize(atom.text)
    return list(dict.fromkeys(terms))


def _contains(seq: Sequence[str], part: Sequence[str]) -> bool:
    n = len(part)
    return any(seq[i:i + n] == part for i in range(len(seq) - n + 1) if seq[i] == part[0])


class Matcher:
    """Which records satisfy the conditions: a boolean mask over log positions (``size`` of them)."""

    def __init__(self, index: Vocabulary, text_of: Callable[[int], str], size: int,
                 prefixes: dict[str, Expansion]):
        self.index, self.text_of, self.size, self.prefixes = index, text_of, size, prefixes

    def _docs(self, term: str) -> np.ndarray:
        mask = np.zeros(self.size, dtype=bool)
        docs = self.index.postings(term)
        mask[docs[docs < self.size]] = True
        return mask

    def atom(self, atom: Atom) -> np.ndarray | None:
        """The records holding the atom (None: it has no searchable term and constrains nothing)."""
        if atom.kind == "prefix":
            mask = np.zeros(self.size, dtype=bool)
            for term in self.prefixes[atom.shown()].terms:
                mask |= self._docs(term)
            return mask
        terms = tokenize(atom.text)
        if not terms:
            return None
        mask = self._docs(terms[0])
        for term in set(terms[1:]):
            mask &= self._docs(term)
        if len(terms) > 1:  # in order and adjacent: read the candidates' token sequences
            for p in np.flatnonzero(mask).tolist():
                mask[p] = _contains(tokenize(self.text_of(p)), terms)
        return mask

    def node(self, node: Node) -> np.ndarray | None:
        if node.atom is not None:
            return self.atom(node.atom)
        masks = [m for m in (self.node(c) for c in node.children) if m is not None]
        if not masks:
            return None
        if node.op == "NOT":
            return ~masks[0]
        out = masks[0].copy()
        for m in masks[1:]:
            if node.op == "AND":
                out &= m
            else:
                out |= m
        return out

    def all(self, conditions: list[Node]) -> np.ndarray | None:
        """Every condition's mask, and-ed (None: no condition constrains anything)."""
        out: np.ndarray | None = None
        for node in conditions:
            m = self.node(node)
            if m is not None:
                out = m if out is None else out & m
        return out

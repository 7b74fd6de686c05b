"""The fields filters read, for every record, as codes into their distinct values (issue 27).

A snapshot kept each record's type, domain and phase in lists and its tags in a dict of position
lists: built in a Python loop over every record, which a one-shot call at a million records paid
before it answered (~0.15 s).  A :class:`Facet` holds one field as int32 codes: a checkpoint's column
is taken with one remap of its codes (``columns.Coded``), a record appended is coded one by one, and
a filter asks each *distinct* value once, then looks its answer up for every record in one array
operation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from ..columns import Coded, Distinct


class Facet:
    """One field of every record (by position) as codes into ``distinct``."""

    def __init__(self) -> None:
        self._distinct = Distinct()
        self._codes = np.zeros(0, dtype=np.int32)
        self.size = 0

    @property
    def distinct(self) -> list[Any]:
        return self._distinct.values

    def __len__(self) -> int:
        return self.size

    @property
    def codes(self) -> np.ndarray:
        return self._codes[:self.size]

    def code(self, value: Any) -> int:
        return self._distinct.code(value)

    def extend(self, values: Iterable[Any]) -> None:
        """Append the records' values."""
        self._append(np.fromiter(map(self.code, values), dtype=np.int32))

    def extend_coded(self, coded: Coded, start: int = 0) -> None:
        """Append a checkpoint's column from ``start`` on (its codes remapped to this facet's)."""
        if start >= len(coded):
            return
        remap = np.fromiter(map(self.code, coded.distinct), dtype=np.int32, count=len(coded.distinct))
        self._append(remap[np.frombuffer(coded.codes, dtype=np.int32)[start:]])

    def _append(self, codes: np.ndarray) -> None:
        end = self.size + len(codes)
        if end > len(self._codes):  # (grown by doubling: a warm process appends one write at a time)
            grown = np.zeros(max(end, 2 * len(self._codes), 64), dtype=np.int32)
            grown[:self.size] = self._codes[:self.size]
            self._codes = grown
        self._codes[self.size:end] = codes
        self.size = end

    def where(self, test: Callable[[Any], bool], n: int | None = None) -> np.ndarray:
        """Whether each of the first ``n`` records' value (all: None) passes ``test``, asked once per
        distinct value."""
        table = np.fromiter((bool(test(v)) for v in self.distinct), dtype=bool, count=len(self.distinct))
        found: np.ndarray = table[self.codes[:n]]  # (no distinct values: no records, an empty answer)
        return found

    def counts(self, mask: np.ndarray | None = None) -> dict[Any, int]:
        """How many records (those ``mask`` keeps) have each value (values of none left out)."""
        codes = self.codes if mask is None else self.codes[mask[:self.size]]
        found = np.bincount(codes, minlength=len(self.distinct))
        return {self.distinct[c]: int(found[c]) for c in np.flatnonzero(found)}

    def present(self) -> list[Any]:
        """The values some record has."""
        return list(self.counts())

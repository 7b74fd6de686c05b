"""The records of a log's state, by position: a list whose kept part is decoded when first read.

A process that restores the log's state from a checkpoint (``store/checkpoint.py``) would otherwise
build a Python object for every record before it answers one query: at 100k records that was most
of a one-shot call (issue 27).  A :class:`RecordList` holds the checkpoint's records as bytes — one
JSON document per line, with where each line starts — and decodes a record when it is first read
(then keeps it); the few fields every call needs for every record (``COLUMNS``: a filter's type,
domain, phase and tags, an expiry, the id, the importance a query's ranking reads of each candidate)
come as columns beside them, read without decoding a record; a checkpoint keeps them in binary
(``columns.py``: the ids as lines, the others as codes into their distinct values).  Records appended
after the checkpoint, and every record of a state read from the log itself, are plain objects in a list.  It behaves as the list of records did: indexes (negative
too), slices (lists), iteration, ``append``, and assignment (the state replaces a record when an
``anchor`` op moves its anchors).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, overload

import orjson

from .columns import Coded, checked_index, key_of
from .fsio import dumps
from .types import Record

COLUMNS = ("id", "type", "domain", "phase", "tags", "valid_until", "importance")


class RecordList(Sequence[Record]):
    """Records by position: ``kept`` ones decoded from ``blob`` on first read, then the appended ones."""

    __slots__ = ("_blob", "_columns", "_decoded", "_kept", "_offsets", "_tail")

    def __init__(self, blob: Any = b"", offsets: Sequence[int] = (0,), columns: dict[str, Any] | None = None):
        """``blob[offsets[i]:offsets[i + 1]]`` is record i's JSON (any buffer: bytes, a memory map);
        ``columns``: each of ``COLUMNS``' value for every kept record (missing ones are decoded): a list,
        or a sequence of ``columns.py`` that decodes its items when read and can be written."""
        self._blob = blob
        self._offsets = offsets
        self._kept = len(offsets) - 1
        self._columns = columns or {}
        if any(len(v) != self._kept for v in self._columns.values()):
            raise ValueError("a column does not match the records")
        self._decoded: dict[int, Record] = {}
        self._tail: list[Record] = []

    def __len__(self) -> int:
        return self._kept + len(self._tail)

    @overload
    def __getitem__(self, index: int) -> Record: ...

    @overload
    def __getitem__(self, index: slice) -> list[Record]: ...

    def __getitem__(self, index: int | slice) -> Record | list[Record]:
        if isinstance(index, slice):
            return [self._at(i) for i in range(*index.indices(len(self)))]
        return self._at(checked_index(index, len(self)))

    def _at(self, i: int) -> Record:
        if i >= self._kept:
            return self._tail[i - self._kept]
        rec = self._decoded.get(i)
        if rec is None:
            rec = self._decoded[i] = orjson.loads(self._blob[self._offsets[i]:self._offsets[i + 1]])
        return rec

    def __iter__(self) -> Iterator[Record]:
        for i in range(self._kept):
            yield self._at(i)
        yield from self._tail

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (RecordList, list)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # (mutable, as a list)

    def __setitem__(self, index: int, rec: Record) -> None:
        index = checked_index(index, len(self))
        if index >= self._kept:
            self._tail[index - self._kept] = rec
            return
        self._decoded[index] = rec
        for name, values in self._columns.items():  # (an unchanged value is not written: a packed column
            if key_of(values[index]) != key_of(rec.get(name)):  # would decode every item to take it)
                values[index] = rec.get(name)

    @property
    def decoded(self) -> int:
        """How many kept records were decoded so far."""
        return len(self._decoded)

    def append(self, rec: Record) -> None:
        self._tail.append(rec)

    def value(self, index: int, name: str) -> Any:
        """Field ``name`` of the record at ``index`` (None where it has none), from its column where there
        is one."""
        column = self._columns.get(name)
        if column is not None and 0 <= index < self._kept:
            return column[index]
        return self[index].get(name)

    def values_at(self, positions: Sequence[int], name: str) -> list[Any]:
        """:meth:`value` of each of ``positions`` (each in range, not negative): a query's candidates in one
        pass, a column's codes read directly."""
        column, kept = self._columns.get(name), self._kept
        if isinstance(column, Coded):
            distinct, codes = column.distinct, column.codes
            return [distinct[codes[p]] if p < kept else self._tail[p - kept].get(name) for p in positions]
        if column is not None:
            return [column[p] if p < kept else self._tail[p - kept].get(name) for p in positions]
        return [self._at(p).get(name) for p in positions]

    def column(self, name: str) -> Sequence[Any] | None:
        """The kept records' column ``name`` as it is held (a list, or ``columns.py``'s ``Lines`` or
        ``Coded``), None where there is none."""
        return self._columns.get(name)

    def coded(self, name: str) -> Coded | None:
        """The kept records' column ``name`` when it is held as codes (a checkpoint's)."""
        column = self._columns.get(name)
        return column if isinstance(column, Coded) else None

    def values(self, name: str, start: int = 0) -> list[Any]:
        """Field ``name`` of every record from ``start`` on (None where a record has none), from its
        column where there is one, without decoding those records."""
        column = self._columns.get(name)
        kept = column[start:] if column is not None else [self._at(i).get(name) for i in range(start, self._kept)]
        return kept + [rec.get(name) for rec in self._tail[max(0, start - self._kept):]]

    def encode(self) -> tuple[bytes, list[int], dict[str, list[Any]]]:
        """Every record as this list's ``blob``, ``offsets`` and ``columns`` (what a checkpoint keeps;
        ``RecordList(*encode())`` is an equal list)."""
        lines, offsets, at = [], [0], 0
        for i in range(len(self)):
            raw = self._blob[self._offsets[i]:self._offsets[i + 1]] if i < self._kept and i not in self._decoded \
                else dumps(self._at(i))
            lines.append(bytes(raw))
            at += len(raw)
            offsets.append(at)
        return b"".join(lines), offsets, {name: self.values(name) for name in COLUMNS}

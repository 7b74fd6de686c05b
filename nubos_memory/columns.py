"""A restored log state's per-record lists kept as flat binary arrays (issue 27): mapped, not parsed.

At a million records a one-shot call spent a third of its time parsing the JSON lists a checkpoint
kept for every record (where its JSON starts, its line number, content hash, id, type, domain, phase,
tags and expiry) and another part building the id -> position dict to apply a tail of new lines.
Here each list is kept as one flat array a process copies with one memcpy (``array``) or reads in
place from the memory-mapped checkpoint, decoding an item when it is asked for:

* ``array``: int64 (line numbers, record offsets) or uint32;
* :class:`Hex`: equal-length lowercase hex digests as their bytes (content hashes);
* :class:`Lines`: strings without a newline, newline-terminated, with where each starts (ids);
* :class:`Coded`: any JSON values as int32 codes into their distinct values (type, domain, phase,
  tags, valid_until: a filter asks each distinct value once);
* :class:`Positions`: id -> latest position through the ids' CRC-32s, sorted, with what changed since
  in a dict (what applying a record line asks).

Each behaves as the list (or dict) it replaces and is writable where the state writes it.
:func:`pack` turns a list into ``(description, bytes)``; :func:`unpack` reads it back from a buffer;
the description is JSON the checkpoint's state line carries (store/checkpoint.py).  Native byte order:
a checkpoint is derived data of this machine, and one written with another byte order is not used.
"""

from __future__ import annotations

import sys
import zlib
from abc import abstractmethod
from array import array
from bisect import bisect_left
from collections.abc import Iterator, Mapping, MutableMapping, MutableSequence, Sequence
from itertools import accumulate
from typing import Any, Self, overload

import orjson

BYTEORDER = sys.byteorder
_HEX = frozenset("0123456789abcdef")


def key_of(value: Any) -> Any:
    """What a value is told apart by: itself for a string or None, its JSON otherwise (so that 1 and
    True, or two equal lists, are one value each)."""
    return value if value is None or type(value) is str else orjson.dumps(value)


class Packed(MutableSequence[str]):
    """Strings kept packed in a buffer (the first ``_kept``, decoded when read) and then as strings
    (``_more``: appended with ``+``, or every one once an item is replaced, inserted or removed)."""

    __slots__ = ("_kept", "_more")

    def __init__(self, kept: int, more: list[str] | None):
        self._kept = kept
        self._more: list[str] = more if more is not None else []

    @abstractmethod
    def _run(self, start: int, stop: int) -> list[str]:
        """Kept items ``start..stop`` decoded (``start < stop <= _kept``)."""

    @abstractmethod
    def _bytes(self, start: int, stop: int) -> bytes:
        """Kept items ``start..stop`` as they are packed."""

    @abstractmethod
    def _with(self, more: list[str]) -> Self:
        """The same packed items, then ``more``."""

    @abstractmethod
    def _unpack(self) -> None:
        """Let go of the buffer (every item is in ``_more`` now)."""

    def __len__(self) -> int:
        return self._kept + len(self._more)

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> list[str]: ...

    def __getitem__(self, index: int | slice) -> str | list[str]:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step != 1:
                return [self[i] for i in range(start, stop, step)]
            if start >= stop:
                return []
            kept = self._run(start, min(stop, self._kept)) if start < self._kept else []
            return kept + self._more[max(start - self._kept, 0):max(stop - self._kept, 0)]
        i = checked_index(index, len(self))
        return self._run(i, i + 1)[0] if i < self._kept else self._more[i - self._kept]

    def values(self) -> list[str]:
        """Every item, decoded."""
        return self[0:len(self)]

    def __iter__(self) -> Iterator[str]:
        return iter(self.values())

    def raw(self, start: int, stop: int) -> bytes | None:
        """Items ``start..stop`` as they are packed when all of them are (None otherwise): what two runs
        are compared by without decoding them."""
        return self._bytes(start, stop) if 0 <= start <= stop <= self._kept else None

    def __add__(self, other: Sequence[str]) -> Self:
        """These items and then ``other``'s (the packed ones shared, not copied)."""
        return self._with(self._more + list(other))

    def _spill(self) -> None:
        if self._kept:
            self._more, self._kept = self.values(), 0
            self._unpack()

    def __setitem__(self, index: Any, value: Any) -> None:
        self._spill()
        self._more[index] = value

    def __delitem__(self, index: Any) -> None:
        self._spill()
        del self._more[index]

    def insert(self, index: int, value: str) -> None:
        if index >= len(self):
            self._more.append(value)
            return
        self._spill()
        self._more.insert(index, value)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (Packed, list)):
            return len(self) == len(other) and self.values() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # (mutable, as a list)


class Hex(Packed):
    """Hex digests of one length kept as their bytes (``width`` bytes each)."""

    __slots__ = ("_raw", "width")

    def __init__(self, raw: Any, width: int, more: list[str] | None = None):
        self._raw = memoryview(raw).cast("B")
        self.width = width
        super().__init__(len(self._raw) // width, more)

    def _run(self, start: int, stop: int) -> list[str]:
        w, raw = self.width, self._raw
        return [raw[i * w:(i + 1) * w].hex() for i in range(start, stop)]

    def _bytes(self, start: int, stop: int) -> bytes:
        return bytes(self._raw[start * self.width:stop * self.width])

    def _with(self, more: list[str]) -> Self:
        return type(self)(self._raw, self.width, more)

    def _unpack(self) -> None:
        self._raw = memoryview(b"")


class Lines(Packed):
    """Strings without a newline kept as UTF-8 lines (``starts[i]``: where line i starts; one more entry
    for the end)."""

    __slots__ = ("_blob", "_starts")

    def __init__(self, blob: Any, starts: array[int], more: list[str] | None = None):
        self._blob = memoryview(blob).cast("B")
        self._starts = starts
        super().__init__(len(starts) - 1, more)

    def _run(self, start: int, stop: int) -> list[str]:
        return str(self._blob[self._starts[start]:self._starts[stop] - 1], "utf-8").split("\n")

    def _bytes(self, start: int, stop: int) -> bytes:
        return bytes(self._blob[self._starts[start]:self._starts[stop]])

    def _with(self, more: list[str]) -> Self:
        return type(self)(self._blob, self._starts, more)

    def _unpack(self) -> None:
        self._blob, self._starts = memoryview(b""), array("q", [0])


class Distinct:
    """Values told apart by :func:`key_of`, each coded by its place in ``values``."""

    __slots__ = ("_code", "values")

    def __init__(self, values: list[Any] | None = None):
        self.values: list[Any] = values if values is not None else []
        self._code: dict[Any, int] | None = None

    def code(self, value: Any) -> int:
        """The code of ``value``, a new one for a value not seen before."""
        if self._code is None:
            self._code = {key_of(v): c for c, v in enumerate(self.values)}
        key = key_of(value)
        found = self._code.get(key)
        if found is None:
            found = self._code[key] = len(self.values)
            self.values.append(value)
        return found


class Coded(Sequence[Any]):
    """JSON values as int32 codes into their ``distinct`` values; an item written is coded too."""

    __slots__ = ("_distinct", "codes")

    def __init__(self, codes: array[int], distinct: list[Any]):
        self.codes = codes
        self._distinct = Distinct(distinct)

    @property
    def distinct(self) -> list[Any]:
        return self._distinct.values

    @classmethod
    def of(cls, values: Sequence[Any]) -> "Coded":
        coded = cls(array("i"), [])
        coded.codes.extend(map(coded.code, values))
        return coded

    def code(self, value: Any) -> int:
        """The code of ``value``, a new one for a value not seen before."""
        return self._distinct.code(value)

    def __len__(self) -> int:
        return len(self.codes)

    @overload
    def __getitem__(self, index: int) -> Any: ...

    @overload
    def __getitem__(self, index: slice) -> list[Any]: ...

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            distinct = self.distinct
            return [distinct[c] for c in self.codes[index]]
        return self.distinct[self.codes[checked_index(index, len(self))]]

    def __setitem__(self, index: int, value: Any) -> None:
        self.codes[checked_index(index, len(self))] = self.code(value)


def crc(rid: str) -> int:
    """The key an id is looked up by in :class:`Positions` (collisions are told apart by the id)."""
    return zlib.crc32(rid.encode("utf-8", "surrogatepass"))


class Positions(MutableMapping[str, int]):
    """Record id -> latest position: the kept ids through ``keys`` (their CRC-32s, sorted) and ``at``
    (each one's position; ``ids`` by position tells colliding keys apart), then ``changed`` since.
    Iterating, counting or removing makes the plain dict once (as ``LogScan.position`` did)."""

    __slots__ = ("_at", "_changed", "_dict", "_ids", "_keys")

    def __init__(self, keys: array[int], at: array[int], ids: Sequence[str]):
        self._keys, self._at, self._ids = keys, at, ids
        self._changed: dict[str, int] = {}
        self._dict: dict[str, int] | None = None

    @staticmethod
    def index(position: Mapping[str, int]) -> tuple[array[int], array[int]]:
        """The ``keys`` and ``at`` arrays of ``position``."""
        import numpy as np  # (only a checkpoint's writer sorts)

        if isinstance(position, Positions):
            position = position.plain()
        keys = np.fromiter(map(crc, position), dtype=np.uint32, count=len(position))
        at = np.fromiter(position.values(), dtype=np.int64, count=len(position))
        order = np.argsort(keys, kind="stable")
        return array("I", keys[order].tobytes()), array("q", at[order].tobytes())

    def __getitem__(self, rid: str) -> int:
        if self._dict is not None:
            return self._dict[rid]
        found = self._changed.get(rid)
        if found is not None:
            return found
        if type(rid) is str:
            key, keys = crc(rid), self._keys
            i = bisect_left(keys, key)
            while i < len(keys) and keys[i] == key:
                if self._ids[self._at[i]] == rid:
                    return int(self._at[i])
                i += 1
        raise KeyError(rid)

    def __setitem__(self, rid: str, pos: int) -> None:
        (self._dict if self._dict is not None else self._changed)[rid] = pos

    def plain(self) -> dict[str, int]:
        """The mapping as a dict (made once; this one then works on it)."""
        if self._dict is None:
            ids = self._ids
            made = dict(zip(ids.values() if isinstance(ids, Lines) else ids, range(len(ids))))
            made.update(self._changed)
            self._dict, self._changed = made, {}
        return self._dict

    def __delitem__(self, rid: str) -> None:
        del self.plain()[rid]

    def __iter__(self) -> Iterator[str]:
        return iter(self.plain())

    def __len__(self) -> int:
        return len(self.plain())

    def items(self) -> Any:
        return self.plain().items()


def hex_bytes(values: Sequence[Any], width: int) -> bytes | None:
    """``values`` as their bytes when each is a lowercase hex digest of ``width`` bytes (None otherwise):
    what a :class:`Hex` column holds, and what it is compared with."""
    if width <= 0 or not all(type(v) is str and len(v) == 2 * width and not set(v) - _HEX for v in values):
        return None
    return bytes.fromhex("".join(values))


def line_bytes(values: Sequence[Any]) -> bytes | None:
    """``values`` as newline-terminated UTF-8 lines (None: one is not a string, holds a newline or cannot
    be encoded): what a :class:`Lines` column holds, and what it is compared with."""
    encoded = _encoded(values)
    return None if encoded is None else b"".join(b + b"\n" for b in encoded)


def _encoded(values: Sequence[Any]) -> list[bytes] | None:
    if not all(type(v) is str and "\n" not in v for v in values):
        return None
    try:
        return [v.encode() for v in values]
    except UnicodeEncodeError:  # (a lone surrogate: never in a parsed record)
        return None


def pack(values: Sequence[Any], kind: str) -> tuple[dict[str, Any], bytes]:
    """``values`` as ``(description, data)`` for :func:`unpack`: ``q`` (int64) or ``I`` (uint32) ints;
    ``hex``: equal-length lowercase hex strings; ``lines``: strings without a newline; ``coded``: any JSON
    values.  Values that do not fit their kind (a hand-edited id with a newline...) are kept as JSON."""
    n = len(values)
    if kind in ("q", "I"):
        return {"kind": kind, "count": n}, (values if isinstance(values, array) and values.typecode == kind
                                            else array(kind, values)).tobytes()
    if kind == "coded":
        coded = values if isinstance(values, Coded) else Coded.of(values)
        return {"kind": "coded", "count": n, "distinct": coded.distinct}, coded.codes.tobytes()
    if kind == "hex":
        if isinstance(values, Hex) and n and (kept := values.raw(0, n)) is not None:  # (a restored column)
            return {"kind": "hex", "count": n, "width": values.width}, kept
        width = len(values[0]) // 2 if n and isinstance(values[0], str) else 0
        digests = hex_bytes(values, width)
        if digests is not None:
            return {"kind": "hex", "count": n, "width": width}, digests
    elif kind == "lines":
        encoded = _encoded(values)
        if encoded is not None:
            starts = array("q", [0])
            starts.extend(accumulate(len(b) + 1 for b in encoded))
            return {"kind": "lines", "count": n}, starts.tobytes() + b"".join(b + b"\n" for b in encoded)
    elif kind != "json":
        raise ValueError(f"no such kind {kind!r}")
    return {"kind": "json", "count": n}, orjson.dumps(list(values))


def unpack(desc: Any, data: Any) -> Any:
    """What :func:`pack` described by ``desc`` holds, read from ``data`` (a buffer: kept in place where
    items are decoded when read).  ValueError/TypeError/KeyError: not such a column.  A column is only
    read from a checkpoint whose payload matched its signed sha256: its codes are not checked one by one."""
    kind, n = desc["kind"], desc["count"]
    if not isinstance(n, int) or n < 0:
        raise ValueError("not a column")
    view = memoryview(data).cast("B")
    if kind == "json":
        values = orjson.loads(view)
        if not isinstance(values, list) or len(values) != n:
            raise ValueError("a column of another length")
        return values
    if kind in ("q", "I", "coded"):
        out = array("i" if kind == "coded" else kind)
        if len(view) != n * out.itemsize:
            raise ValueError("a column of another length")
        out.frombytes(view)
        if kind != "coded":
            return out
        if not isinstance(desc["distinct"], list):
            raise ValueError("not a column")
        return Coded(out, desc["distinct"])
    if kind == "hex":
        width = desc["width"]
        if not isinstance(width, int) or width <= 0 or len(view) != n * width:
            raise ValueError("a column of another length")
        return Hex(view, width)
    if kind == "lines":
        starts = array("q")
        starts.frombytes(view[:(n + 1) * 8])
        blob = view[(n + 1) * 8:]
        if len(starts) != n + 1 or starts[0] != 0 or starts[-1] != len(blob):
            raise ValueError("a column of another length")
        return Lines(blob, starts)
    raise ValueError(f"no such kind {kind!r}")


def pack_all(items: Sequence[tuple[str, Sequence[Any], str]]) -> tuple[dict[str, Any], bytes]:
    """Several columns ``(name, values, kind)`` as one binary section and its description (each
    column's :func:`pack` description with where it lies: ``at``, ``bytes``)."""
    arrays: dict[str, Any] = {}
    parts: list[bytes] = []
    size = 0
    for name, values, kind in items:
        desc, data = pack(values, kind)
        arrays[name] = {**desc, "at": size, "bytes": len(data)}
        parts.append(data)
        size += len(data)
    return arrays, b"".join(parts)


def unpack_from(arrays: Any, section: Any, name: str) -> Any:
    """Column ``name`` of a section :func:`pack_all` wrote (``arrays``: its description)."""
    desc = arrays[name]
    at, size = desc["at"], desc["bytes"]
    if not (isinstance(at, int) and isinstance(size, int) and at >= 0 and at + size <= len(section)):
        raise ValueError("a column outside its section")
    return unpack(desc, section[at:at + size])


def checked_index(index: int, n: int) -> int:
    """``index`` into a sequence of ``n`` items, a negative one counted from the end (IndexError when outside)."""
    if index < 0:
        index += n
    if not 0 <= index < n:
        raise IndexError("position out of range")
    return index


Strings = list[str] | Lines  # ids: a list, or a file's lines read in place
Digests = list[str] | Hex  # content hashes: a list, or a file's digests read in place

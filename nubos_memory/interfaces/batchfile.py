"""Reading a batch of records for ``memory-index``: a JSON array or JSON Lines."""

from __future__ import annotations

from typing import Any

from .. import codes
from ..errors import InputError
from ..fsio import JSONDecodeError, loads

MAX_BATCH_BYTES = 256 << 20


def _bad(message: str, line: int | None, excerpt: str | None, source: str) -> InputError:
    return InputError(message, code=codes.RECORDS_FILE_INVALID,
                      details={"source": source, "line": line, "excerpt": excerpt, "written": 0})


def parse_batch(data: bytes | str, source: str = "-") -> list[Any]:
    """Parse ``data`` (the file's bytes, or its text as the caller read it) as a JSON array of records, or
    as one JSON record per line.

    Nothing is written when this fails: the error names the first bad line.
    """
    if isinstance(data, str):  # (its size in bytes: a code point is at most 4)
        if len(data) > MAX_BATCH_BYTES // 4 and len(data.encode("utf-8", "surrogatepass")) > MAX_BATCH_BYTES:
            data = data.encode("utf-8", "surrogatepass")  # (too large: said below)
        else:
            return _parse_text(data, source)
    if len(data) > MAX_BATCH_BYTES:
        raise InputError(f"records file is larger than {MAX_BATCH_BYTES >> 20} MiB", code=codes.RECORDS_FILE_TOO_LARGE,
                         details={"source": source, "bytes": len(data)})
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise _bad(f"line {line} is not valid UTF-8", line, None, source) from None
    return _parse_text(text, source)


def _parse_text(text: str, source: str) -> list[Any]:
    if text.startswith("\ufeff"):
        text = text[1:]
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            doc = loads(text)
        except JSONDecodeError as exc:
            at = text.count("\n", 0, exc.pos) + 1
            excerpt = text.splitlines()[at - 1][:80] if text.splitlines() else ""
            raise _bad(f"not a valid JSON array (line {at}): {exc.msg}", at, excerpt, source) from None
        if not isinstance(doc, list):  # pragma: no cover - '[' always parses to a list
            raise _bad("not a JSON array", 1, stripped[:80], source)
        return doc
    out: list[Any] = []
    for number, row in enumerate(text.split("\n"), start=1):
        if not row.strip():
            continue
        try:
            out.append(loads(row))
        except JSONDecodeError as exc:
            raise _bad(f"line {number} is neither JSON Lines nor part of a JSON array: {exc.msg}",
                       number, row.strip()[:80], source) from None
    if not out:
        raise _bad("records file holds no records", None, None, source)
    return out

"""Checked by mypy (``bin/test``), never run: the verbs keep their real signatures and answer types
through ``Memory``'s verb decorator (issue 22).  With a signature erased to ``(*Any, **Any) -> Any``
each ``assert_type`` fails and each ``type: ignore`` below becomes unused, which ``--strict`` reports."""

from __future__ import annotations

from typing import TYPE_CHECKING, assert_type

if TYPE_CHECKING:
    from nubos_memory.api.memory import Memory
    from nubos_memory.types import AddResult, ForgetResult, GetResult, IngestResult, QueryResult, RebuildResult, Stats


def probe(mem: Memory) -> None:
    assert_type(mem.query("retry policy", k=3, mode="lexical"), QueryResult)
    assert_type(mem.add({"type": "learning", "title": "t"}), AddResult)
    assert_type(mem.get(["a"]), GetResult)
    assert_type(mem.forget(["a"], reason="r"), ForgetResult)
    assert_type(mem.ingest(["docs"]), IngestResult)
    assert_type(mem.rebuild(reembed=True), RebuildResult)
    assert_type(mem.stats(), Stats)
    mem.query("x", limit=3)  # type: ignore[call-arg]
    mem.query(text=3)  # type: ignore[arg-type]

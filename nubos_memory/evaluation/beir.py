"""A BEIR-format dataset: ``corpus.jsonl``, ``queries.jsonl`` and ``qrels/<split>.tsv``."""

from __future__ import annotations

import csv
import hashlib
from pathlib import Path
from typing import Any

from .. import codes
from ..errors import InputError
from ..fsio import JSONDecodeError, loads
from ..records import valid_id


def _jsonl(path: Path) -> list[dict[str, Any]]:
    out = []
    try:
        with open(path, "rb") as f:
            for number, line in enumerate(f, start=1):
                if line.strip():
                    try:
                        out.append(loads(line))
                    except JSONDecodeError:
                        raise InputError(f"{path.name} line {number} is not JSON", code=codes.BEIR_INVALID,
                                         details={"file": str(path), "line": number}) from None
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror}", code=codes.BEIR_INVALID, details={"file": str(path)}) from None
    return out


def load_beir(folder: Path, split: str) -> tuple[list[dict[str, Any]], dict[str, str], dict[str, dict[str, int]]]:
    """Corpus records, query texts and qrels of one split."""
    if not folder.is_dir():
        raise InputError(f"{folder} is not a BEIR folder", code=codes.BEIR_INVALID, details={"path": str(folder)})
    corpus = _jsonl(folder / "corpus.jsonl")
    queries = {str(q.get("_id")): str(q.get("text", "")) for q in _jsonl(folder / "queries.jsonl")}
    qrels: dict[str, dict[str, int]] = {}
    path = folder / "qrels" / f"{split}.tsv"
    try:
        with open(path, newline="", encoding="utf-8") as f:
            for row in csv.DictReader(f, delimiter="\t"):
                qrels.setdefault(row["query-id"], {})[row["corpus-id"]] = int(row["score"])
    except (OSError, KeyError, ValueError) as exc:
        raise InputError(f"cannot read qrels {path}: {exc}", code=codes.BEIR_INVALID, details={"file": str(path)}) from None
    qrels = {q: r for q, r in qrels.items() if q in queries}
    if not corpus or not qrels:
        raise InputError("the dataset has no documents or no judged queries", code=codes.BEIR_INVALID,
                         details={"docs": len(corpus), "judged_queries": len(qrels)})
    return corpus, queries, qrels


def record_id(doc_id: str) -> str:
    """BEIR ids become record ids unchanged when they are valid ones, else a stable hash."""
    return doc_id if valid_id(doc_id) else "beir-" + hashlib.sha256(doc_id.encode()).hexdigest()[:24]

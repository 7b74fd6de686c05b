"""``memory-stats``: counts, model, timestamps and a consistency report.

It reads files only: no model is loaded, no torch imported, and the HNSW
graph's element count is read from its file header.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Any

from .. import codes
from ..errors import EmbeddingError, RebuildRequired, StoreError
from ..records import SCHEMA_VERSION
from ..search.sideweight import weight_of
from ..types import Stats

# Problems that already say why vectors are missing (no separate "index-behind" then).
VECTOR_BLOCKERS = (codes.MEMORY_REBUILD_REQUIRED, codes.MANIFEST_CORRUPT, codes.MANIFEST_UNTRUSTED,
                   codes.INDEX_MISSING, codes.INDEX_CORRUPT, codes.KEYMAP_CORRUPT, codes.VECTORS_CORRUPT)

if TYPE_CHECKING:
    from pathlib import Path

    from ..config import MemoryConfig
    from ..log import LogScan
    from ..types import Manifest
    from .memory import Memory


def hnsw_element_count(path: "Path") -> int | None:
    """``cur_element_count`` from an hnswlib index file header (offsetLevel0, max_elements, count)."""
    try:
        with open(path, "rb") as f:
            header = f.read(24)
    except OSError:
        return None
    if len(header) < 24:
        return None
    return int(struct.unpack("<QQQ", header)[2])


def _read_vectors(mem: "Memory", problems: list[dict[str, Any]]) -> tuple[Any, Any, Any, bool | None]:
    """The stored vectors (manifest, index, labels) and whether their embedder is the configured one;
    what keeps them from use is added to ``problems``."""
    manifest = index = labels = None
    try:
        manifest, index, labels = mem.snap.vectors()
    except StoreError as exc:
        problems.append({"code": exc.code, "message": exc.message})
    fingerprint_match = None
    if manifest is not None:
        try:
            err = mem.vectors.mismatch(manifest, None)
        except EmbeddingError as exc:  # a gateway that does not answer: its model, so the match, is unknown
            problems.append({"code": exc.code, "message": exc.message, "details": exc.details})
            return manifest, index, labels, None
        except Exception as exc:  # noqa: BLE001 - a broken embedder config
            err = RebuildRequired(str(exc))
        fingerprint_match = err is None
        if err is not None:
            problems.append({"code": err.code, "message": err.message, "details": err.details})
    return manifest, index, labels, fingerprint_match


def _check_index(index: Any, keymap_count: int, problems: list[dict[str, Any]]) -> int | None:
    """The HNSW graph's vector count (None without one); its damage, bad stored vectors and a count
    other than the keymap's are added to ``problems``."""
    index_count = None
    if index is not None and index.hnsw_path is not None:
        try:
            index.verify_graph()  # a graph only large memories search is checked here for every memory
            in_graph = hnsw_element_count(index.hnsw_path)
            index_count = None if in_graph is None else in_graph + len(index) - index.base_rows  # + segments' rows
        except StoreError as exc:
            problems.append({"code": exc.code, "message": exc.message})
        except FileNotFoundError:  # deleted by hand, or a writer merged a newer generation meanwhile
            problems.append({"code": codes.INDEX_MISSING,
                             "message": f"the HNSW graph {index.hnsw_path.name} is gone: if a write merged the "
                                        "generation meanwhile, memory-stats again shows the new one; else run "
                                        "memory-rebuild (queries scan the vectors exactly meanwhile)"})
    if index is not None and keymap_count:
        bad = int((~index.usable_rows()).sum())
        if bad:
            problems.append({"code": codes.VECTORS_INVALID, "count": bad,
                             "message": f"{bad} stored vector(s) are non-finite or zero (written by an older version "
                                        "from a broken model); memory-rebuild embeds those records again"})
    if index is not None and index_count is not None and index_count != keymap_count:
        problems.append({"code": codes.INDEX_KEYMAP_MISMATCH,
                         "message": f"index holds {index_count} vectors, keymap {keymap_count}"})
    return index_count


def _log_problems(scan: "LogScan", pending: int, stale: int, problems: list[dict[str, Any]]) -> None:
    """Add the log's problems, then the index's lag behind it (``pending``, ``stale``), to ``problems``."""
    problems += scan.problems()
    if scan.redacted_present:
        problems.append({"code": codes.RECORDS_REDACTED_PRESENT, "count": len(scan.redacted_present),
                         "lines": scan.redacted_present[:50],
                         "message": f"{len(scan.redacted_present)} line(s) hold text that was redacted (a git merge or "
                                    "cherry-pick brought them back); they are never read, and the next write "
                                    "removes them again (or run memory-redact with their ids)"})
    if pending and not any(p["code"] in VECTOR_BLOCKERS for p in problems):
        problems.append({"code": codes.INDEX_BEHIND, "count": pending,
                         "message": f"{pending} live record(s) have no vector yet; the next write or query "
                                    "embeds them, or run memory-rebuild"})
    if stale:
        problems.append({"code": codes.INDEX_STALE, "count": stale,
                         "message": f"the index holds {stale} vector(s) of ids the log does not hold (a hand edit); "
                                    "memory-rebuild drops them"})


def _retired_reasons(scan: "LogScan") -> dict[str, int]:
    """How many retired records each reason retired."""
    reasons: dict[str, int] = {}
    for info in scan.dead.values():
        reasons[info["reason"]] = reasons.get(info["reason"], 0) + 1
    return reasons


def side_weight(cfg: "MemoryConfig", manifest: "Manifest | None") -> dict[str, Any]:
    """z fusion's lexical weight: the setting, the weight a query without ``alpha`` uses, and the
    manifest's estimate (``search/sideweight.py``; None before the first one)."""
    estimate = (manifest or {}).get("side_weight")
    usable = weight_of(manifest) if cfg.side_weights == "auto" else None
    return {"setting": cfg.side_weights, "weight": usable["weight"] if usable is not None else cfg.alpha,
            "estimate": estimate}


def pieces_status(manifest: "Manifest | None") -> dict[str, Any] | None:
    """Best-piece scoring of records longer than the model's window (``index/vectors.py``): the
    manifest's rule and how many piece vectors it keeps, and HyPE's question vectors; None before any
    vector generation."""
    if manifest is None:
        return None
    rule, hype = manifest.get("pieces"), manifest.get("questions")
    asked = {"questions": dict(hype) if isinstance(hype, dict) else None}  # HyPE's question vectors
    if isinstance(rule, dict):
        from ..index.vectors import PIECE_RULE

        if rule.get("rule") != PIECE_RULE:  # (records written since are cut by today's rule)
            return {**rule, "why": f"long records written before {PIECE_RULE} keep their pieces until "
                                   "memory-rebuild", **asked}
        return {**rule, **asked}
    return {"rule": None, "rows": 0, "why": "a vector generation from before best-piece scoring: long records "
                                            "score by their pooled vector until memory-rebuild", **asked}


def domain_counts(mem: "Memory") -> tuple[dict[str, int], int]:
    """Live records (not expired) by domain, most first then by name, and how many have none."""
    counts = mem.snap.domains.counts(mem.snap.alive)
    without = counts.pop(None, 0)
    named = [(d, n) for d, n in counts.items() if d is not None]
    return dict(sorted(named, key=lambda kv: (-kv[1], kv[0]))), without


def collect_stats(mem: "Memory") -> Stats:
    cfg = mem.config
    scan = mem.scan()
    problems: list[dict[str, Any]] = []
    manifest, index, labels, fingerprint_match = _read_vectors(mem, problems)
    live_ids = scan.ids()
    keymap_ids = set(index.ids) if index is not None else set()
    alive = mem.snap.alive
    pending = scan.live_count if labels is None else int(((labels < 0) & alive).sum())
    retired_ids = {scan.records[p]["id"] for p in scan.dead} - live_ids
    unknown = keymap_ids - live_ids
    retired_in_index = len(unknown & retired_ids)  # expected after forget/supersede; rebuild drops them
    stale = len(unknown) - retired_in_index  # vectors of ids the log does not hold at all (a hand edit)
    keymap_count = len(index) if index is not None else 0
    index_count = _check_index(index, keymap_count, problems)
    _log_problems(scan, pending, stale, problems)
    embedding = (manifest or {}).get("embedding") or {}
    reasons = _retired_reasons(scan)
    expired = len(mem.snap.expired_live())  # past their valid_until: not live, yet no retirement in the log
    out: Stats = {
        "count": scan.live_count - expired,
        "retired": {"total": len(scan.dead), "by_reason": reasons, "redacted": len(scan.redacted),
                    "expired": expired},
        "dim": embedding.get("dim") if manifest else mem.embedder.known_dim(),
        "model": embedding.get("model") or cfg.model if manifest else cfg.model,
        "provider": embedding.get("provider") or cfg.provider,
        "configured_model": cfg.model,
        "runtime": mem.embedder.runtime_info(),
        "schema_version": SCHEMA_VERSION,
        "alpha": cfg.alpha,
        "threshold": cfg.threshold,
        "fusion": cfg.fusion,
        "side_weight": side_weight(cfg, manifest),
        "pieces": pieces_status(manifest),
        "created_at": (manifest or {}).get("created_at"),
        "rebuilt_at": (manifest or {}).get("rebuilt_at"),
        "updated_at": (manifest or {}).get("updated_at"),
        "hnsw": (manifest or {}).get("hnsw"),
        **({"candidates": (manifest or {})["candidates"]} if "candidates" in (manifest or {}) else {}),
        "fingerprint": embedding.get("fingerprint"),
        "consistency": {
            "records": scan.live_count - expired,
            "keymap": keymap_count,
            "index": index_count if index_count is not None else (0 if manifest and not keymap_count else None),
            # rows appended since the last merge, in small files of their own (store/cache.py)
            "segments": {"count": len((manifest or {}).get("segments") or []),
                         "rows": len(index) - index.base_rows if index is not None else 0},
            "pending": pending,
            "stale": stale,
            "retired_in_index": retired_in_index,
            "corrupt_lines": scan.corrupt[:50],
            "corrupt_count": len(scan.corrupt),
            "duplicate_ids": scan.duplicates[:50],
            "partial_tail": scan.partial_tail,
            "damaged_groups": scan.damaged_groups[:50],
            "rolled_back": scan.rolled_back[:50],
            "fingerprint_match": fingerprint_match,
            "consistent": not problems and pending == 0 and stale == 0,
            "problems": problems,
        },
        "bytes": scan.size,
    }
    out["domains"], out["without_domain"] = domain_counts(mem)
    from .hype import describe as generator_status

    out["generator"] = generator_status(mem)  # off, or its settings and breaker; HyPE's counts from the log
    from .. import trust, userdirs

    trust.key()  # resolves the config folder, so user_folders below says where the key is (or why none is)
    out["user_folders"] = userdirs.describe()
    problems += [n for n in trust.notices() + userdirs.notices() if n not in problems]
    out["consistency"]["consistent"] = out["consistency"]["consistent"] and not problems
    where = {**mem.store.describe(), **mem.store.status()}
    out["backend"] = str(where.get("backend"))
    out["store"] = where
    models = where.get("models") or {}
    active = sorted(fp for fp, m in models.items() if m.get("recent"))
    if len(active) > 1:
        problems.append({"code": codes.TEAM_MODELS_DIFFER, "fingerprints": active,
                         "message": f"machines of this team memory embed with {len(active)} different models (vectors "
                                    f"under fingerprints {', '.join(a[:12] for a in active)} in the last week); each "
                                    "machine searches only its own model's vectors. Agree on memory.model (and "
                                    "provider) in the project's config, then memory-rebuild"})
        out["consistency"]["consistent"] = False
    if "memory_dir" in where:
        out["memory_dir"] = str(where["memory_dir"])
    return out

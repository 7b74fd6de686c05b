"""``memory-doctor``: one report of where this memory is and what is wrong with it, with the fixes.

Where the memory is and why (the project root, how it was found, the memory folder, the backend),
where in git the project is, whether the index is current and which runtime embeds, the anchored
records by freshness, and every problem ``memory-stats`` finds with the one command that fixes it.
Like ``memory-stats`` it reads files only: the model is never loaded.  :func:`render` writes the
report for a person (the default); ``--format json`` gives it as data.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import codes
from ..config import ROOT_ENV, STATE_DIR
from .anchors import FRESHNESS, verify_anchors
from .stats import VECTOR_BLOCKERS

if TYPE_CHECKING:
    from .memory import Memory

REBUILD = "np-tools memory-rebuild"
# The one command that fixes each problem memory-stats reports (None: its message says what to do).
FIXES: dict[str, str] = {
    **dict.fromkeys(VECTOR_BLOCKERS, REBUILD),
    codes.INDEX_BEHIND: REBUILD,
    codes.INDEX_STALE: REBUILD,
    codes.INDEX_KEYMAP_MISMATCH: REBUILD,
    codes.VECTORS_INVALID: REBUILD,
    codes.TEAM_MODELS_DIFFER: REBUILD,
    codes.RECORDS_CORRUPT_LINE: "np-tools memory-compact",
    codes.RECORDS_DUPLICATE_ID: "np-tools memory-compact",
    codes.RECORDS_GROUP_DAMAGED: "np-tools memory-compact",
    codes.RECORDS_STRAY_OP: "np-tools memory-compact",
    codes.RECORDS_UNFINISHED_WRITE: "np-tools memory-rebuild",
    codes.RECORDS_REDACTED_PRESENT: "np-tools memory-redact ID [ID ...]",
}
FOUND_BY = {
    "flag": "--root",
    "env": f"${ROOT_ENV}",
    "marker": f"the nearest folder upward with {STATE_DIR}/",
    "cwd": f"the working directory (no {STATE_DIR}/ found upward)",
}


def found_by(root: Path, flag: str | None = None) -> str:
    """How the project root was found (``config.find_root``'s order): ``flag``, ``env``, ``marker``, ``cwd``."""
    if flag is not None:
        return "flag"
    if os.environ.get(ROOT_ENV):
        return "env"
    return "marker" if (root / STATE_DIR).is_dir() else "cwd"


def diagnose(mem: "Memory", how: str) -> dict[str, Any]:
    """The report as data (see the module docstring)."""
    project = mem.project
    report: dict[str, Any] = {
        "root": str(project.root), "found_by": how, "found_by_text": FOUND_BY.get(how, how),
        "config": str(project.config_path) if project.config_found else None,
        "enabled": mem.config.enabled, "memory_dir": str(project.memory_dir), "backend": mem.config.backend,
        "git": mem.git.stamp(), "problems": [],
    }
    if not mem.config.enabled:
        report["problems"].append({"code": codes.MEMORY_DISABLED, "message": "memory is disabled for this project",
                                   "fix": "np-tools memory-init"})
        report["healthy"] = False
        return report
    stats = mem.stats()
    cons = stats["consistency"]
    report["backend"] = stats.get("backend", report["backend"])
    report["memory_dir"] = stats.get("memory_dir", report["memory_dir"])
    index_problems = [p for p in cons["problems"] if FIXES.get(p["code"]) == REBUILD]
    report["index"] = {"current": not index_problems and cons["pending"] == 0 and cons["stale"] == 0,
                       "records": cons["records"], "indexed": cons["keymap"], "pending": cons["pending"],
                       "stale": cons["stale"], "model": stats["model"],
                       "fingerprint_match": cons["fingerprint_match"]}
    report["runtime"] = stats["runtime"]
    anchors = verify_anchors(mem.scan(), mem.anchors, listed=0)
    report["anchors"] = {"anchored": anchors["anchored"], **anchors["freshness"]}
    report["problems"] = [{"code": p["code"], "message": p.get("message", ""), "fix": FIXES.get(p["code"])}
                          for p in cons["problems"]]
    if anchors["freshness"]["moved"]:
        report["anchors"]["fix"] = "np-tools memory-verify --update"  # records where moved code is now
    elif anchors["freshness"]["drifted"] or anchors["freshness"]["missing"]:
        report["anchors"]["fix"] = "np-tools memory-verify"  # lists the records whose code changed or went
    report["healthy"] = not report["problems"] and report["index"]["current"]
    return report


def render(report: dict[str, Any]) -> str:
    """The report for a person: one short section per question, a fix under each problem."""
    lines = ["nubos-memory doctor", "",
             f"project root  {report['root']}", f"  found by    {report['found_by_text']}",
             f"memory        {report['memory_dir']} ({report['backend']}"
             f"{'' if report['enabled'] else ', disabled'})"]
    git = report.get("git")
    if git is None:
        lines.append("git           not a git repository (records carry no git stamp)")
    else:
        branch = git["branch"] or "(detached HEAD)"
        lines.append(f"git           {branch} at {(git['commit'] or '(no commit yet)')[:12]}, "
                     f"worktree {git['worktree']}")
    index = report.get("index")
    if index is not None:
        state = "current" if index["current"] else f"behind ({index['pending']} pending, {index['stale']} stale)"
        lines.append(f"index         {state}: {index['indexed']} of {index['records']} record(s) indexed, "
                     f"model {index['model']}")
    runtime = report.get("runtime")
    if runtime:
        lines.append(f"embeds with   {_runtime_text(runtime)}")
    anchors = report.get("anchors")
    if anchors is not None:
        counts = ", ".join(f"{anchors[f]} {f}" for f in FRESHNESS)
        lines.append(f"anchors       {anchors['anchored']} anchored record(s): {counts}")
        if anchors.get("fix"):
            lines.append(f"  fix         {anchors['fix']}")
    lines.append("")
    if not report["problems"]:
        lines.append("no problems found")
    for p in report["problems"]:
        lines.append(f"problem       {p['code']}: {p['message']}")
        if p.get("fix"):
            lines.append(f"  fix         {p['fix']}")
    return "\n".join(lines) + "\n"


def _runtime_text(runtime: Any) -> str:
    if not isinstance(runtime, dict):
        return str(runtime)
    shown = [f"{k} {v}" for k, v in runtime.items() if v not in (None, "", [], {}) and not isinstance(v, (dict, list))]
    return ", ".join(shown) or "unknown"

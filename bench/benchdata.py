"""Where the benchmarks find their datasets (shared by the bench scripts; not a benchmark itself).

A dataset folder is taken from ``--datasets`` when a script is given it, else from the environment
variable ``NUBOS_MEMORY_DATASETS``, else ``../shared/datasets`` beside the repository (the layout
the README's commands assume). Inside it: ``scifact/`` and ``locomo-dev/conv-*`` (BEIR format).
A missing dataset is a one-line message and exit code 2, not a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ENV = "NUBOS_MEMORY_DATASETS"
DEFAULT = REPO.parent / "shared" / "datasets"
MISSING_EXIT = 2


def add_flag(ap: argparse.ArgumentParser) -> None:
    """``--datasets FOLDER``: the folder holding the datasets (default $NUBOS_MEMORY_DATASETS, else ../shared/datasets)."""
    ap.add_argument("--datasets", type=Path, default=None,
                    help=f"folder holding scifact/ and locomo-dev/ (default: ${ENV}, else ../shared/datasets "
                         "beside the repository)")


def root(flag: Path | None = None) -> Path:
    """The datasets folder: the flag, else $NUBOS_MEMORY_DATASETS, else ../shared/datasets beside the repository."""
    if flag is not None:
        return flag
    env = os.environ.get(ENV)
    return Path(env) if env else DEFAULT


def missing(what: str, path: Path) -> None:
    """Say which dataset is missing and how to point at it, then exit with code 2."""
    print(f"{what}: {path} not found; give --datasets FOLDER or set {ENV} (default: ../shared/datasets beside "
          "the repository)", file=sys.stderr)
    raise SystemExit(MISSING_EXIT)


def scifact(flag: Path | None = None) -> Path:
    """The SciFact BEIR folder (corpus.jsonl, queries.jsonl, qrels/), or exit 2 when it is not there."""
    folder = root(flag) / "scifact"
    for name in ("corpus.jsonl", "queries.jsonl"):
        if not (folder / name).is_file():
            missing("SciFact", folder / name)
    return folder


def locomo(flag: Path | None = None) -> list[Path]:
    """LoCoMo dev's conversations (one BEIR folder each), or exit 2 when there are none."""
    folder = root(flag) / "locomo-dev"
    conversations = sorted(folder.glob("conv-*"))
    if not conversations:
        missing("LoCoMo dev", folder / "conv-*")
    return conversations

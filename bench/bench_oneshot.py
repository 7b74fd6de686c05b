"""One-shot CLI calls on a large memory (issue 27): this checkout against a baseline checkout, same run.

Each call is a fresh ``python -m nubos_memory`` process (process start included), as an agent's tool
call is: the one-shot calls of ``bench_flat.py`` (hybrid and lexical query, stats, add), on a memory of
``--records`` synthetic notes built the way that bench builds one (hash embedder, 384 dimensions: the
figures are the store's and the search's, not the model's) unless ``--memory`` names one.  The two
checkouts run alternately, ``--runs`` times each; the table gives medians.  ``python -c pass`` is the floor.

Run: .venv/bin/python bench/bench_oneshot.py [--records 100000] [--memory DIR] [--baseline CHECKOUT] [--runs 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_flat import ONESHOT, REPO, bare, build, cli


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--memory", type=Path, help="an existing memory to use (else one is built in a temp folder)")
    ap.add_argument("--baseline", type=Path, help="another checkout of nubos-memory to compare with")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    root = args.memory or Path(tempfile.mkdtemp(prefix="bench-oneshot-")) / "memory"
    if args.memory is None:
        build(root, args.records)
    codes = {"this": REPO, **({"baseline": args.baseline} if args.baseline else {})}
    floor = statistics.median(bare() for _ in range(args.runs))
    rows = []
    for name, argv in ONESHOT.items():
        took: dict[str, list[float]] = {k: [] for k in codes}
        for _ in range(args.runs):
            for label, code in codes.items():
                took[label].append(cli(root, argv, code=code))
        rows.append((name, {k: statistics.median(v) for k, v in took.items()}))
    print(f"python -c pass: {floor:.0f} ms")
    print("| call | " + " | ".join(f"{k} (ms)" for k in codes) + " |")
    print("| --- | " + " | ".join("---" for _ in codes) + " |")
    for name, med in rows:
        print(f"| {name} | " + " | ".join(f"{med[k]:.0f}" for k in codes) + " |")


if __name__ == "__main__":
    main()

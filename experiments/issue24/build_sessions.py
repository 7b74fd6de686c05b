"""Session-level LoCoMo dev analog (issue 24): one record per session of each conversation.

Reads ../shared/datasets/locomo-dev/conv-0N (turn-level BEIR: `_id` "D<session>:<turn>", title =
speaker, text = the turn) and writes, per conversation, a BEIR folder whose corpus holds one
document per session: `_id` "S<session>", title "<speaker A> and <speaker B>, session <n>", text =
the session's turns in log order, one per line as "<speaker>: <text>" (how a harvested session note
or handoff would be stored).  Queries are copied unchanged; qrels map each question to every session
holding one of its evidence turns (relevance 1).

    .venv/bin/python experiments/issue24/build_sessions.py [OUT]   # default /tmp/issue24/sessions
"""

from __future__ import annotations

import json
import sys
from collections import OrderedDict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SRC = REPO.parent / "shared" / "datasets" / "locomo-dev"
OUT = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("/tmp/issue24/sessions")


def session_of(doc_id: str) -> int:
    return int(doc_id.split(":", 1)[0].lstrip("D"))


def build(conv: Path, out: Path) -> dict:
    turns = [json.loads(line) for line in (conv / "corpus.jsonl").read_text(encoding="utf-8").splitlines() if line]
    sessions: "OrderedDict[int, list[dict]]" = OrderedDict()
    for t in turns:
        sessions.setdefault(session_of(t["_id"]), []).append(t)
    speakers = list(OrderedDict.fromkeys(t["title"] for t in turns))
    pair = " and ".join(speakers[:2])
    out.mkdir(parents=True, exist_ok=True)
    (out / "qrels").mkdir(exist_ok=True)
    with open(out / "corpus.jsonl", "w", encoding="utf-8") as f:
        for s, ts in sorted(sessions.items()):
            text = "\n".join(f"{t['title']}: {t['text']}" for t in ts)
            f.write(json.dumps({"_id": f"S{s}", "title": f"{pair}, session {s}", "text": text}) + "\n")
    (out / "queries.jsonl").write_text((conv / "queries.jsonl").read_text(encoding="utf-8"), encoding="utf-8")
    rows = [line.split("\t") for line in (conv / "qrels" / "test.tsv").read_text().splitlines()[1:] if line]
    rel: "OrderedDict[str, set]" = OrderedDict()
    for q, d, _ in rows:
        rel.setdefault(q, set()).add(session_of(d))
    with open(out / "qrels" / "test.tsv", "w") as f:
        f.write("query-id\tcorpus-id\tscore\n")
        for q, ss in rel.items():
            for s in sorted(ss):
                f.write(f"{q}\tS{s}\t1\n")
    words = [len(" ".join(t["text"] for t in ts).split()) for ts in sessions.values()]
    multi = sum(len(ss) > 1 for ss in rel.values())
    return {"conv": conv.name, "sessions": len(sessions), "questions": len(rel), "multi_session_q": multi,
            "words_per_session_mean": round(sum(words) / len(words)), "words_min": min(words), "words_max": max(words)}


if __name__ == "__main__":
    for i in range(5):
        print(json.dumps(build(SRC / f"conv-0{i}", OUT / f"conv-0{i}")))

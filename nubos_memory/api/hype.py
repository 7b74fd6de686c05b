"""HyPE: questions each record answers, generated once and kept in the log (``memory-hype``; adr/0019).

When ``memory.generator`` is on and ``questions`` is above 0, every write that adds records starts
:func:`kick`: a detached ``memory-hype`` process (one per project at a time), so the write answers at
once and the questions follow.  :func:`fill` asks the generator for the questions of each live record
that has none yet (outside the write lock: the model is slow), then, under the lock, appends one
``questions`` op per record still live and still without questions (``log.questions_op``), in changes
of :data:`BATCH`, so a long run keeps what it made.  The questions are the log's state from then on
(``LogScan.questions``, ``LogScan.question_map``): ``memory-rebuild`` and every other reader get them
by reading the log, never by asking the model again.  A generator that fails or whose breaker is open
stops the run; its records keep waiting (``memory-stats`` ``generator.hype.waiting``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import codes
from ..errors import ConfigError, EmbeddingError
from ..log import LogScan, questions_op, same_content
from .background import only_worker, start
from .writepath import settled_scan

if TYPE_CHECKING:
    from ..config import MemoryConfig
    from ..generate import Generator
    from ..types import Record
    from .memory import Memory

BATCH = 16  # records whose questions are appended as one change
VERB = "memory-hype"


def waiting(scan: LogScan) -> list[int]:
    """Positions of the live records that have no questions yet, in log order."""
    return [p for p in range(len(scan.records)) if p not in scan.dead and p not in scan.questions]


def counts(scan: LogScan, config: "MemoryConfig") -> dict[str, Any]:
    """``memory-stats`` ``generator.hype``: live records with questions, with an empty answer, and waiting
    (0 while HyPE is off: nothing waits for a generator that is not asked)."""
    live = [q for p, q in scan.questions.items() if p not in scan.dead]
    on = config.generator.enabled and config.generator.questions > 0
    return {"on": on, "questions_per_record": config.generator.questions, "background": config.generator.background,
            "with_questions": sum(1 for q in live if q["questions"]),
            "without_questions": sum(1 for q in live if not q["questions"]),
            "waiting": len(waiting(scan)) if on else 0}


def describe(mem: "Memory") -> dict[str, Any]:
    """``memory-stats`` ``generator``: off, or its settings and breaker (``Generator.describe``: never the
    key), and HyPE's counts from the log.  Never calls the generator."""
    out: dict[str, Any] = {"enabled": mem.config.generator.enabled}
    if mem.config.generator.enabled:
        from ..generate import make_generator  # (its HTTP client: only when there is a generator)

        try:
            out.update(make_generator(mem.config).describe())
        except ConfigError as exc:
            out["error"] = exc.to_dict()
    out["hype"] = counts(mem.scan(), mem.config)
    return out


def fill(mem: "Memory", *, limit: int | None = None) -> dict[str, Any]:
    """Generate the questions of up to ``limit`` waiting records (all when None) and append them
    (``memory-hype``; see module docstring)."""
    from ..generate import make_generator
    from ..generate.tasks import questions

    mem.require_enabled()
    per_record = mem.config.generator.questions
    gen = make_generator(mem.config)
    if per_record == 0:
        raise ConfigError("HyPE is off (memory.generator.questions is 0)", code=codes.GENERATOR_OFF,
                          details={"key": "memory.generator.questions"})
    done: list[str] = []
    degraded: dict[str, Any] | None = None
    with only_worker("hype", mem.project.root) as alone:
        if not alone:
            return {"busy": True, "generated": [], "questions": 0, "waiting": len(waiting(mem.scan())),
                    "requests": 0, "degraded": None}
        while degraded is None and (limit is None or len(done) < limit):
            scan = mem.scan()
            todo = waiting(scan)[: BATCH if limit is None else min(BATCH, limit - len(done))]
            if not todo:
                break
            made: list[tuple["Record", list[str]]] = []
            for pos in todo:
                rec = scan.records[pos]
                try:
                    made.append((rec, questions(gen, rec["title"], rec.get("body") or "", per_record)))
                except EmbeddingError as exc:
                    degraded = exc.to_dict()
                    break
            written = _write(mem, made, gen)
            done += written
            if not written and degraded is None:
                break  # every record of the batch changed meanwhile: read the log again next run
    scan = mem.scan()
    if done:  # the questions' vectors (a write's sync embeds them: index/vectors.py scores by them)
        mem.vectors.sync(None, cap=0, blocking=True, verb=VERB)
    return {"busy": False, "generated": done,
            "questions": sum(len(scan.questions_of(rid) or []) for rid in done),
            "waiting": len(waiting(scan)), "requests": gen.requests, "degraded": degraded}


def _write(mem: "Memory", made: "list[tuple[Record, list[str]]]", gen: "Generator") -> list[str]:
    """Under the lock: a questions op per record that is still the live version of its id and still has
    none; the ids written."""
    if not made:
        return []
    model = gen.served or gen.model
    with mem.store.lock(VERB):
        scan, _ = settled_scan(mem.snap, mem.store)
        ops = []
        for rec, items in made:
            pos = scan.live(rec["id"])
            if pos is not None and pos not in scan.questions and same_content(scan.records[pos], rec):
                ops.append(questions_op(rec["id"], items, model))
        if ops:
            mem.store.append([], ops)
    return [op["id"] for op in ops]


def kept_ops(scan: LogScan) -> list[dict[str, Any]]:
    """The questions ops of the live records (``memory-compact`` appends them to the rewritten log)."""
    return [{"op": "questions", "id": scan.records[p]["id"], **{k: q[k] for k in ("questions", "model", "at")}}
            for p, q in sorted(scan.questions.items()) if p not in scan.dead]


def kick(mem: "Memory") -> bool:
    """After a write that added records: start a detached ``memory-hype`` for this project when HyPE runs in
    the background (``background.py``); whether one was started."""
    settings = mem.config.generator
    if not (settings.enabled and settings.questions > 0 and settings.background):
        return False
    return start(VERB, mem.project.root)

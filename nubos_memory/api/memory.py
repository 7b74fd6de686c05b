"""The library object: everything a verb does is one method of :class:`Memory`.

Data flows one way: records (the store's log) → embeddings → derived state
(vector index, lexical postings) → query.  The parts, each in its own module:

* ``store`` (``store/base.py``): where the log, the write lock and the
  derived state live (``store/``: the project's folder, or a team database);
* ``snap`` (``search/snapshot.py``): the log and its derived data as held in
  this process, refreshed incrementally;
* ``vectors`` (``vectorsync.py``): embedding what lacks a vector, committing it;
* ``writes`` (``writepath.py``): the one write path, :meth:`Memory.apply`.

The verbs validate their arguments, call these, and return plain JSON-able
documents (``types.py``).
"""

from __future__ import annotations

import functools
import os
import stat
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar, cast

from .. import codes, trust, userdirs
from ..config import Project, load_project, read_config_file, validate_section
from ..embed import Embedder, make_embedder
from ..errors import DisabledError, InputError, NubosMemoryError, StoreError, UsageError
from ..fsio import DIR_MODE, atomic_write_bytes, dumps, read_regular
from ..limits import MAX_ECHO, MAX_GET, MAX_PHASE, MAX_QUERY_CHARS, MAX_REASON
from ..log import LogScan, anchor_op, hot_record, read, redact_op
from ..params import CONTEXT_PARAMS, QUERY_PARAMS, WRITE_SCOPE, check
from ..progress import Reporter, stage
from ..records import (
    SCHEMA_VERSION,
    content_hash,
    embed_text,
    epoch_to_iso,
    iso_to_epoch,
    now_iso,
    one_line,
    valid_id,
    validate_batch,
)
from ..search.snapshot import Snapshot
from ..store import open_store, parse_duration, scope
from . import background, usermemory
from .anchors import AnchorCheck, stamp_anchors, uncommitted_moves, verify_anchors, weigh_freshness
from .gitstate import BranchFilter, GitState, mark_merged
from .hype import kept_ops, kick
from .turn import Handoffs
from .vectorsync import VectorSync
from .writepath import WritePath, history, settled_scan

if TYPE_CHECKING:
    import numpy as np

    from ..progress import Progress
    from ..search.snapshot import VectorState
    from ..search.syntax import Parsed
    from ..store.base import Store
    from ..types import (
        AddResult,
        ContextResult,
        ForgetResult,
        GetResult,
        GotRecord,
        IngestResult,
        QueryResult,
        RebuildResult,
        Record,
        Stats,
        WriteResult,
    )


SETTLE_VERB = "memory-settle"
P = ParamSpec("P")
R = TypeVar("R")


def _answer(method: "Callable[Concatenate[Memory, P], R]") -> "Callable[Concatenate[Memory, P], R]":
    """A verb: its answer carries the store's notices (e.g. a folder others can write) and those about
    this user's folders and signing key (``userdirs.py``, ``trust.py``) in ``warnings``.  The verb keeps
    its signature and its answer's type (``reveal_type(Memory.query)``)."""
    @functools.wraps(method)
    def verb(self: "Memory", /, *args: P.args, **kwargs: P.kwargs) -> R:
        result = method(self, *args, **kwargs)
        notices = [*self.notices, *userdirs.notices(), *trust.notices()]
        if isinstance(result, dict) and notices:
            warnings = result.setdefault("warnings", [])
            have = {(w.get("code"), w.get("path")) for w in warnings}
            warnings.extend(n for n in notices if (n["code"], n.get("path")) not in have)
        return result
    return verb


def _check_ids(ids: list[Any]) -> None:
    """Refuse anything that is not a record id, echoing at most a bounded part of it."""
    bad = [str(i)[:MAX_ECHO] for i in ids if not valid_id(i)]
    if bad:
        raise InputError(f"not a record id: {bad[0]!r}", code=codes.RECORD_INVALID_ID, details={"ids": bad[:20]})


def _check_retirement(ids: list[str], reason: Any, verb: str) -> None:
    """The arguments of ``forget`` and ``redact``: at least one well-formed id, and a one-line reason."""
    if not ids:
        raise UsageError(f"give at least one record id to {verb}")
    _check_ids(ids)
    if not one_line(reason, MAX_REASON):
        raise InputError(f"a reason is 1-{MAX_REASON} characters on one line", code=codes.FORGET_INVALID_REASON,
                         details={"length": len(reason) if isinstance(reason, str) else None})


def _query_text(text: str | None) -> str:
    """A query's text, refused when missing, empty or too long."""
    if text is None:
        raise UsageError("query text is required (--text or positional)")
    if not isinstance(text, str) or not text.strip():
        raise InputError("query text is empty", code=codes.MEMORY_EMPTY_QUERY)
    if len(text) > MAX_QUERY_CHARS:
        raise InputError(f"query text is longer than {MAX_QUERY_CHARS} characters", code=codes.QUERY_TOO_LONG,
                         details={"length": len(text), "limit": MAX_QUERY_CHARS})
    return text

class Memory:
    """One project's memory.  ``Memory.open()`` finds the project like the CLI does."""

    def __init__(self, project: Project, embedder: Embedder | None = None, store: "Store | None" = None, *,
                 user: bool = True):
        self.project = project
        self.name = "project"  # which memory this is in answers (hits' ``memory``): project, or user
        self.user_enabled = user  # reads may cover the user-level memory too (``usermemory.py``); off: never
        self._user: Memory | None = None
        self.config = project.config
        self.store: Store = store if store is not None else open_store(project)
        self.snap = Snapshot(self.store)
        self._embedder = embedder
        self.vectors = VectorSync(self.snap, self.store, lambda: self.embedder, self.config)
        self._settle_later = False  # a due estimate goes to a background memory-settle (leave_to_background)
        self._settle_root = project.root
        self.git = GitState(project.root)  # where in git records are written (asked at most once a second)
        self.writes = WritePath(self.snap, self.store, self.vectors, self.config, self.git)
        self._branch = BranchFilter(self.git)
        self.notices: list[dict[str, Any]] = []
        self.anchors = AnchorCheck(project.root, self.git)  # cited files read once per identity (size, mtime)
        self.handoffs = Handoffs()  # the handoff records, newest first, for memory-context (turn.py)
        self._settle_tried: tuple[Any, int] | None = None

    @classmethod
    def open(cls, root: str | os.PathLike[str] | None = None, *, embedder: Embedder | None = None,
             user: bool = True) -> "Memory":
        return cls(load_project(root), embedder, user=user)

    def for_scope(self, scope: str | None, *, create: bool = False) -> "Memory":
        """The memory a verb given ``scope`` works on: this one (None, ``project``), or the user-level memory
        (``user``; ``usermemory.py``), made when ``create`` (a write) and it does not exist yet."""
        check(WRITE_SCOPE, scope)
        if scope != "user" or self.name == "user":
            return self
        from .usermemory import open_user, user_root

        # (a warm process keeps the user memory it opened only while its folder is still the one found, and
        # still safe: one made writable by others since is refused here, as a new process would refuse it)
        if self._user is not None and user_root(write=create, strict=True) != self._user.project.root:
            self._user = None
        if self._user is None:
            self._user = open_user(self, create=create)
            if self._settle_later:
                self._user.leave_to_background(self.project.root)
        return self._user

    # -- plumbing ------------------------------------------------------------------
    @property
    def embedder(self) -> Embedder:
        """The configured embedder (constructed on first use; the model loads on first embed)."""
        if self._embedder is None:
            self._embedder = make_embedder(self.config.provider, self.config.model, self.config.runtime,
                                           self.config.device, self.config)
        return self._embedder

    def use_embedder(self, embedder: Embedder | None) -> None:
        """Embed with ``embedder`` from now on (None: the configured one, made on first use)."""
        self._embedder = embedder

    def loaded_embedder(self) -> Embedder | None:
        """The embedder if one was made already (a warm process keeps its loaded model)."""
        return self._embedder

    def require_enabled(self) -> None:
        """Raise ``memory-disabled`` unless memory is on; refuse a store that could lead elsewhere."""
        if not self.config.enabled:
            raise DisabledError(
                "memory is disabled for this project (memory.enabled is false); run memory-init to enable it",
                details={"root": str(self.project.root), "config": str(self.project.config_path)},
            )
        self.notices = self.store.check()

    def scan(self) -> LogScan:
        """Read the log (tolerating damage; see ``log.py``), incrementally.

        If the log ends in an unfinished write and no writer holds the lock right now, that
        write is not in progress: it is settled here as the next writer would, so a crash's or a
        hand edit's leftovers never hide records until the next write.
        """
        scan = self.snap.refresh()
        if scan.partial_tail is not None and (scan.cursor, scan.size) != self._settle_tried:
            self._settle_tried = (scan.cursor, scan.size)
            try:
                with self.store.try_lock("settle-log") as got:
                    if got:
                        scan, _ = settled_scan(self.snap, self.store)
            except (OSError, NubosMemoryError):
                pass  # a read-only memory: the tail stays unapplied and reported
        return scan

    def apply(self, records: "Sequence[Record]" = (), *, forget: Sequence[str] = (), reason: str = "forgotten",
              reasons: dict[str, str] | None = None, force: bool = False, verb: str = "memory-index",
              progress: "Progress | None" = None) -> "WriteResult":
        """The one write path (``writepath.py``): add validated records and retire ids as one change."""
        self.require_enabled()
        result = self.writes.apply(records, forget=forget, reason=reason, reasons=reasons, force=force, verb=verb,
                                   progress=progress)
        if result["added"] and self.config.generator.enabled:  # HyPE: the new records' questions follow
            kick(self)
        self._settle_in_background()
        return result

    def _settle_in_background(self) -> None:
        """After a write: the side-weight estimate it made due, left to a detached ``memory-settle``
        (``leave_to_background``), unless one runs already (it makes what is due when it has committed).
        Never fails the write, which is committed: a worker that cannot start costs the estimate's wait."""
        if not (self.vectors.estimate_left and self._settle_later):
            return
        self.vectors.estimate_left = False
        scope = ["--scope", "user"] if self.name == usermemory.USER else []
        try:
            if not background.busy("settle", self.project.root):  # (the worker's lock is its memory's)
                background.start(SETTLE_VERB, self._settle_root, scope)
        except OSError:
            pass

    def sync_vectors(self, allowed: "np.ndarray | None", *, budget_s: float | None = None) -> "VectorState":
        """For a query: the vector layer, with what it lacks among ``allowed`` embedded (within a budget)."""
        return self.vectors.sync(allowed, cap=self.config.max_pending_embed, blocking=False, verb="memory-query",
                                 budget_s=budget_s)

    # -- verbs -----------------------------------------------------------------------
    @_answer
    def init(self) -> dict[str, Any]:
        """Create the memory folder and enable memory in the project config."""
        self.notices = self.store.check()
        state_dir = self.project.state_dir
        created = []
        for folder in (state_dir, self.project.memory_dir):
            if not folder.exists():
                created.append(str(folder.relative_to(self.project.root)))
        state_dir.mkdir(mode=DIR_MODE, exist_ok=True)
        doc = read_config_file(self.project.config_path) or {}
        section = dict(doc.get("memory") or {})
        section["enabled"] = True
        doc["memory"] = section
        # Validate what we are about to write, so init never leaves a config that later verbs reject.
        config = validate_section(section, self.project.root)
        atomic_write_bytes(self.project.config_path, dumps(doc, pretty=True) + b"\n")
        self.config = config
        self.store.prepare()
        self.store.usage.start()
        return {
            "initialized": True,
            "root": str(self.project.root),
            "memory_dir": str(self.project.memory_dir),
            "config_path": str(self.project.config_path),
            "created": created,
            "config": config.to_dict(),
        }

    @_answer
    def add(self, record: dict[str, Any], *, force: bool = False) -> "AddResult":
        """Add one record (``memory-add``).  ``id`` in the answer is the record that holds it:
        the new one, or the live record whose text it repeats exactly (``duplicate_of``).  A near
        duplicate is stored and named in ``near_duplicate_of`` with its ``similarity``."""
        result = self.index([record], verb="memory-add", force=force)
        near = result["near_duplicates"][0] if result["near_duplicates"] else None
        dup = result["duplicates"][0]["duplicate_of"] if result["duplicates"] and not result["ids"] else None
        rid = result["ids"][0] if result["ids"] else dup if dup is not None else result["skipped_ids"][0]
        return {"id": rid, "duplicate_of": dup, "near_duplicate_of": near["near_duplicate_of"] if near else None,
                "similarity": near["similarity"] if near else None, **result}

    @_answer
    def index(self, raws: list[Any], *, verb: str = "memory-index", force: bool = False,
              progress: Reporter | None = None) -> "WriteResult":
        """Validate a batch whole, append the new records durably, then index them (``memory-index``).

        Records whose id is live are skipped; exact duplicates of live records (same type and
        text, adr/0009) are reported as ``duplicates`` and not stored, unless ``force``.  Near
        duplicates are stored and reported as ``near_duplicates``.
        """
        self.require_enabled()
        records = stamp_anchors(validate_batch(raws, self.config.record_types), self.anchors)
        return self.apply(records, verb=verb, force=force, progress=stage(progress, "embedding"))

    @_answer
    def forget(self, ids: list[str], *, reason: str = "forgotten") -> "ForgetResult":
        """Retire records (``memory-forget``): a tombstone per id is appended; the log keeps the records,
        results never show them again, the next rebuild drops their vectors."""
        self.require_enabled()
        _check_retirement(ids, reason, "forget")
        out = self.apply(forget=list(dict.fromkeys(ids)), reason=reason, verb="memory-forget")
        return {"forgotten": out["forgotten"], "already_retired": out["already_retired"],
                "recovered": out["recovered"], "warnings": out["warnings"]}

    @_answer
    def redact(self, ids: list[str], *, reason: str = "redacted") -> dict[str, Any]:
        """Remove the text of records from the memory for good (``memory-redact``): a leaked secret, a
        note that must not stay.

        Unlike ``forget`` (a tombstone; the text stays in the log), every line of these ids is replaced,
        in place, by a ``redact`` line holding no content (its reason and time, and a hash that knows
        the line again, so a git merge that brings it back is caught and the next write removes it
        again); so are the lines in the store's backups and set-aside torn bytes (an id found only there,
        forgotten and then compacted out of the log, is redacted there).  Then every derived
        file is rebuilt (the lexical vocabulary held the words), and the answer says how to purge
        the text from git history, which no tool here can reach.
        """
        from .githistory import purge_advice

        self.require_enabled()
        _check_retirement(ids, reason, "redact")
        wanted = set(dict.fromkeys(ids))
        self.store.prepare()
        with self.store.lock("memory-redact"):
            scan, _ = settled_scan(self.snap, self.store)
            # (the copies: backups, torn bytes, other worktrees' logs; an id forgotten and compacted away is there)
            copies = self.store.held_in_copies(wanted)
            unknown = sorted(rid for rid in wanted if rid not in scan.position and rid not in scan.redacted
                             and rid not in copies)
            if unknown:
                raise InputError(f"no record has the id {unknown[0]!r}; nothing was redacted", code=codes.RECORD_NOT_FOUND,
                                 details={"ids": unknown[:50], "written": 0})
            named = {rid: scan.redacted[rid]["hashes"] for rid in copies if rid in scan.redacted}
            ops = [(rid, h) for rid in sorted(copies) for h in sorted(copies[rid]) if h not in named.get(rid, ())]
            if ops:  # the log names what it redacts in the copies: a line a merge, an import or another worktree
                at = now_iso()  # brings back is never read, and a second call finds the id redacted (adr/0015)
                self.store.append([], [redact_op(rid, h, at, reason, copy=True) for rid, h in ops])
            keys = [content_hash(embed_text(r)) for r in scan.records if r["id"] in wanted]
            done = self.store.redact(wanted, reason, keys)
            self.snap.reset_lexical()
        rebuilt = self.rebuild()
        redacted = sorted(set(done["ids"]) | {rid for rid, _ in ops})
        return {"redacted": redacted, "lines": done["lines"],
                "already_redacted": sorted(wanted - set(redacted)), "rewritten": done["files"],
                "rebuilt": rebuilt["count"], "git": purge_advice(self.project.root, self.store, redacted),
                "warnings": rebuilt["warnings"]}

    @_answer
    def get(self, ids: list[str], *, track: bool = True, history: bool = False) -> "GetResult":
        """Records by id (``memory-get``), live or retired: a retired one says why and when
        (``retired``: reason, at, and the id that superseded it; an expired one: reason ``expired``,
        at its ``valid_until``).  Ids no record has are listed in ``missing``; when none is found it
        is an error (``record-not-found``).  ``history`` adds each id's versions in log order, each
        with what replaced or retired it (``search/timeline.history``)."""
        from ..search.timeline import expiry
        from ..search.timeline import history as versions

        self.require_enabled()
        if not isinstance(ids, list) or not ids:
            raise UsageError("give at least one record id")
        if len(ids) > MAX_GET:
            raise InputError(f"at most {MAX_GET} ids at once", code=codes.GET_TOO_MANY, details={"count": len(ids)})
        _check_ids(ids)
        scan = self.scan()
        found: list[GotRecord] = []
        missing: list[str] = []
        for rid in dict.fromkeys(ids):
            pos = scan.position.get(rid)
            if pos is None and rid in scan.redacted:  # its text is gone: only that it was, when and why
                gone = scan.redacted[rid]
                found.append({"id": rid, "live": False, "record": None,
                              "retired": {"reason": "redacted", "at": gone.get("at"), "why": gone.get("reason")}})
                if history:
                    found[-1]["history"] = versions(scan, rid, time.time())
                continue
            if pos is None:
                missing.append(rid)
                continue
            info = scan.dead.get(pos)
            retired = None if info is None else {k: info[k] for k in ("reason", "at", "by") if info.get(k) is not None}
            if retired is None:
                retired = expiry(scan.records[pos], time.time())  # past its valid_until: not live, nothing lost
            found.append({"id": rid, "live": retired is None, "retired": retired, "record": scan.records[pos]})
            if history:
                found[-1]["history"] = versions(scan, rid, time.time())
        if not found:
            raise InputError(f"no record has the id {missing[0]!r}", code=codes.RECORD_NOT_FOUND,
                             details={"ids": missing[:50]})
        out: GetResult = {"records": found, "missing": missing, "warnings": scan.warnings()}
        if missing:
            out["warnings"].append({"code": codes.RECORD_NOT_FOUND, "message": f"{len(missing)} id(s) name no record",
                                    "ids": missing[:50]})
        live = [r["id"] for r in found if r["live"]]
        if track and live and not self.store.usage.record(live):
            out["warnings"].append({"code": codes.USAGE_NOT_RECORDED,
                                    "message": "could not record these records as retrieved"})
        return out

    @_answer
    def query(
        self,
        text: str | None,
        *,
        k: int = 8,
        type: str | None = None,
        phase: str | None = None,
        phase_exact: bool = False,
        tags: list[str] | None = None,
        alpha: float | None = None,
        fusion: str | None = None,
        explain: bool = False,
        mode: str = "hybrid",
        max_tokens: int | None = None,
        track: bool = True,
        collapse: bool = True,
        since: str | None = None,
        as_of: str | None = None,
        branch: str | None = None,
        syntax: bool = True,
        domain: str | None = None,
        scope: str | None = None,
    ) -> "QueryResult":
        """Hybrid search (``memory-query``); see ``search/fusion.py`` for the scoring.

        ``max_tokens`` keeps the best hits whose markdown blocks fit the budget
        (``api/context.py``).  ``track`` records the returned hits as retrieved
        (usage, for ``memory-prune``).  ``collapse`` shows near duplicates as one hit (adr/0009).
        ``phase`` matches that phase and the phases under it (``M001`` finds ``M001-S002-T0001``)
        unless ``phase_exact``.  A ``type`` no record can have is refused with the allowed list.
        ``since`` (ISO-8601) keeps records created at or after that time.  ``as_of`` (ISO-8601) answers
        from the memory as it stood then (``search/timeline.py``); its hits are not counted as retrieved.
        A hit whose record was written inside git says whether that commit is ``merged`` (reachable from
        HEAD); ``branch="current"`` keeps only those and the records written outside git (``gitstate.py``).
        ``syntax`` reads query syntax in the text (``search/syntax.py``); off, the text is a bag of words
        (``memory-context``: an agent's task is never a query language).  ``domain`` keeps the records of
        that domain (``records.py``), before top-k like the other filters; echoed only when given.
        ``scope``: ``project``, ``user`` (the user-level memory) or ``all`` (both in one ranking over one
        statistic; ``usermemory.py``); None: all once a user memory exists.  Each hit's ``memory`` says which.
        """
        from ..search.query import hand_over, run_query, vector_text
        from .context import fit_budget

        if scope == "user" and self.user_enabled:  # the user-level memory alone, whether or not this one is on
            result = self.for_scope("user").query(
                text, k=k, type=type, phase=phase, phase_exact=phase_exact, tags=tags, alpha=alpha, fusion=fusion,
                explain=explain, mode=mode, max_tokens=max_tokens, track=track, collapse=collapse, since=since,
                as_of=as_of, syntax=syntax, domain=domain)
            result["scope"] = usermemory.scope_answer(self, ["user"], result.get("scope"))
            return result
        self.require_enabled()
        text = _query_text(text)
        side_weights = alpha is None and self.config.side_weights == "auto"  # the memory's own z weight
        alpha = self.config.alpha if alpha is None else alpha
        fusion = fusion or self.config.fusion
        for name, value in (("k", k), ("alpha", alpha), ("fusion", fusion), ("mode", mode),
                            ("max_tokens", max_tokens), ("since", since), ("as_of", as_of), ("branch", branch),
                            ("domain", domain), ("scope", scope)):
            check(QUERY_PARAMS[name], value)  # as declared (params.py): the one check of every caller
        self._check_filters(type, phase, tags)
        parsed = self._syntax(text) if syntax else None
        reads = usermemory.reads(self, scope)
        if reads != ["project"]:  # both memories in one ranking (``usermemory.py``)
            options = {"k": k, "type": type, "phase": phase, "tags": tags or [], "alpha": float(alpha),
                       "fusion": fusion, "explain": explain, "mode": mode, "collapse": collapse,
                       "phase_exact": phase_exact, "since": since, "as_of": as_of, "side_weights": side_weights,
                       "domain": domain}
            answer = usermemory.fused(self, text, parsed, options, scope=scope, branch=branch, max_tokens=max_tokens,
                                      track=track)
            if answer is not None:  # (None: the user memory's folder was refused since; the project's alone)
                return answer
        # The query's vector is handed to a warm process's helper now (``embed/helper.py``; None: embedded
        # when needed), and what does not depend on it is looked up meanwhile.
        ahead = hand_over(self.embedder, vector_text(text, parsed)) if mode != "lexical" else None
        try:
            folders = usermemory.folders_read(self)  # the folders read, how found, branch and commit
            note = usermemory.project_only(self, scope)
            result = run_query(self, text, k=k, type=type, phase=phase, tags=tags or [], alpha=float(alpha),
                               fusion=fusion, explain=explain, mode=mode, collapse=collapse, phase_exact=phase_exact,
                               since=since, as_of=as_of, positions=self._on_branch(branch),
                               side_weights=side_weights, syntax=parsed, domain=domain, ahead=ahead)
        finally:
            if ahead is not None:
                ahead.close()  # (a query that ended without its vector frees the helper)
        mark_merged(result["hits"], self.git)
        for hit in result["hits"]:
            hit["memory"] = self.name
        result["scope"] = folders
        note(result)
        if branch is not None:
            result["query"]["filters"]["branch"] = branch
        weigh_freshness(result["hits"], self.anchors, self.config.stale_factor, explain=explain)
        if max_tokens is not None:
            result["hits"], result["budget"] = fit_budget(result["hits"], max_tokens)
        if track and as_of is None and result["hits"] and not self.store.usage.record([h["id"] for h in result["hits"]]):
            result["warnings"].append({"code": codes.USAGE_NOT_RECORDED,
                                       "message": "could not record this query's hits as retrieved; "
                                                  "retrievals are not counted"})
        return result

    @_answer
    def pin(self, ids: list[str]) -> dict[str, Any]:
        """Mark records hot (``memory-pin``): every ``memory-context`` block includes them.  A ``pin`` op per
        record is appended (``log.py``); unknown ids are refused (``record-not-found``), retired ones listed."""
        from .turn import set_hot

        return set_hot(self, ids, True)

    @_answer
    def unpin(self, ids: list[str]) -> dict[str, Any]:
        """Records no longer hot (``memory-unpin``): an ``unpin`` op per record; the records stay."""
        from .turn import set_hot

        return set_hot(self, ids, False)

    @_answer
    def context(self, text: str | None, *, max_tokens: int = CONTEXT_PARAMS["max_tokens"].default, k: int = 8,
                recent: int = 3, track: bool = True, domain: str | None = None, scope: str | None = None
                ) -> "ContextResult":
        """One block for an agent's turn (``memory-context``; ``turn.py``): the live hot records (at most
        40 % of ``max_tokens``, newest first), the task's best ``k`` hits (of ``domain`` only, when given),
        the ``recent`` newest handoff records; no record twice; every record left out named in
        ``budget.left_out``.  ``scope`` as for ``query``: with the user-level memory, its hot records are
        hot here too, and the relevant hits are both memories' in one ranking (handoffs stay the project's)."""
        from .turn import build_context

        self.require_enabled()
        if text is None:
            raise UsageError("the task text is required (--text or positional)")
        for name, value in (("max_tokens", max_tokens), ("k", k), ("recent", recent), ("scope", scope)):
            check(CONTEXT_PARAMS[name], value)
        block = functools.partial(build_context, self, text, max_tokens=max_tokens, k=k, recent=recent, track=track,
                                  domain=domain, scope=scope)
        try:
            return block()
        except StoreError as exc:  # the user memory's folder was refused during the call: once more, the project's
            if not usermemory.turned_unsafe(self, scope, exc):
                raise
        return block()

    def branch_positions(self, branch: str | None) -> "np.ndarray | None":
        """``branch="current"``: the positions of the records merged into HEAD or written outside git (None:
        no such filter)."""
        return self._on_branch(branch)

    def _on_branch(self, branch: str | None) -> "np.ndarray | None":
        """``branch="current"``: the positions of the records merged into HEAD or written outside git."""
        return None if branch is None else self._branch.positions(self.scan().records)

    def _syntax(self, text: str) -> "Parsed | None":
        """The text's query syntax (``search/syntax.py``; None: none); its field filters are checked as
        the flags are (``type:learnings`` is refused like ``--type learnings``)."""
        from ..search.syntax import parse

        parsed = parse(text)
        if parsed is not None:
            for name, values in parsed.filters.items():
                for value in values:
                    if name == "type":
                        self._check_filters(value, None, None)
                    elif name == "phase":
                        self._check_filters(None, value, None)
                    elif name == "tag":
                        self._check_filters(None, None, [value])
                    elif name == "domain":
                        check(QUERY_PARAMS["domain"], value)
        return parsed

    def _check_filters(self, type_: Any, phase: Any, tags: Any) -> None:
        """Refuse filters that can never match (a typo such as ``learnings``), saying what can."""
        if type_ is not None:
            allowed = list(self.config.record_types)
            if isinstance(type_, str) and type_ not in allowed:
                self.scan()
                allowed += sorted(set(self.snap.types.present()) - set(allowed))  # types a changed config dropped
            if not isinstance(type_, str) or type_ not in allowed:
                raise InputError(f"unknown record type {str(type_)[:MAX_ECHO]!r}; the types are {allowed}",
                                 code=codes.QUERY_INVALID_TYPE, details={"type": str(type_)[:MAX_ECHO], "allowed": allowed})
        if phase is not None and not one_line(phase, MAX_PHASE):
            raise InputError(f"a phase filter is 1-{MAX_PHASE} characters on one line", code=codes.QUERY_INVALID_PHASE,
                             details={"phase": str(phase)[:MAX_ECHO]})
        check(QUERY_PARAMS["tags"], tags)

    @_answer
    def rebuild(self, progress: Reporter | None = None, *, reembed: bool = False) -> "RebuildResult":
        """Rebuild every derived file from the log (``memory-rebuild``; ``rebuild.py``).

        Vectors of unchanged text under the same fingerprint are reused unless
        ``reembed``; the graph is built fresh, in log order, single-threaded, fixed seed.
        """
        from .rebuild import Rebuild

        self.require_enabled()
        self.store.prepare()
        return Rebuild(self.snap, self.store, self.vectors, self.config).run(self.scan(), progress, reembed=reembed)

    @_answer
    def settle(self) -> dict[str, Any]:
        """Make what writes left to later (``memory-settle``): the side-weight estimate when it is due,
        committed with the current rows (which merges their segments), else a merge of any segments —
        what ``memory-serve`` does when idle, and what a one-shot write starts in the background instead
        of waiting for it (``leave_to_background``).  One runs per project at a time."""
        from .stats import side_weight

        self.require_enabled()
        committed = False
        with background.only_worker("settle", self.project.root) as alone:
            passes = 2 if alone else 0  # (none while another runs; a second: writes meanwhile may have made one due)
            for _ in range(passes):
                self.scan()
                if not self.vectors.idle(SETTLE_VERB, 1, wait=True):
                    break
                committed = True
        return {"busy": not alone, "committed": committed,
                "side_weight": side_weight(self.config, self.store.read_manifest())}

    def leave_to_background(self, root: Path | None = None) -> None:
        """A one-shot process's writes never wait for a side-weight estimate: one that comes due is made by
        a detached ``memory-settle`` (``background.py``) after the write.  ``root``: the project it is
        started for (the user memory's: the project whose CLI call wrote it, with ``--scope user``)."""
        self.vectors.defer_side_weight = True
        self._settle_later = True
        self._settle_root = root or self.project.root

    @_answer
    def compact(self, progress: Reporter | None = None) -> dict[str, Any]:
        """Rewrite the log with only its live records (``memory-compact``).

        Under the lock: the current log is kept (``records.jsonl.bak-<time>``: a hard link, so not
        a byte is lost), the live records are written in their order to a new log that replaces the
        old one atomically, and the derived state is rebuilt from it (vectors reused, nothing
        re-embedded unless it was missing).
        """
        self.require_enabled()
        self.store.prepare()
        with self.store.lock("memory-compact"):
            scan, recovered = settled_scan(self.snap, self.store)
            live = [hot_record(scan, p) for p in range(len(scan.records)) if p not in scan.dead]  # pins kept
            rewritten = self.store.rewrite(live)
            if kept_ops(scan):  # HyPE's questions are the log's state too: never asked of the model again
                self.store.append([], kept_ops(scan))
            self.store.usage.fold(force=True)
        result = self.rebuild(progress)
        return {
            "compacted": True,
            "kept": len(live),
            "dropped": {"retired": len(scan.dead), "duplicate_lines": len(scan.duplicates),
                        "corrupt_lines": len(scan.corrupt), "operations": scan.ops},
            "corrupt_lines": scan.corrupt[:50],
            "backup": rewritten["backup"],
            "bytes": rewritten["bytes"],
            "embedded": result["embedded"],
            "recovered": recovered,
        }

    @_answer
    def prune(self, unused_for: str | None = None, *, dry_run: bool = False, anchors_missing: bool = False
              ) -> dict[str, Any]:
        """Retire never-retrieved records older than the window (``memory-prune``).

        A record is retired only if it was created before ``now - window`` and
        has no retrieval on record, and only if usage has been tracked for the
        whole window (otherwise "never retrieved" is not known); records with
        no ``created_at`` are kept.  Retiring appends tombstones (reason
        ``pruned``): the records stay in the log until ``memory-compact``.  ``anchors_missing`` instead
        retires the records all of whose cited files are gone (reason ``anchors-missing``).
        """
        self.require_enabled()
        if anchors_missing or unused_for is None:
            if unused_for is not None or not anchors_missing:
                raise UsageError("give --unused-for WINDOW or --anchors-missing (one of them)")
            return self._prune_unanchored(dry_run)
        window = parse_duration(unused_for)
        cutoff = time.time() - window
        since, usage = self.store.usage.summary()
        scan = self.scan()
        out: dict[str, Any] = {"dry_run": dry_run, "unused_for": unused_for, "retired": [],
                               "kept": {"recent": 0, "retrieved": 0, "unknown_age": 0},
                               "tracked_since": epoch_to_iso(since), "warnings": scan.warnings()}
        if since is None or since > cutoff:
            out["warnings"].append({
                "code": codes.USAGE_HISTORY_TOO_SHORT,
                "message": "usage has been tracked for less than the window, so no record is known to be unused "
                           "for that long; nothing was retired",
            })
            return out
        doomed = []
        now = time.time()
        for pos, rec in enumerate(scan.records):
            until = iso_to_epoch(rec.get("valid_until"))
            if pos in scan.dead or (until is not None and until <= now):  # retired, or expired by itself
                continue
            created = iso_to_epoch(rec.get("created_at"))
            if created is None:
                out["kept"]["unknown_age"] += 1
            elif rec["id"] in usage:
                out["kept"]["retrieved"] += 1
            elif created >= cutoff:
                out["kept"]["recent"] += 1
            else:
                doomed.append(rec["id"])
        if doomed and not dry_run:
            doomed = self.apply(forget=doomed, reason="pruned", verb="memory-prune")["forgotten"]
        out["retired"] = doomed
        out["count"] = len(doomed)
        return out

    def _prune_unanchored(self, dry_run: bool) -> dict[str, Any]:
        scan = self.scan()
        report = verify_anchors(scan, self.anchors)
        gone = [s["id"] for s in report["stale"] if all(a["status"] == "missing" for a in s["anchors"])]
        elsewhere = self._cited_elsewhere(scan, gone)  # (their code is another worktree's files)
        doomed = [rid for rid in gone if rid not in elsewhere]
        if doomed and not dry_run:
            doomed = self.apply(forget=doomed, reason="anchors-missing", verb="memory-prune")["forgotten"]
        return {"dry_run": dry_run, "anchors_missing": True, "retired": doomed, "count": len(doomed),
                "other_worktrees": sorted(elsewhere), "warnings": scan.warnings()}

    def _cited_elsewhere(self, scan: LogScan, ids: list[str]) -> set[str]:
        """Those of ``ids`` written in another git worktree of this repository that is there now (their
        ``git.worktree``): the code they cite is that worktree's, not this one's files, so nothing here retires
        or moves them (a forget retires an id in every worktree).  A record of a worktree since removed, or of
        a teammate's checkout laid out otherwise, is this worktree's to check."""
        from ..store import worktree_exists

        here = (self.git.stamp() or {}).get("worktree")
        out = set()
        for rid in ids:
            pos = scan.live(rid)
            stamp = scan.records[pos].get("git") if pos is not None else None
            where = stamp.get("worktree") if isinstance(stamp, dict) else None
            if here is not None and isinstance(where, str) and where != here \
                    and worktree_exists(self.project.root, where):
                out.add(rid)
        return out

    @_answer
    def verify(self, *, update: bool = False) -> dict[str, Any]:
        """Check every live anchored record against the code it cites (``memory-verify``; ``anchors.py``):
        counts by freshness and the drifted and missing records.  ``update`` records the new place of
        moved anchors as ``anchor`` operations in the log (one per record, all in one change)."""
        self.require_enabled()
        checked = self.scan()
        report = verify_anchors(checked, self.anchors)
        updated: list[str] = []
        # (as checked: anchors another writer moved since are left to it; a move into code not committed
        # is not recorded, for the change may be abandoned and the record would cite nothing)
        was = {rid: checked.records[pos].get("anchors") for rid in report["moved"]
               if (pos := checked.live(rid)) is not None}
        uncommitted = sorted(uncommitted_moves(report["moved"], was, self.anchors)) if update else []
        if update and report["moved"]:
            with self.store.lock("memory-verify"):
                scan, _ = settled_scan(self.snap, self.store)
                elsewhere = self._cited_elsewhere(scan, list(report["moved"]))
                ops = [anchor_op(rid, anchors) for rid, anchors in report["moved"].items()
                       if (pos := scan.live(rid)) is not None and rid not in elsewhere and rid not in uncommitted
                       and scan.records[pos].get("anchors") == was.get(rid)]
                if ops:
                    self.store.append([], ops)
                updated = [op["id"] for op in ops]
        moved = report.pop("moved")
        out = {**report, "moved": sorted(moved), "updated": updated, "warnings": self.scan().warnings()}
        if update:
            out["uncommitted"] = uncommitted
        return out

    @_answer
    def ingest(self, paths: list[str], *, include: Sequence[str] = (), exclude: Sequence[str] = (),
               prune_missing: bool = False, record_type: str | None = None,
               progress: Reporter | None = None, domain: str | None = None) -> "IngestResult":
        """Index markdown files and folders, idempotently (``memory-ingest``; see ``ingest/plan.py``).
        Relative paths are relative to the project root, whatever the working directory.  ``domain``:
        every chunk written carries it (a chunk whose text is already stored keeps its own)."""
        from ..ingest.plan import live_sources, plan, read_documents, under

        self.require_enabled()
        if not paths:
            raise UsageError("give at least one markdown file or folder")
        root = self.project.root.resolve()
        docs = read_documents(paths, root, include=include, exclude=exclude, record_type=record_type,
                              types=self.config.record_types, progress=stage(progress, "reading"), domain=domain)
        scan = self.scan()
        if docs.missing:
            sources = live_sources(scan) if prune_missing else {}
            unknown = [m for m in docs.missing if not any(under(s, m) for s in sources)]
            if unknown:
                hint = "" if prune_missing else "; to retire the chunks of a removed file, add --prune-missing"
                raise InputError(f"{unknown[0]!r} does not exist{hint}; nothing was ingested",
                                 code=codes.INGEST_PATH_MISSING, details={"paths": unknown[:50], "written": 0})
            docs.prefixes += docs.missing  # removed files whose chunks are to be retired
        if docs.failed and not docs.desired:
            first = docs.failed[0]
            raise InputError(f"no file could be ingested: {first['message']}", code=codes.INGEST_FILES_FAILED,
                             details={"failed": docs.failed[:50], "written": 0})
        add, retire, report = plan(scan, docs, root, prune_missing=prune_missing)
        add = stamp_anchors(add, self.anchors)  # each chunk cites its file and section
        out: dict[str, Any] = {**report, "added": 0, "retired": 0, "embedded": 0, "skipped": docs.skipped,
                               "failed": docs.failed, "degraded": None, "warnings": scan.warnings()}
        if add or retire:
            written = self.apply(add, forget=list(retire), reasons=retire, verb="memory-ingest", force=True,
                                 progress=stage(progress, "embedding"))
            out.update(added=written["added"], retired=len(written["forgotten"]), embedded=written["embedded"],
                       degraded=written["degraded"], warnings=written["warnings"])
        if docs.failed:
            out["warnings"].append({"code": codes.INGEST_FILES_FAILED,
                                    "message": f"{len(docs.failed)} file(s) could not be ingested and were passed "
                                               "over (see failed); the others were ingested"})
        return cast("IngestResult", out)  # the plan's counts (files, new, changed, ...) lead

    @_answer
    def export(self, path: str) -> dict[str, Any]:
        """Write the whole log, line for line, to ``path`` (``memory-export``): a ``records.jsonl``
        the file store reads as is, whichever store this memory lives in."""
        self.require_enabled()
        target = Path(path)
        if self.store.owns(target):
            raise InputError("memory-export would overwrite the memory's own log", code=codes.EXPORT_TARGET_IS_LOG,
                             details={"path": str(path)[:MAX_ECHO]})
        try:  # a new file is written beside it and renamed over it: never over a link, a pipe or a device
            kind = os.lstat(target).st_mode
        except OSError:
            kind = None
        if kind is not None and not stat.S_ISREG(kind):
            raise InputError(f"cannot write {str(path)[:MAX_ECHO]!r}: it is not a regular file (a link, pipe, device "
                             "or folder); memory-export writes a new file or replaces a regular one",
                             code=codes.EXPORT_UNWRITABLE, details={"path": str(path)[:MAX_ECHO]})
        lines = list(self.store.export_lines())
        try:
            atomic_write_bytes(target, b"".join(lines))
        except OSError as exc:
            raise InputError(f"cannot write {str(path)[:MAX_ECHO]!r}: {exc.strerror}", code=codes.EXPORT_UNWRITABLE,
                             details={"path": str(path)[:MAX_ECHO]}) from None
        scan = self.scan()
        return {"exported": str(target), "lines": len(lines), "records": len(scan.records), "live": scan.live_count,
                "backend": self.store.kind}

    @_answer
    def import_log(self, path: str, progress: Reporter | None = None) -> dict[str, Any]:
        """Load a ``records.jsonl`` (``memory-import``), replaying its history faithfully: for every id this
        memory does not hold yet, each version of its record and each retirement (with its own time and
        reason) in the file's order, as one change.  So every live record there is live here in its last
        version, in the same order, and every retirement keeps its time and reason (issue 21: a forget
        followed by a re-add of the same id is no longer lost).  Idempotent by id: a second run adds
        nothing."""
        self.require_enabled()
        source = Path(path)
        if not source.is_file():
            what = "not a regular file (a folder, a pipe or a device)" if source.exists() else "no such file"
            raise InputError(f"cannot import {str(path)[:MAX_ECHO]!r}: {what}", code=codes.RECORDS_FILE_UNREADABLE,
                             details={"path": str(path)[:MAX_ECHO]})
        try:
            theirs = read(read_regular(source))
        except OSError as exc:
            raise StoreError(f"cannot read {source.name}: {exc.strerror}", code=codes.RECORDS_UNREADABLE,
                             details={"path": str(source)}) from None
        events = history(theirs)
        out = self.writes.replay(events, verb="memory-import", progress=stage(progress, "embedding"))
        self._settle_in_background()
        return {"imported": out["added"], "already_present": out["skipped"], "retired": len(out["forgotten"]),
                "source_lines": theirs.lines, "skipped_lines": len(theirs.corrupt) + len(theirs.duplicates),
                "degraded": out["degraded"], "warnings": theirs.warnings() + out["warnings"]}

    def _team(self, verb: str) -> Any:
        store = self.store
        if getattr(store, "namespaces", None) is None:
            raise InputError(f"{verb} is for a team memory (memory.backend postgres); this memory lives in "
                             f"{self.project.memory_dir}", code=codes.STORE_NOT_TEAM, details={"backend": store.kind})
        return store

    @_answer
    def namespaces(self) -> dict[str, Any]:
        """The team database's namespaces (``memory-namespaces``): a namespace is a name that keeps projects
        apart, not an access boundary (any role with the GRANTs reads every one)."""
        self.require_enabled()
        found = self._team("memory-namespaces").namespaces()
        return {"namespaces": found, "count": len(found)}

    @_answer
    def drop_namespace(self, name: str, *, yes: bool = False) -> dict[str, Any]:
        """Delete a team namespace and everything in it (``memory-drop-namespace NAME --yes``)."""
        from ..config import NAMESPACE_PATTERN

        self.require_enabled()
        store = self._team("memory-drop-namespace")
        if not isinstance(name, str) or not NAMESPACE_PATTERN.fullmatch(name):
            raise InputError("a namespace is 1-128 letters, digits, '.', '_' or '-'", code=codes.NAMESPACE_INVALID,
                             details={"namespace": str(name)[:MAX_ECHO]})
        known = {n["namespace"] for n in store.namespaces()}
        if name not in known:
            raise InputError(f"the team database has no namespace {name!r}", code=codes.NAMESPACE_NOT_FOUND,
                             details={"namespace": name, "namespaces": sorted(known)[:50]})
        if not yes:
            raise UsageError(f"dropping namespace {name!r} deletes its whole memory for every machine; repeat with "
                             "--yes to do it", code=codes.CONFIRMATION_REQUIRED, details={"namespace": name})
        return dict(store.drop_namespace(name))  # one transaction: a writer of it meanwhile starts it afresh

    @_answer
    def hype(self, *, limit: int | None = None) -> dict[str, Any]:
        """Generate the HyPE questions of records that have none yet and append them to the log
        (``memory-hype``; ``hype.py``): what a write starts in the background when the generator is on."""
        from .hype import fill

        return fill(self, limit=limit)

    @_answer
    def summarise(self, *, type: str | None = None, min_size: int = 10, similarity: float | None = None,
                  max_groups: int = 20, dry_run: bool = False) -> dict[str, Any]:
        """Merge each group of near duplicates (or a ``type`` of at least ``min_size`` records) into one record
        that supersedes its members (``memory-summarise``; ``summarise.py``); ``dry_run``: before and after only."""
        from .summarise import summarise

        return summarise(self, type_=type, min_size=min_size, similarity=similarity, max_groups=max_groups,
                         dry_run=dry_run)

    @_answer
    def harvest(self, path: str) -> dict[str, Any]:
        """Write a transcript's episodic summary and durable facts (``memory-harvest``; ``harvest.py``);
        idempotent by the transcript's text."""
        from .harvest import harvest

        return harvest(self, path)

    @_answer
    def doctor(self, *, root_flag: str | None = None) -> dict[str, Any]:
        """One report (``memory-doctor``; ``doctor.py``): where this memory is and how its root was found
        (``root_flag``: the ``--root`` given, if any), git, the index, the runtime, anchors by freshness,
        and every problem with the command that fixes it.  Never loads the model; works while disabled."""
        from .doctor import diagnose, found_by

        return diagnose(self, found_by(self.project.root, root_flag))

    @_answer
    def stats(self) -> "Stats":
        """Counts, model, timestamps and a consistency report (never loads the model)."""
        from .stats import collect_stats

        self.require_enabled()
        user = usermemory.describe(self) if self.name == "project" else None  # first: user_folders names its folder
        out = collect_stats(self)
        out["scope"] = scope(self.project).as_dict()
        if user is not None:
            out["user_memory"] = user
        return out


__all__ = ["SCHEMA_VERSION", "Memory"]

"""Markdown knowledge: chunking, frontmatter, idempotent re-ingestion, pruning, safety."""

from __future__ import annotations

import json
import os

import pytest

from nubos_memory import Memory
from nubos_memory.ingest.markdown import FrontmatterError, chunk_markdown

from .conftest import query, run_cli
from .test_dedup import Counting

PATTERNS = """---
category: patterns
importance: 0.9
tags: [feature-loading, error-handling]
last_updated: 2026-02-24T10:30:00Z
---

# Memory: Patterns

## Feature Loader Initialization

**Context:** Features must be loaded before accessing feature data.

```typescript
const loader = new FeatureLoader(projectPath);
## this is code, not a heading
await loader.initialize();
```

**Why:** FeatureLoader scans `.automaker/features/` on initialization.

## Error Classification

Catch blocks that surface errors to users call classifyError first.
"""

CLAUDE = """# Project guide

Run `pnpm test` before pushing.

## Release

Releases are cut with the release workflow (workflow_dispatch) from the Actions tab.

## Database

Migrations run with `pnpm db:migrate`; never edit an applied migration.
"""


def ingest(root, *args):
    return run_cli(["memory-ingest", "--root", str(root), *args])


@pytest.fixture
def docs(project, monkeypatch):
    monkeypatch.chdir(project)  # relative paths are relative to the working directory, as usual
    (project / "docs").mkdir()
    (project / "knowledge").mkdir()
    (project / "CLAUDE.md").write_text(CLAUDE)
    (project / "knowledge/patterns.md").write_text(PATTERNS)
    (project / "docs/ops.md").write_text("## Backups\n\nNightly pg_dump to the backup bucket, kept 30 days.\n")
    (project / "docs/notes.txt").write_text("not markdown")
    return project


def live_chunks(root):
    mem = Memory.open(root)
    scan = mem.scan()
    return {r["id"]: r for p, r in enumerate(scan.records) if p not in scan.dead and r.get("source_file")}


def test_chunks_split_on_h2_outside_code_and_keep_headings():
    doc = chunk_markdown(PATTERNS, "patterns")
    assert (doc.title, doc.category, doc.importance, doc.tags) == \
        ("Memory: Patterns", "patterns", 0.9, ["feature-loading", "error-handling"])
    assert [c.heading for c in doc.chunks] == ["Feature Loader Initialization", "Error Classification"]
    assert "## this is code, not a heading" in doc.chunks[0].text
    assert all(c.text.startswith("## " + c.heading) for c in doc.chunks)
    plain = chunk_markdown("Just a paragraph.\n\nAnother one.", "readme")
    assert [(c.heading, c.text) for c in plain.chunks] == [("readme", "# readme\nJust a paragraph.\n\nAnother one.")]
    assert chunk_markdown("---\ntags: a, b\n---\nx", "f").tags == ["a", "b"]


def test_a_long_section_is_capped_with_paragraph_then_sentence_fallback():
    para = "A sentence about retries. " * 30
    text = "## Retries\n\n" + "\n\n".join([para] * 6)
    doc = chunk_markdown(text, "f", max_tokens=200)
    assert len(doc.chunks) > 1
    for c in doc.chunks:
        assert c.text.startswith("## Retries\n") and len(c.text) <= 800
    assert doc.chunks == chunk_markdown(text, "f", max_tokens=200).chunks  # deterministic
    words = sum(c.text.count("retries.") for c in doc.chunks)
    assert words == text.count("retries.")


@pytest.mark.parametrize("front,message", [("---\nimportance: 3\n---\n", "importance"),
                                           ("---\ncategory: [a, b]\n---\n", "category"),
                                           ("---\n: : :\n---\n", "YAML"),
                                           ("---\n- a list\n---\n", "mapping"),
                                           ("---\n!!python/object/apply:os.system ['echo hi']\n---\n", "YAML")])
def test_bad_frontmatter_is_refused(front, message):
    with pytest.raises(FrontmatterError, match=message):
        chunk_markdown(front + "body", "f")


def test_ingest_indexes_files_with_provenance_fields(docs):
    r = ingest(docs, "CLAUDE.md", "docs", "knowledge")
    assert r.code == 0, r.err
    assert (r.json["files"], r.json["new"], r.json["added"], r.json["retired"]) == (3, 3, 6, 0)
    chunks = live_chunks(docs)
    by_heading = {c["heading"]: c for c in chunks.values()}
    fl = by_heading["Feature Loader Initialization"]
    assert fl["source_file"] == "knowledge/patterns.md" and fl["chunk_index"] == 0 and fl["importance"] == 0.9
    assert fl["type"] == "learning" and fl["tags"] == ["feature-loading", "error-handling", "patterns"]
    assert by_heading["Release"]["type"] == "research" and by_heading["Release"]["source_file"] == "CLAUDE.md"
    assert not any(c["source_file"].endswith(".txt") for c in chunks.values())
    hit = query(docs, "how are releases cut?").json["hits"][0]
    assert hit["record"]["heading"] == "Release"


def test_reingesting_an_unchanged_file_changes_and_embeds_nothing(docs):
    emb = Counting()
    mem = Memory.open(docs, embedder=emb)
    first = mem.ingest([str(docs / "CLAUDE.md"), str(docs / "knowledge")])
    assert first["added"] == 5 and len(emb.texts) == 5
    log = docs / ".nubos-pilot/memory/records.jsonl"
    before, calls = log.read_bytes(), len(emb.texts)
    again = mem.ingest([str(docs / "CLAUDE.md"), str(docs / "knowledge")])
    assert (again["unchanged"], again["added"], again["retired"], again["embedded"]) == (2, 0, 0, 0)
    assert log.read_bytes() == before and len(emb.texts) == calls


def test_a_changed_file_supersedes_exactly_its_old_chunks(docs):
    ingest(docs, "CLAUDE.md", "docs", "knowledge")
    before = live_chunks(docs)
    text = CLAUDE.replace("never edit an applied migration", "squash migrations before each release")
    (docs / "CLAUDE.md").write_text(text)
    r = ingest(docs, "CLAUDE.md", "docs", "knowledge").json
    assert (r["changed"], r["unchanged"], r["added"], r["retired"]) == (1, 2, 1, 1)
    after = live_chunks(docs)
    gone, new = set(before) - set(after), set(after) - set(before)
    assert len(gone) == 1 and before[gone.pop()]["heading"] == "Database"
    assert len(new) == 1 and after[new.pop()]["heading"] == "Database"
    hits = query(docs, "--k", "10", "migrations").json["hits"]
    bodies = [h["record"]["body"] for h in hits if h["record"].get("heading") == "Database"]
    assert len(bodies) == 1 and "squash migrations" in bodies[0]  # no stale chunk, no duplicate


def test_prune_missing_retires_chunks_of_deleted_files_in_scope(docs):
    ingest(docs, "CLAUDE.md", "docs", "knowledge")
    os.remove(docs / "docs/ops.md")
    kept = ingest(docs, "docs").json
    assert kept["removed"] == 0 and any(c["source_file"] == "docs/ops.md" for c in live_chunks(docs).values())
    pruned = ingest(docs, "docs", "--prune-missing").json
    assert (pruned["removed"], pruned["retired"]) == (1, 1)
    chunks = live_chunks(docs)
    assert not any(c["source_file"] == "docs/ops.md" for c in chunks.values())
    assert any(c["source_file"] == "CLAUDE.md" for c in chunks.values())  # outside the pruned scope


def test_include_and_exclude_globs(docs):
    (docs / "docs/draft.md").write_text("## Draft\n\nnot ready\n")
    r = ingest(docs, "docs", "--exclude", "draft.md").json
    assert r["files"] == 1
    r = ingest(docs, "docs", "knowledge", "--include", "knowledge/*").json
    assert r["files"] == 1 and {c["source_file"] for c in live_chunks(docs).values()} == \
        {"docs/ops.md", "knowledge/patterns.md"}


def test_paths_outside_the_project_and_escaping_symlinks_are_refused(docs, tmp_path):
    outside = tmp_path / "secret.md"
    outside.write_text("## Secret\n\ntoken=abc\n")
    r = ingest(docs, str(outside))
    assert r.code == 5 and r.error["code"] == "ingest-path-outside-project"
    (docs / "docs/link.md").symlink_to(outside)
    r = ingest(docs, "docs")
    assert r.code == 0 and r.json["skipped"] == [{"path": "docs/link.md",
                                                  "reason": "resolves outside the project (symlink)"}]
    assert "token=abc" not in (docs / ".nubos-pilot/memory/records.jsonl").read_text()
    (docs / "escape").symlink_to(tmp_path)
    r = ingest(docs, "escape")
    assert r.code == 5 and r.error["code"] == "ingest-path-outside-project"


def test_a_bad_file_is_reported_and_passed_over_while_the_others_are_ingested(docs):
    (docs / "knowledge/broken.md").write_text("---\nimportance: high\n---\n## x\n\ny\n")
    (docs / "knowledge/binary.md").write_bytes(b"## bad\n\n\xff\xfe\n")
    r = ingest(docs, "CLAUDE.md", "knowledge")
    assert r.code == 0, r.err
    failed = {f["path"]: f["code"] for f in r.json["failed"]}
    assert failed == {"knowledge/broken.md": "ingest-frontmatter-invalid", "knowledge/binary.md": "ingest-file-unreadable"}
    assert "ingest-files-failed" in {w["code"] for w in r.json["warnings"]}
    assert {c["source_file"] for c in live_chunks(docs).values()} == {"CLAUDE.md", "knowledge/patterns.md"}
    # Only bad files: nothing to ingest is an error, naming each file.
    only = ingest(docs, "knowledge/broken.md")
    assert only.code == 5 and only.error["code"] == "ingest-files-failed"
    assert only.error["details"]["failed"][0]["path"] == "knowledge/broken.md"


def test_a_path_that_does_not_exist_is_an_error_and_nothing_is_ingested(docs):
    log = docs / ".nubos-pilot/memory/records.jsonl"
    for typo in (["docs/READNE.md"], ["CLAUDE.md", "nope/"], ["docs/missing.markdown"]):
        r = ingest(docs, *typo)
        assert r.code == 5 and r.error["code"] == "ingest-path-missing", typo
        assert r.error["details"]["written"] == 0 and "--prune-missing" in r.error["message"]
    assert not log.exists()
    # A removed file whose chunks the memory holds: --prune-missing retires them.
    ingest(docs, "docs")
    os.remove(docs / "docs/ops.md")
    assert ingest(docs, "docs/ops.md").error["code"] == "ingest-path-missing"
    pruned = ingest(docs, "docs/ops.md", "--prune-missing")
    assert pruned.code == 0 and (pruned.json["removed"], pruned.json["retired"]) == (1, 1)
    # ... but a path the memory never held stays an error, with --prune-missing too.
    again = ingest(docs, "docs/ops.md", "--prune-missing")
    assert again.code == 5 and again.error["details"]["paths"] == ["docs/ops.md"]


def test_chunk_titles_carry_their_document(docs):
    (docs / "adr").mkdir()
    for n, name in ((4, "Locking and atomic commit"), (5, "Hybrid scoring")):
        (docs / f"adr/{n:04d}.md").write_text(f"# ADR {n:04d} — {name}\n\n## Context\n\nwhy {n}\n\n"
                                              f"## Decision\n\nwhat {n}\n")
    (docs / "docs/front.md").write_text("---\ntitle: Runbook\n---\n# Ignored H1\n\nintro\n\n## Restore\n\nsteps\n")
    assert ingest(docs, "adr", "docs", "CLAUDE.md").code == 0
    titles = {(c["source_file"], c["heading"]): c["title"] for c in live_chunks(docs).values()}
    assert titles[("adr/0004.md", "Context")] == "ADR 0004 — Locking and atomic commit › Context"
    assert titles[("adr/0005.md", "Decision")] == "ADR 0005 — Hybrid scoring › Decision"
    assert titles[("CLAUDE.md", "Project guide")] == "Project guide"  # the opening section: the document alone
    assert titles[("CLAUDE.md", "Release")] == "Project guide › Release"
    assert titles[("docs/front.md", "Restore")] == "Runbook › Restore"  # frontmatter title wins
    assert titles[("docs/ops.md", "Backups")] == "ops › Backups"  # no title: the file's name
    hit = query(docs, "why 4 context").json["hits"][0]
    assert hit["record"]["title"].startswith("ADR 0004")


def test_chunks_a_user_retired_before_titles_changed_stay_retired(docs):
    """Ids from before titles carried their document: a re-ingest replaces the chunks once, and
    a chunk the user forgot under its old id does not come back."""
    from nubos_memory.ingest.markdown import chunk_markdown as chunk
    from nubos_memory.ingest.plan import chunk_id

    doc = chunk(CLAUDE, "CLAUDE")
    old = [{"id": chunk_id("CLAUDE.md", c.index, c.text), "type": "research", "title": c.heading,
            "body": c.text, "source_file": "CLAUDE.md", "chunk_index": c.index, "heading": c.heading}
           for c in doc.chunks]
    mem = Memory.open(docs)
    mem.index(old)
    mem.forget([old[1]["id"]], reason="wrong")  # "Release", forgotten by the user
    r = mem.ingest(["CLAUDE.md"])
    assert (r["changed"], r["added"], r["retired"], r["kept_retired"]) == (1, 2, 2, 1)
    assert sorted(c["heading"] for c in live_chunks(docs).values()) == ["Database", "Project guide"]


def test_ingest_reports_progress_as_json_lines_on_stderr(docs):
    r = ingest(docs, "CLAUDE.md", "docs", "knowledge", "--progress", "json")
    assert r.code == 0 and json.loads(r.out)["added"] == 6
    lines = [json.loads(line)["progress"] for line in r.err.splitlines()]
    stages = [(p["stage"], p["done"], p["total"]) for p in lines]
    assert ("reading", 3, 3) in stages and ("embedding", 6, 6) in stages
    assert all(p["verb"] == "memory-ingest" for p in lines)
    assert ingest(docs, "docs", "--progress", "none").err == ""


def test_ingested_ids_are_deterministic(docs, tmp_path):
    ingest(docs, "knowledge")
    first = sorted(live_chunks(docs))
    other = tmp_path / "clone"
    other.mkdir()
    os.chdir(other)
    run_cli(["memory-init", "--root", str(other)])
    (other / ".nubos-pilot/config.json").write_text(json.dumps(
        {"memory": {"enabled": True, "provider": "hash", "model": "hash-256"}}))
    (other / "knowledge").mkdir()
    (other / "knowledge/patterns.md").write_text(PATTERNS)
    ingest(other, "knowledge")
    assert sorted(live_chunks(other)) == first

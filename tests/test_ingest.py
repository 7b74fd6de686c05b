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


def test_bad_files_refuse_the_whole_ingest(docs):
    (docs / "knowledge/broken.md").write_text("---\nimportance: high\n---\n## x\n\ny\n")
    log = docs / ".nubos-pilot/memory/records.jsonl"
    r = ingest(docs, "CLAUDE.md", "knowledge")
    assert r.code == 5 and r.error["code"] == "ingest-frontmatter-invalid"
    assert r.error["details"]["path"] == "knowledge/broken.md" and not log.exists()
    (docs / "knowledge/broken.md").write_bytes(b"## bad\n\n\xff\xfe\n")
    assert ingest(docs, "knowledge").error["code"] == "ingest-file-unreadable"
    assert ingest(docs, "nope").error["code"] == "ingest-path-missing"


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

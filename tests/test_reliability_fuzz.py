"""Bad input across every verb (issue 5): zero tracebacks, every failure a stable JSON error.

Hypothesis generates records, flag values, query strings, argument lists and config files. Each
run goes through the real CLI entry point; the answer must be exit 0 with one JSON document, or
the JSON error envelope on stderr with the exit code of its class and a code the package
defines (never ``internal-error``). Quick: about 3,000 generated inputs; ``NUBOS_MEMORY_HEAVY=1``:
over 12,000.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nubos_memory import errors

from .conftest import HEAVY, run_cli, write_config

pytestmark = pytest.mark.reliability

SCALE = 4 if HEAVY else 1
SETTINGS = {"deadline": None, "suppress_health_check": list(HealthCheck), "derandomize": not HEAVY}


def _known_codes() -> re.Pattern[str]:
    """Every error code the package can produce: its catalogue (``codes.py``; tests/test_error_codes.py
    holds every raise site to it)."""
    from nubos_memory.codes import CATALOGUE

    return re.compile("(" + "|".join(sorted(re.escape(c) for c in CATALOGUE if c != "internal-error")) + r")\Z")


CODES = _known_codes()
EXIT_OF = {cls.default_code: cls.exit_code for cls in (errors.UsageError, errors.ConfigError, errors.DisabledError,
                                                        errors.InputError, errors.LockTimeout, errors.StoreError,
                                                        errors.EmbeddingError, errors.RebuildRequired)}


def check(result, argv):
    assert result.code != 70, (argv, result.err)  # never a traceback
    if result.code == 0:
        if "--format" in argv and "md" in argv:
            assert result.out.startswith("## Prior memory")
        else:
            assert isinstance(json.loads(result.out), dict)
        return
    assert result.out == "", argv  # failures print nothing on stdout
    err = json.loads(result.err)["error"]
    assert set(err) == {"code", "message", "details"} and isinstance(err["message"], str) and err["message"]
    assert CODES.match(err["code"]), (err, argv)
    assert result.code in (2, 3, 4, 5, 6, 7, 8, 9), (result.code, err)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz") / "proj"
    root.mkdir()
    run_cli(["memory-init", "--root", str(root)])
    write_config(root, provider="hash", model="hash-64", lock_timeout=5.0, near_duplicate=0.95)
    run_cli(["memory-add", "--root", str(root), "--type", "learning", "--title", "seed record about kafka"])
    return root


text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=60)
nasty = st.one_of(text, st.sampled_from(["", " ", "\x00", "\n", "-", "--", "*", '"', "AND", "NOT", "a:b", "🦘",
                                         "<think>x</think>", "<scratch_pad>", "\u202e", "..", "/etc/passwd",
                                         "9" * 40, "-1", "1e309", "nan", "null", "[]", "{}"]))
scalar = st.one_of(st.none(), st.booleans(), st.integers(-10**20, 10**20), st.floats(allow_nan=True), nasty)
json_value = st.recursive(scalar, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(nasty, inner, max_size=4),
                          max_leaves=12)
field_names = st.sampled_from(["id", "type", "phase", "title", "body", "tags", "provenance", "created_at",
                               "source_file", "chunk_index", "heading", "importance", "supersedes", "bogus"])
record = st.one_of(json_value, st.dictionaries(field_names, json_value, max_size=9),
                   st.fixed_dictionaries({"type": st.sampled_from(["learning", "critic", "nope", 3]),
                                          "title": nasty}, optional={"body": nasty, "tags": json_value,
                                                                     "id": nasty, "importance": scalar,
                                                                     "supersedes": nasty}))


@settings(max_examples=1200 * SCALE, **SETTINGS)
@given(batch=st.one_of(st.lists(record, max_size=5), record, st.binary(max_size=200).map(lambda b: b.decode("latin-1"))))
def test_bad_records(root, batch):
    payload = batch if isinstance(batch, str) else json.dumps(batch)
    argv = ["memory-index", "--root", str(root), "--records-file", "-"]
    check(run_cli(argv, stdin=payload), argv)


FLAGS = {
    "memory-add": ["--type", "--title", "--body", "--tags", "--phase", "--provenance", "--id", "--created-at",
                   "--supersedes", "--importance"],
    "memory-query": ["--text", "--k", "--type", "--phase", "--tags", "--alpha", "--fusion", "--mode", "--max-tokens",
                     "--format"],
    "memory-forget": ["--reason"],
    "memory-context": ["--text", "--k", "--max-tokens", "--recent", "--format"],
    "memory-pin": [],
    "memory-unpin": [],
    "memory-prune": ["--unused-for"],
    "memory-ingest": ["--include", "--exclude", "--type"],
    "memory-index": ["--records-file"],
    "memory-stats": [],
    "memory-rebuild": [],
}


@settings(max_examples=1200 * SCALE, **SETTINGS)
@given(data=st.data())
def test_bad_flags_and_queries(root, data):
    verb = data.draw(st.sampled_from(sorted(FLAGS)))
    argv = [verb, "--root", str(root)]
    for flag in data.draw(st.lists(st.sampled_from(FLAGS[verb] or ["--bogus"]), max_size=5, unique=True)):
        argv += [flag, data.draw(nasty)]
    if verb in ("memory-query", "memory-forget", "memory-ingest", "memory-context", "memory-pin", "memory-unpin"):
        argv += data.draw(st.lists(nasty, max_size=3))
    if data.draw(st.booleans()):
        argv.append(data.draw(st.sampled_from(["--explain", "--force", "--dry-run", "--prune-missing",
                                               "--skip-if-disabled", "--unknown"])))
    check(run_cli(argv, stdin=data.draw(text)), argv)


@settings(max_examples=400 * SCALE, **SETTINGS)
@given(argv=st.lists(nasty, max_size=6))
def test_random_argument_lists(root, argv):
    check(run_cli(argv), argv)


@settings(max_examples=300 * SCALE, **SETTINGS)
@given(section=st.one_of(json_value, st.dictionaries(st.sampled_from(
    ["enabled", "provider", "model", "alpha", "threshold", "fusion", "candidates", "types", "lock_timeout",
     "max_pending_embed", "hnsw_m", "hnsw_ef_construction", "hnsw_ef_search", "near_duplicate", "extra"]),
    json_value, max_size=6)), raw=st.booleans())
def test_bad_config_files(tmp_path_factory, section, raw):
    root = tmp_path_factory.mktemp("cfg")
    (root / ".nubos-pilot").mkdir()
    content = json.dumps(section) if raw else json.dumps({"memory": section})
    (root / ".nubos-pilot/config.json").write_text(content)
    for argv in (["memory-stats", "--root", str(root)], ["memory-query", "--root", str(root), "kafka"]):
        check(run_cli(argv), argv)


def test_the_code_whitelist_is_real():
    """The whitelist the fuzzers check against is not a catch-all."""
    assert CODES.match("record-invalid-type") and CODES.match("lock-timeout") and CODES.match("manifest-untrusted")
    assert not CODES.match("internal-error") and not CODES.match("anything-at-all")
    assert Path(__file__).exists()

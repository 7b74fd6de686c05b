"""The architecture holds (issue 13, adr/0011): imports go one way, and no module reaches into
another's private names.

Layers, lowest first; a module may import its own sub-package and any lower layer::

    foundation   errors limits types fsio faults trust userdirs config records tokenize progress
    index, embed         derived indexes; text → vectors
    generate             text → text (the generator seam; adr/0019)
    store                where the log, the lock and derived state live
    search, ingest       answering a query; markdown → records
    api                  the Memory facade, its write path and vector sync, stats, context
    evaluation           memory-eval: BEIR loading, metrics, the embedding cache, the runner
    interfaces           cli, verbs, memory-serve, its client, memory-mcp
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from nubos_memory.errors import EXIT_CODES

from .conftest import REPO

PACKAGE = REPO / "nubos_memory"
FOUNDATION = {"errors", "limits", "types", "fsio", "faults", "trust", "userdirs", "config", "records", "tokenize", "log",
              "recordlist", "columns", "scratch", "roots", "progress", "codes", "params", "gitcmd", "remote"}
LAYER = {"foundation": 0, "index": 1, "embed": 1, "generate": 1, "store": 2, "search": 3, "ingest": 3, "api": 4, "evaluation": 5,
         "interfaces": 6}
# The package's front door re-exports the facade (lazily); ``python -m`` runs the CLI.
ENTRY_POINTS = {"__init__", "__main__"}


def modules() -> list[tuple[str, Path]]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).with_suffix("")
        out.append((".".join(rel.parts), path))
    return out


def layer_of(module: str) -> str:
    """The layer of a module name relative to the package ('store.cache' → store)."""
    head = module.split(".")[0]
    return head if head in LAYER else "foundation"


def imported(path: Path, module: str) -> list[tuple[str, int]]:
    """Package-internal modules ``path`` imports (relative imports resolved), with line numbers."""
    pkg = module.split(".")[:-1]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level == 0:
                if node.module and node.module.startswith("nubos_memory"):
                    out.append((node.module.removeprefix("nubos_memory").lstrip("."), node.lineno))
                continue
            base = pkg[: len(pkg) - (node.level - 1)]
            target = ".".join([*base, *(node.module.split(".") if node.module else [])])
            if node.module is None:  # from . import x
                out += [(".".join([*base, a.name]), node.lineno) for a in node.names]
            else:
                out.append((target, node.lineno))
    return out


def test_imports_go_down_the_layers_only():
    wrong = []
    for module, path in modules():
        name = module.split(".")[-1]
        if name in ENTRY_POINTS and module.count(".") == 0:
            continue
        mine = layer_of(module)
        if mine == "foundation":
            assert name in FOUNDATION, f"{module}: a new top-level module must be placed in a layer (adr/0011)"
        for target, line in imported(path, module):
            theirs = layer_of(target)
            if theirs == mine:
                continue
            if LAYER[theirs] >= LAYER[mine]:
                wrong.append(f"{module}:{line} imports {target} ({mine} → {theirs})")
    assert wrong == []


def test_the_layer_test_can_fail(tmp_path):
    """The checker itself sees an upward import."""
    probe = tmp_path / "probe.py"
    probe.write_text("from ..api.memory import Memory\n")
    assert imported(probe, "store.probe") == [("api.memory", 1)]
    assert LAYER[layer_of("api.memory")] > LAYER[layer_of("store.probe")]


# What the layers above store/ may import of it: the seam (the factory, the Protocol), never a store.
STORE_SEAM = {"store", "store.base"}


def store_reaches(paths: list[tuple[str, Path]]) -> list[str]:
    """Imports of a concrete store (or its parts) from above ``store/``."""
    return [f"{module}:{line} imports {target}" for module, path in paths if LAYER[layer_of(module)] > LAYER["store"]
            for target, line in imported(path, module)
            if layer_of(target) == "store" and target not in STORE_SEAM]


def test_layers_above_store_reach_it_only_through_its_seam():
    """api/, search/, ingest/ (and everything above) name no concrete store: a third store lands in
    store/ alone (issue 22)."""
    assert store_reaches(modules()) == []


def test_the_store_seam_check_can_fail(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("from ..store.files import FileStore\nfrom ..store.base import Store\nfrom ..store import open_store\n")
    assert store_reaches([("search.probe", probe)]) == ["search.probe:1 imports store.files"]


def private_reaches(path: Path) -> list[str]:
    """``x._name`` where x is not self/cls, and ``from y import _name``: another object's private parts."""
    out = []
    where = path.relative_to(REPO) if path.is_relative_to(REPO) else path.name
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            owner = node.value
            if not (isinstance(owner, ast.Name) and owner.id in ("self", "cls")):
                out.append(f"{where}:{node.lineno} .{node.attr}")
        elif isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("nubos_memory")):
            out += [f"{where}:{node.lineno} import {a.name}" for a in node.names
                    if a.name.startswith("_") and not a.name.startswith("__")]
    return out


def test_no_module_reaches_into_another_modules_private_names():
    assert [hit for _, path in modules() for hit in private_reaches(path)] == []


def test_the_private_name_check_can_fail(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("from .memory import _answer\nx = mem._write\ny = self._fine\n")
    found = private_reaches(probe)
    assert len(found) == 2 and "import _answer" in found[0] and "._write" in found[1]


def test_every_exit_code_is_in_the_readme_table():
    table = (REPO / "README.md").read_text().split("## Errors and exit codes", 1)[1].split("\n## ", 1)[0]
    documented = {int(line.split("|")[1]) for line in table.splitlines() if line.startswith("| ") and
                  line.split("|")[1].strip().isdigit()}
    assert documented == set(EXIT_CODES)


def test_no_layer_above_store_names_a_store_or_its_cursor():
    """Issue 22's check, as a test: api/, search/ and ingest/ never say inode, RecordLog, FileStore or PgStore."""
    words = re.compile(r"inode|RecordLog|FileStore|PgStore")
    found = [f"{path.relative_to(REPO)}:{n}" for folder in ("api", "search", "ingest")
             for path in sorted((PACKAGE / folder).rglob("*.py"))
             for n, line in enumerate(path.read_text().splitlines(), start=1) if words.search(line)]
    assert found == []

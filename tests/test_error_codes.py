"""Every stable ``code`` is declared once in ``nubos_memory/codes.py``, used, and documented.

Agents branch on the ``code`` of an error envelope or a warning, so the catalogue is the one place
a code is declared (with one line of meaning), and ``docs/errors.md`` documents each one with that
meaning.  The scanner reads the package's source (ast) for every place a code is given:

* ``code=...`` keywords (``InputError(..., code=...)``), ``"code": ...`` in dict displays,
  ``default_code = ...`` class attributes, ``x.code == ...`` comparisons;
* the first (or second) positional argument of the helpers that take a code (``POSITIONAL``);
* ``for code, ... in (("x", ...), ...)`` tables;
* any use of a catalogue constant (``codes.LOCK_TIMEOUT``, or a name imported from ``codes``).

Every site gives its code as a catalogue constant: a string literal or an f-string at a site fails
(``test_no_code_is_a_literal``).  A literal code must still be in the catalogue, a code built by an
f-string a known template (``TEMPLATES``) whose every value is in the catalogue; every catalogue
code must be used somewhere.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from nubos_memory import codes, errors

from .conftest import REPO

PACKAGE = REPO / "nubos_memory"
DOC = REPO / "docs" / "errors.md"

# Helpers whose positional argument at this index is a code.
POSITIONAL = {"_Fail": 0, "usage_error": 1}
# Codes built from a template: every value each template can take.  None is left in the package (a
# template hides its codes from the catalogue); the scanner still reads them, for the probe below.
TEMPLATES: dict[str, frozenset[str]] = {}
CODE_SHAPE = re.compile(r"[a-z][a-z0-9]*(?:-[a-z0-9]+)*\Z")


@dataclass
class Uses:
    literals: dict[str, list[str]] = field(default_factory=dict)  # code -> where
    constants: dict[str, list[str]] = field(default_factory=dict)  # catalogue constant name -> where
    templates: dict[str, list[str]] = field(default_factory=dict)  # f-string pattern -> where

    def add(self, kind: dict[str, list[str]], key: str, where: str) -> None:
        kind.setdefault(key, []).append(where)

    def codes(self) -> set[str]:
        """Every code value these uses give."""
        out = set(self.literals)
        out |= {getattr(codes, name) for name in self.constants if isinstance(getattr(codes, name, None), str)}
        for pattern in self.templates:
            out |= TEMPLATES.get(pattern, frozenset())
        return out


def _pattern(node: ast.JoinedStr) -> str:
    return "".join(part.value if isinstance(part, ast.Constant) else "{" + ast.unparse(part.value) + "}"
                   for part in node.values)


def _callee(node: ast.Call) -> str:
    func = node.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def _is_code_ref(node: ast.expr) -> bool:
    """``x.code`` or ``x["code"]``."""
    return (isinstance(node, ast.Attribute) and node.attr == "code") or (
        isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value == "code")


def scan_source(text: str, where: str, uses: Uses | None = None) -> Uses:
    """The code uses of one module's source."""
    uses = uses if uses is not None else Uses()
    tree = ast.parse(text)
    imported: set[str] = set()  # names imported from the catalogue (from ..codes import X)
    module_names: set[str] = set()  # what the catalogue module is called here (codes)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if (node.module or "").split(".")[-1] == "codes":
                for alias in node.names:
                    imported.add(alias.asname or alias.name)
                    uses.add(uses.constants, alias.name, f"{where}:{node.lineno}")
            for alias in node.names:
                if alias.name == "codes":
                    module_names.add(alias.asname or "codes")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.endswith(".codes"):
                    module_names.add(alias.asname or alias.name)

    def value(node: ast.expr | None, line: int) -> None:
        """A code given as ``node``: a literal, a catalogue constant or a template."""
        at = f"{where}:{line}"
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            uses.add(uses.literals, node.value, at)
        elif isinstance(node, ast.JoinedStr):
            uses.add(uses.templates, _pattern(node), at)
        # constants (codes.X, X) are counted wherever they appear, below

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in module_names:
            uses.add(uses.constants, node.attr, f"{where}:{node.lineno}")
        elif isinstance(node, ast.Name) and node.id in imported:
            uses.add(uses.constants, node.id, f"{where}:{node.lineno}")
        elif isinstance(node, ast.Call):
            for kw in node.keywords:
                if kw.arg == "code":
                    value(kw.value, node.lineno)
            index = POSITIONAL.get(_callee(node))
            if index is not None and len(node.args) > index:
                value(node.args[index], node.lineno)
        elif isinstance(node, ast.Dict):
            for key, item in zip(node.keys, node.values):
                if isinstance(key, ast.Constant) and key.value == "code":
                    value(item, node.lineno)
        elif isinstance(node, ast.Assign):
            if any(isinstance(t, ast.Name) and t.id == "default_code" for t in node.targets):
                value(node.value, node.lineno)
        elif isinstance(node, ast.Compare):
            if _is_code_ref(node.left):
                for right in node.comparators:
                    elements = right.elts if isinstance(right, ast.Tuple | ast.List | ast.Set) else [right]
                    for element in elements:
                        value(element, node.lineno)
        elif isinstance(node, ast.For):
            target = node.target
            if (isinstance(target, ast.Tuple) and target.elts and isinstance(target.elts[0], ast.Name)
                    and target.elts[0].id == "code" and isinstance(node.iter, ast.Tuple | ast.List)):
                for row in node.iter.elts:
                    if isinstance(row, ast.Tuple) and row.elts:
                        value(row.elts[0], row.lineno)
    return uses


def scan(root: Path = PACKAGE) -> Uses:
    uses = Uses()
    for path in sorted(root.rglob("*.py")):
        if path.name == "codes.py" and path.parent == PACKAGE:
            continue  # the catalogue declares; it does not use
        scan_source(path.read_text(), str(path.relative_to(REPO)), uses)
    return uses


def doc_rows() -> dict[str, list[str]]:
    """docs/errors.md's table rows by code: ``| `code` | kind | exit | meaning |`` -> the other cells."""
    rows: dict[str, list[str]] = {}
    for line in DOC.read_text().splitlines():
        match = re.match(r"\|\s*`([a-z0-9-]+)`\s*\|(.*)\|\s*$", line)
        if match:
            assert match.group(1) not in rows, f"{match.group(1)} has two rows in docs/errors.md"
            rows[match.group(1)] = [cell.strip() for cell in match.group(2).split("|")]
    return rows


# -- the catalogue itself ---------------------------------------------------------------------------------

def test_every_code_is_declared_once_as_its_constant():
    declared = {name: v for name, v in vars(codes).items() if name.isupper() and isinstance(v, str)}
    assert sorted(declared.values()) == sorted(codes.CATALOGUE)  # one constant per code, no stray one
    for name, code in declared.items():
        assert CODE_SHAPE.match(code), code
        assert name == code.upper().replace("-", "_"), (name, code)
    for code, meaning in codes.CATALOGUE.items():
        assert meaning.strip() and "\n" not in meaning and "|" not in meaning, code
    with pytest.raises(ValueError, match="declared twice"):
        codes._code("lock-timeout", "again")


def test_the_catalogue_imports_nothing_but_the_standard_library():
    tree = ast.parse((PACKAGE / "codes.py").read_text())
    imports = [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]
    assert all(isinstance(n, ast.ImportFrom) and n.module == "__future__" for n in imports)


def test_the_error_classes_default_to_catalogue_codes():
    for cls in (errors.NubosMemoryError, *errors.ERROR_CLASSES):
        assert cls.default_code in codes.CATALOGUE, cls.__name__


# -- (a) every code used is declared; (c) every code declared is used ----------------------------------

def test_every_code_used_is_in_the_catalogue():
    uses = scan()
    unknown = {code: where for code, where in uses.literals.items() if code not in codes.CATALOGUE}
    assert unknown == {}, "declare these in nubos_memory/codes.py (and docs/errors.md)"
    missing = {name: where for name, where in uses.constants.items()
               if not isinstance(getattr(codes, name, None), str)}
    assert missing == {}, "no such constant in nubos_memory/codes.py"
    unknown_templates = {p: where for p, where in uses.templates.items() if p not in TEMPLATES}
    assert unknown_templates == {}, "a code built from a template: use the catalogue's constants instead"
    for pattern, values in TEMPLATES.items():
        assert values <= set(codes.CATALOGUE), pattern


def literal_sites(uses: Uses) -> dict[str, list[str]]:
    """The codes given as a string literal or an f-string (by value or pattern), with where."""
    return {**uses.literals, **uses.templates}


def test_no_code_is_a_literal():
    """Raise and warning sites give the catalogue's constant (``codes.X``), never ``"x"`` or ``f"..."``."""
    literal = literal_sites(scan())
    assert literal == {}, "give these codes as nubos_memory/codes.py constants (codes.X)"


def test_every_catalogue_code_is_used():
    unused = set(codes.CATALOGUE) - scan().codes()
    assert unused == set(), "declared in codes.py but emitted nowhere: remove them, or use them"


def test_templates_listed_are_still_used():
    """A template whose module now uses the catalogue is dropped from TEMPLATES (it would hide nothing)."""
    assert set(TEMPLATES) <= set(scan().templates)


# -- (d) the scanner sees what it must: it can fail ------------------------------------------------------

def test_the_scanner_finds_the_known_sites():
    uses = scan()
    sites = sum(map(len, uses.literals.values())) + sum(map(len, uses.constants.values())) \
        + sum(map(len, uses.templates.values()))
    assert sites >= 150
    assert len(uses.codes()) == len(codes.CATALOGUE) >= 100
    # one of each way a code is given
    assert any(w.startswith("nubos_memory/errors.py") for w in uses.constants["LOCK_TIMEOUT"])  # default_code
    assert any(w.startswith("nubos_memory/records.py") for w in uses.constants["RECORD_INVALID_TITLE"])  # table
    assert any(w.startswith("nubos_memory/store/cache.py") for w in uses.constants["MANIFEST_UNTRUSTED"])
    assert "records-corrupt-line" in uses.codes()
    assert "body-file-unreadable" in uses.codes()


def test_the_scanner_flags_what_it_must(tmp_path):
    probe = '''
from . import codes
from .codes import LOCK_TIMEOUT
raise InputError("x", code="made-up-code")
warnings.append({"code": "made-up-warning", "message": "m"})
raise StoreError("x", code=codes.STORE_ERROR)
raise _Fail(f"record-{field}-odd", "m", field)
usage_error("m", "made-up-usage", {})
if exc.code in ("made-up-compared", codes.INDEX_BUSY):
    pass
for code, items in (("made-up-row", []),):
    pass
class E(Exception):
    default_code = "made-up-default"
x = LOCK_TIMEOUT, codes.NO_SUCH_CODE
'''
    uses = scan_source(probe, "probe.py")
    assert set(uses.literals) == {"made-up-code", "made-up-warning", "made-up-usage", "made-up-compared",
                                  "made-up-row", "made-up-default"}
    assert set(uses.constants) == {"LOCK_TIMEOUT", "STORE_ERROR", "INDEX_BUSY", "NO_SUCH_CODE"}
    assert set(uses.templates) == {"record-{field}-odd"}
    assert uses.codes() == set(uses.literals) | {"lock-timeout", "store-error", "index-busy"}
    # the probe's literal and template sites are what test_no_code_is_a_literal fails on
    assert set(literal_sites(uses)) == set(uses.literals) | {"record-{field}-odd"}
    assert literal_sites(uses)["made-up-code"] == ["probe.py:4"]


def test_a_module_of_constants_only_has_no_literal_site():
    probe = '''
from . import codes
raise InputError("x", code=codes.RECORD_NOT_FOUND)
warnings.append({"code": codes.INDEX_BEHIND, "message": "m"})
raise InputError("y", code=UNREADABLE[what])
'''
    uses = scan_source(probe, "probe.py")
    assert literal_sites(uses) == {}
    assert set(uses.constants) == {"RECORD_NOT_FOUND", "INDEX_BEHIND"}


# -- (b) every code is documented with its meaning --------------------------------------------------------

def test_every_code_is_documented_with_its_meaning():
    rows = doc_rows()
    assert set(rows) == set(codes.CATALOGUE), "docs/errors.md must have one row per catalogue code, no other"
    for code, meaning in codes.CATALOGUE.items():
        assert rows[code][-1] == meaning, f"docs/errors.md: {code}'s meaning differs from codes.py's"


def test_documented_exit_codes_match_the_error_classes():
    rows = doc_rows()
    for cls in (errors.NubosMemoryError, *errors.ERROR_CLASSES):
        assert rows[cls.default_code][1].startswith(f"{cls.exit_code} "), cls.__name__


def test_the_readme_links_the_catalogue():
    assert "docs/errors.md" in (REPO / "README.md").read_text()

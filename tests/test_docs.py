"""Docs that cannot drift: every verb has --help and is in the README; the README opens with two commands."""

from __future__ import annotations

import re

import pytest

from nubos_memory.interfaces.cli import COMMANDS, build_parser

from .conftest import REPO


@pytest.mark.parametrize("verb", sorted(COMMANDS))
def test_every_verb_has_help_and_is_documented(verb, capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args([verb, "--help"])
    assert exc.value.code == 0
    assert verb in capsys.readouterr().out
    assert f"np-tools {verb}" in (REPO / "README.md").read_text()


def test_readme_opens_with_the_two_commands():
    text = (REPO / "README.md").read_text()
    first_block = re.search(r"```(?:bash|sh)?\n(.*?)```", text, re.S).group(1)
    commands = [line for line in first_block.splitlines() if line.strip() and not line.startswith("#")]
    assert commands == ["bin/demo", "bin/test"]
    assert "bin/test" in (REPO / ".ci/run").read_text()


def test_exit_codes_are_documented():
    from nubos_memory import errors

    text = (REPO / "README.md").read_text()
    for cls in (errors.UsageError, errors.ConfigError, errors.DisabledError, errors.InputError,
                errors.LockTimeout, errors.StoreError, errors.EmbeddingError, errors.RebuildRequired):
        assert re.search(rf"\|\s*{cls.exit_code}\s*\|", text), cls.__name__

"""One declaration per verb (issue 22): the command line's flags, the MCP tools' schemas and the
library's checks all come from ``params.py``; a new query option (``since``) is one declaration and
the code that uses it."""

from __future__ import annotations

import json

import pytest

from nubos_memory.errors import InputError
from nubos_memory.interfaces.cli import COMMANDS, build_parser
from nubos_memory.params import QUERY, QUERY_PARAMS, check

from .conftest import index_records, query, rec
from .test_mcp import list_tools


def flags_of(verb: str) -> set[str]:
    sub = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    return {o for a in sub.choices[verb]._actions for o in a.option_strings} | {
        a.dest for a in sub.choices[verb]._actions if not a.option_strings}


@pytest.mark.parametrize("verb", sorted(COMMANDS))
def test_every_declared_parameter_is_a_flag_of_its_verb(verb):
    have = flags_of(verb)
    for param in COMMANDS[verb].params:
        if param.cli != "none":
            assert (param.name if param.cli == "positional" else param.flag) in have, (verb, param.name)


def test_the_query_tool_takes_exactly_the_declared_tool_arguments(project):
    schema = list_tools(project)["memory_query"].input_schema
    assert set(schema["properties"]) == {p.name for p in QUERY if p.describe is not None}
    assert schema["properties"]["k"]["maximum"] == QUERY_PARAMS["k"].le
    assert "since" in schema["properties"] and schema["required"] == ["text"]


def test_check_refuses_with_the_declared_code_and_lets_not_given_pass():
    check(QUERY_PARAMS["since"], None)
    check(QUERY_PARAMS["since"], "2026-11-01T00:00:00Z")
    for name, bad in (("k", 0), ("k", True), ("alpha", 1.5), ("fusion", "best"), ("mode", None),
                      ("since", "last tuesday"), ("since", "2026-11-01T00:00:00"), ("tags", "a,b")):
        with pytest.raises(InputError) as err:
            check(QUERY_PARAMS[name], bad)
        assert err.value.code == QUERY_PARAMS[name].invalid[0]


def test_since_keeps_records_created_from_that_time_on_every_interface(project, throwaway_memory):
    records = [rec("deploy with blue green switch", "old way", created_at="2026-01-05T10:00:00Z"),
               rec("deploy with canary waves", "new way", created_at="2026-11-02T10:00:00Z"),
               rec("deploy notes written now", "hand written")]
    records[2].pop("created_at", None)  # stamped with the time it is written
    assert index_records(project, records).code == 0
    everything = query(project, "deploy", "--mode", "lexical")
    assert len(everything.json["hits"]) == 3
    recent = query(project, "deploy", "--mode", "lexical", "--since", "2026-11-01T00:00:00Z")
    assert {h["record"]["title"] for h in recent.json["hits"]} == {"deploy with canary waves", "deploy notes written now"}
    assert recent.json["query"]["filters"]["since"] == "2026-11-01T00:00:00Z"
    assert "since" not in everything.json["query"]["filters"]  # answers without it are as before
    bad = query(project, "deploy", "--since", "yesterday")
    assert bad.code == 5 and json.loads(bad.err)["error"]["code"] == "query-invalid-since"
    mem = throwaway_memory
    mem.index(records)
    got = mem.query("deploy", mode="lexical", since="2026-11-01T00:00:00+00:00")
    assert "deploy with blue green switch" not in {h["record"]["title"] for h in got["hits"]}
    assert len(got["hits"]) == 2

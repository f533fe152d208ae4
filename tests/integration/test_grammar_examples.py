"""The structured-generation examples, each run once on the real default model (cpu backend)."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
from test_examples import run_example

pytestmark = pytest.mark.model


def test_json_extraction_returns_an_object_that_conforms_to_the_schema(cpu_engine):
    out, _ = run_example(cpu_engine, "json-extraction", {})
    jsonschema.validate(out["value"], out["schema"])  # the example's own person schema
    assert out["value"]["born"] == 1815 and "Lovelace" in out["value"]["name"]
    with pytest.raises(AssertionError, match="schema is not valid JSON"):
        run_example(cpu_engine, "json-extraction", {"schema": '{"type": '})


def test_regex_extract_answers_in_the_patterns_shape(cpu_engine):
    pattern = r"[0-9]{4}-[0-9]{2}-[0-9]{2}"
    out, _ = run_example(cpu_engine, "regex-extract", {"pattern": pattern, "max_tokens": 16})
    assert re.fullmatch(pattern, out["answer"]), out
    out, _ = run_example(cpu_engine, "regex-extract", {"question": "Is water wet?", "pattern": "(yes|no)"})
    assert out["answer"] in ("yes", "no")


def test_tool_agent_completes_a_two_call_task(cpu_engine):
    out, events = run_example(cpu_engine, "tool-agent", {})
    calls = [(c["name"], c["args"]) for c in out["calls"]]
    assert sorted(calls) == [("get_time", {"city": "Tokyo"}), ("get_weather", {"city": "Paris"})]
    results = {c["name"]: c["result"] for c in out["calls"]}
    assert [e.value for e in events if e.kind == "stdout"][:2] == [
        f'{c["name"]}({json.dumps(c["args"])}) -> {json.dumps(c["result"])}' for c in out["calls"][:2]]
    reply = out["reply"]
    assert reply.startswith("The ") and "<" not in reply
    # the reply states both results: the time and the temperature only the tools gave (left
    # without them, the model guesses "sunny", another temperature and another time)
    sky, temperature = results["get_weather"]["weather"].split(", ")
    assert results["get_time"]["time"] in reply, reply
    assert sky in reply and re.search(rf"\b{temperature.split()[0]}\b(?!:)", reply), reply

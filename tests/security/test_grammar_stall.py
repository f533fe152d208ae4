"""Grammars from a worker never stall the server: pathological sources are refused by their
bounds before xgrammar parses them, and compilation runs off the event loop."""

from __future__ import annotations

import json
from pathlib import Path

from hostile import Served, victim_is_served, write_program
from pie_core.client import connect
from pie_core.grammar.source import MAX_JSON_DEPTH, MAX_SOURCE_BYTES

STALLER = '''
import json
from inferlet import Grammar, Matcher, Model, runtime, session


def attempt(build):
    try:
        build()
        return "accepted"
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"


def nested(depth, key):
    schema = {"type": "string", "description": key}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return json.dumps(schema)  # as text: the bound is the grammar module's, not the wire's


async def main(input):
    session.send("start")
    refused = [attempt(lambda: Grammar.from_json_schema(nested(300, f"try {i}"))) for i in range(3)]
    refused.append(attempt(lambda: Grammar.from_regex("(ab|cd)" * 40000)))
    refused.append(attempt(lambda: Grammar.from_ebnf("root ::= " + " | ".join(f'"w{i}"' for i in range(40000)))))
    session.send(json.dumps(refused))
    heavy = Grammar.from_json_schema({"type": "string", "minLength": 2000, "maxLength": 4000})  # seconds to compile
    matcher = Matcher(heavy, Model.load(runtime.models()[0]))
    session.send("compiling")
    await matcher.ready()
    return "compiled"
'''


def test_pathological_grammars_are_refused_and_compiles_do_not_stall_other_users(hostile, tmp_path: Path) -> None:
    async def scenario(s: Served) -> None:
        await victim_is_served(s)  # alice's program is installed and the zygote warm: later probes take ~0.1 s
        async with await connect(s.url, s.tokens["mallory"]) as mallory:
            proc = await mallory.launch(await mallory.install(write_program(tmp_path / "staller", STALLER)), {})
            events = proc.events()
            assert (await events.__anext__()).value == "start"
            await victim_is_served(s, within_s=2.0)  # while mallory's sources are parsed
            refused = json.loads((await events.__anext__()).value)
            assert (await events.__anext__()).value == "compiling"
            await victim_is_served(s, within_s=2.0)  # while mallory's grammar compiles
            await proc.terminate()
            assert [event.kind async for event in events] == ["error"]
        assert refused[:3] == [f"InvalidInput: a JSON schema may nest at most {MAX_JSON_DEPTH} objects and arrays deep; "
                               "flatten it, or share repeated parts through $defs/$ref"] * 3, refused
        assert refused[3] == (f"InvalidInput: a regex may be at most {MAX_SOURCE_BYTES} bytes, got 280000; "
                              "split it, or share repeated parts through $defs/$ref or rules"), refused
        assert refused[4].startswith(f"InvalidInput: a EBNF grammar may be at most {MAX_SOURCE_BYTES} bytes"), refused
        await victim_is_served(s)

    hostile(scenario)


def test_a_schema_given_as_a_deeply_nested_dict_is_refused_without_recursing() -> None:
    from pie_core.errors import InvalidInput
    from pie_core.grammar.source import json_schema

    schema: dict[str, object] = {"type": "string"}
    for _ in range(100_000):  # json.dumps would raise RecursionError long before this depth
        schema = {"type": "array", "items": schema}
    try:
        json_schema(schema)
    except InvalidInput as exc:
        assert f"at most {MAX_JSON_DEPTH} objects and arrays deep" in str(exc)
    else:
        raise AssertionError("a 100000-deep schema was accepted")
    try:
        json_schema(json.dumps({"enum": list(range(MAX_SOURCE_BYTES))}))
    except InvalidInput as exc:
        assert f"may be at most {MAX_SOURCE_BYTES} bytes" in str(exc)
    else:
        raise AssertionError("an oversized schema was accepted")

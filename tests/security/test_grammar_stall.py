"""Grammars from a worker never stall the server: pathological sources are refused by their
bounds before xgrammar parses them, and compilation runs off the event loop."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

from hostile import Served, victim_is_served, write_program
from pie_core.client import connect
from pie_core.grammar.compiler import GrammarCompiler
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


def test_pathological_grammars_are_refused_and_compiles_do_not_stall_other_users(hostile, tmp_path: Path,
                                                                                  monkeypatch) -> None:
    """Mallory's heavy grammar is held in its compilation until alice has been served: the
    compile runs on a worker thread, never on the event loop, and holds nobody else up."""
    compiling, release = threading.Event(), threading.Event()
    loop_thread: list[int] = []
    compile_thread: list[int] = []
    real_compile = GrammarCompiler._compile

    def held_compile(self, source):
        if '"minLength": 2000' in source.text:  # mallory's heavy schema; every other grammar as usual
            compile_thread.append(threading.get_ident())
            compiling.set()
            if compile_thread[0] != loop_thread[0]:  # on the loop itself, waiting would only hang the test
                assert release.wait(60), "the test never released the compilation"
        return real_compile(self, source)

    monkeypatch.setattr(GrammarCompiler, "_compile", held_compile)

    async def scenario(s: Served) -> None:
        loop_thread.append(threading.get_ident())
        await victim_is_served(s)  # alice's program is installed and the zygote warm
        async with await connect(s.url, s.tokens["mallory"]) as mallory:
            proc = await mallory.launch(await mallory.install(write_program(tmp_path / "staller", STALLER)), {})
            events = proc.events()
            assert (await events.__anext__()).value == "start"
            refused = json.loads((await events.__anext__()).value)
            assert (await events.__anext__()).value == "compiling"
            try:
                assert await asyncio.to_thread(compiling.wait, 60), "mallory's grammar never reached the compiler"
                assert compile_thread[0] != loop_thread[0], "the grammar was compiled on the event loop's thread"
                await victim_is_served(s)  # while mallory's grammar is still compiling
                assert proc.id in {p.id for p in s.server.processes.of_user("mallory")}
            finally:
                release.set()
            await proc.terminate()
            assert [event.kind async for event in events] == ["error"]
        assert len(compile_thread) == 1  # compiled once
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

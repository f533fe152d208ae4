from pathlib import Path

import asyncio

from inferlet import Model, runtime, session
from pie_core.runtime.manifest import load_manifest
from pie_core.runtime.instance import run_inferlet

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_hello_world_returns_greeting(dummy):
    events = []
    manifest = load_manifest(EXAMPLES / "hello-world")
    final = asyncio.run(run_inferlet(dummy.engine, manifest, {"name": "bob"}, events.append))
    assert (final.kind, final.value) == ("return", "hello bob")
    assert events == [final]


def test_runtime_reports_engine_facts(dummy):
    async def main(_):
        return [runtime.models(), runtime.version(), runtime.instance_id(), runtime.username()]

    models, version, iid, user = dummy.value(main)
    assert models == [dummy.model] and version == dummy.engine.version
    assert iid == dummy.engine.instance_id and user == "local"


def test_send_passes_strings_verbatim_and_json_encodes_the_rest(dummy):
    async def main(_):
        session.send("plain")
        session.send({"n": 3})
        session.send([1, "a"])
        return None

    final, events = dummy.run(main)
    assert [(e.kind, e.value) for e in events] == [
        ("stdout", "plain"),
        ("stdout", '{"n": 3}'),
        ("stdout", '[1, "a"]'),
        ("return", None),
    ]


def test_raising_inferlet_gives_error_event_and_engine_keeps_serving(dummy):
    async def bad(_):
        from inferlet import Context

        ctx = Context(Model.load(runtime.models()[0]))
        ctx.user("hello")
        await ctx.flush()
        raise RuntimeError("boom in the inferlet")

    final, _ = dummy.run(bad)
    assert final.kind == "error" and "boom in the inferlet" in final.value
    assert dummy.engine.pools_whole()

    async def good(_):
        return "still here"

    assert dummy.value(good) == "still here"


def test_unknown_model_lists_the_loaded_ones(dummy):
    async def main(_):
        Model.load("no-such-model")

    final, _ = dummy.run(main)
    assert final.kind == "error" and "no-such-model" in final.value and dummy.model in final.value


def test_spawn_runs_another_inferlet_and_returns_its_result(dummy):
    async def main(_):
        return await runtime.spawn("hello-world@0.1.0", {"name": "child"})

    assert dummy.value(main) == "hello child"


def test_spawn_failures_are_clear(dummy):
    async def wrong_version(_):
        return await runtime.spawn("hello-world@9.9.9", {})

    async def bad_args(_):
        return await runtime.spawn("hello-world", {"nmae": "x"})

    final, _ = dummy.run(wrong_version)
    assert final.kind == "error" and "not 9.9.9" in final.value
    final, _ = dummy.run(bad_args)
    assert final.kind == "error" and "unknown parameter 'nmae'" in final.value

from pathlib import Path

import asyncio

import pytest

from inferlet import Model, runtime, session
from pie_core.errors import PieError
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


def test_spawn_resolves_and_runs_children_with_what_the_instance_was_given(dummy):
    from pie_core.engine.events import Event
    from pie_core.host.binding import HostInstance
    from pie_core.runtime.instance import run_main

    asked, ran = [], []

    def resolve(name):
        asked.append(name)
        return f"program:{name}"

    async def run_child(program, args, child):
        ran.append((program, args, child.depth, child.run_child is run_child, child.resolve_program is resolve))
        return Event("return", "from the injected runner")

    async def main(_):
        return await runtime.spawn("anything", {"k": 1})

    inst = HostInstance(engine=dummy.engine, emit=lambda e: None, resolve_program=resolve, run_child=run_child)
    final = asyncio.run(run_main(dummy.engine, main, {}, inst.emit, instance=inst))
    assert (final.kind, final.value) == ("return", "from the injected runner")
    assert asked == ["anything"] and ran == [("program:anything", {"k": 1}, 1, True, True)]


def test_spawn_without_a_resolver_or_runner_says_what_is_missing(dummy):
    from pie_core.host.binding import HostInstance, bind, unbind

    async def spawn_unequipped():
        token = bind(HostInstance(engine=dummy.engine, emit=lambda e: None))
        try:
            return await runtime.spawn("hello-world")
        finally:
            unbind(token)

    with pytest.raises(PieError, match="no resolve_program or run_child"):
        asyncio.run(spawn_unequipped())

"""The readme's synchronous forms in the process runner, where each inferlet is its own worker
process and may block: ``for event in ctx.generate(..., decode=True)``, ``for tokens in g``,
``for msg in sub``, and (in a plain ``def main``) ``ctx.generate_text(...)``, collectors,
``messaging.pull``, ``sub.next()`` and ``McpSession`` calls returning values; ``Subscription.get()``
never waits. Each gives what its async form gives in-process."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest

from pie_core.engine.engine import Engine
from pie_core.engine.events import Event
from pie_core.host.binding import HostInstance
from pie_core.runtime.instance import run_main
from pie_core.runtime.manifest import load_manifest
from pie_core.runtime.process import ProcessLauncher, WorkerLimits

FIXTURE_SERVER = Path(__file__).parents[1] / "mcp" / "fixture_server.py"

ASYNC_MAIN = '''
import asyncio, inspect
from inferlet import Context, Model, Sampler, messaging, runtime

def asked(model):
    ctx = Context(model)
    ctx.user("tell me a story")
    return ctx

async def main(input):
    model = Model.load(runtime.models()[0])
    opts = dict(max_tokens=5, stop=[])
    with asked(model) as a, asked(model) as b, asked(model) as c, asked(model) as d:
        blocking = [(type(e).__name__, e.text) for e in a.generate(Sampler.argmax(), decode=True, **opts)]
        awaited = [(type(e).__name__, e.text) async for e in b.generate(Sampler.argmax(), decode=True, **opts)]
        batches = [tokens for tokens in c.generate(Sampler.argmax(), **opts)]
        collected = await d.generate(Sampler.argmax(), **opts).collect_tokens()
        pending = a.generate_text(Sampler.argmax(), max_tokens=2, stop=[])  # coroutine code: a coroutine
        is_coroutine = inspect.iscoroutine(pending)
        await pending
    with messaging.subscribe("t") as sub:
        before = sub.get()
        messaging.broadcast("t", "a")
        messaging.broadcast("t", "b")
        got = []
        for msg in sub:
            got.append(msg)
            if len(got) == 2:
                break
        messaging.broadcast("t", "c")
        polled = None
        for _ in range(500):
            polled = sub.get()
            if polled is not None:
                break
            await asyncio.sleep(0.01)
        sub.unsubscribe()
        after = list(sub)
    return {"blocking": blocking, "awaited": awaited, "batches": batches, "collected": collected,
            "is_coroutine": is_coroutine, "before": before, "got": got, "polled": polled, "after": after}
'''

SYNC_MAIN = '''
import json, time
from inferlet import Context, Model, Sampler, mcp, messaging, runtime

def main(input):
    model = Model.load(runtime.models()[0])
    with Context(model) as ctx:
        ctx.user("tell me a story")
        text = ctx.generate_text(Sampler.argmax(), max_tokens=4, stop=[])
        ctx.seal()
        ctx.user("and then?")
        tokens = ctx.generate(Sampler.argmax(), max_tokens=3, stop=[]).collect_tokens()
        ctx.flush()
        flushed = not ctx.buffer()
        try:
            ctx.generate_text(Sampler.argmax(), max_tokens=0)
        except Exception as exc:
            refused = type(exc).__name__
    messaging.push("q", "queued")
    pulled = messaging.pull("q")
    with messaging.subscribe("t") as sub:
        messaging.broadcast("t", "x")
        nxt = sub.next()
        messaging.broadcast("t", "y")
        polled = None
        for _ in range(500):
            polled = sub.get()
            if polled is not None:
                break
            time.sleep(0.01)
    with mcp.connect("calc") as calc:
        added = json.loads(calc.call_tool("add", {"a": 2, "b": 3}))["structuredContent"]["result"]
        tools = sorted(t["name"] for t in json.loads(calc.list_tools())["tools"])
    return {"text": text, "tokens": tokens, "flushed": flushed, "refused": refused, "pulled": pulled,
            "next": nxt, "polled": polled, "added": added, "has_add": "add" in tools}
'''


async def _reference(_input: dict) -> dict:
    """What the synchronous main computes, written with ``await`` and run in-process."""
    from inferlet import Context, Model, Sampler, runtime

    model = Model.load(runtime.models()[0])
    with Context(model) as ctx:
        ctx.user("tell me a story")
        text = await ctx.generate_text(Sampler.argmax(), max_tokens=4, stop=[])
        ctx.seal()
        ctx.user("and then?")
        tokens = await ctx.generate(Sampler.argmax(), max_tokens=3, stop=[]).collect_tokens()
    return {"text": text, "tokens": tokens}


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Any:
    home = tmp_path_factory.mktemp("pie-home")
    (home / "config.toml").write_text(
        f'[mcp.servers.calc]\ncommand = {sys.executable!r}\nargs = [{str(FIXTURE_SERVER)!r}]\n')
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PIE_HOME", str(home))
        engine = Engine("dummy")
        engine.load(None)
        yield engine


def _program(tmp_path: Path, source: str) -> Any:
    (tmp_path / "Pie.toml").write_text('[package]\nname = "sync-forms"\nversion = "1.0.0"\ndescription = "sync"\n')
    (tmp_path / "main.py").write_text(source)
    return load_manifest(tmp_path)


def _run_isolated(engine: Engine, tmp_path: Path, source: str, launcher: Any = None) -> Event:
    """Run ``source`` as an inferlet's main.py with ``launcher`` (default: a process launcher)."""
    manifest = _program(tmp_path, source)
    launcher = launcher or ProcessLauncher(WorkerLimits(wall_s=60.0, cpu_s=60, memory_mb=1024))
    events: list[Event] = []

    async def go() -> Event:
        try:
            return await launcher.start(engine, manifest, {}, HostInstance(engine=engine, emit=events.append))
        finally:
            await engine.mcp.close()
            await launcher.aclose()

    final = asyncio.run(go())
    assert engine.pools_whole(), "a test left KV pages allocated"
    return final


def test_for_loops_block_in_a_worker_and_give_what_async_for_gives(engine, tmp_path):
    check_for_loops(_run_isolated(engine, tmp_path, ASYNC_MAIN))


def check_for_loops(final: Event) -> None:
    assert final.kind == "return", final.value
    out = final.value
    assert out["blocking"] == out["awaited"] and out["blocking"][-1][0] == "Done" and len(out["blocking"]) == 6
    assert [t for batch in out["batches"] for t in batch] == out["collected"] and len(out["collected"]) == 5
    assert all(len(batch) == 1 for batch in out["batches"])  # one accepted token per plain step
    assert out["is_coroutine"] is True  # in coroutine code a value call stays a coroutine
    assert (out["before"], out["got"], out["polled"], out["after"]) == (None, ["a", "b"], "c", [])


def test_a_plain_def_main_gets_values_from_the_waiting_calls(engine, tmp_path):
    check_plain_main(engine, _run_isolated(engine, tmp_path, SYNC_MAIN))


def check_plain_main(engine: Engine, final: Event) -> None:
    assert final.kind == "return", final.value
    out = final.value
    events: list[Event] = []
    reference = asyncio.run(run_main(engine, _reference, {}, events.append))
    assert reference.kind == "return", reference.value
    assert (out["text"], out["tokens"]) == (reference.value["text"], reference.value["tokens"])
    assert len(out["tokens"]) == 3 and out["flushed"] and out["refused"] == "InvalidInput"
    assert (out["pulled"], out["next"], out["polled"]) == ("queued", "x", "y")
    assert out["added"] == 5 and out["has_add"]
    assert engine.pools_whole()


def test_an_exception_in_a_plain_def_main_is_the_error_event(engine, tmp_path):
    source = "def main(input):\n    raise ValueError('no luck')\n"
    final = _run_isolated(engine, tmp_path, source)
    assert (final.kind, final.value) == ("error", "ValueError: no luck")


MCP_IN_ASYNC_MAIN = '''
import json
from inferlet import mcp

async def main(input):
    session = mcp.connect("calc")
    tools_json = session.list_tools()  # the reference's form: a str, inside async def main
    raw = session.call_tool("add", json.dumps({"a": 2, "b": 3}))
    awaited = await session.call_tool("add", {"a": 4, "b": 5})  # and awaiting still works
    session.close()
    return {"is_str": isinstance(tools_json, str) and isinstance(raw, str),
            "tools": sorted(t["name"] for t in json.loads(tools_json)["tools"]),
            "sum": json.loads(raw)["structuredContent"]["result"],
            "awaited": json.loads(awaited)["structuredContent"]["result"]}
'''


def test_mcp_calls_return_strings_inside_async_main_and_can_still_be_awaited(engine, tmp_path):
    check_mcp_strings(_run_isolated(engine, tmp_path, MCP_IN_ASYNC_MAIN))


def check_mcp_strings(final: Event) -> None:
    assert final.kind == "return", final.value
    out = final.value
    assert out["is_str"] and "add" in out["tools"] and (out["sum"], out["awaited"]) == (5, 9)

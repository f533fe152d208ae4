"""Adapters are per user: mallory can neither open alice's adapter by name nor reach files
outside her scratch directory through ``save``/``load``, and her adapter bytes are bounded."""

from __future__ import annotations

import asyncio
from typing import Any

from hostile import Served, victim_is_served, write_program
from pie_core.client import connect
from pie_core.server.quotas import Quotas

ADAPTERS = """
import asyncio
from inferlet import Adapter, Model, runtime, session

async def main(input):
    model = Model.load(runtime.models()[0])
    op = input["op"]
    if op == "hold":
        adapter = Adapter.create(model, input["name"])
        session.send("holding")
        await asyncio.sleep(input["wait"])
        return adapter.name
    if op == "open":
        return Adapter.open(model, input["name"]) is not None
    out = {}
    adapter = Adapter.create(model, "mine")
    for path in ("../alice/stolen", "/etc/passwd", "/tmp"):
        try:
            await adapter.save(path) if input["op"] == "save" else await adapter.load(path)
            out[path] = "allowed"
        except Exception as exc:
            out[path] = f"{type(exc).__name__}: {exc}"
    await adapter.save("ok/adapter")
    await adapter.load("ok/adapter")
    out["ok"] = "round trip"
    more = []
    try:
        for i in range(100):
            more.append(Adapter.create(model, f"extra{i}"))
    except Exception as exc:
        out["quota"] = (len(more), f"{type(exc).__name__}: {exc}")
    return out
"""

PARAMS = ('op = { type = "string" }\nname = { type = "string", optional = true }\n'
          'wait = { type = "float", optional = true }')


async def _program(client: Any, folder: Any) -> str:
    return await client.install(write_program(folder, ADAPTERS, name="adapters", parameters=PARAMS))


def test_mallory_cannot_open_alices_adapter(hostile, tmp_path):
    async def scenario(s: Served) -> None:
        async with await connect(s.url, s.tokens["alice"]) as alice, await connect(s.url, s.tokens["mallory"]) as mallory:
            a_prog, m_prog = await _program(alice, tmp_path / "a"), await _program(mallory, tmp_path / "m")
            holder = await alice.launch(a_prog, {"op": "hold", "name": "secret-style", "wait": 5.0})
            async for ev in holder.events():
                if ev.kind == "stdout":
                    break
            assert await (await alice.launch(a_prog, {"op": "open", "name": "secret-style"})).wait() is True
            assert await (await mallory.launch(m_prog, {"op": "open", "name": "secret-style"})).wait() is False
            assert await asyncio.wait_for(holder.wait(), 20) == "secret-style"
        assert s.server.engine.adapters.bytes_held() == {}  # every adapter went with its inferlet
        await victim_is_served(s)

    hostile(scenario)


def test_adapter_paths_stay_in_the_scratch_directory_and_bytes_are_bounded(hostile, tmp_path):
    async def scenario(s: Served) -> None:
        async with await connect(s.url, s.tokens["mallory"]) as mallory:
            prog = await _program(mallory, tmp_path / "m")
            saved = await asyncio.wait_for((await mallory.launch(prog, {"op": "save"})).wait(), 60)
            loaded = await asyncio.wait_for((await mallory.launch(prog, {"op": "load"})).wait(), 60)
        for out in (saved, loaded):
            for path in ("../alice/stolen", "/etc/passwd", "/tmp"):
                assert out[path].startswith("InvalidInput") and "scratch" in out[path], (path, out[path])
            assert out["ok"] == "round trip"
            held, error = out["quota"]
            assert held == 1 and "quota server.quotas.adapter_bytes" in error, out["quota"]
        assert not (s.data_dir / "scratch" / "alice" / "stolen").exists()
        assert s.server.engine.adapters.bytes_held() == {}
        await victim_is_served(s)

    hostile(scenario, quotas=Quotas(adapter_bytes=2 * 17 * 2**20))

"""Helpers for the MCP tests: config writing and a runner that runs inferlet mains on the
dummy engine and stops the engine's MCP servers in the same event loop."""

import asyncio
import sys
from pathlib import Path
from typing import Any, Awaitable, Callable

import tomlkit

from pie_core.engine.engine import Engine
from pie_core.engine.events import Event
from pie_core.host.binding import HostInstance
from pie_core.runtime.instance import run_main

FIXTURE_SERVER = Path(__file__).with_name("fixture_server.py")
Main = Callable[[dict], Awaitable[Any]]


def write_servers(home: Path, servers: dict[str, dict[str, Any]]) -> None:
    """Write ``[mcp.servers.NAME]`` tables into ``home/config.toml``."""
    doc = tomlkit.document()
    mcp = tomlkit.table(is_super_table=True)
    table = tomlkit.table(is_super_table=True)
    for name, entry in servers.items():
        table[name] = entry
    mcp["servers"] = table
    doc["mcp"] = mcp
    (home / "config.toml").write_text(tomlkit.dumps(doc), encoding="utf-8")


def fixture_entry(**extra: Any) -> dict[str, Any]:
    return {"command": sys.executable, "args": [str(FIXTURE_SERVER)], **extra}


def run(engine: Engine, *mains: Main, instances: list[HostInstance] | None = None) -> list[tuple[Event, list[Event]]]:
    """Run ``mains`` concurrently in one event loop, then stop the engine's MCP servers."""

    async def go() -> list[tuple[Event, list[Event]]]:
        outs: list[list[Event]] = [[] for _ in mains]
        insts = instances or [HostInstance(engine=engine, emit=out.append) for out in outs]
        try:
            finals = await asyncio.gather(*(run_main(engine, m, {}, i.emit, instance=i) for m, i in zip(mains, insts)))
        finally:
            await engine.mcp.close()
        return list(zip(finals, outs))

    return asyncio.run(go())


def value(engine: Engine, main: Main) -> Any:
    """The return value of one inferlet (its failure message fails the test)."""
    (final, _), = run(engine, main)
    assert final.kind == "return", final.value
    return final.value

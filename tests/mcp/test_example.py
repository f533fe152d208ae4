"""The mcp-tools example lists a configured server's tools and calls one."""

import asyncio
from pathlib import Path

from pie_core.runtime.instance import run_inferlet
from pie_core.runtime.manifest import load_manifest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "mcp-tools"


def _run(engine, args):
    async def go():
        events = []
        try:
            await run_inferlet(engine, load_manifest(EXAMPLE), args, events.append)
        finally:
            await engine.close()
        return events

    return asyncio.run(go())


def test_example_lists_the_tools_and_calls_one(engine):
    events = _run(engine, {"tool": "add", "args": '{"a": 2, "b": 5}'})
    final = events[-1]
    assert final.kind == "return", final.value
    assert final.value["server"] == "calc" and final.value["result"] == {"result": 7}
    assert {"add", "fail", "pid"} <= set(final.value["tools"])
    lines = "".join(e.value for e in events if e.kind == "stdout").splitlines()
    assert "  add(a: integer, b: integer) - Add two integers." in lines and lines[-1] == "add -> 7"


def test_example_without_servers_says_how_to_add_one_in_one_line(pie_home, engine):
    (pie_home / "config.toml").write_text("[engine]\npage_size = 16\n")
    final = _run(engine, {})[-1]
    assert final.kind == "error" and "[mcp.servers.NAME]" in final.value and "\n" not in final.value
    assert "pie config set mcp.servers.time.command uvx" in final.value and "docs/mcp.md" in final.value

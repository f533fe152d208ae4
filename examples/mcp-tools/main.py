"""MCP tools: list what an MCP server offers and call one of its tools.

Configure a server on the engine first (see docs/mcp.md), e.g. in ``~/.pie/config.toml``::

    [mcp.servers.time]
    command = "uvx"
    args = ["mcp-server-time"]

then ``pie run mcp-tools -- --tool get_current_time --args '{"timezone": "Europe/Paris"}'``.
The server starts on the first ``connect`` and stays up, shared, until the engine stops.
"""

import json
from typing import Any

from inferlet import mcp, session


def signature(tool: dict[str, Any]) -> str:
    """``name(a: integer, b: integer) - description`` from a tools/list entry."""
    props = (tool.get("inputSchema") or {}).get("properties") or {}
    params = ", ".join(f"{name}: {spec.get('type', 'any')}" for name, spec in props.items())
    return f"{tool['name']}({params}) - {tool.get('description') or 'no description'}"


async def main(input: dict[str, Any]) -> dict[str, Any]:
    servers = mcp.available_servers()
    if not servers:
        raise RuntimeError(
            "mcp-tools needs an MCP server configured on the engine ([mcp.servers.NAME] in ~/.pie/config.toml), e.g. "
            "pie config set mcp.servers.time.command uvx "
            "&& pie config set mcp.servers.time.args '[\"mcp-server-time\"]' (see docs/mcp.md)")
    name = input.get("server") or servers[0]
    with mcp.connect(name) as server:
        tools = json.loads(await server.list_tools())["tools"]
        session.send(f"{name}: {len(tools)} tools\n")
        for tool in tools:
            session.send(f"  {signature(tool)}\n")
        out: dict[str, Any] = {"server": name, "tools": [t["name"] for t in tools]}
        if input.get("tool"):
            result = json.loads(await server.call_tool(input["tool"], input["args"]))
            text = "\n".join(c["text"] for c in result["content"] if c.get("type") == "text")
            session.send(f"{input['tool']} -> {text}\n")
            out |= {"tool": input["tool"], "result": result.get("structuredContent", text)}
    return out

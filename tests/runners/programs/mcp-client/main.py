"""MCP through the client-registered server ``notes``: available_servers, connect (with and
async with), list/call tools (dict and JSON-string arguments), list/read resources, list/get
prompts, a failing tool as McpError, an unknown server as NotFound, a closed session refused."""

import json

from inferlet import mcp
from inferlet.host.errors import NotFound


def check(cond, what):
    if not cond:
        raise AssertionError(what)


async def failure(coro_fn):
    try:
        await coro_fn()
    except Exception as exc:  # noqa: BLE001
        return [type(exc).__name__, str(exc)]
    return None


async def main(input):
    out = {"servers": mcp.available_servers()}
    with mcp.connect("notes") as notes:
        out["server"] = notes.server
        tools = json.loads(await notes.list_tools())["tools"]
        out["tools"] = sorted(t["name"] for t in tools)
        shout = json.loads(await notes.call_tool("shout", {"text": "quiet"}))
        out["shout"] = [c["text"] for c in shout["content"]]
        added = json.loads(await notes.call_tool("add", '{"a": 2, "b": 40}'))
        out["add"] = added.get("structuredContent")
        resources = json.loads(await notes.list_resources())["resources"]
        out["resources"] = [r["uri"] for r in resources]
        out["read"] = [c["text"] for c in json.loads(await notes.read_resource("notes://today"))["contents"]]
        prompts = json.loads(await notes.list_prompts())["prompts"]
        out["prompts"] = [p["name"] for p in prompts]
        got = json.loads(await notes.get_prompt("greet", {"name": "pie"}))
        out["prompt"] = [[m["role"], m["content"]["text"]] for m in got["messages"]]
        out["tool_failed"] = await failure(lambda: notes.call_tool("boom", {"reason": "disk full"}))
        out["bad_args"] = await failure(lambda: notes.call_tool("add", "[1, 2]"))
        out["no_resource"] = await failure(lambda: notes.read_resource("notes://nope"))
    out["closed"] = await failure(lambda: notes.list_tools())
    async with mcp.connect(name="notes") as again:
        out["async_with"] = again.server
    try:
        mcp.connect("no-such-server")
    except NotFound as exc:
        out["unknown"] = [type(exc).__name__, str(exc)]
    try:
        mcp.connect()
    except TypeError as exc:
        out["no_name"] = str(exc)
    check(issubclass(mcp.McpError, Exception), "McpError is an exception class")
    return out

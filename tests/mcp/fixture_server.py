"""A small stdio MCP server for the tests: tools, a resource and a prompt.

Run as ``python fixture_server.py``; it speaks MCP over stdin/stdout until stdin closes.
"""

from __future__ import annotations

import asyncio
import os
import sys

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("pie-fixture", log_level="WARNING")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def fail(reason: str) -> str:
    """Always fails with ``reason``."""
    raise ToolError(reason)


@server.tool()
async def sleep(seconds: float) -> float:
    """Answer after ``seconds``."""
    await asyncio.sleep(seconds)
    return seconds


@server.tool()
def die(code: int = 3) -> str:
    """Kill the server process (the tests check that the engine survives it)."""
    print(f"fixture server exiting with code {code}", file=sys.stderr, flush=True)
    os._exit(code)


@server.tool()
def pid() -> int:
    """The server's process id (tells a restarted server from the first one)."""
    return os.getpid()


@server.resource("pie://greeting", mime_type="text/plain")
def greeting() -> str:
    """A fixed greeting."""
    return "hello from the fixture"


@server.prompt()
def review(code: str) -> str:
    """Ask for a code review."""
    return f"Please review this code:\n{code}"


if __name__ == "__main__":
    server.run("stdio")

"""A client's relay, faked in-process for the tests.

The "client" runs its MCP servers as ``MCPServer`` objects; each relayed request reaches the
named one through the ``mcp`` package's in-memory client transport, as a real client would
forward a relayed frame to its own server connection.
"""

from __future__ import annotations

from typing import Any, Mapping

from mcp import Client
from mcp.server.mcpserver import MCPServer

__all__ = ["InProcessRelay", "BrokenRelay", "notes_server"]


def notes_server() -> MCPServer:
    """A small server only the client has: one tool and one resource."""
    server = MCPServer("client-notes", log_level="WARNING")

    @server.tool()
    def shout(text: str) -> str:
        """Upper-case ``text``."""
        return text.upper()

    @server.resource("notes://today", mime_type="text/plain")
    def today() -> str:
        """Today's note."""
        return "buy milk"

    return server


class InProcessRelay:
    """Implements :class:`pie_core.mcp.McpRelay` over in-process servers; records requests."""

    def __init__(self, servers: Mapping[str, MCPServer]) -> None:
        self._servers = dict(servers)
        self.requests: list[tuple[str, str]] = []

    def servers(self) -> list[str]:
        return list(self._servers)

    async def request(self, server: str, method: str, params: Mapping[str, Any]) -> dict[str, Any]:
        self.requests.append((server, method))
        async with Client(self._servers[server]) as client:
            result = await _send(client, method, params)
        return result.model_dump(mode="json", by_alias=True, exclude_none=True)


class BrokenRelay:
    """A relay whose client has gone away."""

    def servers(self) -> list[str]:
        return ["gone"]

    async def request(self, server: str, method: str, params: Mapping[str, Any]) -> dict[str, Any]:
        raise ConnectionResetError("client disconnected")


async def _send(client: Client, method: str, params: Mapping[str, Any]) -> Any:
    if method == "tools/list":
        return await client.list_tools()
    if method == "tools/call":
        return await client.call_tool(params["name"], dict(params["arguments"]))
    if method == "resources/list":
        return await client.list_resources()
    if method == "resources/read":
        return await client.read_resource(params["uri"])
    if method == "prompts/list":
        return await client.list_prompts()
    if method == "prompts/get":
        return await client.get_prompt(params["name"], dict(params["arguments"]))
    raise ValueError(f"unknown method {method}")

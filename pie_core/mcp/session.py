"""One inferlet's session with one MCP server: the host resource behind the SDK's McpSession."""

from __future__ import annotations

from typing import Any, Mapping

from pie_core.errors import InvalidInput
from pie_core.mcp.endpoint import McpEndpoint

__all__ = ["ServerSession"]


class ServerSession:
    """A handle on an endpoint that stops working once released (the endpoint lives on)."""

    def __init__(self, endpoint: McpEndpoint) -> None:
        self.endpoint = endpoint
        self.closed = False

    @property
    def server(self) -> str:
        return self.endpoint.name

    async def request(self, method: str, params: Mapping[str, Any]) -> dict[str, Any]:
        """Send one request to the server.

        Raises:
            InvalidInput: The session was closed.
            McpError: The server failed (see :class:`~pie_core.mcp.endpoint.McpEndpoint`).
        """
        if self.closed:
            raise InvalidInput(f"the MCP session with {self.server!r} is closed; open another with mcp.connect({self.server!r})")
        return await self.endpoint.request(method, params)

    def release(self) -> None:
        """Close the session (idempotent); the shared server connection stays up."""
        self.closed = True

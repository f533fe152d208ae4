"""What the registry sends MCP requests to: a configured stdio server or a client's relay."""

from __future__ import annotations

from typing import Any, Mapping, Protocol

__all__ = ["McpEndpoint", "METHODS"]

# The MCP requests an inferlet can make (one per McpSession call of the SDK reference).
METHODS = ("tools/list", "tools/call", "resources/list", "resources/read", "prompts/list", "prompts/get")


class McpEndpoint(Protocol):
    """One MCP server as the engine reaches it."""

    @property
    def name(self) -> str:
        """The server's name as inferlets see it."""
        ...

    def prepare(self) -> None:
        """Begin any slow set-up (starting a process) without waiting for it; idempotent."""
        ...

    async def request(self, method: str, params: Mapping[str, Any]) -> dict[str, Any]:
        """Send one request and return the raw JSON-RPC ``result`` object.

        Args:
            method: One of :data:`METHODS`.
            params: The request's ``params`` object (plain JSON values).

        Raises:
            McpError: The server could not be reached, exited, timed out or answered with an error.
        """
        ...

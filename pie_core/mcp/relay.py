"""The seam for MCP servers a *client* registers: their calls travel back to that client.

A client of ``pie serve`` may run MCP servers on its own side (a local file system, a
browser, an IDE) and register them for the inferlets it launches. The server side implements
:class:`McpRelay` over the client's connection (a request frame out, the result frame back)
and attaches it to the instance it launches with :meth:`McpRegistry.attach_relay`. The engine
then treats each of the relay's servers like a configured one: ``mcp.available_servers()``
lists them for that instance only, and ``McpSession`` calls become :meth:`McpRelay.request`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Mapping, Protocol, runtime_checkable

from pie_core.mcp.errors import McpError

__all__ = ["McpRelay", "RelayedEndpoint"]


@runtime_checkable
class McpRelay(Protocol):
    """The MCP servers one client registered, reached through that client."""

    def servers(self) -> Sequence[str]:
        """Names of the servers the client registered (may change while it is connected)."""
        ...

    async def request(self, server: str, method: str, params: Mapping[str, Any]) -> dict[str, Any]:
        """Relay one MCP request to the client and return the raw JSON-RPC ``result`` object.

        Args:
            server: One of :meth:`servers`.
            method: One of :data:`pie_core.mcp.endpoint.METHODS`.
            params: The request's ``params`` object (plain JSON values).

        Raises:
            McpError: The client answered with an error, or is gone. Any other exception is
                reported to the inferlet as an :class:`McpError` too.
        """
        ...


class RelayedEndpoint:
    """A client-registered server as an :class:`~pie_core.mcp.endpoint.McpEndpoint`."""

    def __init__(self, name: str, relay: McpRelay) -> None:
        self._name = name
        self._relay = relay

    @property
    def name(self) -> str:
        return self._name

    def prepare(self) -> None:
        """Nothing to start: the client keeps its own connection to the server."""

    async def request(self, method: str, params: Mapping[str, Any]) -> dict[str, Any]:
        try:
            result = await self._relay.request(self._name, method, params)
        except McpError:
            raise
        except Exception as exc:  # a broken relay must not take the inferlet's error kind with it
            raise McpError(f"MCP server {self._name!r} (registered by the client) failed during {method}: "
                           f"{type(exc).__name__}: {exc}") from exc
        if not isinstance(result, dict):
            raise McpError(f"MCP server {self._name!r} (registered by the client) returned "
                           f"{type(result).__name__} for {method}, not a JSON object")
        return result

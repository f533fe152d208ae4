"""The engine's MCP servers: configured stdio servers plus the servers clients relay."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from pie_core import config as pie_config
from pie_core.errors import NotFound
from pie_core.mcp.endpoint import McpEndpoint
from pie_core.mcp.relay import McpRelay, RelayedEndpoint
from pie_core.mcp.servers import configured_servers
from pie_core.mcp.session import ServerSession
from pie_core.mcp.stdio import StdioConnection

__all__ = ["McpRegistry"]


class McpRegistry:
    """Finds an MCP server by name for an inferlet instance and owns the engine's connections.

    Configured servers (``[mcp.servers.NAME]``) are read from the config on first use; each has
    one connection, started lazily and shared by every inferlet. Relays are attached per
    instance: their servers are visible only to that instance and shadow a configured server
    of the same name.
    """

    def __init__(self, config: Any = None, *, log_dir: Path | None = None) -> None:
        self._config = config
        self._log_dir = log_dir
        self._stdio: dict[str, StdioConnection] | None = None
        self._relays: dict[str, McpRelay] = {}

    def attach_relay(self, owner: str, relay: McpRelay) -> None:
        """Make ``relay``'s servers available to the instance whose id is ``owner``."""
        if not isinstance(relay, McpRelay):
            raise TypeError(f"a relay needs servers() and async request(), got {type(relay).__name__}")
        self._relays[owner] = relay

    def detach_relay(self, owner: str) -> None:
        """Forget the relay of ``owner`` (no-op when none is attached)."""
        self._relays.pop(owner, None)

    def available(self, owner: str | None = None) -> list[str]:
        """Sorted names of the servers instance ``owner`` can connect to.

        Raises:
            InvalidInput: The ``[mcp.servers]`` configuration is malformed.
        """
        relay = self._relays.get(owner) if owner is not None else None
        return sorted(set(self._configured()) | set(relay.servers() if relay else ()))

    def open(self, name: str, owner: str | None = None) -> ServerSession:
        """Open a session with server ``name`` for instance ``owner``; a configured server's
        process starts in the background (call from within the engine's event loop).

        Raises:
            NotFound: No such server (the message lists those available).
            InvalidInput: The ``[mcp.servers]`` configuration is malformed.
        """
        endpoint = self._endpoint(name, owner)
        endpoint.prepare()
        return ServerSession(endpoint)

    def live_servers(self) -> list[str]:
        """Names of configured servers whose process is running or starting."""
        return sorted(name for name, conn in (self._stdio or {}).items() if conn.live)

    def connection(self, name: str) -> StdioConnection:
        """The connection of configured server ``name`` (for status and tests).

        Raises:
            NotFound: ``name`` is not configured.
        """
        try:
            return self._configured()[name]
        except KeyError:
            raise NotFound(f"no configured MCP server named {name!r}") from None

    async def close(self) -> None:
        """Stop every configured server's process; relays are left to their owners."""
        if self._stdio:
            await asyncio.gather(*(conn.close() for conn in self._stdio.values()))

    def _endpoint(self, name: str, owner: str | None) -> McpEndpoint:
        relay = self._relays.get(owner) if owner is not None else None
        if relay is not None and name in relay.servers():
            return RelayedEndpoint(name, relay)
        configured = self._configured()
        if name in configured:
            return configured[name]
        known = ", ".join(self.available(owner)) or "none"
        raise NotFound(f"no MCP server named {name!r}; available: {known} "
                       f"(configure one under [mcp.servers.NAME] in {pie_config.config_path()})")

    def _configured(self) -> dict[str, StdioConnection]:
        if self._stdio is None:
            log_dir = self._log_dir or pie_config.config_home() / "logs"
            specs = configured_servers(self._config)
            self._stdio = {name: StdioConnection(spec, log_dir) for name, spec in specs.items()}
        return self._stdio

"""MCP for inferlets: engine-configured stdio servers and servers a client relays.

Engine side of ``inferlet.mcp``: the :class:`McpRegistry` on each engine resolves a server
name for an instance, owns one shared connection per configured server and stops them at
engine shutdown. :class:`McpRelay` is the seam ``pie serve`` implements to relay calls to
servers its clients register.
"""

from pie_core.mcp.endpoint import METHODS, McpEndpoint
from pie_core.mcp.errors import McpError, check_tool_result
from pie_core.mcp.registry import McpRegistry
from pie_core.mcp.relay import McpRelay, RelayedEndpoint
from pie_core.mcp.servers import StdioServerSpec, configured_servers
from pie_core.mcp.session import ServerSession
from pie_core.mcp.stdio import StdioConnection

__all__ = [
    "METHODS",
    "McpEndpoint",
    "McpError",
    "McpRegistry",
    "McpRelay",
    "RelayedEndpoint",
    "ServerSession",
    "StdioConnection",
    "StdioServerSpec",
    "check_tool_result",
    "configured_servers",
]

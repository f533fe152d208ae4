"""Host interface ``mcp``: MCP servers an inferlet can call (configured on the engine, or
registered by the client that launched it).

Results are the raw JSON-RPC ``result`` objects as plain dicts. Sessions are resources of
the calling instance: they close when the inferlet ends.
"""

from __future__ import annotations

from typing import Any, Mapping

from inferlet.host._declare import host
from inferlet.host.types import McpSession

__all__ = ["available_servers", "call_tool", "close", "connect", "get_prompt", "is_closed", "list_prompts",
           "list_resources", "list_tools", "read_resource", "server_name"]


@host
def available_servers() -> list[str]:
    """Sorted names of the MCP servers the calling inferlet can connect to.

    Raises:
        InvalidInput: The ``[mcp.servers]`` configuration is malformed.
    """


@host
async def call_tool(
    session: McpSession, name: str, arguments: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Call tool ``name`` and return the raw ``tools/call`` result.

    Raises:
        InvalidInput: ``name`` is empty or ``arguments`` is not a JSON object.
        McpError: The tool reported a failure (``isError``), or the server failed.
    """


@host
def close(session: McpSession) -> None:
    """Close ``session``; later calls on it raise InvalidInput."""


@host
def connect(name: str) -> McpSession:
    """Open a session with server ``name``, owned by the caller; a configured server's
    process starts now, in the background (the first request waits for it).

    Raises:
        NotFound: No such server (the message lists the available ones).
        InvalidInput: ``name`` is not a non-empty string, or the configuration is malformed.
    """


@host
async def get_prompt(
    session: McpSession, name: str, arguments: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Render prompt ``name`` and return the raw ``prompts/get`` result.

    Raises:
        InvalidInput: ``name`` is empty, or ``arguments`` is not a mapping of strings to strings.
        McpError: The server failed or knows no such prompt.
    """


@host
def is_closed(session: McpSession) -> bool:
    """Whether ``session`` was closed (by :func:`close` or when its inferlet ended)."""


@host
async def list_prompts(session: McpSession) -> dict[str, Any]:
    """The raw ``prompts/list`` result (``{"prompts": [...]}``).

    Raises:
        McpError: The server failed.
    """


@host
async def list_resources(session: McpSession) -> dict[str, Any]:
    """The raw ``resources/list`` result (``{"resources": [...]}``).

    Raises:
        McpError: The server failed.
    """


@host
async def list_tools(session: McpSession) -> dict[str, Any]:
    """The raw ``tools/list`` result (``{"tools": [...]}``).

    Raises:
        McpError: The server failed or could not be started.
    """


@host
async def read_resource(session: McpSession, uri: str) -> dict[str, Any]:
    """The raw ``resources/read`` result for ``uri`` (``{"contents": [...]}``).

    Raises:
        InvalidInput: ``uri`` is not a non-empty string.
        McpError: The server failed or knows no such resource.
    """


@host
def server_name(session: McpSession) -> str:
    """The name of the server ``session`` talks to."""

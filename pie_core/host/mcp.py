"""Host interface ``mcp``: MCP servers an inferlet can call (configured on the engine, or
registered by the client that launched it).

Results are the raw JSON-RPC ``result`` objects as plain dicts. Sessions are resources of
the calling instance: they close when the inferlet ends.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from pie_core.errors import InvalidInput
from pie_core.host.binding import current
from pie_core.mcp.errors import McpError, check_tool_result
from pie_core.mcp.session import ServerSession

__all__ = [
    "available_servers",
    "connect",
    "close",
    "server_name",
    "is_closed",
    "list_tools",
    "call_tool",
    "list_resources",
    "read_resource",
    "list_prompts",
    "get_prompt",
    "ServerSession",
    "McpError",
]


def available_servers() -> list[str]:
    """Sorted names of the MCP servers the calling inferlet can connect to.

    Raises:
        InvalidInput: The ``[mcp.servers]`` configuration is malformed.
    """
    inst = current()
    return inst.engine.mcp.available(inst.id)


def connect(name: str) -> ServerSession:
    """Open a session with server ``name``, owned by the caller; a configured server's
    process starts now, in the background (the first request waits for it).

    Raises:
        NotFound: No such server (the message lists the available ones).
        InvalidInput: ``name`` is not a non-empty string, or the configuration is malformed.
    """
    if not isinstance(name, str) or not name:
        raise InvalidInput(f"an MCP server name must be a non-empty string, got {name!r}")
    inst = current()
    session = inst.engine.mcp.open(name, inst.id)
    inst.resources.add(session)
    return session


def close(session: ServerSession) -> None:
    """Close ``session``; later calls on it raise InvalidInput."""
    session.release()
    current().resources.discard(session)


def server_name(session: ServerSession) -> str:
    """The name of the server ``session`` talks to."""
    return session.server


def is_closed(session: ServerSession) -> bool:
    """Whether ``session`` was closed (by :func:`close` or when its inferlet ended)."""
    return session.closed


async def list_tools(session: ServerSession) -> dict[str, Any]:
    """The raw ``tools/list`` result (``{"tools": [...]}``).

    Raises:
        McpError: The server failed or could not be started.
    """
    return await session.request("tools/list", {})


async def call_tool(session: ServerSession, name: str, arguments: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Call tool ``name`` and return the raw ``tools/call`` result.

    Raises:
        InvalidInput: ``name`` is empty or ``arguments`` is not a JSON object.
        McpError: The tool reported a failure (``isError``), or the server failed.
    """
    _check_name("tool", name)
    result = await session.request("tools/call", {"name": name, "arguments": _json_object(arguments, "tool")})
    check_tool_result(session.server, name, result)
    return result


async def list_resources(session: ServerSession) -> dict[str, Any]:
    """The raw ``resources/list`` result (``{"resources": [...]}``).

    Raises:
        McpError: The server failed.
    """
    return await session.request("resources/list", {})


async def read_resource(session: ServerSession, uri: str) -> dict[str, Any]:
    """The raw ``resources/read`` result for ``uri`` (``{"contents": [...]}``).

    Raises:
        InvalidInput: ``uri`` is not a non-empty string.
        McpError: The server failed or knows no such resource.
    """
    _check_name("resource uri", uri)
    return await session.request("resources/read", {"uri": uri})


async def list_prompts(session: ServerSession) -> dict[str, Any]:
    """The raw ``prompts/list`` result (``{"prompts": [...]}``).

    Raises:
        McpError: The server failed.
    """
    return await session.request("prompts/list", {})


async def get_prompt(session: ServerSession, name: str, arguments: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Render prompt ``name`` and return the raw ``prompts/get`` result.

    Raises:
        InvalidInput: ``name`` is empty, or ``arguments`` is not a mapping of strings to strings.
        McpError: The server failed or knows no such prompt.
    """
    _check_name("prompt", name)
    args = _json_object(arguments, "prompt")
    bad = [k for k, v in args.items() if not isinstance(v, str)]
    if bad:
        raise InvalidInput(f"prompt arguments must be strings (MCP prompts take text); not strings: {', '.join(bad)}")
    return await session.request("prompts/get", {"name": name, "arguments": args})


def _check_name(what: str, value: Any) -> None:
    if not isinstance(value, str) or not value:
        raise InvalidInput(f"the {what} must be a non-empty string, got {value!r}")


def _json_object(arguments: Mapping[str, Any] | None, what: str) -> dict[str, Any]:
    if arguments is None:
        return {}
    if not isinstance(arguments, Mapping) or not all(isinstance(k, str) for k in arguments):
        raise InvalidInput(f"{what} arguments must be a dict with string keys, got {type(arguments).__name__}")
    try:
        return json.loads(json.dumps(dict(arguments)))
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"{what} arguments must be JSON values: {exc}") from None

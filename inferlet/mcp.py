"""MCP servers: ``from inferlet import mcp``.

Call the tools, resources and prompts of MCP servers configured on the engine
(``[mcp.servers.NAME]`` in ``~/.pie/config.toml``) or registered by your client::

    with mcp.connect("calc") as calc:
        tools = json.loads(await calc.list_tools())["tools"]
        result = json.loads(await calc.call_tool("add", {"a": 2, "b": 3}))

Every session call returns the raw JSON-RPC result as a JSON string, as in the reference. The
calls wait on another process. Where the runner lets an inferlet block (``pie serve --isolation
process`` or ``--isolation wasm``) a call blocks and returns the string, as the reference's
``s.list_tools() -> str`` reads, also inside ``async def main``; the string is awaitable too, so
``await s.list_tools()`` works there as well (while a call blocks, the inferlet's other tasks
wait). In-process (``pie run``'s default) the calls are coroutines: ``await`` them (see
:mod:`inferlet._blocking`).
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from inferlet.host import mcp as _host
from inferlet.host import types as _types
from inferlet.host.errors import InvalidInput, McpError
from inferlet import _blocking


__all__ = ["available_servers", "connect", "McpSession", "McpError"]


class McpSession:
    """A session with one MCP server. Use it as a context manager (``with`` or
    ``async with``) or call :meth:`close`; it also closes when the inferlet ends."""

    def __init__(self, handle: _types.McpSession) -> None:
        self._h = handle

    @property
    def server(self) -> str:
        """The server's name."""
        return _host.server_name(self._h)

    @_blocking.returns_str("s.list_tools()")
    async def list_tools(self) -> str:
        """The tools the server exposes.

        Returns:
            The raw ``tools/list`` result as JSON: ``{"tools": [{"name", "inputSchema", ...}]}``.

        Raises:
            McpError: The server failed or could not be started.
        """
        return _dump(await _host.list_tools(self._h))

    @_blocking.returns_str("s.call_tool(...)")
    async def call_tool(self, name: str, args: Mapping[str, Any] | str | None = None) -> str:
        """Invoke tool ``name``.

        Args:
            name: The tool's name.
            args: Its arguments: a dict, or a JSON object as a string.

        Returns:
            The raw ``tools/call`` result as JSON: ``{"content": [...], "isError": false, ...}``.

        Raises:
            McpError: The tool reported a failure (the message carries its text), or the
                server failed.
            InvalidInput: ``args`` is not a JSON object.
        """
        return _dump(await _host.call_tool(self._h, name, _args(args)))

    @_blocking.returns_str("s.list_resources()")
    async def list_resources(self) -> str:
        """The resources the server offers: the raw ``resources/list`` result as JSON."""
        return _dump(await _host.list_resources(self._h))

    @_blocking.returns_str("s.read_resource(uri)")
    async def read_resource(self, uri: str) -> str:
        """Fetch the resource ``uri``: the raw ``resources/read`` result as JSON
        (``{"contents": [{"uri", "text" | "blob", ...}]}``).

        Raises:
            McpError: No such resource, or the server failed.
        """
        return _dump(await _host.read_resource(self._h, uri))

    @_blocking.returns_str("s.list_prompts()")
    async def list_prompts(self) -> str:
        """The server's prompt templates: the raw ``prompts/list`` result as JSON."""
        return _dump(await _host.list_prompts(self._h))

    @_blocking.returns_str("s.get_prompt(...)")
    async def get_prompt(self, name: str, args: Mapping[str, str] | str | None = None) -> str:
        """Render prompt template ``name`` with string ``args`` (a dict, or a JSON object string).

        Returns:
            The raw ``prompts/get`` result as JSON: ``{"messages": [{"role", "content"}], ...}``.

        Raises:
            McpError: No such prompt, or the server failed.
            InvalidInput: ``args`` is not an object of strings.
        """
        return _dump(await _host.get_prompt(self._h, name, _args(args)))

    def close(self) -> None:
        """Close the session; its calls then raise InvalidInput."""
        _host.close(self._h)

    def __enter__(self) -> McpSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> McpSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


def available_servers() -> list[str]:
    """Names of the MCP servers this inferlet can connect to (configured on the engine or
    registered by its client), sorted."""
    return _host.available_servers()


def connect(server_name: str | None = None, *, name: str | None = None) -> McpSession:
    """Open a session with server ``server_name`` (also accepted as ``name=``).

    Raises:
        NotFound: No such server; the message lists the available ones.
        TypeError: Both names given, or neither.
    """
    if (server_name is None) == (name is None):
        raise TypeError("mcp.connect() takes the server's name once: connect(server_name) or connect(name=...)")
    return McpSession(_host.connect(server_name if name is None else name))


def _args(args: Mapping[str, Any] | str | None) -> Mapping[str, Any] | None:
    if not isinstance(args, str):
        return args
    try:
        value = json.loads(args)
    except ValueError as exc:
        raise InvalidInput(f"arguments given as a string must be a JSON object: {exc}") from None
    if not isinstance(value, dict):
        raise InvalidInput(f"arguments given as a string must be a JSON object, got {type(value).__name__}")
    return value


def _dump(result: dict[str, Any]) -> str:
    return json.dumps(result, ensure_ascii=False)

"""MCP servers a client registers with ``pie serve``: the client answers their relayed calls.

Inferlets the client launches see these servers in ``mcp.available_servers()``; each call they
make arrives here as an ``mcp_request`` frame and is forwarded to the local server, and the
answer goes back as an ``mcp_result`` request. Three kinds of server can be registered:

- an open ``mcp.Client`` or ``mcp.ClientSession`` (the caller keeps it open and closes it);
- anything ``mcp.Client(...)`` can open: ``mcp.StdioServerParameters`` (a local process), an
  ``MCPServer`` or low-level ``Server`` object (in memory), or a URL. The client opens it at
  registration and closes it on unregister or close;
- a function ``(method, params) -> result dict``, async or not (a plain function runs in a
  worker thread so it cannot stall the connection).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from pie_core.mcp.endpoint import METHODS
from pie_core.mcp.errors import McpError

__all__ = ["McpHandler", "RegisteredServers"]

log = logging.getLogger("pie.client")

#: A function answering relayed requests: ``(method, params)`` to the raw JSON-RPC result.
McpHandler = Callable[[str, dict[str, Any]], "Awaitable[dict[str, Any]] | dict[str, Any]"]

Request = Callable[..., Awaitable[Any]]


class RegisteredServers:
    """The servers one :class:`~pie_core.client.Client` registered, by name.

    Args:
        request: The client's ``request(type, **fields)``, used for ``mcp_register``,
            ``mcp_unregister`` and ``mcp_result``.
    """

    def __init__(self, request: Request) -> None:
        self._request = request
        self._targets: dict[str, _Target] = {}
        self._answering: set[asyncio.Task[None]] = set()

    def names(self) -> list[str]:
        return sorted(self._targets)

    async def add(self, name: str, server: Any, timeout: float) -> list[str]:
        """Open ``server`` if the client owns it, then register ``name`` with the server.

        Raises:
            TypeError: ``server`` is none of the accepted kinds.
            McpError: The client could not open ``server``.
            ServerError: The server refused the name or the timeout.
        """
        target = await _open(name, server)
        try:
            registered = await self._request("mcp_register", servers=[name], timeout=timeout)
        except BaseException:
            await target.close()
            raise
        old, self._targets[name] = self._targets.get(name), target
        if old is not None:
            await old.close()
        return list(registered["servers"])

    async def remove(self, name: str) -> list[str]:
        """Unregister ``name`` (calls in flight to it fail on the server) and close it if owned."""
        registered = await self._request("mcp_unregister", servers=[name])
        target = self._targets.pop(name, None)
        if target is not None:
            await target.close()
        return list(registered["servers"])

    def answer(self, frame: dict[str, Any]) -> None:
        """Start answering one ``mcp_request`` frame (in a task: the reader must not wait)."""
        task = asyncio.get_running_loop().create_task(self._answer(frame), name=f"pie-mcp-call-{frame.get('call')}")
        self._answering.add(task)
        task.add_done_callback(self._answering.discard)

    async def close(self) -> None:
        """Stop answering and close every server the client opened."""
        for task in list(self._answering):
            task.cancel()
        await asyncio.gather(*self._answering, return_exceptions=True)
        targets, self._targets = list(self._targets.values()), {}
        await asyncio.gather(*(t.close() for t in targets), return_exceptions=True)

    async def _answer(self, frame: dict[str, Any]) -> None:
        answer: dict[str, Any]
        try:
            result = await self._forward(frame.get("server"), frame.get("method"), frame.get("params") or {})
            answer = {"result": result}
        except Exception as exc:
            answer = {"error": _error(exc)}
        try:
            await self._request("mcp_result", call=frame.get("call"), **answer)
        except Exception as exc:  # late (the call timed out) or the connection is gone
            log.debug("relayed MCP call %s was not answered: %s", frame.get("call"), exc)

    async def _forward(self, server: Any, method: Any, params: dict[str, Any]) -> dict[str, Any]:
        target = self._targets.get(server) if isinstance(server, str) else None
        if target is None:
            raise LookupError(f"this client has no MCP server named {server!r}; it registered: "
                              f"{', '.join(self.names()) or 'none'}")
        if method not in METHODS:
            raise ValueError(f"unsupported MCP method {method!r}; relayed methods: {', '.join(METHODS)}")
        result = await target.request(method, params)
        if not isinstance(result, dict):
            raise TypeError(f"the handler of {server!r} returned {type(result).__name__} for {method}, not a dict")
        try:
            return json.loads(json.dumps(result))
        except (TypeError, ValueError) as exc:
            raise TypeError(f"the result of {server!r} for {method} is not JSON data: {exc}") from None


class _Target:
    """One registered server on the client's side."""

    async def request(self, method: str, params: dict[str, Any]) -> Any:
        raise NotImplementedError

    async def close(self) -> None:
        """Release what the client opened for it (nothing by default)."""


class _Session(_Target):
    """An open ``mcp.Client`` / ``ClientSession``; its owner closes it."""

    def __init__(self, session: Any) -> None:
        self.session = session

    async def request(self, method: str, params: dict[str, Any]) -> Any:
        s = self.session
        if method == "tools/call":
            result = await s.call_tool(params["name"], dict(params.get("arguments") or {}))
        elif method == "resources/read":
            result = await s.read_resource(params["uri"])
        elif method == "prompts/get":
            result = await s.get_prompt(params["name"], dict(params.get("arguments") or {}))
        else:  # tools/list -> list_tools(), resources/list, prompts/list alike
            noun, _ = method.split("/")
            result = await getattr(s, f"list_{noun}")()
        return result.model_dump(mode="json", by_alias=True, exclude_none=True)


class _Owned(_Session):
    """A server the client opened with ``mcp.Client(spec)``, held open by its own task (the
    ``mcp`` client's context manager must be entered and left in one task)."""

    def __init__(self, name: str, spec: Any) -> None:
        super().__init__(None)
        self.name, self.spec = name, spec
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def open(self) -> None:
        ready: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._task = asyncio.get_running_loop().create_task(self._hold(ready), name=f"pie-mcp-{self.name}")
        try:
            self.session = await ready
        except Exception as exc:
            raise McpError(f"could not open MCP server {self.name!r} on this client: {_describe(exc)}") from None

    async def close(self) -> None:
        self._stop.set()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)

    async def _hold(self, ready: asyncio.Future[Any]) -> None:
        from mcp import Client

        try:
            async with Client(self.spec) as client:
                ready.set_result(client)
                await self._stop.wait()
        except BaseException as exc:  # noqa: BLE001 - reported to open(), or logged once running
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else McpError(repr(exc)))
            else:
                log.warning("MCP server %r on this client stopped: %s", self.name, _describe(exc))
            if isinstance(exc, asyncio.CancelledError):
                raise


class _Function(_Target):
    """A handler function; a plain (not async) one runs in a worker thread."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))

    async def request(self, method: str, params: dict[str, Any]) -> Any:
        if self.is_async:
            return await self.fn(method, params)
        result = await asyncio.to_thread(self.fn, method, params)
        return await result if inspect.isawaitable(result) else result


async def _open(name: str, server: Any) -> _Target:
    from mcp import Client, ClientSession, StdioServerParameters
    from mcp.server import MCPServer, Server

    if isinstance(server, (Client, ClientSession)):
        return _Session(server)
    if isinstance(server, (StdioServerParameters, MCPServer, Server, str)):
        owned = _Owned(name, server)
        await owned.open()
        return owned
    if callable(server):
        return _Function(server)
    raise TypeError(f"register_mcp_server({name!r}, ...) takes an open mcp.Client or ClientSession, "
                    f"StdioServerParameters, an MCPServer or Server, a URL, or a function (method, params) -> dict; "
                    f"got {type(server).__name__}")


def _error(exc: BaseException) -> dict[str, Any]:
    """The ``error`` map of an ``mcp_result`` for a failed forward."""
    code = getattr(exc, "code", None)
    message = getattr(exc, "message", None)
    if isinstance(code, int) and not isinstance(code, bool) and isinstance(message, str):  # mcp.MCPError
        return {"message": message, "code": code}
    return {"message": f"{type(exc).__name__}: {exc}"}


def _describe(exc: BaseException) -> str:
    """The innermost messages of ``exc`` (anyio wraps failures in exception groups)."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(e) for e in exc.exceptions)
    return f"{type(exc).__name__}: {exc}"

"""MCP servers a client registers, relayed over its ``pie serve`` connection.

A :class:`ConnectionRelay` belongs to one WebSocket connection. The client names its servers
with ``mcp_register``; every process that connection launches gets :meth:`ConnectionRelay.bound`
(an :class:`~pie_core.mcp.McpRelay`), so those names are visible to it and shadow configured
servers of the same name. Each relayed call goes out as an ``mcp_request`` frame carrying a
``call`` number and waits for the client's ``mcp_result`` request with that number, for at
most the time limit the client registered the server with. A call fails with
:class:`~pie_core.mcp.McpError` naming the server when the client answers with an error, runs
past that limit, unregisters the server or disconnects. See docs/server.md and docs/mcp.md.
"""

from __future__ import annotations

import asyncio
import itertools
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Mapping

from pie_core.errors import InvalidInput, NotFound
from pie_core.mcp.errors import McpError
from pie_core.server.protocol import mcp_request_frame

__all__ = ["ConnectionRelay", "ProcessRelay", "DEFAULT_TIMEOUT_S", "MAX_TIMEOUT_S", "MAX_SERVERS"]

DEFAULT_TIMEOUT_S = 60.0
MAX_TIMEOUT_S = 3600.0
MAX_SERVERS = 64
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


@dataclass(slots=True)
class _Call:
    """A relayed request waiting for the client's ``mcp_result``."""

    server: str
    method: str
    answer: asyncio.Future[dict[str, Any]]


class ConnectionRelay:
    """The servers one connection registered, and its relayed calls in flight.

    Args:
        send: Sends one frame to the client (the connection's ``send``); raising means the
            client is gone.
    """

    def __init__(self, send: Callable[[bytes], Awaitable[None]]) -> None:
        self._send = send
        self._timeouts: dict[str, float] = {}  # registered name -> seconds per call
        self._calls: dict[int, _Call] = {}
        self._numbers = itertools.count(1)
        self._closed: str | None = None

    def servers(self) -> list[str]:
        """Sorted names the client has registered (none once it disconnected)."""
        return sorted(self._timeouts)

    def bound(self, process: str) -> ProcessRelay:
        """The :class:`~pie_core.mcp.McpRelay` for process ``process`` (named in its frames)."""
        return ProcessRelay(self, process)

    def register(self, names: Any, timeout: Any = DEFAULT_TIMEOUT_S) -> list[str]:
        """Add (or re-time) ``names``; returns every registered name.

        Raises:
            InvalidInput: ``names`` is not a non-empty list of names like ``notes`` or
                ``my-files.v2``, ``timeout`` is not in ``(0, 3600]`` seconds, or the connection
                would pass :data:`MAX_SERVERS`. Nothing is registered then.
        """
        wanted = _names(names, "mcp_register")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= MAX_TIMEOUT_S:
            raise InvalidInput(f"mcp_register field 'timeout' must be seconds in (0, {MAX_TIMEOUT_S:g}], got {timeout!r}")
        if len(set(self._timeouts) | set(wanted)) > MAX_SERVERS:
            raise InvalidInput(f"a connection may register at most {MAX_SERVERS} MCP servers; "
                               f"it has {len(self._timeouts)} and asked for {len(wanted)} more")
        for name in wanted:
            self._timeouts[name] = float(timeout)
        return self.servers()

    def unregister(self, names: Any) -> list[str]:
        """Remove ``names`` (calls in flight to them fail); returns the names still registered.

        Raises:
            InvalidInput: ``names`` is malformed or names a server this connection did not register.
        """
        wanted = _names(names, "mcp_unregister")
        unknown = [n for n in wanted if n not in self._timeouts]
        if unknown:
            raise InvalidInput(f"this connection registered no MCP server named {', '.join(map(repr, unknown))}; "
                               f"registered: {', '.join(self.servers()) or 'none'}")
        for name in wanted:
            del self._timeouts[name]
        self._fail(lambda call: call.server in wanted, "the client unregistered it")
        return self.servers()

    def resolve(self, call: Any, result: Any = None, error: Any = None) -> None:
        """Complete relayed call ``call`` with the client's ``result`` or ``error``.

        Raises:
            InvalidInput: Not exactly one of ``result`` (a map) and ``error`` (a map with a
                string ``message`` and an optional integer ``code``); the call keeps waiting.
            NotFound: No call ``call`` is waiting (it timed out, failed or was answered).
        """
        if (result is None) == (error is None):
            raise InvalidInput("mcp_result needs exactly one of 'result' (the JSON-RPC result object) and 'error'")
        if result is not None and not isinstance(result, dict):
            raise InvalidInput(f"mcp_result field 'result' must be a map (the JSON-RPC result object), "
                               f"got {type(result).__name__}")
        failure = _error_text(error) if error is not None else None
        pending = self._calls.pop(call, None) if isinstance(call, int) and not isinstance(call, bool) else None
        if pending is None:
            raise NotFound(f"no relayed MCP call {call!r} is waiting for an answer on this connection "
                           "(it timed out, failed or was answered already)")
        if pending.answer.done():
            return
        if isinstance(result, dict):
            pending.answer.set_result(result)
        else:
            pending.answer.set_exception(McpError(f"MCP server {pending.server!r} (registered by the client) "
                                                  f"answered {pending.method} with an error: {failure}"))

    def close(self, reason: str = "the client disconnected") -> None:
        """The connection is gone: forget every name and fail every call in flight."""
        self._closed = reason
        self._timeouts.clear()
        self._fail(lambda call: True, reason)

    async def request(self, process: str, server: str, method: str, params: Mapping[str, Any]) -> dict[str, Any]:
        """Send one relayed request for ``process`` and wait for the client's answer.

        Raises:
            McpError: The server is not registered (any more), the client is gone, answered
                with an error, or did not answer within the server's time limit.
        """
        where = f"MCP server {server!r} (registered by the client)"
        if self._closed is not None:
            raise McpError(f"{where} cannot take {method}: {self._closed}")
        timeout = self._timeouts.get(server)
        if timeout is None:
            raise McpError(f"{where} cannot take {method}: the client no longer registers it")
        number = next(self._numbers)
        answer: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._calls[number] = _Call(server, method, answer)
        frame = mcp_request_frame(number, process, server, method, dict(params))
        try:
            async with asyncio.timeout(timeout):
                try:
                    await self._send(frame)
                except Exception as exc:
                    raise McpError(f"{where} cannot take {method}: the connection to the client failed "
                                   f"({type(exc).__name__}: {exc})") from None
                return await answer
        except TimeoutError:
            raise McpError(f"{where} did not answer {method} within {timeout:g}s "
                           "(the client sets the limit with mcp_register's 'timeout')") from None
        finally:
            self._calls.pop(number, None)

    def _fail(self, which: Callable[[_Call], bool], reason: str) -> None:
        for number, call in list(self._calls.items()):
            if which(call):
                del self._calls[number]
                if not call.answer.done():
                    call.answer.set_exception(McpError(f"MCP server {call.server!r} (registered by the client) "
                                                       f"did not answer {call.method}: {reason}"))


class ProcessRelay:
    """One process's view of its launching connection's relay (an :class:`~pie_core.mcp.McpRelay`)."""

    def __init__(self, relay: ConnectionRelay, process: str) -> None:
        self._relay = relay
        self.process = process

    def servers(self) -> Sequence[str]:
        return self._relay.servers()

    async def request(self, server: str, method: str, params: Mapping[str, Any]) -> dict[str, Any]:
        return await self._relay.request(self.process, server, method, params)


def _names(names: Any, request: str) -> list[str]:
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise InvalidInput(f"{request} field 'servers' must be a non-empty list of server names, got {names!r}")
    bad = [n for n in names if not _NAME.fullmatch(n)]
    if bad:
        raise InvalidInput(f"MCP server names are 1-64 characters [A-Za-z0-9._-] starting with a letter or digit; "
                           f"got {', '.join(map(repr, bad))}")
    return list(dict.fromkeys(names))


def _error_text(error: Any) -> str:
    """``message (code N)`` of an ``mcp_result`` error map."""
    if not isinstance(error, dict) or not isinstance(error.get("message"), str):
        raise InvalidInput(f"mcp_result field 'error' must be a map with a string 'message', got {error!r}")
    code = error.get("code")
    if code is not None and (isinstance(code, bool) or not isinstance(code, int)):
        raise InvalidInput(f"mcp_result error 'code' must be an integer, got {code!r}")
    return error["message"] + (f" (code {code})" if code is not None else "")

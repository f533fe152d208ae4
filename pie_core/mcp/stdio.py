"""One live connection to one configured stdio MCP server, shared by every inferlet.

The server process starts on the first ``connect`` (in the background) and stays up until the
engine closes. The connection lives in its own asyncio task because the ``mcp`` client's
context managers must be entered and left in one task; inferlets' requests travel over it
concurrently (JSON-RPC ids keep them apart). When the process exits, in-flight and later
requests fail with :class:`McpError` carrying the tail of the server's stderr log, and the
next request starts a fresh process.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any, Mapping

from pie_core.mcp.errors import McpError
from pie_core.mcp.servers import StdioServerSpec

__all__ = ["StdioConnection"]

_LOG_TAIL_LINES = 8
_MIN_START_SECONDS = 30.0  # start-up may take longer than a request (npx, uvx, imports)


class StdioConnection:
    """The engine's connection to the server ``spec`` (an :class:`McpEndpoint`)."""

    def __init__(self, spec: StdioServerSpec, log_dir: Path) -> None:
        self.spec = spec
        self.log_path = log_dir / f"mcp-{re.sub(r'[^A-Za-z0-9._-]', '_', spec.name)}.log"
        self.starts = 0  # processes started so far (restarts after a crash included)
        self._task: asyncio.Task[None] | None = None
        self._ready: asyncio.Future[Any] | None = None
        self._stop: asyncio.Event | None = None
        self._closing: set[asyncio.Task[None]] = set()

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def live(self) -> bool:
        """True while a server process is started or starting (and not known to have exited)."""
        return self._task is not None and not self._task.done() and not (self._stop and self._stop.is_set())

    def prepare(self) -> None:
        """Start the server process in the background unless one is up or starting."""
        loop = asyncio.get_running_loop()
        if self.live:
            assert self._task is not None
            if self._task.get_loop() is not loop:
                raise McpError(f"MCP server {self.name!r} is connected from another event loop; one engine serves one loop")
            return
        if self._stop is not None:
            self._retire(self._stop)  # it exited (or never started): its task finishes on its own
        self._ready = loop.create_future()
        self._ready.add_done_callback(lambda f: f.cancelled() or f.exception())  # read by waiters
        self._stop = asyncio.Event()
        self._task = loop.create_task(self._serve(self._ready, self._stop), name=f"pie-mcp-{self.name}")
        self.starts += 1

    async def request(self, method: str, params: Mapping[str, Any]) -> dict[str, Any]:
        from mcp import MCPError
        from mcp.types import CONNECTION_CLOSED

        self.prepare()
        ready, stop = self._ready, self._stop
        assert ready is not None and stop is not None
        session = await asyncio.shield(ready)
        try:
            async with asyncio.timeout(self.spec.timeout):
                result = await _call(session, method, params)
        except TimeoutError:
            raise McpError(f"MCP server {self.name!r} did not answer {method} within {self.spec.timeout:g}s "
                           f"(raise [mcp.servers.{self.name}] timeout)") from None
        except MCPError as exc:
            if exc.code == CONNECTION_CLOSED:
                self._retire(stop)
                raise McpError(f"MCP server {self.name!r} exited during {method}{self._log_tail()}; "
                               "the next call starts it again") from None
            raise McpError(f"MCP server {self.name!r} refused {method}: {exc.message} (code {exc.code})") from None
        return result.model_dump(mode="json", by_alias=True, exclude_none=True)

    async def close(self) -> None:
        """Stop the server process (stdin closed, then terminated if it lingers) and wait for it."""
        if self._stop is not None:
            self._retire(self._stop)
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)

    def _retire(self, stop: asyncio.Event) -> None:
        """Let the connection task behind ``stop`` finish; a later request starts a new one."""
        stop.set()
        if stop is self._stop and self._task is not None:
            task, self._task = self._task, None
            if not task.done():
                if self._ready is not None and not self._ready.done():
                    task.cancel()  # still starting: nothing to wait for (the mcp client reaps the process)
                self._closing.add(task)
                task.add_done_callback(self._closing.discard)

    async def _serve(self, ready: asyncio.Future[Any], stop: asyncio.Event) -> None:
        import anyio
        from mcp import ClientSession, StdioServerParameters
        from mcp.client.stdio import stdio_client

        spec = self.spec
        params = StdioServerParameters(command=spec.command, args=list(spec.args), env=spec.env or None, cwd=spec.cwd)
        try:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.log_path, "a", encoding="utf-8") as errlog:
                async with stdio_client(params, errlog=errlog) as (read, write), anyio.create_task_group() as tg:
                    # Messages pass through a pump that notices the process's stdout closing, so
                    # a server that dies while idle is replaced on the next call, not failed.
                    inner_send, inner_read = anyio.create_memory_object_stream[Any](0)
                    tg.start_soon(_pump, read, inner_send, stop)
                    async with ClientSession(inner_read, write) as session:
                        with anyio.fail_after(max(spec.timeout, _MIN_START_SECONDS)):
                            await session.initialize()
                        ready.set_result(session)
                        await stop.wait()
                    tg.cancel_scope.cancel()
        except BaseException as exc:  # noqa: BLE001 - reported to every waiter
            if not ready.done():
                ready.set_exception(McpError(
                    f"MCP server {spec.name!r} failed to start ({spec.command} {' '.join(spec.args)}): "
                    f"{_describe(exc)}{self._log_tail()}; check [mcp.servers.{spec.name}] in the config"
                ))
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            if not ready.done():
                ready.set_exception(McpError(f"MCP server {spec.name!r} stopped before it was ready"))

    def _log_tail(self) -> str:
        try:
            lines = self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            return ""
        tail = [line for line in lines[-_LOG_TAIL_LINES:] if line.strip()]
        return f"; its stderr ({self.log_path}) ends with: {' | '.join(tail)}" if tail else ""


async def _pump(source: Any, sink: Any, stop: asyncio.Event) -> None:
    """Forward the server's messages to the session; at end of stream, stop the connection."""
    try:
        async with sink:
            async for item in source:
                await sink.send(item)
    finally:
        stop.set()


async def _call(session: Any, method: str, params: Mapping[str, Any]) -> Any:
    """Send ``method`` through the typed ``ClientSession`` call that matches it."""
    if method == "tools/list":
        return await session.list_tools()
    if method == "tools/call":
        return await session.call_tool(params["name"], dict(params.get("arguments") or {}))
    if method == "resources/list":
        return await session.list_resources()
    if method == "resources/read":
        return await session.read_resource(params["uri"])
    if method == "prompts/list":
        return await session.list_prompts()
    if method == "prompts/get":
        return await session.get_prompt(params["name"], dict(params.get("arguments") or {}))
    raise McpError(f"unsupported MCP method {method!r}")


def _describe(exc: BaseException) -> str:
    """The innermost messages of ``exc`` (anyio wraps failures in exception groups)."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(e) for e in exc.exceptions)
    if isinstance(exc, TimeoutError):
        return "no answer to the MCP initialize request in time"
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if not isinstance(exc, McpError) else text


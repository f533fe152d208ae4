"""One client's WebSocket connection: authenticate, then answer requests in order.

Every request gets exactly one response with its ``id``; a request that fails gets an error
response and changes nothing, and the connection goes on. Events of the processes the
connection is attached to are pushed by :class:`~pie_core.server.processes.ProcessTable`.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from pie_core.errors import InvalidInput, PieError
from pie_core.server.mcp_relay import DEFAULT_TIMEOUT_S, ConnectionRelay
from pie_core.server.protocol import decode_frame, field, request_id, response_error, response_ok
from pie_core.server.store import Upload

if TYPE_CHECKING:
    from pie_core.server.app import PieServer

__all__ = ["ClientSession"]

Handler = Callable[["ClientSession", dict[str, Any]], Awaitable[Any]]
_HANDLERS: dict[str, Handler] = {}
MAX_PAUSE_S = 0.05  # the longest a connection waits after one request for its fair share


def _handles(kind: str) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        _HANDLERS[kind] = fn
        return fn

    return register


class ClientSession:
    """State of one connection: its user (once authenticated), its open uploads and the MCP
    servers it registered."""

    def __init__(self, server: PieServer, ws: ServerConnection, user: str | None) -> None:
        self.server = server
        self.ws = ws
        self.user = user
        self.uploads: set[str] = set()
        self.mcp = ConnectionRelay(ws.send)

    async def run(self) -> None:
        """Answer frames until the client goes away, then release what it left behind.

        Frames are answered one at a time, and after each the connection waits as long as the
        request kept the event loop busy (at least one turn, at most ``MAX_PAUSE_S``): a client
        that pipelines thousands of requests gets at most about half of the loop, however cheap
        or dear its requests, and everyone else the rest. What it has sent but we have not read
        waits in its socket (the server reads ahead ``max_queue`` frames at most).
        """
        try:
            async for message in self.ws:
                cpu = time.thread_time()
                reply = await self.answer(message)
                await self.ws.send(reply)
                # most handlers never suspend: without a pause, one pipelining client holds the loop
                await asyncio.sleep(min(time.thread_time() - cpu, MAX_PAUSE_S))
        except ConnectionClosed:
            pass
        finally:
            self.mcp.close("the client disconnected")
            self.server.processes.connection_closed(self.ws)
            if self.user is not None:
                for uid in self.uploads:
                    self.server.store.drop(self.user, uid)

    async def answer(self, message: bytes | str) -> bytes:
        """The response frame for one incoming frame (never raises)."""
        rid: int | None = None
        try:
            frame = decode_frame(message)
            rid = frame["id"]
            if frame["type"] not in ("auth", "ping") and self.user is None:
                self.user = self.server.auth.check(None)  # raises unless auth is off
            result = await _HANDLERS[frame["type"]](self, frame)
            return response_ok(rid, result)
        except Exception as exc:
            if rid is None and not isinstance(message, str):
                rid = request_id(message)
            if not isinstance(exc, PieError):
                self.server.log_exception(exc)
            return response_error(rid, exc)

    @property
    def uid(self) -> str:
        assert self.user is not None
        return self.user


@_handles("auth")
async def _auth(s: ClientSession, frame: dict[str, Any]) -> Any:
    user = s.server.auth.check(field(frame, "token", str))
    if s.user is not None and user != s.user:
        raise InvalidInput(f"this connection is already authenticated as {s.user!r}; open a new connection for {user!r}")
    s.server.connections.authenticate(s.ws, user)  # raises while the user has all its connections open
    s.user = user
    return {"user": user}


@_handles("ping")
async def _ping(s: ClientSession, frame: dict[str, Any]) -> Any:
    return {"pong": time.time(), "data": frame.get("data")}


@_handles("list_models")
async def _list_models(s: ClientSession, frame: dict[str, Any]) -> Any:
    return s.server.model_list()


@_handles("list_programs")
async def _list_programs(s: ClientSession, frame: dict[str, Any]) -> Any:
    return s.server.store.names(s.uid)


@_handles("upload_begin")
async def _upload_begin(s: ClientSession, frame: dict[str, Any]) -> Any:
    got = s.server.store.begin(s.uid, field(frame, "size", int), field(frame, "sha256", str))
    if isinstance(got, Upload):
        s.uploads.add(got.id)
        return {"upload": got.id, "stored": False, "chunk_size": s.server.options.chunk_size}
    return {"upload": None, "stored": True, "name": got.name, "version": got.version}


@_handles("upload_chunk")
async def _upload_chunk(s: ClientSession, frame: dict[str, Any]) -> Any:
    uid = field(frame, "upload", str)
    return {"received": s.server.store.chunk(s.uid, uid, field(frame, "data", bytes))}


@_handles("upload_end")
async def _upload_end(s: ClientSession, frame: dict[str, Any]) -> Any:
    uid = field(frame, "upload", str)
    s.uploads.discard(uid)
    manifest = await s.server.store.finish(s.uid, uid)  # hashes and unpacks in a worker thread
    return {"name": manifest.name, "version": manifest.version}


@_handles("launch")
async def _launch(s: ClientSession, frame: dict[str, Any]) -> Any:
    manifest = s.server.store.resolve(s.uid, field(frame, "program", str))
    args = manifest.validate_input(field(frame, "input", dict, default={}))
    proc = s.server.processes.launch(s.uid, manifest, args, s.ws, relay=s.mcp)
    if field(frame, "detached", bool, default=False):
        s.server.processes.detach(s.uid, proc.id)
    return {"process": proc.id, "program": proc.program}


@_handles("attach")
async def _attach(s: ClientSession, frame: dict[str, Any]) -> Any:
    pid = field(frame, "process", str)
    return {"process": pid, "buffered": s.server.processes.attach(s.uid, pid, s.ws)}


@_handles("detach")
async def _detach(s: ClientSession, frame: dict[str, Any]) -> Any:
    s.server.processes.detach(s.uid, field(frame, "process", str))
    return None


@_handles("send")
async def _send(s: ClientSession, frame: dict[str, Any]) -> Any:
    s.server.processes.deliver_message(s.uid, field(frame, "process", str), field(frame, "message", str))
    return None


@_handles("transfer_file")
async def _transfer_file(s: ClientSession, frame: dict[str, Any]) -> Any:
    data = field(frame, "data", bytes)
    if len(data) > s.server.options.max_upload:
        raise InvalidInput(f"files are limited to {s.server.options.max_upload} bytes, got {len(data)}")
    s.server.processes.deliver_file(s.uid, field(frame, "process", str), data)
    return {"size": len(data)}


@_handles("signal")
async def _signal(s: ClientSession, frame: dict[str, Any]) -> Any:
    s.server.processes.deliver_message(s.uid, field(frame, "process", str), field(frame, "signal", str))
    return None


@_handles("terminate")
async def _terminate(s: ClientSession, frame: dict[str, Any]) -> Any:
    s.server.processes.terminate(s.uid, field(frame, "process", str))
    return None


@_handles("list_processes")
async def _list_processes(s: ClientSession, frame: dict[str, Any]) -> Any:
    return [p.describe() for p in s.server.processes.of_user(s.uid)]


@_handles("mcp_register")
async def _mcp_register(s: ClientSession, frame: dict[str, Any]) -> Any:
    return {"servers": s.mcp.register(frame.get("servers"), frame.get("timeout", DEFAULT_TIMEOUT_S))}


@_handles("mcp_unregister")
async def _mcp_unregister(s: ClientSession, frame: dict[str, Any]) -> Any:
    return {"servers": s.mcp.unregister(frame.get("servers"))}


@_handles("mcp_result")
async def _mcp_result(s: ClientSession, frame: dict[str, Any]) -> Any:
    s.mcp.resolve(frame.get("call"), frame.get("result"), frame.get("error"))
    return None

"""The async client: one WebSocket connection, requests matched to responses by id."""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import io
import itertools
import tarfile
from pathlib import Path
from typing import Any

import msgpack
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from pie_core.client.mcp_servers import RegisteredServers
from pie_core.client.process import Process, ProcessEvent
from pie_core.errors import PieError

__all__ = ["Client", "ServerError", "connect", "pack_program"]


class ServerError(PieError):
    """The server answered a request with an error.

    Attributes:
        kind: The error kind (``invalid_input``, ``not_found``, ``unauthorized``,
            ``protocol_error``, ...).
    """

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message


def pack_program(folder: str | Path) -> bytes:
    """An inferlet folder as a gzip-compressed tar archive (``Pie.toml`` at its root).

    Raises:
        FileNotFoundError: ``folder`` has no ``Pie.toml``.
    """
    root = Path(folder)
    if not (root / "Pie.toml").is_file():
        raise FileNotFoundError(f"{root} has no Pie.toml; an inferlet is a folder with Pie.toml and main.py")
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz, tarfile.open(fileobj=gz, mode="w") as tar:
        for path in sorted(root.rglob("*")):  # gzip's header time is 0 too: packed a second later, same hash
            if "__pycache__" in path.parts or not path.is_file():
                continue
            info = tar.gettarinfo(str(path), arcname=str(path.relative_to(root)))
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""  # same bytes, same hash
            with path.open("rb") as fh:
                tar.addfile(info, fh)
    return buf.getvalue()


class Client:
    """A connection to ``pie serve``. Create it with :func:`connect`."""

    def __init__(self, ws: ClientConnection) -> None:
        self._ws = ws
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[Any]] = {}
        self._processes: dict[str, Process] = {}
        self._mcp = RegisteredServers(self.request)
        self._reader = asyncio.get_running_loop().create_task(self._read(), name="pie-client-reader")
        self.user: str | None = None

    async def request(self, kind: str, **fields: Any) -> Any:
        """Send one request and wait for its result.

        Raises:
            ServerError: The server refused it.
            ConnectionError: The connection closed first.
        """
        rid = next(self._ids)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting[rid] = fut
        try:
            await self._ws.send(msgpack.packb({"type": kind, "id": rid, **fields}, use_bin_type=True))
            return await fut
        finally:
            self._waiting.pop(rid, None)

    async def authenticate(self, token: str) -> str:
        """Identify as the user owning ``token``; returns the user name."""
        self.user = (await self.request("auth", token=token))["user"]
        return self.user

    async def ping(self) -> float:
        """Round trip time in seconds."""
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await self.request("ping")
        return loop.time() - t0

    async def list_models(self) -> list[dict[str, Any]]:
        return list(await self.request("list_models"))

    async def list_programs(self) -> list[str]:
        return list(await self.request("list_programs"))

    async def list_processes(self) -> list[dict[str, Any]]:
        return list(await self.request("list_processes"))

    async def install(self, folder: str | Path, *, chunk_size: int | None = None) -> str:
        """Upload an inferlet folder (packed, hashed, sent in chunks; skipped when the server
        already stores the same bytes). Returns ``name@version`` to launch it by."""
        data = pack_program(folder)
        begin = await self.request("upload_begin", size=len(data), sha256=hashlib.sha256(data).hexdigest())
        if begin["stored"]:
            return f"{begin['name']}@{begin['version']}"
        step = chunk_size or int(begin["chunk_size"])
        for offset in range(0, len(data), step):
            await self.request("upload_chunk", upload=begin["upload"], data=data[offset : offset + step])
        done = await self.request("upload_end", upload=begin["upload"])
        return f"{done['name']}@{done['version']}"

    async def launch(self, program: str, input: dict[str, Any] | None = None, *, detached: bool = False) -> Process:
        """Start ``name`` or ``name@version`` with ``input``; its events stream to this client
        unless ``detached``."""
        result = await self.request("launch", program=program, input=dict(input or {}), detached=detached)
        return self._process(result["process"])

    async def attach(self, process_id: str) -> Process:
        """Receive the events of a process of this user (buffered ones first)."""
        proc = self._process(process_id)
        await self.request("attach", process=process_id)
        return proc

    async def register_mcp_server(self, name: str, server: Any, *, timeout: float = 60.0) -> list[str]:
        """Make an MCP server on this side available to the inferlets this connection launches.

        Their ``mcp.available_servers()`` lists ``name`` (it shadows a server of that name
        configured on the engine) and their calls are relayed here and forwarded to ``server``.
        The name lasts until :meth:`unregister_mcp_server` or the end of this connection;
        other connections never see it.

        Args:
            name: 1-64 characters ``[A-Za-z0-9._-]``, starting with a letter or digit.
            server: An open ``mcp.Client`` or ``mcp.ClientSession`` (you close it); or
                ``mcp.StdioServerParameters``, an ``MCPServer`` / ``Server`` object or a URL,
                which the client opens now and closes on unregister or :meth:`close`; or a
                function ``(method, params) -> result dict`` (async, or plain: run in a thread).
            timeout: Seconds the engine waits for each answer, in ``(0, 3600]``.

        Returns:
            Every name this connection has registered.

        Raises:
            TypeError: ``server`` is none of those kinds.
            McpError: The client could not open ``server``.
            ServerError: The server refused the name or the timeout (``invalid_input``).
        """
        return await self._mcp.add(name, server, timeout)

    async def unregister_mcp_server(self, name: str) -> list[str]:
        """Withdraw ``name``: calls in flight to it fail, and a server the client opened closes.

        Returns:
            The names still registered.

        Raises:
            ServerError: This connection did not register ``name`` (``invalid_input``).
        """
        return await self._mcp.remove(name)

    async def close(self) -> None:
        await self._ws.close()
        await self._reader
        await self._mcp.close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _process(self, pid: str) -> Process:
        proc = self._processes.get(pid)
        if proc is None:
            proc = self._processes[pid] = Process(self, pid)
        return proc

    async def _read(self) -> None:
        error: BaseException = ConnectionError("the connection to the server closed")
        try:
            async for message in self._ws:
                frame = msgpack.unpackb(message, raw=False)
                if frame.get("type") == "event":
                    self._process(frame["process"])._deliver(
                        ProcessEvent(frame["event"], frame["value"], frame["seq"])
                    )
                elif frame.get("type") == "mcp_request":
                    self._mcp.answer(frame)
                elif frame.get("type") == "response":
                    fut = self._waiting.get(frame.get("id"))  # type: ignore[arg-type]
                    if fut is not None and not fut.done():
                        if frame["ok"]:
                            fut.set_result(frame.get("result"))
                        else:
                            err = frame.get("error") or {}
                            fut.set_exception(ServerError(err.get("kind", "error"), err.get("message", "")))
        except ConnectionClosed as exc:
            error = ConnectionError(f"the connection to the server closed: {exc}")
        finally:
            for fut in self._waiting.values():
                if not fut.done():
                    fut.set_exception(error)
            for proc in self._processes.values():
                proc._closed(error)


async def connect(url: str, token: str | None = None, *, max_size: int = 8 * 2**20) -> Client:
    """Open a connection to ``pie serve`` at ``url`` (``ws://host:port``).

    Args:
        url: The server's WebSocket URL.
        token: Your token (``pie auth add``); None for a server started with ``--no-auth``.
        max_size: Largest message accepted from the server, in bytes.

    Raises:
        ServerError: The token was refused.
        OSError: The server cannot be reached.
    """
    headers = {"Authorization": f"Bearer {token}"} if token else None
    try:
        ws = await ws_connect(url, additional_headers=headers, max_size=max_size)
    except OSError as exc:
        raise ServerError("unreachable", f"cannot reach {url}: {exc}") from None
    except Exception as exc:
        status = getattr(getattr(exc, "response", None), "status_code", None)
        if status == 401:
            body = exc.response.body.decode(errors="replace").strip()  # type: ignore[attr-defined]
            raise ServerError("unauthorized", body) from None
        raise
    client = Client(ws)
    if token:
        await client.authenticate(token)
    return client

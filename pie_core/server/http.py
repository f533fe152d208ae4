"""Plain HTTP on the WebSocket port (``/health``, ``/metrics``, ``/v1/...``).

``websockets`` parses only handshake requests and refuses any request with a body, so its
``process_request`` hook cannot serve ``POST /v1/chat/completions``. Instead each connection
sniffs its first request head: a WebSocket upgrade goes on to ``websockets`` unchanged;
anything else is parsed with ``h11`` and answered by an :class:`HttpApp` (one request per
connection, ``Connection: close``), with streamed bodies for server-sent events.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Protocol
from urllib.parse import parse_qs, urlsplit

import h11
from websockets.asyncio.server import ServerConnection

__all__ = ["HttpRequest", "HttpResponder", "HttpApp", "HttpAwareConnection", "ClientGone"]

MAX_HEAD = 64 * 1024
MAX_BODY = 4 * 2**20
HEAD_TIMEOUT_S = 30.0


class ClientGone(ConnectionError):
    """The HTTP client closed its connection while the response was being streamed."""


@dataclass(frozen=True, slots=True)
class HttpRequest:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]  # lower-case names
    body: bytes


class HttpApp(Protocol):
    async def __call__(self, request: HttpRequest, respond: HttpResponder) -> None: ...


class HttpResponder:
    """Writes one response: whole (:meth:`send`) or streamed (:meth:`start` / :meth:`write` / :meth:`end`)."""

    def __init__(self, transport: asyncio.Transport, conn: h11.Connection) -> None:
        self._transport = transport
        self._conn = conn
        self.started = False

    def send(self, status: int, body: bytes, content_type: str, headers: list[tuple[str, str]] | None = None) -> None:
        hdrs = [("content-type", content_type), ("content-length", str(len(body))), *(headers or [])]
        self._head(status, hdrs)
        self._out(h11.Data(data=body))
        self._out(h11.EndOfMessage())

    def start(self, status: int, content_type: str, headers: list[tuple[str, str]] | None = None) -> None:
        """Begin a body of unknown length (chunked)."""
        self._head(status, [("content-type", content_type), ("cache-control", "no-cache"), *(headers or [])])

    async def write(self, data: bytes) -> None:
        """Send part of a streamed body, waiting while the socket's buffer is full.

        Raises:
            ClientGone: The client disconnected.
        """
        if self._transport.is_closing():
            raise ClientGone("the HTTP client disconnected")
        self._out(h11.Data(data=data))
        while self._transport.get_write_buffer_size() > 256 * 1024:
            if self._transport.is_closing():
                raise ClientGone("the HTTP client disconnected")
            await asyncio.sleep(0.005)

    def end(self) -> None:
        if not self._transport.is_closing():
            self._out(h11.EndOfMessage())

    def _head(self, status: int, headers: list[tuple[str, str]]) -> None:
        self.started = True
        self._out(h11.Response(status_code=status, headers=[*headers, ("connection", "close"), ("server", "pie")]))

    def _out(self, event: Any) -> None:
        data = self._conn.send(event)
        if data and not self._transport.is_closing():
            self._transport.write(data)


def connection_factory(app: HttpApp) -> Callable[..., ServerConnection]:
    """A ``create_connection`` for ``websockets.asyncio.server.serve`` that routes non-WebSocket
    requests to ``app``."""

    def create(*args: Any, **kwargs: Any) -> ServerConnection:
        return HttpAwareConnection(app, *args, **kwargs)

    return create


class HttpAwareConnection(ServerConnection):
    """A ``websockets`` server connection that answers plain HTTP requests itself."""

    def __init__(self, app: HttpApp, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._app = app
        self._mode: str | None = None  # None until the head is read, then "ws" or "http"
        self._head_buf = bytearray()
        self._h11: h11.Connection | None = None
        self._request: h11.Request | None = None
        self._body = bytearray()
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._timer = self.loop.call_later(HEAD_TIMEOUT_S, self._head_timeout)

    def data_received(self, data: bytes) -> None:
        if self._mode == "ws":
            super().data_received(data)
            return
        if self._mode is None:
            self._head_buf += data
            end = self._head_buf.find(b"\r\n\r\n")
            if end < 0 and len(self._head_buf) < MAX_HEAD:
                return
            if self._timer is not None:
                self._timer.cancel()
            head = bytes(self._head_buf[: max(end, 0)]).lower()
            buffered, self._head_buf = bytes(self._head_buf), bytearray()
            if b"\r\nupgrade:" in head and b"websocket" in head:
                self._mode = "ws"
                super().data_received(buffered)
                return
            self._mode = "http"
            self._h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
            data = buffered
        self._feed(data)

    def eof_received(self) -> bool | None:  # type: ignore[override]
        if self._mode == "http":
            return True  # a half-closed client still gets its response; we close after writing it
        super().eof_received()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._task is not None and not self._task.done():
            self._task.cancel()  # the client left: stop whatever its request started
        super().connection_lost(exc)

    def _head_timeout(self) -> None:
        if self._mode is None:
            self.transport.abort()

    def _feed(self, data: bytes) -> None:
        assert self._h11 is not None
        if self._task is not None:
            return  # one request per connection; ignore anything after it
        self._h11.receive_data(data)
        try:
            while True:
                event = self._h11.next_event()
                if event is h11.NEED_DATA:
                    return
                if isinstance(event, h11.Request):
                    self._request = event
                elif isinstance(event, h11.Data):
                    self._body += event.data
                    if len(self._body) > MAX_BODY:
                        self._reject(413, f"request body over {MAX_BODY} bytes")
                        return
                elif isinstance(event, h11.EndOfMessage):
                    self._task = self.loop.create_task(self._serve())
                    return
                elif isinstance(event, h11.ConnectionClosed):
                    self.transport.close()
                    return
        except h11.RemoteProtocolError as exc:
            self._reject(400, f"bad HTTP request: {exc}")

    def _reject(self, status: int, message: str) -> None:
        assert self._h11 is not None
        self._task = asyncio.Future()  # type: ignore[assignment]  # stop reading
        try:
            responder = HttpResponder(self.transport, self._h11)
            responder.send(status, message.encode() + b"\n", "text/plain; charset=utf-8")
        except h11.LocalProtocolError:
            pass
        self.transport.close()

    async def _serve(self) -> None:
        assert self._h11 is not None and self._request is not None
        req = self._request
        target = urlsplit(req.target.decode("latin-1"))
        request = HttpRequest(
            method=req.method.decode("ascii").upper(),
            path=target.path,
            query=parse_qs(target.query),
            headers={k.decode("latin-1").lower(): v.decode("latin-1") for k, v in req.headers},
            body=bytes(self._body),
        )
        responder = HttpResponder(self.transport, self._h11)
        try:
            await self._app(request, responder)
        except (ClientGone, asyncio.CancelledError):
            pass
        except Exception as exc:  # the app failed: a 500 if nothing was sent yet
            if not responder.started:
                responder.send(500, f"internal error: {type(exc).__name__}: {exc}\n".encode(), "text/plain; charset=utf-8")
            self.logger.error("HTTP handler failed", exc_info=True)
        finally:
            self.transport.close()


Route = Callable[[HttpRequest, HttpResponder], Awaitable[None]]

"""Plain HTTP on the WebSocket port (``/health``, ``/metrics``, ``/v1/...``).

``websockets`` parses only handshake requests and refuses any request with a body, so its
``process_request`` hook cannot serve ``POST /v1/chat/completions``. Instead each connection
sniffs its first request head: a WebSocket upgrade goes on to ``websockets`` unchanged;
anything else is parsed with ``h11`` and answered by an :class:`HttpApp`, with streamed bodies
for server-sent events. Connections are kept alive (HTTP/1.1 persistent connections: several
requests, one after another, on one connection) unless the client sends ``Connection: close`` or
the response is an error; a kept connection idle for ``KEEPALIVE_IDLE_S`` is closed.

Every byte a client sends is hostile, so a connection is held to bounds before anyone has
checked who sent it: the whole request (head and body) must arrive within
``REQUEST_TIMEOUT_S`` of its first byte (of the connection, for the first request); a head is at
most ``MAX_HEAD`` bytes (431 beyond) and carries one ``Authorization`` header (400 for more); the
route's admission check (auth, body size) runs on the head, before any body byte is buffered;
connections mid-request are bounded per holder, then server-wide: an anonymous one (its head not
yet admitted; a kept-alive connection waiting for its next request is one) counts against its
address (``MAX_UNFINISHED_PER_PEER``), one whose head named a user against that user
(``MAX_UNFINISHED_PER_USER``), each holder's oldest dropped past its share; past
``MAX_UNFINISHED`` in all, the oldest anonymous one is dropped (a newcomer, itself, when all the
others are authenticated), so anonymous peers can only push out each other;
a pipelined request waits, unread past ``MAX_HEAD`` bytes, until the one before it is answered; a client that closes its socket cancels its request; and
:meth:`HttpConnections.abort_all` ends every connection at once for shutdown.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Protocol
from urllib.parse import parse_qs, urlsplit

import h11
from websockets.asyncio.server import ServerConnection

__all__ = ["HttpRequest", "HttpResponder", "HttpApp", "HttpRefusal", "HttpConnections", "HttpAwareConnection",
           "Admission", "ClientGone", "error_json"]

MAX_HEAD = 64 * 1024
MAX_BODY = 4 * 2**20
REQUEST_TIMEOUT_S = 30.0  # head and body together: a 4 MiB body must come at >= ~140 KB/s
MAX_UNFINISHED = 256  # connections still sending their request head or body, server-wide
MAX_UNFINISHED_PER_PEER = 128  # of those, from one address before its head is read (a NAT or a load tool: bursts)
MAX_UNFINISHED_PER_USER = 64  # of those, sending a request its head authenticated as one user
WRITE_STALL_S = 30.0  # a client that reads nothing of its response for this long is dropped
LINGER_S = 2.0  # after the response, how long a closing connection may take to flush it
KEEPALIVE_IDLE_S = 5.0  # a kept-alive connection with no new request for this long is closed

log = logging.getLogger("pie.server.http")


class ClientGone(ConnectionError):
    """The HTTP client closed its connection (or stopped reading) while the response was being sent."""


class HttpRefusal(Exception):
    """Raised by an admission check to answer a request from its head alone (the connection then closes)."""

    def __init__(self, status: int, body: bytes, content_type: str = "application/json",
                 headers: list[tuple[str, str]] | None = None) -> None:
        super().__init__(status, body)
        self.status = status
        self.body = body
        self.content_type = content_type
        self.headers = headers or []


def error_json(message: str, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> bytes:
    """An error in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``."""
    return json.dumps({"error": {"message": message, "type": kind, "param": param, "code": code}}).encode()


@dataclass(frozen=True, slots=True)
class HttpRequest:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]  # lower-case names
    body: bytes


class HttpApp(Protocol):
    async def __call__(self, request: HttpRequest, respond: HttpResponder) -> None: ...


@dataclass(frozen=True, slots=True)
class Admission:
    """What an admission check found in a head: the most body bytes its route takes, and the
    user its credentials name (None: anonymous, such as ``/health``)."""

    max_body: int
    user: str | None = None


Admit = Callable[[HttpRequest], Admission]
"""Checks a request from its head (``body`` is empty); raises :class:`HttpRefusal` to answer
at once without reading the body."""

Observe = Callable[[str, int], None]
"""Called with the request path and the status of every response the server starts."""


class HttpResponder:
    """Writes one response: whole (:meth:`send`) or streamed (:meth:`start` / :meth:`write` / :meth:`end`).

    ``headers`` go on the response whatever its status (the app sets CORS headers there). An error
    status (400 and up) closes the connection after the response.
    """

    def __init__(self, transport: asyncio.Transport, conn: h11.Connection, path: str = "",
                 observe: Observe | None = None) -> None:
        self._transport = transport
        self._conn = conn
        self._path = path
        self._observe = observe
        self.headers: list[tuple[str, str]] = []
        self.started = False
        self.status = 0

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
            ClientGone: The client disconnected, or read nothing for ``WRITE_STALL_S`` seconds.
        """
        if self._transport.is_closing():
            raise ClientGone("the HTTP client disconnected")
        self._out(h11.Data(data=data))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WRITE_STALL_S
        while self._transport.get_write_buffer_size() > 256 * 1024:
            if self._transport.is_closing():
                raise ClientGone("the HTTP client disconnected")
            if loop.time() > deadline:
                self._transport.abort()
                raise ClientGone(f"the HTTP client read nothing for {WRITE_STALL_S:.0f} s")
            await asyncio.sleep(0.005)

    def end(self) -> None:
        if not self._transport.is_closing():
            self._out(h11.EndOfMessage())

    def _head(self, status: int, headers: list[tuple[str, str]]) -> None:
        self.started = True
        self.status = status
        if self._observe is not None:
            self._observe(self._path, status)
        closing = [("connection", "close")] if status >= 400 and all(k != "connection" for k, _ in headers) else []
        self._out(h11.Response(status_code=status, headers=[*headers, *self.headers, *closing, ("server", "pie")]))

    def _out(self, event: Any) -> None:
        data = self._conn.send(event)
        if data and not self._transport.is_closing():
            self._transport.write(data)


class HttpConnections:
    """The connections of one server: a ``create_connection`` for ``websockets.asyncio.server.serve``
    that routes non-WebSocket requests to ``app``, bounds the connections still sending their
    request, and aborts them all at shutdown."""

    def __init__(self, app: HttpApp, admit: Admit, *, max_unfinished: int | None = None,
                 request_timeout_s: float | None = None, observe: Observe | None = None) -> None:
        self.app = app
        self.admit = admit
        self.observe = observe
        self.draining = False
        self.max_unfinished = MAX_UNFINISHED if max_unfinished is None else max_unfinished
        self.max_per_peer = MAX_UNFINISHED_PER_PEER
        self.max_per_user = MAX_UNFINISHED_PER_USER
        self.request_timeout_s = REQUEST_TIMEOUT_S if request_timeout_s is None else request_timeout_s
        self.live: set[HttpAwareConnection] = set()
        # each unfinished connection's holder: "peer <address>" until its head names a user, then
        # "user <name>"; both maps in insertion order, oldest first
        self.unfinished: dict[HttpAwareConnection, str] = {}
        self._held: dict[str, dict[HttpAwareConnection, None]] = {}

    def __call__(self, *args: Any, **kwargs: Any) -> ServerConnection:
        return HttpAwareConnection(self, *args, **kwargs)

    def opened(self, conn: HttpAwareConnection) -> None:
        self.live.add(conn)
        self.waiting(conn)

    def waiting(self, conn: HttpAwareConnection) -> None:
        """``conn`` waits for (the rest of) a request, anonymous until its head is admitted: it
        counts against its address's share and ``max_unfinished``."""
        self._hold(conn, f"peer {conn.peer_host}", self.max_per_peer)

    def authenticated(self, conn: HttpAwareConnection, user: str) -> None:
        """``conn``'s head was admitted as ``user``'s: from now on it counts against that user's
        share, and an anonymous connection can no longer push it out."""
        if conn in self.unfinished:
            self._hold(conn, f"user {user}", self.max_per_user)

    def _hold(self, conn: HttpAwareConnection, holder: str, share: int) -> None:
        """Count ``conn`` as ``holder``'s; past a bound, drop an unfinished connection: the
        holder's oldest past its share; past ``max_unfinished``, the oldest anonymous one (the
        newcomer itself when every other is authenticated). So anonymous peers only ever push out
        each other, and a user only its own requests."""
        self._release(conn)
        self.unfinished[conn] = holder
        mine = self._held.setdefault(holder, {})
        mine[conn] = None
        if len(mine) > share:  # honest requests arrive in milliseconds: the oldest is the likeliest stall
            self._drop(next(iter(mine)))
        if len(self.unfinished) > self.max_unfinished:
            anonymous = next((c for c, h in self.unfinished.items() if h.startswith("peer ")), None)
            self._drop(anonymous if anonymous is not None else conn)

    def _drop(self, conn: HttpAwareConnection) -> None:
        self._release(conn)
        conn.transport.abort()

    def _release(self, conn: HttpAwareConnection) -> None:
        holder = self.unfinished.pop(conn, None)
        if holder is not None:
            mine = self._held[holder]
            del mine[conn]
            if not mine:
                del self._held[holder]

    def request_read(self, conn: HttpAwareConnection) -> None:
        self._release(conn)

    def lost(self, conn: HttpAwareConnection) -> None:
        self.live.discard(conn)
        self._release(conn)

    def drain(self) -> None:
        """Stop keeping connections alive (for shutdown): idle ones close now, busy ones after
        their response."""
        self.draining = True
        for conn in list(self.live):
            conn.close_if_idle()

    def abort_all(self) -> int:
        """Drop every connection now (no closing handshake) and cancel its HTTP handler; returns how many."""
        conns = list(self.live)
        for conn in conns:
            conn.abort()
        return len(conns)


class HttpAwareConnection(ServerConnection):
    """A ``websockets`` server connection that answers plain HTTP requests itself."""

    def __init__(self, owner: HttpConnections, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._owner = owner
        self._app = owner.app
        self._mode: str | None = None  # None until the head is read, then "ws" or "http"
        self._head_buf = bytearray()
        self._h11: h11.Connection | None = None
        self._request: h11.Request | None = None
        self._max_body = 0
        self._body = bytearray()
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Future[None] | None = None
        self._pipelined = bytearray()  # bytes of the next request, received while this one is served
        self._cycle_bytes = 0  # bytes received since this connection began waiting for its request
        self._closing = False
        self._request_count = 0  # requests served on this connection

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        peer = transport.get_extra_info("peername")
        self.peer_host = str(peer[0]) if isinstance(peer, (tuple, list)) and peer else str(peer)
        self._owner.opened(self)
        self._timer = self.loop.call_later(self._owner.request_timeout_s, self._request_timeout)

    def data_received(self, data: bytes) -> None:
        if self._mode == "ws":
            super().data_received(data)
            return
        if self._mode is None:
            self._head_buf += data
            end = self._head_buf.find(b"\r\n\r\n")
            if end < 0 and len(self._head_buf) < MAX_HEAD:
                return
            head = bytes(self._head_buf[: max(end, 0)]).lower()
            buffered, self._head_buf = bytes(self._head_buf), bytearray()
            if b"\r\nupgrade:" in head and b"websocket" in head:
                self._mode = "ws"
                self._request_done()  # websockets answers the handshake at once
                super().data_received(buffered)
                return
            self._mode = "http"
            self._h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
            data = buffered
        self._feed(data)

    def eof_received(self) -> bool | None:  # type: ignore[override]
        if self._mode == "ws":
            super().eof_received()
            return None
        # An HTTP client that half-closes has left (or will never finish its request): close,
        # which cancels the handler and so the generation it started.
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._request_done()
        self._owner.lost(self)
        if self._task is not None and not self._task.done():
            self._task.cancel()  # the client left: stop whatever its request started
        super().connection_lost(exc)

    def close_if_idle(self) -> None:
        """Close a kept-alive HTTP connection that waits for its next request."""
        if self._mode == "http" and self._task is None and self._request_count and self._cycle_bytes == 0:
            self._close()

    def abort(self) -> None:
        """Drop the connection now and cancel its HTTP handler."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self.transport.abort()

    def _request_done(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._owner.request_read(self)

    def _request_timeout(self) -> None:
        self._timer = None
        if self._mode == "http" and self._task is None and self._cycle_bytes == 0 and self._request_count:
            self._close()  # a kept-alive connection that sent no new request
        elif self._mode == "http" and self._task is None:
            self._reject(408, f"the request did not arrive within {self._owner.request_timeout_s:.0f} s; "
                              "send the head and body without pausing", "request_timeout")
        elif self._mode is None:
            self.transport.abort()

    def _feed(self, data: bytes) -> None:
        assert self._h11 is not None
        if self._task is not None:
            if not self._closing:  # a pipelined request: it waits for this one's response
                self._pipelined += data
                if len(self._pipelined) > MAX_HEAD:
                    self.transport.pause_reading()
            return
        if data:  # (receive_data(b"") would mean end of input to h11)
            self._began(len(data))
            self._h11.receive_data(data)
        self._process()

    def _began(self, size: int) -> None:
        """``size`` more bytes of the awaited request arrived."""
        if self._request_count and self._cycle_bytes == 0 and self._timer is not None:
            self._timer.cancel()  # the next request began: it gets the whole request timeout
            self._timer = self.loop.call_later(self._owner.request_timeout_s, self._request_timeout)
        self._cycle_bytes += size

    def _process(self) -> None:
        """Act on the request events h11 can parse from what it holds."""
        assert self._h11 is not None
        try:
            while True:
                event = self._h11.next_event()
                if event is h11.NEED_DATA:
                    return
                if isinstance(event, h11.Request):
                    self._request = event
                    if not self._admit(event):
                        return
                elif isinstance(event, h11.Data):
                    self._body += event.data
                    if len(self._body) > self._max_body:
                        self._too_big(len(self._body), "at least ")
                        return
                elif isinstance(event, h11.EndOfMessage):
                    self._request_done()
                    self._task = self.loop.create_task(self._serve())
                    return
                elif isinstance(event, h11.ConnectionClosed):
                    self._close()
                    return
        except h11.RemoteProtocolError as exc:
            if exc.error_status_hint == 431:
                self._reject(431, f"a request head may be at most {MAX_HEAD} bytes; send shorter headers",
                             "request_header_fields_too_large")
            else:
                self._reject(400, f"bad HTTP request: {exc}", "bad_request")

    def _admit(self, req: h11.Request) -> bool:
        """Run the route's admission check on the head; False if the request was answered."""
        head = len(req.method) + len(req.target) + 12 + sum(len(k) + len(v) + 4 for k, v in req.headers)
        if head > MAX_HEAD:  # h11 bounds only a head still incomplete: one that arrived whole is counted here
            self._reject(431, f"a request head may be at most {MAX_HEAD} bytes; send shorter headers",
                         "request_header_fields_too_large")
            return False
        if sum(1 for k, _ in req.headers if k == b"authorization") > 1:
            self._reject(400, "send one Authorization header, not several", "bad_request")
            return False
        try:
            admission = self._owner.admit(self._make_request(req, b""))
        except HttpRefusal as refusal:
            self._answer(refusal.status, refusal.body, refusal.content_type, refusal.headers)
            return False
        self._max_body = admission.max_body
        if admission.user is not None:
            self._owner.authenticated(self, admission.user)
        length = next((v for k, v in req.headers if k == b"content-length"), None)
        if length is not None and int(length) > self._max_body:  # h11 has checked it is a number
            self._too_big(int(length), "")
            return False
        return True

    def _too_big(self, size: int, prefix: str) -> None:
        assert self._request is not None
        route = f"{self._request.method.decode('latin-1')} {self._request.target.decode('latin-1')}"
        self._reject(413, f"{route} takes a body of at most {self._max_body} bytes, got {prefix}{size}",
                     "request_too_large")

    def _reject(self, status: int, message: str, code: str) -> None:
        self._answer(status, error_json(message, "invalid_request_error", None, code), "application/json")

    def _answer(self, status: int, body: bytes, content_type: str, headers: list[tuple[str, str]] | None = None) -> None:
        assert self._h11 is not None
        self._request_done()
        self._task = self.loop.create_future()  # stop reading
        self._task.set_result(None)
        try:
            path = self._request.target.decode("latin-1").split("?")[0] if self._request is not None else ""
            responder = HttpResponder(self.transport, self._h11, path, self._owner.observe)
            responder.headers = headers or []
            responder.send(status, body, content_type, [("connection", "close")])
        except h11.LocalProtocolError:
            pass
        self._close()

    def _close(self) -> None:
        self._closing = True
        self.transport.close()
        # a client that does not read would keep a closing transport (and its buffer) forever
        self.loop.call_later(LINGER_S, self.transport.abort)

    @staticmethod
    def _make_request(req: h11.Request, body: bytes) -> HttpRequest:
        target = urlsplit(req.target.decode("latin-1"))
        return HttpRequest(
            method=req.method.decode("ascii").upper(),
            path=target.path,
            query=parse_qs(target.query),
            headers={k.decode("latin-1").lower(): v.decode("latin-1") for k, v in req.headers},
            body=body,
        )

    async def _serve(self) -> None:
        assert self._h11 is not None and self._request is not None
        request = self._make_request(self._request, bytes(self._body))
        self._body = bytearray()
        self._request_count += 1
        responder = HttpResponder(self.transport, self._h11, request.path, self._owner.observe)
        try:
            await self._app(request, responder)
        except (ClientGone, asyncio.CancelledError):
            pass
        except Exception:  # a bug: the client gets an opaque 500, the log the traceback
            log.error("HTTP handler failed on %s %s", request.method, request.path, exc_info=True)
            if not responder.started:
                responder.send(500, error_json("internal server error; the server log has the details", "server_error",
                                               None, "internal_error"), "application/json")
        finally:
            self._next_cycle()

    def _next_cycle(self) -> None:
        """After a response: wait for the connection's next request, or close it."""
        assert self._h11 is not None
        if self._closing or self._owner.draining or self.transport.is_closing() or self._h11.our_state is not h11.DONE \
                or self._h11.their_state is not h11.DONE:
            self._close()  # Connection: close, an error status, or a response cut short
            return
        self._h11.start_next_cycle()
        self._task, self._request, self._max_body, self._cycle_bytes = None, None, 0, 0
        self._owner.waiting(self)
        self._timer = self.loop.call_later(KEEPALIVE_IDLE_S, self._request_timeout)
        held = len(self._h11.trailing_data[0])  # pipelined bytes that came with the last request
        if held:
            self._began(held)
        data, self._pipelined = bytes(self._pipelined), bytearray()
        self.transport.resume_reading()
        self._feed(data)


Route = Callable[[HttpRequest, HttpResponder], Awaitable[None]]

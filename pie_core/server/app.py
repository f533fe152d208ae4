"""``PieServer``: the engine behind a WebSocket + HTTP endpoint (``pie serve``)."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.http11 import Request, Response

from pie_core.config import config_home
from pie_core.engine.engine import Engine
from pie_core.errors import PieError
from pie_core.runtime.launcher import InProcessLauncher, Launcher
from pie_core.server import openai
from pie_core.server.auth import AuthError, Authenticator
from pie_core.server.connection import ClientSession
from pie_core.server.cors import CorsPolicy
from pie_core.server.http import MAX_BODY, Admission, HttpConnections, HttpRefusal, HttpRequest, HttpResponder
from pie_core.server.latency import RequestMetrics
from pie_core.server.memory import MemoryWatch
from pie_core.server.chat_page import chat_page
from pie_core.server.metrics import RateMeter, prometheus_text, status_line
from pie_core.server.processes import ProcessTable
from pie_core.server.quotas import ConnectionCounts, Quotas
from pie_core.server.store import DEFAULT_MAX_UPLOAD, ProgramStore

__all__ = ["ServerOptions", "PieServer"]

log = logging.getLogger("pie.server")

CLOSE_S = 5.0  # close() returns within this, however clients behave
AUTH_TIMEOUT_S = 30.0  # a WebSocket connection that has not authenticated by then is closed


@dataclass(frozen=True, slots=True)
class ServerOptions:
    """How a :class:`PieServer` listens and what it allows.

    Attributes:
        host: Interface to bind (``127.0.0.1`` is loopback only).
        port: TCP port (0 picks a free one; :attr:`PieServer.port` tells which).
        data_dir: Where uploaded programs are stored (default ``~/.pie/server``).
        max_upload: Largest program archive or transferred file, in bytes.
        max_frame: Largest WebSocket message, in bytes (bigger ones close the connection).
        chunk_size: Upload chunk size the server suggests to clients.
        status_interval: Seconds between status log lines (0 = none).
        quotas: What each user may hold at once (docs/server.md, "Quotas").
        max_unauthenticated: WebSocket connections that may wait for their ``auth`` request at
            once (0 = no cap).
        cors: Which web origins may call the HTTP API from a browser (default: none; ``pie
            serve`` reads ``[server] cors_origins``, see :mod:`pie_core.server.cors`).
    """

    host: str = "127.0.0.1"
    port: int = 8080
    data_dir: Path | None = None
    max_upload: int = DEFAULT_MAX_UPLOAD
    max_frame: int = 8 * 2**20
    chunk_size: int = 2**20
    status_interval: float = 10.0
    retain_s: float = 3600.0
    quotas: Quotas = field(default_factory=Quotas)
    max_unauthenticated: int = 64
    cors: CorsPolicy = field(default_factory=CorsPolicy)
    extra: dict[str, Any] = field(default_factory=dict)


class PieServer:
    """Serves one :class:`Engine` to many clients; see docs/server.md for the protocol."""

    def __init__(
        self,
        engine: Engine,
        options: ServerOptions | None = None,
        *,
        auth: Authenticator,
        launcher: Launcher | None = None,
        console: Console | None = None,
        close_engine: bool = True,
    ) -> None:
        self.engine = engine
        self._close_engine = close_engine
        self.options = options or ServerOptions()
        self.auth = auth
        data_dir = self.options.data_dir or config_home() / "server"
        self.store = ProgramStore(data_dir, max_upload=self.options.max_upload)
        self.processes = ProcessTable(engine, launcher or InProcessLauncher(), retain_s=self.options.retain_s,
                                      scratch_root=data_dir / "scratch", quotas=self.options.quotas,
                                      resolve=self.store.resolve)
        self.connections = ConnectionCounts(self.options.quotas, self.options.max_unauthenticated)
        self._apply_quotas(self.options.quotas)
        self.rate = RateMeter()
        self.request_metrics = RequestMetrics(list(engine.models), [p for _, p in self._routes()])
        self.console = console or Console(stderr=True)
        self.connection_count = 0
        self._server: Server | None = None
        self._connections: HttpConnections | None = None
        self._status_task: asyncio.Task[None] | None = None
        self._memory_task: asyncio.Task[None] | None = None
        self._stopped = asyncio.Event()

    @property
    def port(self) -> int:
        assert self._server is not None, "start() first"
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def url(self) -> str:
        return f"ws://{self.options.host}:{self.port}"

    async def start(self) -> None:
        """Bind and start accepting connections.

        Raises:
            OSError: The address cannot be bound; ``errno.EADDRINUSE`` when another socket
                listens on the port (``pie serve`` turns that into a one-line error).
        """
        self._connections = HttpConnections(self._http, self._http_admit, observe=self.request_metrics.response)
        self._server = await serve(
            self._handle,
            self.options.host,
            self.options.port,
            process_request=self._check_handshake,
            create_connection=self._connections,  # type: ignore[arg-type]
            max_size=self.options.max_frame,
            max_queue=4,  # frames read ahead of the session loop: bounds a pipelining client's memory
            open_timeout=None,  # HTTP requests on this port may stream for long; requests time out in http.py
            close_timeout=1.0,  # a client that never answers our close frame is dropped after this
            logger=log,
        )
        self._status_task = asyncio.get_running_loop().create_task(self._status_loop(), name="pie-status")
        if MemoryWatch.applies(self.processes.launcher):
            watch = MemoryWatch(self.processes.launcher, lambda: self.processes.quotas)
            self._memory_task = asyncio.get_running_loop().create_task(watch.run(), name="pie-memory")

    async def serve_until_signalled(self) -> None:
        """Run until SIGTERM/SIGINT, then :meth:`close`."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stopped.set)
        try:
            await self._stopped.wait()
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
            await self.close()

    def stop(self) -> None:
        self._stopped.set()

    async def close(self) -> None:
        """Stop accepting, end every inferlet with an Error event, close connections, stop the engine.

        Clients get a second or two to take their last events and closing handshakes; connections
        that have not closed by then (slow readers, half-sent requests) are aborted, so this
        returns within ``CLOSE_S`` seconds whatever the clients do.
        """
        loop = asyncio.get_running_loop()
        # the last two seconds are for aborting, the engine and the process's own exit (a loaded
        # machine takes most of a second to tear down the wasm engine and the interpreter)
        deadline = loop.time() + CLOSE_S - 2.0
        if self._status_task is not None:
            self._status_task.cancel()
        if self._memory_task is not None:
            self._memory_task.cancel()
        if self._server is not None:
            self._server.server.close()  # stop accepting; open connections still get their last events
            if self._connections is not None:
                self._connections.drain()  # kept-alive HTTP connections close (busy ones after their response)
            try:
                await asyncio.wait_for(self.processes.shutdown("server shutting down", flush_s=1.0),
                                       max(0.1, deadline - loop.time() - 1.0))
            except TimeoutError:
                log.warning("inferlets did not stop in time; closing connections anyway")
            self._server.close()
            try:
                await asyncio.wait_for(self._server.wait_closed(), max(0.1, deadline - loop.time()))
            except TimeoutError:
                assert self._connections is not None
                aborted = self._connections.abort_all()
                for task in list(self._server.handler_tasks):
                    task.cancel()
                log.warning("aborted %d connections that did not close in time", aborted)
                try:
                    await asyncio.wait_for(self._server.wait_closed(), 0.5)
                except TimeoutError:
                    log.warning("connection handlers did not end after abort; stopping anyway")
            self._server = None
        if self._close_engine:
            await self.engine.close()

    def model_list(self) -> list[dict[str, Any]]:
        return [
            {"name": m.name, "backend": m.backend, "page_size": m.caps.page_size, "pages": m.caps.num_pages,
             "replicas": len(self.engine.replicas.get(m.name, [m]))}
            for m in self.engine.models.values()
        ]

    def log_exception(self, exc: BaseException) -> None:
        log.error("request failed: %s", exc, exc_info=exc)

    # WebSocket --------------------------------------------------------------------------------

    def _check_handshake(self, connection: ServerConnection, request: Request) -> Response | None:
        """A browser page's handshake (an ``Origin`` header) needs an allowed origin (403
        otherwise: on a loopback ``--no-auth`` server a visited page could run inferlets); an
        ``Authorization: Bearer`` header, when present, must be valid (401 otherwise)."""
        origin = request.headers.get("Origin")
        connection.pie_user = None  # type: ignore[attr-defined]
        if origin is not None and not self.options.cors.allows(origin):
            return Response(403, "Forbidden", Headers([("Content-Type", "text/plain")]),
                            f"WebSocket connections from web origin {origin!r:.100} are not allowed; the server's "
                            "admin can list it in [server] cors_origins\n".encode())
        headers = request.headers.get_all("Authorization")
        if len(headers) > 1:
            return Response(400, "Bad Request", Headers([("Content-Type", "text/plain")]),
                            b"send one Authorization header, not several\n")
        header = headers[0] if headers else None
        if not self.auth.enabled:
            connection.pie_user = self.auth.check(None)  # type: ignore[attr-defined]
        elif header is not None:
            try:
                connection.pie_user = self.auth.bearer(header)  # type: ignore[attr-defined]
            except AuthError as exc:
                return Response(401, "Unauthorized", Headers([("Content-Type", "text/plain")]), f"{exc}\n".encode())
        return None

    def _apply_quotas(self, quotas: Quotas) -> None:
        """Bound each user's pages, credits, snapshots, adapters and messaging in the engine by ``quotas``."""
        for model in self.engine.all_replicas():  # loaded before the server is built (pie serve, Engine.load)
            pool_pages = model.pool.num_pages
            model.pool.accounts.limit_of = lambda user, n=pool_pages: quotas.for_user(user).pages_of(n)
            model.market.ledger.budget_of = lambda user: quotas.for_user(user).credits_of()
        for replicas in self.engine.replicas.values():  # one quota bounds a user's pages on all replicas together
            if len(replicas) > 1:
                total = sum(r.pool.num_pages for r in replicas)
                for model in replicas:
                    model.pool.accounts.total_limit_of = lambda user, n=total: quotas.for_user(user).pages_of(n)
        self.engine.snapshots.limit_of = lambda user: quotas.for_user(user).snapshots or None
        self.engine.adapters.limit_of = lambda user: quotas.for_user(user).adapter_bytes or None
        self.engine.broker.limits_of = lambda user: quotas.for_user(user).messaging()

    async def _handle(self, ws: ServerConnection) -> None:
        try:
            self.connections.enter(ws, getattr(ws, "pie_user", None))
        except PieError as exc:  # over a connection cap: say why in the close frame
            await ws.close(1008, str(exc)[:120])
            return
        self.connection_count += 1
        session = ClientSession(self, ws, getattr(ws, "pie_user", None))
        loop = asyncio.get_running_loop()
        deadline = loop.call_later(AUTH_TIMEOUT_S, lambda: session.user is None and loop.create_task(
            ws.close(1008, f"authenticate within {AUTH_TIMEOUT_S:g} s of connecting")))
        try:
            await session.run()
        finally:
            deadline.cancel()
            self.connection_count -= 1
            self.connections.leave(ws)

    # HTTP -------------------------------------------------------------------------------------

    def _v1_routes(self) -> dict[tuple[str, str], Any]:
        return {
            ("GET", "/v1/models"): self._v1_models,
            ("POST", "/v1/chat/completions"): openai.chat_completions,
            ("POST", "/v1/completions"): openai.completions,
            ("POST", "/v1/embeddings"): openai.embeddings,
        }

    def _routes(self) -> list[tuple[str, str]]:
        return [("GET", "/"), ("GET", "/health"), ("GET", "/metrics"), *self._v1_routes()]

    def _http_admit(self, request: HttpRequest) -> Admission:
        """From the head alone: 403 for a disallowed web origin (204 for an allowed CORS preflight),
        404 for an unknown route, 401 for a bad token on ``/v1/*`` and ``/metrics``, else the
        most body bytes the route takes (nothing is buffered for a request refused here)."""
        self.options.cors.check(request, trust_names=self.auth.enabled)
        cors = self.options.cors.headers(request)
        route = (request.method, request.path.rstrip("/") or "/")
        if route in (("GET", "/"), ("GET", "/health")):  # the chat page and the health check are public
            return Admission(0)
        if route != ("GET", "/metrics") and route not in self._v1_routes():
            known = ", ".join(f"{m} {p}" for m, p in self._routes())
            raise HttpRefusal(404, openai.error_body(f"no route {request.method} {request.path}; routes: {known}",
                                                    code="not_found"), headers=cors)
        try:
            user = self.auth.bearer(request.headers.get("authorization"))
        except AuthError as exc:
            raise HttpRefusal(401, openai.error_body(str(exc), "authentication_error", code="invalid_api_key"),
                              headers=cors) from None
        return Admission(MAX_BODY if request.method == "POST" else 0, user)

    async def _http(self, request: HttpRequest, respond: HttpResponder) -> None:
        route = (request.method, request.path.rstrip("/") or "/")
        respond.headers = self.options.cors.headers(request)
        try:
            if route == ("GET", "/"):
                page, headers = chat_page()
                respond.send(200, page, "text/html; charset=utf-8", headers)
                return
            if route == ("GET", "/health"):
                body = {"status": "ok", "models": list(self.engine.models), "processes": len(self.processes)}
                respond.send(200, json.dumps(body).encode(), "application/json")
                return
            if route == ("GET", "/metrics"):
                respond.send(200, prometheus_text(self).encode(), "text/plain; version=0.0.4; charset=utf-8")
                return
            handler = self._v1_routes()[route]  # _http_admit refused every other route
            user = self.auth.bearer(request.headers.get("authorization"))
            key = object()  # an HTTP request in flight counts against its user's connection quota
            try:
                self.connections.enter(key, user)
            except PieError as exc:
                respond.send(429, openai.error_body(str(exc), "rate_limit_error", code="rate_limit_exceeded"),
                             "application/json")
                return
            try:
                await handler(self, user, request, respond)
            finally:
                self.connections.leave(key)
        except PieError as exc:
            if respond.started:
                raise
            status, body = openai.error_response(exc)
            respond.send(status, body, "application/json")

    @staticmethod
    async def _v1_models(server: PieServer, user: str, request: HttpRequest, respond: HttpResponder) -> None:
        data = [{"id": name, "object": "model", "created": 0, "owned_by": "pie"} for name in server.engine.models]
        respond.send(200, json.dumps({"object": "list", "data": data}).encode(), "application/json")

    # status -----------------------------------------------------------------------------------

    async def _status_loop(self) -> None:
        interval = self.options.status_interval
        while True:
            await asyncio.sleep(interval if interval > 0 else 1.0)
            self.processes.sweep()
            line = status_line(self)
            if interval > 0:
                self.console.print(f"[dim]{time.strftime('%H:%M:%S')}[/] {line}", soft_wrap=True)

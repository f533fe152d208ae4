"""Raw HTTP: several requests on one kept-alive connection (pipelined too), idle and ``Connection:
close`` connections end, and CORS: foreign origins refused by default, allowed ones answered."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import h11
import pytest

from pie_core.errors import InvalidInput
from pie_core.server import http
from pie_core.server.cors import CorsPolicy


class Conn:
    """One client connection that reads responses with h11 (so nothing depends on the server closing)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.h11 = h11.Connection(h11.CLIENT)
        self._expect()

    def _expect(self) -> None:
        """Put the client-side parser in the state of having sent a request (h11 reads responses then)."""
        self.h11.send(h11.Request(method="GET", target="/", headers=[("host", "x")]))
        self.h11.send(h11.EndOfMessage())

    @classmethod
    async def open(cls, s: Any) -> Conn:
        return cls(*await asyncio.open_connection("127.0.0.1", s.server.port))

    @staticmethod
    def request(method: str, path: str, body: Any = None, headers: dict[str, str] | None = None) -> bytes:
        """Raw request bytes (built by hand, so several can be pipelined)."""
        data = b"" if body is None else json.dumps(body).encode()
        hdrs = {"host": "x", **(headers or {})}
        if method == "POST":
            hdrs |= {"content-type": "application/json", "content-length": str(len(data))}
        head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in hdrs.items()) + "\r\n"
        return head.encode() + data

    async def response(self, within_s: float = 10.0) -> tuple[int, dict[str, str], bytes]:
        status, headers, body = 0, {}, b""
        while True:
            event = self.h11.next_event()
            if event is h11.NEED_DATA:
                self.h11.receive_data(await asyncio.wait_for(self.reader.read(65536), within_s))
            elif isinstance(event, h11.Response):
                status = event.status_code
                headers = {k.decode(): v.decode() for k, v in event.headers}
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                if self.h11.their_state is h11.DONE and self.h11.our_state is h11.DONE:
                    self.h11.start_next_cycle()
                    self._expect()
                return status, headers, body

    async def send(self, *requests: bytes) -> None:
        self.writer.write(b"".join(requests))
        await self.writer.drain()

    async def closed_by_server(self, within_s: float = 5.0) -> bool:
        return await asyncio.wait_for(self.reader.read(1), within_s) == b""


def test_one_connection_serves_several_requests_in_turn_and_pipelined(served):
    async def scenario(s):
        auth = {"authorization": f"Bearer {s.tokens['alice']}"}
        conn = await Conn.open(s)
        await conn.send(conn.request("GET", "/health"))
        status, headers, body = await conn.response()
        assert status == 200 and json.loads(body)["status"] == "ok" and headers.get("connection") != "close"
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0}
        await conn.send(conn.request("POST", "/v1/chat/completions", chat, auth))
        status, _, body = await conn.response()
        assert status == 200 and json.loads(body)["object"] == "chat.completion"
        await conn.send(conn.request("POST", "/v1/chat/completions", {**chat, "stream": True}, auth))
        status, headers, body = await conn.response()
        assert status == 200 and headers["content-type"] == "text/event-stream" and body.endswith(b"data: [DONE]\n\n")
        # two requests in one write: answered in order on the same connection
        await conn.send(conn.request("GET", "/v1/models", None, auth) + conn.request("GET", "/health"))
        first, second = await conn.response(), await conn.response()
        assert first[0] == 200 and json.loads(first[2])["object"] == "list"
        assert second[0] == 200 and json.loads(second[2])["status"] == "ok"
        await conn.send(conn.request("GET", "/health", None, {"connection": "close"}))
        status, headers, _ = await conn.response()
        assert status == 200 and headers["connection"] == "close" and await conn.closed_by_server()
        conn.writer.close()

    served(scenario)


def test_an_error_response_closes_the_connection(served):
    async def scenario(s):
        conn = await Conn.open(s)
        bad = {"messages": "hi"}
        await conn.send(conn.request("POST", "/v1/chat/completions", bad, {"authorization": f"Bearer {s.tokens['alice']}"}))
        status, headers, _ = await conn.response()
        assert status == 400 and headers["connection"] == "close" and await conn.closed_by_server()
        conn.writer.close()

    served(scenario)


def test_an_idle_kept_alive_connection_is_closed_and_counts_as_unfinished(served, monkeypatch):
    monkeypatch.setattr(http, "KEEPALIVE_IDLE_S", 0.3)

    async def scenario(s):
        conn = await Conn.open(s)
        await conn.send(conn.request("GET", "/health"))
        assert (await conn.response())[0] == 200
        await asyncio.sleep(0.05)
        assert len(s.server._connections.unfinished) == 1  # waiting for its next request
        assert await conn.closed_by_server(2.0)
        assert not s.server._connections.unfinished
        conn.writer.close()

    served(scenario)


def test_a_foreign_origin_is_refused_by_default_before_the_body_is_read(served):
    async def scenario(s):
        conn = await Conn.open(s)
        await conn.send(conn.request("POST", "/v1/completions", {"prompt": "a"},
                                     {"origin": "https://evil.example", "authorization": f"Bearer {s.tokens['alice']}"}))
        status, headers, body = await conn.response()
        assert status == 403 and json.loads(body)["error"]["code"] == "origin_not_allowed"
        assert "access-control-allow-origin" not in headers
        assert not s.server.processes.of_user("alice")
        conn.writer.close()
        plain = await Conn.open(s)  # a client that is no browser sends no Origin
        await plain.send(plain.request("GET", "/health"))
        status, headers, _ = await plain.response()
        assert status == 200 and "access-control-allow-origin" not in headers
        plain.writer.close()

    served(scenario)


def test_an_allowed_origin_gets_its_preflight_and_cors_headers_on_every_answer(served):
    app = "https://app.example"

    async def scenario(s):
        conn = await Conn.open(s)
        await conn.send(conn.request("OPTIONS", "/v1/chat/completions", None, {
            "origin": app, "access-control-request-method": "POST",
            "access-control-request-headers": "authorization, content-type, x-stainless-os"}))
        status, headers, body = await conn.response()
        assert status == 204 and body == b""
        assert headers["access-control-allow-origin"] == app and headers["vary"] == "Origin"
        assert "POST" in headers["access-control-allow-methods"]
        assert headers["access-control-allow-headers"] == "authorization, content-type, x-stainless-os"
        conn.writer.close()
        conn = await Conn.open(s)
        await conn.send(conn.request("GET", "/v1/models", None, {"origin": app}))  # no token: 401, readable
        status, headers, _ = await conn.response()
        assert status == 401 and headers["access-control-allow-origin"] == app
        conn.writer.close()
        conn = await Conn.open(s)
        await conn.send(conn.request("GET", "/v1/models", None, {"origin": app, "authorization": f"Bearer {s.tokens['bob']}"}))
        status, headers, _ = await conn.response()
        assert status == 200 and headers["access-control-allow-origin"] == app
        await conn.send(conn.request("GET", "/health", None, {"origin": "https://other.example"}))
        assert (await conn.response())[0] == 403
        conn.writer.close()

    served(scenario, cors=CorsPolicy((app,)))


def test_cors_origins_come_from_the_config_and_bad_ones_are_refused():
    assert CorsPolicy.from_config({"server": {"cors_origins": ["https://A.example/", "*"]}}).origins == \
        ("https://a.example", "*")
    assert CorsPolicy.from_config({}).origins == ()
    assert CorsPolicy(("*",)).allows("https://anything.example")
    for bad in (["https://a.example/path"], ["a.example"], "https://a.example", [1]):
        with pytest.raises(InvalidInput, match="cors_origins"):
            CorsPolicy.from_config({"server": {"cors_origins": bad}})


def test_a_websocket_handshake_from_a_foreign_origin_is_refused_even_without_auth(served):
    """A page the user visits must not reach a loopback --no-auth server's WebSocket API."""
    from websockets.asyncio.client import connect as ws_connect
    from websockets.exceptions import InvalidStatus

    async def scenario(s):
        with pytest.raises(InvalidStatus) as refused:
            async with ws_connect(s.url, origin="https://evil.example"):
                pass
        assert refused.value.response.status_code == 403
        async with ws_connect(s.url, origin="https://app.example") as ws:  # an allowed origin
            await ws.ping()
        async with ws_connect(s.url) as ws:  # no Origin: not a browser
            await ws.ping()
        assert not s.server.processes.of_user("local")

    served(scenario, auth=False, cors=CorsPolicy(("https://app.example",)))

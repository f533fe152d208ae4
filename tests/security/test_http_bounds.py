"""HTTP bounds that used to let one client cancel or confuse another: unfinished requests are
bounded per address and per user before the server-wide cap (anonymous connections can only
push out each other), a head carries one ``Authorization`` header, and a head is at most 64 KiB
however it arrives."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from hostile import victim_is_served

from pie_core.runtime.launcher import InProcessLauncher
from pie_core.server import http
from test_http import CHAT, openai_error, post_head, raw_http, response

COMPLETIONS = "/v1/completions"
BODY = json.dumps({"prompt": "a", "max_tokens": 2}).encode()


async def half_sent(s, token: str):
    """A completion whose head (with ``token``) and first body byte were sent, the rest held back."""
    head = post_head(COMPLETIONS, len(BODY), token).replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n")
    reader, writer = await raw_http(s, head, BODY[:1])
    return reader, writer


async def finish(reader, writer) -> tuple[int, dict]:
    writer.write(BODY[1:])
    await writer.drain()
    return await response(reader, 10)


@pytest.fixture
def small_caps(monkeypatch):
    monkeypatch.setattr(http, "MAX_UNFINISHED", 32)
    monkeypatch.setattr(http, "MAX_UNFINISHED_PER_PEER", 8)
    monkeypatch.setattr(http, "MAX_UNFINISHED_PER_USER", 6)


def test_idle_anonymous_connections_cannot_drop_a_users_half_sent_request(hostile, small_caps):
    async def scenario(s):
        assert await finish(*await half_sent(s, s.tokens["alice"]))  # warm: the built-in program is loaded
        alice = await half_sent(s, s.tokens["alice"])
        await asyncio.sleep(0.1)  # her head is admitted: the connection is hers now
        idle = [await asyncio.open_connection("127.0.0.1", s.server.port) for _ in range(300)]
        await asyncio.sleep(0.3)
        anonymous = sum(1 for h in s.server._connections.unfinished.values() if h.startswith("peer "))
        assert anonymous <= 8, f"{anonymous} anonymous connections from one address are mid-request"
        start = time.monotonic()
        status, reply = await finish(*alice)
        assert status == 200 and reply["object"] == "text_completion", reply
        assert time.monotonic() - start < 0.5, f"alice's request took {time.monotonic() - start:.2f}s"
        for _, w in idle:
            w.close()
        assert await victim_is_served(s) < 0.5

    hostile(scenario, launcher=InProcessLauncher())


def test_a_user_past_its_share_of_unfinished_requests_drops_only_its_own(hostile, small_caps):
    async def scenario(s):
        alice = [await half_sent(s, s.tokens["alice"]) for _ in range(2)]
        mallory = [await half_sent(s, s.tokens["mallory"]) for _ in range(40)]
        await asyncio.sleep(0.3)
        held = list(s.server._connections.unfinished.values())
        assert held.count("user mallory") == 6 and held.count("user alice") == 2, held
        dropped = [await asyncio.wait_for(r.read(), 2.0) for r, _ in mallory[:34]]
        assert dropped == [b""] * 34  # her oldest went, to make room for her newest
        for pair in alice:
            status, reply = await finish(*pair)
            assert status == 200, reply
        for _, w in mallory:
            w.close()

    hostile(scenario, launcher=InProcessLauncher())


def test_past_the_server_wide_cap_a_newcomer_cannot_push_out_authenticated_requests(hostile, monkeypatch):
    monkeypatch.setattr(http, "MAX_UNFINISHED", 8)
    monkeypatch.setattr(http, "MAX_UNFINISHED_PER_USER", 7)

    async def scenario(s):
        alice = await half_sent(s, s.tokens["alice"])
        mallory = [await half_sent(s, s.tokens["mallory"]) for _ in range(7)]
        await asyncio.sleep(0.2)
        idle = [await asyncio.open_connection("127.0.0.1", s.server.port) for _ in range(3)]
        assert [await asyncio.wait_for(r.read(), 2.0) for r, _ in idle] == [b""] * 3  # the newcomers went
        held = list(s.server._connections.unfinished.values())
        assert held.count("user mallory") == 7 and held.count("user alice") == 1, held
        status, reply = await finish(*alice)
        assert status == 200, reply
        for _, w in [*mallory, *idle]:
            w.close()

    hostile(scenario, launcher=InProcessLauncher())


def test_two_authorization_headers_are_a_400(hostile):
    async def scenario(s):
        both = f"Authorization: Bearer {s.tokens['alice']}\r\nAuthorization: Bearer {s.tokens['mallory']}\r\n"
        head = (f"POST {COMPLETIONS} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{both}"
                f"Content-Length: {len(BODY)}\r\n\r\n").encode()
        reader, _ = await raw_http(s, head, BODY)
        assert "one Authorization header" in openai_error(*await response(reader), 400)
        reader, _ = await raw_http(s, f"GET /health HTTP/1.1\r\nHost: x\r\n{both}\r\n".encode())
        openai_error(*await response(reader), 400)
        upgrade = (f"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                   f"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n{both}\r\n")
        reader, _ = await raw_http(s, upgrade.encode())
        reply = await asyncio.wait_for(reader.read(), 3.0)
        assert reply.startswith(b"HTTP/1.1 400") and b"one Authorization header" in reply, reply[:200]
        await victim_is_served(s)

    hostile(scenario, launcher=InProcessLauncher())


@pytest.mark.parametrize("how", ["one chunk", "unterminated", "kept-alive"])
def test_a_head_over_64_KiB_is_refused_431(hostile, how):
    async def scenario(s):
        line = f"X-Filler: {'a' * 70_000}\r\n"
        if how == "kept-alive":
            first = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
            reader, writer = await raw_http(s, first)
            reply = await asyncio.wait_for(reader.readuntil(b'"processes"'), 3.0)
            assert reply.startswith(b"HTTP/1.1 200"), reply[:100]
            await asyncio.wait_for(reader.readuntil(b"}"), 3.0)
            writer.write(f"GET /health HTTP/1.1\r\nHost: x\r\n{line}\r\n".encode())
        else:
            end = "\r\n" if how == "one chunk" else ""
            reader, writer = await raw_http(s, f"GET /health HTTP/1.1\r\nHost: x\r\n{line}{end}".encode())
        status, reply = await response(reader)
        assert status == 431 and "at most 65536 bytes" in reply["error"]["message"], reply
        writer.close()
        await victim_is_served(s)

    hostile(scenario, launcher=InProcessLauncher())

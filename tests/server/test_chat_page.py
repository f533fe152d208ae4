"""The chat page at ``GET /``: public, self-contained (no external asset, a CSP that allows its own
inline code by hash and this origin only), and its same-origin calls to the API pass the CORS
check that refuses every other web page, under the API's own authentication. A page that reaches
the server under a name it controls (DNS rebinding) is still refused on a server without auth."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import re
from typing import Any

from pie_core.client import connect
from pie_core.server.auth import User, hash_token, metrics_id
from pie_core.server.chat_page import chat_page

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0}


async def _raw(s: Any, method: str, path: str, headers: dict[str, str], body: Any = None) -> tuple[int, dict[str, str], bytes]:
    """One request with exactly these headers (``Host`` included), ``Connection: close``."""
    reader, writer = await asyncio.open_connection("127.0.0.1", s.server.port)
    data = b"" if body is None else json.dumps(body).encode()
    hdrs = {**headers, "connection": "close"}
    if body is not None:
        hdrs |= {"content-type": "application/json", "content-length": str(len(data))}
    writer.write((f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in hdrs.items()) + "\r\n").encode() + data)
    await writer.drain()
    raw = await asyncio.wait_for(reader.read(), 20)
    writer.close()
    head, _, rest = raw.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    found = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    if found.get("transfer-encoding") == "chunked":
        body_out, rest_bytes = b"", rest
        while rest_bytes:
            size, _, rest_bytes = rest_bytes.partition(b"\r\n")
            n = int(size, 16)
            body_out, rest_bytes = body_out + rest_bytes[:n], rest_bytes[n + 2:]
            if n == 0:
                break
        rest = body_out
    return int(lines[0].split()[1]), found, rest


def test_the_page_is_served_whole_with_a_strict_csp(served) -> None:
    async def scenario(s: Any) -> None:
        status, headers, body = await _raw(s, "GET", "/", {"host": f"127.0.0.1:{s.server.port}"})
        assert status == 200 and headers["content-type"].startswith("text/html")
        html = body.decode()
        assert "<title>Pie chat</title>" in html and "/v1/chat/completions" in html and "localStorage" in html
        csp = headers["content-security-policy"]
        assert "default-src 'none'" in csp and "connect-src 'self'" in csp and "unsafe-inline" not in csp
        for tag in ("script", "style"):
            (block,) = re.findall(rf"<{tag}>(.*?)</{tag}>", html, re.S)
            digest = base64.b64encode(hashlib.sha256(block.encode()).digest()).decode()
            assert f"'sha256-{digest}'" in csp, tag
        assert headers["x-content-type-options"] == "nosniff"

    served(scenario)


def test_the_page_names_no_external_asset() -> None:
    html = chat_page()[0].decode()
    assert not re.search(r"""(src|href)\s*=\s*["'](?!#|data:)""", html), "the page must load nothing"
    assert not re.search(r"https?://", html) and "@import" not in html and "url(" not in html


def test_same_origin_calls_pass_cors_and_still_need_the_token(served) -> None:
    async def scenario(s: Any) -> None:
        here = f"127.0.0.1:{s.server.port}"
        page = {"host": here, "origin": f"http://{here}"}
        status, _, body = await _raw(s, "POST", "/v1/chat/completions", page, CHAT)
        assert status == 401, body  # past CORS, stopped by auth
        status, _, body = await _raw(s, "POST", "/v1/chat/completions",
                                     {**page, "authorization": f"Bearer {s.tokens['alice']}"}, CHAT)
        assert status == 200 and json.loads(body)["object"] == "chat.completion"
        status, _, body = await _raw(s, "GET", "/v1/models", {**page, "authorization": f"Bearer {s.tokens['alice']}"})
        assert status == 200 and json.loads(body)["data"]
        # Another page's origin is refused as before, on the same host.
        status, _, body = await _raw(s, "POST", "/v1/chat/completions",
                                     {"host": here, "origin": "http://evil.example",
                                      "authorization": f"Bearer {s.tokens['alice']}"}, CHAT)
        assert status == 403 and b"origin_not_allowed" in body

    served(scenario)


def test_a_rebound_name_is_refused_without_auth_but_an_address_or_localhost_is_not(served) -> None:
    async def scenario(s: Any) -> None:
        port = s.server.port
        rebound = {"host": f"evil.example:{port}", "origin": f"http://evil.example:{port}"}
        status, _, body = await _raw(s, "POST", "/v1/chat/completions", rebound, CHAT)
        assert status == 403 and b"origin_not_allowed" in body
        for host in (f"127.0.0.1:{port}", f"localhost:{port}"):
            status, _, body = await _raw(s, "POST", "/v1/chat/completions", {"host": host, "origin": f"http://{host}"}, CHAT)
            assert status == 200, (host, body)

    served(scenario, auth=False)


def test_a_same_origin_name_is_trusted_when_auth_is_on(served) -> None:
    async def scenario(s: Any) -> None:
        host = f"pie.example:{s.server.port}"
        page = {"host": host, "origin": f"https://{host}", "authorization": f"Bearer {s.tokens['bob']}"}
        status, _, body = await _raw(s, "POST", "/v1/chat/completions", page, CHAT)
        assert status == 200, body

    served(scenario)


def test_metrics_need_the_token_when_auth_is_on_and_name_no_user(served) -> None:
    async def scenario(s: Any) -> None:
        here = {"host": f"127.0.0.1:{s.server.port}"}
        status, _, body = await _raw(s, "GET", "/metrics", here)
        assert status == 401 and b"authentication required" in body
        async with await connect(s.url, s.tokens["bob"]):  # bob holds a connection: a per-user gauge
            status, _, body = await _raw(s, "GET", "/metrics", {**here, "authorization": f"Bearer {s.tokens['alice']}"})
        text = body.decode()
        bob = metrics_id(User("bob", hash_token(s.tokens["bob"])))
        assert status == 200 and f'pie_user_connections{{user="{bob}"}} 1' in text
        assert "alice" not in text and "bob" not in text
        status, _, body = await _raw(s, "GET", "/health", here)  # load balancers need no token
        assert status == 200

    served(scenario)

"""Class 7, HTTP edges: requests are judged from their head, bounded in time and count, cancelled
when their client leaves, and every bad body gets an OpenAI-shaped 4xx, never a 500 or plain text."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from hostile import victim_is_served

from pie_core.runtime.launcher import InProcessLauncher
from pie_core.server import http, openai

CHAT = "/v1/chat/completions"
MSG = [{"role": "user", "content": "hi"}]


async def raw_http(s: Any, head: bytes, body: bytes = b"") -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", s.server.port)
    writer.write(head + body)
    await writer.drain()
    return reader, writer


def post_head(path: str, length: int, token: str | None = None) -> bytes:
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{auth}"
            f"Content-Length: {length}\r\n\r\n").encode()


async def response(reader: asyncio.StreamReader, within_s: float = 3.0) -> tuple[int, dict[str, Any]]:
    """Status and JSON body of the whole response (the server closes after it)."""
    raw = await asyncio.wait_for(reader.read(), within_s)
    head, _, body = raw.partition(b"\r\n\r\n")
    assert b"content-type: application/json" in head.lower(), raw[:300]
    return int(head.split()[1]), json.loads(body)


async def post(s: Any, path: str, body: Any, token: str | None = None) -> tuple[int, dict[str, Any]]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    reader, writer = await raw_http(s, post_head(path, len(data), token), data)
    try:
        return await response(reader, 20)
    finally:
        writer.close()


def openai_error(status: int, reply: dict[str, Any], want: int, param: str | None = None) -> str:
    assert status == want, (status, reply)
    err = reply["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    if param is not None:
        assert err["param"] == param, err
    return err["message"]


def test_unauthenticated_v1_requests_get_401_from_the_head_before_any_body_is_read(hostile):
    async def scenario(s):
        reader, writer = await raw_http(s, post_head(CHAT, 4_000_000))  # no token, and no body follows
        status, reply = await response(reader, 2.0)
        assert "Authorization: Bearer" in openai_error(status, reply, 401)
        reader, writer = await raw_http(s, post_head(CHAT, 4_000_000, "wrong-token"))
        openai_error(*await response(reader, 2.0), 401)
        assert not s.server._connections.unfinished  # nothing left holding a body buffer
        await victim_is_served(s)

    hostile(scenario, launcher=InProcessLauncher())


def test_a_body_larger_than_the_route_takes_is_refused_from_content_length(hostile):
    async def scenario(s):
        reader, _ = await raw_http(s, post_head(CHAT, 50_000_000, s.tokens["mallory"]))
        message = openai_error(*await response(reader, 2.0), 413)
        assert f"at most {http.MAX_BODY} bytes, got 50000000" in message
        head = f"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {s.tokens['mallory']}\r\nContent-Length: 10\r\n\r\n"
        reader, _ = await raw_http(s, head.encode())
        openai_error(*await response(reader, 2.0), 413)
        await victim_is_served(s)

    hostile(scenario, launcher=InProcessLauncher())


def test_a_request_whose_body_never_finishes_is_answered_408_at_its_deadline(hostile, monkeypatch):
    monkeypatch.setattr(http, "REQUEST_TIMEOUT_S", 1.0)

    async def scenario(s):
        reader, writer = await raw_http(s, post_head(CHAT, 1000, s.tokens["mallory"]), b'{"messages": ')
        slow_head, _ = await raw_http(s, b"GET /health HTTP/1.1\r\nHo")  # a head that never ends
        assert "did not arrive within 1 s" in openai_error(*await response(reader, 3.0), 408)
        assert await asyncio.wait_for(slow_head.read(), 3.0) == b""  # dropped without a word
        assert not s.server._connections.live or all(c._mode == "ws" for c in s.server._connections.live)
        await victim_is_served(s)

    hostile(scenario, launcher=InProcessLauncher())


def test_unfinished_connections_are_bounded_server_wide_and_newcomers_cannot_push_out_admitted_ones(hostile,
                                                                                                    monkeypatch):
    monkeypatch.setattr(http, "MAX_UNFINISHED", 16)

    async def scenario(s):
        stalled = []
        for _ in range(40):
            stalled.append(await raw_http(s, post_head(CHAT, 1000, s.tokens["mallory"]), b"{"))
            await asyncio.sleep(0.01)  # each head admitted before the next connection opens
        await asyncio.sleep(0.2)
        assert len(s.server._connections.unfinished) <= 16
        dropped = [await asyncio.wait_for(r.read(), 2.0) for r, _ in stalled[16:]]
        assert dropped == [b""] * 24  # anonymous until their heads are read, they could not push out the first 16
        for _, w in stalled:
            w.close()
        await victim_is_served(s)
        status, reply = await post(s, "/v1/completions", {"prompt": "a", "max_tokens": 2}, s.tokens["alice"])
        assert status == 200 and reply["object"] == "text_completion"

    hostile(scenario, launcher=InProcessLauncher())


@pytest.mark.parametrize("leave", ["half-close", "close"])
def test_a_non_streaming_client_that_leaves_cancels_its_generation_and_frees_its_pages(hostile, leave):
    async def scenario(s):
        body = json.dumps({"messages": MSG, "max_tokens": 30000, "temperature": 0}).encode()
        reader, writer = await raw_http(s, post_head(CHAT, len(body), s.tokens["mallory"]), body)
        deadline = time.monotonic() + 10
        while not s.server.processes.of_user("mallory"):
            assert time.monotonic() < deadline, "the generation never started"
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)
        assert s.server.processes.of_user("mallory") and not reader.at_eof()  # still generating
        if leave == "half-close":
            writer.write_eof()
        else:
            writer.close()
        deadline = time.monotonic() + 5
        while s.server.processes.of_user("mallory") or not s.server.engine.pools_whole():
            assert time.monotonic() < deadline, "the generation outlived its client"
            await asyncio.sleep(0.01)
        await victim_is_served(s)

    hostile(scenario, launcher=InProcessLauncher())


BAD_BODIES = [
    ({"messages": MSG, "response_format": {"type": "json_schema", "json_schema": "x"}}, "response_format.json_schema"),
    ({"messages": MSG, "response_format": "json"}, "response_format"),
    ({"messages": MSG, "stream": True, "stream_options": [1]}, "stream_options"),
    ({"messages": MSG, "stream": "yes"}, "stream"),
    ({"messages": MSG, "max_tokens": 0}, "max_tokens"),
    ({"messages": MSG, "max_tokens": True}, "max_tokens"),
    ({"messages": MSG, "max_completion_tokens": 1.5}, "max_completion_tokens"),
    ({"messages": MSG, "n": True}, "n"),
    ({"messages": MSG, "n": 17}, "n"),
    ({"messages": MSG, "temperature": True}, "temperature"),
    ({"messages": MSG, "top_p": "1"}, "top_p"),
    ({"messages": MSG, "seed": 1.5}, "seed"),
    ({"messages": MSG, "seed": False}, "seed"),
    ({"messages": MSG, "stop": [1]}, "stop"),
    ({"messages": MSG, "model": ["dummy"]}, "model"),
    ({"messages": [["user", "hi"]]}, "messages[0]"),
    ({"messages": [{"role": ["user"], "content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": {"a": 1}}]}, "messages[0].content"),
    ({"messages": MSG, "tools": "f"}, "tools"),
    ({"messages": MSG, "tools": [{"type": "function", "function": {"name": "f" * 100_000}}]}, "tools[0]"),
    ({"messages": MSG, "logprobs": 1}, "logprobs"),
    ({"messages": MSG, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"messages": "hi"}, "messages"),
    ({"messages": [{"role": "user", "content": "x" * 1_500_000}]}, "messages"),
]


@pytest.mark.parametrize("body,param", BAD_BODIES, ids=[p for _, p in BAD_BODIES])
def test_a_bad_chat_body_gets_an_openai_shaped_400_naming_the_field(hostile, body, param):
    async def scenario(s):
        openai_error(*await post(s, CHAT, body, s.tokens["mallory"]), 400, param)
        assert not s.server.processes.of_user("mallory")

    hostile(scenario, launcher=InProcessLauncher())


def test_deep_json_huge_prompts_and_non_objects_get_a_400_not_a_500(hostile):
    async def scenario(s):
        tok = s.tokens["mallory"]
        deep = b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
        assert "nests deeper than" in openai_error(*await post(s, CHAT, deep, tok), 400)
        nested = {"messages": MSG, "response_format": {"type": "json_schema", "json_schema": {"schema": {}}}}
        inner: dict[str, Any] = nested["response_format"]["json_schema"]["schema"]
        for _ in range(200):  # deep but under the recursion limit: caught by the depth bound
            inner["items"] = {}
            inner = inner["items"]
        assert "nests deeper than" in openai_error(*await post(s, CHAT, nested, tok), 400)
        huge = {"prompt": "word " * 800_000, "max_tokens": 1}  # 4 MB of prompt
        assert f"limit is {openai.MAX_PROMPT_BYTES} bytes" in openai_error(*await post(s, "/v1/completions", huge, tok),
                                                                          400, "prompt")
        openai_error(*await post(s, CHAT, b"[1, 2]", tok), 400)
        openai_error(*await post(s, CHAT, b"\xff\xfe{", tok), 400)
        await victim_is_served(s)

    hostile(scenario, launcher=InProcessLauncher())


def test_a_prompt_longer_than_the_context_is_a_400_context_length_exceeded(hostile):
    async def scenario(s):
        tok = s.tokens["mallory"]
        limit = openai._context_tokens(s.server, None)
        for path, body, param in (("/v1/completions", {"prompt": " ab" * (limit + 10), "max_tokens": 1}, "prompt"),
                                  (CHAT, {"messages": [{"role": "user", "content": " ab" * (limit + 10)}],
                                          "stream": True}, "messages")):
            status, reply = await post(s, path, body, tok)
            assert "shorten the" in openai_error(status, reply, 400, param)
            assert reply["error"]["code"] == "context_length_exceeded"
        await victim_is_served(s)

    hostile(scenario, launcher=InProcessLauncher())


def test_a_handler_bug_is_an_openai_shaped_500_without_a_traceback(hostile, monkeypatch):
    async def broken(*args: Any) -> None:
        raise KeyError("secret-internal-detail")

    monkeypatch.setattr(openai, "chat_completions", broken)

    async def scenario(s):
        status, reply = await post(s, CHAT, {"messages": MSG}, s.tokens["mallory"])
        message = openai_error(status, reply, 500)
        assert reply["error"]["type"] == "server_error" and "secret-internal-detail" not in message
        await victim_is_served(s)

    hostile(scenario, launcher=InProcessLauncher())


def test_honest_requests_still_work_with_zero_off_values(hostile):
    async def scenario(s):
        body = {"messages": MSG, "max_tokens": 3, "n": 1, "logprobs": False, "tools": [], "presence_penalty": 0,
                "stream_options": None, "seed": None, "stop": None, "temperature": 0}
        status, reply = await post(s, CHAT, body, s.tokens["alice"])
        assert status == 200 and reply["choices"][0]["message"]["role"] == "assistant", reply

    hostile(scenario, launcher=InProcessLauncher())

"""Bad input gets a clear error response; the connection and the server carry on."""

from __future__ import annotations

import hashlib
import io
import tarfile
import urllib.error
import urllib.request

import msgpack
import pytest
from conftest import PROBE
from server_helpers import raw_connect, raw_request

from pie_core.client import ServerError, connect


async def _still_serves(ws) -> None:
    reply = await raw_request(ws, {"type": "ping", "id": 999})
    assert reply["ok"] and reply["id"] == 999


@pytest.mark.parametrize(
    "frame, kind, words",
    [
        ("a text message", "protocol_error", "binary"),
        (b"\xc1\xc1 not msgpack", "protocol_error", "not valid MessagePack"),
        (msgpack.packb([1, 2, 3]), "protocol_error", "map"),
        (msgpack.packb({"type": "ping"}), "protocol_error", "'id'"),
        ({"type": "fly", "id": 4}, "protocol_error", "unknown request type 'fly'"),
        ({"type": "launch", "id": 5}, "invalid_input", "needs field 'program'"),
        ({"type": "launch", "id": 6, "program": 42}, "invalid_input", "must be str"),
        ({"type": "launch", "id": 7, "program": "no-such-program"}, "not_found", "no program 'no-such-program'"),
        ({"type": "launch", "id": 8, "program": "../../etc"}, "invalid_input", "name@version"),
        ({"type": "launch", "id": 9, "program": "hello-world", "input": {"nope": 1}}, "invalid_input", "unknown parameter"),
        ({"type": "send", "id": 10, "process": "feedbeef0000", "message": "x"}, "not_found", "no process"),
        ({"type": "upload_chunk", "id": 11, "upload": "zzz", "data": b"x"}, "not_found", "no open upload"),
    ],
)
def test_malformed_or_wrong_requests_get_an_error_response(served, frame, kind, words):
    async def scenario(s):
        async with raw_connect(s.url, s.tokens["alice"]) as ws:
            reply = await raw_request(ws, frame)
            assert reply["type"] == "response" and reply["ok"] is False
            assert reply["error"]["kind"] == kind and words in reply["error"]["message"]
            if isinstance(frame, dict):
                assert reply["id"] == frame["id"]
            await _still_serves(ws)

    served(scenario)


def test_oversized_uploads_are_refused_and_nothing_is_stored(served):
    async def scenario(s):
        async with await connect(s.url, s.tokens["alice"]) as client:
            with pytest.raises(ServerError, match="upload size must be 1..4096 bytes"):
                await client.request("upload_begin", size=10_000, sha256="0" * 64)
            begin = await client.request("upload_begin", size=10, sha256="0" * 64)
            with pytest.raises(ServerError, match="more than its declared 10 bytes"):
                await client.request("upload_chunk", upload=begin["upload"], data=b"x" * 11)
            with pytest.raises(ServerError, match="no open upload"):  # dropped
                await client.request("upload_end", upload=begin["upload"])
            with pytest.raises(ServerError, match="files are limited to 4096 bytes"):
                proc = await client.launch("hello-world")
                await proc.transfer_file(b"x" * 5000)
            # the connection survived every refusal: a ping still comes back with its own payload
            assert (await client.request("ping", data=b"after refusals"))["data"] == b"after refusals"
        assert list(s.server.store.root.glob("*/Pie.toml")) == []

    served(scenario, max_upload=4096)


def _tar(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.mark.parametrize(
    "archive, words",
    [
        (b"definitely not a tar archive", "not a safe tar archive"),
        (_tar({"../evil.py": b"x", "Pie.toml": b"[package]\nname='x'\n"}), "not a safe tar archive"),
        (_tar({"main.py": b"async def main(i): pass\n"}), "has no Pie.toml"),
    ],
)
def test_bad_archives_are_refused(served, archive, words):
    async def scenario(s):
        async with await connect(s.url, s.tokens["alice"]) as client:
            begin = await client.request("upload_begin", size=len(archive), sha256=hashlib.sha256(archive).hexdigest())
            await client.request("upload_chunk", upload=begin["upload"], data=archive)
            with pytest.raises(ServerError, match=words):
                await client.request("upload_end", upload=begin["upload"])
            wrong = await client.request("upload_begin", size=len(archive), sha256="ab" * 32)
            await client.request("upload_chunk", upload=wrong["upload"], data=archive)
            with pytest.raises(ServerError, match="hash mismatch"):
                await client.request("upload_end", upload=wrong["upload"])
            assert await client.install(PROBE) == "probe@1.0.0"

    served(scenario)


def test_wrong_tokens_are_refused_clearly(served):
    async def scenario(s):
        with pytest.raises(ServerError, match="unauthorized: the token matches no user"):
            await connect(s.url, "not-a-token")
        async with raw_connect(s.url) as ws:  # no token yet: only auth and ping are answered
            reply = await raw_request(ws, {"type": "list_processes", "id": 1})
            assert reply["error"]["kind"] == "unauthorized" and "send an 'auth' request" in reply["error"]["message"]
            reply = await raw_request(ws, {"type": "auth", "id": 2, "token": "wrong"})
            assert reply["error"]["kind"] == "unauthorized"
            reply = await raw_request(ws, {"type": "auth", "id": 3, "token": s.tokens["bob"]})
            assert reply["ok"] and reply["result"] == {"user": "bob"}
            reply = await raw_request(ws, {"type": "auth", "id": 4, "token": s.tokens["alice"]})
            assert "already authenticated as 'bob'" in reply["error"]["message"]
            assert (await raw_request(ws, {"type": "list_processes", "id": 5}))["ok"]

        def http(path: str, token: str | None) -> int:
            req = urllib.request.Request(s.http + path, headers={"Authorization": f"Bearer {token}"} if token else {})
            try:
                return urllib.request.urlopen(req).status
            except urllib.error.HTTPError as exc:
                return exc.code

        import asyncio

        assert await asyncio.to_thread(http, "/v1/models", None) == 401
        assert await asyncio.to_thread(http, "/v1/models", "wrong") == 401
        assert await asyncio.to_thread(http, "/v1/models", s.tokens["alice"]) == 200

    served(scenario)


def test_a_missing_program_is_a_clear_error_and_the_connection_goes_on(served):
    async def scenario(s):
        async with await connect(s.url, s.tokens["alice"]) as client:
            with pytest.raises(ServerError, match="not_found: no program 'ghost@1.0'.*upload it first"):
                await client.launch("ghost@1.0")
            with pytest.raises(ServerError, match="available at version 0.1.0, not 9.9"):
                await client.launch("hello-world@9.9")
            assert await (await client.launch("hello-world")).wait() == "hello world"

    served(scenario)

"""Helpers shared by the server tests."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from typing import Any, Callable

import msgpack
from websockets.asyncio.client import connect as ws_connect


async def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    """Poll until ``predicate()`` holds (fails the test after ``timeout`` seconds)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not predicate():
        if loop.time() > end:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)


async def raw_request(ws: Any, frame: Any) -> dict[str, Any]:
    """Send one frame (a dict is packed; bytes/str go as they are) and read the next reply."""
    await ws.send(msgpack.packb(frame, use_bin_type=True) if isinstance(frame, dict) else frame)
    return msgpack.unpackb(await ws.recv(), raw=False)


def raw_connect(url: str, token: str | None = None) -> Any:
    headers = {"Authorization": f"Bearer {token}"} if token else None
    return ws_connect(url, additional_headers=headers)


def http_request(url: str, body: dict | None = None, token: str | None = None) -> tuple[int, str, bytes]:
    """A blocking HTTP request (POST with a JSON body, GET without): status, content type, body."""
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=json.dumps(body).encode() if body is not None else None, headers=headers)
    try:
        with urllib.request.urlopen(req) as resp:
            return resp.status, resp.headers.get("content-type", ""), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("content-type", ""), exc.read()

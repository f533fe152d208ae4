"""The session with the client that launched this inferlet: ``from inferlet import session``."""

from __future__ import annotations

import json
from typing import Any

from inferlet.host import session as _host
from inferlet import _blocking

__all__ = ["send", "send_file", "receive", "receive_file"]


def send(message: Any) -> None:
    """Send to the client as a Stdout event: strings verbatim, anything else JSON-encoded."""
    _host.send(message if isinstance(message, str) else json.dumps(message))


def send_file(data: bytes) -> None:
    """Send a binary blob to the client as a File event."""
    _host.send_file(data)


@_blocking.awaitable("session.receive()")
async def receive() -> str:
    """Wait for the next message (or signal) from the client.

    ``await session.receive()`` everywhere; in plain synchronous code (a ``def main`` in the
    process or wasm runner) ``session.receive()`` blocks and returns the message."""
    return await _host.receive()


@_blocking.awaitable("session.receive_file()")
async def receive_file() -> bytes:
    """Wait for the next file from the client (blocking in plain synchronous code, as :func:`receive`)."""
    return await _host.receive_file()

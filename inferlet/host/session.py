"""Host interface ``session``: the channel between an inferlet and its client."""

from __future__ import annotations


from inferlet.host._declare import host

__all__ = ["receive", "receive_file", "send", "send_file", "write_stderr"]


@host
async def receive() -> str:
    """Wait for the next message (or signal) from the client."""


@host
async def receive_file() -> bytes:
    """Wait for the next file from the client."""


@host(oneway=True)
def send(text: str) -> None:
    """Emit a Stdout event with ``text``."""


@host(oneway=True)
def send_file(data: bytes) -> None:
    """Emit a File event carrying ``data``."""


@host(oneway=True)
def write_stderr(text: str) -> None:
    """Emit a Stderr event."""

"""Host interface ``session``: the channel between an inferlet and its client."""

from __future__ import annotations

from pie_core.engine.events import Event
from pie_core.host.binding import current

__all__ = ["send", "send_file", "receive", "receive_file", "write_stderr"]


def send(text: str) -> None:
    """Emit a Stdout event with ``text``."""
    current().emit(Event("stdout", text))


def send_file(data: bytes) -> None:
    """Emit a File event carrying ``data``."""
    current().emit(Event("file", bytes(data)))


def write_stderr(text: str) -> None:
    """Emit a Stderr event."""
    current().emit(Event("stderr", text))


async def receive() -> str:
    """Wait for the next message (or signal) from the client."""
    return await current().inbox.get()


async def receive_file() -> bytes:
    """Wait for the next file from the client."""
    return await current().files.get()

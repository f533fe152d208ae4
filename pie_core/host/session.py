"""Host interface ``session``: the channel between an inferlet and its client."""

from __future__ import annotations

from pie_core.engine.events import Event
from pie_core.host.binding import any_thread, current

__all__ = ["send", "send_file", "receive", "receive_file", "write_stderr"]


@any_thread
def send(text: str) -> None:
    """Emit a Stdout event with ``text``."""
    current().emit_soon(Event("stdout", text))


@any_thread
def send_file(data: bytes) -> None:
    """Emit a File event carrying ``data``."""
    current().emit_soon(Event("file", bytes(data)))


@any_thread
def write_stderr(text: str) -> None:
    """Emit a Stderr event."""
    current().emit_soon(Event("stderr", text))


async def receive() -> str:
    """Wait for the next message (or signal) from the client."""
    return await current().inbox.get()


async def receive_file() -> bytes:
    """Wait for the next file from the client."""
    return await current().files.get()

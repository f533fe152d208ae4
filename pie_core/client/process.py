"""A handle on one process running on the server."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, AsyncIterator

if TYPE_CHECKING:
    from pie_core.client.client import Client

__all__ = ["Process", "ProcessEvent", "ProcessFailed"]


@dataclass(frozen=True, slots=True)
class ProcessEvent:
    """One event: ``kind`` is ``stdout`` (str), ``stderr`` (str), ``file`` (bytes), ``return``
    (main's value) or ``error`` (str); ``seq`` counts from 1 per process."""

    kind: str
    value: Any
    seq: int

    @property
    def is_terminal(self) -> bool:
        return self.kind in ("return", "error")


class ProcessFailed(Exception):
    """The inferlet ended with an Error event (its text is the message)."""


class Process:
    """Events and controls of one process (returned by ``Client.launch`` / ``Client.attach``)."""

    def __init__(self, client: Client, process_id: str) -> None:
        self.client = client
        self.id = process_id
        self._queue: asyncio.Queue[ProcessEvent | BaseException] = asyncio.Queue()
        self._last_seq = 0
        self.done = False

    async def events(self) -> AsyncIterator[ProcessEvent]:
        """Events in order, ending after the terminal ``return`` or ``error`` event.

        Raises:
            ConnectionError: The connection closed before the process ended (reconnect and
                ``attach`` to get the rest: the server keeps detached processes' events).
        """
        while True:
            item = await self._queue.get()
            if isinstance(item, BaseException):
                raise item
            yield item
            if item.is_terminal:
                return

    async def wait(self) -> Any:
        """Run to the end; the return value.

        Raises:
            ProcessFailed: The process ended with an error.
        """
        async for ev in self.events():
            if ev.kind == "error":
                raise ProcessFailed(ev.value)
            if ev.kind == "return":
                return ev.value
        return None

    async def send(self, message: str) -> None:
        """Deliver ``message`` to the inferlet's ``session.receive()``."""
        await self.client.request("send", process=self.id, message=message)

    async def transfer_file(self, data: bytes) -> None:
        """Deliver ``data`` to the inferlet's ``session.receive_file()``."""
        await self.client.request("transfer_file", process=self.id, data=bytes(data))

    async def signal(self, signal: str) -> None:
        """Send a signal; the inferlet reads it through ``session.receive()``."""
        await self.client.request("signal", process=self.id, signal=signal)

    async def terminate(self) -> None:
        """Cancel the process; an ``error`` event follows."""
        await self.client.request("terminate", process=self.id)

    async def detach(self) -> None:
        """Stop receiving events (the server buffers them) and let the process outlive this
        connection; ``Client.attach(id)`` resumes."""
        await self.client.request("detach", process=self.id)

    def _deliver(self, event: ProcessEvent) -> None:
        if event.seq <= self._last_seq:
            return  # a resend after reattach: already delivered
        self._last_seq = event.seq
        self.done = self.done or event.is_terminal
        self._queue.put_nowait(event)

    def _closed(self, error: BaseException) -> None:
        if not self.done:
            self._queue.put_nowait(error)

"""A blocking wrapper around the async client, for scripts and notebooks."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any, Coroutine, Iterator, TypeVar

from pie_core.client.client import Client, connect
from pie_core.client.process import Process, ProcessEvent, ProcessFailed

__all__ = ["SyncClient", "SyncProcess", "connect_sync"]

T = TypeVar("T")


class _Loop:
    """An event loop on a daemon thread that runs the client's coroutines."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="pie-client", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


class SyncProcess:
    """Blocking counterpart of :class:`~pie_core.client.process.Process`."""

    def __init__(self, loop: _Loop, proc: Process) -> None:
        self._loop, self._proc = loop, proc
        self.id = proc.id

    def events(self) -> Iterator[ProcessEvent]:
        it = self._proc.events().__aiter__()
        while True:
            try:
                yield self._loop.run(it.__anext__())  # type: ignore[arg-type]
            except StopAsyncIteration:
                return

    def wait(self) -> Any:
        for ev in self.events():
            if ev.kind == "error":
                raise ProcessFailed(ev.value)
            if ev.kind == "return":
                return ev.value
        return None

    def send(self, message: str) -> None:
        self._loop.run(self._proc.send(message))

    def transfer_file(self, data: bytes) -> None:
        self._loop.run(self._proc.transfer_file(data))

    def signal(self, signal: str) -> None:
        self._loop.run(self._proc.signal(signal))

    def terminate(self) -> None:
        self._loop.run(self._proc.terminate())

    def detach(self) -> None:
        self._loop.run(self._proc.detach())


class SyncClient:
    """Blocking counterpart of :class:`~pie_core.client.client.Client` (use :func:`connect_sync`)."""

    def __init__(self, loop: _Loop, client: Client) -> None:
        self._loop, self._client = loop, client

    def install(self, folder: str | Path) -> str:
        return self._loop.run(self._client.install(folder))

    def launch(self, program: str, input: dict[str, Any] | None = None, *, detached: bool = False) -> SyncProcess:
        return SyncProcess(self._loop, self._loop.run(self._client.launch(program, input, detached=detached)))

    def attach(self, process_id: str) -> SyncProcess:
        return SyncProcess(self._loop, self._loop.run(self._client.attach(process_id)))

    def list_models(self) -> list[dict[str, Any]]:
        return self._loop.run(self._client.list_models())

    def list_processes(self) -> list[dict[str, Any]]:
        return self._loop.run(self._client.list_processes())

    def ping(self) -> float:
        return self._loop.run(self._client.ping())

    def register_mcp_server(self, name: str, server: Any, *, timeout: float = 60.0) -> list[str]:
        """Blocking :meth:`~pie_core.client.Client.register_mcp_server`. ``server`` runs on the
        client's own event loop thread, so pass ``StdioServerParameters``, an ``MCPServer`` or a
        function (a plain one runs in a worker thread), not a session opened on another loop."""
        return self._loop.run(self._client.register_mcp_server(name, server, timeout=timeout))

    def unregister_mcp_server(self, name: str) -> list[str]:
        return self._loop.run(self._client.unregister_mcp_server(name))

    def close(self) -> None:
        try:
            self._loop.run(self._client.close())
        finally:
            self._loop.stop()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect_sync(url: str, token: str | None = None) -> SyncClient:
    """Blocking :func:`~pie_core.client.client.connect`."""
    loop = _Loop()
    try:
        return SyncClient(loop, loop.run(connect(url, token)))
    except BaseException:
        loop.stop()
        raise

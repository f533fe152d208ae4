"""How the server starts an inferlet: the :class:`Launcher` seam, one runner per implementation.

:class:`InProcessLauncher` runs the inferlet as an asyncio task in the server's own process
(the runner ``pie run`` uses, :func:`pie_core.runtime.instance.run_inferlet`). It is fast but
gives no containment: a misbehaving inferlet can block or crash the server.
:class:`pie_core.runtime.process.ProcessLauncher` implements the same protocol with worker
processes (the host API over a pipe, wall-time, CPU and memory limits), and
:class:`pie_core.runtime.wasm.launcher.WasmLauncher` with WebAssembly components."""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from pie_core.engine.engine import Engine
from pie_core.engine.events import Event
from pie_core.host.binding import HostInstance
from pie_core.runtime.instance import run_inferlet
from pie_core.runtime.manifest import Manifest

__all__ = ["Launcher", "InProcessLauncher"]


class Launcher(Protocol):
    """Starts inferlets for the server.

    ``start`` must return a task that emits every event through ``instance.emit`` (a terminal
    ``return`` or ``error`` last), releases everything the inferlet held before it finishes,
    and turns ``task.cancel(reason)`` into an ``error`` event carrying the reason.
    ``instance.inbox`` / ``instance.files`` feed ``session.receive`` / ``receive_file``.
    """

    def start(self, engine: Engine, manifest: Manifest, args: dict[str, Any], instance: HostInstance) -> asyncio.Task[Event]: ...

    async def aclose(self) -> None:
        """Stop any helper the launcher keeps (called at server shutdown, after every task ended)."""


class InProcessLauncher:
    """Runs each inferlet as a task on the server's event loop (no isolation)."""

    def start(self, engine: Engine, manifest: Manifest, args: dict[str, Any], instance: HostInstance) -> asyncio.Task[Event]:
        coro = run_inferlet(engine, manifest, args, instance.emit, instance=instance)
        return asyncio.get_running_loop().create_task(coro, name=f"pie-inferlet-{manifest.name}-{instance.id}")

    async def aclose(self) -> None:
        """Nothing to stop: every inferlet ran as a task."""

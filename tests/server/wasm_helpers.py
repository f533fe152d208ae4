"""One wasm launcher per test session: the component is built (or found in the cache) and
compiled once, then every wasm test instantiates it."""

from __future__ import annotations

import asyncio
from typing import Any

from pie_core.engine.engine import Engine
from pie_core.engine.events import Event
from pie_core.host.binding import HostInstance
from pie_core.runtime.manifest import Manifest
from pie_core.runtime.wasm.host import GuestLimits
from pie_core.runtime.wasm.launcher import WasmLauncher

_launcher: WasmLauncher | None = None


def shared_launcher() -> WasmLauncher:
    global _launcher
    if _launcher is None:
        _launcher = WasmLauncher(GuestLimits(wall_s=60.0, memory_mb=512))
        asyncio.run(_launcher.host())
    return _launcher


def run_wasm(engine: Engine, manifest: Manifest, args: dict[str, Any], *, limits: GuestLimits | None = None,
             username: str = "alice", scratch_root: Any = None) -> tuple[Event, list[Event]]:
    """Run one inferlet in the sandbox; its final event and the events before it."""
    launcher = shared_launcher()
    if limits is not None:
        launcher = WasmLauncher(limits, host=asyncio.run(launcher.host()))
    events: list[Event] = []
    inst = HostInstance(engine=engine, emit=events.append, username=username, scratch_root=scratch_root)

    async def main() -> Event:
        return await launcher.start(engine, manifest, args, inst)

    final = asyncio.run(main())
    assert events[-1] == final
    return final, events[:-1]
